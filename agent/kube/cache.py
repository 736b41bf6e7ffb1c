"""The node's pod list, kept in memory and relisted in a thread of its own.

Readers (the resolver, on the probes' threads) only look a UID up in a dict that
the thread replaces whole: nothing blocks on the network. The thread relists
every `relist_s`, sooner (at most once a second) when a reader met a UID the
list lacks (a pod started since), and while the source is unreachable it retries
with exponential backoff from 1 s up to `backoff_max_s`, logging the outage once
and its end once; every failed relist is counted. A periodic relist rather than a
watch: one GET per node every 10 s is light on the API server, and a pod is in
the list from its admission, seconds before its processes open a socket.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from fabricscope.agent.kube.podlist import Pod, PodList
from fabricscope.errors import UserError

log = logging.getLogger("fabricscope.agent.kube")

BACKOFF_START_S = 1.0
MISS_RELIST_GAP_S = 1.0


def next_delay(failures: int, relist_s: float, backoff_max_s: float) -> float:
    """Seconds until the next relist after `failures` failed ones in a row."""
    if failures == 0:
        return relist_s
    return min(backoff_max_s, BACKOFF_START_S * 2 ** (failures - 1))


@dataclass
class CacheStats:
    relists: int = 0             # successful fetches
    relist_failures: int = 0     # fetches that failed (unreachable, refused, not a PodList)
    items_garbled: int = 0       # list items that were no readable pod (summed per relist)
    pods: int = 0                # pods in the latest list


class PodCache:
    def __init__(self, fetch: Callable[[], PodList], relist_s: float = 10.0,
                 backoff_max_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._fetch = fetch
        self.relist_s, self.backoff_max_s, self.clock = relist_s, backoff_max_s, clock
        self.stats = CacheStats()
        self.generation = 0          # successful relists so far
        self.healthy = False         # the latest relist succeeded
        self.first_done = threading.Event()   # the first relist ended (either way)
        self.on_relist: list[Callable[[], None]] = []   # after each attempt (metrics, tests)
        self._pods: dict[str, Pod] = {}
        self._failures = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_attempt = float("-inf")

    def get(self, uid: str) -> Pod | None:
        return self._pods.get(uid)

    def request_relist(self) -> None:
        """A reader missed a UID: relist soon (the thread keeps a 1 s gap)."""
        self._wake.set()

    def refresh(self) -> bool:
        """One relist now, on the calling thread. True when it succeeded."""
        self._last_attempt = self.clock()
        try:
            listed = self._fetch()
        except UserError as exc:
            self.stats.relist_failures += 1
            if self._failures == 0:
                log.warning("pod list unavailable: %s (fix: %s); records go on without "
                            "namespace, pod and Kubernetes job tags; retrying with backoff, "
                            "failures counted in fabricscope_agent_probe_events_total"
                            "{probe=\"kube\",event=\"relist_failures\"}", exc.cause, exc.fix)
            self._failures += 1
            self.healthy = False
            return False
        finally:
            self.first_done.set()
        if self._failures:
            log.info("pod list reachable again after %d failed relists", self._failures)
        self._pods = dict(listed.pods)          # replaced whole: readers never see half
        self._failures = 0
        self.healthy = True
        self.generation += 1
        self.stats.relists += 1
        self.stats.items_garbled += listed.garbled
        self.stats.pods = len(listed.pods)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kube-pods", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            for listener in self.on_relist:
                listener()
            self._wake.wait(next_delay(self._failures, self.relist_s, self.backoff_max_s))
            self._wake.clear()
            gap = MISS_RELIST_GAP_S - (self.clock() - self._last_attempt)
            if gap > 0 and self._failures == 0:
                self._stop.wait(gap)
