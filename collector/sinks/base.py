"""The sink contract and what the two InfluxDB sinks share.

A sink takes records, encodes them once with fabricscope.lineproto and sends
them in chunks of `influx_batch_lines`, gzipped unless the server is on this host
(fabricscope.collector.sinks.http.on_loopback). It retries a temporary failure
`influx_retries` times, then raises SinkError (server unreachable, 5xx,
timeout: the collector spools the batch, or answers RETRY and the agent
resends) and SinkRejected when the server refused the points for good
(HTTP 400: resending cannot help). Synchronous HTTP runs on a small thread pool
so the collector's event loop never blocks on the network.
"""

from __future__ import annotations

import abc
import asyncio
from concurrent.futures import ThreadPoolExecutor

from fabricscope import lineproto
from fabricscope.errors import UserError
from fabricscope.records import Record

#: Concurrent HTTP requests per sink (one per busy agent stream, up to this many).
HTTP_THREADS = 8


class SinkError(Exception):
    """Temporary: the write may succeed if sent again later."""


class SinkRejected(Exception):
    """Permanent: the server refused these points (`records` of them, best known count)."""

    def __init__(self, message: str, records: int):
        super().__init__(message)
        self.records = records


def one_line(exc: BaseException) -> str:
    """An exception as one short line (urllib3 nests reasons in long reprs)."""
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:300]


def unreachable(url: str, reason: str) -> UserError:
    return UserError(f"cannot reach InfluxDB at {url}: {reason}", "start InfluxDB or point "
                     "--influx-url (FABRICSCOPE_COLLECTOR_INFLUX_URL) at it")


class Sink(abc.ABC):
    """async start() / write(records) / write_lines(lines) / close()."""

    def __init__(self, config):
        self.config = config
        self.url = config.influx_url.rstrip("/")
        # One thread per concurrent writer, plus the spool replay.
        threads = max(HTTP_THREADS, getattr(config, "influx_writers", 0) + 1)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="sink")

    async def start(self) -> None:
        """Check the server answers (and prepare it). Raise UserError when it does not."""
        await self._run(self._start_sync)

    async def write(self, records: list[Record]) -> None:
        await self.write_lines([lineproto.encode(r) for r in records])

    async def write_lines(self, lines: list[str]) -> None:
        """Write already-encoded lines (the collector encodes while validating).

        A temporary failure is retried `influx_retries` times (after 0.1 s, 0.2 s, ...)
        before SinkError reaches the caller: a restarting or briefly overloaded server
        then costs a short delay, not a spool round trip."""
        for chunk in lineproto.chunks(lines, self.config.influx_batch_lines):
            for attempt in range(self.config.influx_retries + 1):
                try:
                    await self._run(self._write_sync, chunk)
                    break
                except SinkError:
                    if attempt == self.config.influx_retries:
                        raise
                    await asyncio.sleep(0.1 * 2 ** attempt)

    async def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._close_sync()

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    @abc.abstractmethod
    def _start_sync(self) -> None: ...

    @abc.abstractmethod
    def _write_sync(self, lines: list[str]) -> None: ...

    def _close_sync(self) -> None:
        pass
