"""Which node a process belongs to, and which training job and rank it is.

Uprobes on a library fire in every process on the kernel that maps it, and one
kernel serves every lab node; a node's agent keeps only processes in its own
network namespace (compared by the inode of /proc/PID/ns/net). Job and rank come
from the process's environment (/proc/PID/environ, readable by root) with the
rule of fabricscope/jobs.py, which the markers source uses too, so gloo records
and train_step records of one process carry the same tags. In Kubernetes the
process's pod (agent/kube/) adds namespace and pod, and its labels' training job
comes before MASTER_ADDR:MASTER_PORT (the markers source cannot see the pod: set
FABRICSCOPE_JOB from the label through the downward API where train_step must match).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.kube.resolver import PodIdentity, Resolution
from fabricscope.agent.procmaps import Environments
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
    """Cache of ProcessInfo per pid (a process's namespace and environment at start)."""

    def __init__(self, proc: Path = Path("/proc"), own_netns: int | None = None,
                 pods=None, environments: Environments | None = None):
        self.proc = proc
        self.pods = pods            # fabricscope.agent.kube.resolver.PodResolver, None outside Kubernetes
        #: shared with the agent's other /proc readers (procmaps.shared_environments)
        self.environments = environments if environments is not None else Environments()
        self.own_netns = own_netns if own_netns is not None else _netns(proc / "self")
        self._known: dict[int, ProcessInfo] = {}

    def get(self, pid: int) -> ProcessInfo | None:
        """The process's info; None when it is gone (or /proc refuses)."""
        info = self._known.get(pid)
        if info is not None:
            return info
        base = self.proc / str(pid)
        netns = _netns(base)
        if netns is None:
            return None
        local = netns == self.own_netns
        env: dict[str, str] = {}
        resolution, pod = Resolution.UNKNOWN, None
        if local:
            try:
                env = self.environments.read(base)
            except OSError:
                return None
            if self.pods is not None:
                resolution, pod = self.pods.for_pid(self.proc, pid)
        info = describe(pid, env, local, pod)
        if resolution is not Resolution.PENDING:    # its pod may be listed by the next ask
            self._known[pid] = info
        return info

    def alive(self, pid: int) -> bool:
        # a zombie has no namespaces any more: it counts as gone
        return _netns(self.proc / str(pid)) is not None

    def forget(self, pid: int) -> None:
        self._known.pop(pid, None)

    def pids(self) -> list[int]:
        return list(self._known)


def _netns(base: Path) -> int | None:
    try:
        return os.stat(base / "ns" / "net").st_ino
    except OSError:
        return None
