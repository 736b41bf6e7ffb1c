"""Shipper against an in-process fake grpc.aio Collector: acks, resends, order, drops."""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
import pytest

from agent.metrics import AgentMetrics
from agent.shipper import Backoff, BatchQueue, Shipper
from fabricscope.records import Record
from fabricscope.wire import pb, pb_grpc, record_from_pb

OK, RETRY, REJECTED = pb.Ack.OK, pb.Ack.RETRY, pb.Ack.REJECTED


def recs(n, start=0):
    return [Record("m", 1 + i, {"node": "n"}, {"v": i}) for i in range(start, start + n)]


class FakeCollector(pb_grpc.CollectorServicer):
    """Records every Batch; `policy(batch, attempt)` returns an Ack status or "hangup"."""

    def __init__(self, policy=lambda batch, attempt: OK):
        self.policy = policy
        self.received: list = []
        self.streams = 0

    async def Stream(self, request_iterator, context):  # noqa: N802 (grpc naming)
        self.streams += 1
        async for batch in request_iterator:
            attempt = sum(1 for b in self.received if b.seq == batch.seq)
            self.received.append(batch)
            status = self.policy(batch, attempt)
            if status == "hangup":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "collector restarting")
            yield pb.Ack(seq=batch.seq, status=status, reason="test")

    def values(self):
        return [[record_from_pb(r).fields["v"] for r in b.records] for b in self.received]


async def start_server(servicer, port=0):
    server = grpc.aio.server()
    pb_grpc.add_CollectorServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_shipper(port, metrics, max_records=10_000, **kw):
    kw.setdefault("backoff", Backoff(initial_s=0.02, max_s=0.1, rng=lambda: 0.0))
    kw.setdefault("connect_timeout_s", 0.5)
    kw.setdefault("flush_timeout_s", 10.0)
    return Shipper(f"127.0.0.1:{port}", "n", metrics, BatchQueue(max_records),
                   agent_id="agent-1", **kw)


async def until(cond, what, timeout_s=10.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def sample(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels or None) or 0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_batches_arrive_in_order_with_seq_from_1_and_are_forgotten_on_ok():
    metrics = AgentMetrics()

    async def main():
        fake = FakeCollector()
        server, port = await start_server(fake)
        shipper = make_shipper(port, metrics).start()
        for i in range(3):
            await shipper.send(recs(2, 2 * i))
        await shipper.close()
        await server.stop(None)
        return fake, shipper
    fake, shipper = run(main())
    assert [b.seq for b in fake.received] == [1, 2, 3]
    assert {(b.agent_id, b.node, b.dropped_before) for b in fake.received} == {("agent-1", "n", 0)}
    assert fake.values() == [[0, 1], [2, 3], [4, 5]]
    assert len(shipper.queue) == 0
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="ok") == 3
    assert sample(metrics, "fabricscope_agent_batches_sent_total") == 3
    assert sample(metrics, "fabricscope_agent_queue_records") == 0
    assert sample(metrics, "fabricscope_agent_collector_connected") == 1


def test_retry_resends_the_same_batch_and_nothing_is_lost():
    metrics = AgentMetrics()

    async def main():
        fake = FakeCollector(lambda b, attempt: RETRY if b.seq == 2 and attempt < 2 else OK)
        server, port = await start_server(fake)
        shipper = make_shipper(port, metrics).start()
        for i in range(3):
            await shipper.send(recs(1, i))
        await shipper.close()
        await server.stop(None)
        return fake
    fake = run(main())
    seqs = [b.seq for b in fake.received]
    assert seqs.count(2) == 3 and sorted(set(seqs)) == [1, 2, 3]
    resent = [b for b in fake.received if b.seq == 2]
    assert all(b.records == resent[0].records for b in resent)
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="retry") == 2
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="ok") == 3
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="shutdown") == 0


