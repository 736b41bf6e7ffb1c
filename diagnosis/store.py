"""The engine's window on the shared store: InfluxQL queries and line-protocol writes.

InfluxQL over `/query` is answered by InfluxDB 1.x, by 2.x through its v1
compatibility API (a DBRP mapping for the bucket) and by 3.x, so the engine
runs on any of them; writes go to `/write` (1.x, and 2.x/3.x's v1 endpoint).
Every failure is a StoreError with one line saying what answered what; the CLI
turns it into `fabricscope: error: ...; fix: ...`.
"""

from __future__ import annotations

import functools
import gzip
import http.client
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass

import msgpack

from fabricscope import lineproto
from fabricscope.errors import UserError
from fabricscope.records import Record


class StoreError(UserError):
    """The store is unreachable or refused a request."""


_CONNECTIONS = threading.local()     # each thread's kept-alive connections to stores


@dataclass(frozen=True)
class Store:
    url: str = "http://127.0.0.1:8086"
    db: str = "fabricscope"
    token: str = ""                 # InfluxDB 2.x/3.x API token (Authorization: Token ...)
    timeout_s: float = 10.0

    def _request(self, path: str, params: dict, body: bytes | None = None,
                 headers: dict | None = None, kind: list | None = None) -> bytes:
        """The answer's body (`kind`, when given, receives its Content-Type), over this
        thread's kept-alive connection to the store: a connection per request (what
        urllib makes) was a sixth of a live tick's CPU, each tick asking a dozen
        queries. A kept connection the store closed meanwhile is made again once."""
        target = f"{self._base_path()}{path}?{form_encode(params)}"
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Token {self.token}"
        method = "POST" if body is not None else "GET"
        for attempt in (0, 1):
            conn, kept = self._connection()
            try:
                conn.request(method, target, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
            except (http.client.HTTPException, OSError) as exc:
                self._drop(conn)
                if kept and attempt == 0:
                    continue
                reason = getattr(exc, "reason", None) or exc or type(exc).__name__
                raise StoreError(f"InfluxDB at {self.url} is unreachable ({reason})",
                                 "start InfluxDB or pass --influx-url URL") from None
            if resp.will_close:
                self._drop(conn)
            if resp.status >= 400:
                text = data.decode(errors="replace")[:300]
                raise StoreError(f"InfluxDB at {self.url} answered HTTP {resp.status} to "
                                 f"{path}: {_error_text(text)}", "check --influx-url, "
                                 "--database and the token")
            if kind is not None:
                kind.append(resp.headers.get("Content-Type", ""))
            return data
        raise AssertionError("unreachable")

    def _base_path(self) -> str:
        return _path_of(self.url)

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """(this thread's connection to the store, whether it served a request before)."""
        conns = _CONNECTIONS.__dict__.setdefault("by_store", {})
        key = (self.url, self.timeout_s)
        conn = conns.get(key)
        if conn is not None:
            return conn, True
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StoreError(f"InfluxDB URL {self.url!r} is not http(s)://host[:port]",
                             "pass --influx-url like http://127.0.0.1:8086")
        make = http.client.HTTPSConnection if parts.scheme == "https" else \
            http.client.HTTPConnection
        try:
            port = parts.port
        except ValueError:
            raise StoreError(f"InfluxDB URL {self.url!r} has a bad port",
                             "pass --influx-url like http://127.0.0.1:8086") from None
        conn = conns[key] = make(parts.hostname, port, timeout=self.timeout_s)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        conns = _CONNECTIONS.__dict__.get("by_store", {})
        for key in [k for k, c in conns.items() if c is conn]:
            del conns[key]

    def series(self, influxql: str) -> list[tuple[dict, list[str], list[list]]]:
        """Every series of the answer as (tags, columns, rows of values); times in ns.
        The engine's per-tick reads use this form: a dict per row cost more than the
        rest of a read together."""
        kind: list[str] = []
        body = self._request("/query", {"q": influxql, "db": self.db, "epoch": "ns"},
                             headers={"Accept": "application/x-msgpack"}, kind=kind)
        data = self._decode(body, kind[0] if kind else "")
        out = []
        for result in data.get("results", []):
            if "error" in result:
                raise StoreError(f"InfluxDB refused a query: {result['error']}",
                                 f"check that database {self.db!r} exists") from None
            for series in result.get("series", []):
                out.append((series.get("tags", {}) or {}, series["columns"],
                            series.get("values", [])))
        return out

    def _decode(self, body: bytes, content_type: str) -> dict:
        """An answer asked for as MessagePack (InfluxDB 1.6+): it decodes in about 60 %
        of the CPU of the same answer's JSON, which was a fifth of a live tick
        (bench/diagnosis_tick.py); a store that answers JSON anyway is read as JSON."""
        try:
            if content_type.startswith("application/x-msgpack"):
                return msgpack.unpackb(body) if body else {}
            return json.loads(body or b"{}")
        except (ValueError, msgpack.UnpackException):
            raise StoreError(f"InfluxDB at {self.url} answered /query with neither JSON "
                             "nor MessagePack", "check that --influx-url points at "
                             "InfluxDB") from None

    def query(self, influxql: str) -> list[dict]:
        """Rows of every series: {column: value, "_tags": {...}}; times in ns."""
        rows: list[dict] = []
        for tags, columns, values in self.series(influxql):
            for row_values in values:
                row = dict(zip(columns, row_values))
                row["_tags"] = tags
                rows.append(row)
        return rows

    def write(self, records: list[Record]) -> None:
        if not records:
            return
        body = gzip.compress(lineproto.encode_many(records), 1)
        self._request("/write", {"db": self.db, "precision": "ns"}, body,
                      {"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    def ping(self) -> None:
        """Raise StoreError unless InfluxDB answers and the database exists."""
        rows = self.query("SHOW DATABASES")
        names = {r.get("name") for r in rows}
        if names and self.db not in names:
            raise StoreError(f"InfluxDB at {self.url} has no database {self.db!r}",
                             "pass --database with the collector's influx_db")


@functools.lru_cache(maxsize=16)
def _path_of(url: str) -> str:
    return urllib.parse.urlsplit(url).path.rstrip("/")


def _error_text(text: str) -> str:
    try:
        obj = json.loads(text)
        return str(obj.get("error") or obj.get("message") or text)
    except ValueError:
        return text.strip().splitlines()[0] if text.strip() else "(no body)"


_ALWAYS_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_FORM_TABLE = {c: chr(c) if chr(c) in _ALWAYS_SAFE else "+" if c == 0x20 else f"%{c:02X}"
               for c in range(128)}


def form_encode(params: dict) -> str:
    """urllib.parse.urlencode(params) for string values, through str.translate where
    they are ASCII: urlencode quotes character by character in Python, and a tick's
    queries name every node of the job (several kB each), which made the encoding a
    few per cent of a tick's CPU."""
    return "&".join(
        f"{urllib.parse.quote_plus(str(k))}="
        + (v.translate(_FORM_TABLE) if isinstance(v, str) and v.isascii()
           else urllib.parse.quote_plus(str(v)))
        for k, v in params.items())


def quote(value: str) -> str:
    """An InfluxQL string literal ('...', with \\ and ' escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def regex_of(values) -> str:
    """/^(a|b)$/ matching exactly these tag values."""
    return _regex_of(tuple(sorted(values)))


@functools.lru_cache(maxsize=256)
def _regex_of(values: tuple[str, ...]) -> str:
    # a live tick asks for the same job's nodes in several statements each second
    return "/^(" + "|".join(re.escape(v).replace("/", "\\/") for v in values) + ")$/"
