"""The Kubernetes manifests stay consistent with the code they deploy.

No cluster exists here; these checks read the manifests as Kubernetes objects
(apiVersion/kind/spec as the API defines them) and hold them against the CLI and
config declarations, so a renamed flag, port or environment variable fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from agent.config import AgentConfig
from collector.config import CollectorConfig

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _objects():
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def _containers(obj):
    return obj["spec"]["template"]["spec"]["containers"]


def test_every_object_has_the_kubernetes_basics():
    objs = _objects()
    assert {o["kind"] for _, o in objs} >= {"DaemonSet", "Deployment", "Service", "ConfigMap",
                                             "Namespace"}
    for name, obj in objs:
        assert obj["apiVersion"] in ("v1", "apps/v1"), name
        assert obj["metadata"]["name"], name
        if obj["kind"] in ("DaemonSet", "Deployment"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items(), name


def test_env_overrides_name_real_config_fields():
    fields = {"agent": {f.name for f in dataclasses.fields(AgentConfig)},
              "collector": {f.name for f in dataclasses.fields(CollectorConfig)}}
    seen = 0
    for _, obj in _objects():
        if obj["kind"] not in ("DaemonSet", "Deployment"):
            continue
        for c in _containers(obj):
            for env in c.get("env", []):
                _, section, key = env["name"].split("_", 2)
                assert key.lower() in fields[section.lower()], env["name"]
                seen += 1
    assert seen >= 3


def test_ports_and_probes_match_the_defaults():
    by_kind = {obj["kind"]: obj for _, obj in _objects()}
    agent = _containers(by_kind["DaemonSet"])[0]
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz",
                                                   "port": AgentConfig().metrics_port}
    collector = _containers(by_kind["Deployment"])[0]
    assert collector["readinessProbe"]["httpGet"]["port"] == CollectorConfig().metrics_port
    grpc_port = int(CollectorConfig().listen.rsplit(":", 1)[1])
    assert by_kind["Service"]["spec"]["ports"][0]["targetPort"] == grpc_port
    assert by_kind["DaemonSet"]["spec"]["template"]["spec"]["hostNetwork"] is True


def test_agent_configmap_is_a_valid_agent_config(tmp_path):
    from fabricscope.config import load
    cm = next(o for _, o in _objects() if o["kind"] == "ConfigMap")
    path = tmp_path / "agent.yaml"
    path.write_text(cm["data"]["agent.yaml"])
    cfg = load(AgentConfig, "agent", env={}, path=str(path))
    assert cfg.collector.endswith(":9470")
