"""nccl probe on the real libnccl.so.2 (PyPI nvidia-nccl-cu12, fetched by scripts/fetch-nccl.sh).

Without a GPU NCCL still runs its argument checks: collectives with a NULL
communicator return 4 (ncclInvalidArgument) and ncclCommInitRank returns 1 (no CUDA
driver), so a child process calls a known sequence with distinctive arguments and
the probe must report each call exactly (op, count, datatype, bytes, root/peer,
stream from the stack, ret, pid), once. The child waits on its stdin until the
test has seen the probe attached; no sleeps.

This file is also the child: `python test_nccl_probe.py LIBPATH`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
UNIQUE_ID = bytes(range(128))

# (symbol, arguments): strides of distinct values so a misread register shows.
CALLS = [
    ("ncclAllReduce", dict(count=1000, datatype=7, redop=0, stream=0x5151)),
    ("ncclAllReduce", dict(count=4096, datatype=9, redop=2, stream=0x5152)),
    ("ncclAllGather", dict(count=256, datatype=4, stream=0x5153)),
    ("ncclReduceScatter", dict(count=128, datatype=6, redop=4, stream=0x5154)),
    ("ncclAlltoAll", dict(count=64, datatype=2, stream=0x5155)),
    ("ncclBroadcast", dict(count=77, datatype=1, root=3, stream=0x5156)),
    ("ncclReduce", dict(count=99, datatype=8, redop=1, root=2, stream=0x5157)),
    ("ncclGather", dict(count=5, datatype=3, root=6, stream=0x5158)),
    ("ncclAllReduceConfig", dict(count=31, datatype=5, redop=3, stream=0x5159)),
    ("ncclGroupStart", {}),
    ("ncclSend", dict(count=12345, datatype=7, peer=1, stream=0x515A)),
    ("ncclRecv", dict(count=54321, datatype=10, peer=5, stream=0x515B)),
    ("ncclGroupEnd", {}),
    ("ncclBcast", dict(count=10, datatype=0, root=1, stream=0x515C)),
    ("ncclCommInitRank", dict(nranks=4, rank=2)),
    ("ncclCommInitRankConfig", dict(nranks=3, rank=1)),
    ("ncclCommSplit", dict(color=5, key=6)),
    ("ncclCommDestroy", {}),
    ("ncclCommAbort", {}),
]


# --- the child ----------------------------------------------------------------------------

def _args(sym: str, a: dict) -> tuple[list, list]:
    """(argtypes, values) in the order of the wheel's nccl.h."""
    P, S, I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int     # noqa: E741, N806
    stream = P(a.get("stream", 0))
    if sym in ("ncclAllReduce", "ncclReduceScatter", "ncclAllReduceConfig"):
        types = [P, P, S, I, I, P, P] + ([P] if sym.endswith("Config") else [])
        vals = [None, None, a["count"], a["datatype"], a["redop"], None, stream]
        return types, vals + ([None] if sym.endswith("Config") else [])
    if sym in ("ncclAllGather", "ncclAlltoAll"):
        return [P, P, S, I, P, P], [None, None, a["count"], a["datatype"], None, stream]
    if sym in ("ncclBroadcast", "ncclGather"):
        return [P, P, S, I, I, P, P], [None, None, a["count"], a["datatype"], a["root"], None,
                                       stream]
    if sym == "ncclReduce":
        return [P, P, S, I, I, I, P, P], [None, None, a["count"], a["datatype"], a["redop"],
                                          a["root"], None, stream]
    if sym in ("ncclSend", "ncclRecv", "ncclBcast"):
        peer = a.get("peer", a.get("root"))
        return [P, S, I, I, P, P], [None, a["count"], a["datatype"], peer, None, stream]
    if sym in ("ncclCommDestroy", "ncclCommAbort"):
        return [P], [None]
    return [], []


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def child(lib_path: str) -> None:
    lib = ctypes.CDLL(lib_path)
    version = ctypes.c_int()
    lib.ncclGetVersion(ctypes.byref(version))
    print(f"ready {os.getpid()} {version.value}", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    rets = []
    for sym, a in CALLS:
        fn = getattr(lib, sym)
        if sym.startswith("ncclCommInitRank"):
            comm, uid = ctypes.c_void_p(), _UniqueId()
            ctypes.memmove(ctypes.addressof(uid), UNIQUE_ID, 128)
            config = [ctypes.c_void_p] if sym.endswith("Config") else []
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, _UniqueId,
                           ctypes.c_int] + config
            rets.append(fn(ctypes.byref(comm), a["nranks"], uid, a["rank"],
                           *([None] if config else [])))
            continue
        if sym == "ncclCommSplit":
            newcomm = ctypes.c_void_p()
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
            rets.append(fn(None, a["color"], a["key"], ctypes.byref(newcomm), None))
            continue
        fn.argtypes, vals = _args(sym, a)
        rets.append(fn(*vals))
    print(json.dumps(rets), flush=True)
    sys.stdin.readline()          # stay alive (library mapped) until the test closes stdin


