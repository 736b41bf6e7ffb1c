"""Shipper against an in-process fake grpc.aio Collector: acks, resends, order, drops, spool."""

from __future__ import annotations

import asyncio
import logging
import re

import grpc
import pytest

from fabricscope.agent.metrics import AgentMetrics
from fabricscope.agent.shipper import Backoff, Shipper
from fabricscope.agent.spool import BatchSpool
from fabricscope.errors import UserError
from fabricscope.records import Record
from fabricscope.services import free_port
from fabricscope.wire import pb, pb_grpc

OK, RETRY, REJECTED = pb.Ack.OK, pb.Ack.RETRY, pb.Ack.REJECTED


def recs(n, start=0, pad=""):
    tags = {"node": "n", "pad": pad} if pad else {"node": "n"}
    return [Record("m", 1 + i, dict(tags), {"v": i}) for i in range(start, start + n)]


class FakeCollector(pb_grpc.CollectorServicer):
    """Records every Batch; `policy(batch, attempt)` returns an Ack status, a (status,
    retry_after_ms) pair or "hangup"."""

    def __init__(self, policy=lambda batch, attempt: OK):
        self.policy = policy
        self.received: list = []
        self.arrivals: list[float] = []
        self.metadata: list[dict] = []
        self.streams = 0

    async def Stream(self, request_iterator, context):  # noqa: N802 (grpc naming)
        self.streams += 1
        self.metadata.append(dict(context.invocation_metadata()))
        async for batch in request_iterator:
            attempt = sum(1 for b in self.received if b.seq == batch.seq)
            self.received.append(batch)
            self.arrivals.append(asyncio.get_running_loop().time())
            status = self.policy(batch, attempt)
            if status == "hangup":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "collector restarting")
            status, after = status if isinstance(status, tuple) else (status, 0)
            yield pb.Ack(seq=batch.seq, status=status, reason="test", retry_after_ms=after)

    def values(self):
        return [[int(re.search(r" v=(-?\d+)i ", line).group(1)) for line in b.lines
                 if line.startswith("m,")] for b in self.received]

    def loss(self):
        """(seq, reason, records) of every agent_loss record received."""
        return [(b.seq, re.search(r",reason=(\w+)", line).group(1),
                 int(re.search(r" records=(\d+)i ", line).group(1)))
                for b in self.received for line in b.lines if line.startswith("agent_loss,")]


async def start_server(servicer, port=0):
    server = grpc.aio.server()
    pb_grpc.add_CollectorServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port


def make_shipper(port, metrics, max_records=10_000, spool_dir="", max_bytes=1 << 30,
                 agent_id="agent-1", **kw):
    kw.setdefault("backoff", Backoff(initial_s=0.02, max_s=0.1, rng=lambda: 0.0))
    kw.setdefault("connect_timeout_s", 0.5)
    kw.setdefault("flush_timeout_s", 10.0)
    spool = BatchSpool(str(spool_dir), max_bytes, max_records)
    spool.open()
    return Shipper(f"127.0.0.1:{port}", "n", metrics, spool, agent_id=agent_id, **kw)


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


async def serve_and_ship(fake, metrics, batches, **kw):
    server, port = await start_server(fake)
    try:
        shipper = make_shipper(port, metrics, **kw).start()
        for batch in batches:
            await shipper.send(batch)
        await shipper.close()
        return shipper
    finally:
        await server.stop(None)


def test_batches_arrive_in_order_with_seq_from_1_and_are_forgotten_on_ok():
    metrics, fake = AgentMetrics(), FakeCollector()
    shipper = run(serve_and_ship(fake, metrics, [recs(2, 2 * i) for i in range(3)]))
    assert [b.seq for b in fake.received] == [1, 2, 3]
    assert {(b.agent_id, b.node, b.dropped_before) for b in fake.received} == {("agent-1", "n", 0)}
    assert fake.values() == [[0, 1], [2, 3], [4, 5]]
    assert len(shipper.spool) == 0
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="ok") == 3
    assert sample(metrics, "fabricscope_agent_batches_sent_total") == 3
    assert sample(metrics, "fabricscope_agent_sent_bytes_total") == sum(
        b.ByteSize() for b in fake.received)
    assert sample(metrics, "fabricscope_agent_records_spooled_total") == 6
    assert sample(metrics, "fabricscope_agent_queue_records") == 0
    assert sample(metrics, "fabricscope_agent_collector_connected") == 1


