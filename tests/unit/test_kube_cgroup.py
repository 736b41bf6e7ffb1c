import json
from pathlib import Path

import pytest

from fabricscope.agent.kube.cgroup import CgroupVerdict, parse_pod_cgroup

CASES = json.loads((Path(__file__).parent / "kube_fixtures" / "cgroups.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_real_cgroup_shape_names_its_pod_container_and_qos(case):
    found = parse_pod_cgroup(case["text"])
    want = case["expected"]
    assert found.verdict is CgroupVerdict(want["verdict"])
    assert (found.pod_uid, found.container_id) == (want["pod_uid"], want["container_id"])
    assert (found.qos.value if found.qos else None) == want["qos"]


def test_the_v2_line_wins_over_v1_lines_that_name_another_pod():
    text = ("4:cpu,cpuacct:/kubepods/besteffort/pod74c13223-5a00-11e9-b385-42010a80018d/" + "a" * 64
            + "\n0::/kubepods.slice/kubepods-pod0c1d2e3f_4a5b_6c7d_8e9f_0a1b2c3d4e5f.slice/"
            + "cri-containerd-" + "b" * 64 + ".scope\n")
    found = parse_pod_cgroup(text)
    assert (found.pod_uid, found.container_id) == ("0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f", "b" * 64)


def test_a_crio_conmon_scope_is_the_pod_without_a_container():
    text = ("0::/kubepods.slice/kubepods-pod0c1d2e3f_4a5b_6c7d_8e9f_0a1b2c3d4e5f.slice/"
            "crio-conmon-" + "c" * 64 + ".scope\n")
    found = parse_pod_cgroup(text)
    assert found.verdict is CgroupVerdict.POD and found.container_id == ""


def test_a_pod_word_in_a_host_path_is_not_a_pod():
    assert parse_pod_cgroup("0::/system.slice/podman.service\n").verdict is CgroupVerdict.HOST
    assert parse_pod_cgroup("0::/user.slice/pod1234\n").verdict is CgroupVerdict.HOST


def test_an_empty_file_is_garbled():
    assert parse_pod_cgroup("").verdict is CgroupVerdict.GARBLED
