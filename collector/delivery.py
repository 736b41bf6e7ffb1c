"""Where an accepted batch goes: InfluxDB, else the collector's disk spool, else "later".

    delivery = Delivery(sink, spool_or_None, metrics, readiness, retry_after_s,
                        max_lines=5000, writers=4)
    await delivery.start()
    outcome = await delivery.deliver(lines)     # -> Outcome
    await delivery.close()

Semantics (what an Ack OK promises, see collector/stream.py):
- The sink answers: the lines are in InfluxDB. `Outcome.written` lines. The
  lines of concurrent streams travel together in requests of up to max_lines
  (collector/coalesce.py); the spool is replayed in such requests too.
- The sink fails temporarily (down, 5xx, timeout) and a spool is configured:
  the lines are gzipped into one spool entry, fsynced, and the batch counts as
  accepted (durable at-least-once: ack after spool). From then on new batches go
  straight to the spool (no write attempt, so a slow InfluxDB does not stall
  every stream for influx_timeout_s) until the replay task writes the oldest
  entry successfully; then direct writes resume while the backlog drains in the
  background, oldest first. Order does not matter: a point is identified by
  series and timestamp, so a late or repeated write stores the same point.
- The spool is full (spool_max_bytes), or absent and the sink failing: the
  outcome asks the agent to slow down: RETRY with retry_after_s and the gRPC
  code RESOURCE_EXHAUSTED (spool full) or UNAVAILABLE (no spool). Nothing is
  dropped: the agent keeps the batch and resends it.
- The sink refuses points for good (HTTP 400): `Outcome.rejected` lines (when
  replaying, counted in records_rejected_total{reason="sink_rejected"}).
An unreadable spool entry (disk corruption) is deleted and its records counted
in records_dropped_total{reason="spool_corrupt"}; a spool that cannot be written
(disk error) answers RETRY like a full one.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc

from fabricscope.collector.coalesce import Coalescer
from fabricscope.collector.sinks.base import SinkError, SinkRejected
from fabricscope.spool import DirSpool, Entry, SpoolCorrupt, SpoolFull

log = logging.getLogger("collector")

#: Replay retries a failing sink after this long, doubling up to REPLAY_MAX_S.
REPLAY_INITIAL_S, REPLAY_MAX_S = 0.2, 5.0


@dataclass
class Outcome:
    written: int = 0                    # lines the sink accepted
    spooled: int = 0                    # lines durably spooled instead
    rejected: int = 0                   # lines the sink refused for good
    problem: str = ""                   # why rejected, or why RETRY
    retry_after_s: float = 0.0          # > 0: answer RETRY, the agent waits this long
    code: grpc.StatusCode = grpc.StatusCode.OK


def encode_lines(lines: list[str]) -> bytes:
    return gzip.compress("\n".join(lines).encode(), compresslevel=1)


def decode_lines(payload: bytes) -> list[str]:
    try:
        text = gzip.decompress(payload).decode()
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise SpoolCorrupt(f"payload does not decompress: {exc}") from None
    return text.split("\n") if text else []


class Delivery:
    def __init__(self, sink, spool: DirSpool | None, metrics, readiness, retry_after_s: float,
                 max_lines: int = 5000, writers: int = 4):
        self.sink, self.spool, self.m, self.readiness = sink, spool, metrics, readiness
        self.retry_after_s = retry_after_s
        self.max_lines = max_lines
        self.coalescer = Coalescer(self._write, max_lines, writers)
        self.healthy = True
        # Spool I/O has its own threads: the sink's may all hang on a slow InfluxDB.
        self._io = ThreadPoolExecutor(4, thread_name_prefix="spool")
        self._wake = asyncio.Event()
        self._replayer: asyncio.Task | None = None
        self._last_key = 0

    async def start(self) -> None:
        self.coalescer.start()
        if self.spool is None:
            return
        entries = await self._in_thread(self.spool.open)
        for path in self.spool.unreadable:
            log.warning("spool: ignoring %s (not a spool entry name)", path.name)
        if entries:
            log.info("spool: %d entries (%d records, %d bytes) left by a previous run; "
                     "replaying", len(entries), sum(e.count for e in entries), self.spool.bytes)
            self._wake.set()
        self.m.spool_bytes.set_function(lambda: self.spool.bytes)
        self.m.spool_entries.set_function(lambda: len(self.spool))
        self.m.spool_oldest_age.set_function(self._oldest_age)
        self._replayer = asyncio.create_task(self._replay(), name="spool-replay")

    async def close(self) -> None:
        await self.coalescer.close()
        if self._replayer is not None:
            self._replayer.cancel()
            await asyncio.gather(self._replayer, return_exceptions=True)
        self._io.shutdown(wait=True)
        if self.spool is not None:
            self.spool.close()

    async def deliver(self, lines: list[str]) -> Outcome:
        if not lines:
            return Outcome()
        if self.spool is not None and not self.healthy:
            return await self._to_spool(lines)
        try:
            await self.coalescer.write(lines)
        except SinkError as exc:
            self._failing(exc)
            if self.spool is not None:
                return await self._to_spool(lines)
            self.m.batches_throttled.labels("sink_down").inc()
            return Outcome(problem=f"sink unavailable: {exc}", retry_after_s=self.retry_after_s,
                           code=grpc.StatusCode.UNAVAILABLE)
        except SinkRejected as exc:
            self._recovered()
            return Outcome(written=max(0, len(lines) - exc.records),
                           rejected=min(exc.records, len(lines)), problem=str(exc),
                           code=grpc.StatusCode.INVALID_ARGUMENT)
        self._recovered()
        return Outcome(written=len(lines))

    # --- sink ------------------------------------------------------------------------
    async def _write(self, lines: list[str]) -> None:
        started = time.perf_counter()
        try:
            await self.sink.write_lines(lines)
        except SinkError:
            self.m.sink_errors.labels("temporary").inc()
            raise
        except SinkRejected as exc:
            self.m.sink_errors.labels("rejected").inc()
            log.warning("sink refused %d records: %s", exc.records, exc)
            raise
        finally:
            self.m.sink_write_seconds.observe(time.perf_counter() - started)

    def _failing(self, exc: Exception) -> None:
        if self.healthy:      # log the transition, not every failed write
            log.warning("sink failing, %s: %s", "spooling to disk" if self.spool is not None
                        else "answering RETRY", exc)
        self.healthy = False
        if self.spool is None:
            self.readiness.mark_not_ready(f"sink failing: {exc}")

    def _recovered(self) -> None:
        if not self.healthy:
            log.info("sink writes succeed again")
        self.healthy = True
        if not self.readiness.ready:
            self.readiness.mark_ready()

    # --- spool -----------------------------------------------------------------------
    async def _in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def _new_key(self) -> int:
        # Keys are ns timestamps (so the oldest entry's age is known), kept unique and
        # increasing across restarts by starting above the largest key on disk.
        key = max(time.time_ns(), self._last_key + 1, self.spool.next_key())
        self._last_key = key
        return key

    async def _to_spool(self, lines: list[str]) -> Outcome:
        key = self._new_key()
        try:
            await self._in_thread(lambda: self.spool.append(key, encode_lines(lines), len(lines)))
        except SpoolFull:
            self.m.batches_throttled.labels("spool_full").inc()
            self.readiness.mark_not_ready("spool full")
            return Outcome(problem=f"collector spool full ({self.spool.bytes} of "
                           f"{self.spool.max_bytes} bytes) while the sink is failing; slow down",
                           retry_after_s=self.retry_after_s,
                           code=grpc.StatusCode.RESOURCE_EXHAUSTED)
        except OSError as exc:
            self.m.batches_throttled.labels("spool_error").inc()
            log.warning("spool write failed: %s", exc.strerror or exc)
            return Outcome(problem=f"collector spool unwritable: {exc.strerror or exc}",
                           retry_after_s=self.retry_after_s, code=grpc.StatusCode.UNAVAILABLE)
        self.m.records_spooled.inc(len(lines))
        self._wake.set()
        return Outcome(spooled=len(lines))

    def _oldest_age(self) -> float:
        entries = self.spool.entries() if len(self.spool) else []
        return max(0.0, (time.time_ns() - entries[0].key) / 1e9) if entries else 0.0

    async def _replay(self) -> None:
        delay = REPLAY_INITIAL_S
        while True:
            entries = self.spool.entries()
            if not entries:
                self._wake.clear()
                await self._wake.wait()
                continue
            if await self._replay_some(entries):
                delay = REPLAY_INITIAL_S
                continue
            await asyncio.sleep(delay)
            delay = min(REPLAY_MAX_S, delay * 2)

    async def _replay_some(self, entries: list[Entry]) -> bool:
        """Write the oldest entries (up to max_lines together) and remove them; False when
        the sink is still failing."""
        taken, lines = [], []
        for entry in entries:
            if taken and len(lines) + entry.count > self.max_lines:
                break
            try:
                lines += decode_lines(await self._in_thread(self.spool.read, entry))
            except SpoolCorrupt as exc:
                log.warning("spool: dropping unreadable entry (%d records): %s", entry.count, exc)
                self.m.records_dropped.labels("spool_corrupt").inc(entry.count)
                await self._in_thread(self.spool.remove, entry)
                continue
            taken.append(entry)
        if not taken:
            return True
        try:
            await self._write(lines)
        except SinkError as exc:
            self._failing(exc)
            return False
        except SinkRejected as exc:
            self.m.records_rejected.labels("sink_rejected").inc(min(exc.records, len(lines)))
            self.m.records_written.inc(max(0, len(lines) - exc.records))
        else:
            self.m.records_written.inc(len(lines))
        self.m.records_replayed.inc(len(lines))
        for entry in taken:
            await self._in_thread(self.spool.remove, entry)
        self._recovered()
        return True
