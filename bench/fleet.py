"""A simulated training fleet: what every node's agent ships each second, as the
canonical lines a real agent sends, cheap enough to produce in real time for 1,000
nodes on the machine that also runs the collector under test.

One job of N ranks in a ring (rank i on node i, gloo's ring: rank i sends the
gradients to rank i-1), steps of an 8 MiB model, each rank reading 1 MiB per step
from a storage server and writing a 1 MiB checkpoint to it. What a node ships,
taken from recorded 3-node lab runs (DDP over gloo, `--data-mb 1`, a checkpoint
per step; healthy at 3.5 steps/s: 50 records per node-second; with 2 % loss on
a node's port at 1.9 steps/s: 31, plus 76 tcp_retransmit per node-second on the
lossy senders):

- per second (the agent's 1 s windows): 1 tcp_node, 5 tcp_flow (ring out to
  rank i-1, ring in from rank i+1, storage read, storage write: the job's; the
  agent's own flow to the collector, no job tags), 2 nic_window (rx, tx),
  1 nic_qdisc, 1 gloo_progress (the step in progress at the poll);
- per training step: 1 gloo_step, 2 gloo_collective (two gradient buckets),
  4 gloo_phase (compute, grad_sync, data_load, checkpoint), 3 nic_burst,
  2 tcp_transfer (the read, the checkpoint);
- healthy: 3 steps/s (46 records per node-second); once the fault is on, 2 steps
  of 0.5 s per second, and the lossy node's cells resend 2 % of their segments
  (its ring out, its checkpoint writes, and rank i+1's ring flow into it), with a
  tcp_retransmit record per 2.5 segments resent, as the lab's fast retransmits
  carried: ~200 records per second on each of those two senders.

Every line is built once per node and mode as a %-template whose timestamp (and
step index) are filled in per second: `Fleet.lines(i, second)` is a few string
formats per line, so the generator's CPU stays small beside the collector's.

Timing: node i's agent polls at a phase of i/N s within the second; the batch it
ships 0.2 s after a poll carries its window of [second + phase, +1 s) and the
records of its steps that started in the second before (complete, with their
phases), as the agent's join passes them a poll later.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from fabricscope.lineschema import canonical_line
from fabricscope.records import Record

SECOND = 1_000_000_000
MSS = 1448
MODEL_BYTES = 8_396_800          # the lab's 8 MiB MLP, as gloo_step.bytes reports it
READ_BYTES = CHECKPOINT_BYTES = 1 << 20
LOSS = 0.02                      # share of the lossy cells' segments resent
SEGS_PER_RECORD = 2.5            # tcp_retransmit records: one per fast retransmit
SHIP_DELAY_S = 0.2               # an agent ships its batch this long after a poll
STORAGE = "198.19.255.1"         # the data server behind the fabric
COLLECTOR = "198.19.255.2"
_TS = 1_111_111_111_111_111_111  # 19 digits, as every timestamp of this century
_STEP = 987_654_321


@dataclass(frozen=True)
class Mode:
    """How a node's second looks: steps per second and their timing."""

    steps: int
    step_s: float
    sync_s: float

    @property
    def compute_s(self) -> float:
        return self.step_s - self.sync_s


HEALTHY = Mode(steps=3, step_s=1 / 3, sync_s=0.2)
FAULTED = Mode(steps=2, step_s=0.5, sync_s=0.367)


@dataclass(frozen=True)
class Template:
    fmt: str            # the canonical line with %d for (step index and) timestamp
    offset_ns: int      # from the start of the window (or the step)
    stepped: bool = False


@dataclass
class NodeTemplates:
    window: dict[bool, list[Template]]      # lossy? -> per-second records
    steps: dict[bool, list[Template]]       # faulted? -> the records of one step


def template(record: Record, offset_ns: int) -> Template:
    """The record's canonical line with its timestamp (and a step field) left open."""
    stepped = record.fields.get("step") == _STEP
    record.time_ns = _TS
    line = canonical_line(record).replace("%", "%%")
    if stepped:
        line = line.replace(f"step={_STEP}i", "step=%di")
    assert line.endswith(f" {_TS}")
    return Template(line[:-19] + "%d", offset_ns, stepped)


