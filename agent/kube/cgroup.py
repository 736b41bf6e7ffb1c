"""A process's pod UID and container ID, read from its /proc/PID/cgroup.

The kubelet names a pod's cgroup after its UID and the runtime names each
container's after the container ID (kubelet pkg/kubelet/cm/cgroup_manager_linux.go,
cadvisor's container handlers):

    systemd driver   /kubepods.slice/kubepods-burstable.slice/
                       kubepods-burstable-pod<uid, '-' as '_'>.slice/cri-containerd-<id>.scope
                     (docker-<id>.scope, crio-<id>.scope; guaranteed QoS: no qos level,
                     /kubepods.slice/kubepods-pod<uid>.slice/...)
    cgroupfs driver  /kubepods/burstable/pod<uid>/<id>   (guaranteed: /kubepods/pod<uid>/<id>)

cgroup v1 writes one `N:controllers:path` line per hierarchy, v2 one `0::path`
line. A static pod's UID is 32 hex digits without dashes. The pod segment is
looked for anywhere in the path: kind nodes and a kubelet with a --cgroup-root
put a prefix before `kubepods`, and a reader in another cgroup namespace sees
`/../..` in front. A process in a private cgroup namespace shows only `0::/`:
its pod cannot be told from here (CgroupVerdict.HIDDEN, counted by the resolver).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class CgroupVerdict(enum.Enum):
    POD = "pod"              # a pod's cgroup: pod UID found (container ID when in one)
    HOST = "host"            # a cgroup outside kubepods (system services, the node's users)
    HIDDEN = "hidden"        # every path is the root: a private cgroup namespace
    GARBLED = "garbled"      # no line of the `N:controllers:path` form


class QosClass(enum.Enum):
    GUARANTEED = "guaranteed"
    BURSTABLE = "burstable"
    BESTEFFORT = "besteffort"


@dataclass(frozen=True)
class PodCgroup:
    verdict: CgroupVerdict
    pod_uid: str = ""        # canonical form: dashes, as metadata.uid
    container_id: str = ""   # 64 hex digits; "" for the pod's own cgroup (or conmon)
    qos: QosClass | None = None


_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(
    r"(?:^|/)(?:[a-z0-9.-]*?kubepods(?:-(?P<qos_sd>burstable|besteffort))?-)?"
    rf"pod(?P<uid>{_UUID}|[0-9a-f]{{32}})(?:\.slice)?(?=/|$)")
_QOS_FS = re.compile(r"/kubepods/(burstable|besteffort)/pod")
_CONTAINER = re.compile(r"^/(?:(?:cri-containerd|docker|crio)-)?([0-9a-f]{64})(?:\.scope)?(?=/|$)")


def parse_pod_cgroup(text: str) -> PodCgroup:
    """/proc/PID/cgroup text -> where the process runs. The v2 line wins when it names
    a pod (on a hybrid host v1 lines may lag behind); else the first v1 line that does."""
    paths: list[str] = []
    for line in text.splitlines():
        hierarchy, sep1, rest = line.partition(":")
        _, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hierarchy.isdigit() and path.startswith("/")):
            continue
        if hierarchy == "0":
            paths.insert(0, path)
        else:
            paths.append(path)
    if not paths:
        return PodCgroup(CgroupVerdict.GARBLED)
    for path in paths:
        found = _pod_in(path)
        if found is not None:
            return found
    if all(p == "/" for p in paths):
        return PodCgroup(CgroupVerdict.HIDDEN)
    return PodCgroup(CgroupVerdict.HOST)


def _pod_in(path: str) -> PodCgroup | None:
    m = _POD.search(path)
    if m is None:
        return None
    uid = m.group("uid").replace("_", "-")
    qos_name = m.group("qos_sd") or (q.group(1) if (q := _QOS_FS.search(path)) else "")
    qos = QosClass(qos_name) if qos_name else QosClass.GUARANTEED
    c = _CONTAINER.match(path[m.end():])
    return PodCgroup(CgroupVerdict.POD, uid, c.group(1) if c else "", qos)
