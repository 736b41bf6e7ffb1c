"""Agent pipeline stages: batcher, node tagging, jsonl output, the wired pipeline."""

from __future__ import annotations

import asyncio
import io
import json

from fabricscope.agent.metrics import AgentMetrics
from fabricscope.agent.outputs import JsonlOutput
from fabricscope.agent.pipeline import Batcher, batch_stage, run_pipeline, tag_node
from fabricscope.records import Record


def recs(n, start=0, measurement="m"):
    return [Record(measurement, 1000 + i, {"i": str(i)}, {"v": i}) for i in range(start, start + n)]


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels or None)


def test_batcher_cuts_full_batches_and_keeps_the_rest():
    b = Batcher(max_records=3, flush_interval_s=1.0)
    full = b.add(recs(7), now=10.0)
    assert [len(x) for x in full] == [3, 3]
    assert b.deadline() == 11.0          # the leftover record arrived at 10.0
    assert not b.due(10.9) and b.due(11.0)
    assert [r.fields["v"] for r in b.flush()] == [6]
    assert b.deadline() is None and b.flush() == []


def test_batcher_deadline_is_set_by_the_first_record_of_a_batch():
    b = Batcher(max_records=100, flush_interval_s=2.0)
    b.add(recs(1), now=1.0)
    b.add(recs(1), now=2.5)
    assert b.deadline() == 3.0


def test_tag_node_adds_the_node_tag():
    assert [r.tags for r in tag_node(recs(2), "node7")] == \
        [{"i": "0", "node": "node7"}, {"i": "1", "node": "node7"}]


def test_batch_stage_flushes_a_partial_batch_after_the_interval():
    async def main():
        inq, outq = asyncio.Queue(), asyncio.Queue()
        task = asyncio.create_task(batch_stage(inq, outq, Batcher(1000, 0.05)))
        inq.put_nowait(recs(3))
        batch = await asyncio.wait_for(outq.get(), 10)   # arrives without an end marker
        inq.put_nowait(recs(2, 3))
        inq.put_nowait(None)
        rest = await asyncio.wait_for(outq.get(), 10)
        assert await asyncio.wait_for(outq.get(), 10) is None
        await task
        return batch, rest
    batch, rest = asyncio.run(main())
    assert [r.fields["v"] for r in batch] == [0, 1, 2]
    assert [r.fields["v"] for r in rest] == [3, 4]


def test_jsonl_output_prints_one_record_per_line():
    out = io.StringIO()
    asyncio.run(JsonlOutput(AgentMetrics(), out).send(recs(2)))
    lines = out.getvalue().splitlines()
    assert [Record.from_json(line) for line in lines] == recs(2)
    assert json.loads(lines[0]) == {"measurement": "m", "time_ns": 1000, "tags": {"i": "0"},
                                    "fields": {"v": 0}}


def test_jsonl_output_counts_what_a_closed_stdout_loses():
    out = io.StringIO()
    out.close()
    metrics = AgentMetrics()
    o = JsonlOutput(metrics, out)
    asyncio.run(o.send(recs(3)))
    asyncio.run(o.send(recs(2)))
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="stdout_closed") == 5


class FakeProbe:
    def __init__(self, name, batches, stop):
        self.name, self.batches, self.stop = name, list(batches), stop
        self.polls = 0

    def poll(self):
        self.polls += 1
        if not self.batches:
            self.stop()
            return []
        return self.batches.pop(0)

    def stats(self):
        return {"lost": 2, "decode_errors": 1}


class ListOutput:
    def __init__(self):
        self.batches, self.closed = [], False

    async def send(self, batch):
        self.batches.append(batch)

    async def close(self):
        self.closed = True


def test_pipeline_delivers_every_record_once_in_order_with_node_tag():
    metrics = AgentMetrics()
    out, sink = io.StringIO(), ListOutput()
    detached = []

    async def main():
        stop = asyncio.Event()
        probe = FakeProbe("fake", [recs(4), recs(3, 4), [], recs(5, 7)], stop.set)
        await run_pipeline([probe], [JsonlOutput(metrics, out), sink], node="n1",
                           poll_interval_s=0.001, batch_max_records=3, flush_interval_s=5,
                           metrics=metrics, stop=stop, after_poll=lambda: detached.append(1))
    asyncio.run(main())
    got = [Record.from_json(line) for line in out.getvalue().splitlines()]
    assert [r.fields["v"] for r in got] == list(range(12))
    assert all(r.tags["node"] == "n1" for r in got)
    assert all(len(b) <= 3 for b in sink.batches) and sink.closed
    assert sum(len(b) for b in sink.batches) == 12
    assert detached == [1]
    assert sample(metrics, "fabricscope_agent_records_total", probe="fake") == 12
    assert sample(metrics, "fabricscope_agent_events_lost_total", probe="fake") == 2
    assert sample(metrics, "fabricscope_agent_probe_events_total", probe="fake",
                  event="decode_errors") == 1
    assert sample(metrics, "fabricscope_agent_poll_seconds_count") >= 5


def test_a_failing_probe_does_not_stop_the_others():
    metrics = AgentMetrics()
    sink = ListOutput()

    class Broken:
        name = "broken"

        def poll(self):
            raise RuntimeError("boom")

        def stats(self):
            return {}

    async def main():
        stop = asyncio.Event()
        await run_pipeline([Broken(), FakeProbe("ok", [recs(2)], stop.set)], [sink], node="n",
                           poll_interval_s=0.001, batch_max_records=10, flush_interval_s=5,
                           metrics=metrics, stop=stop)
    asyncio.run(main())
    assert [r.fields["v"] for b in sink.batches for r in b] == [0, 1]
    assert sample(metrics, "fabricscope_agent_poll_errors_total", probe="broken") >= 2


def test_the_kernels_counters_outlive_the_detach_that_frees_their_maps():
    """A probe reads `lost` and `filtered` from BPF maps that its detach frees; the
    final snapshot, taken after the detach, keeps them at the values read before."""
    metrics = AgentMetrics()

    class Detaching(FakeProbe):
        attached = True

        def stats(self):
            user = {"records": 7}
            return {**user, "lost": 3, "filtered": 9} if self.attached else user

    async def main():
        stop = asyncio.Event()
        probe = Detaching("gloo", [recs(2)], stop.set)
        await run_pipeline([probe], [ListOutput()], node="n", poll_interval_s=0.001,
                           batch_max_records=10, flush_interval_s=5, metrics=metrics,
                           stop=stop, after_poll=lambda: setattr(probe, "attached", False))
    asyncio.run(main())
    assert metrics.probe_stats.get("gloo") == {"records": 7, "lost": 3, "filtered": 9}
    assert sample(metrics, "fabricscope_agent_events_lost_total", probe="gloo") == 3
