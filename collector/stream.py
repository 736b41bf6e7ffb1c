"""One agent stream: each Batch in, validated, delivered, answered by one Ack, in order.

Ack semantics (what the agent may rely on):
- OK: every valid record of the batch is durable: in the sink, or fsynced to the
  collector's spool and replayed from there (collector/delivery.py).
  At-least-once: the ack is sent only after that.
- RETRY (+ retry_after_ms): nothing was stored; the sink is failing and there is
  no room in the spool (or no spool). The agent sends nothing for retry_after_ms
  and then resends the same batch: this is the slow-down signal. Nothing is
  counted as written or refused.
- REJECTED: do not resend. Either the whole batch was refused (wrong
  schema_version, no node, seq 0, message over max_message_bytes: nothing
  written), or some records were invalid: the valid ones ARE written, each
  invalid one is counted in records_rejected_total{reason}, and the reason says
  "<k> of <n> records refused (<n-k> written); first: <problem>". Resending
  would only refuse the same records again, and one bad record never holds
  back the valid ones.
Every Ack carries `code`, the gRPC status code that names the outcome: OK;
FAILED_PRECONDITION (schema version); INVALID_ARGUMENT (malformed batch or
records, refused by InfluxDB); OUT_OF_RANGE (first refused record's timestamp
outside the window); RESOURCE_EXHAUSTED (oversized message; spool full);
UNAVAILABLE (sink down, no spool).

Duplicates: the stream remembers the highest acknowledged seq per agent_id. A
batch at or below it (the agent resent after a lost ack or a reconnect) is
counted in batches_duplicate_total and written again: InfluxDB stores one point
per series and timestamp, so rewriting identical points changes nothing. That is
what keeps replicas stateless: any replica may receive any resend.

batch.dropped_before > 0 (records the agent lost, cumulative) is exported as
agent_dropped_records{node} and written as an `agent_loss` point with
reason=dropped_before, timestamped with the batch's latest record (so a resend
rewrites the same point) or the collector's clock for an empty batch; only when
the count changed since the last batch on this stream.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from fabricscope.collector.validate import Checked, Limits, check_batch
from fabricscope import lineproto
from fabricscope.records import Record
from fabricscope.wire import pb

log = logging.getLogger("collector")

OK, REJECTED, RETRY = pb.Ack.OK, pb.Ack.REJECTED, pb.Ack.RETRY
STATUS_NAMES = {OK: "ok", REJECTED: "rejected", RETRY: "retry"}
_CODES = {"schema_version": grpc.StatusCode.FAILED_PRECONDITION,
          "oversized": grpc.StatusCode.RESOURCE_EXHAUSTED,
          "time_future": grpc.StatusCode.OUT_OF_RANGE,
          "time_past": grpc.StatusCode.OUT_OF_RANGE}


def code_number(code: grpc.StatusCode) -> int:
    return code.value[0]


@dataclass(frozen=True)
class Oversized:
    """A decodable message over max_message_bytes: refused, but the stream goes on."""

    batch: object           # pb.Batch, for seq, node and the record count
    size: int
    limit: int


class StreamSession:
    def __init__(self, delivery, metrics, limits: Limits):
        self.delivery = delivery
        self.m = metrics
        self.limits = limits
        self.acked: dict[str, int] = {}          # agent_id -> highest seq acked here
        self.loss_written: dict[str, int] = {}   # agent_id -> dropped_before last written

    async def handle(self, item) -> pb.Ack:
        batch = item.batch if isinstance(item, Oversized) else item
        size = len(batch.records) + len(batch.lines)
        self.m.batches_received.inc()
        self.m.records_received.inc(size)
        if isinstance(item, Oversized):
            checked = Checked()
            checked.refuse("oversized", f"message of {item.size} bytes exceeds the collector's "
                           f"max_message_bytes {item.limit}; fix: send smaller batches (agent "
                           "batch_max_bytes)", max(1, size))
            return self._ack(batch, REJECTED, checked.first_problem, checked)
        checked = check_batch(batch, time.time_ns(), self.limits)
        if checked.batch_error:
            return self._ack(batch, REJECTED, checked.batch_error, checked)
        now = time.time()
        self.m.agent_last_seen.labels(batch.node).set(now)
        self.m.agent_dropped.labels(batch.node).set(batch.dropped_before)
        if checked.max_time_ns:
            self.m.agent_lag.labels(batch.node).set(max(0.0, now - checked.max_time_ns / 1e9))
        if batch.seq <= self.acked.get(batch.agent_id, 0):
            self.m.batches_duplicate.inc()
        lines = checked.lines
        loss = self._loss_line(batch, checked)
        if loss:
            lines = lines + [loss]
        outcome = await self.delivery.deliver(lines)
        if outcome.retry_after_s:
            return self._ack(batch, RETRY, outcome.problem, None, outcome.code,
                             outcome.retry_after_s)
        if outcome.rejected:
            checked.refuse("sink_rejected", outcome.problem, outcome.rejected)
        self.m.records_written.inc(outcome.written)
        if loss and not outcome.rejected:
            self.loss_written[batch.agent_id] = batch.dropped_before
        if checked.rejected:
            bad = min(checked.rejected_count, size)
            return self._ack(batch, REJECTED, f"{bad} of {size} records refused "
                             f"({size - bad} written); first: {checked.first_problem}", checked)
        self.m.records_acked.inc(size)
        return self._ack(batch, OK, "", checked)

    def _loss_line(self, batch, checked: Checked) -> str:
        if batch.dropped_before == 0 \
                or self.loss_written.get(batch.agent_id) == batch.dropped_before:
            return ""
        record = Record("agent_loss", checked.max_time_ns or time.time_ns(),
                        {"node": batch.node, "agent_id": batch.agent_id or "-",
                         "reason": "dropped_before"},
                        {"records": int(batch.dropped_before)})
        try:
            return lineproto.encode(record)
        except lineproto.LineProtocolError as exc:   # a node name line protocol cannot carry
            checked.refuse("unencodable", f"agent_loss: {exc}")
            return ""

    def _ack(self, batch, status, reason: str, checked: Checked | None,
             code: grpc.StatusCode | None = None, retry_after_s: float = 0.0) -> pb.Ack:
        self.m.batches_acked.labels(STATUS_NAMES[status]).inc()
        if checked is not None:
            for why, count in checked.rejected.items():
                self.m.records_rejected.labels(why).inc(count)
            if code is None and status == REJECTED:
                code = _CODES.get(checked.first_reason, grpc.StatusCode.INVALID_ARGUMENT)
        if status != RETRY and batch.seq > self.acked.get(batch.agent_id, 0):
            self.acked[batch.agent_id] = batch.seq
        return pb.Ack(seq=batch.seq, status=status, reason=reason,
                      retry_after_ms=int(retry_after_s * 1000),
                      code=code_number(code or grpc.StatusCode.OK))
