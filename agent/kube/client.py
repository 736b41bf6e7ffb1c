"""Fetches the pod list of this node: from the kubelet or from the API server.

    kubelet     GET <kube_url>/pods                      (https://NODE:10250; RBAC nodes/proxy)
    apiserver   GET <kube_url>/api/v1/pods?fieldSelector=spec.nodeName=<node>   (RBAC pods list)

Both answer a PodList. The bearer token is read again at each fetch: projected
service-account tokens are rotated on disk. The kubelet's serving certificate is
often self-signed, hence kube_insecure_tls; the API server's is signed by the
service-account CA (kube_ca_file). Every failure is a KubeUnreachable of one line
naming the cause and the fix; the cache counts it and logs it once per outage.
"""

from __future__ import annotations

import enum
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from fabricscope.agent.kube.podlist import PodList, parse_pod_list
from fabricscope.errors import UserError

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
KUBELET_URL = "https://127.0.0.1:10250"


class PodSource(enum.Enum):
    OFF = "off"
    AUTO = "auto"            # apiserver inside a cluster (KUBERNETES_SERVICE_HOST set), else off
    APISERVER = "apiserver"
    KUBELET = "kubelet"


class KubeUnreachable(UserError):
    """The pod list could not be fetched or read."""


@dataclass(frozen=True)
class Endpoint:
    source: PodSource                # APISERVER or KUBELET (resolved from AUTO already)
    url: str                         # base URL, no trailing path
    node: str
    token_file: str = ""
    ca_file: str = ""
    insecure_tls: bool = False
    timeout_s: float = 5.0

    def pods_url(self) -> str:
        base = self.url.rstrip("/")
        if self.source is PodSource.KUBELET:
            return base + "/pods"
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self.node}"})
        return f"{base}/api/v1/pods?{query}"


def resolve_source(source: PodSource, env: dict[str, str] | os._Environ) -> PodSource:
    """AUTO -> APISERVER inside a cluster (the service env of every pod), else OFF."""
    if source is PodSource.AUTO:
        return PodSource.APISERVER if env.get("KUBERNETES_SERVICE_HOST") else PodSource.OFF
    return source


def default_url(source: PodSource, env) -> str:
    if source is PodSource.KUBELET:
        return KUBELET_URL
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}" if host else ""


class PodListClient:
    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self._context = _tls_context(endpoint) if endpoint.url.startswith("https:") else None

    def fetch(self) -> PodList:
        """One GET of the node's pods; KubeUnreachable on any failure."""
        e = self.endpoint
        request = urllib.request.Request(e.pods_url(), headers={"Accept": "application/json"})
        token = _read_token(e.token_file)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        where = f"{e.source.value} {e.url}"
        try:
            with urllib.request.urlopen(request, timeout=e.timeout_s,
                                        context=self._context) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:
            raise KubeUnreachable(f"{where} answered HTTP {exc.code} {exc.reason}",
                                  _fix_for_status(exc.code, e.source)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubeUnreachable(f"cannot reach {where}: {reason}",
                                  "check kube_url, and that the agent runs with "
                                  "hostNetwork (kubelet) or can reach the API server") from None
        try:
            return parse_pod_list(json.loads(body), where)
        except ValueError:
            raise KubeUnreachable(f"{where} answered something that is not JSON",
                                  "point kube_url at the kubelet or the API server") from None
        except UserError as exc:
            raise KubeUnreachable(exc.cause, exc.fix) from None


def _fix_for_status(code: int, source: PodSource) -> str:
    if code in (401, 403):
        need = "nodes/proxy get" if source is PodSource.KUBELET else "pods list"
        return f"grant the agent's service account {need} (RBAC) and check kube_token_file"
    return "check kube_url and kube_pods"


def _read_token(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""       # no token: the server answers 401, which names the fix


def _tls_context(e: Endpoint) -> ssl.SSLContext:
    if e.insecure_tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        return ssl.create_default_context(cafile=e.ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"cannot read kube_ca_file {e.ca_file}: {exc}",
                        "give the PEM CA of the kubelet or API server, or set "
                        "kube_insecure_tls for a kubelet with a self-signed certificate") from None
