"""A PodList (the kubelet's /pods, or the API server's /api/v1/pods of one node) ->
the pods this agent can name, by UID.

Only what the tags need is kept: namespace, name, UID, node, labels, annotations
and the IDs of the pod's containers (status.containerStatuses[].containerID,
`containerd://<64 hex>`, `cri-o://...`, `docker://...`; init and ephemeral
containers too). An item without metadata.uid/name/namespace is garbled: skipped
and counted, the rest of the list is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.errors import UserError

_STATUS_LISTS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


@dataclass(frozen=True)
class Pod:
    uid: str
    namespace: str
    name: str
    node: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    container_ids: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PodList:
    pods: dict[str, Pod]         # by UID
    garbled: int = 0             # items skipped: not a pod object with uid, name, namespace


def parse_pod_list(obj: object, source: str = "pod list") -> PodList:
    """Decoded JSON -> PodList; a body that is no PodList at all is a UserError."""
    if not isinstance(obj, dict) or not isinstance(obj.get("items"), list):
        kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise UserError(f"{source}: answer is not a PodList (kind {kind!r})",
                        "point kube_url at the kubelet (https://NODE:10250) or the API server")
    pods: dict[str, Pod] = {}
    garbled = 0
    for item in obj["items"]:
        pod = _pod(item)
        if pod is None:
            garbled += 1
        else:
            pods[pod.uid] = pod
    return PodList(pods, garbled)


def _pod(item: object) -> Pod | None:
    if not isinstance(item, dict):
        return None
    meta = item.get("metadata")
    if not isinstance(meta, dict):
        return None
    uid, name, namespace = (meta.get(k) for k in ("uid", "name", "namespace"))
    if not all(isinstance(v, str) and v for v in (uid, name, namespace)):
        return None
    spec, status = item.get("spec"), item.get("status")
    node = spec.get("nodeName", "") if isinstance(spec, dict) else ""
    return Pod(uid=uid, namespace=namespace, name=name, node=str(node or ""),
               labels=_strings(meta.get("labels")),
               annotations=_strings(meta.get("annotations")),
               container_ids=frozenset(_container_ids(status)))


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def _container_ids(status: object) -> list[str]:
    """`<runtime>://<id>` -> id, from every container status list of the pod."""
    if not isinstance(status, dict):
        return []
    out = []
    for key in _STATUS_LISTS:
        for entry in status.get(key) or []:
            cid = entry.get("containerID", "") if isinstance(entry, dict) else ""
            if isinstance(cid, str) and "://" in cid:
                out.append(cid.partition("://")[2])
    return out
