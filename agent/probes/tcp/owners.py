"""Who owns a TCP flow: pid, command, cgroup/container, and training rank and job.

Kernel events name a flow by its addresses and ports only. The owner is found
from user space, in the agent's network namespace:

1. /proc/net/tcp and /proc/net/tcp6 (of the agent's namespace: they list only
   its sockets; read through /proc/thread-self) map local and remote
   address:port to the socket's inode;
2. /proc/PID/fd/* links `socket:[INODE]` map the inode to the process holding it
   (processes of the agent's namespace are scanned first; the scan stops when
   every wanted inode is found);
3. /proc/PID/comm, /proc/PID/cgroup and, for rank and job, /proc/PID/environ
   (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT or FABRICSCOPE_JOB, the
   rule of fabricscope/jobs.py, as the markers source and the gloo probe);
4. in Kubernetes (Owners.pods, agent/kube/), the pod the cgroup names: namespace,
   pod and the training job of its labels.

Answers are cached per flow; only unknown flows trigger a rescan, at most one per
`rescan_s`, and a flow still unknown after `max_attempts` scans is given up
(kernel sockets, processes that already closed it) and counted. Nothing here
needs BPF: tests run it on a fake /proc tree.

A scan finds only sockets still open, so a connection that lives less than a
rescan (a data-loader fetch, a checkpoint upload) would escape it. The kernel
probes therefore name the process that connected a flow (connect() runs in it:
sock/inet_sock_set_state -> SYN_SENT) and `learn` takes that pid's owner straight
from /proc/PID. Kernel pids are host pids: they are used only when the agent sees
the host's pid namespace (hostPID in Kubernetes), else the scan alone answers.
"""

from __future__ import annotations

import ipaddress
import os
import re
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fabricscope.agent.kube.resolver import PodIdentity
from fabricscope.agent.procmaps import Environments
from fabricscope.jobs import tags_from_env

#: (local address, local port, remote address, remote port); addresses as text
FlowKey = tuple[str, int, str, int]

_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")


@dataclass(frozen=True)
class Owner:
    pid: int
    comm: str
    cgroup: str = ""
    container: str = ""
    rank: str = ""           # "" when the process has no RANK
    local_rank: str = ""
    world_size: str = ""
    job: str = ""
    namespace: str = ""      # Kubernetes: the pod's namespace and name
    pod: str = ""

    def tags(self) -> dict[str, str]:
        """Record tags: the ones this owner has (empty values are left out)."""
        out = {"pid": str(self.pid), "comm": self.comm, "cgroup": self.cgroup,
               "container": self.container, "rank": self.rank, "local_rank": self.local_rank,
               "world_size": self.world_size, "job": self.job,
               "namespace": self.namespace, "pod": self.pod}
        return {k: v for k, v in out.items() if v}


def _addr(hex_text: str) -> str:
    """/proc/net/tcp address: the in-memory (network order) bytes printed as
    native-endian u32 words."""
    words = [int(hex_text[i:i + 8], 16) for i in range(0, len(hex_text), 8)]
    ip = ipaddress.ip_address(struct.pack(f"={len(words)}I", *words))
    if ip.version == 6 and ip.ipv4_mapped:
        return str(ip.ipv4_mapped)
    return str(ip)


#: the inode of the initial pid namespace (PROC_PID_INIT_INO, include/linux/proc_ns.h)
_HOST_PID_NS_INO = 0xEFFFFFFC


def _in_host_pid_namespace(proc: Path) -> bool:
    try:
        return os.stat(proc / "self" / "ns" / "pid").st_ino == _HOST_PID_NS_INO
    except OSError:
        return False


def parse_proc_net_tcp(text: str) -> dict[FlowKey, int]:
    """Content of /proc/net/tcp or tcp6 -> {flow: socket inode} (inode 0 left out)."""
    out: dict[FlowKey, int] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        (laddr, lport), (raddr, rport) = (p.split(":") for p in parts[1:3])
        inode = int(parts[9])
        if inode:
            out[(_addr(laddr), int(lport, 16), _addr(raddr), int(rport, 16))] = inode
    return out


