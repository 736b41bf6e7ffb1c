"""Nobody let in: TLS, mutual TLS and bearer tokens bound to nodes; secrets never logged.

Certificates are real X.509 made by openssl (fabricscope.tls.make_pki): one PKI the
collector trusts, and a second, unrelated one standing for an attacker's.
"""

from __future__ import annotations

import re
import time

import grpc
import pytest

from fabricscope.collector.config import CollectorConfig
from fabricscope.collector.server import CollectorThread
from fabricscope.lab.stack import http_get
from fabricscope.records import Record
from fabricscope.services import InfluxServer, free_port
from tests.support.servers import VictoriaMetricsServer
from fabricscope.tls import bearer, make_pki
from fabricscope.wire import make_batch, pb, pb_grpc
from tests.unit.transport_procs import ServiceProc, synthetic_counts, wait_for

TOKEN0 = "tok-node0-5f2b8c1e9a7d4e63b0c1"
TOKEN1 = "tok-node1-0a9e8d7c6b5a4f3e2d1c"
WRONG = "tok-wrong-11112222333344445555"
T0 = time.time_ns() - 10**9


def synthetic(node: str, n: int = 0) -> Record:
    return Record("synthetic", T0 + n, {"node": node, "stream": "0"}, {"n": n, "value": 0.5})


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    base = tmp_path_factory.mktemp("pki")
    return make_pki(base / "good", clients=["node0"]), make_pki(base / "evil", clients=["node0"],
                                                                 ca_name="evil")


@pytest.fixture
def influx():
    with InfluxServer() as server:
        yield server


def tokens_file(path) -> str:
    path.write_text(f"{TOKEN0}: node0\n{TOKEN1}: node1\n")
    return str(path)


def creds(ca, client=None):
    cert, key = client if client else (None, None)
    return grpc.ssl_channel_credentials(ca.read_bytes(), key.read_bytes() if key else None,
                                        cert.read_bytes() if cert else None)


def attempt(port: int, credentials, token: str | None, node: str = "node0"):
    """One stream with one batch: ('ok', ack) or (status code, details)."""
    options = [("grpc.ssl_target_name_override", "localhost")]
    channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials, options) if credentials \
        else grpc.insecure_channel(f"127.0.0.1:{port}")
    metadata = (bearer(token),) if token else None
    with channel:
        try:
            acks = list(pb_grpc.CollectorStub(channel).Stream(
                iter([make_batch(node=node, agent_id="x", seq=1,
                                 lines=[f"synthetic,node={node},stream=0 n=0i,value=0.5 {T0}"])]),
                metadata=metadata, timeout=20))
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
    return "ok", acks[0]


def test_only_the_right_certificate_and_token_for_the_right_node_get_in(pki, influx, tmp_path):
    good, evil = pki
    cfg = CollectorConfig(listen="127.0.0.1:0", influx_url=influx.url, influx_db="fs",
                          metrics_host="127.0.0.1", metrics_port=0,
                          tls_cert=str(good.server_cert), tls_key=str(good.server_key),
                          tls_client_ca=str(good.ca), tokens_file=tokens_file(tmp_path / "t"))
    with CollectorThread(cfg) as c:
        port = c.port
        refused = {
            "plaintext": attempt(port, None, TOKEN0),
            "no client certificate": attempt(port, creds(good.ca), TOKEN0),
            "certificate of another CA": attempt(port, creds(good.ca, evil.client("node0")),
                                                 TOKEN0),
            "server not trusted": attempt(port, creds(evil.ca, good.client("node0")), TOKEN0),
        }
        for what, (code, _) in refused.items():
            assert code == grpc.StatusCode.UNAVAILABLE, what
        mtls = creds(good.ca, good.client("node0"))
        assert attempt(port, mtls, None) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "no bearer token (metadata authorization: Bearer <token>)")
        assert attempt(port, mtls, WRONG) == (grpc.StatusCode.UNAUTHENTICATED,
                                              "unknown bearer token")
        assert attempt(port, mtls, TOKEN1, node="node0") == (
            grpc.StatusCode.PERMISSION_DENIED,
            "this token may send for node 'node1' only, not 'node0'")
        assert synthetic_counts(influx) == {}          # nothing of the above was written
        status, ack = attempt(port, mtls, TOKEN0)
        assert (status, ack.status) == ("ok", pb.Ack.OK)
        assert synthetic_counts(influx) == {"node0": (1, 0)}
        m = c.collector.metrics.registry.get_sample_value
        assert [m("fabricscope_collector_auth_failures_total", {"reason": r})
                for r in ("no_token", "bad_token", "node_mismatch")] == [1, 1, 1]


