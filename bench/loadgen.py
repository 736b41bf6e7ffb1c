"""A load generator speaking the real protocol: many agents' shippers in one process.

    result = asyncio.run(run_load(LoadSpec(target="127.0.0.1:9470", agents=250,
                                           batches=8, records=50)))

Each simulated agent is the real agent.shipper.Shipper (acks, resends, backoff,
slow-down, gzip, TLS and tokens: exactly what `fabricscope agent` runs) with its
own gRPC channel, i.e. its own TCP connection and stream, as a fleet of nodes
would open. Agent i reports as node `<prefix><i>` and sends `batches` batches
of `records` synthetic records (fabricscope/measurements/synthetic.py; record
n of agent i at base + n µs), so InfluxDB can be checked point by point:
`count(n)` per node must equal batches x records. Records are encoded as lines
before the clock starts (Shipper.send_lines), so the timed part is batch
serialization, the transport and the collector. Memory-only spools (nothing on disk).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from agent.metrics import AgentMetrics
from agent.shipper import Backoff, Shipper
from agent.sources.synthetic import make_record
from agent.spool import BatchSpool
from fabricscope.lineschema import canonical_line

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
    began = time.perf_counter()
    start.set()
    await asyncio.wait_for(asyncio.gather(*tasks), spec.timeout_s + 60)
    seconds = time.perf_counter() - began
    dropped = int(_total(metrics, "fabricscope_agent_records_dropped_total"))
    sent = spec.total_records
    return LoadResult(
        records=sent, acked_records=sent - dropped, dropped=dropped,
        batches_ok=int(_total(metrics, "fabricscope_agent_batches_acked_total", status="ok")),
        retries=int(_total(metrics, "fabricscope_agent_batches_acked_total", status="retry")),
        bytes_sent=int(_total(metrics, "fabricscope_agent_sent_bytes_total")), seconds=seconds)
