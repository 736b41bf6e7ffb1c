"""`fabricscope diagnose | explain | annotate | compare`: the engine for a person.

    fabricscope diagnose [--since 15m | --start T --end T] [--job J] [--json] [--recompute]
    fabricscope explain FINDING_ID
    fabricscope annotate [--job J] "raised bucket_cap_mb to 50"
    fabricscope compare --job J (--before T1..T2 --after T3..T4 | --around TEXT) [--json]

`diagnose` reports the findings the collectors' live engine recorded for the
window (`first_seen` is when it raised them); with --recompute, or where none
were recorded, it replays the same engine over the window's raw measurements
(diagnosis/replay.py). Every command exits 0 whether or not it finds anything,
and 2 with one line when the store is unreachable or holds nothing for the
window.
"""

from __future__ import annotations

import getpass
import importlib
import json
import socket
import sys
import time

from fabricscope.errors import UserError

STALE_NS = 60 * 1_000_000_000   # an open finding without evidence this long is stale

EPILOG = """examples:
  fabricscope diagnose --since 30m
  fabricscope diagnose --job 198.18.0.1:29500 --recompute --json
  fabricscope explain 8083af23f99a
  fabricscope annotate --job 198.18.0.1:29500 "NCCL_SOCKET_NTHREADS=4"
  fabricscope compare --job 198.18.0.1:29500 --around NCCL_SOCKET_NTHREADS
"""


def store_arguments(p) -> None:
    """The flags that say where the store is (every command that reads it)."""
    p.add_argument("--influx-url", default="http://127.0.0.1:8086", help="InfluxDB base URL")
    p.add_argument("--database", default="fabricscope", help="database (1.x) or bucket")
    p.add_argument("--token", default="", help="InfluxDB 2.x/3.x API token")


def _store_args(p) -> None:
    store_arguments(p)
    p.add_argument("--topology-file", default="", help="node -> ToR map (as the collector's)")