def test_plain_tls_without_client_certificates(pki, influx):
    good, _ = pki
    cfg = CollectorConfig(listen="127.0.0.1:0", influx_url=influx.url, influx_db="fs",
                          metrics_host="127.0.0.1", metrics_port=0,
                          tls_cert=str(good.server_cert), tls_key=str(good.server_key))
    with CollectorThread(cfg) as c:
        assert attempt(c.port, creds(good.ca), None)[0] == "ok"
        assert attempt(c.port, None, None)[0] == grpc.StatusCode.UNAVAILABLE


def test_tokens_file_errors_are_one_line_and_never_show_a_token(tmp_path):
    from fabricscope.collector.auth import TokenTable
    from fabricscope.errors import UserError
    bad = tmp_path / "tokens"
    bad.write_text(f"{TOKEN0}: node0\nshort: node1\n")
    with pytest.raises(UserError) as err:
        TokenTable(str(bad))
    assert "entry 2: a token must be a string of at least 16 characters" in err.value.one_line()
    assert TOKEN0 not in err.value.one_line() and "short" not in err.value.one_line()


def test_rotated_tokens_apply_to_new_streams_without_a_restart(influx, tmp_path):
    path = tmp_path / "tokens"
    cfg = CollectorConfig(listen="127.0.0.1:0", influx_url=influx.url, influx_db="fs",
                          metrics_host="127.0.0.1", metrics_port=0, tokens_file=tokens_file(path))
    with CollectorThread(cfg) as c:
        assert attempt(c.port, None, TOKEN0)[0] == "ok"
        path.write_text(f"{WRONG}: node0\n")
        assert attempt(c.port, None, TOKEN0)[0] == grpc.StatusCode.UNAUTHENTICATED
        assert attempt(c.port, None, WRONG)[0] == "ok"


def test_agent_with_a_wrong_token_is_refused_and_no_secret_reaches_a_log(pki, tmp_path):
    """Collector (v2 API, with an InfluxDB token) and agent as processes, debug logging on."""
    good, _ = pki
    influx_token = "influx-secret-7d6c5b4a39281706"
    (tmp_path / "agent.token").write_text(WRONG + "\n")
    with VictoriaMetricsServer() as vm:
        port = free_port()
        collector = ServiceProc("collector", [
            "-v", "collector", "--listen", f"127.0.0.1:{port}", "--influx-api", "v2",
            "--influx-url", vm.url, "--influx-db", "fs", "--influx-token", influx_token,
            "--metrics-host", "127.0.0.1", "--metrics-port", "0",
            "--tls-cert", str(good.server_cert), "--tls-key", str(good.server_key),
            "--tls-client-ca", str(good.ca), "--tokens-file", tokens_file(tmp_path / "t")],
            tmp_path)
        cert, key = good.client("node0")
        agent_argv = ["-v", "agent", "--node", "node0", "--probes", "synthetic",
                      "--collector", f"127.0.0.1:{port}", "--tls-server-name", "localhost",
                      "--tls-ca", str(good.ca), "--tls-cert", str(cert), "--tls-key", str(key),
                      "--token-file", str(tmp_path / "agent.token"),
                      "--spool-dir", str(tmp_path / "spool"), "--metrics-host", "127.0.0.1",
                      "--metrics-port", "0", "--synthetic-count", "500"]
        agent = ServiceProc("agent", agent_argv, tmp_path)
        try:
            collector.start()
            agent.start()
            agent.wait_log(r"UNAUTHENTICATED: unknown bearer token")
            collector.wait_log(r"refusing stream from .*: unknown bearer token")
            assert agent.metric("fabricscope_agent_records_dropped_total") == 0   # kept
            agent.stop()
            (tmp_path / "agent.token").write_text(TOKEN0 + "\n")
            agent.start()       # resends the 500 records its first run spooled
            wait_for(lambda: agent.metric("fabricscope_agent_queue_records") == 0
                     and agent.metric("fabricscope_agent_batches_acked_total", status="ok") > 0,
                     60, "the agent's spooled records to be acknowledged")
            wait_for(lambda: sum(len(r["values"]) for r in vm.wait_export(
                '{__name__="synthetic_n"}', count=1)) == 500, 60, "500 points in VictoriaMetrics")
            scraped = [http_get(f"http://127.0.0.1:{p.metrics_port}/metrics")[1]
                       for p in (collector, agent)]
        finally:
            agent.stop()
            collector.stop()
        texts = [collector.all_text(), agent.all_text(), *scraped]
        assert any(re.search(r"DEBUG", t) for t in texts)          # debug logging was on
        key_text = good.server_key.read_text().splitlines()[1]
        for secret in (TOKEN0, TOKEN1, WRONG, influx_token, key_text):
            assert not any(secret in t for t in texts), "a secret reached a log or /metrics"
