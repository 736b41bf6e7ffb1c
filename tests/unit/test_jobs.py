"""The job/rank rule (fabricscope/jobs.py) that markers, gloo and TCP owners share."""

from fabricscope.jobs import tags_from_env, tags_from_meta


def test_job_tag_falls_back_to_pid():
    assert tags_from_meta({}, 42) == {"rank": "-", "job": "42"}
    assert tags_from_meta({"rank": "0", "fabricscope_job": "j"}, 42) == {"rank": "0", "job": "j"}


def test_master_address_names_the_job_only_with_its_port():
    meta = {"rank": "3", "master_addr": "198.18.0.1", "master_port": "29500"}
    assert tags_from_meta(meta, 7) == {"rank": "3", "job": "198.18.0.1:29500"}
    assert tags_from_meta({"master_addr": "198.18.0.1"}, 7)["job"] == "7"
    assert tags_from_meta({**meta, "fabricscope_job": ""}, 7)["job"] == "198.18.0.1:29500"


def test_environment_follows_the_same_rule_and_ignores_other_variables():
    env = {"RANK": "1", "MASTER_ADDR": "198.18.0.1", "MASTER_PORT": "29500", "PATH": "/bin",
           "rank": "9"}
    assert tags_from_env(env, 7) == {"rank": "1", "job": "198.18.0.1:29500"}
    assert tags_from_env({**env, "FABRICSCOPE_JOB": "llm"}, 7) == {"rank": "1", "job": "llm"}
    assert tags_from_env({"PATH": "/bin"}, 7) == {"rank": "-", "job": "7"}


def test_a_kubernetes_job_is_named_as_a_person_names_it_and_other_ids_as_they_are():
    from fabricscope.diagnosis.finding import Finding
    from fabricscope.diagnosis.present import explain
    from fabricscope.jobs import job_label
    assert job_label("research/llama-70b-pretrain") == "llama-70b-pretrain in namespace research"
    for other in ("198.18.0.1:29500", "job-a", "4242", "a/b/c", "Team/Run"):
        assert job_label(other) == other
    f = Finding("lossy_link", "critical", "research/llama-70b-pretrain", {"node": "node1"},
                1, "Lossy link at node1")
    assert "job llama-70b-pretrain in namespace research" in explain(f)
