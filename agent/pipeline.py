"""The agent pipeline: probes -> tag node -> join -> batcher -> outputs.

Each stage is a small async function between asyncio queues, so each can be
tested alone; `run_pipeline` wires them. A stage ends by passing None (end of
stream) downstream, so stopping is: set `stop`, the poll stage polls one last
time, the batcher flushes, the outputs flush and close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Iterable, Protocol

from fabricscope.cadence import until_next
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.pipeline")

#: polls run this long after each multiple of the poll interval on the wall clock
#: (fabricscope/cadence.py): the NIC probe's window of the second before has closed,
#: with the packets stamped just before the boundary in the kernel's rings, and the
#: tcp probe's window cut here spans the same second
POLL_OFFSET_S = 0.02


class Output(Protocol):
    async def send(self, batch: list[Record]) -> None: ...
    async def close(self) -> None: ...


def tag_node(records: list[Record], node: str) -> list[Record]:
    for r in records:
        r.tags["node"] = node
    return records


class Batcher:
    """Groups records into batches of at most `max_records`; a batch is due
    `flush_interval_s` after its first record arrived. Time is passed in."""

    def __init__(self, max_records: int, flush_interval_s: float):
        self.max_records = max_records
        self.flush_interval_s = flush_interval_s
        self._buf: list[Record] = []
        self._first_at: float | None = None

    def add(self, records: Iterable[Record], now: float) -> list[list[Record]]:
        """Add records; return the batches that became full."""
        full = []
        for r in records:
            if not self._buf:
                self._first_at = now
            self._buf.append(r)
            if len(self._buf) >= self.max_records:
                full.append(self.flush())
        return full

    def deadline(self) -> float | None:
        return None if self._first_at is None else self._first_at + self.flush_interval_s

    def due(self, now: float) -> bool:
        d = self.deadline()
        return d is not None and now >= d

    def flush(self) -> list[Record]:
        out, self._buf, self._first_at = self._buf, [], None
        return out


def poll_once(probes, node: str, metrics, join=None, final: bool = False) -> list[Record]:
    """Drain every probe once (runs in a worker thread: BCC calls block briefly), then
    pass the records through `join` (agent/training_join.py; `final`: release all)."""
    start = time.perf_counter()
    out: list[Record] = []
    if join is not None:
        join.begin_poll()
    for probe in probes:
        try:
            records = probe.poll()
        except Exception as exc:   # a probe bug must not stop the others
            metrics.poll_errors.labels(probe.name).inc()
            first = probe.name not in metrics.poll_failed
            metrics.poll_failed.add(probe.name)
            (log.warning if first else log.debug)(
                "probe %s: poll failed: %s: %s%s", probe.name, type(exc).__name__, exc,
                " (further failures only counted in fabricscope_agent_poll_errors_total)"
                if first else "")
            records = []
        metrics.records.labels(probe.name).inc(len(records))
        now = time.monotonic()
        if final:
            metrics.probe_stats.keep_last(probe.name, probe.stats(), now)
        elif metrics.probe_stats.due(probe.name, now):
            metrics.probe_stats.update(probe.name, probe.stats(), now)
        out += tag_node(records, node)
    if join is not None:
        out = join.feed(out, time.monotonic()) + (join.flush() if final else [])
        metrics.probe_stats.update("join", join.stats())
    metrics.poll_seconds.observe(time.perf_counter() - start)
    return out


def read_stats(probes, metrics) -> None:
    """Every probe's counters now (a snapshot each, whatever is due)."""
    now = time.monotonic()
    for probe in probes:
        metrics.probe_stats.update(probe.name, probe.stats(), now)


async def poll_stage(probes, node: str, interval_s: float, out: asyncio.Queue, metrics,
                     stop: asyncio.Event, after_poll: Callable[[], object] | None = None,
                     join=None) -> None:
    while True:
        stopping = stop.is_set()
        records = await asyncio.to_thread(poll_once, probes, node, metrics, join,
                                          stopping and after_poll is None)
        if records:
            out.put_nowait(records)
        if stopping:
            break
        try:
            await asyncio.wait_for(stop.wait(), until_next(interval_s, POLL_OFFSET_S))
        except asyncio.TimeoutError:
            pass
    if after_poll is not None:
        # Detaching drains what the kernel still holds (e.g. the NIC probe's open
        # window); the Probe contract hands those records out in one more poll().
        # The kernel's counters are read first, while the maps that hold them exist.
        await asyncio.to_thread(read_stats, probes, metrics)
        await asyncio.to_thread(after_poll)
        records = await asyncio.to_thread(poll_once, probes, node, metrics, join, True)
        if records:
            out.put_nowait(records)
    out.put_nowait(None)


async def batch_stage(inq: asyncio.Queue, outq: asyncio.Queue, batcher: Batcher,
                      clock: Callable[[], float] = time.monotonic) -> None:
    while True:
        deadline = batcher.deadline()
        try:
            timeout = None if deadline is None else max(0.0, deadline - clock())
            item = await asyncio.wait_for(inq.get(), timeout)
        except asyncio.TimeoutError:
            item = []
        if item is None:
            rest = batcher.flush()
            if rest:
                outq.put_nowait(rest)
            outq.put_nowait(None)
            return
        for batch in batcher.add(item, clock()):
            outq.put_nowait(batch)
        if batcher.due(clock()):
            outq.put_nowait(batcher.flush())


async def output_stage(inq: asyncio.Queue, outputs: list[Output]) -> None:
    try:
        while (batch := await inq.get()) is not None:
            for o in outputs:
                await o.send(batch)
    finally:
        for o in outputs:
            await o.close()


async def run_pipeline(probes, outputs: list[Output], *, node: str, poll_interval_s: float,
                       batch_max_records: int, flush_interval_s: float, metrics,
                       stop: asyncio.Event, after_poll: Callable[[], object] | None = None,
                       join=None) -> None:
    """Wire and run the stages until `stop` is set and everything is flushed.

    `after_poll` runs (in a thread) once the last poll is done: the agent detaches
    its probes there, before waiting for the outputs to flush."""
    records_q: asyncio.Queue = asyncio.Queue()
    batches_q: asyncio.Queue = asyncio.Queue()
    poller = asyncio.create_task(
        poll_stage(probes, node, poll_interval_s, records_q, metrics, stop, after_poll, join),
        name="poll")
    batcher = asyncio.create_task(
        batch_stage(records_q, batches_q, Batcher(batch_max_records, flush_interval_s)),
        name="batch")
    sender = asyncio.create_task(output_stage(batches_q, outputs), name="output")
    try:
        await poller
        await batcher
        await sender
    finally:
        for task in (poller, batcher, sender):
            task.cancel()
        await asyncio.gather(poller, batcher, sender, return_exceptions=True)
