"""The Kubernetes manifests stay consistent with the code they deploy, and keep the
agent's privileges to what it uses.

Every kustomization under deploy/kubernetes/ (the base and each overlay) is rendered
with `kubectl kustomize` (offline) and its objects are held against the CLI and the
config declarations, so a renamed flag, port or environment variable fails here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fabricscope.agent.config import AgentConfig
from fabricscope.collector.config import CollectorConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ["base"] + sorted(f"overlays/{p.name}" for p in (DEPLOY / "overlays").iterdir()
                                   if (p / "kustomization.yaml").is_file())
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl missing: the manifests are "
                                   "rendered with `kubectl kustomize` (apt-get install kubectl)")

#: what the agent's probes use, each for the reason deploy/kubernetes/base says
AGENT_CAPABILITIES = {"BPF", "PERFMON", "NET_ADMIN", "SYS_RESOURCE", "SYS_PTRACE"}
#: the only host paths the agent writes: marker rings it deletes, its spool
AGENT_WRITABLE_MOUNTS = {"/run/fabricscope/markers", "/var/lib/fabricscope/spool"}


@functools.lru_cache(maxsize=None)
def render(kustomization: str) -> tuple[dict, ...]:
    """The objects `kubectl kustomize deploy/kubernetes/<kustomization>` prints."""
    proc = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / kustomization)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"kubectl kustomize {kustomization}: {proc.stderr.strip()}"
    return tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)


def one(objs, kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(obj: dict) -> dict:
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def port_number(c: dict, port) -> int:
    """A probe's or Service's port: a number, or the name of a container port."""
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


pytestmark = needs_kubectl


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_workload_selects_its_own_pods(kustomization):
    for obj in render(kustomization):
        assert obj["metadata"]["name"], obj["kind"]
        if obj["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_env_overrides_name_real_config_fields(kustomization):
    fields = {"AGENT": {f.name for f in dataclasses.fields(AgentConfig)},
              "COLLECTOR": {f.name for f in dataclasses.fields(CollectorConfig)}}
    objs = render(kustomization)
    seen = 0
    for name in ("fabricscope-agent", "fabricscope-collector"):
        workload = next(o for o in objs if o["metadata"]["name"] == name
                        and o["kind"] in ("DaemonSet", "Deployment"))
        for env in env_of(container(workload)):
            prefix, section, key = env.split("_", 2)
            assert prefix == "FABRICSCOPE" and key.lower() in fields[section], env
            seen += 1
    assert seen >= 3


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_ports_and_probes_match_the_defaults(kustomization):
    objs = render(kustomization)
    agent = container(one(objs, "DaemonSet"))
    metrics = AgentConfig().metrics_port
    assert port_number(agent, agent["readinessProbe"]["httpGet"]["port"]) == metrics
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": metrics}
    collector = container(one(objs, "Deployment", "fabricscope-collector"))
    assert port_number(collector, collector["readinessProbe"]["httpGet"]["port"]) == \
        CollectorConfig().metrics_port
    grpc_port = CollectorConfig().listen_host_port()[1]
    service = one(objs, "Service", "fabricscope-collector")
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert port_number(collector, grpc["targetPort"]) == grpc_port == grpc["port"]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_agent_config_points_at_the_collector_service(kustomization, tmp_path):
    from fabricscope.config import load
    objs = render(kustomization)
    path = tmp_path / "agent.yaml"
    path.write_text(one(objs, "ConfigMap", "fabricscope-agent")["data"]["agent.yaml"])
    cfg = load(AgentConfig, "agent", env={}, path=str(path))
    host, _, port = cfg.collector.rpartition(":")
    service = one(objs, "Service", "fabricscope-collector")
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) in {p["port"] for p in service["spec"]["ports"]}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_agent_runs_with_named_capabilities_not_privileged(kustomization):
    pod = one(render(kustomization), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    ctx = container({"spec": {"template": {"spec": pod}}})["securityContext"]
    assert ctx["privileged"] is False and ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert set(ctx["capabilities"]["add"]) == AGENT_CAPABILITIES


def test_each_capability_and_mount_of_the_agent_says_why():
    text = (DEPLOY / "base" / "agent-daemonset.yaml").read_text()
    for cap in AGENT_CAPABILITIES:
        assert re.search(rf"^\s+- {cap}\s+# \S", text, re.M), f"capability {cap} has no reason"
    mounts = text[text.index("volumeMounts:"):text.index("volumes:")].splitlines()
    for i, line in enumerate(mounts):
        if line.strip().startswith("- {name:") and "config" not in line:
            assert mounts[i - 1].strip().startswith("#"), f"no reason above {line.strip()}"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_agent_writes_only_its_spool_and_the_markers(kustomization):
    c = container(one(render(kustomization), "DaemonSet"))
    writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
    assert writable == AGENT_WRITABLE_MOUNTS


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_agent_spools_under_the_mounted_spool_directory(kustomization):
    spool_root = AgentConfig().spool_dir.split("{node}")[0].rstrip("/")
    c = container(one(render(kustomization), "DaemonSet"))
    assert spool_root in {m["mountPath"] for m in c["volumeMounts"]}
    assert env_of(c)["FABRICSCOPE_AGENT_NODE"]["valueFrom"] == \
        {"fieldRef": {"fieldPath": "spec.nodeName"}}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_agent_role_only_reads_pods_and_nodes(kustomization):
    objs = render(kustomization)
    role = one(objs, "ClusterRole", "fabricscope-agent")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods", "nodes"],
                              "verbs": ["get", "list", "watch"]}]
    binding = one(objs, "ClusterRoleBinding", "fabricscope-agent")
    pod = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": "fabricscope"}]
    assert not any(o["kind"] in ("Role", "ClusterRole") for o in objs
                   if o["metadata"]["name"] != "fabricscope-agent")


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_containers_other_than_the_agent_run_unprivileged(kustomization):
    for obj in render(kustomization):
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
        ctx = container(obj)["securityContext"]
        assert ctx == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}, obj["metadata"]["name"]


def test_the_collector_survives_voluntary_disruption_one_replica_at_a_time():
    objs = render("base")
    deployment = one(objs, "Deployment", "fabricscope-collector")
    pdb = one(objs, "PodDisruptionBudget", "fabricscope-collector")
    assert deployment["spec"]["replicas"] > pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_the_base_names_the_local_images_and_production_a_registry():
    def images(kustomization):
        return sorted(container(o)["image"] for o in render(kustomization)
                      if o["kind"] in ("DaemonSet", "Deployment"))
    assert images("base") == ["localhost/fabricscope-agent:0.1.0",
                              "localhost/fabricscope-collector:0.1.0"]
    assert all(not i.startswith("localhost/") and i.endswith(":0.1.0")
               for i in images("overlays/production"))


def test_the_mtls_overlay_gives_both_ends_their_certificates():
    objs = render("overlays/production")
    agent, collector = (container(one(objs, kind)) for kind in ("DaemonSet", "Deployment"))
    agent_files = {k: e["value"] for k, e in env_of(agent).items() if "_TLS_" in k}
    collector_files = {k: e["value"] for k, e in env_of(collector).items() if "_TLS_" in k}
    assert set(agent_files) == {f"FABRICSCOPE_AGENT_TLS_{k}" for k in ("CA", "CERT", "KEY")}
    assert set(collector_files) == {f"FABRICSCOPE_COLLECTOR_TLS_{k}"
                                    for k in ("CERT", "KEY", "CLIENT_CA")}
    for c, files in ((agent, agent_files), (collector, collector_files)):
        mounted = {m["mountPath"] for m in c["volumeMounts"]}
        assert {str(Path(f).parent) for f in files.values()} <= mounted


def test_the_example_influxdb_overlay_points_the_collector_at_its_statefulset():
    objs = render("overlays/in-cluster-influxdb")
    env = env_of(container(one(objs, "Deployment")))
    service = one(objs, "Service", "fabricscope-influxdb")
    assert env["FABRICSCOPE_COLLECTOR_INFLUX_URL"]["value"] == \
        f"http://{service['metadata']['name']}.fabricscope.svc:{service['spec']['ports'][0]['port']}"
    assert env["FABRICSCOPE_COLLECTOR_INFLUX_API"]["value"] == "v1"
    assert "FABRICSCOPE_COLLECTOR_INFLUX_TOKEN" not in env
    assert one(objs, "StatefulSet")["spec"]["volumeClaimTemplates"]
