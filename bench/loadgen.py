"""Load generators speaking the real protocol: many agents' shippers in one process, or
pre-built messages for benchmarks.

    result = asyncio.run(run_load(LoadSpec(target="127.0.0.1:9470", agents=250,
                                           batches=8, records=50)))

Each simulated agent is the real fabricscope.agent.shipper.Shipper (acks, resends, backoff,
slow-down, gzip, TLS and tokens: exactly what `fabricscope agent` runs) with its
own gRPC channel, i.e. its own TCP connection and stream, as a fleet of nodes
would open. Agent i reports as node `<prefix><i>` and sends `batches` batches
of `records` synthetic records (fabricscope/measurements/synthetic.py; record
n of agent i at base + n µs), so InfluxDB can be checked point by point:
`count(n)` per node must equal batches x records. Records are encoded as lines
before the clock starts (Shipper.send_lines), so the timed part is batch
serialization, the transport and the collector. Memory-only spools (nothing on disk).

`run_prebuilt(spec)` is the same fleet at almost no CPU of its own, for benchmarks
of the collector on a machine it shares with the generator: every agent's batches
are serialized and gzipped (level 6, what gRPC's gzip uses) before the clock starts,
and a minimal gRPC client (RawStream, HTTP/2 by h2) sends them as they are,
compressed messages on one stream per agent, at most max_in_flight unacknowledged.
The collector receives exactly the bytes the shippers would send, and does all of
its own work (decompression, decoding, validation, writing, acking).

`PacedStream` is that client for a schedule of the caller's: each message goes when
the caller sends it (a fleet streaming in real time, bench/diagnosis_cost.py), and
each Ack's latency is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import time
from dataclasses import dataclass, field

from fabricscope.agent.metrics import AgentMetrics
from fabricscope.agent.shipper import METHOD, Backoff, Shipper
from fabricscope.agent.sources.synthetic import make_record
from fabricscope.agent.spool import BatchSpool
from fabricscope.lineschema import canonical_line
from fabricscope.wire import make_batch, pb

PERIOD_NS = 1000


@dataclass
class LoadSpec:
    target: str
    agents: int = 200
    batches: int = 10
    records: int = 100
    node_prefix: str = "load"
    base_ns: int = field(default_factory=lambda: time.time_ns() - 600 * 10**9)
    tokens: dict[str, str] = field(default_factory=dict)    # node -> bearer token
    credentials: object = None                               # grpc.ChannelCredentials
    compression: bool = True
    max_in_flight: int = 4
    timeout_s: float = 600.0

    def node(self, i: int) -> str:
        return f"{self.node_prefix}{i}"

    @property
    def total_records(self) -> int:
        return self.agents * self.batches * self.records


@dataclass
class LoadResult:
    records: int                # records sent (all batches of all agents)
    acked_records: int          # records in batches acknowledged OK
    dropped: int                # records the shippers gave up on (any reason)
    batches_ok: int
    retries: int                # RETRY acks (slow-down or sink failure)
    bytes_sent: int             # serialized batch bytes (before gzip)
    seconds: float              # first send to last ack
    generator_cpu_s: float = 0.0  # this process's CPU time in those seconds

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def build_records(spec: LoadSpec, i: int) -> list[list]:
    """Agent i's batches as Records (node tag set)."""
    out = []
    for b in range(spec.batches):
        first = b * spec.records
        batch = [make_record(n, spec.base_ns, PERIOD_NS, stream=str(i))
                 for n in range(first, first + spec.records)]
        for r in batch:
            r.tags["node"] = spec.node(i)
        out.append(batch)
    return out


def build_batches(spec: LoadSpec, i: int) -> list[list[str]]:
    """Agent i's batches as canonical lines, what its shipper sends."""
    return [[canonical_line(r) for r in batch] for batch in build_records(spec, i)]


async def _agent(spec: LoadSpec, i: int, batches: list[list], metrics: AgentMetrics,
                 start: asyncio.Event) -> None:
    spool = BatchSpool("", 1 << 40, spec.batches * spec.records + 1000)
    shipper = Shipper(spec.target, spec.node(i), metrics, spool, agent_id=f"loadgen-{i}",
                      max_in_flight=spec.max_in_flight, flush_timeout_s=spec.timeout_s,
                      backoff=Backoff(initial_s=0.1, max_s=2.0), credentials=spec.credentials,
                      token=spec.tokens.get(spec.node(i), ""), compression=spec.compression)
    await start.wait()
    shipper.start()
    for batch in batches:
        await shipper.send_lines(batch)
    await shipper.close()


