"""`fabricscope lab up --tors` and `lab fault` for uplinks, CPU and storage: parsing,
and the one-line errors that come before anything needs root."""

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabricscope.lab import cli, cli_faults
from fabricscope.lab.model import plan

ROOT = Path(__file__).resolve().parents[2]


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["lab", *argv])


def test_new_faults_parse():
    args = parse("up", "--name", "x", "--nodes", "4", "--tors", "2")
    assert (args.nodes, args.tors) == (4, 2)
    assert parse("up", "--name", "x", "--nodes", "4").tors == 1
    args = parse("fault", "--name", "x", "--uplink", "tor0", "shape", "--rate", "200mbit",
                 "--burst", "16kb")
    assert (args.func, args.uplink, args.node, args.rate, args.direction) == \
        (cli_faults.cmd_fault_shape, "tor0", None, "200mbit", None)
    args = parse("fault", "--name", "x", "--uplink", "tor1", "loss", "2", "--direction", "down")
    assert (args.func, args.pct, args.direction) == (cli_faults.cmd_fault_loss, "2", "down")
    args = parse("fault", "--name", "x", "--node", "1", "delay", "5ms")
    assert (args.func, args.node, args.delay) == (cli_faults.cmd_fault_delay, 1, "5ms")
    args = parse("fault", "--name", "x", "--node", "1", "cpu", "30")
    assert (args.func, args.node, args.pct) == (cli_faults.cmd_fault_cpu, 1, "30")
    args = parse("fault", "--name", "x", "storage", "--rate", "20mbit", "--delay", "50ms")
    assert (args.func, args.action, args.rate, args.delay) == \
        (cli_faults.cmd_fault_storage, None, "20mbit", "50ms")
    assert parse("fault", "--name", "x", "storage", "clear").action == "clear"
    args = parse("fault", "--name", "x", "--uplink", "tor0", "clear")
    assert (args.func, args.uplink) == (cli_faults.cmd_clear, "tor0")
    assert parse("clear", "--name", "x", "--uplink", "tor1").uplink == "tor1"


def test_node_and_uplink_exclude_each_other():
    with pytest.raises(SystemExit):
        parse("fault", "--name", "x", "--node", "0", "--uplink", "tor0", "clear")


def test_list_describes_every_kind_of_fault():
    lab = plan("demo", 4, "198.18.4.0/24", tors=2)
    lab.faults = {1: {"cpu": {"pct": 30.0, "quota_us": 30000, "period_us": 100000},
                      "loss": {"pct": 2.0, "direction": "tx"}},
                  2: {"delay": {"delay_s": 0.005, "pid": 4242}}}
    lab.uplink_faults = {"tor0": {"shape": {"rate_bps": 2 * 10**8, "burst": 16384,
                                            "limit": 66384, "direction": "up"}}}
    lab.storage_fault = {"rate_bps": 20_000_000, "delay_s": 0.05}
    assert cli_faults.describe_faults(lab) == (
        "node1: loss 2% tx, cpu 30%; node2: delay 5ms; tor0 uplink: shape 200mbit burst 16384B limit 66384B up; "
        "storage: rate 20mbit, delay 50ms")
    assert cli_faults.describe_faults(plan("demo", 2, "198.18.4.0/24")) == ""


@pytest.fixture
def labs(tmp_path, monkeypatch):
    """A state dir with lab 'one' (one ToR) and lab 'two' (4 nodes on 2 ToRs): their
    state files only, enough for every error found before root is needed."""
    monkeypatch.setenv("FABRICSCOPE_LAB_DIR", str(tmp_path))
    plan("one", 2, "198.18.4.0/24").save()
    plan("two", 4, "198.18.5.0/24", tors=2).save()
    return dict(os.environ)


@pytest.mark.parametrize("argv,cause", [
    (["up", "--name", "x", "--nodes", "2", "--tors", "3"], "ToR count 3 is out of range"),
    (["up", "--name", "x", "--nodes", "2", "--tors", "0"], "ToR count 0 is out of range"),
    (["fault", "--name", "one", "--uplink", "tor0", "loss", "1"], "has one ToR and no uplinks"),
    (["fault", "--name", "two", "--uplink", "tor2", "loss", "1"], "has no ToR 'tor2'"),
    (["fault", "--name", "two", "--uplink", "tor0", "loss", "1", "--direction", "tx"],
     "direction 'tx' does not apply to an uplink"),
    (["fault", "--name", "two", "--node", "0", "loss", "1", "--direction", "up"],
     "direction 'up' does not apply to a node's port"),
    (["fault", "--name", "two", "--node", "0", "shape", "--rate", "1gbit", "--burst", "32kb",
      "--direction", "up"], "--direction applies to uplinks only"),
    (["fault", "--name", "two", "--uplink", "tor0", "shape", "--rate", "x", "--burst", "32kb"],
     "rate 'x' is not valid"),
    (["fault", "--name", "two", "--node", "1", "cpu", "0"], "CPU share 0% is out of range"),
    (["fault", "--name", "two", "--node", "1", "cpu", "100000"], "is out of range"),
    (["fault", "--name", "two", "--node", "1", "cpu", "lots"], "CPU share 'lots' is not a number"),
    (["fault", "--name", "two", "cpu", "30"], "a CPU fault needs a node"),
    (["fault", "--name", "two", "--uplink", "tor0", "cpu", "30"], "a CPU fault is a node's"),
    (["fault", "--name", "two", "--node", "7", "cpu", "30"], "has no node 7"),
    (["fault", "--name", "two", "--node", "1", "delay", "soon"], "time 'soon'"),
    (["fault", "--name", "two", "--uplink", "tor0", "delay", "5ms"],
     "a delay is on a node's switch port"),
    (["fault", "--name", "two", "delay", "5ms"], "a delay needs a node"),
    (["fault", "--name", "two", "storage"], "a storage fault needs a rate or a delay"),
    (["fault", "--name", "two", "--node", "0", "storage", "--delay", "5ms"],
     "the storage fault is the lab's data server's"),
    (["fault", "--name", "two", "storage", "clear", "--rate", "1mbit"],
     "`storage clear` takes no --rate or --delay"),
    (["fault", "--name", "two", "storage", "--rate", "fast"], "rate 'fast' is not valid"),
    (["fault", "--name", "two", "storage", "--delay", "0"], "time '0' must be positive"),
    (["clear", "--name", "two", "--uplink", "spine"], "has no ToR 'spine'"),
    (["fault", "--name", "nolab", "--uplink", "tor0", "loss", "1"], "no lab named 'nolab'"),
])
def test_bad_fault_input_is_one_line_and_exit_2(labs, argv, cause):
    out = subprocess.run([sys.executable, "-m", "fabricscope", "lab", *argv], cwd=ROOT,
                         capture_output=True, text=True, env=labs)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabricscope: error: "), out.stderr
    assert cause in lines[0], lines[0]
