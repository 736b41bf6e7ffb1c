"""The cgroup CPU controller as the kernel shows it: where its hierarchy is mounted, a
process's cgroup in it, and that cgroup's quota and throttling.

    cgroup v1: <mount>/<path>/cpu.stat      nr_periods nr_throttled throttled_time (ns)
               <mount>/<path>/cpu.cfs_quota_us, cpu.cfs_period_us (quota -1: none)
    cgroup v2: <mount>/<path>/cpu.stat      ... nr_periods nr_throttled throttled_usec
               <mount>/<path>/cpu.max       "QUOTA PERIOD" ("max PERIOD": none)

A CFS quota lets a cgroup's tasks run QUOTA us of every PERIOD us; once they used
it, the kernel takes them off the CPU until the next period and adds the rest of the
period to the throttled time. That is what a Kubernetes CPU limit does to a pod, and
a throttled training rank is late to its collectives or slow inside them. Shared by
the lab (which sets quotas) and the agent (which reads them for each training rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuHierarchy:
    version: int              # 1 or 2
    mount: str                # where the hierarchy holding the cpu controller is mounted


def parse_mounts(text: str, v2_controllers=lambda mount: "") -> CpuHierarchy | None:
    """The hierarchy with the cpu controller, from /proc/self/mounts text: a v1
    `cgroup` mount whose options name `cpu`, else a `cgroup2` mount whose
    cgroup.controllers (v2_controllers(mount)) lists it; None when neither."""
    v2 = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mount, fstype, options = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup" and "cpu" in options:
            return CpuHierarchy(1, mount)
        if fstype == "cgroup2":
            v2.append(mount)
    for mount in v2:
        if "cpu" in v2_controllers(mount).split():
            return CpuHierarchy(2, mount)
    return None


def detect(mounts: str = "/proc/self/mounts") -> CpuHierarchy | None:
    def controllers(mount: str) -> str:
        try:
            with open(os.path.join(mount, "cgroup.controllers")) as fh:
                return fh.read()
        except OSError:
            return ""
    try:
        with open(mounts) as fh:
            return parse_mounts(fh.read(), controllers)
    except OSError:
        return None


def process_cgroup(text: str, version: int) -> str | None:
    """A process's cgroup in the cpu hierarchy, from /proc/PID/cgroup text: the v1 line
    whose controllers include `cpu`, or v2's `0::` line; None when there is none, or
    when the path climbs out of the reader's cgroup namespace ("/../.."): a reader in
    a private cgroup namespace (a container's) sees other containers' cgroups relative
    to its own, which its view of the hierarchy's mount cannot place."""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (version == 2 and hierarchy == "0" and controllers == "") or \
                (version == 1 and "cpu" in controllers.split(",")):
            return None if ".." in path.split("/") else path
    return None


def parse_stat(text: str) -> dict[str, int]:
    """cpu.stat as ints (nr_periods, nr_throttled, throttled_time or throttled_usec, ...)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def throttled_ns(stat: dict[str, int]) -> int | None:
    """Time the cgroup was throttled, summed over the CPUs it ran on (v1
    throttled_time, v2 throttled_usec); None when cpu.stat has neither."""
    if "throttled_usec" in stat:
        return stat["throttled_usec"] * 1000
    return stat.get("throttled_time")


def parse_limit(cpu_max: str | None, quota_us: str | None, period_us: str | None
                ) -> float | None:
    """The quota in CPUs (quota / period) from cpu.max (v2) or cpu.cfs_quota_us and
    cpu.cfs_period_us (v1); None when unlimited or unreadable."""
    try:
        if cpu_max is not None:
            quota, period = cpu_max.split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if quota_us is not None and period_us is not None:
            quota_v, period_v = int(quota_us), int(period_us)
            return None if quota_v < 0 or period_v <= 0 else quota_v / period_v
    except (ValueError, ZeroDivisionError):
        return None
    return None


class CgroupCpu:
    """One cgroup of the cpu hierarchy: its throttled time and its quota, read on
    demand (a few small files: cheap enough for every agent poll)."""

    def __init__(self, hierarchy: CpuHierarchy, path: str):
        self.dir = os.path.join(hierarchy.mount, path.lstrip("/"))
        self.version = hierarchy.version

    @classmethod
    def of_process(cls, hierarchy: CpuHierarchy | None, pid: int, proc: str = "/proc"
                   ) -> CgroupCpu | None:
        """The cgroup the process is in now; None without a cpu hierarchy or once the
        process is gone."""
        if hierarchy is None:
            return None
        try:
            with open(os.path.join(proc, str(pid), "cgroup")) as fh:
                path = process_cgroup(fh.read(), hierarchy.version)
        except OSError:
            return None
        return None if path is None else cls(hierarchy, path)

    def throttled_ns(self) -> int | None:
        """None when the cgroup is gone or shows no throttling counters."""
        try:
            return throttled_ns(parse_stat(self._read("cpu.stat")))
        except OSError:
            return None

    def limit_cpus(self) -> float | None:
        if self.version == 2:
            return parse_limit(self._read_or_none("cpu.max"), None, None)
        return parse_limit(None, self._read_or_none("cpu.cfs_quota_us"),
                           self._read_or_none("cpu.cfs_period_us"))

    def _read(self, name: str) -> str:
        with open(os.path.join(self.dir, name)) as fh:
            return fh.read()

    def _read_or_none(self, name: str) -> str | None:
        try:
            return self._read(name)
        except OSError:
            return None
