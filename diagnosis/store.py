"""The engine's window on the shared store: InfluxQL queries and line-protocol writes.

InfluxQL over `/query` is answered by InfluxDB 1.x, by 2.x through its v1
compatibility API (a DBRP mapping for the bucket) and by 3.x, so the engine
runs on any of them; writes go to `/write` (1.x, and 2.x/3.x's v1 endpoint).
Every failure is a StoreError with one line saying what answered what; the CLI
turns it into `fabricscope: error: ...; fix: ...`.
"""

from __future__ import annotations

import gzip
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from fabricscope import lineproto
from fabricscope.errors import UserError
from fabricscope.records import Record


class StoreError(UserError):
    """The store is unreachable or refused a request."""


@dataclass(frozen=True)
class Store:
    url: str = "http://127.0.0.1:8086"
    db: str = "fabricscope"
    token: str = ""                 # InfluxDB 2.x/3.x API token (Authorization: Token ...)
    timeout_s: float = 10.0

    def _request(self, path: str, params: dict, body: bytes | None = None,
                 headers: dict | None = None) -> bytes:
        url = f"{self.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        hdrs = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Token {self.token}"
        req = urllib.request.Request(url, data=body, headers=hdrs,
                                     method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")[:300]
            raise StoreError(f"InfluxDB at {self.url} answered HTTP {exc.code} to {path}: "
                             f"{_error_text(text)}", "check --influx-url, --database and the "
                             "token") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StoreError(f"InfluxDB at {self.url} is unreachable ({reason})",
                             "start InfluxDB or pass --influx-url URL") from None

    def series(self, influxql: str) -> list[tuple[dict, list[str], list[list]]]:
        """Every series of the answer as (tags, columns, rows of values); times in ns.
        The engine's per-tick reads use this form: a dict per row cost more than the
        rest of a read together."""
        body = self._request("/query", {"q": influxql, "db": self.db, "epoch": "ns"})
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            raise StoreError(f"InfluxDB at {self.url} answered /query with no JSON",
                             "check that --influx-url points at InfluxDB") from None
        out = []
        for result in data.get("results", []):
            if "error" in result:
                raise StoreError(f"InfluxDB refused a query: {result['error']}",
                                 f"check that database {self.db!r} exists") from None
            for series in result.get("series", []):
                out.append((series.get("tags", {}) or {}, series["columns"],
                            series.get("values", [])))
        return out

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


def _error_text(text: str) -> str:
    try:
        obj = json.loads(text)
        return str(obj.get("error") or obj.get("message") or text)
    except ValueError:
        return text.strip().splitlines()[0] if text.strip() else "(no body)"


def quote(value: str) -> str:
    """An InfluxQL string literal ('...', with \\ and ' escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def regex_of(values) -> str:
    """/^(a|b)$/ matching exactly these tag values."""
    return "/^(" + "|".join(re.escape(v).replace("/", "\\/") for v in sorted(values)) + ")$/"
