"""Joins across probes: collectives with the TCP traffic of the same process.

A stage between the poll and the batcher (agent/pipeline.py). Each probe knows one
side: the gloo probe when a process ran its collectives (gloo_collective,
gloo_step), the tcp probes what the process's sockets did (tcp_retransmit with the
owner's pid, tcp_transfer: runs of bytes without a gap). Put together:

1. Retransmits during a collective: each gloo_collective and gloo_step gets
   `retrans_segs` and `retransmits`, from the tcp_retransmit records of the same pid
   stamped inside its window, and each step `sync_retrans_segs`, those inside its
   collectives (only when a tcp probe runs; otherwise the fields are absent, not
   zero). Collectives on two threads can overlap: sum steps, not collectives.
2. Phases outside the collectives. A flow of a training process is a ring flow
   (gloo's pair connections) when it moved most of its bytes in transfers lying
   inside that process's collective windows (at least half of a transfer's time
   inside them, from at least two such transfers). All transfers of a ring flow are
   the collectives' traffic and are folded (counted, not written), also the small
   ones around the windows: a peer's early send, the tail a rank's socket still
   sends after its collective returned (under loss, for an RTO). The vote is by
   bytes, not by one overlap: on a busy host a collective's thread can return late,
   after the main thread already started the next batch read on another flow.
   Transfers to the job's rendezvous store (MASTER_ADDR:MASTER_PORT) are control
   traffic, folded too. Any other transfer is written, and when its owner is a
   training process (a job and rank in its environment) it is also a phase of that
   job's step: `data_load` when it mostly received, `checkpoint` when it mostly
   sent. A small piece (under TAIL_BYTES) that began at most tail_s after the
   flow's previous transfer (its gap_s) continues that transfer's phase: the
   8-byte acknowledgment a store sends after a checkpoint, late because the store
   was descheduled, is part of the checkpoint, not a read. No list of rank peers is
   needed: a rank moves gradient bytes only on the flows of its collectives.
3. NCCL communicators created before the agent attached: their nccl_call records
   lack rank, nranks and comm_id; the NCCL_DEBUG log's `Init COMPLETE` line of the
   same pid and communicator handle (nccl_log_comm) has them.

Records that join wait in the stage for their partners until the next poll (a
retransmit inside a collective's window, or the collective windows around a
transfer, happened before the record was made, so the next poll has drained
them; the tcp probes hold a record until its owner is known); a training process's
transfer waits on, up to WINDOW_WAIT_S, until that process's collective windows
up to its end have arrived (counted as transfers_awaited). A transfer on a flow
already settled apart from the ring (SETTLED_BYTES outside the windows, which
outweigh those inside by more than its own, so no window can make it a ring
flow), with none of the flow's transfers still waiting before it, goes on with
its own poll (counted as transfers_settled): a slow read streams in pieces on
one persistent connection, and its pieces would otherwise wait for the step's
next collective to return, a step after they came. Everything else passes
straight through. Windows, steps and retransmits are remembered for HORIZON_S
per process.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from typing import Callable

from fabricscope.records import Record

HOLD_S = 0.0          # seconds a joined record waits at least (besides one poll)
WINDOW_WAIT_S = 10.0  # at most this long a training transfer waits for its windows
HORIZON_S = 60.0      # seconds of windows, steps and retransmits kept per process
TAIL_S = 0.02         # default tail_s: the agent passes config tcp_transfer_tail_us
TAIL_BYTES = 64 << 10     # a piece this small after a transfer continues its phase
MAX_FLOW_PHASES = 4096    # flows per process whose last phase is remembered (oldest go)
MAX_NCCL_COMMS = 65536    # communicators remembered from NCCL logs (oldest dropped)
#: bytes a flow must have moved outside the collective windows before its transfers
#: go on without waiting for the windows of their time (_settled_apart): far more
#: than a ring connection's setup exchange, so that a ring flow's first small
#: transfers, voted before their windows came, cannot settle it apart
SETTLED_BYTES = 1 << 20
_HELD = frozenset({"gloo_collective", "gloo_step", "tcp_transfer"})
_WINDOWED = frozenset({"gloo_collective", "gloo_step"})     # joined by their window alone


def _end_ns(r: Record) -> int:
    return r.time_ns + int(r.fields["seconds"] * 1e9)


def _training(r: Record) -> bool:
    """A record of a training process: its owner's pid, job and rank are known."""
    return "job" in r.tags and "rank" in r.tags and "pid" in r.tags


