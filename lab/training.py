"""Real PyTorch DDP (gloo) across a lab's nodes: one rank per node, in its namespace;
with kind= the other kinds of job (FSDP, MoE, pipeline, serving; lab/workloads/).

    with start_training(lab, steps=20, model_mb=8) as run:
        for line in run.steps():          # {"step": n, "seconds": s}, from rank 0
            ...
        if run.wait() != 0:
            raise RuntimeError(run.error)

Each rank is `ip netns exec <netns> <this python> -m fabricscope.lab.train_worker ...` with
RANK, WORLD_SIZE, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1, MASTER_ADDR (node 0's address),
MASTER_PORT, GLOO_SOCKET_IFNAME (the node's NIC), FABRICSCOPE_MARKERS_DIR (the
node's markers dir) and OMP_NUM_THREADS=1 in its environment; `extra_env` is
applied last. Each rank joins its node's CPU cgroup (Lab nodes' `cgroup`, see
lab/cgroups.py) in the child before exec, so a CPU fault on the node throttles
every instruction of the rank and nothing else on the node. Rank 0's stdout is the step stream; every rank's stderr (and the
other ranks' stdout) goes to <node dir>/train.log. When one rank fails, the
others are ended (SIGTERM, SIGKILL after 3 s), and the run's returncode is the
failed rank's.

With data_server (a fabricscope.lab.dataserver address, see running_dataserver) every rank
also GETs data_bytes per step and PUTs a checkpoint every checkpoint_every steps
over one persistent connection; with io_log_dir each rank logs every transfer to
{io_log_dir}/rank{r}.jsonl, read back with TrainingRun.io_events(rank).

This module does not import torch; only lab/train_worker.py (the rank) does.
"""

from __future__ import annotations

import json
import math
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time

from fabricscope.errors import UserError
from fabricscope.lab import exec_argv
from fabricscope.lab.topology import Lab, load, require_root
from fabricscope.lab.train_worker import TRAINED

WIDTH = 1024
RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "TORCHELASTIC_RUN_ID")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mlp_shape(model_mb: float) -> tuple[int, int]:
    """(width, layers) of the MLP whose float32 parameters take about model_mb MiB.

    `layers` square Linear(width, width) layers, bytes = layers * (width^2 + width) * 4:
    as few layers as keep width <= 1024, then the width that fits the size best."""
    if isinstance(model_mb, bool) or not isinstance(model_mb, (int, float)) or not model_mb > 0 \
            or not math.isfinite(model_mb):
        raise UserError(f"model size {model_mb!r} MiB must be positive", "give e.g. --model-mb 8")
    target = model_mb * 2**20
    layers = max(1, math.ceil(target / ((WIDTH * WIDTH + WIDTH) * 4) - 1e-9))
    width = max(8, int(round((-1 + math.sqrt(1 + target / layers)) / 2)))   # (w^2+w)*4*L = target
    return min(width, WIDTH), layers


def param_bytes(width: int, layers: int) -> int:
    return layers * (width * width + width) * 4


