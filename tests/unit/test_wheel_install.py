"""The wheel holds one package, `fabricscope`, with its BPF sources as package data,
and what it installs runs from anywhere (tests/support/wheel.py builds and installs
it). The agent, collector and diagnose running from the install against a lab:
tests/kernel/test_wheel_live.py."""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from tests.support.wheel import installed_wheel


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    return installed_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_only_the_fabricscope_package(installed):
    names = zipfile.ZipFile(installed.wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"fabricscope", "fabricscope-0.1.0.dist-info"}, tops
    for component in ("agent", "collector", "lab", "bench", "demo", "diagnosis", "surface"):
        assert f"fabricscope/{component}/__init__.py" in names, component
    assert {"fabricscope/bpf/gloo.bpf.c", "fabricscope/bpf/nic.bpf.c",
            "fabricscope/bpf/fs_common.h"} <= set(names)
    assert "fabricscope/v1/telemetry_pb2.py" in names
    assert not [n for n in names if n.startswith(("fabricscope/tests", "tests/"))]


def run(installed, *argv: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_the_installed_package_imports_from_the_install_and_finds_its_bpf_sources(
        installed, tmp_path):
    proc = run(installed, installed.python, "-c",
               "import fabricscope, fabricscope.agent.bpf as b, fabricscope.agent.probes as p; "
               "print(fabricscope.__file__); print(b.BPF_DIR); print(sorted(p.REGISTRY))",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    package, bpf_dir, probes = proc.stdout.splitlines()
    assert package.startswith(str(installed.site)), package
    assert bpf_dir == str(installed.site / "fabricscope" / "bpf")
    assert (installed.site / "fabricscope" / "bpf" / "tcp_retransmit.bpf.c").is_file()
    assert "'nic'" in probes and "'gloo'" in probes


@pytest.mark.parametrize("command", ["agent", "collector", "diagnose", "lab", "bench", "report"])
def test_every_command_of_the_installed_script_runs(installed, tmp_path, command):
    proc = run(installed, installed.fabricscope, command, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
