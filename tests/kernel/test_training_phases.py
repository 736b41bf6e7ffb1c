"""Training phases and retransmits joined with collectives, in the lab (agent/training_join.py).

Real 3-rank DDP over gloo, one real agent (`--probes gloo,tcp_flows,markers`) in
node 1's namespace. The ranks read a batch from a data server every step and write a
checkpoint every few steps (lab/dataserver.py, on the lab's gateway: a peer that is
no rank), logging each transfer's wall-clock bounds and bytes: the ground truth.
Data loading and checkpoints must come out as gloo_phase records, byte-exact,
inside those bounds and in the right step, while the ring's own traffic is folded
into the collectives. A second run with random loss on node 1 checks that the
retransmits stamped inside each collective are counted on it.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabricscope import schema
from fabricscope.records import Record

STEPS = 12
EVERY = 4                 # a checkpoint after every 4th step
DATA_BYTES = 2 << 20
NODE = 1                  # the agent's node and rank
SLACK_NS = 2_000_000      # wall clock vs the agent's monotonic->wall mapping


@dataclass
class Run:
    records: list[Record]
    truth: list[dict]
    server: str
    stderr: str

    def of(self, measurement: str, **tags) -> list[Record]:
        return [r for r in self.records if r.measurement == measurement
                and all(r.tags.get(k) == v for k, v in tags.items())]

    def near(self, event: dict, margin_ns: int = 200_000_000) -> str:
        """The phases and transfers around a ground-truth transfer, for a failure
        message: (start relative to the event's, seconds, bytes in, bytes out, ...)."""
        lo, hi = event["start_ns"] - margin_ns, event["end_ns"] + margin_ns
        rows = [(r.measurement, r.time_ns - event["start_ns"], r.fields["seconds"],
                 r.fields["bytes_in"], r.fields["bytes_out"],
                 r.fields.get("peer") or r.tags.get("daddr"), r.tags.get("rank"))
                for r in self.records if r.measurement in ("gloo_phase", "tcp_transfer")
                and "bytes_in" in r.fields and lo <= r.time_ns <= hi]
        closes = [(r.tags["sport"], r.tags.get("from_state"), r.fields.get("bytes_acked"),
                   r.fields.get("bytes_sent"), r.fields.get("bytes_received"))
                  for r in self.records if r.measurement == "tcp_flow_close"
                  and f"{r.tags.get('daddr')}:{r.tags.get('dport')}" == self.server]
        return f"truth lasted {(event['end_ns'] - event['start_ns']) / 1e6:.2f} ms; " \
               f"around it: {rows}; the server's connections closed (sport, from, " \
               f"acked, sent, received): {closes}"

    def summary(self) -> str:
        """What came out, for a failure message: records by measurement, transfers by
        owner, and the agent's log tail."""
        counts = Counter(r.measurement for r in self.records)
        owners = Counter((t.tags.get("rank", "-"), t.tags.get("pid", "-"), t.tags.get("comm", "-"),
                          t.tags.get("daddr"))
                         for t in self.of("tcp_transfer"))
        return f"records {dict(counts)}; transfers by (rank, pid, comm, daddr) " \
               f"{dict(owners)}; " \
               f"agent log: {self.stderr[-1500:]}"


def _run(tmp: Path, loss_pct: float = 0.0, data: bool = True) -> Run:
    from tests.kernel.jsonl_agent import jsonl_agent, records
    from fabricscope.lab import faults
    from fabricscope.lab.dataserver import running_dataserver
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training

    with running_lab(nodes=3) as lab, running_dataserver(lab, None) as server:
        with jsonl_agent(lab, lab.nodes[NODE], tmp, "--probes", "gloo,tcp_flows,markers",
                         "--tcp-transfer-min-bytes", "1") as agent:
            if loss_pct:
                faults.loss(lab, NODE, loss_pct)
            kw = dict(data_server=server, data_bytes=DATA_BYTES, checkpoint_every=EVERY,
                      io_log_dir=str(tmp)) if data else {}
            with start_training(lab, STEPS, model_mb=4,
                                master_port=29000 + os.getpid() % 500, **kw) as training:
                list(training.steps())
                assert training.wait() == 0, training.error
                truth = training.io_events(NODE)
    # stopped: the last poll drained the closes and flushed the join
    return Run(records(agent.out_path), truth, server, agent.err_path.read_text())


@pytest.fixture(scope="module")
def phases_run(tmp_path_factory) -> Run:
    return _run(tmp_path_factory.mktemp("phases"))


def _inside(r: Record, event: dict) -> bool:
    end = r.time_ns + int(r.fields["seconds"] * 1e9)
    return event["start_ns"] - SLACK_NS <= r.time_ns and end <= event["end_ns"] + SLACK_NS


def test_records_match_the_schema(phases_run):
    assert phases_run.records, phases_run.stderr[-2000:]
    for r in phases_run.records:
        schema.validate(r)


def test_data_loading_is_found_byte_exact_inside_each_read(phases_run):
    reads = [e for e in phases_run.truth if e["kind"] == "data_load"]
    assert len(reads) == STEPS and all(e["bytes"] == DATA_BYTES for e in reads)
    phases = phases_run.of("gloo_phase", phase="data_load", rank=str(NODE))
    for e in reads:
        mine = [p for p in phases if _inside(p, e) and p.fields["peer"] == phases_run.server]
        assert sum(p.fields["bytes_in"] for p in mine) == DATA_BYTES, \
            f"{e}: {phases_run.near(e)}; {phases_run.summary()}"
        # steps run from one first AllReduce to the next: step n's read is in step n - 1
        assert {p.fields["step"] for p in mine} == {e["step"] - 1}, (e, mine)


def test_checkpoints_are_found_byte_exact_in_their_step(phases_run):
    writes = [e for e in phases_run.truth if e["kind"] == "checkpoint"]
    assert [e["step"] for e in writes] == [EVERY - 1 + i * EVERY for i in range(STEPS // EVERY)]
    phases = phases_run.of("gloo_phase", phase="checkpoint", rank=str(NODE))
    for e in writes:
        mine = [p for p in phases if _inside(p, e) and p.fields["peer"] == phases_run.server]
        # what the peer acknowledged: the 16-byte request and the checkpoint
        assert sum(p.fields["bytes_out"] for p in mine) == e["bytes"] + 16, \
            f"{e}: {phases_run.near(e)}; {phases_run.summary()}"
        assert {p.fields["step"] for p in mine} == {e["step"]}, (e, mine)


def test_ring_traffic_is_folded_not_taken_for_io(phases_run):
    bulk = [p for p in phases_run.of("gloo_phase") if p.tags["phase"] in ("data_load",
                                                                         "checkpoint")
            and p.fields["bytes"] >= 64 << 10]
    assert bulk and {p.fields["peer"] for p in bulk} == {phases_run.server}, \
        phases_run.summary()
    transfers = phases_run.of("tcp_transfer")
    assert transfers and all(t.tags.get("rank") in (None, str(NODE)) for t in transfers)
    # the gradients crossed the ring inside collectives: no written transfer carries them
    ring = [t for t in transfers if t.tags["daddr"] != phases_run.server.rsplit(":", 1)[0]
            and t.fields["bytes_in"] + t.fields["bytes_out"] >= 1 << 20]
    assert ring == []


@pytest.fixture(scope="module")
def lossy_run(tmp_path_factory) -> Run:
    return _run(tmp_path_factory.mktemp("lossy"), loss_pct=2.0, data=False)


def test_retransmits_inside_each_collective_are_counted_on_it(lossy_run):
    colls = lossy_run.of("gloo_collective", rank=str(NODE))
    assert colls and all("retrans_segs" in c.fields for c in colls), lossy_run.stderr[-2000:]
    pid = str(colls[0].fields["pid"])
    retrans = [(r.time_ns, r.fields["segs"]) for r in lossy_run.of("tcp_retransmit", pid=pid)]
    for c in colls:
        end = c.time_ns + int(c.fields["seconds"] * 1e9)
        inside = [s for t, s in retrans if c.time_ns <= t <= end]
        assert (c.fields["retransmits"], c.fields["retrans_segs"]) == \
            (len(inside), sum(inside)), c
    assert sum(c.fields["retrans_segs"] for c in colls) > 0     # 2 % loss hits the ring
    # every step with a length (the last one of a process has none, so no window)
    steps = [s for s in lossy_run.of("gloo_step", rank=str(NODE)) if "seconds" in s.fields]
    assert steps and all(0 <= s.fields["sync_retrans_segs"] <= s.fields["retrans_segs"]
                         for s in steps)
    assert sum(s.fields["sync_retrans_segs"] for s in steps) > 0
    assert sum(s.fields["retrans_segs"] for s in steps) <= sum(s for _, s in retrans)