def _total(metrics: list[AgentMetrics], name: str, **labels) -> float:
    """Sum of the samples named `name` whose labels include `labels`, over all agents."""
    total = 0.0
    for m in metrics:
        for family in m.registry.collect():
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total += s.value
    return total


async def run_load(spec: LoadSpec) -> LoadResult:
    # Hundreds of "connected" lines say nothing; warnings (unreachable, refused) still show.
    shipper_log = logging.getLogger("fabricscope.agent.shipper")
    level = shipper_log.level
    shipper_log.setLevel(max(logging.WARNING, level))
    try:
        return await _run_load(spec)
    finally:
        shipper_log.setLevel(level)


async def _run_load(spec: LoadSpec) -> LoadResult:
    batches = [build_batches(spec, i) for i in range(spec.agents)]
    metrics = [AgentMetrics() for _ in range(spec.agents)]
    start = asyncio.Event()
    tasks = [asyncio.create_task(_agent(spec, i, batches[i], metrics[i], start))
             for i in range(spec.agents)]
    await asyncio.sleep(0)
    began, cpu = time.perf_counter(), time.process_time()
    start.set()
    await asyncio.wait_for(asyncio.gather(*tasks), spec.timeout_s + 60)
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    dropped = int(_total(metrics, "fabricscope_agent_records_dropped_total"))
    sent = spec.total_records
    return LoadResult(
        records=sent, acked_records=sent - dropped, dropped=dropped,
        batches_ok=int(_total(metrics, "fabricscope_agent_batches_acked_total", status="ok")),
        retries=int(_total(metrics, "fabricscope_agent_batches_acked_total", status="retry")),
        bytes_sent=int(_total(metrics, "fabricscope_agent_sent_bytes_total")), seconds=seconds,
        generator_cpu_s=cpu)



async def run_prebuilt(spec: LoadSpec) -> LoadResult:
    """The fleet's batches, built and gzipped before the clock (and the streams opened),
    sent and acknowledged within it by RawStream."""
    host, _, port = spec.target.rpartition(":")
    fleet = [[grpc_message(make_batch(node=spec.node(i), agent_id=f"loadgen-{i}", seq=seq,
                                      lines=lines).SerializeToString())
              for seq, lines in enumerate(build_batches(spec, i), 1)]
             for i in range(spec.agents)]
    streams = [RawStream(host, int(port)) for _ in fleet]
    try:
        await asyncio.gather(*(stream.open() for stream in streams))
        began, cpu = time.perf_counter(), time.process_time()
        answers = await asyncio.wait_for(asyncio.gather(*(
            stream.exchange(messages, spec.max_in_flight)
            for stream, messages in zip(streams, fleet))), spec.timeout_s)
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        for stream in streams:
            stream.close()
    acks = [ack for agent in answers for ack in agent]
    ok = sum(ack.status == pb.Ack.OK for ack in acks)
    return LoadResult(records=spec.total_records, acked_records=ok * spec.records,
                      dropped=spec.total_records - ok * spec.records, batches_ok=ok,
                      retries=sum(ack.status == pb.Ack.RETRY for ack in acks),
                      bytes_sent=sum(len(m) for messages in fleet for m in messages),
                      seconds=seconds, generator_cpu_s=cpu)


def grpc_message(payload: bytes, level: int = 6) -> bytes:
    """A gRPC length-prefixed message, compressed as gRPC's gzip does it (zlib's default
    level, gzip framing; `level` for a generator that must spend less)."""
    body = gzip.compress(payload, compresslevel=level)
    return b"\x01" + len(body).to_bytes(4, "big") + body


