"""Time windows on the command line: `--since 15m`, `--start T --end T`, `T1..T2`.

A time is UNIX seconds (`1796160039.9`), an ISO 8601 date-time (`2026-12-01T21:40:00`,
local time unless it carries an offset or Z), or `now`; a duration is a number
with s, m, h or d (`90s`, `15m`). Errors are one-line UserErrors naming the text.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime

from fabricscope.errors import UserError

SECOND = 1_000_000_000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Span:
    start_ns: int
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / SECOND

    def __str__(self) -> str:
        return f"{_fmt(self.start_ns)} .. {_fmt(self.end_ns)}"


def _fmt(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / SECOND))


def parse_duration(text: str) -> float:
    m = _DURATION.match(text or "")
    if not m:
        raise UserError(f"duration {text!r} is not valid", "give e.g. 90s, 15m, 2h or 1d")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_time(text: str, now_ns: int | None = None) -> int:
    now_ns = time.time_ns() if now_ns is None else now_ns
    text = (text or "").strip()
    if text == "now":
        return now_ns
    try:
        return int(float(text) * SECOND)
    except ValueError:
        pass
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * SECOND)
    except ValueError:
        raise UserError(f"time {text!r} is not valid",
                        "give UNIX seconds, an ISO date-time (2026-12-01T21:40:00) or now"
                        ) from None


def parse_range(text: str, now_ns: int | None = None) -> Span:
    """`T1..T2` -> Span."""
    if ".." not in (text or ""):
        raise UserError(f"range {text!r} is not T1..T2",
                        "give e.g. 2026-12-01T21:40:00..2026-12-01T21:45:00")
    a, b = text.split("..", 1)
    return ordered(parse_time(a, now_ns), parse_time(b, now_ns))


def ordered(start_ns: int, end_ns: int) -> Span:
    if end_ns <= start_ns:
        raise UserError("the window ends before it starts", "give an end after the start")
    return Span(start_ns, end_ns)


def window_of(args, now_ns: int | None = None, default: str = "15m") -> Span:
    """The window of --since, or --start/--end (each defaulting sensibly)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    start, end = getattr(args, "start", None), getattr(args, "end", None)
    since = getattr(args, "since", None)
    if since and (start or end):
        raise UserError("--since and --start/--end exclude each other", "give one of them")
    if start or end:
        end_ns = parse_time(end, now_ns) if end else now_ns
        start_ns = parse_time(start, now_ns) if start else end_ns - int(
            parse_duration(default) * SECOND)
        return ordered(start_ns, end_ns)
    return ordered(now_ns - int(parse_duration(since or default) * SECOND), now_ns)


def add_window_arguments(parser, default: str = "15m") -> None:
    parser.add_argument("--since", metavar="DURATION",
                        help=f"the last DURATION (e.g. 15m; default {default})")
    parser.add_argument("--start", metavar="T", help="window start (UNIX s or ISO time)")
    parser.add_argument("--end", metavar="T", help="window end (default now)")
