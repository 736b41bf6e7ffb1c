"""Kubernetes: which pod and training job each process belongs to.

- cgroup.py: /proc/PID/cgroup -> pod UID and container ID (systemd and cgroupfs
  drivers, cgroup v1 and v2);
- podlist.py: a PodList (kubelet /pods, or the API server's pods of this node) ->
  pods by UID;
- training.py: a pod's labels -> its training job and its index in the job;
- client.py: fetches the pod list (bearer token, CA or kubelet's self-signed cert);
- cache.py: keeps the list, relisting in a thread (periodically, sooner after a
  miss, with backoff while unreachable), never on a probe's hot path;
- resolver.py: cgroup text -> PodIdentity, with counters of what stayed unknown;
- topology.py: node labels (`kubectl get nodes -o json`) -> the topology file.
"""
