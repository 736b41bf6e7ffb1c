"""A pod's training job and its index in the job, from the labels the job
controllers put on their pods.

Precedence, first label present wins:
  1. the keys of config kube_job_labels (an in-house controller, or a preference);
  2. Kubeflow training-operator `training.kubeflow.org/job-name` (PyTorchJob, MPIJob...);
  3. JobSet `jobset.sigs.k8s.io/jobset-name`;
  4. Volcano `volcano.sh/job-name`;
  5. LeaderWorkerSet `leaderworkerset.sigs.k8s.io/name`;
  6. batch Job `batch.kubernetes.io/job-name`, then the older `job-name`.
Wrappers come before what they create: a JobSet runs its replicated jobs as batch
Jobs, whose pods carry both the JobSet's name and their child Job's (`<jobset>-
<replicatedjob>-<index>`); the training job is the JobSet, so the batch labels come
last, as the job of a plain Job only. The operators above create pods directly and
do not label one pod with another's name.

The index (a pod's place in its job; the rank where a job runs one process per
pod) comes from `training.kubeflow.org/replica-index`, `jobset.sigs.k8s.io/job-index`,
`batch.kubernetes.io/job-completion-index` (a label since 1.28, an annotation
before), `leaderworkerset.sigs.k8s.io/worker-index` or `volcano.sh/task-index`.
The pods' environment is not in the pod list (values set at run time by torchrun
are nowhere in it), so RANK from /proc/PID/environ stays the rank when set.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class JobController(enum.Enum):
    CONFIGURED = "configured"
    KUBEFLOW = "kubeflow"
    JOBSET = "jobset"
    VOLCANO = "volcano"
    LEADERWORKERSET = "leaderworkerset"
    BATCH = "batch"


BUILTIN_JOB_LABELS: tuple[tuple[str, JobController], ...] = (
    ("training.kubeflow.org/job-name", JobController.KUBEFLOW),
    ("jobset.sigs.k8s.io/jobset-name", JobController.JOBSET),
    ("volcano.sh/job-name", JobController.VOLCANO),
    ("leaderworkerset.sigs.k8s.io/name", JobController.LEADERWORKERSET),
    ("batch.kubernetes.io/job-name", JobController.BATCH),
    ("job-name", JobController.BATCH),
)

INDEX_KEYS = (
    "training.kubeflow.org/replica-index",
    "jobset.sigs.k8s.io/job-index",
    "batch.kubernetes.io/job-completion-index",
    "leaderworkerset.sigs.k8s.io/worker-index",
    "volcano.sh/task-index",
)


@dataclass(frozen=True)
class TrainingJob:
    name: str
    controller: JobController
    index: str = ""          # "" when no label or annotation gives it


def training_job(labels: dict[str, str], annotations: dict[str, str],
                 extra_keys: tuple[str, ...] = ()) -> TrainingJob | None:
    """The pod's training job, None when no known label names one."""
    keys = [(k, JobController.CONFIGURED) for k in extra_keys] + list(BUILTIN_JOB_LABELS)
    for key, controller in keys:
        if labels.get(key):
            return TrainingJob(labels[key], controller, _index(labels, annotations))
    return None


def _index(labels: dict[str, str], annotations: dict[str, str]) -> str:
    for key in INDEX_KEYS:
        value = labels.get(key) or annotations.get(key) or ""
        if value.isdigit():
            return value
    return ""
