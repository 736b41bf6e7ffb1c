"""Source `synthetic`: numbered records at a fixed rate. A load generator, not a probe.

Used by the transport tests and benchmarks (and usable against a real
collector to size it): `fabricscope agent --probes synthetic --synthetic-rate
5000 --synthetic-count 100000`. Record n of a run is a `synthetic` point
(fabricscope/measurements/synthetic.py) with field n, tag stream=0 and the
timestamp base + n / rate, where base is the run's start. Each poll produces
every record whose time has come (at most MAX_PER_POLL), up to synthetic_count.

Resuming after a crash. With a spool directory, the source keeps
`<spool_dir>/synthetic.json`: base and the first record not yet durably
spooled. The shipper calls `durable(records)` once it has fsynced a batch; only
then does the resume point move. A restarted agent (after SIGKILL too)
continues from there: records produced but not yet spooled when the previous
run died are produced again, identical to the lost ones, and records that were
spooled are resent from the spool, not produced again. So every record of the
run reaches InfluxDB, and a record that happens to travel twice rewrites the
same point: `count(n)` per node equals synthetic_count exactly. Records whose
time fell while the agent was down are produced at restart (catch-up), at most
MAX_PER_POLL per poll. Without a spool directory there is nothing to resume:
every start is a new run.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from fabricscope.agent.probes.base import Probe
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.synthetic")

STATE_FILE = "synthetic.json"
MAX_PER_POLL = 50_000


def value_of(n: int) -> float:
    """A deterministic payload: the same n always carries the same value."""
    return ((n * 2654435761) % 1_000_003) / 1_000_003


def make_record(n: int, base_ns: int, period_ns: int, stream: str = "0") -> Record:
    return Record("synthetic", base_ns + n * period_ns, {"stream": stream},
                  {"n": n, "value": value_of(n)})


class SyntheticSource(Probe):
    name = "synthetic"

    def __init__(self, ctx):
        super().__init__(ctx)
        cfg = ctx.config
        self.period_ns = max(1, int(round(1e9 / cfg.synthetic_rate)))
        self.count = cfg.synthetic_count
        spool = cfg.spool_path() if cfg.collector else ""
        self.state_path = Path(spool) / STATE_FILE if spool else None
        self.base_ns = 0
        self.next = 0              # next record to produce
        self.durable_next = 0      # first record not yet durably spooled
        self.produced = 0          # records produced by this process

    def attach(self) -> None:
        state = self._load()
        if state:
            self.base_ns, self.durable_next = state
            log.info("synthetic: resuming run of %d at record %d", self.base_ns,
                     self.durable_next)
        else:
            self.base_ns = time.time_ns()
        self.next = self.durable_next
        self._save()

    def poll(self) -> list[Record]:
        due = (time.time_ns() - self.base_ns) // self.period_ns + 1
        if self.count:
            due = min(due, self.count)
        end = min(due, self.next + MAX_PER_POLL)
        out = [make_record(n, self.base_ns, self.period_ns) for n in range(self.next, end)]
        self.produced += len(out)
        self.next = max(self.next, end)
        return out

    def durable(self, records: list[Record]) -> None:
        """Called by the shipper after it spooled these records (in production order)."""
        mine = [r.fields["n"] for r in records if r.measurement == "synthetic"]
        if mine and max(mine) + 1 > self.durable_next:
            self.durable_next = max(mine) + 1
            self._save()

    def stats(self) -> dict[str, int]:
        return {"produced": self.produced, "next": self.next}

    def _load(self) -> tuple[int, int] | None:
        if self.state_path is None:
            return None
        try:
            data = json.loads(self.state_path.read_text())
            return int(data["base_ns"]), int(data["next"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("synthetic: ignoring unreadable %s (%s); starting a new run",
                        self.state_path, exc)
            return None

    def _save(self) -> None:
        if self.state_path is None:
            return
        # Atomic replace; no fsync: after a power loss an older resume point only makes
        # records be produced again, which rewrites the same points.
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_name(STATE_FILE + ".part")
        tmp.write_text(json.dumps({"base_ns": self.base_ns, "next": self.durable_next}))
        os.replace(tmp, self.state_path)