if __name__ == "__main__":
    child(sys.argv[1])
    sys.exit(0)


# --- the tests ----------------------------------------------------------------------------

import pytest   # noqa: E402  (the child above needs only the standard library)

from fabricscope.agent.probes.base import Clock, ProbeContext   # noqa: E402
from fabricscope.agent.probes.nccl.layout import APIS, comm_id_hash   # noqa: E402
from fabricscope import busbw, schema   # noqa: E402

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def nccl_lib() -> str:
    """The real library, fetched (idempotently) into the cache."""
    run = subprocess.run(["bash", str(ROOT / "scripts" / "fetch-nccl.sh")], text=True,
                         capture_output=True, timeout=1800)
    if run.returncode != 0:
        pytest.skip("libnccl.so.2 not available: scripts/fetch-nccl.sh failed: "
                    + (run.stderr.strip().splitlines() or ["?"])[-1])
    return str(Path(run.stdout.strip().splitlines()[-1]) / "libnccl.so.2")


@pytest.fixture(scope="module")
def kernel_ready():
    from fabricscope.agent import kernel
    kernel.prepare()


@contextlib.contextmanager
def nccl_probe(paths: list[str], **kw):
    from fabricscope.agent.probes.nccl.probe import NcclProbe
    ctx = ProbeContext("n1", frozenset(), Clock(), SimpleNamespace(nccl_paths=paths))
    probe = NcclProbe(ctx, **kw)
    try:
        probe.attach()
        yield probe
    finally:
        probe.detach()


@contextlib.contextmanager
def workload(cmd: list[str], env: dict | None = None):
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=None if env is None else {**os.environ, **env})
    try:
        ready = proc.stdout.readline().split()
        assert ready[:1] == ["ready"], f"child did not start: {ready}"
        assert int(ready[2]) >= 23203                       # ncclGetVersion worked
        yield proc, int(ready[1])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()


def run_calls(proc) -> list[int]:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


POLL_S = 0.02     # between polls of a condition (a polling interval, not a wait for it)


def await_records(probe, pid: int, n: int, deadline_s: float = 60) -> list:
    got: list = []
    deadline = time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < deadline:
        got += [r for r in probe.poll() if r.tags["pid"] == str(pid)]
        if len(got) < n:
            time.sleep(POLL_S)
    return got


def await_true(fn, what: str, deadline_s: float = 60):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out waiting for {what}")


