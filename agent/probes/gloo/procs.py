"""Which node a process belongs to, and which training job and rank it is.

Uprobes on a library fire in every process on the kernel that maps it, and one
kernel serves every lab node; a node's agent keeps only processes in its own
network namespace (compared by the inode of /proc/PID/ns/net); in Kubernetes, where
a node is a kernel, also the processes of the pods listed on the node, whatever
their network namespace (a pod off the host network has its own). Job and rank come
from the process's environment (/proc/PID/environ, readable by root) with the
rule of fabricscope/jobs.py, which the markers source uses too, so gloo records
and train_step records of one process carry the same tags. In Kubernetes the
process's pod (agent/kube/) adds namespace and pod, and its labels' training job
comes before MASTER_ADDR:MASTER_PORT (the markers source cannot see the pod: set
FABRICSCOPE_JOB from the label through the downward API where train_step must match).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.kube.resolver import PodIdentity, Resolution
from fabricscope.agent.procmaps import Environments, keep_newest, start_time
from fabricscope.jobs import tags_from_env


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    local: bool                # in the agent's network namespace
    job: str
    rank: str                  # RANK, '-' when unset
    world_size: int | None     # WORLD_SIZE, None when unset or not a number
    namespace: str = ""        # Kubernetes: the pod's namespace and name, "" elsewhere
    pod: str = ""


def describe(pid: int, env: dict[str, str], local: bool,
             pod: PodIdentity | None = None) -> ProcessInfo:
    tags = tags_from_env(env, pid, pod.job if pod else "", pod.index if pod else "")
    world = env.get("WORLD_SIZE", "")
    return ProcessInfo(pid=pid, local=local, job=tags["job"], rank=tags["rank"],
                       world_size=int(world) if world.isdigit() and int(world) > 0 else None,
                       namespace=pod.namespace if pod else "", pod=pod.pod if pod else "")


class ProcessTable:
    """Cache of ProcessInfo per pid (a process's namespace and environment at start).

    A process that exits keeps answering for GONE_S after it is forgotten: its last
    events may still be in the ring when the probe sees it gone (an agent the
    training starves of CPU drains them late), and by then /proc has no namespace
    for it (a zombie) or no entry at all (reaped). Its pid answers for it only while
    no other process holds the pid (the start time tells them apart).

    A process the probe's watcher thread witnessed (`witness`: its namespace here,
    its environment in `environments`) is named after it exits even when `get`
    first asks then: a short run can live and end between two of the agent's
    drains."""

    GONE_S = 30.0
    WITNESS_LIMIT = 4096

    def __init__(self, proc: Path = Path("/proc"), own_netns: int | None = None,
                 pods=None, environments: Environments | None = None, clock=time.monotonic):
        self.proc = proc
        self.pods = pods            # fabricscope.agent.kube.resolver.PodResolver, None outside Kubernetes
        #: shared with the agent's other /proc readers (procmaps.shared_environments)
        self.environments = environments if environments is not None else Environments()
        self.own_netns = own_netns if own_netns is not None else netns_inode(proc / "self")
        self.clock = clock
        self._known: dict[int, ProcessInfo] = {}
        self._starts: dict[int, str | None] = {}   # the start time each was read with
        self._gone: dict[int, float] = {}          # forgotten pids: when
        #: pid -> (start time, network namespace) read by `witness`, until `get` reads it
        self._witnessed: dict[int, tuple[str, int]] = {}
        self._lock = threading.Lock()              # `witness` runs on another thread
        self.late = 0        # answers for processes already gone

    def get(self, pid: int) -> ProcessInfo | None:
        """The process's info; None when it is gone (or /proc refuses) unless it was
        read before it went, within GONE_S."""
        base = self.proc / str(pid)
        info = self._known.get(pid)
        if info is not None:
            gone = self._gone.get(pid)
            if gone is None:
                return info
            start = start_time(str(base))
            if self.clock() - gone <= self.GONE_S and start in (None, self._starts.get(pid)):
                self.late += 1
                return info
            self._drop(pid)
        start = start_time(str(base))
        netns = netns_inode(base)
        if netns is None:
            netns = self._witnessed_netns(pid, start)
            if netns is None:
                return None
            self.late += 1
        local = netns == self.own_netns
        env: dict[str, str] = {}
        resolution, pod = Resolution.UNKNOWN, None
        if self.pods is not None:
            resolution, pod = self.pods.for_pid(self.proc, pid)
            # a Kubernetes node is a kernel of its own: a process of a pod listed on
            # this node is this node's, in whatever network namespace the pod runs
            # (the namespace rule tells apart lab nodes that share one kernel)
            local = local or resolution is Resolution.POD
        if local:
            try:
                env = self.environments.read(base)
            except OSError:
                recalled = self.environments.recall(base)    # reaped since it was witnessed
                if recalled is None:
                    return None
                env = recalled
        info = describe(pid, env, local, pod)
        if resolution is not Resolution.PENDING:    # its pod may be listed by the next ask
            self._known[pid], self._starts[pid] = info, start
            with self._lock:
                self._witnessed.pop(pid, None)
        return info

    def witness(self, pid: int) -> None:
        """Read what `get` needs of a process that just started calling, while it
        lives: its network namespace and start time here and, for a local one (in
        Kubernetes any: whether its pod is this node's is asked later), its
        environment into `environments`. Safe beside `get` on another thread."""
        base = self.proc / str(pid)
        start, netns = start_time(str(base)), netns_inode(base)
        if netns is None or start is None:
            return
        if netns == self.own_netns or self.pods is not None:
            try:
                self.environments.read(base)
            except OSError:
                return
        with self._lock:
            keep_newest(self._witnessed, pid, (start, netns), self.WITNESS_LIMIT)

    def _witnessed_netns(self, pid: int, start: str | None) -> int | None:
        """The namespace `witness` read for the process now gone (zombie: `start`
        still readable and the same; reaped: None), else None."""
        with self._lock:
            seen = self._witnessed.get(pid)
        if seen is None or start not in (None, seen[0]):
            return None
        return seen[1]

    def alive(self, pid: int) -> bool:
        # a zombie has no namespaces any more: it counts as gone
        return netns_inode(self.proc / str(pid)) is not None

    def forget(self, pid: int) -> None:
        """The process is gone: its info answers its late events for GONE_S more."""
        now = self.clock()
        with self._lock:
            self._witnessed.pop(pid, None)
        if pid in self._known:
            self._gone.setdefault(pid, now)
        for old in [p for p, t in self._gone.items() if now - t > self.GONE_S]:
            self._drop(old)

    def _drop(self, pid: int) -> None:
        self._known.pop(pid, None)
        self._starts.pop(pid, None)
        self._gone.pop(pid, None)

    def forgotten(self, pid: int) -> bool:
        """The process was seen gone (`forget`): what answers for it now are late events."""
        return pid in self._gone

    def pids(self) -> list[int]:
        """The processes not yet forgotten."""
        return [p for p in self._known if p not in self._gone]


def netns_inode(base: Path) -> int | None:
    """The inode of the network namespace of the process at `base` (/proc/PID); None
    once it is gone (a zombie has none)."""
    try:
        return os.stat(base / "ns" / "net").st_ino
    except OSError:
        return None
