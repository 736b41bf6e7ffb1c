"""Merge the writes of concurrent agent streams into InfluxDB requests of ~influx_batch_lines.

Hundreds of agents each send small batches; InfluxDB is most efficient with
~5000 lines per request. `Coalescer.write(lines)` queues the lines and returns
when the request that carried them succeeded (or raises its error). A fixed
number of writer tasks (influx_writers) each take every queued request up to
`max_lines` lines and send them as one request. No timer: while the writers
are busy, requests accumulate, so batching grows with load and costs no
latency when idle.

A merged request refused for good (HTTP 400, e.g. a field type conflict in one
batch) cannot say which batch held the bad points: each request is then written
again on its own (identical points, so harmless) so the refusal reaches only
the batch it belongs to. A temporary failure fails every merged request.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from dataclasses import dataclass, field

from fabricscope.collector.sinks.base import SinkRejected


@dataclass
class _Request:
    lines: list[str]
    future: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop()
                                   .create_future())


class Coalescer:
    def __init__(self, write, max_lines: int, writers: int):
        self._write = write                  # async (lines) -> None, raises Sink errors
        self.max_lines = max_lines
        self.writers = writers
        self._queue: collections.deque[_Request] = collections.deque()
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.requests = 0                    # sink requests made (for tests and benches)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._writer(), name=f"sink-writer-{i}")
                       for i in range(self.writers)]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._queue:
            self._queue.popleft().future.cancel()

    async def write(self, lines: list[str]) -> None:
        request = _Request(lines)
        self._queue.append(request)
        self._ready.set()
        await request.future

    def _take(self) -> list[_Request]:
        taken, total = [], 0
        while self._queue and (not taken or total + len(self._queue[0].lines) <= self.max_lines):
            request = self._queue.popleft()
            if request.future.cancelled():       # its stream went away
                continue
            taken.append(request)
            total += len(request.lines)
        return taken

    async def _writer(self) -> None:
        while True:
            if not self._queue:
                self._ready.clear()
                await self._ready.wait()
                continue
            taken = self._take()
            if taken:
                await self._send(taken)

    async def _send(self, taken: list[_Request]) -> None:
        try:
            await self._send_merged(taken)
        except asyncio.CancelledError:          # closing: nobody must wait forever
            for request in taken:
                request.future.cancel()
            raise

    async def _send_merged(self, taken: list[_Request]) -> None:
        try:
            self.requests += 1
            await self._write(list(itertools.chain.from_iterable(r.lines for r in taken)))
        except SinkRejected as exc:
            if len(taken) == 1:
                _settle(taken[0], exc)
                return
            for request in taken:            # find whose points were refused
                try:
                    self.requests += 1
                    await self._write(request.lines)
                except Exception as one:    # noqa: BLE001 (handed to the waiting stream)
                    _settle(request, one)
                else:
                    _settle(request, None)
        except Exception as exc:            # noqa: BLE001 (handed to every waiting stream)
            for request in taken:
                _settle(request, exc)
        else:
            for request in taken:
                _settle(request, None)


def _settle(request: _Request, exc: BaseException | None) -> None:
    if request.future.done():
        return
    if exc is None:
        request.future.set_result(None)
    else:
        request.future.set_exception(exc)
