"""The pod resolver wired into the agent: flow owners, gloo's process table, the
records' schema and the agent's config."""

import json
import os
from pathlib import Path

import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.kube.cache import PodCache
from fabricscope.agent.kube.client import PodSource
from fabricscope.agent.kube.podlist import PodList, parse_pod_list
from fabricscope.agent.kube.resolver import PodResolver
from fabricscope.agent.kube.setup import build_resolver
from fabricscope.agent.probes.gloo.procs import ProcessTable
from fabricscope.agent.probes.gloo.records import _tags
from fabricscope.agent.probes.tcp.owners import Owners
from fabricscope.errors import UserError
from fabricscope.records import Record
from fabricscope.schema import validate

FIXTURES = Path(__file__).parent / "kube_fixtures"
FULL = parse_pod_list(json.loads((FIXTURES / "podlist_node_a.json").read_text()))
CGROUPS = {c["name"]: c["text"] for c in
           json.loads((FIXTURES / "cgroups.json").read_text())["cases"]}


def listed(*answers) -> PodResolver:
    answers = list(answers)
    cache = PodCache(lambda: answers.pop(0) if len(answers) > 1 else answers[0])
    cache.refresh()
    return PodResolver(cache)


def fake_process(root: Path, pid: int, cgroup: str, env: dict[str, str]) -> None:
    base = root / str(pid)
    (base / "ns").mkdir(parents=True)
    (root / "netns").touch()
    if not (base / "ns" / "net").exists():
        os.symlink(root / "netns", base / "ns" / "net")
    (base / "comm").write_text("python3\n")
    (base / "cgroup").write_text(cgroup)
    (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in env.items()))


def test_a_flow_owner_in_a_labelled_pod_carries_namespace_pod_and_the_job_name(tmp_path):
    fake_process(tmp_path, 20, CGROUPS["v2_systemd_burstable_containerd"],
                 {"RANK": "7", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    owner = Owners(proc=tmp_path, pods=listed(FULL))._read_owner(20)
    tags = owner.tags()
    assert (tags["namespace"], tags["pod"], tags["job"], tags["rank"]) == \
        ("research", "llama-pretrain-worker-3", "research/llama-pretrain", "7")
    assert tags["container"] == "4f2a9c1d0e8b"
    validate(Record("tcp_flow", 1, {"saddr": "10.0.0.2", "daddr": "10.0.0.1", "sport": "1",
                                    "dport": "2", "node": "node-a", **tags},
                    {"seconds": 1.0}))


def test_fabricscope_job_still_wins_and_the_pods_index_is_the_rank_without_rank(tmp_path):
    fake_process(tmp_path, 21, CGROUPS["v2_systemd_guaranteed_crio"], {"FABRICSCOPE_JOB": "mine"})
    tags = Owners(proc=tmp_path, pods=listed(FULL))._read_owner(21).tags()
    assert (tags["job"], tags["rank"], tags["pod"]) == ("mine", "1", "gpt-js-workers-0-1-x7k2p")


def test_a_process_outside_any_pod_keeps_the_tags_it_had(tmp_path):
    fake_process(tmp_path, 22, "0::/system.slice/sshd.service\n", {})
    assert Owners(proc=tmp_path, pods=listed(FULL))._read_owner(22).tags() == \
        {"pid": "22", "comm": "python3", "cgroup": "/system.slice/sshd.service"}


def test_gloo_waits_out_a_pending_pod_and_then_keeps_its_job(tmp_path):
    fake_process(tmp_path, 30, CGROUPS["v1_cgroupfs_guaranteed"],
                 {"RANK": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    pods = listed(PodList({}), FULL)
    table = ProcessTable(tmp_path, own_netns=os.stat(tmp_path / "netns").st_ino, pods=pods)
    assert table.get(30).job == "10.0.0.1:29500" and table.pids() == []   # not kept
    pods.cache.refresh()
    info = table.get(30)
    assert (info.job, info.namespace, info.pod) == ("research/finetune", "research",
                                                    "finetune-2-q9wzl")
    assert table.pids() == [30]
    validate(Record("gloo_step", 1, {**_tags(info), "node": "node-a"},
                    {"seconds": 1.0, "step": 1}))


def test_kubernetes_is_off_by_default_outside_a_cluster_and_on_inside():
    cfg = AgentConfig(node="node-a", kube_ca_file="")    # the system's roots
    assert build_resolver(cfg, env={}) is None
    inside = build_resolver(cfg, env={"KUBERNETES_SERVICE_HOST": "10.96.0.1",
                                      "KUBERNETES_SERVICE_PORT": "443"})
    assert inside.cache._fetch.__self__.endpoint.source is PodSource.APISERVER


def test_a_missing_ca_file_stops_the_start_with_one_line(tmp_path):
    cfg = AgentConfig(node="node-a", kube_pods="kubelet", kube_ca_file=str(tmp_path / "ca"))
    with pytest.raises(UserError, match="cannot read kube_ca_file") as err:
        build_resolver(cfg, env={})
    assert "kube_insecure_tls" in err.value.fix


def test_the_api_server_source_without_an_address_is_one_line_naming_kube_url():
    with pytest.raises(UserError) as err:
        build_resolver(AgentConfig(node="node-a", kube_pods="apiserver"), env={})
    assert "kube_url" in err.value.fix


def test_a_bad_pod_source_in_the_config_names_the_choices():
    with pytest.raises(UserError) as err:
        AgentConfig(node="n", kube_pods="etcd", probes=["markers"]).check()
    assert err.value.fix == "give auto, apiserver, kubelet or off"


def test_gloo_keeps_a_pod_of_this_node_off_the_host_network_and_nothing_else_foreign(tmp_path):
    """A training pod with a network namespace of its own is still this node's (a
    Kubernetes node is one kernel); a process in another namespace and in no pod is
    not, and outside Kubernetes the namespace alone decides."""
    fake_process(tmp_path, 40, CGROUPS["v1_cgroupfs_guaranteed"],
                 {"RANK": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    fake_process(tmp_path, 41, "0::/system.slice/sshd.service\n", {"RANK": "0"})
    elsewhere = os.stat(tmp_path / "netns").st_ino + 1        # the agent's: the host's
    table = ProcessTable(tmp_path, own_netns=elsewhere, pods=listed(FULL))
    info = table.get(40)
    assert info.local and (info.job, info.rank, info.pod) == \
        ("research/finetune", "2", "finetune-2-q9wzl")
    assert not table.get(41).local
    assert not ProcessTable(tmp_path, own_netns=elsewhere).get(40).local