class TrainingRun:
    """A running DDP job, Popen-like. Use it as a context manager (ends ranks on exit)."""

    def __init__(self, lab: Lab, argv: list[list[str]], envs: list[dict], timeout_s: float | None,
                 io_log_dir: str | None = None, cgroups: list[str] | None = None):
        self.lab = lab
        self.io_log_dir = io_log_dir
        self.returncode: int | None = None
        self.error: str | None = None       # one line, set when a rank failed or timed out
        #: ranks that aborted (SIGABRT) in teardown, after every rank had trained: torch's
        #: gloo sometimes ends with "terminate called without an active exception" at
        #: interpreter exit. The run counts as finished; the descriptions are kept here.
        self.teardown_aborts: list[str] = []
        self.records: list[dict] = []        # every step line from rank 0 so far
        self.log_paths = [os.path.join(n.dir, "train.log") for n in lab.nodes]
        self._queue: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._stopping = False
        self._lock = threading.Lock()
        self._deadline = time.monotonic() + timeout_s if timeout_s else None
        self._timeout_s = timeout_s
        self.procs: list[subprocess.Popen] = []
        logs = []
        try:
            for rank, (args, env) in enumerate(zip(argv, envs)):
                os.makedirs(os.path.dirname(self.log_paths[rank]), exist_ok=True)
                open(self.log_paths[rank], "wb").close()     # truncate, then append:
                log = open(self.log_paths[rank], "ab")       # rank 0's reader appends too
                logs.append(log)
                self.procs.append(start_rank(
                    args, env, cgroups[rank] if cgroups else "",
                    stdout=subprocess.PIPE if rank == 0 else log, stderr=log))
        except BaseException:
            for proc in self.procs:
                _signal(proc, signal.SIGKILL)
                proc.wait()
            raise
        finally:
            for log in logs:
                log.close()
        self._reader = threading.Thread(target=self._read, name="lab-train-reader", daemon=True)
        self._monitor = threading.Thread(target=self._watch, name="lab-train-monitor", daemon=True)
        self._reader.start()
        self._monitor.start()

    # -- Popen-like API ---------------------------------------------------------------

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def steps(self):
        """Yield rank 0's step dicts (a served request's dicts for kind serve) as they
        come, until rank 0's stdout closes."""
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.put(None)       # later calls end at once too
                return
            yield item

    def io_log_path(self, rank: int) -> str | None:
        self.lab.node(rank)                   # UserError for a rank the lab lacks
        return io_log_path(self.io_log_dir, rank) if self.io_log_dir else None

    def io_events(self, rank: int) -> list[dict]:
        """Rank `rank`'s transfers so far ({"kind", "step", "rank", "start_ns", "end_ns",
        "bytes"}, in order); [] without io_log_dir or before its first transfer."""
        path = self.io_log_path(rank)
        return read_io_log(path) if path else []

    def poll(self) -> int | None:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for every rank; the run's returncode (0: all ranks succeeded)."""
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.procs[0].args, timeout)
        self._reader.join()
        return self.returncode  # type: ignore[return-value]

    def terminate(self, grace_s: float = 3.0) -> None:
        """End every rank: SIGTERM, then SIGKILL after grace_s. Returns when all are gone."""
        with self._lock:
            self._stopping = True
            if self.error is None and not self._done.is_set():
                self.error = "training was stopped before it finished"
        self._end_all(grace_s)
        self._done.wait()

    kill = terminate

    def __enter__(self) -> "TrainingRun":
        return self

    def __exit__(self, *exc) -> None:
        if not self._done.is_set():
            self.terminate()
        self.wait()

    # -- internals ------------------------------------------------------------------

    def _read(self) -> None:
        stream = self.procs[0].stdout
        try:
            with open(self.log_paths[0], "ab") as log:
                for raw in stream:
                    try:
                        item = json.loads(raw)
                    except ValueError:
                        item = None
                    if isinstance(item, dict) and ("step" in item or "request" in item):
                        self.records.append(item)
                        self._queue.put(item)
                    else:
                        log.write(raw)
                        log.flush()
        finally:
            stream.close()
            self._queue.put(None)

    def _end_all(self, grace_s: float) -> None:
        for proc in self.procs:
            _signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs:
            if proc.poll() is None:
                _signal(proc, signal.SIGKILL)

    def _watch(self) -> None:
        try:
            while True:
                codes = [self._code(r, p.poll()) for r, p in enumerate(self.procs)]
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                timed_out = (self._deadline is not None and time.monotonic() > self._deadline
                             and None in codes)
                if (failed or timed_out) and not self._stopping:
                    with self._lock:
                        self._stopping = True
                        if timed_out and not failed:
                            self.error = f"training did not finish within {self._timeout_s:g} s"
                        elif self.error is None:
                            self.error = self._describe(*failed[0])
                    self._end_all(3.0)
                if None not in codes:
                    break
                time.sleep(0.05)
            codes = [self._code(r, p.wait()) for r, p in enumerate(self.procs)]
            bad = [c for c in codes if c != 0]
            if self.error and not bad:
                bad = [1]
            self.returncode = bad[0] if bad else 0
            if self.returncode and self.error is None:
                rank = next(r for r, c in enumerate(codes) if c != 0)
                self.error = self._describe(rank, codes[rank])
        finally:
            self._done.set()

    def _code(self, rank: int, code: int | None) -> int | None:
        """The rank's exit status, 0 for an abort in teardown after every rank trained."""
        if judged_status(code, _trained(self.log_paths[rank])) != code:
            text = self._describe(rank, code)
            if text not in self.teardown_aborts:
                self.teardown_aborts.append(text)
            return 0
        return code

    def _describe(self, rank: int, code: int) -> str:
        node = self.lab.nodes[rank]
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        last = _last_line(self.log_paths[rank])
        return (f"rank {rank} ({node.name}) {how}" + (f": {last}" if last else "")
                + f" (log: {self.log_paths[rank]})")


