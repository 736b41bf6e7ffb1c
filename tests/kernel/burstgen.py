"""Microburst generator with ground truth: paced UDP bursts, one JSON line per burst.

    ip netns exec NS python tests/kernel/burstgen.py --dst 198.19.7.2 --rate 1gbit \
        --frame 4042 --bursts 1000,200,1000,200 --gap-ms 30

Each burst: the time (CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns) read just
before its first send, then frames sent at the given line rate (frame = L2
bytes on the wire: UDP payload + 8 + 20 + 14), busy-waiting on the monotonic
clock between sends. Prints per burst {"start_ns", "end_ns", "bytes",
"packets", "planned_us", "max_late_ns"}: end_ns is read after the last send;
bytes and packets count the frames the kernel accepted; max_late_ns is how far
behind its schedule the sender fell (a burst that fell behind by more than a bin
may legitimately be seen as two). Runs as SCHED_FIFO when allowed, so that a
busy machine does not stretch a burst (a pause of more than a bin splits it).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

HEADERS = 14 + 20 + 8       # Ethernet, IPv4, UDP


def parse_rate(text: str) -> int:
    scale = {"kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
    for unit, mult in scale.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * mult)
    return int(text)


def burst(sock: socket.socket, dst: tuple[str, int], frame: int, rate_bps: int,
          duration_us: int) -> dict:
    payload = bytes(frame - HEADERS)
    interval_ns = frame * 8 * 10**9 // rate_bps
    count = max(1, round(duration_us * 1000 / interval_ns))
    sent = late = 0
    start = time.monotonic_ns()
    for i in range(count):
        due = start + i * interval_ns
        now = time.monotonic_ns()
        late = max(late, now - due)
        while now < due:
            now = time.monotonic_ns()
        try:
            sock.sendto(payload, dst)
            sent += 1
        except BlockingIOError:       # would block: not sent, not counted
            pass
    end = time.monotonic_ns()
    return {"start_ns": start, "end_ns": end, "bytes": sent * frame, "packets": sent,
            "planned_us": duration_us, "max_late_ns": late}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dst", required=True)
    p.add_argument("--port", type=int, default=9)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--frame", type=int, default=4042, help="L2 frame bytes")
    p.add_argument("--bursts", default="1000,200", help="burst lengths in us, comma separated")
    p.add_argument("--gap-ms", type=float, default=30.0)
    args = p.parse_args(argv)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    except (OSError, AttributeError):
        pass
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    sock.setblocking(False)
    rate = parse_rate(args.rate)
    # The first sends on a fresh socket are slow (route and neighbour lookups, buffer
    # and page allocations): two full-size warm-up frames keep that out of the first burst.
    for _ in range(2):
        sock.sendto(bytes(args.frame - HEADERS), (args.dst, args.port))
        time.sleep(args.gap_ms / 1000)
    for length in (int(x) for x in args.bursts.split(",") if x):
        print(json.dumps(burst(sock, (args.dst, args.port), args.frame, rate, length)),
              flush=True)
        time.sleep(args.gap_ms / 1000)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