class RawStream:
    """One agent's Collector/Stream call over its own HTTP/2 connection (h2), sending
    pre-built messages: a minimal gRPC client whose cost per batch is a few h2 calls.

    Only what this stream needs: no retries, no reconnects; a stream that ends early, a
    reset or a gRPC error status raises RuntimeError."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self._conn = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._stream_id = 0

    async def open(self) -> None:
        import h2.config
        import h2.connection
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        self._conn.initiate_connection()
        self._stream_id = self._conn.get_next_available_stream_id()
        self._conn.send_headers(self._stream_id, [
            (":method", "POST"), (":scheme", "http"), (":path", METHOD),
            (":authority", f"{self.host}:{self.port}"), ("content-type", "application/grpc"),
            ("te", "trailers"), ("grpc-encoding", "gzip"),
            ("grpc-accept-encoding", "identity,gzip")])
        await self._flush()

    async def exchange(self, messages: list[bytes], max_in_flight: int) -> list:
        """Send every message, at most max_in_flight unacknowledged; the Acks, in order."""
        acks: list = []
        outgoing = bytearray()
        sent = 0
        incoming = bytearray()
        while len(acks) < len(messages):
            while sent < len(messages) and sent - len(acks) < max_in_flight:
                outgoing += messages[sent]
                sent += 1
            self._send_some(outgoing)
            await self._flush()
            data = await self._reader.read(1 << 16)
            if not data:
                raise RuntimeError(f"collector closed the connection after {len(acks)} acks")
            self._receive(data, incoming, acks)
        self._conn.end_stream(self._stream_id)
        await self._flush()
        return acks

    def _send_some(self, outgoing: bytearray) -> None:
        """As much of `outgoing` as HTTP/2 flow control allows now, in frames."""
        conn, sid = self._conn, self._stream_id
        while outgoing:
            size = min(len(outgoing), conn.local_flow_control_window(sid),
                       conn.max_outbound_frame_size)
            if size <= 0:
                return
            conn.send_data(sid, bytes(outgoing[:size]))
            del outgoing[:size]

    def _receive(self, data: bytes, incoming: bytearray, acks: list) -> None:
        import h2.events
        for event in self._conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                self._conn.acknowledge_received_data(event.flow_controlled_length,
                                                     event.stream_id)
                incoming += event.data
                acks += _messages(incoming)
            elif isinstance(event, h2.events.TrailersReceived):
                status = dict(event.headers).get("grpc-status", "?")
                raise RuntimeError(f"stream ended with grpc-status {status}: "
                                   f"{dict(event.headers).get('grpc-message', '')}")
            elif isinstance(event, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                raise RuntimeError(f"collector ended the stream: {event}")

    async def _flush(self) -> None:
        self._writer.write(self._conn.data_to_send())
        await self._writer.drain()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _messages(incoming: bytearray) -> list:
    """The complete gRPC messages at the front of `incoming` (removed), as Acks."""
    out = []
    while len(incoming) >= 5 and len(incoming) >= 5 + int.from_bytes(incoming[1:5], "big"):
        size = int.from_bytes(incoming[1:5], "big")
        body = bytes(incoming[5:5 + size])
        out.append(pb.Ack.FromString(gzip.decompress(body) if incoming[0] else body))
        del incoming[:5 + size]
    return out


class PacedStream(RawStream):
    """A RawStream whose caller decides when each message goes (a real-time schedule):
    send() puts one message on the wire now, as far as HTTP/2 flow control allows, and
    a reader task takes the Acks as they come, with each one's latency (send to ack),
    and sends what flow control held back. A failure of the stream is raised by the
    next send() or by finish()."""

    def __init__(self, host: str, port: int):
        super().__init__(host, port)
        self._pending = bytearray()
        self._sent_at: list[float] = []
        self.acks: list = []
        self.latencies_s: list[float] = []
        self._reader_task: asyncio.Task | None = None
        self._failure: BaseException | None = None
        self._acked = asyncio.Event()

    async def open(self) -> None:
        await super().open()
        self._reader_task = asyncio.create_task(self._read())

    @property
    def sent(self) -> int:
        return len(self._sent_at)

    def send(self, message: bytes) -> None:
        if self._failure is not None:
            raise RuntimeError(f"stream failed: {self._failure}")
        self._sent_at.append(time.perf_counter())
        self._pending += message
        self._send_some(self._pending)
        self._writer.write(self._conn.data_to_send())

    async def _read(self) -> None:
        incoming = bytearray()
        try:
            while True:
                data = await self._reader.read(1 << 16)
                if not data:
                    raise RuntimeError(f"collector closed the connection after "
                                       f"{len(self.acks)} acks")
                acks: list = []
                self._receive(data, incoming, acks)
                now = time.perf_counter()
                for ack in acks:
                    self.latencies_s.append(now - self._sent_at[len(self.acks)])
                    self.acks.append(ack)
                if acks:
                    self._acked.set()
                self._send_some(self._pending)
                self._writer.write(self._conn.data_to_send())
        except (RuntimeError, OSError) as exc:
            self._failure = exc
            self._acked.set()

    async def finish(self, timeout_s: float) -> int:
        """Wait up to timeout_s for the Acks of everything sent, end the stream, and
        return how many batches are still unacknowledged (0: all of them came)."""
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < self.sent and time.monotonic() < deadline:
            if self._failure is not None:
                raise RuntimeError(f"stream failed: {self._failure}")
            self._acked.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._acked.wait(), deadline - time.monotonic())
        self._conn.end_stream(self._stream_id)
        await self._flush()
        return self.sent - len(self.acks)

    def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        super().close()
