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
may be reported; then 1 ms and 200 us bursts. A burst whose frames left with a gap
that may have left a bin under the threshold (a vCPU of this VM stalls for 30-100
us at times) has no ground truth (see `disturbed`) and is set aside; at most 10 %
may be.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import Counter

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
FRAME = 4042              # L2 bytes per frame the generator sends ...
FRAME_NS = FRAME * 8      # ... each taking this long at 1 Gbit/s
START_TOL_NS = 200_000
BYTES_TOL = 0.05


def match(truth: dict, bursts: list[dict], offset_ns: int) -> dict | None:
    for b in bursts:
        start = b["time_ns"] - offset_ns
        if abs(start - truth["start_ns"]) <= START_TOL_NS and \
                abs(b["fields"]["bytes"] - truth["bytes"]) <= BYTES_TOL * truth["bytes"]:
            return b
    return None


def disturbed(truth: dict) -> bool:
    """The frames left with a gap (this VM's vCPUs stall for 30-100 us at times)
    that may have left a bin of the burst below the utilization threshold: the
    probe may then rightly see two bursts or a shorter one, and the ground truth of
    that burst is unknown, so it is judged neither found nor missed, and what the
    probe reported during it is not counted as extra.

    The probe bins each frame by its TC egress time, ts // BIN_NS on the monotonic
    clock; that time lies between the start of the frame's send call and its tap
    stamp. A bin is surely hot when at least `need` frames lie in it by both (frames
    are whole: 2 here, not the 1.5 of the threshold alone). The burst is found whole
    when every bin strictly between its first and last is hot (its partly filled
    edge bins are joined to it), or, within two bins, one of them is."""
    need = math.ceil(HOT * BIN_NS / FRAME_NS)
    start = truth["start_ns"]
    lows = [(start + s - STAMP_TOL_NS) // BIN_NS for s in truth["sent_ns"]]
    highs = [(start + d + STAMP_TOL_NS) // BIN_NS for d in truth["departures_ns"]]
    sure = Counter(lo for lo, hi in zip(lows, highs) if lo == hi)
    first, last = lows[0], highs[-1]
    if last - first <= 1:
        return max(sure.values(), default=0) < need
    return any(sure[b] < need for b in range(first + 1, last))


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
    clean = [t for t in truth if not disturbed(t)]
    matched = {i: match(t, reported, offset) for i, t in enumerate(clean)}
    found = [i for i, b in matched.items() if b is not None]
    errors_us = [abs(matched[i]["time_ns"] - offset - clean[i]["start_ns"]) / 1000
                 for i in found]
    detail = [(t["planned_us"], t["start_ns"], t["bytes"], t["max_gap_ns"]) for t in clean]
    set_aside = [(t["planned_us"], t["start_ns"], t["max_gap_ns"]) for t in truth if disturbed(t)]
    err = (f"median {statistics.median(errors_us):.1f} us max {max(errors_us):.1f} us"
           if errors_us else "-")
    print(f"bursts {len(truth)}, clean {len(clean)}, set aside {len(set_aside)} (gaps on the "
          f"wire), found {len(found)}/{len(clean)}, start error {err}, reported "
          f"{len(reported)}; set aside (us, start, max gap): {set_aside}")
    assert len(set_aside) <= SET_ASIDE_MAX * len(truth), f"frames left with gaps: {set_aside}"
    assert len(found) >= 0.95 * len(clean), f"missed: {detail} reported: {reported}"
    used = {id(b) for b in matched.values() if b is not None}
    stalled = [(t["start_ns"] + offset - START_TOL_NS, t["end_ns"] + offset + START_TOL_NS)
               for t in truth if disturbed(t)]
    extra = [b for b in reported if id(b) not in used
             and not any(lo <= b["time_ns"] <= hi for lo, hi in stalled)]
    assert len(extra) <= 0.05 * len(clean), f"bursts that were not sent: {extra}"
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
