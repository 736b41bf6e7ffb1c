"""Measurement declarations, one module per probe family (see fabricscope.schema).

The tags every training process's records carry, whichever source saw it, are
declared here once."""

#: a process's Kubernetes pod (agent/kube/resolver.py); absent outside Kubernetes
POD_TAGS = {
    "namespace": "Kubernetes namespace of the process's pod",
    "pod": "Kubernetes pod the process runs in",
}
#: the training job and rank of a process (fabricscope/jobs.py)
JOB_TAGS = {
    "job": "job id (FABRICSCOPE_JOB, else the Kubernetes job controller's pod label as "
           "NAMESPACE/NAME, else MASTER_ADDR:MASTER_PORT, else pid), the same for every "
           "source of one process",
    "rank": "training rank (RANK env, else the pod's index in its job; '-' when unknown)",
    **POD_TAGS,
}
