"""The collector: a grpc.aio server for `fabricscope.v1.Collector/Stream`, a sink, /metrics.

    collector = Collector(CollectorConfig(listen="127.0.0.1:0"))
    await collector.start()          # UserError when InfluxDB cannot be reached
    ... collector.port ...
    await collector.stop()

or, from synchronous code (tests, demo, benches), `with CollectorThread(config) as c:`.

Many agents stream at once, one long-lived stream each, handled by
collector.stream.StreamSession (ack semantics are documented there). Nothing
needed for correctness lives in one replica: duplicates are harmless because
InfluxDB overwrites identical points, so agents may reconnect to any replica.

Message size: gRPC receives messages up to twice `max_message_bytes`; the
collector measures each one and ends the stream with RESOURCE_EXHAUSTED (naming
both sizes) when it exceeds `max_message_bytes`, counted in
messages_oversized_total. Messages beyond twice the limit are refused by gRPC
itself with the same status code before they reach Python, which cannot be
observed from the server and so are not counted: the factor bounds memory per
message while keeping every plausible overshoot counted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import grpc

from collector.metrics import CollectorMetrics
from collector.sinks import make_sink
from collector.stream import StreamSession
from collector.validate import Limits
from fabricscope.errors import UserError
from fabricscope.selfmetrics import Readiness, SelfMetricsServer
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


class Collector:
    def __init__(self, config, sink=None):
        self.config = config
        self.metrics = CollectorMetrics()
        self.readiness = Readiness()
        self.sink = sink
        self.limits = Limits.from_config(config)
        self._server: grpc.aio.Server | None = None
        self._http: SelfMetricsServer | None = None
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
        log.info("collector listening on %s", self.address)
        log.info("collector metrics on http://%s:%d/metrics", self.config.metrics_host,
                 self.metrics_port)

    async def _start(self) -> None:
        if self.sink is None:
            self.sink = make_sink(self.config)
        await self.sink.start()
        self._http = SelfMetricsServer(self.config.metrics_host, self.config.metrics_port,
                                       self.readiness, self.metrics.registry).start()
        limit = self.config.max_message_bytes * HARD_LIMIT_FACTOR
        self._server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit)])
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
            "Stream": grpc.stream_stream_rpc_method_handler(
                self._stream, request_deserializer=self._deserialize,
                response_serializer=pb.Ack.SerializeToString)}),))
        try:
            self.port = self._server.add_insecure_port(self.config.listen)
        except RuntimeError as exc:
            raise UserError(f"cannot listen on {self.config.listen}: {exc}",
                            "pick a free address with --listen (port 0 picks one)") from None
        await self._server.start()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, let streams finish for grace_s, then close. Safe to call twice."""
        self.readiness.mark_not_ready("stopping")
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
        http, self._http = self._http, None
        if http is not None:
            http.stop()
        if self.sink is not None:
            await self.sink.close()

    def _deserialize(self, data: bytes):
        # Runs before the handler sees the message: the one place that knows its size.
        if len(data) > self.config.max_message_bytes:
            return _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"message of {len(data)} bytes exceeds the collector's "
                            f"max_message_bytes {self.config.max_message_bytes}; fix: send "
                            "smaller batches (agent batch_max_records)")
        try:
            return pb.Batch.FromString(data)
        except Exception as exc:  # protobuf raises DecodeError, or others on garbage
            return _Refused(grpc.StatusCode.INVALID_ARGUMENT, f"message is not a Batch: {exc}")

    async def _stream(self, requests, context):
        session = StreamSession(self.sink, self.metrics, self.readiness, self.limits)
        self.metrics.agents_connected.inc()
        try:
            async for batch in requests:
                if isinstance(batch, _Refused):
                    counter = (self.metrics.messages_oversized
                               if batch.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                               else self.metrics.messages_undecodable)
                    counter.inc()
                    log.warning("ending stream from %s: %s", context.peer(), batch.details)
                    await context.abort(batch.code, batch.details)
                yield await session.handle(batch)
        finally:
            self.metrics.agents_connected.dec()


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
