"""Training steps inferred from one process's NCCL calls (no markers needed): nccl_step.

A call is a token (op, communicator, message size); a step is a period of the token
sequence, found as agent/probes/callseq.py says.

Why not gloo's partition by bytes (agent/probes/gloo/steps.py): it cuts runs of
AllReduce windows into groups of the gradient bytes G, merging the windows that
overlap into bursts; NCCL calls have enqueue times only (no windows to merge), and an
FSDP step has no AllReduce and no single G.

Once found, every call is checked against the step's sequence; a call that breaks it
(the model or the bucket layout changed) drops the pattern (counted `resyncs`) and the
search runs again.

Times are enqueue times: a step lasts from its first call to the next step's first
call, the host's pace. In steady state that is the GPU's too, since the host waits for
the GPU once a step (the loss, the optimizer); without such a wait the host runs ahead
by at most the CUDA stream's queue. Calls with variable sizes (MoE AlltoAll with
dynamic routing) repeat no sequence, and yield no steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricscope.agent.probes.callseq import MAX_HISTORY, find_pattern
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.agent.probes.ncclprof.records import job_tags
from fabricscope.records import Record


@dataclass(frozen=True)
class Call:
    ts_ns: int           # enqueue time, UNIX epoch ns
    op: str
    comm: str
    bytes: int

    @property
    def token(self) -> tuple[str, str, int]:
        return (self.op, self.comm, self.bytes)


@dataclass(frozen=True)
class NcclStep:
    index: int
    start_ns: int
    seconds: float           # to the next step's first call
    collectives: int
    bytes: int
    calls_seconds: float     # first to last call of the step


class CallSteps:
    """One process's calls in, NcclSteps out (each once the next step's first call came)."""

    def __init__(self) -> None:
        self.calls: list[Call] = []      # not yet in an emitted step
        self.template: list[tuple] | None = None   # the step's tokens once known
        self.next_index = 0
        self.resyncs = 0
        self.dropped = 0                 # calls before the first step or after a break

    def feed(self, calls: list[Call]) -> list[NcclStep]:
        self.calls += calls
        if self.template is None and not self._search():
            return []
        return self._cut_steps()

    def _search(self) -> bool:
        if len(self.calls) > MAX_HISTORY:
            self.dropped += len(self.calls) - MAX_HISTORY
            self.calls = self.calls[-MAX_HISTORY:]
        found = find_pattern(self.calls, fresh=not self.resyncs)
        if found is None:
            return False
        self.dropped += found.anchor
        self.calls = self.calls[found.anchor:]
        self.template = [c.token for c in self.calls[:found.period]]
        return True

    def _cut_steps(self) -> list[NcclStep]:
        q = len(self.template)
        broken = next((i for i, c in enumerate(self.calls)
                       if c.token != self.template[i % q]), None)
        if broken is None:      # every step held but the last has its next step's call
            return self._emit(max(0, len(self.calls) - 1) // q)
        steps = self._emit(broken // q)     # the steps before the one that broke
        self.resyncs += 1
        self.template = None
        return steps + (self._cut_steps() if self._search() else [])

    def _emit(self, complete: int) -> list[NcclStep]:
        """Emit the first `complete` steps held (each followed by a call of the next)."""
        q, out = len(self.template or ()) or 1, []
        for k in range(complete):
            step, nxt = self.calls[k * q:(k + 1) * q], self.calls[(k + 1) * q]
            out.append(NcclStep(self.next_index, step[0].ts_ns,
                                (nxt.ts_ns - step[0].ts_ns) / 1e9, len(step),
                                sum(c.bytes for c in step),
                                (step[-1].ts_ns - step[0].ts_ns) / 1e9))
            self.next_index += 1
        self.calls = self.calls[complete * q:]
        return out


_GROUP_OPS = frozenset({"GroupStart", "GroupEnd"})


def call_of(record: Record) -> tuple[int, Call] | None:
    """(pid, Call) of a successful collective or p2p nccl_call record, else None."""
    if record.measurement != "nccl_call" or record.tags.get("op") in _GROUP_OPS \
            or record.fields.get("ret", 0) != 0:
        return None
    f = record.fields
    size = f.get("size_bytes", f.get("bytes", 0))
    return int(record.tags["pid"]), Call(record.time_ns, record.tags["op"],
                                         record.tags.get("comm", ""), size)


class StepRecords:
    """The nccl probe's records of a poll in, nccl_step records out: one CallSteps per
    process of this node (network namespace), tagged with its job and rank as gloo_step."""

    def __init__(self, procs: ProcessTable):
        self._procs = procs
        self._trackers: dict[int, CallSteps] = {}
        self._tags: dict[int, dict[str, str]] = {}
        self._done = {"step_resyncs": 0, "step_calls_dropped": 0}
        self.counters = {"step_calls_foreign": 0, "steps_unterminated": 0}

    def feed(self, records: list[Record]) -> list[Record]:
        by_pid: dict[int, list[Call]] = {}
        for r in records:
            found = call_of(r)
            if found is not None:
                by_pid.setdefault(found[0], []).append(found[1])
        out = []
        for pid, calls in by_pid.items():
            tracker = self._tracker(pid)
            if tracker is None:
                self.counters["step_calls_foreign"] += len(calls)
                continue
            out += [self._record(pid, s) for s in tracker.feed(calls)]
        self._sweep()
        return out

    def _tracker(self, pid: int) -> CallSteps | None:
        if pid in self._trackers:
            return self._trackers[pid]
        info = self._procs.get(pid)
        if info is None or not info.local:
            return None     # another node's process (or gone before we looked)
        self._tags[pid] = job_tags(info, pid)
        tracker = self._trackers[pid] = CallSteps()
        return tracker

    def _record(self, pid: int, s: NcclStep) -> Record:
        return Record("nccl_step", s.start_ns, dict(self._tags[pid]),
                      {"step": s.index, "seconds": s.seconds, "collectives": s.collectives,
                       "bytes": s.bytes, "calls_seconds": s.calls_seconds, "pid": pid})

    def _sweep(self) -> None:
        """Forget exited processes; a last step never closed by a next one is counted."""
        for pid in [p for p in self._trackers if not self._procs.alive(p)]:
            tracker = self._trackers.pop(pid)
            self._tags.pop(pid, None)
            self._procs.forget(pid)
            self.counters["steps_unterminated"] += bool(tracker.template and tracker.calls)
            self._done["step_resyncs"] += tracker.resyncs
            self._done["step_calls_dropped"] += tracker.dropped

    def stats(self) -> dict[str, int]:
        live = self._trackers.values()
        return {**self.counters,
                "step_resyncs": self._done["step_resyncs"] + sum(t.resyncs for t in live),
                "step_calls_dropped": self._done["step_calls_dropped"]
                + sum(t.dropped for t in live)}