@dataclass
class Fleet:
    """N nodes of one job; node `lossy`'s cells resend LOSS of their segments from
    second `onset_s` (UNIX seconds) on, and every rank's steps slow down with it."""

    nodes: int
    job: str = "198.18.0.1:29500"
    lossy: int = 0
    onset_s: int = 1 << 40
    start_s: int = 0                     # second of the first step (step indexes)
    _templates: list[NodeTemplates] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.nodes < 3:
            raise ValueError("a ring needs at least 3 nodes")
        self._templates = [_node_templates(self, i) for i in range(self.nodes)]

    # -- who is who --------------------------------------------------------------------
    def node(self, i: int) -> str:
        return f"node{i}"

    def address(self, i: int) -> str:
        return str(ipaddress.IPv4Address("198.18.0.1") + i)

    def phase_ns(self, i: int) -> int:
        return i * SECOND // self.nodes

    def sends_at_s(self, i: int, second: int) -> float:
        """When node i ships the batch of its window starting in `second` (UNIX s)."""
        return second + 1 + (self.phase_ns(i) / SECOND) + SHIP_DELAY_S

    def onset_ns(self) -> int:
        """When the loss begins: the start of the lossy node's first lossy window."""
        return self.onset_s * SECOND + min(self.phase_ns(self.lossy),
                                           self.phase_ns((self.lossy + 1) % self.nodes))

    def senders_into_lossy(self) -> tuple[int, int]:
        """The two nodes whose cells cross the lossy port: itself and rank lossy+1."""
        return self.lossy, (self.lossy + 1) % self.nodes

    # -- what node i ships -------------------------------------------------------------
    def lines(self, i: int, second: int) -> list[str]:
        """Node i's batch for its window starting in `second`: the window's records and
        those of the steps that started in the second before."""
        t = self._templates[i]
        base = second * SECOND + self.phase_ns(i)
        out = [tp.fmt % (base + tp.offset_ns) for tp in t.window[second >= self.onset_s]]
        return out + self.step_lines(i, second - 1)

    def step_lines(self, i: int, second: int, only: tuple[str, ...] = ()) -> list[str]:
        """The records of node i's steps that started in `second` (those of the
        measurements named in `only`, when given: a job's history is its steps)."""
        mode = FAULTED if second >= self.onset_s else HEALTHY
        templates = [tp for tp in self._templates[i].steps[mode is FAULTED]
                     if not only or tp.fmt.startswith(only)]
        first = self._step_index(second)
        out = []
        for j in range(mode.steps):
            start = second * SECOND + int(j * mode.step_s * SECOND) + (i % 10) * 50_000
            for tp in templates:
                out.append(tp.fmt % (first + j, start + tp.offset_ns) if tp.stepped
                           else tp.fmt % (start + tp.offset_ns))
        return out

    def _step_index(self, second: int) -> int:
        healthy = max(0, min(second, self.onset_s) - self.start_s)
        return healthy * HEALTHY.steps + max(0, second - self.onset_s) * FAULTED.steps

    def records_per_second(self, i: int, faulted: bool) -> int:
        t = self._templates[i]
        mode = FAULTED if faulted else HEALTHY
        return len(t.window[faulted]) + mode.steps * len(t.steps[faulted])


def _node_templates(fleet: Fleet, i: int) -> NodeTemplates:
    return NodeTemplates(window={f: _window(fleet, i, f) for f in (False, True)},
                         steps={f: _step(fleet, i, f) for f in (False, True)})


def _lossy_sides(fleet: Fleet, i: int) -> tuple[bool, bool]:
    """(node i is the lossy node, node i's ring flow goes into it): rank i sends to i-1."""
    return i == fleet.lossy, (i - 1) % fleet.nodes == fleet.lossy


def _owner_tags(fleet: Fleet, i: int) -> dict[str, str]:
    return {"pid": str(2000 + i % 50), "comm": "python", "cgroup": f"/kubepods/train-{i}",
            "rank": str(i), "local_rank": "0", "world_size": str(fleet.nodes),
            "job": fleet.job}


