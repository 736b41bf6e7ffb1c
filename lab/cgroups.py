"""One CPU cgroup per lab node, so a CPU quota can make that node's ranks a straggler.

    cgroup v1 (a hierarchy with the cpu controller, e.g. /sys/fs/cgroup/cpu):
        <mount>/fabricscope/<lab>/n<I>     cpu.cfs_period_us, cpu.cfs_quota_us (-1: none)
    cgroup v2 (the unified hierarchy, where the cpu controller is):
        <mount>/fabricscope/<lab>/n<I>     cpu.max "QUOTA PERIOD" ("max PERIOD": none),
        with +cpu in cgroup.subtree_control of every cgroup above it

Which one the host has is read from /proc/self/mounts (the cpu controller sits on
one hierarchy at a time). The cgroups are made at `lab up` and removed with the
lab; only the node's training ranks join theirs (fabricscope.lab.training, in the child
before exec), so a quota slows the rank as a slow host would while the node's
agent keeps its telemetry on time. A quota is QUOTA of every 100 ms period:
pct % of one CPU; the kernel throttles the cgroup for the rest of a period
once its tasks used QUOTA, and counts that in cpu.stat (nr_periods, nr_throttled).
The hierarchy is also bind-mounted read-only at /run/fabricscope-cgroup/<lab>
(expose), where the lab's agents, whose `ip netns exec` hides /sys/fs/cgroup, read
their ranks' throttled time.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import time
from dataclasses import dataclass

from fabricscope import cgroupcpu
from fabricscope.errors import UserError

log = logging.getLogger(__name__)

PERIOD_US = 100_000
MIN_QUOTA_US = 1_000          # the kernel refuses quotas under 1 ms
ROOT_NAME = "fabricscope"
#: where each lab's agents find the cpu hierarchy (expose)
EXPOSED_ROOT = "/run/fabricscope-cgroup"


@dataclass(frozen=True)
class Hierarchy(cgroupcpu.CpuHierarchy):
    def lab_dir(self, lab: str) -> str:
        return os.path.join(self.mount, ROOT_NAME, lab)

    def node_dir(self, lab: str, index: int) -> str:
        return os.path.join(self.lab_dir(lab), f"n{index}")


def parse_mounts(text: str, v2_controllers=lambda mount: "") -> Hierarchy | None:
    """The hierarchy with the cpu controller (fabricscope.cgroupcpu.parse_mounts)."""
    h = cgroupcpu.parse_mounts(text, v2_controllers)
    return None if h is None else Hierarchy(h.version, h.mount)


def detect() -> Hierarchy | None:
    h = cgroupcpu.detect()
    return None if h is None else Hierarchy(h.version, h.mount)


def quota_us(pct: float, ncpus: int) -> int:
    """pct % of one CPU as a quota per PERIOD_US; UserError unless 1 <= pct <= 100 * ncpus."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not pct == pct:
        raise UserError(f"CPU share {pct!r} is not a number", "give a percentage, e.g. 30")
    top = 100 * ncpus
    if not MIN_QUOTA_US * 100 / PERIOD_US <= pct <= top:
        raise UserError(f"CPU share {pct:g}% is out of range",
                        f"give a percentage of one CPU between 1 and {top} ({ncpus} CPUs)")
    return max(MIN_QUOTA_US, int(round(pct * PERIOD_US / 100)))


def create(lab: str, count: int) -> list[str]:
    """Make the lab's node cgroups; their paths, or [] (with a warning) where the host
    has no usable cpu controller: the lab works, only the CPU fault is missing."""
    h = detect()
    if h is None:
        log.warning("no cgroup hierarchy with the cpu controller: lab %s has no CPU fault", lab)
        return []
    paths = [h.node_dir(lab, i) for i in range(count)]
    try:
        if h.version == 2:
            _enable_cpu_v2(h, lab)
        for path in paths:
            os.makedirs(path, exist_ok=True)
    except OSError as exc:
        log.warning("cannot make CPU cgroups for lab %s (%s): it has no CPU fault", lab, exc)
        remove(lab)
        return []
    return paths


def _enable_cpu_v2(h: Hierarchy, lab: str) -> None:
    """+cpu in subtree_control from the mount down to the lab's cgroup (v2 gives a
    controller to a cgroup's children only when every ancestor delegates it)."""
    path = h.mount
    for part in (ROOT_NAME, lab):
        with open(os.path.join(path, "cgroup.subtree_control"), "w") as fh:
            fh.write("+cpu")
        path = os.path.join(path, part)
        os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cgroup.subtree_control"), "w") as fh:
        fh.write("+cpu")


def set_quota(path: str, quota: int | None) -> None:
    """Limit the cgroup to `quota` us of CPU per PERIOD_US; None lifts the limit."""
    if os.path.exists(os.path.join(path, "cpu.max")):
        _write(path, "cpu.max", f"{quota if quota else 'max'} {PERIOD_US}")
    else:
        _write(path, "cpu.cfs_period_us", str(PERIOD_US))
        _write(path, "cpu.cfs_quota_us", str(quota if quota else -1))


def quota(path: str) -> int | None:
    """The cgroup's quota in us per PERIOD_US, None when unlimited."""
    if os.path.exists(os.path.join(path, "cpu.max")):
        value = _read(path, "cpu.max").split()[0]
        return None if value == "max" else int(value)
    value = int(_read(path, "cpu.cfs_quota_us"))
    return None if value < 0 else value


