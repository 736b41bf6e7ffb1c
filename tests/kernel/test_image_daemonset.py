"""The agent and collector images (`make image`: deploy/image/build.sh), run as the
DaemonSet runs them: the agent's root filesystem under bubblewrap with exactly the
manifest's securityContext, mounts and host namespaces (tests/support/daemonset.py
reads them from deploy/kubernetes/base), in a lab node's network namespace; the
collector from its own image; InfluxDB on the host. Every default probe attaches and
records reach InfluxDB; with one capability the manifest grants removed, the agent
stops with the one line that names it."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess

import pytest

from fabricscope.agent import kernel
from fabricscope.agent.kernel import Capability
from fabricscope.agent.config import DEFAULT_PROBES
from fabricscope.lab import exec_argv
from fabricscope.lab.running import running_lab
from fabricscope.lab.stack import (AGENT_METRICS_PORT, await_condition, http_get, metric_value,
                                   running_stack, start_proc)
from fabricscope.services import terminate
from tests.support.daemonset import agent_pod

pytestmark = pytest.mark.root

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    out = tmp_path_factory.mktemp("image")
    proc = subprocess.run(["bash", "deploy/image/build.sh"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "IMAGE_OUT": str(out),
                                          "IMAGE_FORMAT": "dir"})
    assert proc.returncode == 0, proc.stderr[-3000:] + (out / "build.log").read_text()[-3000:]
    # the node's side of the contract (docs/deploy.md): the running kernel's headers
    # at /lib/modules/RELEASE/build (the pod mounts /lib/modules read-only)
    kernel.apply_links(kernel.plan_headers(os.uname().release, ""))
    return out


def on_node(node, argv: list[str]) -> list[str]:
    """argv in the node's network namespace, which stands for the host's network
    (hostNetwork): `ip netns exec` gives it the node's sysfs, and tracefs is mounted
    there as systemd mounts it on a node at boot."""
    return exec_argv(node, ["sh", "-c", "mountpoint -q /sys/kernel/tracing || "
                            "mount -t tracefs nodev /sys/kernel/tracing; exec \"$@\"", "sh",
                            *argv])


def collector_argv(images, lab) -> tuple[str, ...]:
    """The collector's image: no capability, the host's network (its Service's port),
    the lab's topology file mounted read-only (a ConfigMap in a cluster)."""
    topology = os.path.dirname(lab.topology_path)
    return ("bwrap", "--ro-bind", str(images / "collector"), "/", "--dev", "/dev", "--proc",
            "/proc", "--tmpfs", "/run", "--ro-bind", topology, topology, "--die-with-parent", "--clearenv",
            "--setenv", "PATH", "/usr/local/bin:/usr/bin", "--cap-drop", "ALL", "--",
            "fabricscope")


def effective_in_container(argv: list[str]) -> int:
    """CapEff of a process started as the container's (its bwrap prefix)."""
    prefix = argv[:argv.index("--") + 1]
    out = subprocess.run([*prefix, "grep", "CapEff", "/proc/self/status"], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[1], 16)


def test_the_container_gets_exactly_the_manifests_capabilities(images, tmp_path):
    pod = agent_pod()
    argv = pod.argv(images / "agent", tmp_path, "node0")
    assert effective_in_container(argv) == sum(1 << Capability[c] for c in pod.granted())
    assert {"BPF", "PERFMON", "NET_ADMIN", "SYS_PTRACE"} <= set(pod.granted())


def test_the_daemonsets_agent_attaches_every_default_probe_and_its_records_reach_influxdb(
        images, tmp_path):
    pod = agent_pod()
    with running_lab(nodes=2) as lab, \
            running_stack(lab, agents=False, command=collector_argv(images, lab)) as stack:
        node = lab.nodes[0]
        argv = pod.argv(images / "agent", tmp_path, node.name, "--collector",
                        stack.collector_addr)
        agent = start_proc("agent-daemonset", on_node(node, argv), tmp_path)
        try:
            url = f"http://{node.address}:{AGENT_METRICS_PORT}"

            def ready() -> bool:
                assert agent.alive(), agent.log_tail(20)
                return http_get(f"{url}/readyz")[0] == 200
            await_condition(ready, 300, "the DaemonSet's agent to be ready")
            metrics = http_get(f"{url}/metrics")[1]
            for probe in DEFAULT_PROBES:
                assert metric_value(metrics, "fabricscope_agent_probe_attached",
                                    {"probe": probe}) == 1, (probe, agent.log_tail(30))

            def stored() -> int:
                rows = stack.influx.query("SELECT count(*) FROM tcp_node WHERE node = 'node0'",
                                          db="fabricscope")
                return len(rows)
            await_condition(stored, 120, "the agent's records in InfluxDB")
        finally:
            stop_container(agent.popen)
        assert agent.popen.returncode == 0, agent.log_tail(20)
        # the stop line names what was lost; the programs' skipped hits (missed_hits,
        # rebuilt from later hits: docs/architecture.md) are the kernel's, not a loss
        stopped = [line for line in agent.log_tail(5).splitlines() if " stopped; " in line]
        assert stopped and not re.search(r"\b(lost|decode_errors|handler_errors|unattributed) \d",
                                         stopped[-1]), agent.log_tail(20)


def stop_container(popen: subprocess.Popen) -> None:
    """SIGTERM to the container's process, as a kubelet stops a pod, and its exit
    awaited: bwrap waits for it and exits with its status (bwrap itself, signalled,
    would take it down with SIGKILL: --die-with-parent)."""
    pid = popen.pid
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except FileNotFoundError:
        children = []
    for child in children:
        os.kill(child, signal.SIGTERM)
    try:
        popen.wait(timeout=30)
    except subprocess.TimeoutExpired:
        terminate(popen, 10)


def test_the_init_container_puts_the_nccl_profiler_plugin_on_the_node(images, tmp_path):
    """With no capability and a read-only root, as the manifest runs it: the plugin
    the image carries lands in the node's directory, whole, and NCCL finds its
    entry points in it."""
    init = agent_pod().init_container("nccl-profiler")
    assert init.granted() == []
    proc = subprocess.run(init.argv(images / "agent", tmp_path, "node0"), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (mount,) = init.container["volumeMounts"]
    placed = tmp_path / "host" / mount["name"]
    assert sorted(p.name for p in placed.iterdir()) == ["libnccl-profiler-fabricscope.so"]
    plugin = placed / "libnccl-profiler-fabricscope.so"
    shipped = images / "agent" / "usr/local/lib/fabricscope/libnccl-profiler-fabricscope.so"
    assert plugin.read_bytes() == shipped.read_bytes()
    lib = ctypes.CDLL(str(plugin))
    assert all(hasattr(lib, f"ncclProfiler_v{v}") for v in range(1, 7))


@pytest.mark.parametrize("dropped", ["BPF", "PERFMON", "NET_ADMIN", "SYS_PTRACE"])
def test_without_one_of_its_capabilities_the_agent_stops_with_one_line_naming_it(
        images, tmp_path, dropped):
    pod = agent_pod()
    assert dropped in pod.capabilities
    with running_lab(nodes=1) as lab:
        node = lab.nodes[0]
        argv = pod.argv(images / "agent", tmp_path, node.name, "--collector",
                        f"{lab.gateway}:1", drop=dropped)
        assert not effective_in_container(argv) >> Capability[dropped] & 1
        proc = subprocess.run(on_node(node, argv), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fabricscope: error: missing capability ") and \
        f"CAP_{dropped} " in last and last.count("CAP_") == 1, proc.stderr
