"""One agent stream: each Batch in, validated, written, answered by one Ack, in order.

Ack semantics (what the agent may rely on):
- OK: every record of the batch is in the sink (at-least-once: the ack is sent
  only after the sink accepted the write).
- RETRY: the sink failed temporarily; nothing is counted as written or refused;
  the agent resends the same batch later.
- REJECTED: do not resend. Either the whole batch was refused (wrong
  schema_version, no node, seq 0: nothing written), or some records were
  invalid: the valid ones ARE written, each invalid one is counted in
  records_rejected_total{reason}, and the reason says
  "<k> of <n> records refused (<n-k> written); first: <problem>". Resending
  would only refuse the same records again, and one bad record never holds
  back the valid ones.

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

from collector.sinks.base import SinkError, SinkRejected
from collector.validate import Checked, Limits, check_batch
from fabricscope import lineproto
from fabricscope.records import Record
from fabricscope.wire import pb

log = logging.getLogger("collector")

OK, REJECTED, RETRY = pb.Ack.OK, pb.Ack.REJECTED, pb.Ack.RETRY
STATUS_NAMES = {OK: "ok", REJECTED: "rejected", RETRY: "retry"}


class StreamSession:
    def __init__(self, sink, metrics, readiness, limits: Limits):
        self.sink = sink
        self.m = metrics
        self.readiness = readiness
        self.limits = limits
        self.acked: dict[str, int] = {}          # agent_id -> highest seq acked here
        self.loss_written: dict[str, int] = {}   # agent_id -> dropped_before last written

    async def handle(self, batch) -> pb.Ack:
        self.m.batches_received.inc()
        self.m.records_received.inc(len(batch.records))
        checked = check_batch(batch, time.time_ns(), self.limits)
        if checked.batch_error:
            return self._ack(batch, REJECTED, checked.batch_error, checked)
        self.m.agent_last_seen.labels(batch.node).set(time.time())
        self.m.agent_dropped.labels(batch.node).set(batch.dropped_before)
        if batch.seq <= self.acked.get(batch.agent_id, 0):
            self.m.batches_duplicate.inc()
        lines = checked.lines
        loss = self._loss_line(batch, checked)
        if loss:
            lines = lines + [loss]
        written, sink_problem = await self._write(lines)
        if written is None:
            return self._ack(batch, RETRY, sink_problem, None)
        if sink_problem:
            checked.rejected["sink_rejected"] += len(lines) - written
            checked.first_problem = checked.first_problem or sink_problem
        self.m.records_written.inc(written)
        if loss and written == len(lines):
            self.loss_written[batch.agent_id] = batch.dropped_before
        if checked.rejected:
            total = len(batch.records)
            bad = min(checked.rejected_count, total)
            return self._ack(batch, REJECTED, f"{bad} of {total} records refused "
                             f"({total - bad} written); first: {checked.first_problem}", checked)
        return self._ack(batch, OK, "", checked)

    async def _write(self, lines: list[str]) -> tuple[int | None, str]:
        """(lines written, problem); written None: temporary failure, answer RETRY."""
        if not lines:
            return 0, ""
        started = time.perf_counter()
        try:
            await self.sink.write_lines(lines)
        except SinkError as exc:
            self.m.sink_errors.labels("temporary").inc()
            if self.readiness.ready:   # log the transition, not every failed batch
                log.warning("sink failing, answering RETRY: %s", exc)
            self.readiness.mark_not_ready(f"sink failing: {exc}")
            return None, f"sink unavailable: {exc}"
        except SinkRejected as exc:
            self.m.sink_errors.labels("rejected").inc()
            log.warning("sink refused %d records: %s", exc.records, exc)
            return max(0, len(lines) - exc.records), str(exc)
        finally:
            self.m.sink_write_seconds.observe(time.perf_counter() - started)
        if not self.readiness.ready:
            log.info("sink writes succeed again")
            self.readiness.mark_ready()
        return len(lines), ""

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
            checked.rejected["unencodable"] += 1
            checked.first_problem = checked.first_problem or f"agent_loss: {exc}"
            return ""

    def _ack(self, batch, status, reason: str, checked: Checked | None) -> pb.Ack:
        self.m.batches_acked.labels(STATUS_NAMES[status]).inc()
        if checked is not None:
            for why, count in checked.rejected.items():
                self.m.records_rejected.labels(why).inc(count)
        if status != RETRY and batch.seq > self.acked.get(batch.agent_id, 0):
            self.acked[batch.agent_id] = batch.seq
        return pb.Ack(seq=batch.seq, status=status, reason=reason)