def test_retry_resends_the_same_batch_after_retry_after_and_nothing_is_lost():
    metrics = AgentMetrics()
    fake = FakeCollector(lambda b, attempt: (RETRY, 300) if b.seq == 2 and attempt < 2 else OK)
    run(serve_and_ship(fake, metrics, [recs(1, i) for i in range(3)]))
    seqs = [b.seq for b in fake.received]
    assert seqs.count(2) == 3 and sorted(set(seqs)) == [1, 2, 3]
    resent = [b for b in fake.received if b.seq == 2]
    assert all(b.records == resent[0].records for b in resent)
    # The slow-down signal: nothing was sent within retry_after_ms of a RETRY.
    arrivals = [t for b, t in zip(fake.received, fake.arrivals) if b.seq == 2]
    assert all(later - earlier >= 0.3 for earlier, later in zip(arrivals, arrivals[1:]))
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="retry") == 2
    assert sample(metrics, "fabricscope_agent_collector_throttled_total") == 2
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="ok") == 3
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="shutdown") == 0


def test_rejected_batches_are_counted_and_not_resent(caplog):
    metrics = AgentMetrics()
    fake = FakeCollector(lambda b, attempt: REJECTED if b.seq == 1 else OK)
    with caplog.at_level(logging.WARNING, "fabricscope.agent.shipper"):
        run(serve_and_ship(fake, metrics, [recs(4), recs(1, 4)]))
    assert [b.seq for b in fake.received] == [1, 2]
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="rejected") == 4
    assert sample(metrics, "fabricscope_agent_batches_acked_total", status="rejected") == 1
    assert sum("rejected batch 1 (4 records): test" in r.message for r in caplog.records) == 1
    assert fake.loss() == []          # the collector counts its own refusals


def test_unacked_batches_are_resent_with_their_seq_after_a_reconnect():
    metrics = AgentMetrics()
    fake = FakeCollector(lambda b, attempt: "hangup" if b.seq == 2 and attempt == 0 else OK)
    run(serve_and_ship(fake, metrics, [recs(1, i) for i in range(4)]))
    assert fake.streams >= 2
    delivered = {b.seq: fake.values()[i][0] for i, b in enumerate(fake.received)}
    assert delivered == {1: 0, 2: 1, 3: 2, 4: 3}
    # after the hangup, 2 is resent before anything newer
    after = [b.seq for b in fake.received][[b.seq for b in fake.received].index(2) + 1:]
    assert after[0] == 2


def _ship_while_down_then_up(metrics, caplog, batches, **kw):
    port = free_port()

    async def main():
        shipper = make_shipper(port, metrics, **kw).start()
        for batch in batches:                          # collector down
            await shipper.send(batch)
        await until(lambda: sample(metrics, "fabricscope_agent_collector_connected") == 0
                    and any("unreachable" in r.message for r in caplog.records),
                    "the unreachable warning")
        fake = FakeCollector()
        server, _ = await start_server(fake, port)
        try:
            await until(lambda: len(shipper.spool) == 0, "the spool to drain")
            await shipper.send(recs(1, 50))
            await shipper.close()
        finally:
            await server.stop(None)
        return fake
    with caplog.at_level(logging.INFO, "fabricscope.agent.shipper"):
        return run(main())


def test_full_memory_queue_drops_oldest_and_ships_the_loss(caplog):
    metrics = AgentMetrics()
    # 50 records for 35 places (memory only); a batch keeps room for a loss record.
    fake = _ship_while_down_then_up(metrics, caplog, [recs(10, 10 * i) for i in range(5)],
                                    max_records=35)
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="queue_full") == 20
    assert [b.seq for b in fake.received] == [3, 4, 5, 6]
    # The batch admitted right after each drop carries the cumulative count.
    assert [b.dropped_before for b in fake.received] == [0, 10, 20, 20]
    assert fake.loss() == [(4, "queue_full", 10), (5, "queue_full", 20)]
    assert fake.values() == [list(range(20, 30)), list(range(30, 40)), list(range(40, 50)), [50]]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].message   # not one per retry
    assert "kept in memory (up to 35 records)" in warnings[0].message
    assert sum("connected" in r.message and r.levelno == logging.INFO
               for r in caplog.records) == 1


