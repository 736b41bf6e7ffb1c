"""fabricscope.lab.cgroups without root: finding the cpu controller, quota arithmetic, the
control files of v1 and v2 (on plain files), and the preexec join."""

import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.errors import UserError
from fabricscope.lab import cgroups

V1_MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V1_COMOUNTED = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"


def test_the_hierarchy_holding_the_cpu_controller_is_found():
    assert cgroups.parse_mounts(V1_MOUNTS) == cgroups.Hierarchy(1, "/sys/fs/cgroup/cpu")
    assert cgroups.parse_mounts(V1_COMOUNTED) == cgroups.Hierarchy(1, "/sys/fs/cgroup/cpu,cpuacct")
    controllers = {"/sys/fs/cgroup": "cpuset cpu io memory pids"}
    assert cgroups.parse_mounts(V2_MOUNTS, controllers.get) == cgroups.Hierarchy(2, "/sys/fs/cgroup")
    # cgroup2 without cpu delegated (it is bound to a v1 hierarchy, or missing): none
    assert cgroups.parse_mounts(V2_MOUNTS, lambda m: "memory pids") is None
    assert cgroups.parse_mounts("cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\n") is None
    assert cgroups.parse_mounts("") is None


def test_node_cgroups_live_under_fabricscope_and_the_lab():
    h = cgroups.Hierarchy(1, "/sys/fs/cgroup/cpu")
    assert h.lab_dir("demo") == "/sys/fs/cgroup/cpu/fabricscope/demo"
    assert h.node_dir("demo", 3) == "/sys/fs/cgroup/cpu/fabricscope/demo/n3"


@pytest.mark.parametrize("pct,quota", [(30, 30_000), (1, 1_000), (12.5, 12_500), (100, 100_000),
                                       (200, 200_000), (2.0004, 2_000)])
def test_quota_is_pct_of_each_100_ms_period(pct, quota):
    assert cgroups.quota_us(pct, ncpus=2) == quota


@pytest.mark.parametrize("pct", [0, -5, 0.5, 201, float("nan"), "30", True, None])
def test_bad_cpu_shares_are_user_errors(pct):
    with pytest.raises(UserError) as err:
        cgroups.quota_us(pct, ncpus=2)
    assert "\n" not in err.value.one_line()


def test_an_out_of_range_share_names_the_range():
    with pytest.raises(UserError) as err:
        cgroups.quota_us(250, ncpus=2)
    assert "between 1 and 200" in err.value.fix


def test_v1_control_files(tmp_path):
    for name, value in (("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", "-1"),
                        ("cgroup.procs", "12\n34\n"), ("tasks", ""),
                        ("cpu.stat", "nr_periods 10\nnr_throttled 9\nthrottled_time 5\n")):
        (tmp_path / name).write_text(value)
    assert cgroups.quota(str(tmp_path)) is None
    cgroups.set_quota(str(tmp_path), 30_000)
    assert (tmp_path / "cpu.cfs_quota_us").read_text() == "30000"
    assert cgroups.quota(str(tmp_path)) == 30_000
    cgroups.set_quota(str(tmp_path), None)
    assert (tmp_path / "cpu.cfs_quota_us").read_text() == "-1"
    assert cgroups.stat(str(tmp_path)) == {"nr_periods": 10, "nr_throttled": 9,
                                           "throttled_time": 5}
    assert cgroups.procs(str(tmp_path)) == [12, 34]
    assert cgroups.procs(str(tmp_path / "gone")) == []
    assert cgroups.usage_ns(str(tmp_path)) == 0           # no cpuacct, no tasks in it
    (tmp_path / "cpuacct.usage").write_text("123456\n")
    assert cgroups.usage_ns(str(tmp_path)) == 123456


def test_v2_control_files(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 2500\nnr_periods 3\nnr_throttled 1\n")
    assert cgroups.quota(str(tmp_path)) is None
    cgroups.set_quota(str(tmp_path), 25_000)
    assert (tmp_path / "cpu.max").read_text() == "25000 100000"
    assert cgroups.quota(str(tmp_path)) == 25_000
    cgroups.set_quota(str(tmp_path), None)
    assert (tmp_path / "cpu.max").read_text() == "max 100000"
    assert cgroups.usage_ns(str(tmp_path)) == 2_500_000


def test_the_join_runs_in_the_child_before_exec(tmp_path):
    """The child writes 0 (itself) to cgroup.procs before the program starts: here a
    plain file stands in for the cgroup, and the program sees the write done."""
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    out = subprocess.run([sys.executable, "-c", f"print(open({str(procs)!r}).read())"],
                         preexec_fn=cgroups.joiner(str(tmp_path)), capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "0"


def test_v2_creation_delegates_cpu_down_to_the_lab(tmp_path, monkeypatch):
    """v2 gives a controller to a cgroup's children only when every ancestor lists it
    in cgroup.subtree_control (plain files stand in for the cgroupfs)."""
    monkeypatch.setattr(cgroups, "detect", lambda: cgroups.Hierarchy(2, str(tmp_path)))
    paths = cgroups.create("demo", 2)
    assert paths == [str(tmp_path / "fabricscope/demo/n0"), str(tmp_path / "fabricscope/demo/n1")]
    for level in (tmp_path, tmp_path / "fabricscope", tmp_path / "fabricscope/demo"):
        assert (level / "cgroup.subtree_control").read_text() == "+cpu"
    assert all(Path(p).is_dir() for p in paths)


def test_no_cpu_controller_means_no_cgroups_and_a_lab_all_the_same(tmp_path, monkeypatch,
                                                                    caplog):
    monkeypatch.setattr(cgroups, "detect", lambda: None)
    # a lab running on this machine meanwhile exposes its hierarchy there
    monkeypatch.setattr(cgroups, "EXPOSED_ROOT", str(tmp_path / "exposed"))
    assert cgroups.create("demo", 2) == []
    assert "no CPU fault" in caplog.text
    assert cgroups.remove("demo") is False and cgroups.lab_pids("demo") == []
    assert cgroups.lab_names() == []