def start_rank(argv: list[str], env: dict | None, cgroup: str, stdout, stderr) -> subprocess.Popen:
    """Start one rank's process (argv: already wrapped to run in its node's netns) in
    its own session and, when `cgroup` is given, in that cgroup from its first
    instruction (see fabricscope.lab.cgroups.joiner)."""
    from fabricscope.lab.cgroups import joiner
    return subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                            stdout=stdout, stderr=stderr, start_new_session=True,
                            preexec_fn=joiner(cgroup) if cgroup else None)


def judged_status(code: int | None, trained: bool) -> int | None:
    """A rank's exit status as the run counts it: 0 for an abort (SIGABRT) after the
    rank wrote TRAINED, i.e. in torch's gloo teardown once every rank passed the final
    barrier ("terminate called without an active exception")."""
    return 0 if code == -signal.SIGABRT and trained else code


def _trained(log_path: str) -> bool:
    try:
        with open(log_path, "rb") as f:
            return TRAINED.encode() in f.read()
    except OSError:
        return False


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _last_line(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 4096))
            lines = [ln.strip() for ln in fh.read().decode(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [ln for ln in lines if ln]
    return lines[-1][:300] if lines else ""


def io_log_path(io_log_dir: str, rank: int) -> str:
    return os.path.join(io_log_dir, f"rank{rank}.jsonl")


def read_io_log(path: str) -> list[dict]:
    """The complete JSON lines of a rank's I/O log ([] when it does not exist). A last
    line without its newline is still being written and is left for the next read."""
    try:
        with open(path) as fh:
            text = fh.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def io_args(data_server: str | None, data_bytes: int, checkpoint_every: int) -> list[str]:
    """train_worker flags for the data-server options; UserError when they do not fit."""
    from fabricscope.lab.dataserver import MAX_LENGTH, parse_addr
    for value, what, flag in ((data_bytes, "data size", "data_bytes"),
                              (checkpoint_every, "checkpoint interval", "checkpoint_every")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UserError(f"{what} {value!r} is not valid", f"give {flag}=0 (none) or more")
    if data_bytes > MAX_LENGTH:
        raise UserError(f"data size {data_bytes} is over the data server's limit",
                        f"give data_bytes up to {MAX_LENGTH} (1 GiB)")
    if data_server is None:
        if data_bytes or checkpoint_every:
            raise UserError("data_bytes and checkpoint_every need a data server",
                            "start one with lab.dataserver.running_dataserver(lab) and pass "
                            "data_server=its ADDR:PORT")
        return []
    if not isinstance(data_server, str):
        raise UserError(f"data server {data_server!r} is not ADDR:PORT", "give e.g. 198.18.0.1:9000")
    parse_addr(data_server)
    return ["--data-server", data_server, "--data-bytes", str(data_bytes),
            "--checkpoint-every", str(checkpoint_every)]


def kind_args(kind: str, knobs: dict | None, world: int, batch: int = 32,
              data_server: bool = False) -> list[str]:
    """train_worker flags for `kind` and its knobs ([] for DDP without knobs, so the DDP
    command line is what it always was); UserError when they do not fit."""
    import argparse

    from fabricscope.lab.train_worker import add_kind_arguments, kind_problem
    from fabricscope.lab.workloads import Kind
    try:
        kind = Kind(kind)
    except ValueError:
        raise UserError(f"job kind {kind!r} is not known",
                        "give one of " + ", ".join(k.value for k in Kind)) from None
    parser = argparse.ArgumentParser(add_help=False)
    add_kind_arguments(parser)
    defaults = vars(parser.parse_args([]))
    knobs = dict(knobs or {})
    unknown = sorted(set(knobs) - set(defaults) - {"kind"})
    if unknown:
        raise UserError(f"unknown knob(s) {', '.join(unknown)} for kind {kind.value}",
                        "give only " + ", ".join(sorted(set(defaults) - {"kind"})))
    for name, value in knobs.items():
        want = type(defaults[name])
        if isinstance(value, bool) or not isinstance(value, (int, float) if want is float
                                                      else want):
            raise UserError(f"knob {name}={value!r} is not a {want.__name__}",
                            f"give {name} as a {want.__name__}, e.g. {defaults[name]!r}")
    if kind is Kind.DDP:
        if knobs:
            raise UserError("DDP takes no knobs", "leave knobs out with kind ddp")
        return []
    settings = argparse.Namespace(**{**defaults, **knobs, "kind": kind.value, "batch": batch,
                                     "data_server": "set" if data_server else None})
    problem = kind_problem(settings, world)
    if problem:
        raise UserError(problem, "see `fabricscope lab train --help`")
    flags = ["--kind", kind.value]
    for name, value in sorted(knobs.items()):
        flags += ["--" + name.replace("_", "-"), str(value)]
    return flags


def rank_env(lab: Lab, rank: int, master_port: int, base: dict | None = None) -> dict:
    """The environment of rank `rank` (without extra_env)."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in RANK_ENV}
    node = lab.nodes[rank]
    env.update(
        RANK=str(rank), WORLD_SIZE=str(lab.world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=lab.nodes[0].address, MASTER_PORT=str(master_port),
        GLOO_SOCKET_IFNAME=node.ifname, FABRICSCOPE_MARKERS_DIR=node.markers_dir,
        OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
        FABRICSCOPE_LAB=lab.name, FABRICSCOPE_LAB_NODE=str(node.index),
        FABRICSCOPE_LAB_PARENT=str(os.getpid()),
        PYTHONPATH=os.pathsep.join([REPO_ROOT] + [p for p in env.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    return env


def _prepare_io_logs(io_log_dir, world_size: int) -> str | None:
    """Create io_log_dir and empty every rank's log (no lines from an earlier run)."""
    if io_log_dir is None:
        return None
    if not isinstance(io_log_dir, (str, os.PathLike)) or not str(io_log_dir):
        raise UserError(f"I/O log directory {io_log_dir!r} is not valid", "give a directory path")
    path = os.path.abspath(os.fspath(io_log_dir))
    try:
        os.makedirs(path, exist_ok=True)
        for rank in range(world_size):
            open(io_log_path(path, rank), "w").close()
    except OSError as exc:
        raise UserError(f"cannot write I/O logs in {path}: {exc.strerror}",
                        "give a writable io_log_dir") from None
    return path


def start_training(lab: Lab | str, steps: int, model_mb: float = 8, extra_env: dict | None = None,
                   batch: int = 32, master_port: int | None = None,
                   timeout_s: float | None = None, python: str | None = None, *,
                   data_server: str | None = None, data_bytes: int = 0,
                   checkpoint_every: int = 0, io_log_dir: str | None = None,
                   cpus: set[int] | None = None, kind: str = "ddp",
                   knobs: dict | None = None) -> TrainingRun:
    """Start DDP on every node of `lab` for `steps` steps; returns the TrainingRun.

    model_mb: MLP parameter MiB (default 8); batch: samples per rank per step;
    master_port: rank 0's rendezvous port (default: random in 20000-39999);
    timeout_s: end all ranks when the run takes longer (default: no limit;
    each rank's gloo collectives time out after 300 s anyway).
    data_server: ADDR:PORT of a fabricscope.lab.dataserver; data_bytes: bytes each rank GETs
    per step (0: none); checkpoint_every: each rank PUTs its state_dict after
    every K-th step (0: never); io_log_dir: each rank's transfers go to
    {io_log_dir}/rank{r}.jsonl (see TrainingRun.io_events); cpus: the CPUs every
    rank may run on (taskset; default: any).
    kind: ddp (default), fsdp, moe, pipeline or serve (lab/workloads/; `steps` are
    requests for serve); knobs: that kind's settings by flag name without dashes
    (layers, experts_per_rank, skew, micro_batches, slow_stage, stage_skew, rate,
    serve_mode; see kind_args)."""
    io_flags = io_args(data_server, data_bytes, checkpoint_every)   # checked before root
    require_root("`lab train`")
    lab = load(lab if isinstance(lab, str) else lab.name)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UserError(f"step count {steps!r} is not valid", "give --steps 1 or more")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UserError(f"batch size {batch!r} is not valid", "give --batch 1 or more")
    mlp_shape(model_mb)
    kind_flags = kind_args(kind, knobs, lab.world_size, batch, bool(io_flags))
    port = master_port or random.randint(20000, 39999)
    python = python or sys.executable
    log_dir = _prepare_io_logs(io_log_dir, lab.world_size)
    argv, envs = [], []
    pin = ["taskset", "-c", ",".join(str(c) for c in sorted(cpus))] if cpus else []
    for node in lab.nodes:
        log_flag = ["--io-log", io_log_path(log_dir, node.index)] if log_dir else []
        argv.append(exec_argv(node, [*pin, python, "-m", "fabricscope.lab.train_worker", "--steps", str(steps),
                                     "--model-mb", repr(float(model_mb)), "--batch", str(batch),
                                     *io_flags, *log_flag, *kind_flags]))
        env = rank_env(lab, node.index, port)
        env.update(extra_env or {})
        envs.append(env)
    return TrainingRun(lab, argv, envs, timeout_s, io_log_dir=log_dir,
                       cgroups=[n.cgroup for n in lab.nodes])
