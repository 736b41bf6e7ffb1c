"""Ship batches to the collector over one long-lived gRPC stream (Collector.Stream).

Contract (proto/fabricscope/v1/telemetry.proto): each Batch carries agent_id (a
random boot id of this process) and seq (assigned when the batch is admitted,
strictly increasing, kept for resends); the collector answers each with an Ack:
OK (durable: forget it), RETRY (resend later, not before retry_after_ms: the
collector's slow-down signal), REJECTED (invalid: counted, logged, never resent).

Admission (`send`): records are encoded as canonical line protocol
(fabricscope.lineschema; one that cannot be is counted as `unencodable`) and
serialized into one Batch (split in halves while over batch_max_bytes), room is made in the spool (agent/spool.py: the
oldest batches go when spool_max_bytes, or in memory-only mode
queue_max_records, would be exceeded), and the batch is stored: fsynced to disk
when a spool directory is set, so it survives a crash and a restarted agent
resends it. Every record given up is counted in
records_dropped_total{reason} (spool_full, queue_full, oversized, unencodable,
spool_corrupt, shutdown, rejected) and, except `rejected` (which the collector counts
itself), shipped: the batch admitted right after a loss carries the cumulative
count in `dropped_before` and one `agent_loss` record per reason, so InfluxDB
shows the gap. Listeners in `on_durable` hear of each admitted record list
(the synthetic source keeps its resume point with it).

Sending: up to max_in_flight batches on the stream, gzip-compressed (gRPC
message compression); after a reconnect every unacknowledged batch is resent
in seq order. Reconnects back off exponentially with jitter; an unreachable or
refusing collector produces one warning line per state change, never one per
retry. Credentials: TLS or mutual TLS channel credentials and a bearer token
(metadata `authorization`), never logged.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from typing import Callable

from fabricscope.agent.spool import BatchSpool, Pending, SpoolCorrupt, SpoolFull
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.shipper")

METHOD = "/fabricscope.v1.Collector/Stream"
#: Reasons whose losses travel in dropped_before / agent_loss (the collector counts
#: its own refusals).
SHIPPED_LOSSES = ("spool_full", "queue_full", "oversized", "unencodable", "spool_corrupt",
                  "shutdown")
CHANNEL_OPTIONS = [("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000),
                   ("grpc.keepalive_permit_without_calls", 1),
                   ("grpc.http2.max_pings_without_data", 0),
                   ("grpc.max_send_message_length", -1)]


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

    def __init__(self, target: str, node: str, metrics, spool: BatchSpool, *,
                 agent_id: str | None = None, max_in_flight: int = 4,
                 backoff: Backoff | None = None, connect_timeout_s: float = 5.0,
                 flush_timeout_s: float = 5.0, batch_max_bytes: int = 4 << 20,
                 credentials=None, token: str = "", compression: bool = True,
                 server_name: str = ""):
        self.target, self.node, self.metrics, self.spool = target, node, metrics, spool
        self.agent_id = agent_id or uuid.uuid4().hex
        self.max_in_flight = max_in_flight
        self.backoff = backoff or Backoff()
        self.retry_backoff = Backoff(initial_s=self.backoff.initial_s, max_s=self.backoff.max_s)
        self.connect_timeout_s = connect_timeout_s
        self.flush_timeout_s = flush_timeout_s
        self.batch_max_bytes = batch_max_bytes
        self._credentials, self._token = credentials, token
        self.compression, self.server_name = compression, server_name
        self.on_durable: list[Callable[[list[Record]], object]] = []
        self.lost: dict[str, int] = {reason: 0 for reason in SHIPPED_LOSSES}
        self._loss_shipped: dict[str, int] = dict(self.lost)
        self._next_seq = spool.next_seq()
        self._disk_ok = True
        self._unencodable_seen: set[str] = set()
        self._wake = asyncio.Event()
        self._changed = asyncio.Event()        # an ack or drop happened (close() waits on it)
        self._paused_until = 0.0
        self._connected: bool | None = None
        self._up_since: float | None = None
        self._task: asyncio.Task | None = None

    # --- pipeline side ------------------------------------------------------------------
    def start(self) -> "Shipper":
        self._task = asyncio.create_task(self._run(), name="shipper")
        self.metrics.oldest_pending_age.set_function(self._oldest_age)
        self._update_gauges()
        return self

    def _oldest_age(self) -> float:
        oldest = self.spool.oldest_created()
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)

    async def send(self, batch: list[Record]) -> None:
        await self._admit(self._encode(batch))
        for listener in self.on_durable:
            listener(batch)
        self._update_gauges()
        self._wake.set()

    async def send_lines(self, lines: list[str]) -> None:
        """Admit lines already in canonical form (the load generator builds them ahead)."""
        await self._admit(lines)
        self._update_gauges()
        self._wake.set()

    async def close(self) -> None:
        """Wait up to flush_timeout_s for every batch to be acked, then stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.flush_timeout_s
        while len(self.spool) and loop.time() < deadline:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
            except asyncio.TimeoutError:
                break
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        left, batches = self.spool.records, len(self.spool)
        self.spool.close()
        if not left:
            return
        if self.spool.durable:
            log.info("shutdown: %d records in %d batches stay spooled in %s and are sent at "
                     "the next start", left, batches, self.spool.disk.dir)
        else:
            self.metrics.records_dropped.labels("shutdown").inc(left)
            log.warning("shutdown: %d records in %d batches were not acknowledged by %s",
                        left, batches, self.target)

    # --- admission ----------------------------------------------------------------------
    def _encode(self, records: list[Record]) -> list[str]:
        """Canonical lines (what the collector validates); unencodable records counted."""
        from fabricscope.lineproto import LineProtocolError
        from fabricscope.lineschema import canonical_line
        lines = []
        for r in records:
            try:
                lines.append(canonical_line(r))
            except LineProtocolError as exc:
                self._lose("unencodable", 1)
                if r.measurement not in self._unencodable_seen:   # once per measurement
                    self._unencodable_seen.add(r.measurement)
                    log.warning("dropping a record line protocol cannot carry (%s); further "
                                "ones are only counted", exc)
        return lines

    async def _admit(self, lines: list[str]) -> None:
        """Make one batch, make room, store it; halve while over batch_max_bytes."""
        from fabricscope.wire import make_batch
        if not lines:
            return
        seq = self._next_seq
        batch = make_batch(node=self.node, agent_id=self.agent_id, seq=seq, lines=lines,
                           dropped_before=sum(self.lost.values()))
        size = batch.ByteSize()
        if size > self.batch_max_bytes:
            if len(lines) == 1:
                self._lose("oversized", 1)
                log.warning("dropping a record of %d bytes (batch_max_bytes %d): %.80s",
                            size, self.batch_max_bytes, lines[0])
                return
            half = len(lines) // 2
            await self._admit(lines[:half])
            await self._admit(lines[half:])
            return
        self._next_seq += 1
        # Room for the loss records this very batch may carry (~150 bytes each): those
        # pending, and one more for the drops made now.
        extra = len(self._loss_records()) + 1
        dropped = self.spool.make_room(size + 200 * extra, len(lines) + extra)
        if dropped:
            self._lose("spool_full" if self.spool.durable else "queue_full",
                       sum(p.count for p in dropped))
        loss = self._loss_records()
        if loss:
            batch = make_batch(node=self.node, agent_id=self.agent_id, seq=seq,
                               lines=lines + self._encode(loss),
                               dropped_before=sum(self.lost.values()))
        await self._store(seq, batch.SerializeToString(), len(batch.lines))
        self._loss_shipped.update({r.tags["reason"]: r.fields["records"] for r in loss})
        self.metrics.records_spooled.inc(len(lines))

    async def _store(self, seq: int, data: bytes, count: int) -> None:
        try:
            entry = await asyncio.to_thread(self.spool.store, seq, data, count)
        except SpoolFull:       # only when one batch exceeds spool_max_bytes on its own
            self._lose("spool_full", count)
            return
        except OSError as exc:
            # The disk failed: keep the batch in memory (still sent, not crash-safe).
            if self._disk_ok:
                log.warning("spool write failed (%s): keeping batches in memory until the "
                            "disk works again", exc.strerror or exc)
            self._disk_ok = False
            entry = None
        else:
            self._disk_ok = True
        self.spool.add(seq, data, count, entry)

    def _lose(self, reason: str, count: int) -> None:
        self.lost[reason] = self.lost.get(reason, 0) + count
        self.metrics.records_dropped.labels(reason).inc(count)
        self._changed.set()

    def _loss_records(self) -> list[Record]:
        now = time.time_ns()
        return [Record("agent_loss", now, {"node": self.node, "agent_id": self.agent_id,
                                           "reason": reason}, {"records": count})
                for reason, count in self.lost.items() if count != self._loss_shipped.get(reason)]

    # --- connection ---------------------------------------------------------------------
    async def _run(self) -> None:
        import grpc

        while True:
            self._up_since = None          # set by _session once the stream is open
            try:
                await self._session()
                reason, code = "the collector closed the stream", None
            except grpc.aio.AioRpcError as exc:
                reason, code = f"{exc.code().name}: {exc.details()}", exc.code()
            except asyncio.TimeoutError:
                reason, code = f"no connection within {self.connect_timeout_s:g} s", None
            except Exception as exc:   # a broken stream surfaces as various grpc errors
                reason, code = f"{type(exc).__name__}: {exc}", None
            self.spool.unsend_all()
            refused = code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
            up = self._up_since is not None and time.monotonic() - self._up_since >= 1.0
            if up and not refused:
                # A stream that worked for a while ended (a collector restart, or its
                # max_connection_age moving us to another replica): reconnect at once and
                # warn only if that fails.
                log.info("stream to %s ended (%s); reconnecting", self.target, reason)
                continue
            self._set_connected(False, reason)
            # Refused credentials will not fix themselves soon: wait the longest backoff.
            await asyncio.sleep(self.backoff.max_s if refused else self.backoff.next())

    def _channel(self):
        import grpc

        options = list(CHANNEL_OPTIONS)
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        compression = grpc.Compression.Gzip if self.compression else grpc.Compression.NoCompression
        if self._credentials is not None:
            return grpc.aio.secure_channel(self.target, self._credentials, options, compression)
        return grpc.aio.insecure_channel(self.target, options, compression)

    async def _session(self) -> None:
        from fabricscope.tls import bearer
        from fabricscope.wire import pb

        async with self._channel() as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), self.connect_timeout_s)
            except asyncio.TimeoutError:
                await self._why_not_connected(channel)
                raise
            stream = channel.stream_stream(METHOD, request_serializer=None,
                                           response_deserializer=pb.Ack.FromString)
            call = stream(metadata=(bearer(self._token),) if self._token else None)
            self._set_connected(True)
            self._up_since = time.monotonic()
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

    async def _why_not_connected(self, channel) -> None:
        """Raise the gRPC error of one fail-fast call (it names TLS and connect failures)."""
        from fabricscope.wire import pb
        stream = channel.stream_stream(METHOD, response_deserializer=pb.Ack.FromString)
        call = stream(wait_for_ready=False, timeout=self.connect_timeout_s)
        try:
            await call.read()
        finally:
            call.cancel()

    def _set_connected(self, up: bool, reason: str = "") -> None:
        self.metrics.collector_connected.set(1 if up else 0)
        if up == self._connected:
            return
        self._connected = up
        if up:
            log.info("collector %s connected (agent_id %s)", self.target, self.agent_id)
        else:
            where = f"spooled in {self.spool.disk.dir} (up to {self.spool.max_bytes} bytes)" \
                if self.spool.durable else f"kept in memory (up to {self.spool.memory_max_records}" \
                " records)"
            log.warning("collector %s unreachable: %s; batches are %s, retrying with backoff",
                        self.target, reason, where)

    # --- stream -------------------------------------------------------------------------
    async def _write_loop(self, call) -> None:
        while True:
            p = await self._next_to_send()
            try:
                data = self.spool.payload(p)
            except SpoolCorrupt as exc:
                log.warning("spool: dropping unreadable batch %d (%d records): %s",
                            p.seq, p.count, exc)
                self.spool.take(p.seq)
                self._lose("spool_corrupt", p.count)
                continue
            p.sent = True
            await call.write(data)
            self.metrics.batches_sent.inc()
            self.metrics.bytes_sent.inc(len(data))

    async def _next_to_send(self) -> Pending:
        loop = asyncio.get_running_loop()
        while True:
            wait = self._paused_until - loop.time()
            p = self.spool.next_unsent()
            if wait <= 0 and p is not None and self.spool.in_flight() < self.max_in_flight:
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
            if self.spool.unsend(ack.seq) is not None:
                self._pause(ack)
        else:
            p = self.spool.take(ack.seq)
            self.backoff.reset()
            if ack.status == pb.Ack.OK:
                self.retry_backoff.reset()
            elif p is not None:
                self.metrics.records_dropped.labels("rejected").inc(p.count)
                log.warning("collector rejected batch %d (%d records): %s", ack.seq,
                            p.count, ack.reason)
        self._update_gauges()
        self._changed.set()
        self._wake.set()

    def _pause(self, ack) -> None:
        """Send nothing for max(retry_after_ms, our own backoff): the slow-down signal."""
        loop = asyncio.get_running_loop()
        wait = max(ack.retry_after_ms / 1000.0, self.retry_backoff.next())
        self._paused_until = max(self._paused_until, loop.time() + wait)
        if ack.retry_after_ms:
            self.metrics.collector_throttled.inc()
        log.debug("collector asked to retry batch %d in %.2f s: %s", ack.seq, wait, ack.reason)

    def _update_gauges(self) -> None:
        self.metrics.queue_records.set(self.spool.records)
        self.metrics.spool_bytes.set(self.spool.disk.bytes if self.spool.durable
                                     else self.spool.bytes)
        self.metrics.spool_batches.set(len(self.spool))


def build_shipper(cfg, metrics) -> Shipper:
    """The Shipper an AgentConfig describes, its spool opened (and locked). UserError on
    unreadable credentials or an unusable spool directory."""
    from fabricscope import tls
    token = tls.read_secret(cfg.token_file) if cfg.token_file else cfg.token
    creds = tls.channel_credentials(cfg.tls_ca, cfg.tls_cert, cfg.tls_key) \
        if cfg.uses_tls() else None
    spool = BatchSpool(cfg.spool_path(), cfg.spool_max_bytes, cfg.queue_max_records)
    restored = spool.open()
    if restored:
        log.info("spool %s: %d batches (%d records) left by a previous run; resending them",
                 spool.disk.dir, len(restored), spool.records)
    return Shipper(cfg.collector, cfg.node, metrics, spool, flush_timeout_s=cfg.shutdown_timeout_s,
                   batch_max_bytes=cfg.batch_max_bytes, credentials=creds, token=token,
                   compression=cfg.compression == "gzip", server_name=cfg.tls_server_name)