def parse_cgroup(text: str) -> tuple[str, str]:
    """/proc/PID/cgroup -> (path, container id).

    path: the cgroup v2 line's, unless it is the root "/" on a hybrid host, then the
    first more specific v1 path. Container id: the first 64-hex id in any line
    (docker, containerd, cri-o name their cgroups after it), shortened to 12."""
    v2, v1 = "", ""
    container = ""
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            v2 = path
        elif path not in ("", "/") and not v1:
            v1 = path
        m = _CONTAINER_ID.search(path)
        if m and not container:
            container = m.group(1)[:12]
    return (v2 if v2 not in ("", "/") else v1 or v2 or "/"), container


def describe_process(pid: int, comm: str, cgroup: tuple[str, str],
                     env: dict[str, str], pod: PodIdentity | None = None) -> Owner:
    """cgroup: parse_cgroup's (path, container); pod: its Kubernetes pod, if known."""
    rank = local_rank = world = job = ""
    pod_job, index = (pod.job, pod.index) if pod else ("", "")
    if "RANK" in env or "FABRICSCOPE_JOB" in env or pod_job:
        tags = tags_from_env(env, pid, pod_job, index)
        rank, job = (tags["rank"] if tags["rank"] != "-" else ""), tags["job"]
        local_rank = env.get("LOCAL_RANK", "")
        world = env.get("WORLD_SIZE", "")
    return Owner(pid, comm, cgroup[0], cgroup[1], rank, local_rank, world, job,
                 pod.namespace if pod else "", pod.pod if pod else "")


@dataclass
class OwnerStats:
    resolved: int = 0          # flows whose owner was found
    unresolved: int = 0        # flows given up after max_attempts scans
    learned: int = 0           # flows whose owner came from the pid the kernel saw connect
    scans: int = 0             # rescans of /proc/net/tcp (+ fds when needed)
    fd_scans: int = 0          # processes whose fds were read