def _flow(fleet, i, daddr, sport, dport, acked, received, rtt_us, lossy, owned=True):
    segs = max(1, acked // MSS)
    resent = round(segs * LOSS) if lossy else 0
    fields = {"seconds": 1.0, "segs_in": max(1, received // MSS + segs // 2),
              "bytes_acked": acked, "acked_bps": acked * 8.0, "bytes_received": received,
              "received_bps": received * 8.0, "rtt_samples": max(1, segs // 2),
              "rtt_p50_us": rtt_us, "rtt_p90_us": rtt_us * 2, "rtt_p99_us": rtt_us * 6,
              "rtt_min_us": rtt_us / 2, "rtt_max_us": rtt_us * 20, "rtt_mean_us": rtt_us * 1.3,
              "rtt_stddev_us": rtt_us, "cwnd_min": 10, "cwnd_max": 60 if lossy else 200,
              "retrans_segs": resent, "retrans_bytes": resent * MSS,
              "timeouts": 1 if lossy else 0}
    tags = {"node": fleet.node(i), "saddr": fleet.address(i), "daddr": daddr,
            "sport": str(sport), "dport": str(dport),
            **(_owner_tags(fleet, i) if owned else {})}
    return Record("tcp_flow", 0, tags, fields), segs, resent


def _window(fleet: Fleet, i: int, faulted: bool) -> list[Template]:
    """The records of one of node i's 1 s windows, offsets from the window's start."""
    lossy_out, lossy_in = _lossy_sides(fleet, i) if faulted else (False, False)
    n = fleet.nodes
    steps = (FAULTED if faulted else HEALTHY).steps
    ring = steps * 2 * MODEL_BYTES * (n - 1) // n
    flows = [
        _flow(fleet, i, fleet.address((i - 1) % n), 42593, 40000 + i, ring, steps * 4096,
              60.0, lossy_out or lossy_in),
        _flow(fleet, i, fleet.address((i + 1) % n), 40000 + (i + 1) % n, 42593, steps * 4096,
              ring, 60.0, False),
        _flow(fleet, i, STORAGE, 50000 + i, 36379, steps * 320, steps * READ_BYTES, 200.0,
              False),
        _flow(fleet, i, STORAGE, 51000 + i, 36379, steps * CHECKPOINT_BYTES, steps * 48, 200.0,
              lossy_out),
        _flow(fleet, i, COLLECTOR, 52000 + i, 9470, 2000, 400, 150.0, False, owned=False),
    ]
    segs = sum(f[1] for f in flows)
    resent = sum(f[2] for f in flows)
    out = [template(f[0], 1000 + k) for k, f in enumerate(flows)]
    node = {"node": fleet.node(i)}
    acked = sum(f[0].fields["bytes_acked"] for f in flows)
    out.append(template(Record("tcp_node", 0, node, {
        "seconds": 1.0, "flows": len(flows), "bytes_acked": acked, "segs_out": segs + resent,
        "bytes_out": acked + resent * MSS, "retrans_segs": resent,
        "retrans_bytes": resent * MSS, "retrans_ratio": resent * MSS / max(1, acked),
        "retrans_seg_ratio": resent / max(1, segs), "timeouts": 1 if resent else 0,
        "fast_segs": resent, "rto_segs": 0, "slow_start_segs": 0, "tlp_segs": 0,
        "syn_segs": 0, "synack_segs": 0, "unknown_segs": 0, "resets_sent": 0,
        "resets_received": 0, "opens": 0, "closes": 0}), 0))
    iface = {"node": fleet.node(i), "interface": "eth0"}
    for k, direction in enumerate(("rx", "tx")):
        out.append(template(Record("nic_window", 0, {**iface, "direction": direction}, {
            "bytes": ring, "packets": ring // MSS, "rate_bps": ring * 8.0,
            "peak_bps": 7.0e9, "p99_bps": 5.0e9, "peak_util": 0.7, "hot_bins": 0,
            "hot_s": 0.0, "link_speed_bps": 10_000_000_000, "bin_us": 100, "lost_bins": 0,
            "bursts": 3 * steps, "bursts_listed": 3 * steps}), 2000 + k))
    out.append(template(Record("nic_qdisc", 0, {**iface, "kind": "mq", "handle": "0:0",
                                                "parent": "root"}, {
        "backlog_bytes": 0, "qlen": 0, "drops": 0, "overlimits": 0, "requeues": 0,
        "bytes": ring, "packets": ring // MSS}), 3000))
    # the step in progress at the agent's poll (gloo_progress: one per poll and rank)
    mode = FAULTED if faulted else HEALTHY
    out.append(template(Record("gloo_progress", 0, {"node": fleet.node(i), "job": fleet.job,
                                                    "rank": str(i)}, {
        "step": 0, "seconds": mode.step_s / 2, "sync_seconds": mode.sync_s / 2,
        "compute_seconds": (mode.step_s - mode.sync_s) / 2, "waiting": False}), 5000))
    for f, _segs, count in flows:
        for k in range(round(count / SEGS_PER_RECORD)):
            out.append(template(Record("tcp_retransmit", 0, {
                **f.tags, "state": "ESTABLISHED", "kind": "fast"}, {
                "segs": 3 if k % 2 else 2, "payload_bytes": MSS * (3 if k % 2 else 2),
                "err": 0}), 4000 + k * (SECOND // (count + 1))))
    return out


def _step(fleet: Fleet, i: int, faulted: bool) -> list[Template]:
    """The records of one step of rank i, offsets from the step's start."""
    mode = FAULTED if faulted else HEALTHY
    lossy = faulted and any(_lossy_sides(fleet, i))
    n = fleet.nodes
    tags = {"node": fleet.node(i), "job": fleet.job, "rank": str(i)}
    sent = 2 * MODEL_BYTES * (n - 1) // n
    resent = round(sent // MSS * LOSS) if lossy else 0
    compute_ns = int(mode.compute_s * SECOND)
    sync_ns = int(mode.sync_s * SECOND)
    busbw = 2 * (n - 1) / n * MODEL_BYTES / mode.sync_s / 1e9
    owner = _owner_tags(fleet, i)
    out = [
        template(Record("gloo_step", 0, tags, {
            "step": _STEP, "seconds": mode.step_s, "sync_seconds": mode.sync_s,
            "compute_seconds": mode.compute_s, "comm_fraction": mode.sync_s / mode.step_s,
            "buckets": 2, "bytes": MODEL_BYTES, "sent_bytes": sent, "busbw_gbs": busbw,
            "wire_efficiency": 1.0, "retransmits": resent, "retrans_segs": resent,
            "sync_retrans_segs": resent}), 0),
        template(Record("gloo_phase", 0, {**tags, "phase": "compute"}, {
            "seconds": mode.compute_s, "bytes": 0, "collectives": 0, "step": _STEP}), 0),
        template(Record("gloo_phase", 0, {**tags, "phase": "grad_sync"}, {
            "seconds": mode.sync_s, "bytes": MODEL_BYTES, "collectives": 2, "step": _STEP}),
            compute_ns),
        template(Record("gloo_phase", 0, {**tags, "phase": "data_load"}, {
            "seconds": 0.004, "bytes": READ_BYTES, "collectives": 0, "step": -1,
            "bytes_in": READ_BYTES, "bytes_out": 0, "peer": f"{STORAGE}:36379",
            "pid": 2000 + i % 50}), 1_000_000),
        template(Record("gloo_phase", 0, {**tags, "phase": "checkpoint"}, {
            "seconds": 0.006, "bytes": CHECKPOINT_BYTES, "collectives": 0, "step": -1,
            "bytes_in": 0, "bytes_out": CHECKPOINT_BYTES, "peer": f"{STORAGE}:36379",
            "pid": 2000 + i % 50}), 10_000_000),
    ]
    for k in range(2):
        out.append(template(Record("gloo_collective", 0, {**tags, "op": "AllReduce"}, {
            "seconds": mode.sync_s / 2, "bytes": MODEL_BYTES // 2, "bytes_source": "options",
            "nranks": n, "comm_rank": i, "sent_bytes": sent // 2, "recv_bytes": sent // 2,
            "sends": 2 * (n - 1), "algbw_gbs": busbw * n / (2 * (n - 1)), "busbw_gbs": busbw,
            "ring_bytes": sent // 2, "wire_efficiency": 1.0, "pid": 2000 + i % 50,
            "tid": 3000 + k, "retransmits": resent // 2, "retrans_segs": resent // 2}),
            compute_ns + k * sync_ns // 2))
    for k in range(3):
        out.append(template(Record("nic_burst", 0, {"node": fleet.node(i), "interface": "eth0",
                                                    "direction": ("rx", "tx")[k % 2]}, {
            "duration_ns": 150_000, "bytes": 200_000, "packets": 140, "peak_util": 0.7,
            "peak_bps": 7.0e9, "hot_bins": 0, "bins": 2}), compute_ns + k * sync_ns // 3))
    for k, (sport, bytes_in, bytes_out) in enumerate(((50000 + i, READ_BYTES, 0),
                                                       (51000 + i, 0, CHECKPOINT_BYTES))):
        out.append(template(Record("tcp_transfer", 0, {
            "node": fleet.node(i), "saddr": fleet.address(i), "daddr": STORAGE,
            "sport": str(sport), "dport": "36379", "side": "client", **owner}, {
            "seconds": 0.004 + 0.002 * k, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "gap_s": mode.step_s}), 1_000_000 + k * 9_000_000))
    return out
