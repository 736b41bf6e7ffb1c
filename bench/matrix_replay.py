"""Replay a diagnosis-matrix dump through the engine as it is now.

    FABRICSCOPE_MATRIX_DUMP=/tmp/dump python -m fabricscope.bench.diagnosis_matrix --set dev --runs 12
    python -m fabricscope.bench.matrix_replay /tmp/dump/*.json.gz

A dump (bench/scenarios._dump_data, gzipped JSON) holds a scenario's raw measurements as the store
answered them, the lab's node-to-ToR map and the fault's onset. Each is loaded
into a fresh influxd on loopback (every column typed by fabricscope.schema, tags
apart from fields), `diagnose --recompute`'s engine runs over it, and its
warnings are judged as the matrix judges the live engine's: so a change to the
engine can be tried on a run's real evidence in seconds instead of a lab run.
The live engine read the same rows as they arrived; replay gives each second
once it is over, so first_seen can differ from the live run's by a second or so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from fabricscope.diagnosis.evidence import SECOND
from fabricscope.errors import UserError
from fabricscope.records import Record
from fabricscope.schema import measurements
from fabricscope.services import InfluxServer

DB = "fabricscope"


def records_of(dump: dict) -> list[Record]:
    out = []
    for name, spec in measurements().items():
        if name == "finding":
            continue
        tags = spec.all_tags()
        for row in dump.get(name, []):
            fields = {}
            for key, value in row.items():
                if key in ("time", "_tags") or key in tags or value is None:
                    continue
                f = spec.fields.get(key)
                fields[key] = f.type(value) if f is not None and f.type in (int, float) \
                    else value
            if fields:
                out.append(Record(name, int(row["time"]), {k: str(row[k]) for k in tags
                                                           if row.get(k) not in (None, "")},
                                  fields))
    return out


def replay_dump(path: str, influx: InfluxServer) -> dict:
    from fabricscope.diagnosis.cli import recompute
    from fabricscope.diagnosis.finding import Finding
    from fabricscope.diagnosis.store import Store
    from fabricscope.diagnosis.timespan import Span
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
        dump = json.load(fh)
    influx.query(f"DROP DATABASE {DB}")
    influx.query(f"CREATE DATABASE {DB}")
    store = Store(influx.url, DB)
    records = records_of(dump)
    for i in range(0, len(records), 5000):
        store.write(records[i:i + 5000])
    tors = {n["name"]: n.get("tor") for n in dump["nodes"]}
    times = [r.time_ns for r in records]
    onset = next((e["ns"] for e in dump["events"] if e["event"] == "on"), 0)
    job = dump["outcome"]["job"]
    live = [Finding.from_row({**r, **r.get("_tags", {})}) for r in dump.get("finding", [])
            if r.get("job") == job or r.get("_tags", {}).get("job") == job]
    found = recompute(store, Span(min(times), max(times) + SECOND), job, tors.get)
    return {"scenario": dump["outcome"]["scenario"], "params": dump["outcome"]["params"],
            "live": [_brief(f, onset) for f in live], "replay": [_brief(f, onset) for f in found],
            "sentences": [(str(f.cause), f.summary) for f in found],
            "judged": _judged(dump, found, onset, store, max(times))}


def _judged(dump: dict, found: list, onset_ns: int, store, end_ns: int):
    """The replay's findings judged as bench/scenarios.judge judges the live ones, and
    the scenario's compare (around the clearing; the healthy job against itself) run
    again on its samples."""
    from fabricscope.bench.scenarios import Expect, Outcome, Scenario, assess
    o = dump["outcome"]
    # of two faults only the first must be named (bench/scenarios.py: the cost of each
    # alone is not measured), whatever the dump's judge of the time required
    sc = Scenario(o["scenario"], [], [Expect(e["cause"], e["place"],
                                             e.get("required", True) and i == 0)
                                      for i, e in enumerate(o["expected"])],
                  cleared=o["scenario"] == "cleared" or bool(o.get("clear_ns")))
    out = Outcome(o["scenario"], o["params"], o["job"], onset_ns=onset_ns,
                  clear_ns=o.get("clear_ns") or 0, seed=o.get("seed"), lab=o.get("lab", {}),
                  cost=o.get("cost"))
    assess(out, sc, found, store, 0, end_ns)
    return out


def warnings_of(out: dict) -> list[tuple]:
    """The replay's warnings (no info findings): (cause, place, severity), sorted."""
    return sorted({(str(c), w, s) for c, w, s, *_ in out["replay"] if s != "info"})


