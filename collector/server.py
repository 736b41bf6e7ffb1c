"""The collector: a grpc.aio server for `fabricscope.v1.Collector/Stream`, a sink, /metrics.

    collector = Collector(CollectorConfig(listen="127.0.0.1:0"))
    await collector.start()          # UserError when InfluxDB cannot be reached
    ... collector.port ...
    await collector.stop()

or, from synchronous code (tests, demo, benches), `with CollectorThread(config) as c:`.

Many agents stream at once, one long-lived stream each, handled by
fabricscope.collector.stream.StreamSession (ack semantics are documented there) and
fabricscope.collector.delivery.Delivery (sink, spool, slow-down). Nothing needed for
correctness lives in one replica: duplicates are harmless because InfluxDB
overwrites identical points, so agents may reconnect to any replica. gRPC
binds with SO_REUSEPORT, so several replicas on one host may share one port
(the kernel spreads connections); max_connection_age_s makes long-lived
streams move between replicas over time (docs/SCALING.md).

Security (collector/auth.py, fabricscope/tls.py): with tls_cert/tls_key the
port speaks TLS, with tls_client_ca mutual TLS (a client without a certificate
from that CA fails the handshake); with tokens_file each stream needs a bearer
token, and a token only writes its own node's batches.

Message size: gRPC receives messages up to twice `max_message_bytes`; the
collector measures each one and refuses one over `max_message_bytes` with an
Ack REJECTED, code RESOURCE_EXHAUSTED (naming both sizes), counted in
messages_oversized_total; the stream goes on. Messages beyond twice the limit
are refused by gRPC itself (the stream ends RESOURCE_EXHAUSTED) before they
reach Python, which cannot be observed from the server and so are not counted:
the factor bounds memory per message while keeping every plausible overshoot
counted. A message that is not a Batch ends the stream INVALID_ARGUMENT.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

import grpc

from fabricscope.collector.auth import TokenTable
from fabricscope.collector.diagnosis import start_diagnosis
from fabricscope.collector.delivery import Delivery
from fabricscope.collector.metrics import CollectorMetrics
from fabricscope.collector.sinks import make_sink
from fabricscope.collector.stream import Oversized, StreamSession
from fabricscope.collector.validate import Limits
from fabricscope import tls
from fabricscope.errors import UserError
from fabricscope.selfmetrics import Readiness, SelfMetricsServer
from fabricscope.spool import DirSpool
from fabricscope.wire import pb

log = logging.getLogger("collector")

SERVICE = "fabricscope.v1.Collector"
#: gRPC's own limit, as a multiple of max_message_bytes (see module docstring).
HARD_LIMIT_FACTOR = 2


@dataclass(frozen=True)
class _Refused:
    """A message the deserializer did not turn into a Batch."""

    code: grpc.StatusCode
    details: str


def server_options(config) -> list[tuple[str, int]]:
    options = [("grpc.max_receive_message_length", config.max_message_bytes * HARD_LIMIT_FACTOR),
               # Agents ping every 30 s to notice dead peers behind NAT/load balancers.
               ("grpc.keepalive_time_ms", 60_000), ("grpc.keepalive_timeout_ms", 20_000),
               ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
               ("grpc.keepalive_permit_without_calls", 1)]
    if config.max_connection_age_s > 0:
        options += [("grpc.max_connection_age_ms", int(config.max_connection_age_s * 1000)),
                    # In-flight batches get this long to be acked before the cut (what
                    # is cut is resent by the agent); at most the age itself.
                    ("grpc.max_connection_age_grace_ms",
                     int(min(30.0, config.max_connection_age_s) * 1000))]
    return options


class _Throttled:
    """Log at most one line per interval (hostile clients must not flood the log); the
    metrics count every event."""

    def __init__(self, interval_s: float = 5.0):
        self.interval_s, self._next, self._suppressed = interval_s, 0.0, 0

    def warning(self, fmt: str, *args) -> None:
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        if self._suppressed:
            fmt += f" ({self._suppressed} similar lines suppressed)"
        self._next, self._suppressed = now + self.interval_s, 0
        log.warning(fmt, *args)


class Collector:
    def __init__(self, config, sink=None):
        self.config = config
        self.metrics = CollectorMetrics()
        self.readiness = Readiness()
        self.sink = sink
        self.limits = Limits.from_config(config)
        self.tokens: TokenTable | None = None
        self._refusals = _Throttled()
        self.delivery: Delivery | None = None
        self._server: grpc.aio.Server | None = None
        self._http: SelfMetricsServer | None = None
        self.diagnosis = None          # fabricscope.diagnosis.live.LiveDiagnosis when config.diagnosis
        self.port = 0

    @property
    def address(self) -> str:
        host, _ = self.config.listen_host_port()
        return f"{host}:{self.port}"

    @property
    def metrics_port(self) -> int:
        return self._http.port if self._http else 0

    async def start(self) -> None:
        """Check the sink, then serve. Raise UserError (and release everything) on failure."""
        self.readiness.mark_not_ready("checking the sink")
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        self.readiness.mark_ready()
        if self.tokens is None:
            log.warning("no tokens_file: any client that reaches the port may send data")
        log.info("collector listening on %s%s", self.address,
                 " (mutual TLS)" if self.config.tls_client_ca
                 else " (TLS)" if self.config.tls_cert else "")
        log.info("collector metrics on http://%s:%d/metrics", self.config.metrics_host,
                 self.metrics_port)

    async def _start(self) -> None:
        cfg = self.config
        if cfg.tokens_file:
            self.tokens = TokenTable(cfg.tokens_file)
        creds = tls.server_credentials(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca) \
            if cfg.tls_cert else None
        if self.sink is None:
            self.sink = make_sink(cfg)
        spool = DirSpool(cfg.spool_dir, cfg.spool_max_bytes) if cfg.spool_dir else None
        self.delivery = Delivery(self.sink, spool, self.metrics, self.readiness,
                                 cfg.retry_after_s, cfg.influx_batch_lines, cfg.influx_writers)
        await self.delivery.start()
        await self._start_sink(spool is not None)
        self._http = SelfMetricsServer(cfg.metrics_host, cfg.metrics_port,
                                       self.readiness, self.metrics.registry).start()
        self._server = grpc.aio.server(options=server_options(cfg),
                                       maximum_concurrent_rpcs=cfg.max_streams)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Stream": grpc.stream_stream_rpc_method_handler(
                self._stream, request_deserializer=self._deserialize,
                response_serializer=pb.Ack.SerializeToString)}),))
        try:
            self.port = self._server.add_secure_port(cfg.listen, creds) if creds \
                else self._server.add_insecure_port(cfg.listen)
        except RuntimeError as exc:
            raise UserError(f"cannot listen on {cfg.listen}: {exc}",
                            "pick a free address with --listen (port 0 picks one)") from None
        await self._server.start()
        if cfg.diagnosis:
            self.diagnosis = start_diagnosis(cfg, self.metrics.registry, self.port)
            await self.diagnosis.start()

    async def _start_sink(self, spooling: bool) -> None:
        try:
            await self.sink.start()
        except UserError as exc:
            if not spooling:
                raise
            # With a spool the collector can take batches now and write them later.
            log.warning("%s; spooling until it answers", exc.cause)
            self.delivery.healthy = False

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, let streams finish for grace_s, then close. Safe to call twice."""
        self.readiness.mark_not_ready("stopping")
        diagnosis, self.diagnosis = self.diagnosis, None
        if diagnosis is not None:
            await diagnosis.stop()
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
        http, self._http = self._http, None
        if http is not None:
            http.stop()
        delivery, self.delivery = self.delivery, None
        if delivery is not None:
            await delivery.close()
        sink, self.sink = self.sink, None
        if sink is not None:
            await sink.close()

    def _deserialize(self, data: bytes):
        # Runs before the handler sees the message: the one place that knows its size.
        self.metrics.bytes_received.inc(len(data))
        try:
            batch = pb.Batch.FromString(data)
        except Exception as exc:  # protobuf raises DecodeError, or others on garbage
            return _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"message is not a Batch: {exc}")
        if len(data) > self.config.max_message_bytes:
            return Oversized(batch, len(data), self.config.max_message_bytes)
        return batch

    async def _stream(self, requests, context):
        node = await self._authenticate(context)
        session = StreamSession(self.delivery, self.metrics, self.limits)
        self.metrics.agents_connected.inc()
        try:
            async for item in requests:
                if isinstance(item, _Refused):
                    self.metrics.messages_undecodable.inc()
                    self._refusals.warning("ending stream from %s: %s", context.peer(),
                                           item.details)
                    await context.abort(item.code, item.details)
                if isinstance(item, Oversized):
                    self.metrics.messages_oversized.inc()
                batch = item.batch if isinstance(item, Oversized) else item
                if node is not None and batch.node != node:
                    await self._refuse(context, "node_mismatch", grpc.StatusCode.PERMISSION_DENIED,
                                       f"this token may send for node {node!r} only, not "
                                       f"{batch.node!r}")
                yield await session.handle(item)
        finally:
            self.metrics.agents_connected.dec()

    async def _authenticate(self, context) -> str | None:
        """The token's node; None when authentication is off. Aborts the call when refused."""
        if self.tokens is None:
            return None
        verdict = self.tokens.check(context.invocation_metadata())
        if not verdict.ok:
            text = "no bearer token (metadata authorization: Bearer <token>)" \
                if verdict.reason == "no_token" else "unknown bearer token"
            await self._refuse(context, verdict.reason, grpc.StatusCode.UNAUTHENTICATED, text)
        return verdict.node

    async def _refuse(self, context, reason: str, code: grpc.StatusCode, text: str) -> None:
        self.metrics.auth_failures.labels(reason).inc()
        self._refusals.warning("refusing stream from %s: %s", context.peer(), text)
        await context.abort(code, text)


class CollectorThread:
    """Run a Collector on its own event loop thread, for synchronous callers.

    `with CollectorThread(config) as c: ... c.port ...`; leaving the block stops
    it, also on exceptions. Start errors (UserError) are raised in the caller."""

    def __init__(self, config, sink=None, start_timeout_s: float = 60.0):
        self.collector = Collector(config, sink)
        self._timeout = start_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="collector",
                                         daemon=True)

    @property
    def port(self) -> int:
        return self.collector.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.collector.port}" if self.collector.address.startswith(
            ("0.0.0.0", "[::]")) else self.collector.address

    def start(self) -> "CollectorThread":
        self._thread.start()
        try:
            self._call(self.collector.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            try:
                self._call(self.collector.stop())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._timeout)

    def __enter__(self) -> "CollectorThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