def test_rejected_batches_are_counted_and_not_resent(caplog):
    metrics = AgentMetrics()

    async def main():
        fake = FakeCollector(lambda b, attempt: REJECTED if b.seq == 1 else OK)
        server, port = await start_server(fake)
        shipper = make_shipper(port, metrics).start()
        await shipper.send(recs(4))
        await shipper.send(recs(1, 4))
        await shipper.close()
        await server.stop(None)
        return fake
    with caplog.at_level(logging.WARNING, "fabricscope.agent.shipper"):
        fake = run(main())
    assert [b.seq for b in fake.received] == [1, 2]
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="rejected") == 4
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="rejected") == 1
    assert sum("rejected batch 1 (4 records): test" in r.message for r in caplog.records) == 1


def test_unacked_batches_are_resent_with_their_seq_after_a_reconnect():
    metrics = AgentMetrics()

    async def main():
        fake = FakeCollector(lambda b, attempt: "hangup" if b.seq == 2 and attempt == 0 else OK)
        server, port = await start_server(fake)
        shipper = make_shipper(port, metrics).start()
        for i in range(4):
            await shipper.send(recs(1, i))
        await shipper.close()
        await server.stop(None)
        return fake
    fake = run(main())
    assert fake.streams >= 2
    delivered = {b.seq: record_from_pb(b.records[0]).fields["v"] for b in fake.received}
    assert delivered == {1: 0, 2: 1, 3: 2, 4: 3}
    # after the hangup, 2 is resent before anything newer
    after = [b.seq for b in fake.received][[b.seq for b in fake.received].index(2) + 1:]
    assert after[0] == 2


def test_full_queue_drops_oldest_and_reports_it_in_dropped_before(caplog):
    metrics = AgentMetrics()
    port = free_port()

    async def main():
        shipper = make_shipper(port, metrics, max_records=30).start()
        for i in range(5):                       # collector down: 50 records for 30 places
            await shipper.send(recs(10, 10 * i))
        await until(lambda: sample(metrics, "fabricscope_agent_collector_connected") == 0
                    and any("unreachable" in r.message for r in caplog.records),
                    "the unreachable warning")
        await asyncio.sleep(0)
        fake = FakeCollector()
        server, _ = await start_server(fake, port)
        await until(lambda: len(shipper.queue) == 0, "the queue to drain")
        await shipper.send(recs(1, 50))
        await shipper.close()
        await server.stop(None)
        return fake
    with caplog.at_level(logging.INFO, "fabricscope.agent.shipper"):
        fake = run(main())
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="queue_full") == 20
    assert [b.seq for b in fake.received] == [1, 2, 3, 4]
    assert [b.dropped_before for b in fake.received] == [20, 20, 20, 20]
    assert fake.values() == [list(range(20, 30)), list(range(30, 40)), list(range(40, 50)), [50]]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].message   # not one per retry
    assert sum("connected" in r.message and r.levelno == logging.INFO
               for r in caplog.records) == 1


def test_shutdown_with_collector_down_counts_what_is_left():
    metrics = AgentMetrics()

    async def main():
        shipper = make_shipper(free_port(), metrics, flush_timeout_s=0.2).start()
        await shipper.send(recs(7))
        await shipper.close()
    run(main())
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="shutdown") == 7


def test_batch_queue_bounds_by_records():
    q = BatchQueue(max_records=5)
    assert q.put(recs(3)) == 0
    assert q.put(recs(3)) == 3            # the first batch goes
    assert (q.records, q.dropped, len(q)) == (3, 3, 1)
    p = q.next_unsent()
    p.seq, p.sent = 1, True
    assert q.next_unsent() is None and q.in_flight() == 1
    q.unsend_all()
    assert q.next_unsent() is p
    p.sent = True
    assert q.take(1) is p and q.records == 0 and q.take(1) is None


def test_backoff_grows_caps_and_resets():
    b = Backoff(initial_s=1, max_s=5, factor=2, jitter=0.5, rng=lambda: 1.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 2.5, 2.5]
    b.reset()
    assert b.next() == 0.5


@pytest.mark.parametrize("bad", ["nohost", "host:port"])
def test_collector_address_without_port_is_a_user_error(bad):
    from agent.config import AgentConfig
    from fabricscope.errors import UserError
    with pytest.raises(UserError, match="has no port"):
        AgentConfig(collector=bad).check()
