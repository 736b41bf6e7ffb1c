"""Which training job and rank a process belongs to: the one rule every source uses.

The markers ring (its JSON metadata), the gloo probe and the TCP flow owners
(a process's environment) all tag records with `job` and `rank`; they must agree,
or records of one process would not join. The job id is FABRICSCOPE_JOB, else
the orchestrator's name of the job (Kubernetes: NAMESPACE/NAME, the name from the
job controller's pod label, agent/kube/training.py and resolver.job_id), else MASTER_ADDR:MASTER_PORT (what every rank of a
torch.distributed job shares), else the pid (a process on its own). The rank is
RANK, else the pod's index in its job, '-' when neither is known.
"""

from __future__ import annotations

import re

from fabricscope.markers import META_ENV

#: a Kubernetes training job's id: NAMESPACE/NAME (a DNS label, a DNS subdomain)
_KUBE_JOB = re.compile(r"^([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)/([a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)$")


def job_label(job: str) -> str:
    """A job as a person names it: a Kubernetes training job (NAMESPACE/NAME) as
    "NAME in namespace NAMESPACE"; any other id (a rendezvous address, a
    FABRICSCOPE_JOB) as it is."""
    m = _KUBE_JOB.match(job)
    return f"{m.group(2)} in namespace {m.group(1)}" if m else job


def tags_from_meta(meta: dict, pid: int, orchestrator_job: str = "",
                   orchestrator_index: str = "") -> dict[str, str]:
    """rank/job tags from lower-cased META_ENV keys (a ring's JSON metadata)."""
    if meta.get("fabricscope_job"):
        job = str(meta["fabricscope_job"])
    elif orchestrator_job:
        job = orchestrator_job
    elif meta.get("master_addr") and meta.get("master_port"):
        job = f"{meta['master_addr']}:{meta['master_port']}"
    else:
        job = str(pid)
    return {"rank": str(meta.get("rank", orchestrator_index or "-")), "job": job}


def tags_from_env(env: dict[str, str], pid: int, orchestrator_job: str = "",
                  orchestrator_index: str = "") -> dict[str, str]:
    """rank/job tags from a process's environment, with the rule of tags_from_meta
    (the markers writer copies the same META_ENV variables into its metadata)."""
    return tags_from_meta({k.lower(): env[k] for k in META_ENV if k in env}, pid,
                          orchestrator_job, orchestrator_index)
