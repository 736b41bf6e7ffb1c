"""Ship batches to the collector over one long-lived gRPC stream (Collector.Stream).

Contract (proto/fabricscope/v1/telemetry.proto): each Batch carries agent_id (a
random boot id of this process) and seq (from 1, given at first send and kept
for resends); the collector answers each with an Ack: OK (stored: forget it),
RETRY (resend after a backoff), REJECTED (invalid: counted, logged, never resent).

Every batch stays in the BatchQueue until its Ack OK; after a reconnect all
unacknowledged batches are resent in order. The queue is bounded in records: when
full the oldest batches go, counted in records_dropped_total{reason="queue_full"}
and carried as the cumulative `dropped_before` of the next batch sent. An
unreachable collector produces one warning line per state change, never one per
retry. BatchQueue is a class of its own so that a disk spool can replace it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import uuid
from dataclasses import dataclass

from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.shipper")


@dataclass
class Pending:
    records: list[Record]
    seq: int = 0                # 0 until first sent
    dropped_before: int = 0     # cumulative drops when first sent
    sent: bool = False          # written on the current stream, Ack outstanding


class BatchQueue:
    """FIFO of batches awaiting Ack OK, bounded by the number of records."""

    def __init__(self, max_records: int):
        self.max_records = max_records
        self._items: collections.deque[Pending] = collections.deque()
        self.records = 0
        self.dropped = 0            # records dropped for room, cumulative

    def __len__(self) -> int:
        return len(self._items)

    def put(self, records: list[Record]) -> int:
        """Append a batch; drop the oldest ones to make room. Returns records dropped."""
        dropped = 0
        while self._items and self.records + len(records) > self.max_records:
            old = self._items.popleft()
            self.records -= len(old.records)
            dropped += len(old.records)
        self._items.append(Pending(list(records)))
        self.records += len(records)
        self.dropped += dropped
        return dropped

    def next_unsent(self) -> Pending | None:
        return next((p for p in self._items if not p.sent), None)

    def in_flight(self) -> int:
        return sum(1 for p in self._items if p.sent)

    def take(self, seq: int) -> Pending | None:
        """Remove and return the batch with this seq (None when it is gone)."""
        for p in self._items:
            if p.sent and p.seq == seq:
                self._items.remove(p)
                self.records -= len(p.records)
                return p
        return None

    def unsend(self, seq: int) -> Pending | None:
        for p in self._items:
            if p.seq == seq:
                p.sent = False
                return p
        return None

    def unsend_all(self) -> None:
        for p in self._items:
            p.sent = False


class Backoff:
    """Exponential backoff with jitter: initial * factor^n, capped, minus up to `jitter`."""

    def __init__(self, initial_s: float = 0.2, max_s: float = 10.0, factor: float = 2.0,
                 jitter: float = 0.5, rng=random.random):
        self.initial_s, self.max_s, self.factor, self.jitter = initial_s, max_s, factor, jitter
        self._rng = rng
        self._n = 0

    def next(self) -> float:
        delay = min(self.max_s, self.initial_s * self.factor ** self._n)
        self._n += 1
        return delay * (1.0 - self.jitter * self._rng())

    def reset(self) -> None:
        self._n = 0


class Shipper:
    """Pipeline output that ships to the collector; start() it, close() it."""

    def __init__(self, target: str, node: str, metrics, queue: BatchQueue, *,
                 agent_id: str | None = None, max_in_flight: int = 4,
                 backoff: Backoff | None = None, connect_timeout_s: float = 5.0,
                 flush_timeout_s: float = 5.0):
        self.target, self.node, self.metrics, self.queue = target, node, metrics, queue
        self.agent_id = agent_id or uuid.uuid4().hex
        self.max_in_flight = max_in_flight
        self.backoff = backoff or Backoff()
        self.retry_backoff = Backoff(initial_s=self.backoff.initial_s, max_s=self.backoff.max_s)
        self.connect_timeout_s = connect_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self._next_seq = 1
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()        # an ack or drop happened (close() waits on it)
        self._paused_until = 0.0
        self._connected: bool | None = None
        self._task: asyncio.Task | None = None

    # --- pipeline side ------------------------------------------------------------------
    def start(self) -> "Shipper":
        self._task = asyncio.create_task(self._run(), name="shipper")
        return self

    async def send(self, batch: list[Record]) -> None:
        dropped = self.queue.put(batch)
        if dropped:
            self.metrics.records_dropped.labels("queue_full").inc(dropped)
        self._update_gauge()
        self._wake.set()

    async def close(self) -> None:
        """Wait up to flush_timeout_s for every batch to be acked, then stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.flush_timeout_s
        while len(self.queue) and loop.time() < deadline:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        left = self.queue.records
        if left:
            self.metrics.records_dropped.labels("shutdown").inc(left)
            log.warning("shutdown: %d records in %d batches were not acknowledged by %s",
                        left, len(self.queue), self.target)

    # --- connection ---------------------------------------------------------------------
    async def _run(self) -> None:
        import grpc

        while True:
            try:
                await self._session()
                reason = "the collector closed the stream"
            except grpc.aio.AioRpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except asyncio.TimeoutError:
                reason = f"no connection within {self.connect_timeout_s:g} s"
            except Exception as exc:   # a broken stream surfaces as various grpc errors
                reason = f"{type(exc).__name__}: {exc}"
            self._set_connected(False, reason)
            self.queue.unsend_all()
            await asyncio.sleep(self.backoff.next())

    async def _session(self) -> None:
        import grpc

        from fabricscope.wire import pb_grpc

        async with grpc.aio.insecure_channel(self.target) as channel:
            await asyncio.wait_for(channel.channel_ready(), self.connect_timeout_s)
            call = pb_grpc.CollectorStub(channel).Stream()
            self._set_connected(True)
            tasks = [asyncio.create_task(self._write_loop(call)),
                     asyncio.create_task(self._read_loop(call))]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                call.cancel()

    def _set_connected(self, up: bool, reason: str = "") -> None:
        self.metrics.collector_connected.set(1 if up else 0)
        if up == self._connected:
            return
        self._connected = up
        if up:
            log.info("collector %s connected (agent_id %s)", self.target, self.agent_id)
        else:
            log.warning("collector %s unreachable: %s; keeping up to %d records, retrying "
                        "with backoff", self.target, reason, self.queue.max_records)

    # --- stream -------------------------------------------------------------------------
    async def _write_loop(self, call) -> None:
        from fabricscope.wire import make_batch

        while True:
            p = await self._next_to_send()
            if p.seq == 0:
                p.seq, self._next_seq = self._next_seq, self._next_seq + 1
                p.dropped_before = self.queue.dropped
            p.sent = True
            await call.write(make_batch(node=self.node, agent_id=self.agent_id, seq=p.seq,
                                        records=p.records, dropped_before=p.dropped_before))
            self.metrics.batches_sent.inc()

    async def _next_to_send(self) -> Pending:
        loop = asyncio.get_running_loop()
        while True:
            wait = self._paused_until - loop.time()
            p = self.queue.next_unsent()
            if wait <= 0 and p is not None and self.queue.in_flight() < self.max_in_flight:
                return p
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait if wait > 0 else None)
            except asyncio.TimeoutError:
                pass

    async def _read_loop(self, call) -> None:
        import grpc

        while (ack := await call.read()) is not grpc.aio.EOF:
            self._on_ack(ack)

    def _on_ack(self, ack) -> None:
        from fabricscope.wire import pb

        status = pb.Ack.Status.Name(ack.status).lower()
        self.metrics.batches_acked.labels(status).inc()
        if ack.status == pb.Ack.RETRY:
            if self.queue.unsend(ack.seq) is not None:
                loop = asyncio.get_running_loop()
                self._paused_until = loop.time() + self.retry_backoff.next()
                log.debug("collector asked to retry batch %d: %s", ack.seq, ack.reason)
        else:
            p = self.queue.take(ack.seq)
            self.backoff.reset()
            if ack.status == pb.Ack.OK:
                self.retry_backoff.reset()
            elif p is not None:
                self.metrics.records_dropped.labels("rejected").inc(len(p.records))
                log.warning("collector rejected batch %d (%d records): %s", ack.seq,
                            len(p.records), ack.reason)
        self._update_gauge()
        self._changed.set()
        self._wake.set()

    def _update_gauge(self) -> None:
        self.metrics.queue_records.set(self.queue.records)
