"""A process's cgroup -> its pod (namespace, name), training job and index.

The answer is one of four (Resolution): POD; NOT_IN_POD (a cgroup outside
kubepods: node services, the node's users); UNKNOWN (the pod cannot be named: a
private cgroup namespace, a garbled file, a pod the list still lacks after two
relists, or no list at all because its source is unreachable); PENDING (the pod's
UID is not in the list yet but a relist is on its way: a pod that just started).
Callers that cache an answer per process ask again after PENDING, so the job tag
of a process does not change under it. Each answer is counted (stats()).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from fabricscope.agent.kube.cache import PodCache
from fabricscope.agent.kube.cgroup import CgroupVerdict, parse_pod_cgroup
from fabricscope.agent.kube.training import training_job

_MAX_MISSES = 4096


class Resolution(enum.Enum):
    POD = "pod"
    NOT_IN_POD = "not_in_pod"
    PENDING = "pending"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class PodIdentity:
    namespace: str
    pod: str
    uid: str
    job: str = ""            # NAMESPACE/NAME of its training job (job_id); "" when none
    index: str = ""          # the pod's index in its job; "" when unknown

    def tags(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod}


def job_id(namespace: str, name: str) -> str:
    """A training job's id: its name within its namespace, as kubectl writes one
    (`research/llama`). A job's name is unique only in its namespace: two teams'
    `finetune` jobs must not be one job to the diagnosis."""
    return f"{namespace}/{name}"


class PodResolver:
    def __init__(self, cache: PodCache, job_labels: tuple[str, ...] = ()):
        self.cache = cache
        self.job_labels = tuple(job_labels)
        self.counts: Counter[str] = Counter()
        self._missed: dict[str, int] = {}      # pod UID -> cache generation at first miss

    def identify(self, cgroup_text: str) -> tuple[Resolution, PodIdentity | None]:
        found = parse_pod_cgroup(cgroup_text)
        if found.verdict is not CgroupVerdict.POD:
            if found.verdict is CgroupVerdict.HOST:
                return self._count(Resolution.NOT_IN_POD, "not_in_pod"), None
            return self._count(Resolution.UNKNOWN, f"cgroup_{found.verdict.value}"), None
        pod = self.cache.get(found.pod_uid)
        if pod is None:
            return self._miss(found.pod_uid), None
        self._missed.pop(found.pod_uid, None)
        job = training_job(pod.labels, pod.annotations, self.job_labels)
        identity = PodIdentity(pod.namespace, pod.name, pod.uid,
                               job_id(pod.namespace, job.name) if job else "",
                               job.index if job else "")
        return self._count(Resolution.POD, "in_pod"), identity

    def for_pid(self, proc: Path, pid: int) -> tuple[Resolution, PodIdentity | None]:
        try:
            text = (proc / str(pid) / "cgroup").read_text()
        except OSError:
            return self._count(Resolution.UNKNOWN, "cgroup_unreadable"), None
        return self.identify(text)

    def _miss(self, uid: str) -> Resolution:
        """Pending while a relist that began after the first miss may still list it."""
        if not self.cache.first_done.is_set():
            return self._count(Resolution.PENDING, "pending")
        if not self.cache.healthy:
            return self._count(Resolution.UNKNOWN, "pod_list_unavailable")
        if len(self._missed) > _MAX_MISSES:
            self._missed.clear()
        first = self._missed.setdefault(uid, self.cache.generation)
        if self.cache.generation < first + 2:
            self.cache.request_relist()
            return self._count(Resolution.PENDING, "pending")
        return self._count(Resolution.UNKNOWN, "pod_unlisted")

    def _count(self, resolution: Resolution, what: str) -> Resolution:
        self.counts[what] += 1
        return resolution

    def stats(self) -> dict[str, int]:
        """Counters for fabricscope_agent_probe_events_total{probe="kube"}."""
        s = self.cache.stats
        return {**self.counts, "relists": s.relists, "relist_failures": s.relist_failures,
                "items_garbled": s.items_garbled}
