"""fabricscope as a platform team installs it, live: the wheel in a clean venv
(tests/support/wheel.py) runs the collector and one agent per lab node, the agents
compile their probes from the installed BPF sources and attach, real DDP trains,
its steps reach InfluxDB through the installed collector, and the installed
`fabricscope diagnose` reads them back. Nothing of the checkout is on the installed
interpreter's path; the lab and the training come from the checkout (they are the
test's world, not the product under test)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fabricscope.lab.running import running_lab
from fabricscope.lab.stack import await_condition, running_stack
from fabricscope.lab.training import start_training
from tests.support.wheel import installed_wheel

pytestmark = pytest.mark.root

STEPS = 12


def test_the_installed_agent_collector_and_diagnose_see_a_training_job(tmp_path):
    installed = installed_wheel(tmp_path)
    command = (str(installed.fabricscope),)
    with running_lab(nodes=2) as lab, running_stack(lab, command=command) as stack:
        for proc in [*stack.agents.values(), *stack.replicas]:
            cmdline = open(f"/proc/{proc.popen.pid}/cmdline", "rb").read().split(b"\0")
            assert str(installed.fabricscope).encode() in cmdline, cmdline
        port = 29000 + os.getpid() % 500
        job = f"{lab.nodes[0].address}:{port}"
        with start_training(lab, STEPS, model_mb=2, master_port=port) as training:
            list(training.steps())
            assert training.wait() == 0, training.error

        def stored_steps() -> int:
            rows = stack.influx.query(f"SELECT count(\"seconds\") FROM gloo_step "
                                      f"WHERE job = '{job}'", db="fabricscope")
            return rows[0]["count"] if rows else 0
        await_condition(lambda: stored_steps() >= STEPS - 2, 60,
                        "the installed agents' steps in InfluxDB")
        proc = subprocess.run([*command, "diagnose", "--influx-url", stack.influx.url,
                               "--job", job, "--since", "10m", "--recompute", "--json"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert set(out) == {"job_class", "findings"}
        assert [f for f in out["findings"] if f["severity"] == "critical"] == [], out
