"""Source "nccl_log": NCCL_DEBUG=INFO output -> records (collectives, topology, network, warnings).

Reads the files named by `nccl_log_paths` (literal paths or glob patterns such as
/var/log/train/nccl.*.log, for NCCL_DEBUG_FILE=/var/log/train/nccl.%h.%p.log;
matching files that appear later are picked up; `-` is the agent's stdin),
following each like `tail -F` from its beginning (NCCL prints the topology once,
at init). What the lines mean and which become records: agent/probes/nccl/logparse.py.
Every line is counted by outcome (record, ignored, foreign, garbled, blank) in
stats(); none is fatal. One line may give several records (a Trees line: one per
channel).

Times: a line's own timestamp when NCCL printed one (NCCL_DEBUG_TIMESTAMP_LEVELS;
by default WARN lines only), else when the agent read the line (within
`poll_interval_s` of its writing while following; replaying an old file stamps
its lines with the read time).
"""

from __future__ import annotations

import glob
import logging
import os
import stat
import time

from fabricscope.agent.probes.nccl.log_tail import FileTail, StreamTail
from fabricscope.agent.probes.nccl.logparse import BLANK, FOREIGN, GARBLED, IGNORED, RECORD, parse_line
from fabricscope.agent.probes.base import Probe, ProbeContext, ProbeUnavailable
from fabricscope.errors import UserError
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.nccl_log")

STDIN = "-"
OUTCOMES = (RECORD, IGNORED, FOREIGN, GARBLED, BLANK)


class NcclLogSource(Probe):
    name = "nccl_log"

    def __init__(self, ctx: ProbeContext, *, paths: list[str] | None = None,
                 rescan_s: float = 2.0, stdin_fd: int = 0, max_bytes_per_poll: int = 4 << 20):
        super().__init__(ctx)
        self.patterns = list(paths if paths is not None
                             else getattr(ctx.config, "nccl_log_paths", []) or [])
        self.rescan_s = rescan_s
        self.stdin_fd = stdin_fd
        self.max_bytes = max_bytes_per_poll
        self._tails: dict[str, FileTail | StreamTail] = {}
        self._last_scan = float("-inf")
        self._counts = {f"lines_{o}": 0 for o in OUTCOMES}
        self._closed = {"rotations": 0, "truncations": 0, "overlong": 0}
        self._followed = 0

    def attach(self) -> None:
        if not self.patterns:
            raise ProbeUnavailable("no NCCL log to read: set nccl_log_paths (files, glob "
                                   "patterns, or - for stdin)")
        for pattern in self.patterns:
            if pattern != STDIN and not glob.has_magic(pattern) and os.path.exists(pattern) \
                    and not stat.S_ISREG(os.stat(pattern).st_mode):
                raise UserError(f"nccl_log_paths: {pattern} is not a regular file",
                                "point it at the file NCCL_DEBUG_FILE names (or - for stdin)")
        if STDIN in self.patterns:
            self._tails[STDIN] = StreamTail(self.stdin_fd)
        self._rescan()

    def detach(self) -> None:
        for tail in self._tails.values():
            tail.close()
        self._tails.clear()

    def poll(self) -> list[Record]:
        if time.monotonic() - self._last_scan >= self.rescan_s:
            self._rescan()
        out: list[Record] = []
        for tail in list(self._tails.values()):
            lines = tail.read_lines(self.max_bytes)
            now = time.time_ns()
            for line in lines:
                outcome, records = parse_line(line, now)
                self._counts[f"lines_{outcome}"] += 1
                out += records
        return out

    def stats(self) -> dict[str, int]:
        """Counters (exported as fabricscope_agent_probe_events_total)."""
        out = dict(self._counts)
        for key in self._closed:
            out[key] = self._closed[key] + sum(getattr(t.stats, key) for t in self._tails.values())
        out["files_followed"] = self._followed
        return out

    def following(self) -> list[str]:
        """Paths followed now ("-" for stdin)."""
        return list(self._tails)

    def _rescan(self) -> None:
        self._last_scan = time.monotonic()
        present: set[str] = set()
        for pattern in self.patterns:
            if pattern == STDIN:
                continue
            matches = glob.glob(pattern) if glob.has_magic(pattern) else [pattern]
            present.update(m for m in matches if os.path.isfile(m))
        for path in sorted(present - self._tails.keys()):
            log.info("nccl_log: following %s", path)
            self._tails[path] = FileTail(path)
            self._followed += 1
        for path in [p for p in self._tails if p != STDIN and p not in present]:
            tail = self._tails[path]
            if isinstance(tail, FileTail) and not tail.finished():
                continue   # removed but not read to its end yet: next polls do
            self._retire(path)

    def _retire(self, path: str) -> None:
        tail = self._tails.pop(path)
        for key in self._closed:
            self._closed[key] += getattr(tail.stats, key)
        tail.close()