def test_full_disk_spool_drops_oldest_and_ships_the_loss(tmp_path, caplog):
    metrics = AgentMetrics()
    batches = [recs(10, 10 * i, pad="x" * 200) for i in range(5)]
    one = len(make_batch_bytes(batches[0]))
    fake = _ship_while_down_then_up(metrics, caplog, batches, spool_dir=tmp_path / "s",
                                    max_bytes=3 * one + 1200)
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="spool_full") == 20
    assert [b.seq for b in fake.received] == [3, 4, 5, 6]
    assert fake.loss() == [(4, "spool_full", 10), (5, "spool_full", 20)]
    assert [p.name for p in (tmp_path / "s").iterdir() if p.suffix == ".spool"] == []


def make_batch_bytes(records):
    from fabricscope.lineschema import canonical_line
    from fabricscope.wire import make_batch
    return make_batch(node="n", agent_id="agent-1", seq=1,
                      lines=[canonical_line(r) for r in records]).SerializeToString()


def test_spooled_batches_survive_a_restart_with_their_agent_id_and_seq(tmp_path):
    metrics = AgentMetrics()

    async def first_run():      # collector down: everything stays spooled
        shipper = make_shipper(free_port(), metrics, spool_dir=tmp_path, agent_id="boot-1",
                               flush_timeout_s=0.1).start()
        for i in range(3):
            await shipper.send(recs(2, 2 * i))
        await shipper.close()
    run(first_run())
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="shutdown") == 0
    assert len(list(tmp_path.glob("*.spool"))) == 3

    fake = FakeCollector()
    second = AgentMetrics()
    shipper = run(serve_and_ship(fake, second, [recs(1, 6)], spool_dir=tmp_path,
                                 agent_id="boot-2"))
    assert [(b.agent_id, b.seq) for b in fake.received] == [
        ("boot-1", 1), ("boot-1", 2), ("boot-1", 3), ("boot-2", 4)]
    assert fake.values() == [[0, 1], [2, 3], [4, 5], [6]]
    assert len(shipper.spool) == 0 and list(tmp_path.glob("*.spool")) == []


def test_a_spool_directory_serves_one_agent_at_a_time(tmp_path):
    first = BatchSpool(str(tmp_path), 1 << 20, 100)
    first.open()
    with pytest.raises(UserError, match="in use by another process"):
        BatchSpool(str(tmp_path), 1 << 20, 100).open()
    first.close()
    BatchSpool(str(tmp_path), 1 << 20, 100).open()


def test_corrupt_spool_entry_is_dropped_and_counted(tmp_path, caplog):
    async def first_run():
        shipper = make_shipper(free_port(), AgentMetrics(), spool_dir=tmp_path,
                               flush_timeout_s=0.1).start()
        await shipper.send(recs(3))
        await shipper.send(recs(2, 3))
        await shipper.close()
    run(first_run())
    victim = sorted(tmp_path.glob("*.spool"))[0]
    victim.write_bytes(victim.read_bytes()[:-5] + b"xxxxx")
    metrics, fake = AgentMetrics(), FakeCollector()
    with caplog.at_level(logging.WARNING, "fabricscope.agent.shipper"):
        run(serve_and_ship(fake, metrics, [], spool_dir=tmp_path, max_records=0))
    assert fake.values() == [[3, 4]]
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="spool_corrupt") == 3
    assert any("dropping unreadable batch 1 (3 records)" in r.message for r in caplog.records)


