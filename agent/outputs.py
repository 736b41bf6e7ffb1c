"""Local outputs of the pipeline (the collector shipper lives in agent/shipper.py).

`--output jsonl`: every record as one JSON object per line on stdout
(Record.to_json), flushed per batch; logs go to stderr, so stdout stays
machine-readable. When stdout goes away (reader exited), the output disables
itself, logs one line and counts the records it could not write.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.outputs")


class JsonlOutput:
    def __init__(self, metrics, stream: TextIO | None = None):
        self.metrics = metrics
        self.stream = stream if stream is not None else sys.stdout
        self._broken = False

    async def send(self, batch: list[Record]) -> None:
        if self._broken:
            self.metrics.records_dropped.labels("stdout_closed").inc(len(batch))
            return
        try:
            self.stream.write("".join(r.to_json() + "\n" for r in batch))
            self.stream.flush()
        except (BrokenPipeError, ValueError) as exc:   # ValueError: stream closed
            self._broken = True
            self.metrics.records_dropped.labels("stdout_closed").inc(len(batch))
            log.warning("jsonl output stopped: stdout is closed (%s)", type(exc).__name__)

    async def close(self) -> None:
        try:
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass
