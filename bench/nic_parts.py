"""What each part of the nic TC program costs a CPU-bound TCP stream: iperf3 throughput
with variants of the program on both ends of a veth pair, against none, in one run.

    python -m fabricscope.bench.nic_parts [--rounds 10] [--seconds 2] [--parts none,0,1,3,5,7]

Variants are bpf/nic.bpf.c compiled with -DFS_NIC_PARTS=mask (FS_NIC_PART_*: 1 the
interface lookup and the clock, 2 the time bins, 4 the flow table; 0 returns at
once: the bare hook; 7 is what the agent runs), attached by fabricscope.agent.tc (tcx where
the kernel has it) in a helper process per end that does nothing else: no drains,
no agent. Each round measures every variant once, in an order reversed every
other round, so drift hits all alike; the figure per variant is the median of its
per-round ratios to the round's `none`, with quartiles. The testbed is
iperf3-overhead-nic's (bench/iperf3_overhead.py: netns_pair, iperf3_server).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys

from fabricscope.bench.iperf3_overhead import PYTHON, ROOT, iperf3_server, netns_pair, sh

NAMES = {"none": "no program", "0": "bare hook (returns at once)",
         "1": "interface lookup + clock", "3": "+ bins", "5": "+ flow table (no bins)",
         "7": "all (what the agent runs)"}


def attach_and_wait(parts: int, ifname: str) -> None:
    """In a helper process (in the interface's namespace): compile the variant, register
    the interface, attach both directions, say "ready", hold until stdin closes."""
    from fabricscope.agent import bpf, kernel
    from fabricscope.agent.probes.nic.probe import pick_interfaces, register_interface
    from fabricscope.agent.tc import TcPrograms
    kernel.prepare()
    from bcc import BPF

    prog = bpf.compile_program("nic", ["-DFS_NIC_RINGS=2", "-DFS_NIC_MAX_IFACES=1",
                                       f"-DFS_NIC_CPUS={_cpu_ids()}", f"-DFS_NIC_PARTS={parts}"])
    link, = pick_interfaces((ifname,))
    register_interface(prog, link.index, 0, 14)
    fns = {d: prog.load_func(f"fs_nic_{d}".encode(), BPF.SCHED_CLS)
           for d in ("ingress", "egress")}
    hooks = TcPrograms(fns)
    hooks.attach([link])
    try:
        print("ready", hooks.mechanism, flush=True)
        sys.stdin.read()
    finally:
        hooks.detach()


@contextlib.contextmanager
def attached(parts: int, ifname: str, prefix: list[str]):
    """The variant on both directions of ifname for the block, from a helper process
    started under prefix (e.g. `ip netns exec NS`); yields "tcx" or "clsact"."""
    proc = subprocess.Popen([*prefix, PYTHON, "-m", "fabricscope.bench.nic_parts", "--attach", str(parts),
                             ifname], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        if not line or line[0] != "ready":
            raise RuntimeError(f"FS_NIC_PARTS={parts} did not attach on {ifname}: "
                               + proc.stderr.read().strip()[-300:])
        yield line[1]
    finally:
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _cpu_ids() -> int:
    from fabricscope.agent.probes.nic.bpfmap import cpu_id_limit
    return cpu_id_limit()


def _busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat (busy: not idle, not iowait)."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return sum(f) - f[3] - f[4], sum(f)


def measure(rounds: int, seconds: int, variants: list[str]) -> dict:
    gbps = {v: [] for v in variants}
    busy = {v: [] for v in variants}
    mechanism = ""
    with netns_pair() as pair, iperf3_server(pair.ns_b):
        for r in range(rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                with contextlib.ExitStack() as helpers:
                    if v != "none":
                        for ns, ifname in ((pair.ns_a, pair.if_a), (pair.ns_b, pair.if_b)):
                            mechanism = helpers.enter_context(
                                attached(int(v), ifname, pair.exec(ns)))
                    b0, t0 = _busy()
                    out = sh(*pair.exec(pair.ns_a, "iperf3", "-c", pair.addr_b,
                                        "-t", str(seconds), "-J"))
                    b1, t1 = _busy()
                gbps[v].append(json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"]
                               / 1e9)
                busy[v].append((b1 - b0) / max(t1 - t0, 1))
            print(f"round {r + 1}/{rounds}: "
                  + ", ".join(f"{v} {gbps[v][-1]:.2f}" for v in variants), file=sys.stderr)
    base = variants[0]
    rows = []
    for v in variants:
        ratios = sorted(a / b for a, b in zip(gbps[v], gbps[base]))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        rows.append({"parts": v, "what": NAMES.get(v, v),
                     "median_gbps": statistics.median(gbps[v]),
                     "paired_ratio": statistics.median(ratios), "quartiles": (q[0], q[2]),
                     "busy_of_all_cpus": statistics.median(busy[v])})
    return {"rounds": rounds, "seconds": seconds, "attach": mechanism, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.bench.nic_parts",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=2, help="iperf3 -t per measurement")
    parser.add_argument("--parts", default="none,0,1,3,5,7",
                        help="variants: none, or FS_NIC_PARTS masks; the first is the base")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--attach", nargs=2, metavar=("PARTS", "IFNAME"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attach:
        attach_and_wait(int(args.attach[0]), args.attach[1])
        return 0
    variants = args.parts.split(",")
    bad = [v for v in variants if v != "none" and not (v.isdigit() and int(v) < 8)]
    if bad or args.rounds < 1 or args.seconds < 1:
        print(f"nic_parts: bad --parts {','.join(bad)} or --rounds/--seconds below 1; give "
              "e.g. --parts none,0,7 --rounds 10", file=sys.stderr)
        return 2
    result = measure(args.rounds, args.seconds, variants)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"nic_parts: {result['rounds']} rounds of iperf3 -t {result['seconds']}, programs "
          f"attached by {result['attach'] or '-'}; ratio: per round against {variants[0]}")
    for row in result["rows"]:
        print(f"  {row['parts']:>4}  {row['what']:<30} {row['median_gbps']:6.2f} Gbit/s  "
              f"ratio {row['paired_ratio']:.3f} ({row['quartiles'][0]:.3f}-"
              f"{row['quartiles'][1]:.3f})  CPUs busy {row['busy_of_all_cpus']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