def record(folder: str, influx: InfluxServer) -> int:
    """Write folder/expected.json: each dump's faults and the warnings the engine now
    gives it (tests/unit/test_diagnosis_corpus.py holds the engine to them)."""
    expected = {}
    for path in sorted(Path(folder).glob("*.json.gz")):
        out = replay_dump(str(path), influx)
        judged = out["judged"]
        expected[path.name] = {"params": out["params"], "expected": judged.expected,
                               "warnings": warnings_of(out), "right": judged.ok}
        print(f"{path.name}: {'right' if judged.ok else 'WRONG'} {warnings_of(out)}")
    (Path(folder) / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    return 0


def _brief(f, onset_ns: int) -> tuple:
    """(cause, place, severity, first_seen after the onset, seconds of bad evidence)."""
    return (str(f.cause), f.where, f.severity,
            round((f.first_seen_ns - onset_ns) / 1e9, 2) if onset_ns else None,
            round(((f.end_ns or f.last_seen_ns) - f.start_ns) / 1e9, 1))


def _step(compare: dict) -> str:
    s = compare.get("step_time", {})
    drift = ", ".join(f"{d:+.3f}" for d in s.get("drift") or [] if d is not None)
    return (f"{s.get('verdict')} ({s.get('change_pct') or 0:+.1f} %, p_holm "
            f"{s.get('p_holm') or 0:.3g}, drift {drift}); all verdicts "
            f"{sorted({v['verdict'] for v in compare.values()})}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dumps", nargs="*", help="JSON files written by a matrix run with "
                        "FABRICSCOPE_MATRIX_DUMP set (.json or .json.gz)")
    parser.add_argument("--json", metavar="FILE", help="also write the replayed runs and their "
                        "summary to FILE, as bench.diagnosis_matrix --json does (docs/"
                        "DIAGNOSIS.md renders it)")
    parser.add_argument("--record", metavar="FOLDER", help="write FOLDER/expected.json from "
                        "the engine's findings over FOLDER's dumps")
    args = parser.parse_args(argv)
    if args.record:
        with InfluxServer() as influx:
            return record(args.record, influx)
    if not args.dumps:
        parser.error("give dumps to replay, or --record FOLDER")
    right, latency, failed, outcomes = 0, [], [], []
    with InfluxServer() as influx:
        for path in args.dumps:
            try:
                out = replay_dump(path, influx)
            except UserError as exc:          # one dump the store could not replay
                failed.append(path)
                print(f"{path}: not replayed: {exc.one_line()}")
                continue
            judged = out["judged"]
            outcomes.append(judged)
            right += judged.ok
            latency += judged.latency_s
            print(f"{out['scenario']} ({out['params']}): "
                  f"{'right' if judged.ok else 'WRONG'}, false alarms {judged.false_alarms}, "
                  f"moved {judged.moved}" + (f"; compare step time {_step(judged.compare)}"
                                             if judged.compare else ""))
            print(f"  live:   {out['live']}")
            print(f"  replay: {out['replay']}")
    latency.sort()
    print(f"\nreplay: {right}/{len(args.dumps) - len(failed)} right; onset -> first_seen "
          f"median {latency[len(latency) // 2] if latency else None} s, max "
          f"{latency[-1] if latency else None} s" +
          (f"; {len(failed)} not replayed: {' '.join(failed)}" if failed else ""))
    if args.json and outcomes:
        write_results(args.json, outcomes, args.dumps)
    return 1 if failed else 0


def write_results(path: str, outcomes: list, dumps: list[str]) -> None:
    """The replayed runs as a results file (fabricscope.bench.diagnosis_matrix.read_results), with
    the command that replays them again."""
    from fabricscope.bench.diagnosis_matrix import summarize
    dumps = sorted({str(Path(d).parent) for d in dumps})
    command = ("python -m fabricscope.bench.matrix_replay " + " ".join(f"{d}/*.json.gz" for d in dumps)
               + f" --json {path}")
    with open(path, "w") as fh:
        json.dump({"summary": summarize(outcomes), "runs": [o.to_dict() for o in outcomes],
                   "command": command, "replayed": True}, fh, indent=1)
        fh.write("\n")


if __name__ == "__main__":
    sys.exit(main())
