"""A pooled, thread-safe HTTP client for the sinks (urllib3, no retries of its own).

Retrying is the agent's job (it resends on RETRY), so each request is tried once
and failures become short one-line reasons.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

import urllib3

from fabricscope.collector.sinks.base import HTTP_THREADS, SinkError, one_line


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


def on_loopback(url: str) -> bool:
    """Whether `url` names this host (localhost, 127.0.0.0/8, ::1).

    The sinks send to such a server uncompressed: gzip only saves network bytes, which
    loopback does not carry, and costs the collector about as much per line as
    validating it (and InfluxDB its decompression)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
