"""Every kind of lab job runs for real: two ranks of fabricscope.lab.train_worker over gloo on
loopback (no lab, no root), a tiny model, a few steps; rank 0's lines are checked."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.lab.train_worker import TRAINED
from fabricscope.lab.training import judged_status

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path: Path, flags: list[str], world: int = 2) -> list[dict]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "lo", "FABRICSCOPE_MARKERS_DIR": str(tmp_path / "markers")}
        env.pop("FABRICSCOPE_LAB_PARENT", None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "fabricscope.lab.train_worker", "--model-mb", "0.25", "--batch", "8",
             *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):       # judged as a lab run judges its ranks
        assert judged_status(p.returncode, TRAINED in err) == 0, err[-2000:]
    return [json.loads(line) for line in outs[0][0].splitlines() if line.startswith("{")]


@pytest.mark.parametrize("flags", [
    ["--kind", "fsdp", "--layers", "2"],
    ["--kind", "moe", "--layers", "2", "--skew", "1.2"],
    ["--kind", "pipeline", "--layers", "1", "--slow-stage", "1", "--stage-skew", "2"],
], ids=["fsdp", "moe", "pipeline"])
def test_each_training_kind_runs_its_steps_and_rank_0_reports_each(tmp_path, flags):
    lines = run_ranks(tmp_path, ["--steps", "3", *flags])
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert all(line["seconds"] > 0 for line in lines)


@pytest.mark.parametrize("mode", ["moe", "pipeline"])
def test_serving_answers_every_request_with_its_latency(tmp_path, mode):
    lines = run_ranks(tmp_path, ["--kind", "serve", "--serve-mode", mode, "--steps", "4",
                                 "--rate", "50", "--layers", "1"])
    assert [line["request"] for line in lines] == [0, 1, 2, 3]
    assert all(line["seconds"] > 0 for line in lines)
    arrivals = [line["arrival_s"] for line in lines]
    assert arrivals == sorted(arrivals)
