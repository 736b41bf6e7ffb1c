"""Run the nic probe alone and print its records as JSON lines (debugging, tests, bench).

    python -m fabricscope.agent.probes.nic.standalone --interfaces eth0 --link-speed-bps eth0=1gbit
    ip netns exec NS python -m fabricscope.agent.probes.nic.standalone --duration 10

Takes every agent flag (docs/config.md). Prints `{"event": "ready", "interfaces":
[...], "clock_offset_ns": N}` once attached (record time = CLOCK_MONOTONIC + N),
then one record per line, and on SIGTERM/SIGINT or after --duration: detaches, prints the last records and `{"event": "stats", ...}` (Probe.stats()).
Errors: one line on stderr, exit 2 (bad input) or 3 (probe unavailable here).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from fabricscope.errors import UserError


def _emit(obj) -> None:
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    sys.stdout.flush()


def run(argv: list[str] | None = None) -> int:
    from fabricscope.agent.config import AgentConfig
    from fabricscope import config as fconfig

    parser = argparse.ArgumentParser(prog="nic_standalone", description=__doc__.split("\n")[0])
    fconfig.add_arguments(parser, AgentConfig)
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop after this many seconds (default: at SIGTERM/SIGINT)")
    args = parser.parse_args(argv)
    cfg = fconfig.load(AgentConfig, "agent", args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    from fabricscope.agent import kernel
    kernel.prepare(cfg.kernel_headers)
    from fabricscope.agent.probes.base import Clock, ProbeContext, effective_poll_interval
    from fabricscope.agent.probes.nic.probe import NicProbe

    probe = NicProbe(ProbeContext(cfg.node, frozenset(), Clock(), cfg))
    try:
        probe.attach()
        _emit({"event": "ready", "interfaces": probe.interface_names(),
               "clock_offset_ns": probe.ctx.clock.offset_ns})
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        while not stop.is_set():
            for record in probe.poll():
                _emit(record.to_json())
            wait = effective_poll_interval(cfg.poll_interval_s, [probe])
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    break
            stop.wait(wait)
    finally:
        probe.detach()
    for record in probe.poll():
        _emit(record.to_json())
    _emit({"event": "stats", **probe.stats()})
    return 0


def main() -> None:
    from fabricscope.agent.probes.base import ProbeUnavailable
    try:
        sys.exit(run())
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        sys.exit(exc.exit_code)
    except ProbeUnavailable as exc:
        print(f"fabricscope: nic probe unavailable: {exc}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
