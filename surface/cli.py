"""`fabricscope report` and `fabricscope top`: the operator's views of the store.

    fabricscope report [--since 15m | --start T --end T] [--job J] [--compare C] --out F
    fabricscope top [--job J] [--interval 1] [--once]

`report` writes one self-contained HTML file (plotly.js inlined, nothing fetched
when it opens): the job's summary and primary finding, the timeline of steps,
phases and findings, the NIC heatmap, TCP, collectives, the topology coloured by
health, every finding with its evidence and advice and, with --compare, the
before/after statistics of `fabricscope compare`. `top` is a live terminal view
of the same store, refreshed every second. Both exit 2 with one line when the
store is unreachable or holds nothing for them.
"""

from __future__ import annotations

import argparse

EPILOG = """examples:
  fabricscope report --since 30m --out report.html
  fabricscope report --job 198.18.0.1:29500 --compare "fault cleared" --out report.html
  fabricscope report --start 2026-12-01T21:40:00 --end 2026-12-01T21:55:00 \\
      --compare 2026-12-01T21:40:00..2026-12-01T21:45:00..2026-12-01T21:50:00 --out r.html
  fabricscope top
  fabricscope top --job 198.18.0.1:29500 --once
"""



def register(sub) -> None:
    from fabricscope.diagnosis.cli import store_arguments
    from fabricscope.diagnosis.timespan import add_window_arguments
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("report", help="one self-contained HTML report of a job's window",
                       description="One self-contained HTML file (nothing fetched when it "
                                   "opens) of a job's window: summary, findings, compare, "
                                   "timeline, topology, NICs, TCP, collectives.",
                       epilog=EPILOG, formatter_class=fmt)
    store_arguments(p)
    add_window_arguments(p)
    p.add_argument("--job", help="the job (default: the one with the primary finding, else "
                                 "the one with the most ranks)")
    p.add_argument("--compare", metavar="SPLIT",
                   help="a before/after section: an annotation's text (split at the latest "
                        "one that contains it), T1..T2..T3 (before T1..T2, after T2..T3) or "
                        "T1..T2,T3..T4")
    p.add_argument("--compare-window", default="2m", metavar="DURATION",
                   help="with an annotation: the length of each side (default 2m, "
                        "clipped to the report's window)")
    p.add_argument("--out", required=True, help="the HTML file to write")
    p.set_defaults(func=_report)

    p = sub.add_parser("top", help="a live terminal view: links, steps, collectives, findings",
                       description="Refreshed every --interval seconds from the store; q "
                                   "quits.", epilog=EPILOG, formatter_class=fmt)
    store_arguments(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame as text and exit")
    p.add_argument("--width", type=int, default=0,
                   help="with --once: the frame's width (default: the terminal's)")
    p.set_defaults(func=_top)


def _store(args):
    from fabricscope.diagnosis.store import Store
    store = Store(args.influx_url, args.database, args.token)
    store.ping()
    return store


def _report(args) -> int:
    from fabricscope.surface.report.page import write_report
    path, summary = write_report(_store(args), args)
    print(f"wrote {path} ({summary})")
    return 0


def _top(args) -> int:
    from fabricscope.surface.top import check, run_top
    check(args)
    return run_top(_store(args), args)
