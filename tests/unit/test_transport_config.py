"""Transport settings of agent and collector: one-line errors for bad combinations."""

from __future__ import annotations

import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.collector.config import CollectorConfig
from fabricscope.errors import UserError


@pytest.mark.parametrize("kw,message", [
    ({"token": "a" * 20, "token_file": "/x"}, "both token and token_file are set"),
    ({"tls_cert": "c.pem"}, "tls_cert and tls_key must be given together"),
    ({"compression": "zstd"}, "compression must be gzip or none"),
    ({"batch_max_bytes": 10}, "batch_max_bytes 10 is too small"),
    ({"spool_max_bytes": 1 << 20}, "holds less than two batches"),
    ({"synthetic_rate": 0}, "synthetic_rate must be positive"),
])
def test_agent_transport_errors(kw, message):
    with pytest.raises(UserError, match=message):
        AgentConfig(**{"probes": ["synthetic"], **kw}).check()


def test_agent_spool_path_names_the_node_and_tls_is_implied_by_files():
    cfg = AgentConfig(node="gpu/7", probes=["synthetic"])
    assert cfg.spool_path() == "/var/lib/fabricscope/spool/gpu_7"
    assert AgentConfig(spool_dir="").spool_path() == ""
    assert not cfg.uses_tls() and AgentConfig(tls_ca="ca.pem").uses_tls()


@pytest.mark.parametrize("kw,message", [
    ({"tls_key": "k.pem"}, "tls_cert and tls_key must be given together"),
    ({"tls_client_ca": "ca.pem"}, "tls_client_ca needs tls_cert and tls_key"),
    ({"spool_max_bytes": 0}, "spool_max_bytes must be positive"),
    ({"retry_after_s": 0}, "retry_after_s must be positive"),
    ({"influx_retries": -1}, "influx_retries must not be negative"),
    ({"max_connection_age_s": -1}, "max_connection_age_s must not be negative"),
])
def test_collector_transport_errors(kw, message):
    with pytest.raises(UserError, match=message):
        CollectorConfig(**kw).check()


def test_missing_tls_files_are_one_line_errors(tmp_path):
    from fabricscope.tls import channel_credentials, read_secret, server_credentials
    with pytest.raises(UserError) as err:
        server_credentials(str(tmp_path / "no.crt"), str(tmp_path / "no.key"))
    assert err.value.one_line().startswith("fabricscope: error: cannot read TLS key ")
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UserError, match="is empty"):
        read_secret(str(tmp_path / "empty"))
    (tmp_path / "two").write_text("one two\n")
    with pytest.raises(UserError, match="one token without spaces"):
        read_secret(str(tmp_path / "two"))
    with pytest.raises(UserError, match="given together"):
        channel_credentials(cert="c.pem")
