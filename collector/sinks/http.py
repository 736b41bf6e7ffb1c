"""A pooled, thread-safe HTTP client for the sinks (urllib3, no retries of its own).

Retrying is the agent's job (it resends on RETRY), so each request is tried once
and failures become short one-line reasons.
"""

from __future__ import annotations

import urllib3

from collector.sinks.base import HTTP_THREADS, SinkError, one_line


def reason(exc: BaseException) -> str:
    """The most useful one-line cause: the OS error ("Connection refused") if any."""
    chain, seen = [], exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    for err in chain:
        if isinstance(err, OSError) and err.strerror:
            return err.strerror
    # urllib3 2.x makes NewConnectionError a TimeoutError: check timeouts only after OS errors.
    if any(isinstance(err, (urllib3.exceptions.TimeoutError, TimeoutError)) for err in chain):
        return "timed out"
    return one_line(exc)


class Http:
    def __init__(self, timeout_s: float):
        self._pool = urllib3.PoolManager(maxsize=HTTP_THREADS, retries=False,
                                         timeout=urllib3.Timeout(total=timeout_s))

    def request(self, method: str, url: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        """(status, body). Raise SinkError when no HTTP answer came back."""
        try:
            resp = self._pool.request(method, url, body=body, headers=headers)
        except urllib3.exceptions.HTTPError as exc:
            raise SinkError(reason(exc)) from None
        return resp.status, resp.data

    def close(self) -> None:
        self._pool.clear()
