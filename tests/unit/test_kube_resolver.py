import json
from pathlib import Path

import pytest

from fabricscope.agent.kube.cache import PodCache
from fabricscope.agent.kube.podlist import PodList, parse_pod_list
from fabricscope.agent.kube.resolver import PodIdentity, PodResolver, Resolution
from fabricscope.agent.kube.topology import main as topology_main
from fabricscope.agent.kube.topology import topology_from_nodes
from fabricscope.errors import UserError
from fabricscope.topology import parse_topology

FIXTURES = Path(__file__).parent / "kube_fixtures"
CGROUPS = {c["name"]: c["text"] for c in
           json.loads((FIXTURES / "cgroups.json").read_text())["cases"]}


class ListSource:
    """Pod lists to hand out one per relist; an exception instance is raised instead."""

    def __init__(self, *answers):
        self.answers = list(answers)

    def __call__(self) -> PodList:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


FULL = parse_pod_list(json.loads((FIXTURES / "podlist_node_a.json").read_text()))
EMPTY = PodList({})


def resolver(*answers, refresh=True) -> PodResolver:
    cache = PodCache(ListSource(*answers))
    if refresh:
        cache.refresh()
    return PodResolver(cache)


def test_a_process_in_a_listed_pod_gets_namespace_pod_its_namespaced_job_and_index():
    res = resolver(FULL)
    assert res.identify(CGROUPS["v2_systemd_burstable_containerd"]) == (
        Resolution.POD, PodIdentity("research", "llama-pretrain-worker-3",
                                    "5f0b6c2e-8a4d-4c1e-9b7a-2d3e4f5a6b7c", "research/llama-pretrain",
                                    "3"))
    assert res.identify(CGROUPS["v1_cgroupfs_guaranteed"])[1].tags() == \
        {"namespace": "research", "pod": "finetune-2-q9wzl"}
    assert res.stats()["in_pod"] == 2


def test_a_static_pod_without_job_labels_has_a_pod_but_no_job():
    resolution, identity = resolver(FULL).identify(
        CGROUPS["v2_static_pod_hash_uid_pod_cgroup_itself"])
    assert resolution is Resolution.POD and (identity.pod, identity.job) == \
        ("kube-proxy-node-a", "")


def test_hidden_and_garbled_cgroups_and_host_processes_are_counted_apart():
    res = resolver(FULL)
    assert res.identify(CGROUPS["v2_private_cgroup_namespace"])[0] is Resolution.UNKNOWN
    assert res.identify(CGROUPS["garbled"])[0] is Resolution.UNKNOWN
    assert res.identify(CGROUPS["v2_host_service"])[0] is Resolution.NOT_IN_POD
    stats = res.stats()
    assert (stats["cgroup_hidden"], stats["cgroup_garbled"], stats["not_in_pod"]) == (1, 1, 1)


def test_a_pod_missing_from_the_list_is_pending_until_two_relists_later_then_unknown():
    res = resolver(EMPTY, EMPTY, EMPTY)
    text = CGROUPS["v2_systemd_burstable_containerd"]
    assert res.identify(text)[0] is Resolution.PENDING
    res.cache.refresh()             # may have begun before the miss
    assert res.identify(text)[0] is Resolution.PENDING
    res.cache.refresh()             # began after it: the pod would be listed by now
    assert res.identify(text)[0] is Resolution.UNKNOWN
    assert res.stats()["pending"] == 2 and res.stats()["pod_unlisted"] == 1


def test_a_pod_listed_by_the_relist_after_a_miss_is_found():
    res = resolver(EMPTY, FULL)
    text = CGROUPS["v2_systemd_guaranteed_crio"]
    assert res.identify(text)[0] is Resolution.PENDING
    res.cache.refresh()
    assert res.identify(text)[1].job == "ml/gpt-js"


def test_before_the_first_list_a_pod_is_pending_and_with_the_source_down_unknown():
    text = CGROUPS["v2_systemd_guaranteed_crio"]
    assert resolver(FULL, refresh=False).identify(text)[0] is Resolution.PENDING
    down = resolver(UserError("cannot reach kubelet", "check kube_url"))
    assert down.identify(text) == (Resolution.UNKNOWN, None)
    assert down.stats()["pod_list_unavailable"] == 1 and down.stats()["relist_failures"] == 1


def test_a_pid_whose_cgroup_file_is_gone_is_unknown(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(CGROUPS["v1_cgroupfs_guaranteed"])
    res = resolver(FULL)
    assert res.for_pid(tmp_path, 7)[1].job == "research/finetune"
    assert res.for_pid(tmp_path, 8)[0] is Resolution.UNKNOWN


NODES = json.loads((FIXTURES / "nodelist.json").read_text())
LEVELS = ["cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"]


def test_node_labels_give_each_node_its_tor_named_by_every_level():
    topology, left_out = topology_from_nodes(NODES, LEVELS)
    assert topology.tors == ("b1.sb1", "b1.sb2", "b2.sb1")
    assert topology.nodes == {"node-a": "b1.sb1", "node-b": "b1.sb2", "node-c": "b2.sb1"}
    assert left_out == ["node-d"]
    assert parse_topology(topology.to_yaml()) == topology


def test_one_level_label_such_as_the_zone_is_enough():
    topology, _ = topology_from_nodes(NODES, ["topology.kubernetes.io/zone"])
    assert topology.nodes_of("us-central1-a") == ("node-a", "node-b", "node-c")


def test_labels_no_node_carries_are_one_line_naming_the_fix():
    with pytest.raises(UserError, match="no node carries"):
        topology_from_nodes(NODES, ["example.com/rack"])


def test_the_topology_command_writes_the_file_and_names_the_nodes_left_out(tmp_path, capsys):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps(NODES))
    out = tmp_path / "topology.yaml"
    args = [str(nodes), "-o", str(out)] + [a for level in LEVELS for a in ("--level", level)]
    assert topology_main(args) == 0
    assert parse_topology(out.read_text()).tor_of("node-c") == "b2.sb1"
    assert "node-d" in capsys.readouterr().err
    assert topology_main([str(tmp_path / "none.json"), "--level", "x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_jobs_of_one_name_in_two_namespaces_stay_two_jobs():
    from fabricscope.agent.kube.resolver import job_id
    assert job_id("team-a", "finetune") != job_id("team-b", "finetune")
    assert job_id("research", "finetune") == "research/finetune"
