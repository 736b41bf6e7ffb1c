"""Shared test configuration. Tiers: tests/unit (no root), tests/kernel (root, BPF, netns)."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    """SIGTERM (a CI job cancelled, `timeout`) unwinds like Ctrl-C, so fixtures stop
    the servers, agents and labs they started instead of leaving them orphaned."""
    from fabricscope.lab.running import unwind_on_sigterm
    unwind_on_sigterm()


def pytest_collection_modifyitems(config, items):
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (kernel tier)")
    for item in items:
        if "tests/kernel" in str(item.fspath):
            item.add_marker(skip)