def stat(path: str) -> dict[str, int]:
    """cpu.stat as ints (nr_periods, nr_throttled, ...; v2 adds usage_usec)."""
    return cgroupcpu.parse_stat(_read(path, "cpu.stat"))


def usage_ns(path: str) -> int:
    """CPU time the cgroup's tasks used: cpu.stat usage_usec (v2) or cpuacct.usage when
    cpuacct shares the hierarchy; else (v1 with cpuacct mounted apart, as here) the
    sum of the run time (/proc/<tid>/schedstat) of the threads in it now."""
    data = stat(path)
    if "usage_usec" in data:
        return data["usage_usec"] * 1000
    with contextlib.suppress(OSError):
        return int(_read(path, "cpuacct.usage"))
    total = 0
    for tid in _ids(path, "tasks"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
    return total


def procs(path: str) -> list[int]:
    """Pids of the processes in the cgroup ([] when it does not exist)."""
    return _ids(path, "cgroup.procs")


def joiner(path: str):
    """A preexec_fn that moves the new child into the cgroup before it execs (writing 0
    to cgroup.procs moves the writer), so not one instruction of the program runs
    outside. It only calls os.open/os.write/os.close on values prepared here."""
    target = os.path.join(path, "cgroup.procs").encode()

    def join() -> None:
        fd = os.open(target, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    return join


def lab_pids(lab: str) -> list[int]:
    """Processes in the lab's cgroups (to end before removing them)."""
    h = detect()
    if h is None or not os.path.isdir(h.lab_dir(lab)):
        return []
    return [pid for path in _tree(h.lab_dir(lab)) for pid in procs(path)]


def _tree(path: str) -> list[str]:
    """The cgroup at `path` and every cgroup below it, children first."""
    out = []
    for entry in sorted(os.listdir(path)):
        child = os.path.join(path, entry)
        if os.path.isdir(child):
            out += _tree(child)
    return out + [path]


def remove(lab: str, wait_s: float = 3.0) -> bool:
    """Remove the lab's cgroups (their processes must be ended first); True when any
    was there. A cgroup whose last task is still exiting refuses rmdir (EBUSY) for a
    moment: retried for up to wait_s, then left with a warning."""
    exposed = _unexpose(lab)
    h = detect()
    if h is None or not os.path.isdir(h.lab_dir(lab)):
        return exposed
    try:
        _rmdir_tree(h.lab_dir(lab), wait_s)
    except OSError as exc:      # the rest of the teardown still runs; `lab down` again retries
        log.warning("cannot remove the cgroups of lab %s: %s", lab, exc)
        return True
    _rmdir_quietly(os.path.join(h.mount, ROOT_NAME))     # the last lab takes the parent along
    return True


def lab_names() -> list[str]:
    """Names of the labs that have cgroups or an exposed hierarchy now (orphans
    included)."""
    h = detect()
    root = os.path.join(h.mount, ROOT_NAME) if h else ""
    names = set()
    for base in (root, EXPOSED_ROOT):
        if base and os.path.isdir(base):
            names |= {e for e in os.listdir(base) if os.path.isdir(os.path.join(base, e))}
    return sorted(names)


def exposed_dir(lab: str) -> str:
    return os.path.join(EXPOSED_ROOT, lab)


def expose(lab: str) -> str | None:
    """A read-only bind mount of the cpu hierarchy outside /sys for the lab's agents,
    so that they can read their ranks' throttled time: `ip netns exec` mounts a fresh
    sysfs for the namespace, without the cgroup mounts under /sys/fs/cgroup (a
    DaemonSet pod mounts the host's /sys instead). The agent finds it in its mount
    table like any cgroup mount. Its path, or None (with a warning) where it cannot
    be made: the agents then report no throttled time."""
    h = detect()
    if h is None:
        return None
    target = exposed_dir(lab)
    if _mounted(target):
        return target
    try:
        os.makedirs(target, exist_ok=True)
        for argv in (["mount", "--bind", h.mount, target],
                     ["mount", "-o", "remount,bind,ro", target]):
            subprocess.run(argv, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        log.warning("cannot expose the cpu cgroups to lab %s's agents (%s): they report "
                    "no throttled time", lab, detail.strip())
        _unexpose(lab)
        return None
    return target


def _unexpose(lab: str) -> bool:
    """Unmount and remove the lab's exposed hierarchy; True when it was there. Only
    ever rmdir (never a recursive delete): a mount left in place refuses it."""
    target = exposed_dir(lab)
    found = _mounted(target)
    if found:
        subprocess.run(["umount", "-l", target], capture_output=True)
    if os.path.isdir(target):
        found = True
        _rmdir_quietly(target)
    _rmdir_quietly(EXPOSED_ROOT)
    return found


def _mounted(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as fh:
            return any(line.split()[1:2] == [path] for line in fh)
    except OSError:
        return False


def _rmdir_tree(path: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    for cgroup in _tree(path):
        while True:
            try:
                os.rmdir(cgroup)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)


def _rmdir_quietly(path: str) -> None:
    with contextlib.suppress(OSError):       # not empty: other labs still use it
        os.rmdir(path)


def _ids(path: str, name: str) -> list[int]:
    try:
        return [int(x) for x in _read(path, name).split()]
    except FileNotFoundError:
        return []


def _read(path: str, name: str) -> str:
    with open(os.path.join(path, name)) as fh:
        return fh.read()


def _write(path: str, name: str, value: str) -> None:
    with open(os.path.join(path, name), "w") as fh:
        fh.write(value)