def register(sub) -> None:
    from fabricscope.diagnosis.timespan import add_window_arguments
    import argparse
    fmt = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("diagnose", help="what is wrong, where, how much, what to change",
                       description=__doc__.split("\n\n")[0], epilog=EPILOG, formatter_class=fmt)
    _store_args(p)
    add_window_arguments(p)
    p.add_argument("--job", help="only this job")
    p.add_argument("--json", action="store_true",
                   help='one object {"job_class": {job: point}, "findings": [...]}')
    p.add_argument("--recompute", action="store_true",
                   help="run the engine over the raw measurements instead of reading findings")
    p.add_argument("--explain", action="store_true", help="the chain of evidence of each")
    p.add_argument("--all", action="store_true", help="show info findings too")
    p.set_defaults(func=diagnose)

    p = sub.add_parser("explain", help="a finding's chain of evidence",
                       description="What was seen, where, when, what it rules out, and what "
                                   "to change.")
    _store_args(p)
    p.add_argument("finding_id")
    p.set_defaults(func=explain)

    p = sub.add_parser("annotate", help="note a change (Grafana shows it; compare splits at it)")
    _store_args(p)
    p.add_argument("--job", default="-", help="the job it concerns (default: all)")
    p.add_argument("--at", metavar="T", help="when it happened (default now)")
    p.add_argument("text")
    p.set_defaults(func=annotate)

    p = sub.add_parser("compare", help="before/after a change, with statistics",
                       description=importlib.import_module("fabricscope.diagnosis.compare").__doc__
                       .split("\n\n")[0], formatter_class=fmt)
    _store_args(p)
    p.add_argument("--job", required=True)
    p.add_argument("--before", metavar="T1..T2")
    p.add_argument("--after", metavar="T3..T4")
    p.add_argument("--around", metavar="ANNOTATION",
                   help="split at the latest annotation whose text contains this")
    p.add_argument("--window", default="2m",
                   help="with --around: the length of each side (default 2m)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=compare)


def _store(args):
    from fabricscope.diagnosis.store import Store
    store = Store(args.influx_url, args.database, args.token)
    store.ping()
    return store


def _tor_of(args):
    if not args.topology_file:
        return lambda node: None
    from fabricscope.topology import load_topology
    return load_topology(args.topology_file).tor_of


def recorded(store, span, job: str | None):
    from fabricscope.diagnosis.finding import Finding
    from fabricscope.diagnosis.store import quote
    where = f" AND job = {quote(job)}" if job else ""
    rows = store.query(f"SELECT * FROM finding WHERE time <= {span.end_ns}{where}")
    out = []
    for row in rows:
        f = Finding.from_row({**row, **row.get("_tags", {})})
        # an open finding counts while it has evidence near the window (one left open
        # by a collector that stopped with its job is not news forever)
        last = f.end_ns if f.end_ns is not None else max(f.last_seen_ns, f.start_ns) + STALE_NS
        if last >= span.start_ns:
            out.append(f)
    return out


def recompute(store, span, job: str | None, tor_of):
    from fabricscope.diagnosis.engine import JobEngine
    from fabricscope.diagnosis.evidence import SECOND
    from fabricscope.diagnosis.jobclass import replay_classes
    from fabricscope.diagnosis.replay import replay
    from fabricscope.diagnosis.source import StoreSource
    source = StoreSource(store)
    lead = 120 * SECOND                 # the jobs' baseline steps before the window
    jobs = source.jobs(span.start_ns - lead, span.end_ns)
    if job:
        jobs = {j: m for j, m in jobs.items() if j == job}
    if not jobs:
        raise UserError(f"the store holds no training steps for {span}"
                        + (f" of job {job}" if job else ""),
                        "widen --since, or check --influx-url and --database")
    out = []
    for j, members in jobs.items():
        ev = source.read(members, span.start_ns - lead, span.end_ns,
                         heartbeat_from_ns=span.start_ns - lead)
        engine = JobEngine(j, tor_of=tor_of)
        found = replay(engine, ev, (span.start_ns - lead) // SECOND, span.end_ns // SECOND + 1,
                       classes=replay_classes(store, j))
        out += [f for f in found if f.end_ns is None or f.end_ns >= span.start_ns]
    return out


def diagnose(args) -> int:
    from fabricscope.diagnosis.present import explain as explain_one
    from fabricscope.diagnosis.present import findings_text
    from fabricscope.diagnosis.timespan import window_of
    span = window_of(args)
    store = _store(args)
    findings = [] if args.recompute else recorded(store, span, args.job)
    if not findings:
        findings = recompute(store, span, args.job, _tor_of(args))
    from fabricscope.diagnosis.jobclass import class_line, job_classes
    classes = job_classes(store, span.start_ns, span.end_ns, args.job, {f.job for f in findings})
    if args.json:
        print(json.dumps({"job_class": classes, "findings": [f.to_json() for f in findings]},
                         indent=1))
        return 0
    sys.stdout.write("".join(class_line(j, p) + "\n" for j, p in sorted(classes.items())))
    if args.explain:
        for f in findings:
            sys.stdout.write(explain_one(f) + "\n")
    else:
        sys.stdout.write(findings_text(findings, show_info=args.all))
    return 0


def explain(args) -> int:
    from fabricscope.diagnosis.finding import Finding
    from fabricscope.diagnosis.present import explain as explain_one
    from fabricscope.diagnosis.store import quote
    store = _store(args)
    rows = store.query(f"SELECT * FROM finding WHERE id = {quote(args.finding_id)}")
    if not rows:
        raise UserError(f"no finding {args.finding_id!r} in the store",
                        "list them with `fabricscope diagnose --since 1h`")
    f = Finding.from_row({**rows[-1], **rows[-1].get("_tags", {})})
    sys.stdout.write(explain_one(f))
    return 0


def annotate(args) -> int:
    from fabricscope.diagnosis.timespan import parse_time
    from fabricscope.records import Record
    if not args.text.strip():
        raise UserError("the annotation text is empty", 'give a text, e.g. "raised ECN threshold"')
    store = _store(args)
    at = parse_time(args.at) if args.at else time.time_ns()
    store.write([Record("annotation", at, {"job": args.job},
                        {"text": args.text, "author": f"{getpass.getuser()}@"
                                                      f"{socket.gethostname()}"})])
    print(f"annotated job {args.job} at {time.strftime('%H:%M:%S', time.localtime(at / 1e9))}")
    return 0


def compare(args) -> int:
    from fabricscope.diagnosis import compare as cmp
    from fabricscope.diagnosis.present import compare_text
    from fabricscope.diagnosis.timespan import SECOND, Span, parse_duration, parse_range
    store = _store(args)
    if args.around:
        if args.before or args.after:
            raise UserError("--around excludes --before/--after", "give one or the other")
        at = _annotation_time(store, args.job, args.around)
        w = int(parse_duration(args.window) * SECOND)
        before, after = Span(at - w, at), Span(at, at + w)
    elif args.before and args.after:
        before, after = parse_range(args.before), parse_range(args.after)
    else:
        raise UserError("compare needs --before and --after, or --around",
                        "e.g. --around 'bucket_cap_mb' or --before T1..T2 --after T3..T4")
    results = cmp.compare_samples(cmp.samples(store, args.job, before, after))
    if all(r.n_before == 0 and r.n_after == 0 for r in results):
        raise UserError(f"the store holds no samples of job {args.job} in those windows",
                        "check --job (see `fabricscope diagnose`) and the windows")
    if args.json:
        print(json.dumps({"job": args.job, "before": [before.start_ns / SECOND,
                                                      before.end_ns / SECOND],
                          "after": [after.start_ns / SECOND, after.end_ns / SECOND],
                          "metrics": [r.to_json() for r in results]}, indent=1))
    else:
        sys.stdout.write(compare_text(args.job, before, after, results))
    return 0


def _annotation_time(store, job: str, text: str) -> int:
    from fabricscope.diagnosis.store import quote
    rows = store.query(f"SELECT text FROM annotation WHERE job = {quote(job)} OR job = '-'")
    hits = [r for r in rows if text in (r.get("text") or "")]
    if not hits:
        raise UserError(f"no annotation of job {job} contains {text!r}",
                        'write one with `fabricscope annotate --job J "..."`')
    return int(max(r["time"] for r in hits))
