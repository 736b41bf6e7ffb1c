"""Kernel preparation decisions (agent/kernel.py) on fake directory trees, no root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabricscope.agent import kernel
from fabricscope.errors import UserError

RELEASE = "6.18.44-test"


def headers(root: Path, name: str, makefile: bool = True) -> Path:
    d = root / name
    (d / "include").mkdir(parents=True)
    if makefile:
        (d / "Makefile").write_text("include x\n")
    return d


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "modules").mkdir()
    (tmp_path / "src").mkdir()
    return tmp_path


def plan(tree, configured=""):
    return kernel.plan_headers(RELEASE, configured, modules_root=tree / "modules",
                               src_root=tree / "src", arch="amd64")


def test_running_kernel_headers_are_used_as_they_are(tree):
    build = headers(tree / "modules" / RELEASE, "build")
    p = plan(tree)
    assert p.build == build and p.links == ()
    assert "running kernel" in p.origin


def test_newest_distribution_package_is_linked_with_its_common_dir(tree):
    for v in ("6.1.0-9", "6.1.0-57", "5.10.0-30"):
        headers(tree / "src", f"linux-headers-{v}-amd64")
        headers(tree / "src", f"linux-headers-{v}-common")
    headers(tree / "src", "linux-headers-6.1.0-99-amd64", makefile=False)   # broken: skipped
    p = plan(tree)
    assert p.build == tree / "src/linux-headers-6.1.0-57-amd64"
    assert p.source == tree / "src/linux-headers-6.1.0-57-common"
    mod = tree / "modules" / RELEASE
    assert p.links == ((mod / "build", p.build), (mod / "source", p.source))
    assert "6.1.0-57" in p.describe()

    kernel.apply_links(p)
    assert os.readlink(mod / "build") == str(p.build)
    assert os.readlink(mod / "source") == str(p.source)
    again = plan(tree)            # second run: the links are found, nothing to do
    assert again.links == () and again.build == p.build.resolve()


def test_package_without_common_dir_uses_itself_as_source(tree):
    build = headers(tree / "src", "linux-headers-6.1.0-57-amd64")
    p = plan(tree)
    assert p.source == build


def test_dangling_build_link_is_replaced(tree):
    mod = tree / "modules" / RELEASE
    mod.mkdir()
    (mod / "build").symlink_to(tree / "gone")
    headers(tree / "src", "linux-headers-6.1.0-57-amd64")
    p = plan(tree)
    kernel.apply_links(p)
    assert (mod / "build" / "Makefile").is_file()


def test_no_headers_anywhere_is_one_clear_error(tree):
    with pytest.raises(UserError) as err:
        plan(tree)
    assert "linux-headers-amd64" in err.value.fix
    assert "\n" not in err.value.one_line()


def test_real_but_empty_build_dir_is_not_overwritten(tree):
    (tree / "modules" / RELEASE / "build").mkdir(parents=True)
    headers(tree / "src", "linux-headers-6.1.0-57-amd64")
    with pytest.raises(UserError, match="exists but has no Makefile"):
        plan(tree)


def test_configured_headers_win_and_are_linked(tree):
    headers(tree / "modules" / RELEASE, "build")        # would be used otherwise ...
    (tree / "modules" / RELEASE / "build").rename(tree / "modules" / RELEASE / "real")
    (tree / "modules" / RELEASE / "build").symlink_to(tree / "modules" / RELEASE / "real")
    mine = headers(tree / "opt", "linux-headers-6.2-amd64")
    common = headers(tree / "opt", "linux-headers-6.2-common")
    p = plan(tree, str(mine))
    assert (p.build, p.source, p.origin) == (mine, common, "config kernel_headers")
    kernel.apply_links(p)
    assert os.readlink(tree / "modules" / RELEASE / "build") == str(mine)


def test_configured_headers_must_exist(tree):
    with pytest.raises(UserError, match="has no Makefile"):
        plan(tree, str(tree / "nope"))


def test_configured_headers_never_replace_a_real_directory(tree):
    headers(tree / "modules" / RELEASE, "build")
    mine = headers(tree / "opt", "hdrs")
    with pytest.raises(UserError, match="real directory"):
        plan(tree, str(mine))


def test_not_root_is_one_line_with_the_fix():
    with pytest.raises(UserError) as err:
        kernel.check_root(euid=1000)
    assert err.value.one_line() == ("fabricscope: error: must run as root to load BPF programs "
                                    "and mount tracefs; fix: run with sudo")
    kernel.check_root(euid=0)


def test_mounts_missing_when_their_marker_path_is_absent(tmp_path):
    present = tmp_path / "tracing"
    (present / "events").mkdir(parents=True)
    absent = tmp_path / "debug"
    absent.mkdir()
    mounts = (kernel.Mount("tracefs", present, True, "events"),
              kernel.Mount("debugfs", absent, False, "tracing"))
    assert [m.fstype for m in kernel.missing_mounts(mounts)] == ["debugfs"]


def test_required_mount_failure_is_a_user_error_optional_is_not(tmp_path):
    nowhere = tmp_path / "does-not-exist"
    optional = (kernel.Mount("debugfs", nowhere, False, "tracing"),)
    assert kernel.ensure_mounts(optional) == []
    required = (kernel.Mount("tracefs", nowhere, True, "events"),)
    with pytest.raises(UserError) as err:
        kernel.ensure_mounts(required)
    assert "mount -t tracefs nodev" in err.value.fix
