"""The agent's pod resolver from its config: None where Kubernetes is off."""

from __future__ import annotations

import os

from fabricscope.agent.kube.cache import PodCache
from fabricscope.agent.kube.client import Endpoint, PodListClient, PodSource, default_url, resolve_source
from fabricscope.agent.kube.resolver import PodResolver
from fabricscope.errors import UserError


def build_resolver(cfg, env=os.environ) -> PodResolver | None:
    """kube_pods off (or auto outside a cluster): None, and records carry no pod tags."""
    source = resolve_source(PodSource(cfg.kube_pods), env)
    if source is PodSource.OFF:
        return None
    url = cfg.kube_url or default_url(source, env)
    if not url:
        raise UserError("kube_pods apiserver needs the API server's address",
                        "set kube_url, or run in a pod (KUBERNETES_SERVICE_HOST)")
    endpoint = Endpoint(source, url, cfg.node, cfg.kube_token_file, cfg.kube_ca_file,
                        cfg.kube_insecure_tls)
    cache = PodCache(PodListClient(endpoint).fetch, relist_s=cfg.kube_relist_s)
    return PodResolver(cache, tuple(cfg.kube_job_labels))
