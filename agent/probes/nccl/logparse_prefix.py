"""The prefix of an NCCL_DEBUG line, and whatever a launcher put before it.

NCCL's own prefix (src/debug.cc, ncclDebugLogInternal):

    [timestamp] host:pid:tid [cudaDev] NCCL INFO <message>
    [timestamp] host:pid:tid [cudaDev] file.cc:line (func) NCCL WARN <message>

Launchers and log shippers prepend their own text, which is kept as `head` and
read where its form is known: Ray `(RayTrainWorker pid=615, ip=10.72.7.6) ` (the
innermost of nested actor prefixes wins), torchrun `[rank0]:`, Open MPI
`--tag-output` `[1,3]<stdout>:`; others (pdsh `node: `, Python logging, CloudWatch
`| 2024-12-04T05:27:48.128Z | `) stay text. The NCCL prefix is searched where a
token can start (line start, or after a space, `:`, `>`, `]`, `)` or `|`), which
keeps the search linear on hostile lines.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from enum import StrEnum

_PREFIX = re.compile(
    r"(?:^|(?<=[\s:>\])|]))(?:\[(?P<ts>[^\]]{1,64})\] )?"
    r"(?P<host>[^\s:\[\]()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] "
    r"(?:(?P<file>\S+):(?P<line>\d+)(?: \((?P<func>[^)]*)\))? NCCL (?P<wlevel>WARN)"
    r"|NCCL (?P<level>INFO|TRACE))(?: (?P<msg>.*))?$")
_RAY = re.compile(r"\((?:(?P<name>\w+) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^)\s]+))?\)")
_TORCHRUN = re.compile(r"\[rank(?P<rank>\d+)\]:")
_MPIRUN = re.compile(r"\[(?P<job>\d+),(?P<rank>\d+)\]<std(?:out|err)>:")


class Garbled(ValueError):
    """A line of a recognised kind whose numbers cannot be values (outcome GARBLED)."""


#: InfluxDB integers are int64: a number outside cannot be a field or a tag we trust
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def to_int(text: str, base: int = 10) -> int:
    """int(text) for a number a regex matched, as an int64; Garbled otherwise.
    Digit runs are checked by length first: Python refuses to convert strings of
    over 4,300 digits (ValueError), and a corrupted or hostile log may carry one."""
    if len(text.lstrip("-")) > (19 if base == 10 else 16):
        raise Garbled(f"number of {len(text)} characters")
    value = int(text, base)
    if not INT64_MIN <= value <= INT64_MAX:
        raise Garbled(f"number {value} outside int64")
    return value


def to_u64(hex_text: str) -> int:
    """A 64-bit hash printed with %llx (NCCL's commId): any value up to 2^64 - 1."""
    if len(hex_text) > 16:
        raise Garbled(f"hash of {len(hex_text)} hex digits")
    return int(hex_text, 16)


class LauncherKind(StrEnum):
    RAY = "ray"
    TORCHRUN = "torchrun"
    MPIRUN = "mpirun"


@dataclass(frozen=True)
class Launcher:
    """What a launcher's prefix says about the process that printed the line."""

    kind: LauncherKind
    name: str | None = None      # Ray actor class (RayTrainWorker, RayWorkerWrapper)
    pid: int | None = None       # Ray's pid=
    ip: str | None = None        # Ray's ip=
    rank: int | None = None      # torchrun's [rankN], Open MPI's [job,rank]


@dataclass(frozen=True)
class LogLine:
    """An NCCL line split into its prefix and message."""

    time_ns: int | None        # from the line's timestamp, when it has one
    host: str
    pid: int
    tid: int
    cuda_dev: int
    level: str                 # INFO, WARN or TRACE
    file: str | None           # WARN only
    line: int | None
    func: str | None
    message: str
    head: str = ""             # text before NCCL's prefix (a launcher's, a shipper's)
    launcher: Launcher | None = None


def parse_timestamp(text: str) -> int | None:
    """NCCL's default "%F %T" (optionally with .fraction), local time -> epoch ns."""
    m = re.match(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,9}))?$", text.strip())
    if not m:
        return None
    try:
        secs = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None
    frac = m.group(2) or ""
    return int(secs) * 1_000_000_000 + int(frac.ljust(9, "0") or 0)


def read_launcher(head: str) -> Launcher | None:
    """The launcher a line's head names, when its form is known."""
    if not head:
        return None
    if rays := list(_RAY.finditer(head)):
        m = rays[-1]
        return Launcher(LauncherKind.RAY, m.group("name"), to_int(m.group("pid")), m.group("ip"))
    if m := _TORCHRUN.search(head):
        return Launcher(LauncherKind.TORCHRUN, rank=to_int(m.group("rank")))
    if m := _MPIRUN.search(head):
        return Launcher(LauncherKind.MPIRUN, rank=to_int(m.group("rank")))
    return None


def split_line(text: str) -> LogLine | None:
    """The prefix fields of an NCCL line; None when the line is not one."""
    text = text.rstrip("\r\n")
    m = _PREFIX.search(text)
    if not m:
        return None
    ts = parse_timestamp(m.group("ts")) if m.group("ts") is not None else None
    head = text[:m.start()].strip()
    return LogLine(ts, m.group("host"), to_int(m.group("pid")), to_int(m.group("tid")),
                   to_int(m.group("dev")), m.group("wlevel") or m.group("level"),
                   m.group("file"), to_int(m.group("line")) if m.group("line") else None,
                   m.group("func"), (m.group("msg") or "").strip(), head, read_launcher(head))