def check_exact(records: list, rets: list[int], pid: int) -> None:
    assert len(records) == len(CALLS) == len(rets)
    assert [r.fields["seq"] for r in records] == sorted(r.fields["seq"] for r in records)
    for rec, (sym, a), ret in zip(records, CALLS, rets):
        rec.tags["node"] = "n1"
        schema.validate(rec)
        assert rec.tags["pid"] == str(pid)
        assert rec.fields["api"] == sym and rec.fields["ret"] == ret
        assert rec.fields["duration_ns"] > 0
        if sym.startswith("ncclCommInitRank"):
            assert rec.measurement == "nccl_comm" and rec.tags["event"] == "init"
            assert (rec.fields["nranks"], rec.fields["rank"]) == (a["nranks"], a["rank"])
            assert rec.tags["comm_id"] == f"0x{comm_id_hash(UNIQUE_ID):x}"   # id on the stack
            assert ret == 1 and rec.tags["comm"] == "0x0"        # no CUDA driver here
            continue
        if sym == "ncclCommSplit":
            assert rec.tags["event"] == "split" and rec.fields["parent"] == "0x0"
            assert (rec.fields["color"], rec.fields["key"]) == (5, 6) and ret != 0
            continue
        if sym in ("ncclCommDestroy", "ncclCommAbort"):
            assert rec.tags["event"] == sym[len("ncclComm"):].lower() and ret == 0
            continue
        assert rec.measurement == "nccl_call" and rec.tags["timing"] == "enqueue"
        if "count" not in a:                                    # group start/end
            assert rec.tags["op"] == sym[len("nccl"):]
            continue
        assert ret == 4                                          # ncclInvalidArgument
        assert rec.fields["count"] == a["count"]
        assert rec.tags["datatype"] == busbw.datatype_name(a["datatype"])
        assert rec.fields["bytes"] == a["count"] * busbw.datatype_size(a["datatype"])
        assert rec.fields["stream"] == f"0x{a['stream']:x}"     # 7th/8th args: the stack
        assert rec.tags.get("redop") == (busbw.redop_name(a["redop"]) if "redop" in a else None)
        assert rec.fields.get("root") == a.get("root")
        assert rec.fields.get("peer") == a.get("peer")
    assert records[13].tags["op"] == "Broadcast"                # ncclBcast, reported once


def test_every_call_is_reported_exactly(nccl_lib, kernel_ready):
    with nccl_probe([nccl_lib]) as probe:
        (path, _pids, symbols), = probe.libraries()
        assert path == nccl_lib and "ncclAllReduce" in symbols and len(symbols) == 30
        # started after attach: the configured file's uprobes catch it from its first call
        with workload([sys.executable, __file__, nccl_lib]) as (proc, pid):
            rets = run_calls(proc)
            records = await_records(probe, pid, len(CALLS))
            check_exact(records, rets, pid)
        stats = probe.stats()
        assert stats["nested"] >= 1 and stats["lost"] == 0 and stats["decode_errors"] == 0


def test_process_in_another_mount_namespace_is_discovered(nccl_lib, kernel_ready):
    """No configured path: the probe finds the library in /proc/PID/maps of a process
    that sees it at a path that does not exist for the agent (a container's view),
    attaches, and detaches once the process is gone."""
    with tempfile.TemporaryDirectory(prefix="fsnccl-") as mnt, \
            nccl_probe([], rescan_s=0.1) as probe:
        assert probe.libraries() == []
        inner = os.path.join(mnt, "libnccl.so.2")
        script = (f'touch {inner} && mount --bind {nccl_lib} {inner} && '
                  f'exec {sys.executable} {__file__} {inner}')
        with workload(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                       script]) as (proc, pid):
            def discovered():
                probe.poll()            # drives the rescan
                return [lib for lib in probe.libraries() if pid in lib[1]]

            libs = await_true(discovered, "the child's library")
            assert libs[0][0] == inner and not os.path.samefile(inner, nccl_lib)
            rets = run_calls(proc)
            check_exact(await_records(probe, pid, len(CALLS)), rets, pid)
            proc.stdin.close()
            proc.wait(timeout=30)
        await_true(lambda: probe.poll() == [] and probe.libraries() == [],
                   "detach after the process exited")
        stats = probe.stats()
        assert stats["libraries_attached"] == stats["libraries_detached"] == 1