@dataclass
class _Process:
    """What the join remembers of one pid (times in wall ns)."""
    #: the union of its collective windows as disjoint (start, end), sorted: coverage is
    #: all the join asks of them, and disjoint windows answer it with two bisections
    #: (two gloo threads' collectives overlap; a long first barrier would otherwise make
    #: every query walk all the windows of its length)
    windows: list[tuple[int, int]] = field(default_factory=list)
    retrans: list[tuple[int, int]] = field(default_factory=list)     # (time, segs), sorted
    votes: dict[tuple[str, str, str, str], list[int]] = field(default_factory=dict)
    #   flow -> [bytes of transfers inside windows, bytes outside, transfers inside]
    phases: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    #   flow -> phase of its last written transfer
    newest_end_ns: int = 0                                           # latest window end

    def add_window(self, start_ns: int, end_ns: int) -> None:
        w = self.windows
        i = bisect.bisect_left(w, (start_ns, end_ns))
        if i > 0 and w[i - 1][1] >= start_ns:          # the one before reaches it: merge
            i -= 1
            start_ns, end_ns = w[i][0], max(end_ns, w[i][1])
        j = i
        while j < len(w) and w[j][0] <= end_ns:          # and those it reaches
            end_ns = max(end_ns, w[j][1])
            j += 1
        w[i:j] = [(start_ns, end_ns)]
        self.newest_end_ns = max(self.newest_end_ns, end_ns)

    def trim(self, before_ns: int) -> None:
        self.windows = [w for w in self.windows if w[1] >= before_ns]
        self.retrans = [r for r in self.retrans if r[0] >= before_ns]

    def in_window(self, start_ns: int, end_ns: int) -> bool:
        """Is at least half of [start_ns, end_ns] inside collective windows (for an
        instant: is it inside one)? A long transfer may span several collectives and
        the compute between them."""
        w = self.windows
        lo = max(0, bisect.bisect_right(w, (start_ns, 1 << 62)) - 1)
        hi = bisect.bisect_right(w, (end_ns, 1 << 62))
        covered = 0
        for s, e in w[lo:hi]:
            s, e = max(s, start_ns), min(e, end_ns)
            if e < s:
                continue
            if end_ns == start_ns:
                return True
            covered += e - s
        return end_ns > start_ns and 2 * covered >= end_ns - start_ns

    def retransmits_in_windows(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """(events, segments) stamped in [start_ns, end_ns] and inside a window."""
        lo = bisect.bisect_left(self.retrans, (start_ns, -1))
        hi = bisect.bisect_right(self.retrans, (end_ns, 1 << 62))
        events = segs = 0
        for t, n in self.retrans[lo:hi]:
            i = bisect.bisect_right(self.windows, (t, 1 << 62))
            if i and self.windows[i - 1][1] >= t:
                events, segs = events + 1, segs + n
        return events, segs

    def is_ring(self, key) -> bool:
        """Most bytes inside windows, from at least two transfers inside (one read
        that a late collective return overlapped does not make a ring flow)."""
        inside, outside, count = self.votes.get(key, (0, 0, 0))
        return inside > outside and count >= 2

    def retransmits(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """(events, segments) stamped in [start_ns, end_ns]."""
        lo = bisect.bisect_left(self.retrans, (start_ns, -1))
        hi = bisect.bisect_right(self.retrans, (end_ns, 1 << 62))
        inside = self.retrans[lo:hi]
        return len(inside), sum(s for _, s in inside)


class TrainingJoin:
    def __init__(self, retransmits_known: bool, hold_s: float = HOLD_S,
                 horizon_s: float = HORIZON_S, transfers_per_s: int = 200,
                 tail_s: float = TAIL_S, wall_ns: Callable[[], int] | None = None):
        """retransmits_known: a tcp probe runs, so a window without retransmit records
        really had none. transfers_per_s: written tcp_transfer records of processes that
        are not training ranks, at most, per second of the records' own time. tail_s: a
        small piece at most this long after its flow's previous transfer continues that
        transfer's phase (0: never). wall_ns: the probes' clock (UNIX ns, as they stamp
        records), read as each poll begins (begin_poll): a collective or step that
        ended before it goes on with that poll; None: every held record waits for the
        next poll."""
        self.retransmits_known = retransmits_known
        self.wall_ns = wall_ns
        self._poll_began_ns = 0
        self.tail_s = tail_s
        self.transfers_per_s = transfers_per_s
        self._budget_second, self._budget_used = -1, 0
        self.hold_s, self.horizon_ns = hold_s, int(horizon_s * 1e9)
        self._held: deque[tuple[float, int, Record]] = deque()   # (arrived, poll, record)
        self._polls = 0
        self._awaiting: list[tuple[float, Record]] = []   # transfers past hold_s, no windows yet
        self.window_wait_s = max(hold_s, WINDOW_WAIT_S)
        self._votes: dict[int, str] = {}     # id(held transfer) -> pid it voted "inside" for
        self._unvoted: dict[str, dict[int, Record]] = {}   # pid -> held transfers, no vote yet
        #: (pid, flow) -> its transfers held or awaiting windows
        self._waiting_on_flow: defaultdict[tuple, int] = defaultdict(int)
        self._procs: dict[str, _Process] = defaultdict(_Process)
        self._pid_of: dict[tuple[str, str], str] = {}                  # (job, rank) -> pid
        self._steps: dict[tuple[str, str], list[tuple[int, int, int]]] = defaultdict(list)
        self._newest_ns = 0
        self._trimmed_s = 0.0
        self._nccl_comms: OrderedDict[tuple[str, str], tuple[int, int, str | None]] = \
            OrderedDict()
        self.counters = {"nccl_calls_completed_from_logs": 0, "transfers_unlisted": 0,
                         "transfers_folded": 0, "transfers_control": 0, "transfers_written": 0,
                         "transfers_awaited": 0, "transfers_settled": 0,
                         "phases_inferred": 0,
                         "collectives_joined": 0, "steps_joined": 0}

    # --- the stage ----------------------------------------------------------------------

    def begin_poll(self) -> None:
        """A poll is about to drain the probes: what happened before now is in the
        kernel's buffers, and this poll hands it out."""
        if self.wall_ns is not None:
            self._poll_began_ns = self.wall_ns()

    def feed(self, records: list[Record], now_s: float) -> list[Record]:
        """Take a poll's records; return those ready to go on (others are held)."""
        self._polls += 1
        out = []
        windows_from: set[str] = set()       # pids with new collective windows
        fresh: list[Record] = []             # transfers of this poll
        for r in records:
            self._newest_ns = max(self._newest_ns, r.time_ns)
            if r.measurement == "tcp_retransmit" and "pid" in r.tags:
                bisect.insort(self._procs[r.tags["pid"]].retrans,
                              (r.time_ns, int(r.fields.get("segs", 1))))
            elif r.measurement == "gloo_collective":
                self._learn_collective(r)
                windows_from.add(str(r.fields.get("pid", "")))
            elif r.measurement == "gloo_step":
                self._learn_step(r)
            elif r.measurement == "nccl_log_comm":
                self._learn_nccl_comm(r)
            elif r.measurement == "nccl_call" and "rank" not in r.fields:
                self._complete_nccl_call(r)
            elif r.measurement == "tcp_transfer":
                if self._settled_apart(r):
                    self.counters["transfers_settled"] += 1
                    out += self._release(r)
                    continue
                self._unvoted.setdefault(r.tags.get("pid", ""), {})[id(r)] = r
                self._waiting_on_flow[_waiting_key(r)] += 1
                fresh.append(r)
            if r.measurement in _HELD:
                self._held.append((now_s, self._polls, r))
            else:
                out.append(r)
        # transfers wait for a vote "inside" until windows covering them arrive (a
        # collective's window comes at its return, its transfers are reported before)
        retry = [r for pid in windows_from for r in self._unvoted.get(pid, {}).values()]
        for r in {id(r): r for r in retry + fresh}.values():
            if self._vote(r):
                del self._unvoted[r.tags.get("pid", "")][id(r)]
        awaiting, self._awaiting = self._awaiting, []
        for arrived, r in awaiting:                 # arrived first: go first
            if self._awaits_windows(r, arrived, now_s):
                self._awaiting.append((arrived, r))
            else:
                out += self._release(r)
        keep: deque[tuple[float, int, Record]] = deque()
        for arrived, poll, r in self._held:
            if not self._ripe(r, arrived, poll, now_s):
                keep.append((arrived, poll, r))
            elif self._awaits_windows(r, arrived, now_s):
                self._awaiting.append((arrived, r))
                self.counters["transfers_awaited"] += 1
            else:
                out += self._release(r)
        self._held = keep
        if now_s - self._trimmed_s >= 1.0:
            self._trimmed_s = now_s
            self._trim()
        return out

    def _ripe(self, r: Record, arrived_s: float, poll: int, now_s: float) -> bool:
        """A record has had its partners once a later poll was fed (and hold_s, when
        set, has passed): a retransmit inside a collective's window, or a transfer's
        collective windows, happened before the record was made, so the next poll
        has drained them (the tcp probes tag a record with its owner before they hand
        it out); a transfer still missing its windows then waits for them. A
        collective or step that ended before its own poll began has its partners in
        that poll already: the retransmits inside its window were in the kernel's
        buffers when the poll started draining them. That saves the diagnosis a poll
        interval on every step (a step is reported once the next one's first
        collective returns, well after it ended)."""
        if now_s - arrived_s < self.hold_s:
            return False
        return poll < self._polls or (
            r.measurement in _WINDOWED and r.fields.get("seconds") is not None
            and _end_ns(r) < self._poll_began_ns)

    def flush(self) -> list[Record]:
        """At shutdown: release everything held, joined with what is known."""
        out = []
        for _, r in self._awaiting:
            out += self._release(r)
        self._awaiting = []
        while self._held:
            out += self._release(self._held.popleft()[2])
        return out

    def _settled_apart(self, r: Record) -> bool:
        """A training process's transfer whose flow no window can make a ring flow
        (its bytes outside the windows exceed those inside with this transfer's
        counted in), with no earlier transfer of the flow still held: its vote and
        its phase come out the same with the windows of its time as without, and
        its flow's order is kept (a checkpoint's tail piece takes the phase of the
        transfer before it)."""
        if not _training(r) or self._waiting_on_flow.get(_waiting_key(r)):
            return False
        proc = self._procs.get(r.tags["pid"])
        if proc is None:
            return False
        inside, outside, _ = proc.votes.get(_flow(r), (0, 0, 0))
        weight = max(1, int(r.fields["bytes_in"]) + int(r.fields["bytes_out"]))
        return outside >= SETTLED_BYTES and inside + weight <= outside

    def _awaits_windows(self, r: Record, arrived_s: float, now_s: float) -> bool:
        """A training process's transfer is judged (ring flow or phase) only once that
        process's collective windows up to the transfer's end have arrived: they come
        from another probe, which a loaded machine or a long poll interval can delay
        past hold_s. Bounded by WINDOW_WAIT_S (the job may have stopped its
        collectives: a last checkpoint)."""
        if r.measurement != "tcp_transfer" or now_s - arrived_s >= self.window_wait_s:
            return False
        if not _training(r):
            return False
        proc = self._procs.get(r.tags["pid"])
        return proc is None or proc.newest_end_ns < _end_ns(r)

    def stats(self) -> dict[str, int]:
        return dict(self.counters)

    # --- learning -----------------------------------------------------------------------

    def _learn_collective(self, r: Record) -> None:
        pid = str(r.fields.get("pid", ""))
        if not pid:
            return
        proc = self._procs[pid]
        proc.add_window(r.time_ns, r.time_ns + int(r.fields["seconds"] * 1e9))
        self._pid_of[(r.tags.get("job", ""), r.tags.get("rank", "-"))] = pid

    def _learn_nccl_comm(self, r: Record) -> None:
        if "rank" not in r.fields or "nranks" not in r.fields:
            return
        key = (r.tags.get("pid", ""), r.tags.get("comm", ""))
        self._nccl_comms[key] = (int(r.fields["rank"]), int(r.fields["nranks"]),
                                 r.tags.get("comm_id"))
        self._nccl_comms.move_to_end(key)
        while len(self._nccl_comms) > MAX_NCCL_COMMS:
            self._nccl_comms.popitem(last=False)

    def _complete_nccl_call(self, r: Record) -> None:
        known = self._nccl_comms.get((r.tags.get("pid", ""), r.tags.get("comm", "")))
        if known is None:
            return
        r.fields["rank"], r.fields["nranks"] = known[0], known[1]
        if known[2] and "comm_id" not in r.tags:
            r.tags["comm_id"] = known[2]
        self.counters["nccl_calls_completed_from_logs"] += 1

    def _learn_step(self, r: Record) -> None:
        seconds = r.fields.get("seconds")
        end = r.time_ns + int(seconds * 1e9) if seconds is not None else None
        key = (r.tags.get("job", ""), r.tags.get("rank", "-"))
        bisect.insort(self._steps[key], (r.time_ns, end if end is not None else -1,
                                         int(r.fields["step"])))

    def _vote(self, r: Record, at_release: bool = False) -> bool:
        """Count r's bytes for or against its flow being a ring flow. Before release
        only a vote for, once windows seen cover it (returns whether it voted); at
        release, with the windows known by then, the final vote (returns whether the
        flow is a ring flow)."""
        pid = r.tags.get("pid", "")
        proc = self._procs.get(pid)
        earlier = self._votes.pop(id(r), None)
        if at_release:
            self._unvoted.get(pid, {}).pop(id(r), None)
        if proc is None:
            return False
        key = _flow(r)
        votes = proc.votes.setdefault(key, [0, 0, 0])
        weight = max(1, int(r.fields["bytes_in"]) + int(r.fields["bytes_out"]))
        inside = proc.in_window(r.time_ns, _end_ns(r))
        if not at_release:
            if inside:
                votes[0] += weight
                votes[2] += 1
                self._votes[id(r)] = pid
            return inside
        if earlier == pid:
            votes[0] -= weight
            votes[2] -= 1
        votes[0 if inside else 1] += weight
        votes[2] += inside
        return proc.is_ring(key)

    def _trim(self) -> None:
        before = self._newest_ns - self.horizon_ns
        for proc in self._procs.values():
            proc.trim(before)
        for pid in [p for p, proc in self._procs.items()
                    if not proc.windows and not proc.retrans]:
            del self._procs[pid]
        for pid in [p for p, held in self._unvoted.items() if not held]:
            del self._unvoted[pid]
        for key in [k for k, pid in self._pid_of.items() if pid not in self._procs]:
            del self._pid_of[key]
        for key in list(self._steps):
            self._steps[key] = [s for s in self._steps[key] if s[1] < 0 or s[1] >= before]
            if not self._steps[key]:
                del self._steps[key]

    # --- joining ------------------------------------------------------------------------

    def _release(self, r: Record) -> list[Record]:
        if r.measurement == "tcp_transfer":
            key = _waiting_key(r)
            if self._waiting_on_flow.get(key):
                self._waiting_on_flow[key] -= 1
                if not self._waiting_on_flow[key]:
                    del self._waiting_on_flow[key]
            return self._transfer(r)
        pid = str(r.fields.get("pid", "")) if r.measurement == "gloo_collective" else \
            self._pid_of.get((r.tags.get("job", ""), r.tags.get("rank", "-")), "")
        seconds = r.fields.get("seconds")
        if self.retransmits_known and pid and seconds is not None:
            end = r.time_ns + int(seconds * 1e9)
            proc = self._procs[pid]
            r.fields["retransmits"], r.fields["retrans_segs"] = proc.retransmits(r.time_ns, end)
            if r.measurement == "gloo_step":
                r.fields["sync_retrans_segs"] = proc.retransmits_in_windows(r.time_ns, end)[1]
            self.counters["collectives_joined" if r.measurement == "gloo_collective"
                          else "steps_joined"] += 1
        return [r]

    def _transfer(self, r: Record) -> list[Record]:
        if self._vote(r, at_release=True):           # at release: the windows of its time have arrived
            self.counters["transfers_folded"] += 1
            return []
        if "job" in r.tags and r.tags["job"] == f"{r.tags['daddr']}:{r.tags['dport']}":
            self.counters["transfers_control"] += 1     # the rendezvous store
            return []
        training = _training(r)
        if not training and not self._within_budget(r.time_ns):
            self.counters["transfers_unlisted"] += 1
            return []
        self.counters["transfers_written"] += 1
        out = [r]
        if training:
            out.append(self._phase(r, r.time_ns, _end_ns(r)))
            self.counters["phases_inferred"] += 1
        return out

    def _within_budget(self, time_ns: int) -> bool:
        second = time_ns // 1_000_000_000
        if second != self._budget_second:
            self._budget_second, self._budget_used = second, 0
        self._budget_used += 1
        return self._budget_used <= self.transfers_per_s

    def _phase(self, r: Record, start: int, end: int) -> Record:
        key = (r.tags["job"], r.tags["rank"])
        bytes_in, bytes_out = int(r.fields["bytes_in"]), int(r.fields["bytes_out"])
        phase = "data_load" if bytes_in >= bytes_out else "checkpoint"
        phases = self._procs[r.tags["pid"]].phases
        gap = r.fields.get("gap_s")
        if gap is not None and gap <= self.tail_s and bytes_in + bytes_out < TAIL_BYTES:
            phase = phases.get(_flow(r), phase)       # the rest of the transfer before
        phases[_flow(r)] = phase
        if len(phases) > MAX_FLOW_PHASES:
            del phases[next(iter(phases))]
        tags = {"job": key[0], "rank": key[1], "phase": phase}
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
        i = bisect.bisect_right(steps, (t, 1 << 62, 1 << 62))
        if not i:
            return -1
        _, end, index = steps[i - 1]      # the latest step started by t (steps do not overlap)
        return index if end < 0 or t < end else index + 1


def _waiting_key(r: Record) -> tuple[str, tuple[str, str, str, str]]:
    return r.tags.get("pid", ""), _flow(r)


def _flow(r: Record) -> tuple[str, str, str, str]:
    t = r.tags
    return (t["saddr"], t["sport"], t["daddr"], t["dport"])
