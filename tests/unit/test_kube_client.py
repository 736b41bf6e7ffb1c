import json
import logging
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from fabricscope.agent.kube.cache import PodCache, next_delay
from fabricscope.agent.kube.client import (Endpoint, KubeUnreachable, PodListClient, PodSource,
                               default_url, resolve_source)
from tests.support.kubelet import StandInKubelet

FIXTURES = Path(__file__).parent / "kube_fixtures"
POD_LIST = json.loads((FIXTURES / "podlist_node_a.json").read_text())


@pytest.fixture
def kubelet():
    with StandInKubelet(POD_LIST, token="t0ken") as server:
        yield server


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("t0ken\n")
    return str(path)


def test_the_kubelets_pods_endpoint_is_fetched_with_the_bearer_token(kubelet, token_file):
    client = PodListClient(Endpoint(PodSource.KUBELET, kubelet.url, "node-a", token_file))
    listed = client.fetch()
    assert len(listed.pods) == 7 and kubelet.requests == ["/pods"]


def test_the_api_server_is_asked_for_this_nodes_pods_only(kubelet, token_file):
    client = PodListClient(Endpoint(PodSource.APISERVER, kubelet.url, "node-b", token_file))
    listed = client.fetch()
    assert [p.name for p in listed.pods.values()] == ["elsewhere-0"]
    assert kubelet.requests == ["/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-b"]


def test_a_refused_token_is_one_line_naming_the_rbac_fix(kubelet, tmp_path):
    client = PodListClient(Endpoint(PodSource.KUBELET, kubelet.url, "node-a",
                                    str(tmp_path / "missing")))
    with pytest.raises(KubeUnreachable) as err:
        client.fetch()
    assert "HTTP 401" in err.value.cause and "nodes/proxy" in err.value.fix
    assert "\n" not in err.value.one_line()


def test_nothing_listening_is_one_line_naming_kube_url():
    client = PodListClient(Endpoint(PodSource.KUBELET, "http://127.0.0.1:9", "node-a"))
    with pytest.raises(KubeUnreachable) as err:
        client.fetch()
    assert "cannot reach kubelet http://127.0.0.1:9" in err.value.cause
    assert "kube_url" in err.value.fix


@pytest.fixture
def self_signed(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=node-a", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def test_tls_is_verified_against_the_ca_file_or_skipped_for_a_self_signed_kubelet(
        self_signed, token_file):
    cert, key = self_signed
    with StandInKubelet(POD_LIST, token="t0ken", certfile=cert, keyfile=key) as server:
        verified = Endpoint(PodSource.KUBELET, server.url, "node-a", token_file, ca_file=cert)
        assert len(PodListClient(verified).fetch().pods) == 7
        insecure = Endpoint(PodSource.KUBELET, server.url, "node-a", token_file,
                            insecure_tls=True)
        assert len(PodListClient(insecure).fetch().pods) == 7
        untrusted = Endpoint(PodSource.KUBELET, server.url, "node-a", token_file)
        with pytest.raises(KubeUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            PodListClient(untrusted).fetch()


def test_auto_means_the_api_server_inside_a_cluster_and_off_outside():
    inside = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert resolve_source(PodSource.AUTO, inside) is PodSource.APISERVER
    assert resolve_source(PodSource.AUTO, {}) is PodSource.OFF
    assert resolve_source(PodSource.KUBELET, {}) is PodSource.KUBELET
    assert default_url(PodSource.APISERVER, inside) == "https://10.96.0.1:443"
    assert default_url(PodSource.APISERVER, {"KUBERNETES_SERVICE_HOST": "fd00::1"}) == \
        "https://[fd00::1]:443"


def test_relists_back_off_from_one_second_to_the_cap_and_return_to_the_period():
    assert [next_delay(n, 10.0, 60.0) for n in range(8)] == [10, 1, 2, 4, 8, 16, 32, 60]


def test_an_outage_is_logged_once_counted_each_time_and_its_end_logged(kubelet, token_file,
                                                                       caplog):
    cache = PodCache(PodListClient(Endpoint(PodSource.KUBELET, kubelet.url, "node-a",
                                            token_file)).fetch)
    caplog.set_level(logging.INFO, logger="fabricscope.agent.kube")
    assert cache.refresh() and cache.get("5f0b6c2e-8a4d-4c1e-9b7a-2d3e4f5a6b7c") is not None
    kubelet.fail_with(503)
    assert not cache.refresh() and not cache.refresh()
    kubelet.fail_with(None)
    assert cache.refresh()
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "pod list unavailable" in m and "HTTP 503" in m]) == 1
    assert any("reachable again after 2 failed relists" in m for m in lines)
    assert (cache.stats.relists, cache.stats.relist_failures, cache.stats.items_garbled) == \
        (2, 2, 2)
    assert cache.get("5f0b6c2e-8a4d-4c1e-9b7a-2d3e4f5a6b7c") is not None


def test_the_cache_thread_relists_when_a_reader_asks(kubelet, token_file):
    cache = PodCache(PodListClient(Endpoint(PodSource.KUBELET, kubelet.url, "node-a",
                                            token_file)).fetch, relist_s=3600.0)
    relisted = threading.Semaphore(0)
    cache.on_relist.append(relisted.release)
    cache.start()
    try:
        assert relisted.acquire(timeout=10)          # the first list, at start
        cache.request_relist()
        assert relisted.acquire(timeout=10)          # long before the hour's relist
    finally:
        cache.stop()
    assert cache.stats.relists >= 2
