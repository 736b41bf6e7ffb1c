"""Source `nccl_ras`: the health of a job's ranks from NCCL's RAS service (NCCL >= 2.24).

Every NCCL process runs RAS, a keep-alive mesh over the bootstrap network, and one
process per node listens for clients (`NCCL_RAS_ADDR`, default port 28028). This
source is that service's client, speaking the protocol of NCCL's `ncclras`
(src/ras/client.cc): `CLIENT PROTOCOL 2`, `TIMEOUT <s>`, `SET FORMAT json`, `STATUS`,
then the JSON status document until the service closes the connection. A status asks
every rank of every communicator, so RAS may take up to its collective timeout (5 s
per leg, 10 s in all) to answer: the queries run every `nccl_ras_interval_s` in a
thread of their own, and each poll hands out what the last one brought.

What it exports (fabricscope/measurements/nccl_health.py): nccl_ras_comm per
communicator and query (ranks, missing, unresponsive, dead, errors), nccl_ras_rank per
rank in trouble (dead, unresponsive, missing, error, aborted). Counters: `queries`,
`unreachable` (no connection or no answer: one log line until it answers again),
`unsupported` (an NCCL whose RAS does not print JSON, before 2.28), `malformed` (a
document that is not RAS's JSON).
"""

from __future__ import annotations

import enum
import json
import logging
import socket
import threading
import time

from fabricscope.agent.procmaps import shared_environments
from fabricscope.agent.probes.base import Probe, ProbeContext, ProbeUnavailable
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.nccl_ras")

PROTOCOL = 2                 # NCCL_RAS_CLIENT_PROTOCOL (src/ras/ras_internal.h)
CONNECT_TIMEOUT_S = 2.0
RAS_TIMEOUT_S = 5            # TIMEOUT sent: RAS's per-leg collective timeout
READ_TIMEOUT_S = 2 * RAS_TIMEOUT_S + 2     # two legs and a margin, as ncclras waits
MAX_DOCUMENT = 64 << 20      # a status larger than this is refused (malformed)


class RankState(str, enum.Enum):
    DEAD = "dead"
    UNRESPONSIVE = "unresponsive"
    MISSING = "missing"
    ERROR = "error"
    ABORTED = "aborted"


class RasUnreachable(Exception):
    """No connection, or no answer in time; the message names the cause and the fix."""


class RasUnsupported(Exception):
    """The service answered but cannot give JSON (older NCCL)."""


def query_status(host: str, port: int) -> str:
    """One status document from RAS at host:port (raw JSON text)."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise RasUnreachable(f"cannot connect to NCCL RAS at {host}:{port} ({why}); is a job "
                             "running there with RAS on (NCCL_RAS_ENABLE, NCCL_RAS_ADDR)?"
                             ) from None
    with sock:
        sock.settimeout(READ_TIMEOUT_S)
        try:
            reply = _command(sock, f"CLIENT PROTOCOL {PROTOCOL}")
            if not reply.upper().startswith("SERVER PROTOCOL "):
                raise RasUnsupported(f"unexpected greeting {reply!r}")
            for cmd in (f"TIMEOUT {RAS_TIMEOUT_S}", "SET FORMAT json"):
                reply = _command(sock, cmd)
                if reply.upper() != "OK":
                    raise RasUnsupported(f"{cmd!r} answered {reply!r}")
            sock.sendall(b"STATUS\n")
            return _read_all(sock)
        except (TimeoutError, socket.timeout):
            raise RasUnreachable(f"NCCL RAS at {host}:{port} did not answer within "
                                 f"{READ_TIMEOUT_S} s") from None
        except OSError as exc:
            raise RasUnreachable(f"NCCL RAS at {host}:{port}: {exc.strerror or exc}") from None


def _command(sock: socket.socket, cmd: str) -> str:
    sock.sendall(cmd.encode() + b"\n")
    buf = b""
    while not buf.endswith(b"\n"):
        data = sock.recv(1024)
        if not data:
            raise RasUnreachable("NCCL RAS closed the connection")
        buf += data
    return buf.decode(errors="replace").strip()


def _read_all(sock: socket.socket) -> str:
    chunks, size = [], 0
    while True:
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks).decode(errors="replace")
        chunks.append(data)
        size += len(data)
        if size > MAX_DOCUMENT:
            raise ValueError(f"status larger than {MAX_DOCUMENT} bytes")


def _rank_states(rank: dict, missing: bool) -> RankState | None:
    s = rank.get("status") or {}
    if missing:
        return (RankState.DEAD if s.get("considered_dead") else
                RankState.UNRESPONSIVE if s.get("unresponsive") else RankState.MISSING)
    if s.get("abort_flag"):
        return RankState.ABORTED
    if s.get("async_error") or s.get("init_state"):
        return RankState.ERROR
    return None


def status_records(doc: dict, job: str, time_ns: int) -> list[Record]:
    """nccl_ras_comm and nccl_ras_rank records of one status document. Raises
    KeyError/TypeError/ValueError on a document that is not RAS's JSON."""
    out = []
    ras = doc["ras"]
    for comm in doc["communicators"]:
        tags = {"job": job, "comm": str(comm["hash"])}
        counts = dict.fromkeys(RankState, 0)
        for rank, missing in [(r, False) for r in comm["ranks"]] + \
                             [(r, True) for r in comm["missing_ranks"]]:
            state = _rank_states(rank, missing)
            if state is None:
                continue
            counts[state] += 1
            s = rank.get("status") or {}
            fields = {"host": str(rank.get("host", "unknown")), "pid": int(rank.get("pid", -1)),
                      "cuda_dev": int(rank.get("cuda_dev", -1))}
            if state is RankState.ERROR:
                fields.update(async_error=int(s.get("async_error", 0)),
                              init_state=int(s.get("init_state", 0)))
            out.append(Record("nccl_ras_rank", time_ns,
                              {**tags, "rank": str(int(rank["rank"])), "state": state.value},
                              fields))
        errors = counts[RankState.ERROR] + counts[RankState.ABORTED]
        missing_n = int(comm["missing_ranks_count"])
        out.append(Record("nccl_ras_comm", time_ns, tags, {
            "nranks": int(comm["size"]), "ranks_seen": int(comm["ranks_count"]),
            "missing": missing_n, "unresponsive": counts[RankState.UNRESPONSIVE],
            "dead": counts[RankState.DEAD], "errors": errors,
            "healthy": missing_n == 0 and errors == 0,
            "collection_seconds": float(ras["collection_time_sec"]),
            "timeouts": int(ras["timeouts_count"])}))
    return out


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ProbeUnavailable(f"nccl_ras_address {address!r} is not host:port: give e.g. "
                               "127.0.0.1:28028")
    return host.strip("[]"), int(port)


