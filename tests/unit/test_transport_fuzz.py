"""Fuzzing the collector's endpoint: malformed and hostile messages, while a well-behaved
agent streams alongside. The collector must answer each with an Ack or a precise status
(never UNKNOWN or INTERNAL: an unhandled exception), and the other stream must not notice.
"""

from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabricscope.collector.config import CollectorConfig
from fabricscope.collector.server import CollectorThread
from fabricscope.lineschema import canonical_line
from fabricscope.records import Record
from fabricscope.services import InfluxServer
from fabricscope.wire import make_batch, pb, pb_grpc
from tests.unit.transport_procs import synthetic_counts, wait_for

MAX_BYTES = 64 * 1024
T0 = time.time_ns() - 60 * 10**9
ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}


@pytest.fixture(scope="module")
def collector():
    with InfluxServer() as influx:
        cfg = CollectorConfig(listen="127.0.0.1:0", influx_url=influx.url, influx_db="fs",
                              metrics_host="127.0.0.1", metrics_port=0,
                              max_message_bytes=MAX_BYTES)
        with CollectorThread(cfg) as c:
            yield c, influx


class SteadyAgent:
    """A well-behaved agent on one long-lived stream: one valid batch every 20 ms."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self.outbox: queue.Queue = queue.Queue()
        self.acks: list = []
        self.sent = 0
        self._thread = threading.Thread(target=self._read, daemon=True)

    def _requests(self):
        while (batch := self.outbox.get()) is not None:
            yield batch

    def _read(self):
        for ack in pb_grpc.CollectorStub(self.channel).Stream(self._requests(), timeout=600):
            self.acks.append(ack)

    def start(self):
        self._thread.start()
        self._writer = threading.Thread(target=self._write, daemon=True)
        self._writer.start()
        return self

    def _write(self):
        while not getattr(self, "stopping", False):
            self.sent += 1
            line = canonical_line(Record("synthetic", T0 + self.sent,
                                         {"node": "steady", "stream": "0"},
                                         {"n": self.sent, "value": 1.0}))
            self.outbox.put(make_batch(node="steady", agent_id="steady", seq=self.sent,
                                       lines=[line]))
            time.sleep(0.02)

    def stop(self):
        self.stopping = True
        self._writer.join(60)
        self.outbox.put(None)
        self._thread.join(60)
        self.channel.close()


text = st.text(max_size=40)
field_values = st.one_of(st.builds(pb.FieldValue, f=st.floats()),
                         st.builds(pb.FieldValue, i=st.integers(-(1 << 63), (1 << 63) - 1)),
                         st.builds(pb.FieldValue, s=text), st.builds(pb.FieldValue, b=st.booleans()),
                         st.just(pb.FieldValue()))
pb_records = st.builds(
    pb.Record, measurement=st.one_of(st.sampled_from(["synthetic", "tcp_retransmit", "agent_loss"]),
                                     text),
    time_ns=st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(T0, T0 + 10**9)),
    tags=st.dictionaries(st.one_of(st.sampled_from(["node", "stream", "reason"]), text), text,
                         max_size=4),
    fields=st.dictionaries(st.one_of(st.sampled_from(["n", "value", "segs"]), text),
                           field_values, max_size=4))
good_line = st.integers(0, 10**6).map(
    lambda n: f"synthetic,node=fuzz,stream=0 n={n}i,value=0.5 {T0 + n}")
lines = st.one_of(text, good_line, good_line.map(lambda s: s.replace("0.5", '"x"')),
                  st.text(min_size=1000, max_size=3000))
batches = st.builds(
    pb.Batch, schema_version=st.one_of(st.just(1), st.integers(0, 2**32 - 1)),
    node=st.one_of(st.just("fuzz"), text), agent_id=text,
    seq=st.one_of(st.integers(1, 100), st.integers(0, 2**64 - 1)),
    records=st.lists(pb_records, max_size=5), dropped_before=st.integers(0, 2**64 - 1),
    lines=st.lists(lines, max_size=30))
oversized = st.integers(1, 50).map(lambda seq: make_batch(
    node="fuzz", agent_id="big", seq=seq,
    lines=[f"synthetic,node=fuzz,stream=0 n={n}i,value=0.5 {T0 + n}" for n in range(1200)]))
# Weighted towards decodable batches: garbage bytes mostly test protobuf's parser.
messages = st.one_of(batches.map(pb.Batch.SerializeToString),
                     batches.map(pb.Batch.SerializeToString),
                     batches.map(pb.Batch.SerializeToString),
                     oversized.map(pb.Batch.SerializeToString), st.binary(max_size=300),
                     st.binary(min_size=MAX_BYTES + 1, max_size=MAX_BYTES + 10))


def send_raw(address: str, payloads: list[bytes]):
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream("/fabricscope.v1.Collector/Stream",
                                     request_serializer=lambda raw: raw,
                                     response_deserializer=pb.Ack.FromString)
        try:
            return list(call(iter(payloads), timeout=60)), None
        except grpc.RpcError as exc:
            return [], exc


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(payloads=st.lists(messages, min_size=1, max_size=3))
def fuzz_once(address: str, payloads: list[bytes]):
    acks, error = send_raw(address, payloads)
    if error is not None:
        assert error.code() in ALLOWED, (error.code(), error.details())
    for ack in acks:
        assert ack.status in (pb.Ack.OK, pb.Ack.REJECTED, pb.Ack.RETRY)
        assert ack.status == pb.Ack.OK or ack.reason


def test_hostile_messages_never_break_the_collector_or_other_streams(collector):
    c, influx = collector
    steady = SteadyAgent(c.address).start()
    try:
        fuzz_once(c.address)
    finally:
        steady.stop()
    assert len(steady.acks) == steady.sent
    assert all(a.status == pb.Ack.OK for a in steady.acks)
    assert [a.seq for a in steady.acks] == list(range(1, steady.sent + 1))
    wait_for(lambda: synthetic_counts(influx).get("steady", (0, 0))[0] == steady.sent, 30,
             "the steady agent's points")
    # Still serving new streams after the fuzzing.
    acks, error = send_raw(c.address, [make_batch(
        node="after", agent_id="a", seq=1,
        lines=[f"synthetic,node=after,stream=0 n=1i,value=1.0 {T0}"]).SerializeToString()])
    assert error is None and [a.status for a in acks] == [pb.Ack.OK]