def test_pid_filter_and_entry_only_mode(nccl_lib, kernel_ready):
    """Attach to a process that already runs (breakpoints go into its existing mapping),
    record only its pid, entry probes only: calls without ret/duration; another
    process's calls are filtered in the kernel and counted."""
    cmd = [sys.executable, __file__, nccl_lib]
    with workload(cmd) as (proc, pid), workload(cmd) as (other, other_pid):
        with nccl_probe([nccl_lib], pids={pid}, entry_only=True) as probe:
            run_calls(proc)
            # entry-only cannot pair calls, so ncclBcast's inner ncclBroadcast shows too
            records = await_records(probe, pid, len(CALLS) + 1)
            assert [r.fields["api"] for r in records] == \
                [sym for sym, _ in CALLS[:14]] + ["ncclBroadcast"] + [s for s, _ in CALLS[14:]]
            assert all("ret" not in r.fields and "duration_ns" not in r.fields for r in records)
            assert records[0].fields["count"] == CALLS[0][1]["count"]
            run_calls(other)
            stats = await_true(lambda: (probe.poll() == [] and
                                        probe.stats()["filtered"] >= len(CALLS) + 1
                                        and probe.stats()), "filtered calls")
            assert stats["filtered"] == len(CALLS) + 1 and stats["emitted"] == len(CALLS) + 1
            assert other_pid != pid


def test_configured_paths_missing_or_not_nccl(kernel_ready, tmp_path):
    """A missing path is skipped and counted; a file without NCCL functions is a
    one-line UserError (a misconfiguration, not a host limitation)."""
    from fabricscope.agent.probes.nccl.probe import NcclProbe
    from fabricscope.errors import UserError
    missing = str(tmp_path / "libnccl.so.2")
    ctx = ProbeContext("n1", frozenset(), Clock(),
                       SimpleNamespace(nccl_paths=[missing, "/usr/bin/true"]))
    probe = NcclProbe(ctx)
    try:
        with pytest.raises(UserError, match="/usr/bin/true exports none of the NCCL"):
            probe.attach()
        assert probe.stats()["paths_missing"] == 1
    finally:
        probe.detach()
        probe.detach()


def test_real_nccl_debug_file_is_followed(nccl_lib, tmp_path):
    """The nccl_log source on what the real library writes with NCCL_DEBUG=INFO into
    NCCL_DEBUG_FILE=<dir>/nccl.%h.%p.log: every NULL-comm collective is a WARN record
    (with NCCL's own timestamp) and an error trace with code 4."""
    from fabricscope.agent.probes.nccl.log_source import NcclLogSource
    ctx = ProbeContext("n1", frozenset(), Clock(), SimpleNamespace())
    src = NcclLogSource(ctx, paths=[str(tmp_path / "nccl.*.log")], rescan_s=0)
    src.attach()
    try:
        env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
        with workload([sys.executable, __file__, nccl_lib], env) as (proc, pid):
            before = time.time_ns()
            run_calls(proc)
            op = {api.symbol: api.op for api in APIS}
            wanted = {f"{op[sym]} : comm argument is NULL" for sym, a in CALLS if "count" in a}
            seen: list = []

            def all_warnings():
                seen.extend(r for r in src.poll() if r.tags["pid"] == str(pid))
                return wanted <= {r.fields.get("message") for r in seen}

            await_true(all_warnings, "NCCL's WARN lines")
        warns = [r for r in seen if r.measurement == "nccl_warn" and r.tags["level"] == "WARN"
                 and r.fields["message"] in wanted]
        assert all(r.time_ns >= before - 2_000_000_000 for r in warns)   # NCCL's timestamp
        assert all(r.tags["file"] == "misc/argcheck.cc" for r in warns)
        traces = [r for r in seen if r.tags.get("level") == "INFO" and r.fields.get("code") == 4]
        assert len(traces) >= len(wanted)
        stats = src.stats()
        assert stats["lines_garbled"] == 0 and stats["files_followed"] == 1
    finally:
        src.detach()