def test_big_batches_are_split_and_a_record_too_big_alone_is_dropped():
    metrics, fake = AgentMetrics(), FakeCollector()
    records = recs(8, pad="p" * 300) + [Record("m", 99, {"node": "n", "pad": "P" * 5000},
                                               {"v": 99}), Record("m", 98, {"node": "a\\b"},
                                                                  {"v": 98})]
    run(serve_and_ship(fake, metrics, [records, recs(1, 50)], batch_max_bytes=2048))
    assert sorted(v for batch in fake.values() for v in batch) == list(range(8)) + [50]
    assert len(fake.received) > 1 and all(b.ByteSize() <= 2048 for b in fake.received)
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="oversized") == 1
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="unencodable") == 1
    assert sorted(fake.loss()) == [(fake.received[0].seq, "unencodable", 1),   # noticed first
                                   (fake.received[-1].seq, "oversized", 1)]   # with the next


def test_shutdown_with_collector_down_counts_what_is_left_in_memory():
    metrics = AgentMetrics()

    async def main():
        shipper = make_shipper(free_port(), metrics, flush_timeout_s=0.2).start()
        await shipper.send(recs(7))
        await shipper.close()
    run(main())
    assert sample(metrics, "fabricscope_agent_records_dropped_total", reason="shutdown") == 7


class CountingProxy:
    """A TCP relay that counts the bytes clients send: what really crosses the wire."""

    def __init__(self, target_port: int):
        self.target_port, self.upstream_bytes = target_port, 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _client(self, reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(src, dst, count):
            try:
                while data := await src.read(65536):
                    if count:
                        self.upstream_bytes += len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                dst.close()
        try:
            await asyncio.gather(pipe(reader, up_writer, True), pipe(up_reader, writer, False))
        except asyncio.CancelledError:
            # the loop's end cancels a relay still open; a cancelled client task makes
            # asyncio's stream callback log an error, a returned one does not
            pass

    async def stop(self):
        self.server.close()


@pytest.mark.parametrize("compression", [True, False])
def test_batches_are_gzipped_on_the_wire(compression):
    records = recs(200, pad="the same text again and again " * 4)
    raw = sum(len(make_batch_bytes(records[i:i + 50])) for i in range(0, 200, 50))

    async def main():
        fake = FakeCollector()
        server, port = await start_server(fake)
        proxy = CountingProxy(port)
        proxy_port = await proxy.start()
        try:
            shipper = make_shipper(proxy_port, AgentMetrics(), compression=compression).start()
            for i in range(0, 200, 50):
                await shipper.send(records[i:i + 50])
            await shipper.close()
        finally:
            await proxy.stop()
            await server.stop(None)
        return fake, proxy.upstream_bytes
    fake, wire = run(main())
    assert sorted(v for batch in fake.values() for v in batch) == list(range(200))
    if compression:
        assert wire < raw / 5
    else:
        assert wire > raw


def test_token_travels_as_bearer_metadata():
    fake = FakeCollector()
    run(serve_and_ship(fake, AgentMetrics(), [recs(1)], token="s3cret-token-0123456789"))
    assert fake.metadata[0]["authorization"] == "Bearer s3cret-token-0123456789"


def test_durable_listeners_hear_of_admitted_records(tmp_path):
    heard: list = []

    async def main():
        shipper = make_shipper(free_port(), AgentMetrics(), spool_dir=tmp_path,
                               flush_timeout_s=0.1)
        shipper.on_durable.append(lambda records: heard.append(
            (len(list(tmp_path.glob("*.spool"))), [r.fields["v"] for r in records])))
        shipper.start()
        await shipper.send(recs(2))
        await shipper.close()
    run(main())
    assert heard == [(1, [0, 1])]       # called once the batch was on disk


def test_backoff_grows_caps_and_resets():
    b = Backoff(initial_s=1, max_s=5, factor=2, jitter=0.5, rng=lambda: 1.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 2.5, 2.5]
    b.reset()
    assert b.next() == 0.5


@pytest.mark.parametrize("bad", ["nohost", "host:port"])
def test_collector_address_without_port_is_a_user_error(bad):
    from fabricscope.agent.config import AgentConfig
    with pytest.raises(UserError, match="has no port"):
        AgentConfig(collector=bad).check()