class NcclRasSource(Probe):
    name = "nccl_ras"
    needs_bpf = False

    def __init__(self, ctx: ProbeContext, procs: ProcessTable | None = None):
        super().__init__(ctx)
        cfg = ctx.config
        self.address = str(getattr(cfg, "nccl_ras_address", "") or "")
        self.interval_s = float(getattr(cfg, "nccl_ras_interval_s", 10.0))
        self.job = str(getattr(cfg, "nccl_ras_job", "") or "")
        self._procs = procs or ProcessTable(pods=getattr(ctx, "pods", None),
                                          environments=shared_environments(ctx))
        self._lock = threading.Lock()
        self._pending: list[Record] = []
        self._counts = {"queries": 0, "unreachable": 0, "unsupported": 0, "malformed": 0}
        self._failing = False           # logged once per outage
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def attach(self, start_thread: bool = True) -> None:
        """start_thread=False: no query thread (tests call query_once themselves)."""
        if not self.address:
            raise ProbeUnavailable("nccl_ras_address is not set (off by default): give the "
                                   "RAS address of a node of the job, e.g. 127.0.0.1:28028")
        self.host, self.port = parse_address(self.address)
        if not self.interval_s > 0:
            raise ProbeUnavailable(f"nccl_ras_interval_s {self.interval_s:g} is not positive: "
                                   "give e.g. 10")
        if not start_thread:
            return
        self._thread = threading.Thread(target=self._run, name="nccl-ras", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.query_once()
            self._stop.wait(self.interval_s)

    def query_once(self) -> None:
        """One status query; its records wait for the next poll."""
        now = time.time_ns()
        self._counts["queries"] += 1
        try:
            doc = json.loads(query_status(self.host, self.port))
            records = status_records(doc, self.job or self._job_of(doc), now)
        except RasUnreachable as exc:
            self._fail("unreachable", str(exc))
            return
        except RasUnsupported as exc:
            self._fail("unsupported", f"NCCL RAS at {self.address} gives no JSON status "
                       f"({exc}); it needs NCCL >= 2.28")
            return
        except (ValueError, KeyError, TypeError) as exc:
            self._fail("malformed", f"NCCL RAS at {self.address} sent a status that is not "
                       f"its JSON ({type(exc).__name__}: {exc})")
            return
        if self._failing:
            log.info("nccl_ras: %s answers again", self.address)
        self._failing = False
        with self._lock:
            self._pending += records

    def _fail(self, counter: str, message: str) -> None:
        self._counts[counter] += 1
        if not self._failing:
            log.warning("nccl_ras: %s (counted in probe_events_total{event=\"%s\"}; logged "
                        "again only after it answers)", message, counter)
        self._failing = True

    def _job_of(self, doc: dict) -> str:
        """The job of a rank RAS lists that runs here (its environment), else the address."""
        own = set(self.ctx.addresses) | {"127.0.0.1", "::1"}
        for comm in doc.get("communicators", []):
            for rank in comm.get("ranks", []):
                if rank.get("host") in own and isinstance(rank.get("pid"), int):
                    info = self._procs.get(rank["pid"])
                    if info is not None and info.local:
                        return info.job
        return f"ras:{self.address}"

    def poll(self) -> list[Record]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def stats(self) -> dict[str, int]:
        return dict(self._counts)

    def detach(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=READ_TIMEOUT_S + CONNECT_TIMEOUT_S)
            self._thread = None
