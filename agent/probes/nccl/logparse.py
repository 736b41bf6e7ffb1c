"""Parse NCCL_DEBUG=INFO output into records: pure functions, no I/O.

Line layout (NCCL src/debug.cc, ncclDebugLogInternal):

    [timestamp] host:pid:tid [cudaDev] NCCL INFO <message>
    [timestamp] host:pid:tid [cudaDev] file.cc:line (func) NCCL WARN <message>

The timestamp (strftime NCCL_DEBUG_TIMESTAMP_FORMAT, default "[%F %T] ", local
time) is printed only for the levels in NCCL_DEBUG_TIMESTAMP_LEVELS, by default
WARN only; WARN lines also start with an empty line. Messages recognised (format
strings from the NCCL sources named in each pattern's comment) become records;
other NCCL lines are `ignored`, lines without the NCCL prefix `foreign`, and NCCL
lines of a recognised kind that do not parse `garbled`. Nothing here raises on
bad input.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from fabricscope import busbw
from fabricscope.records import Record

#: outcome of one line
RECORD, IGNORED, FOREIGN, GARBLED, BLANK = "record", "ignored", "foreign", "garbled", "blank"

_PREFIX = re.compile(
    r"^(?:\[(?P<ts>[^\]]*)\] )?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] "
    r"(?:(?P<file>\S+):(?P<line>\d+)(?: \((?P<func>[^)]*)\))? NCCL (?P<wlevel>WARN)"
    r"|NCCL (?P<level>INFO|TRACE))(?: (?P<msg>.*))?$")

# enqueue.cc: "%s: opCount %lx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d
#              comm %p [nranks=%d] stream %p"
_COLL_START = re.compile(r"^\w+: opCount ")
_COLL = re.compile(
    r"^(?P<op>\w+): opCount (?P<opc>[0-9a-f]+) sendbuff (?P<sb>\S+) recvbuff (?P<rb>\S+) "
    r"count (?P<count>\d+) datatype (?P<dt>-?\d+) op (?P<redop>-?\d+) root (?P<root>-?\d+) "
    r"comm (?P<comm>\S+)(?: \[nranks=(?P<nranks>\d+)\])? stream (?P<stream>\S+)$")
# transport/{net,p2p,shm}.cc: "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d..."
_CHANNEL = re.compile(
    r"^Channel (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<sr>\d+)\[(?P<sd>-?\d+)\] -> "
    r"(?P<dr>\d+)\[(?P<dd>-?\d+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>\S.*)$")
# graph/rings.cc dumpLine: "Channel %02d/%02d :" then " %d" per rank in ring order
_RING_ORDER = re.compile(
    r"^Channel (?P<ch>\d+)/(?P<n>\d+) :(?P<order>(?: +\d+)+)(?P<more>\.\.\.)?$")
# init.cc: "Ring %02d : %d -> %d -> %d"
_RING = re.compile(r"^Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>\d+) -> (?P<next>-?\d+)$")
# transport/net_socket.cc
_SOCK_THREADS = re.compile(
    r"^NET/Socket: Using (?P<t>\d+) threads and (?P<s>\d+) sockets per thread$")
_SOCK_DEVS = re.compile(r"^NET/Socket : Using(?P<devs>(?: \[\d+\]\S+)+)$")
# transport/net_ib/init.cc: "NET/IB : Using%s %s; OOB %s:%s"
_IB_DEVS = re.compile(r"^NET/IB : Using(?P<devs>(?: \[\d+\]\S+)+) ?(?:\[RO\])?; OOB (?P<oob>\S+)$")
# init.cc: "Using network %s"
_NETWORK = re.compile(r"^Using network (?P<net>\S+)$")
# init.cc: "[Rank %d] %s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId %lx commId 0x%llx
#           - Init START" and the COMPLETE variants (parent ... color ... key for children)
_INIT_START = re.compile(r"^(?:\[Rank \d+\] )?(?:\w+ )?comm \S+ rank ")
_INIT = re.compile(
    r"^(?:\[Rank \d+\] )?(?:(?P<func>nccl\w+) )?comm (?P<comm>\S+) rank (?P<rank>\d+) "
    r"nranks (?P<nranks>\d+) cudaDev (?P<cd>-?\d+) nvmlDev (?P<nd>-?\d+) busId (?P<bus>[0-9a-f]+) "
    r"(?:commId 0x(?P<cid>[0-9a-f]+)|parent (?P<parent>\S+) childCount \d+ color (?P<color>-?\d+) "
    r"key (?P<key>-?\d+)) - Init (?P<what>START|COMPLETE)$")
# include/checks.h NCCLCHECK et al.: INFO "%s:%d (%s) -> %d" (older NCCL: "%s:%d -> %d")
_TRACE = re.compile(r"^(?P<file>[\w./-]+\.\w+):(?P<line>\d+)(?: \((?P<func>[^)]*)\))? "
                    r"-> (?P<code>\d+)(?P<rest>.*)$")
# transport/net_ib: "with status=%s(%d)" (2.2x+), "with status=%d" (GIN), "with error %d," (<2.20)
_IB_STATUS = re.compile(r"with (?:status=(?:(?P<name>IBV_WC_\w+)\()?(?P<code>\d+)\)?"
                        r"|error (?P<old>\d+),)")

#: enum ibv_wc_status (rdma-core verbs.h)
IBV_WC_STATUS = ("SUCCESS LOC_LEN_ERR LOC_QP_OP_ERR LOC_EEC_OP_ERR LOC_PROT_ERR WR_FLUSH_ERR "
                 "MW_BIND_ERR BAD_RESP_ERR LOC_ACCESS_ERR REM_INV_REQ_ERR REM_ACCESS_ERR "
                 "REM_OP_ERR RETRY_EXC_ERR RNR_RETRY_EXC_ERR LOC_RDD_VIOL_ERR REM_INV_RD_REQ_ERR "
                 "REM_ABORT_ERR INV_EECN_ERR INV_EEC_STATE_ERR FATAL_ERR RESP_TIMEOUT_ERR "
                 "GENERAL_ERR").split()


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


def split_line(text: str) -> LogLine | None:
    """The prefix fields of an NCCL line; None when the line is not one."""
    m = _PREFIX.match(text.rstrip("\r\n"))
    if not m:
        return None
    ts = parse_timestamp(m.group("ts")) if m.group("ts") is not None else None
    return LogLine(ts, m.group("host"), _int(m.group("pid")), _int(m.group("tid")),
                   _int(m.group("dev")), m.group("wlevel") or m.group("level"), m.group("file"),
                   _int(m.group("line")) if m.group("line") else None, m.group("func"),
                   m.group("msg") or "")


class Garbled(ValueError):
    """A line of a recognised kind whose numbers cannot be values (outcome GARBLED)."""


#: InfluxDB integers are int64: a number outside cannot be a field or a tag we trust
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _int(text: str, base: int = 10) -> int:
    """int(text) for a number the regexes matched, as an int64; Garbled otherwise.
    Digit runs are checked by length first: Python refuses to convert strings of
    over 4,300 digits (ValueError), and a corrupted or hostile log may carry one."""
    if len(text.lstrip("-")) > (19 if base == 10 else 16):
        raise Garbled(f"number of {len(text)} characters")
    value = int(text, base)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise Garbled(f"number {value} outside int64")
    return value


def _ptr(text: str) -> str:
    """%p as glibc prints it: 0x... or (nil)."""
    return "0x0" if text == "(nil)" else text


def _rec(measurement: str, ll: LogLine, now_ns: int, tags: dict, fields: dict) -> Record:
    for name, value in fields.items():          # derived sizes (count x element) too
        if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
            raise Garbled(f"{name} {value} outside int64")
    return Record(measurement, ll.time_ns or now_ns,
                  {"host": ll.host, "pid": str(ll.pid), **tags}, fields)


def _coll(ll: LogLine, now_ns: int, m: re.Match) -> Record:
    op, dt, count = m.group("op"), _int(m.group("dt")), _int(m.group("count"))
    fields: dict = {"op_count": _int(m.group("opc"), 16), "count": count,
                    "root": _int(m.group("root")), "stream": _ptr(m.group("stream")),
                    "tid": ll.tid}
    nranks = _int(m.group("nranks")) if m.group("nranks") else None
    if nranks is not None:
        fields["nranks"] = nranks
    size = busbw.datatype_size(dt)
    if size is not None:
        fields["bytes"] = count * size
        if op in busbw.OPS and (nranks is None or nranks >= 1):
            total = busbw.message_bytes(op, count, size, nranks)
            if total is not None:
                fields["size_bytes"] = total
    tags = {"op": op, "datatype": busbw.datatype_name(dt),
            "redop": busbw.redop_name(_int(m.group("redop"))), "comm": _ptr(m.group("comm"))}
    return _rec("nccl_log_coll", ll, now_ns, tags, fields)


def _channel(ll: LogLine, now_ns: int, m: re.Match) -> Record:
    via = m.group("via").strip()
    fields = {"channel": _int(m.group("ch")), "src_rank": _int(m.group("sr")),
              "src_dev": _int(m.group("sd")), "dst_rank": _int(m.group("dr")),
              "dst_dev": _int(m.group("dd")), "via": via}
    if m.group("conn") is not None:
        fields["conn"] = _int(m.group("conn"))
    tags = {"kind": "channel", "transport": via.split("/", 1)[0],
            "direction": m.group("dir") or "-"}
    return _rec("nccl_topology", ll, now_ns, tags, fields)


def _init(ll: LogLine, now_ns: int, m: re.Match) -> Record:
    tags = {"event": "init_" + m.group("what").lower(), "comm": _ptr(m.group("comm"))}
    if m.group("cid"):
        tags["comm_id"] = f"0x{_int(m.group('cid'), 16):x}"   # as the nccl probe writes it
    fields: dict = {"rank": _int(m.group("rank")), "nranks": _int(m.group("nranks")),
                    "cuda_dev": _int(m.group("cd")), "nvml_dev": _int(m.group("nd")),
                    "bus_id": m.group("bus")}
    if m.group("func"):
        fields["func"] = m.group("func")
    if m.group("parent"):
        fields.update(parent=_ptr(m.group("parent")), color=_int(m.group("color")),
                      key=_int(m.group("key")))
    return _rec("nccl_log_comm", ll, now_ns, tags, fields)


def _warn(ll: LogLine, now_ns: int) -> Record:
    tags = {"level": "WARN", "file": ll.file or "-"}
    if ll.func:
        tags["func"] = ll.func
    fields: dict = {"message": ll.message, "line": ll.line or 0, "tid": ll.tid}
    m = _IB_STATUS.search(ll.message)
    if m:
        code = _int(m.group("code") or m.group("old"))
        fields["code"] = code
        fields["status"] = m.group("name") or (
            "IBV_WC_" + IBV_WC_STATUS[code] if code < len(IBV_WC_STATUS) else f"ibv_wc{code}")
    return _rec("nccl_warn", ll, now_ns, tags, fields)


def _trace(ll: LogLine, now_ns: int, m: re.Match) -> Record:
    code = _int(m.group("code"))
    tags = {"level": "INFO", "file": m.group("file")}
    if m.group("func"):
        tags["func"] = m.group("func")
    fields = {"message": ll.message, "line": _int(m.group("line")), "code": code,
              "status": busbw.result_name(code), "tid": ll.tid}
    return _rec("nccl_warn", ll, now_ns, tags, fields)


def _net(ll: LogLine, now_ns: int, kind: str, fields: dict) -> Record:
    return _rec("nccl_net", ll, now_ns, {"kind": kind}, fields)


def _info(ll: LogLine, now_ns: int) -> tuple[str, Record | None]:
    msg = ll.message
    if _COLL_START.match(msg):
        m = _COLL.match(msg)
        return (RECORD, _coll(ll, now_ns, m)) if m else (GARBLED, None)
    if msg.startswith("Channel "):
        if m := _CHANNEL.match(msg):
            return RECORD, _channel(ll, now_ns, m)
        if m := _RING_ORDER.match(msg):
            return RECORD, _rec("nccl_topology", ll, now_ns, {"kind": "ring_order"},
                                {"channel": _int(m.group("ch")),
                                 "order": " ".join(m.group("order").split())})
        return GARBLED, None
    if msg.startswith("Ring "):
        m = _RING.match(msg)
        if not m:
            return (IGNORED, None) if "<-" in msg or "[" in msg else (GARBLED, None)
        return RECORD, _rec("nccl_topology", ll, now_ns, {"kind": "ring"},
                            {"channel": _int(m.group("ch")), "prev": _int(m.group("prev")),
                             "rank": _int(m.group("rank")), "next": _int(m.group("next"))})
    if m := _SOCK_THREADS.match(msg):
        return RECORD, _net(ll, now_ns, "socket_threads",
                            {"threads": _int(m.group("t")), "sockets_per_thread": _int(m.group("s"))})
    if m := _SOCK_DEVS.match(msg):
        return RECORD, _net(ll, now_ns, "socket_devices", {"devices": m.group("devs").strip()})
    if m := _IB_DEVS.match(msg):
        return RECORD, _net(ll, now_ns, "ib_devices",
                            {"devices": m.group("devs").strip(), "oob": m.group("oob")})
    if m := _NETWORK.match(msg):
        return RECORD, _net(ll, now_ns, "network", {"network": m.group("net")})
    if _INIT_START.match(msg) and msg.endswith(("Init START", "Init COMPLETE")):
        m = _INIT.match(msg)
        return (RECORD, _init(ll, now_ns, m)) if m else (GARBLED, None)
    if m := _TRACE.match(msg):
        return RECORD, _trace(ll, now_ns, m)
    return IGNORED, None


def parse_line(text: str, now_ns: int) -> tuple[str, Record | None]:
    """(outcome, record or None) for one line; `now_ns` stamps lines without a timestamp.
    Never raises: a line whose numbers cannot be values is GARBLED."""
    if not text.strip():
        return BLANK, None
    try:
        ll = split_line(text)
        if ll is None:
            return FOREIGN, None
        if ll.level == "WARN":
            return RECORD, _warn(ll, now_ns)
        if ll.level == "TRACE":
            return IGNORED, None
        return _info(ll, now_ns)
    except Garbled:
        return GARBLED, None
