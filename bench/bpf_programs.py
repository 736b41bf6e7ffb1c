"""Where the agents' kernel side goes: each BPF program's runs/s and ns per run under DDP.

Not a ratio but the breakdown behind the pinned ddp-overhead figure (what runs in the
ranks' own context): a 3-node lab with InfluxDB, a collector and one agent per node
(every default probe), one real gloo DDP run; the kernel's BPF run-time statistics
(sysctl kernel.bpf_stats_enabled, switched on for the measurement and restored
after) are read from each agent's program fds (/proc/PID/fdinfo: run_cnt,
run_time_ns) before and after `--seconds` of training. Program names come from the
kernel (BPF_PROG_GET_FD_BY_ID + BPF_OBJ_GET_INFO_BY_FD; the first 15 characters).

    python -m fabricscope.bench.bpf_programs [--seconds 10] [--model-mb 8]

The three agents share this kernel: a tracepoint program runs three times per event
(twice leaving at the address check), so divide those rows by three for a node of
its own; TC programs run once per packet per interface.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import time
import uuid
from collections import defaultdict
from pathlib import Path

from fabricscope.agent.probes.nic.bpfmap import prog_name_by_id
from fabricscope.errors import UserError

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")


def program_stats(pids: list[int]) -> dict[int, tuple[int, int]]:
    """prog id -> (run_cnt, run_time_ns) of every BPF program fd these processes hold."""
    out: dict[int, tuple[int, int]] = {}
    for pid in pids:
        for fdinfo in Path(f"/proc/{pid}/fdinfo").iterdir():
            try:
                text = fdinfo.read_text()
            except OSError:
                continue
            if "run_time_ns" not in text:
                continue
            fields = dict(re.findall(r"^(\w+):\s*(\S+)", text, re.M))
            out[int(fields["prog_id"])] = (int(fields["run_cnt"]), int(fields["run_time_ns"]))
    return out


def breakdown(before: dict, after: dict, seconds: float) -> list[tuple[str, float, float, float]]:
    """(name, runs/s, ns per run, % of one core) per program name, largest first."""
    per_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for prog_id, (runs, ns) in after.items():
        runs0, ns0 = before.get(prog_id, (0, 0))
        if runs > runs0:
            row = per_name[prog_name_by_id(prog_id)]
            row[0] += runs - runs0
            row[1] += ns - ns0
    rows = [(name, runs / seconds, ns / runs, ns / seconds / 1e7)
            for name, (runs, ns) in per_name.items()]
    return sorted(rows, key=lambda r: -r[3])


@contextlib.contextmanager
def bpf_stats_on():
    before = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    try:
        yield
    finally:
        STATS_SYSCTL.write_text(before)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fabricscope.bench.bpf_programs", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--model-mb", type=float, default=8.0)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("fabricscope.bench.bpf_programs: needs root (reads BPF program statistics); "
                         "run it as root")
    from fabricscope.lab.stack import await_agents_ready, running_stack, start_agent
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training
    try:
        with running_lab(f"bbp{uuid.uuid4().hex[:4]}", 3) as lab, \
                running_stack(lab, agents=False) as stack, \
                start_training(lab, 10**7, model_mb=args.model_mb) as run:
            while len(run.records) < 20:          # past DDP's first steps
                if run.poll() is not None:
                    raise SystemExit(f"the training ended: {run.error}")
                time.sleep(0.1)
            for node in lab.nodes:
                start_agent(stack, node)
            await_agents_ready(stack)
            time.sleep(3)                         # past the agents' start-up
            pids = [proc.popen.pid for proc in stack.agents.values()]
            with bpf_stats_on():
                before, steps0, t0 = program_stats(pids), len(run.records), time.monotonic()
                time.sleep(args.seconds)
                after, seconds = program_stats(pids), time.monotonic() - t0
            steps = len(run.records) - steps0
            rows = breakdown(before, after, seconds)      # names while still loaded
    except UserError as exc:
        raise SystemExit(f"fabricscope.bench.bpf_programs: {exc}") from None
    print(f"{steps / seconds:.1f} DDP steps/s over {seconds:.1f} s, 3 agents, every default probe")
    print(f"{'program':<24} {'runs/s':>10} {'ns/run':>8} {'% of a core':>12}")
    for name, rate, per_run, core in rows:
        print(f"{name:<24} {rate:>10.0f} {per_run:>8.0f} {core:>12.3f}")
    print(f"{'all':<24} {'':>10} {'':>8} {sum(r[3] for r in rows):>12.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
