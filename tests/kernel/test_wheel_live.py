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
#: the gloo probe's counters that say why a rank's events were not stored
WHY_NOT_STORED = ("unattributed", "late_attributed", "handler_errors", "decode_errors")


def gloo_counts(stack, node_index: int) -> str:
    def count(event: str) -> float:
        return stack.agent_metric(node_index, "fabricscope_agent_probe_events_total",
                                  {"probe": "gloo", "event": event})
    return ", ".join(f"{event} {count(event):.0f}" for event in WHY_NOT_STORED)


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
        try:
            await_condition(lambda: stored_steps() >= STEPS - 2, 60,
                            "the installed agents' steps in InfluxDB")
        except TimeoutError as exc:     # which agent saw what: its counters, its log
            tails = "; ".join(f"node{i}'s agent: {gloo_counts(stack, i)}; log: "
                              f"{agent.log_tail(6)}" for i, agent in sorted(stack.agents.items()))
            raise TimeoutError(f"{exc}: {stored_steps()} steps stored; {tails}") from exc
        proc = subprocess.run([*command, "diagnose", "--influx-url", stack.influx.url,
                               "--job", job, "--since", "10m", "--recompute", "--json"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert set(out) == {"job_class", "findings"}
        assert [f for f in out["findings"] if f["severity"] == "critical"] == [], out
