"""Network-namespace chores netlink does not cover: sysctls inside a netns, the
processes living in one, removing it.

A netns sysctl (/proc/sys/net/...) is per network namespace of the *calling
thread*, so `ns_sysctl` enters the namespace with setns(2) in a short-lived
thread and leaves the rest of the process where it is (no fork, no `ip netns exec`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import signal
import threading
import time

log = logging.getLogger(__name__)

NETNS_RUN_DIR = "/var/run/netns"
CLONE_NEWNET = 0x40000000


def netns_path(name: str) -> str:
    return os.path.join(NETNS_RUN_DIR, name)


def netns_names() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_RUN_DIR))
    except FileNotFoundError:
        return []


def set_sysctl(path: str, value: str) -> None:
    """Write a /proc/sys file of the calling thread's namespace; missing files are ignored."""
    with contextlib.suppress(FileNotFoundError):
        with open(path, "w") as fh:
            fh.write(value)


def ns_sysctl(name: str, settings: dict[str, str]) -> None:
    """Write /proc/sys files (keys: paths under /proc/sys/) inside netns `name`."""
    errors: list[BaseException] = []

    def enter_and_write() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns_path(name), os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({name}): {os.strerror(err)}")
            finally:
                os.close(fd)
            for key, value in settings.items():
                set_sysctl(os.path.join("/proc/sys", key), value)
        except BaseException as exc:       # handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=enter_and_write, name=f"setns-{name}")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def remove_netns(name: str) -> bool:
    """Unmount and unlink /var/run/netns/<name>; False when there was none."""
    from pyroute2 import netns
    if not os.path.exists(netns_path(name)):
        return False
    try:
        netns.remove(name)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EINVAL):
            raise
    return True


def netns_pids(names: list[str]) -> list[int]:
    """Pids of the processes whose network namespace is one of `names` (not our own)."""
    inodes = set()
    for name in names:
        try:
            st = os.stat(netns_path(name))
            inodes.add((st.st_dev, st.st_ino))
        except OSError:
            pass
    if not inodes:
        return []
    pids, me = [], os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in inodes:
            pids.append(int(entry))
    return pids


def end_processes(names: list[str], grace_s: float = 3.0) -> int:
    """SIGTERM the processes in these namespaces, SIGKILL what is left after grace_s.

    Left alive, they would keep the namespace (and its veth, and so the switch port)
    in existence after the lab is gone."""
    return end_pids(netns_pids(names), ", ".join(names), grace_s)


def end_pids(pids: list[int], where: str, grace_s: float = 3.0) -> int:
    """SIGTERM these processes (of a lab: in its namespaces or cgroups), SIGKILL what
    is left after grace_s; returns how many there were."""
    pids = sorted(set(pids))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        log.info("ended %d process(es) left in %s", len(pids), where)
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
