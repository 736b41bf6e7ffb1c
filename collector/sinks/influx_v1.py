"""InfluxDB 1.x sink: POST line protocol to /write?db=...&precision=ns, gzipped unless
InfluxDB is on this host (fabricscope.collector.sinks.http.on_loopback).

Creates the database at start (`CREATE DATABASE` is a no-op when it exists) and
again when a write finds it gone. Status mapping: 204 written; 400 refused for
good (bad points; InfluxDB writes the good lines of the request and says
`dropped=N`); 404 database not found: recreate it and ask for a resend;
anything else and network failures are temporary.
"""

from __future__ import annotations

import gzip
import json
import re
import urllib.parse

from fabricscope.collector.sinks.base import Sink, SinkError, SinkRejected, one_line, unreachable
from fabricscope.collector.sinks.http import Http, on_loopback

_DROPPED = re.compile(r"dropped=(\d+)")


def influx_error(body: bytes | str) -> str:
    """InfluxDB's JSON {"error": "..."} (v2: {"message": "..."}) body as one line."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        obj = json.loads(text)
        return one_line(Exception(obj.get("error") or obj["message"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return one_line(Exception(text[:300]))


class InfluxV1Sink(Sink):
    def __init__(self, config):
        super().__init__(config)
        self._http = Http(config.influx_timeout_s)
        self._write_url = f"{self.url}/write?" + urllib.parse.urlencode(
            {"db": config.influx_db, "precision": "ns"})
        self._need_database = True
        self.gzip = not on_loopback(self.url)

    def _start_sync(self) -> None:
        try:
            status, body = self._http.request("GET", self.url + "/ping")
        except SinkError as exc:
            raise unreachable(self.url, str(exc)) from None
        if status != 204:
            raise unreachable(self.url, f"/ping answered HTTP {status} (is it InfluxDB 1.x?)")
        try:
            self._create_database()
        except SinkError as exc:
            raise unreachable(self.url, str(exc)) from None

    def _create_database(self) -> None:
        name = self.config.influx_db.replace("\\", "\\\\").replace('"', '\\"')
        query = urllib.parse.urlencode({"q": f'CREATE DATABASE "{name}"'})
        status, body = self._http.request("POST", f"{self.url}/query?{query}")
        if status != 200 or b'"error"' in body:
            raise SinkError(f"CREATE DATABASE {self.config.influx_db} failed: "
                            f"HTTP {status} {influx_error(body)}")
        self._need_database = False

    def _write_sync(self, lines: list[str]) -> None:
        if self._need_database:
            self._create_database()
        body = "\n".join(lines).encode()
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self.gzip:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        status, answer = self._http.request("POST", self._write_url, body=body, headers=headers)
        if status == 204:
            return
        text = influx_error(answer)
        if status == 400:
            dropped = _DROPPED.search(text)
            count = int(dropped.group(1)) if dropped and int(dropped.group(1)) else len(lines)
            raise SinkRejected(f"InfluxDB refused points: {text}", count)
        if status == 404 and "database not found" in text:
            self._need_database = True
        raise SinkError(f"InfluxDB answered HTTP {status}: {text}")

    def _close_sync(self) -> None:
        self._http.close()