@dataclass
class Owners:
    """Flow -> Owner cache over a /proc tree (the agent's namespace's view)."""

    proc: Path = Path("/proc")
    rescan_s: float = 1.0
    max_attempts: int = 3
    clock: Callable[[], float] = time.monotonic
    max_cached: int = 65536
    stats: OwnerStats = field(default_factory=OwnerStats)
    #: kernel pids name processes in this /proc (None: decide once, from whether the
    #: agent's pid namespace is the host's)
    host_pids: bool | None = None
    #: fabricscope.agent.kube.resolver.PodResolver in Kubernetes (namespace, pod and job tags)
    pods: object = None
    #: environments read while their processes lived, shared with the agent's other
    #: /proc readers: a process read after it exited still has its rank
    environments: Environments = field(default_factory=Environments)

    def __post_init__(self) -> None:
        self._flows: dict[FlowKey, Owner | None] = {}
        self._attempts: dict[FlowKey, int] = {}
        self._by_pid: dict[int, Owner] = {}
        self._last_scan: float | None = None
        self._own_netns: int | None = None

    def _me(self) -> Path:
        """/proc/thread-self where it exists: the calling thread's namespace, which
        differs from the process's when a thread joined another one (setns; tests)."""
        me = self.proc / "thread-self"
        return me if me.exists() else self.proc / "self"

    def get(self, flow: FlowKey) -> Owner | None:
        """The cached owner (None: unknown or given up); never scans."""
        return self._flows.get(flow)

    def resolve(self, flows) -> dict[FlowKey, Owner]:
        """Owners of `flows`; unknown ones trigger one rescan when it is due."""
        wanted = [f for f in set(flows) if f not in self._flows]
        now = self.clock()
        if wanted and (self._last_scan is None or now - self._last_scan >= self.rescan_s):
            self._last_scan = now
            self._scan(wanted)
        return {f: o for f in flows if (o := self._flows.get(f)) is not None}

    def learn(self, flow: FlowKey, pid: int) -> None:
        """The kernel saw `pid` (host pid namespace) connect `flow`: its owner, read now
        from /proc/PID while the process lives, with no scan. Ignored when this /proc
        shows another pid namespace, or the process is already gone (a scan may still
        find the socket in another process that inherited it)."""
        if self._flows.get(flow) is not None:
            return
        if self.host_pids is None:
            self.host_pids = _in_host_pid_namespace(self.proc)
        if not self.host_pids:
            return
        owner = self._read_owner(pid)        # fresh: pids are reused
        if owner is not None:
            self._bound_cache()
            self._flows[flow] = owner
            self._attempts.pop(flow, None)
            self.stats.learned += 1

    def pending(self, flow: FlowKey) -> bool:
        """Not known yet and not given up: a later rescan may still find its owner."""
        return flow not in self._flows

    def forget(self, flow: FlowKey) -> None:
        self._flows.pop(flow, None)
        self._attempts.pop(flow, None)

    def _scan(self, wanted: list[FlowKey]) -> None:
        self.stats.scans += 1
        self._by_pid.clear()               # pids are reused: read them fresh each scan
        try:
            self._own_netns = os.stat(self._me() / "ns" / "net").st_ino
        except OSError:
            self._own_netns = None
        self._bound_cache()
        inodes = self._socket_inodes()
        want_inodes = {inodes[f]: f for f in wanted if f in inodes}
        found = self._pids_holding(set(want_inodes)) if want_inodes else {}
        for inode, pid in found.items():
            owner = self._owner(pid)
            if owner is not None:
                self._flows[want_inodes[inode]] = owner
                self.stats.resolved += 1
        for f in wanted:
            if f in self._flows:
                continue
            self._attempts[f] = self._attempts.get(f, 0) + 1
            if self._attempts[f] >= self.max_attempts:
                self._flows[f] = None          # given up: no more scans for it
                self.stats.unresolved += 1

    def _bound_cache(self) -> None:
        if len(self._flows) > self.max_cached:   # flows whose close we never saw
            self._flows.clear()
            self._attempts.clear()

    def _socket_inodes(self) -> dict[FlowKey, int]:
        out: dict[FlowKey, int] = {}
        for name in ("tcp", "tcp6"):
            try:
                out.update(parse_proc_net_tcp((self._me() / "net" / name).read_text()))
            except OSError:
                continue
        return out

    def _pids(self) -> list[int]:
        """Pids, those of the agent's network namespace first."""
        local, other = [], []
        for entry in os.scandir(self.proc):
            if entry.name.isdigit():
                try:
                    ino = os.stat(os.path.join(entry.path, "ns", "net")).st_ino
                except OSError:
                    ino = None
                (local if ino == self._own_netns else other).append(int(entry.name))
        return local + other

    def _pids_holding(self, inodes: set[int]) -> dict[int, int]:
        found: dict[int, int] = {}
        for pid in self._pids():
            self.stats.fd_scans += 1
            fd_dir = self.proc / str(pid) / "fd"
            try:
                names = os.listdir(fd_dir)
            except OSError:
                continue
            for name in names:
                try:
                    m = _SOCKET_LINK.match(os.readlink(fd_dir / name))
                except OSError:
                    continue
                if m and int(m.group(1)) in inodes and int(m.group(1)) not in found:
                    found[int(m.group(1))] = pid
            if len(found) == len(inodes):
                break
        return found

    def _owner(self, pid: int) -> Owner | None:
        """The owner of pid, read once per scan."""
        if pid not in self._by_pid:
            owner = self._read_owner(pid)
            if owner is None:
                return None
            self._by_pid[pid] = owner
        return self._by_pid[pid]

    def _read_owner(self, pid: int) -> Owner | None:
        base = self.proc / str(pid)
        try:
            comm = (base / "comm").read_text().strip()
        except OSError:
            # reaped before this read (a short run, an agent starved of CPU): its rank
            # and job if another probe read them while it lived
            env = self.environments.recall(base)
            return describe_process(pid, "", ("", ""), env) if env is not None else None
        try:
            cgroup_text = (base / "cgroup").read_text()
        except OSError:
            cgroup_text = ""
        try:
            env = self.environments.read(base)
        except OSError:
            env = {}
        # a pod still PENDING (started since the last relist) is tagged without it
        pod = self.pods.identify(cgroup_text)[1] if self.pods is not None else None
        return describe_process(pid, comm, parse_cgroup(cgroup_text) if cgroup_text
                                else ("", ""), env, pod)
