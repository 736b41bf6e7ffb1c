"""The tcp_flows sweep's sock_diag dump: time per dump against `ss -tane` in the same run.

The sweep (agent/probes/tcp/sweep.py) lists the cookies of every full TCP socket of
the namespace once per window with candidates. This runs it in a namespace of its
own holding N loopback connections (2N sockets), for each N, repeated, and prints
the medians with the ratio to `ss -tane` listing the same sockets (its cookies are
compared too: the two must agree).

    python -m fabricscope.bench.sweep_dump [--sockets 0,1000,3000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid

from fabricscope.agent.probes.tcp.sweep import live_cookies


def _measure(counts: list[int], repeats: int) -> list[dict]:
    srv = socket.create_server(("127.0.0.1", 0), backlog=4096)
    port, keep, out = srv.getsockname()[1], [], []
    for n in counts:
        while len(keep) < n:
            keep.append(socket.create_connection(("127.0.0.1", port)))
            keep.append(srv.accept()[0])
        ours, theirs = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            cookies = live_cookies()
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            text = subprocess.run(["ss", "-tane"], capture_output=True, text=True).stdout
            theirs.append(time.perf_counter() - t)
        ss = {int(x, 16) for x in re.findall(r"sk:([0-9a-f]+)", text)}
        out.append({"sockets": len(cookies), "agree_with_ss": cookies == ss,
                    "dump_ms": statistics.median(ours) * 1e3,
                    "ss_ms": statistics.median(theirs) * 1e3,
                    "ratio": statistics.median(ours) / statistics.median(theirs)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sockets", default="0,1000,3000",
                   help="connections to hold, comma-separated (each is 2 sockets)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    counts = [2 * int(x) for x in a.sockets.split(",")]
    if a.inside:
        print(json.dumps(_measure(counts, a.repeats)))
        return 0
    ns = f"fssweep{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        res = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "fabricscope.bench.sweep_dump",
                              "--inside", "--sockets", a.sockets, "--repeats", str(a.repeats)],
                             capture_output=True, text=True, check=True)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    print(f"{'sockets':>8} {'dump ms':>9} {'ss ms':>8} {'ratio':>6}  cookies agree")
    for row in json.loads(res.stdout):
        print(f"{row['sockets']:>8} {row['dump_ms']:>9.2f} {row['ss_ms']:>8.2f} "
              f"{row['ratio']:>6.2f}  {row['agree_with_ss']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
