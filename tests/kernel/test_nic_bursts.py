"""Acceptance: microbursts of known start and size, seen by the nic probe at 100 us bins.

The generator is C (tests/kernel/burstgen.c: busy-wait pacing at 1 Gbit/s on
CLOCK_MONOTONIC, SCHED_FIFO, pinned), so the frames' timing does not depend on the
Python interpreter. Ground truth is where each frame left: an AF_PACKET tap on the
sending veth stamps every outgoing frame in the kernel (converted to
CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns), and the generator fails unless the
tap saw every frame it sent, stamped within its send call. The probe watches that
veth's egress (link speed configured as 1 Gbit/s, threshold 0.5): TC egress runs
inside the sender's sendto(), just before the tap, so the bins see the packets
when they pass the interface, not when the receiving side's softirq gets CPU on a
busy machine. First a 10 s quiet baseline on the private link, in which no burst
may be reported; then 1 ms and 200 us bursts.

A vCPU of this VM stalls for 20-100 us in a third of all milliseconds (measured with
a SCHED_FIFO busy loop), so frames do leave with gaps, and a gap can leave a bin of a
burst under the threshold: the probe then rightly reports two bursts, or a shorter
one. The test does not set such bursts aside: from where each frame left it
predicts what the probe must report (`predicted`: every way the frames can fall
into bins, then the burst rule of agent/probes/nic/window.py, restated here) and
requires the probe's bursts in that span to be one of those outcomes, to the byte
and the packet, each starting at its first frame. Only a burst with too many ways
(frames whose send call straddles a bin edge) is set aside; at most 10 % may be.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics

import pytest

from fabricscope.records import Record
from fabricscope.schema import validate
from tests.kernel.nic_lab import burstgen, netns_pair, running, sh

pytestmark = pytest.mark.root

QUIET_S = 10
BIN_NS = 100_000          # the probe's default bin (nic_bin_us)
HOT = 0.5                 # its default burst threshold (nic_burst_threshold)
BURSTS = ["1000", "200"] * 20
SET_ASIDE_MAX = 0.10      # of the bursts, at most this share may have no ground truth
STAMP_TOL_NS = 2_000      # a tap stamp, converted to monotonic, is this close to the kernel's
FRAME = 1042              # L2 bytes per frame the generator sends ...
LINK_BPS = 10**9
HOT_BYTES = HOT * LINK_BPS * BIN_NS / 8 / 10**9   # a hot bin carries this many bytes, at least
STALL_NS = FRAME * 8 + 20_000   # frames left this far apart: the sender stalled
MAX_WAYS = 4096           # ways the frames of one burst may fall into bins, at most


def frame_bins(truth: dict) -> list[range]:
    """Per frame, the bins its TC egress time may lie in: that time is after its send
    call began (sent_ns) and before its tap stamp (departures_ns), each +- the stamp
    tolerance."""
    start = truth["start_ns"]
    return [range((start + s - STAMP_TOL_NS) // BIN_NS, (start + d + STAMP_TOL_NS) // BIN_NS + 1)
            for s, d in zip(truth["sent_ns"], truth["departures_ns"])]


def bursts_of(bin_of: tuple[int, ...], frame_bytes: int) -> tuple[tuple[int, int, int], ...]:
    """The probe's burst rule over frames placed in bins: runs of consecutive hot bins
    (bytes >= HOT_BYTES), each extended by the non-empty bin just before it (unless the
    run before took it as its tail) and just after it. Per burst: (bytes, packets,
    index of its first frame)."""
    frames: dict[int, list[int]] = {}
    for i, b in enumerate(bin_of):
        frames.setdefault(b, []).append(i)
    hot = [b for b in sorted(frames) if len(frames[b]) * frame_bytes >= HOT_BYTES]
    runs: list[list[int]] = []
    for b in hot:
        if runs and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    out, tail = [], None
    for run in runs:
        lo, hi = run[0], run[-1]
        if lo - 1 in frames and lo - 1 != tail:
            lo -= 1
        if hi + 1 in frames:
            hi += 1
        tail = hi
        members = [i for b in range(lo, hi + 1) for i in frames.get(b, [])]
        out.append((len(members) * frame_bytes, len(members), min(members)))
    return tuple(out)


def predicted(truth: dict) -> set | None:
    """Every outcome the probe may rightly report for this burst, or None when the
    frames can fall into bins in more than MAX_WAYS ways (then it has no ground truth).
    Frames pass TC in order, so their bins never decrease."""
    options = frame_bins(truth)
    ways = math.prod(len(o) for o in options)
    if ways > MAX_WAYS:
        return None
    frame_bytes = truth["bytes"] // truth["packets"]
    out = set()
    for bin_of in itertools.product(*options):
        if all(x <= y for x, y in zip(bin_of, bin_of[1:])):
            out.add(bursts_of(bin_of, frame_bytes))
    return out


def _earliest_ns(truth: dict) -> int:
    """Where the burst's first frame can have passed TC: from its send call on, which
    on a busy VM can begin more than a bin before the frame reaches the tap (a vCPU
    stall between the two; frame_bins allows the same)."""
    return truth["start_ns"] + min(0, truth["sent_ns"][0])


def judge(truth: dict, reported: list[dict], offset_ns: int) -> list[dict] | None:
    """The probe's bursts that started in this burst's span when they are one of its
    predicted outcomes (and each starts within its first frame's send call), else None."""
    lo = _earliest_ns(truth) + offset_ns - BIN_NS - STAMP_TOL_NS
    hi = truth["end_ns"] + offset_ns + STAMP_TOL_NS
    mine = sorted((b for b in reported if lo <= b["time_ns"] <= hi), key=lambda b: b["time_ns"])
    for outcome in predicted(truth) or ():
        if len(outcome) != len(mine):
            continue
        if all(b["fields"]["bytes"] == nbytes and b["fields"]["packets"] == packets
               and truth["sent_ns"][first] - STAMP_TOL_NS
               <= b["time_ns"] - offset_ns - truth["start_ns"]
               <= truth["departures_ns"][first] + STAMP_TOL_NS
               for b, (nbytes, packets, first) in zip(mine, outcome)):
            return mine
    return None


def test_microbursts_found_with_start_and_size():
    gen_exe = burstgen()
    with netns_pair(mtu=9000) as pair, running(pair.exec(pair.ns_a), "--interfaces", pair.if_a,
                                       "--link-speed-bps", f"{pair.if_a}=1gbit",
                                       "--nic-bursts-per-window", "1000") as probe:
        ready = probe.ready()
        offset = ready["clock_offset_ns"]
        # quiet baseline: await QUIET_S complete 1 s windows on the idle link
        probe.wait_for(lambda _x: len([w for w in probe.records("nic_window")
                                       if w["tags"]["direction"] == "tx"]) >= QUIET_S + 1,
                       timeout_s=QUIET_S + 60)
        quiet_bursts = list(probe.records("nic_burst"))
        quiet = list(probe.records("nic_window"))

        gen = sh(*pair.exec(pair.ns_a, gen_exe, "--dst", pair.addr_b, "--rate", "1gbit",
                            "--frame", str(FRAME), "--bursts", ",".join(BURSTS), "--gap-ms", "20",
                            "--tap", pair.if_a, "--cpu", str(max(os.sched_getaffinity(0)))),
                 check=False)
        assert gen.returncode == 0, f"burstgen failed ({gen.returncode}): {gen.stderr}"
        truth = [json.loads(line) for line in gen.stdout.splitlines()]
        last_end = max(t["end_ns"] for t in truth) + offset
        # await the window after the last burst: every burst has been drained by then
        probe.wait_for(lambda x: x.get("measurement") == "nic_window"
                       and x["time_ns"] > last_end, timeout_s=60)
        stats = probe.stop()

    assert quiet_bursts == [], f"bursts on a quiet link: {quiet_bursts}"
    assert all(w["fields"]["hot_bins"] == 0 for w in quiet)
    assert len(truth) == len(BURSTS) and all(t["packets"] for t in truth)
    first_start = min(t["start_ns"] for t in truth) + offset
    reported = [b for b in probe.records("nic_burst") if b["time_ns"] >= first_start - 10**6
                and b["tags"] == {"interface": pair.if_a, "direction": "tx"}]
    judged = [t for t in truth if predicted(t) is not None]
    set_aside = [(t["planned_us"], t["start_ns"], t["max_gap_ns"]) for t in truth
                 if predicted(t) is None]
    matched = [(t, judge(t, reported, offset)) for t in judged]
    found = [(t, mine) for t, mine in matched if mine is not None]
    # how far the first burst reported starts from the first frame: 0-10 us, or a
    # stall's length when the frames before a stall rightly made no burst of their own
    # (each reported start is checked against its own first frame by `judge`); a burst
    # whose frames a stall spread over bins none of which was hot rightly made none
    errors_us = [abs(mine[0]["time_ns"] - offset - t["start_ns"]) / 1000
                 for t, mine in found if mine]
    split = [t["planned_us"] for t, mine in found if len(mine) > 1]
    stalled = sum(1 for t in judged if t["max_gap_ns"] > STALL_NS)
    ambiguous = sum(1 for t in judged if len(predicted(t)) > 1)
    err = (f"median {statistics.median(errors_us):.1f} us max {max(errors_us):.1f} us"
           if errors_us else "-")
    print(f"bursts {len(truth)}, judged {len(judged)} ({stalled} with a gap of > 20 us on the "
          f"wire, {ambiguous} with more than one right outcome), set aside {len(set_aside)}, found {len(found)}/{len(judged)} "
          f"(split by a gap, rightly: {split}), start error {err}, reported {len(reported)}; "
          f"set aside (us, start, max gap): {set_aside}")
    assert len(set_aside) <= SET_ASIDE_MAX * len(truth), f"bursts with no ground truth: {set_aside}"
    missed = [(t["planned_us"], t["start_ns"] + offset, t["sent_ns"][0], t["bytes"],
               t["max_gap_ns"], sorted(predicted(t))[:3]) for t, mine in matched if mine is None]
    assert len(found) >= 0.95 * len(judged), f"missed: {missed} reported: {reported}"
    used = {id(b) for _, mine in found for b in mine}
    spans = [(_earliest_ns(t) + offset - BIN_NS - STAMP_TOL_NS, t["end_ns"] + offset + STAMP_TOL_NS)
             for t in truth]
    extra = [b for b in reported if id(b) not in used
             and not any(lo <= b["time_ns"] <= hi for lo, hi in spans)]
    assert extra == [], f"bursts that were not sent: {extra}"
    for record in probe.lines:
        if "measurement" in record:
            validate(Record(record["measurement"], record["time_ns"],
                            {**record["tags"], "node": "n"}, record["fields"]))
    assert stats["lost"] == 0 and stats["ring_miss"] == 0
    # every burst found is counted in its window, and listed (the cap is above the count)
    tx_windows = [w for w in probe.records("nic_window") if w["tags"]["direction"] == "tx"]
    tx_bursts = [b for b in probe.records("nic_burst") if b["tags"]["direction"] == "tx"]
    assert sum(w["fields"]["bursts"] for w in tx_windows) == len(tx_bursts)
    assert all(w["fields"]["bursts_listed"] == w["fields"]["bursts"] for w in tx_windows)
