"""Joins across probes: collectives with the TCP traffic of the same process.

A stage between the poll and the batcher (agent/pipeline.py). Each probe knows one
side: the gloo probe when a process ran its collectives (gloo_collective,
gloo_step), the tcp probes what the process's sockets did (tcp_retransmit with the
owner's pid, tcp_transfer: runs of bytes without a gap). Put together:

1. Retransmits during a collective: each gloo_collective and gloo_step gets
   `retrans_segs` and `retransmits`, from the tcp_retransmit records of the same pid
   stamped inside its window (only when a tcp probe runs; otherwise the fields are
   absent, not zero).
2. Phases outside the collectives: a flow of a training process that carried a
   transfer overlapping one of that process's collective windows is a ring flow
   (gloo's pair connections), and all its transfers are the collectives' traffic:
   folded (counted, not written; the collective records carry their bytes), also the
   small ones a peer sends before this rank enters the collective. Transfers to the
   job's rendezvous store (MASTER_ADDR:MASTER_PORT) are control traffic, folded too.
   Any other transfer is written, and when its owner is a training process (a job
   and rank in its environment) it is also a phase of that job's step: `data_load`
   when it mostly received, `checkpoint` when it mostly sent. This needs no list of
   rank peers: a rank moves gradient bytes only on the flows of its collectives.

Records that join wait HOLD_S in the stage (their partners may be drained in a
later poll: a transfer is reported when the flow's next one starts, and the tcp
probes hold a record up to a /proc rescan for its owner); everything else passes
straight through. Windows, steps and retransmits are remembered for HORIZON_S per
process.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from dataclasses import dataclass, field

from fabricscope.records import Record

HOLD_S = 2.0          # seconds a joined record waits for its partners
HORIZON_S = 60.0      # seconds of windows, steps and retransmits kept per process
_HELD = frozenset({"gloo_collective", "gloo_step", "tcp_transfer"})


@dataclass
class _Process:
    """What the join remembers of one pid (times in wall ns)."""
    windows: list[tuple[int, int]] = field(default_factory=list)     # (start, end), sorted
    retrans: list[tuple[int, int]] = field(default_factory=list)     # (time, segs), sorted
    ring_flows: set[tuple[str, str, str, str]] = field(default_factory=set)
    job: tuple[str, str] | None = None                               # (job, rank)

    def trim(self, before_ns: int) -> None:
        self.windows = [w for w in self.windows if w[1] >= before_ns]
        self.retrans = [r for r in self.retrans if r[0] >= before_ns]

    def in_window(self, start_ns: int, end_ns: int) -> bool:
        """Does [start_ns, end_ns] overlap a window? (A process's collectives run one at
        a time per thread, so looking back a few windows from the last that starts
        before end_ns is enough.)"""
        i = bisect.bisect_right(self.windows, (end_ns, 1 << 62))
        return any(e >= start_ns for _, e in self.windows[max(0, i - 8):i])

    def retransmits(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """(events, segments) stamped in [start_ns, end_ns]."""
        lo = bisect.bisect_left(self.retrans, (start_ns, -1))
        hi = bisect.bisect_right(self.retrans, (end_ns, 1 << 62))
        inside = self.retrans[lo:hi]
        return len(inside), sum(s for _, s in inside)


class TrainingJoin:
    def __init__(self, retransmits_known: bool, hold_s: float = HOLD_S,
                 horizon_s: float = HORIZON_S):
        """retransmits_known: a tcp probe runs, so a window without retransmit records
        really had none."""
        self.retransmits_known = retransmits_known
        self.hold_s, self.horizon_ns = hold_s, int(horizon_s * 1e9)
        self._held: deque[tuple[float, Record]] = deque()
        self._procs: dict[str, _Process] = defaultdict(_Process)
        self._pid_of: dict[tuple[str, str], str] = {}                  # (job, rank) -> pid
        self._steps: dict[tuple[str, str], list[tuple[int, int, int]]] = defaultdict(list)
        self._newest_ns = 0
        self._trimmed_s = 0.0
        self.counters = {"transfers_folded": 0, "transfers_control": 0, "transfers_written": 0,
                         "phases_inferred": 0,
                         "collectives_joined": 0, "steps_joined": 0}

    # --- the stage ----------------------------------------------------------------------

    def feed(self, records: list[Record], now_s: float) -> list[Record]:
        """Take a poll's records; return those ready to go on (others are held)."""
        out = []
        for r in records:
            self._newest_ns = max(self._newest_ns, r.time_ns)
            if r.measurement == "tcp_retransmit" and "pid" in r.tags:
                bisect.insort(self._procs[r.tags["pid"]].retrans,
                              (r.time_ns, int(r.fields.get("segs", 1))))
            elif r.measurement == "gloo_collective":
                self._learn_collective(r)
            elif r.measurement == "gloo_step":
                self._learn_step(r)
            elif r.measurement == "tcp_transfer":
                self._learn_ring(r)
            if r.measurement in _HELD:
                self._held.append((now_s, r))
            else:
                out.append(r)
        while self._held and now_s - self._held[0][0] >= self.hold_s:
            out += self._release(self._held.popleft()[1])
        if now_s - self._trimmed_s >= 1.0:
            self._trimmed_s = now_s
            self._trim()
        return out

    def flush(self) -> list[Record]:
        """At shutdown: release everything held, joined with what is known."""
        out = []
        while self._held:
            out += self._release(self._held.popleft()[1])
        return out

    def stats(self) -> dict[str, int]:
        return dict(self.counters)

    # --- learning -----------------------------------------------------------------------

    def _learn_collective(self, r: Record) -> None:
        pid = str(r.fields.get("pid", ""))
        if not pid:
            return
        proc = self._procs[pid]
        bisect.insort(proc.windows, (r.time_ns, r.time_ns + int(r.fields["seconds"] * 1e9)))
        proc.job = (r.tags.get("job", ""), r.tags.get("rank", "-"))
        self._pid_of[proc.job] = pid

    def _learn_step(self, r: Record) -> None:
        seconds = r.fields.get("seconds")
        end = r.time_ns + int(seconds * 1e9) if seconds is not None else None
        key = (r.tags.get("job", ""), r.tags.get("rank", "-"))
        self._steps[key].append((r.time_ns, end if end is not None else -1,
                                 int(r.fields["step"])))

    def _learn_ring(self, r: Record) -> bool:
        """Mark r's flow a ring flow when r overlaps a collective of its process."""
        proc = self._procs.get(r.tags.get("pid", ""))
        if proc is None:
            return False
        key = _flow(r)
        if key not in proc.ring_flows and proc.in_window(
                r.time_ns, r.time_ns + int(r.fields["seconds"] * 1e9)):
            proc.ring_flows.add(key)
        return key in proc.ring_flows

    def _trim(self) -> None:
        before = self._newest_ns - self.horizon_ns
        for proc in self._procs.values():
            proc.trim(before)
        for pid in [p for p, proc in self._procs.items()
                    if not proc.windows and not proc.retrans and not proc.ring_flows]:
            del self._procs[pid]
        for key in list(self._steps):
            self._steps[key] = [s for s in self._steps[key] if s[1] < 0 or s[1] >= before]
            if not self._steps[key]:
                del self._steps[key]

    # --- joining ------------------------------------------------------------------------

    def _release(self, r: Record) -> list[Record]:
        if r.measurement == "tcp_transfer":
            return self._transfer(r)
        pid = str(r.fields.get("pid", "")) if r.measurement == "gloo_collective" else \
            self._pid_of.get((r.tags.get("job", ""), r.tags.get("rank", "-")), "")
        seconds = r.fields.get("seconds")
        if self.retransmits_known and pid and seconds is not None:
            events, segs = self._procs[pid].retransmits(r.time_ns,
                                                        r.time_ns + int(seconds * 1e9))
            r.fields["retransmits"], r.fields["retrans_segs"] = events, segs
            self.counters["collectives_joined" if r.measurement == "gloo_collective"
                          else "steps_joined"] += 1
        return [r]

    def _transfer(self, r: Record) -> list[Record]:
        if self._learn_ring(r):     # windows that arrived since it was fed count too
            self.counters["transfers_folded"] += 1
            return []
        if "job" in r.tags and r.tags["job"] == f"{r.tags['daddr']}:{r.tags['dport']}":
            self.counters["transfers_control"] += 1     # the rendezvous store
            return []
        self.counters["transfers_written"] += 1
        out = [r]
        if "job" in r.tags and "rank" in r.tags and "pid" in r.tags:
            end = r.time_ns + int(r.fields["seconds"] * 1e9)
            out.append(self._phase(r, r.time_ns, end))
            self.counters["phases_inferred"] += 1
        return out

    def _phase(self, r: Record, start: int, end: int) -> Record:
        key = (r.tags["job"], r.tags["rank"])
        bytes_in, bytes_out = int(r.fields["bytes_in"]), int(r.fields["bytes_out"])
        tags = {"job": key[0], "rank": key[1],
                "phase": "data_load" if bytes_in >= bytes_out else "checkpoint"}
        if "node" in r.tags:
            tags["node"] = r.tags["node"]
        fields = {"seconds": (end - start) / 1e9, "bytes": bytes_in + bytes_out,
                  "bytes_in": bytes_in, "bytes_out": bytes_out, "collectives": 0,
                  "step": self._step_at(key, start),
                  "peer": f"{r.tags['daddr']}:{r.tags['dport']}", "pid": int(r.tags["pid"])}
        return Record("gloo_phase", start, tags, fields)

    def _step_at(self, key: tuple[str, str], t: int) -> int:
        """Index of the inferred step whose time span holds t: steps run from one first
        AllReduce to the next, so data loaded before step n's forward falls in n - 1.
        After the last step written, the one in progress; -1 before the first."""
        steps = self._steps.get(key, [])
        best = -1
        for start, end, index in steps:
            if start <= t and (end < 0 or t < end):
                return index
            if start <= t:
                best = max(best, index + 1 if end >= 0 and t >= end else index)
        return best


def _flow(r: Record) -> tuple[str, str, str, str]:
    t = r.tags
    return (t["saddr"], t["sport"], t["daddr"], t["dport"])
