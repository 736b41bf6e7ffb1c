import json
from pathlib import Path

import pytest

from fabricscope.agent.kube.podlist import parse_pod_list
from fabricscope.agent.kube.training import JobController, training_job
from fabricscope.errors import UserError

FIXTURES = Path(__file__).parent / "kube_fixtures"


def pod_list():
    return parse_pod_list(json.loads((FIXTURES / "podlist_node_a.json").read_text()))


def test_a_kubelet_pod_list_gives_each_pod_by_uid_and_counts_the_garbled_item():
    listed = pod_list()
    assert listed.garbled == 1
    assert len(listed.pods) == 7
    pod = listed.pods["5f0b6c2e-8a4d-4c1e-9b7a-2d3e4f5a6b7c"]
    assert (pod.namespace, pod.name, pod.node) == ("research", "llama-pretrain-worker-3", "node-a")
    assert pod.container_ids == {"4f2a9c1d0e8b7a6f5c4d3e2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29"}


def test_init_container_ids_belong_to_their_pod_whatever_the_runtime_prefix():
    pod = pod_list().pods["0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"]
    assert pod.container_ids == {"2" * 64, "9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c"}


def test_an_answer_that_is_no_pod_list_is_one_user_error():
    with pytest.raises(UserError, match="not a PodList"):
        parse_pod_list({"kind": "Status", "code": 403})


@pytest.mark.parametrize("uid, job, controller, index", [
    ("5f0b6c2e-8a4d-4c1e-9b7a-2d3e4f5a6b7c", "llama-pretrain", JobController.KUBEFLOW, "3"),
    ("0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f", "gpt-js", JobController.JOBSET, "1"),
    ("11112222-3333-4444-5555-666677778888", "mnist-vc", JobController.VOLCANO, "0"),
    ("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "vllm-lws", JobController.LEADERWORKERSET, "2"),
    ("d1e2f3a4-b5c6-4d7e-8f90-a1b2c3d4e5f6", "finetune", JobController.BATCH, "2"),
])
def test_each_controllers_labels_name_the_training_job_and_the_pods_index(uid, job, controller,
                                                                          index):
    pod = pod_list().pods[uid]
    found = training_job(pod.labels, pod.annotations)
    assert (found.name, found.controller, found.index) == (job, controller, index)


def test_a_jobset_pod_belongs_to_the_jobset_not_to_its_child_batch_job():
    pod = pod_list().pods["0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"]
    assert pod.labels["job-name"] == "gpt-js-workers-1"
    assert training_job(pod.labels, pod.annotations).name == "gpt-js"


def test_configured_label_keys_come_before_the_builtin_ones():
    labels = {"team.example.com/run": "run-42", "job-name": "run-42-launcher"}
    found = training_job(labels, {}, extra_keys=("team.example.com/run",))
    assert (found.name, found.controller) == ("run-42", JobController.CONFIGURED)


def test_a_pod_no_job_controller_labelled_has_no_training_job():
    pod = pod_list().pods["3b5d7f9a1c2e4f6a8b0c2d4e6f8a0b1c"]
    assert training_job(pod.labels, pod.annotations) is None
    assert training_job({"job-name": ""}, {}) is None


def test_an_index_that_is_not_a_number_is_left_out():
    found = training_job({"jobset.sigs.k8s.io/jobset-name": "j",
                          "jobset.sigs.k8s.io/job-index": "x"}, {})
    assert found.index == ""
