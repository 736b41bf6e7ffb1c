"""tcp_flows hooks and settings: which tracepoints make which -D flags, what makes the
probe unavailable, and the config checks (one-line UserErrors)."""

from __future__ import annotations

import pytest

from fabricscope.agent.config import AgentConfig
from fabricscope.agent.probes.base import ProbeUnavailable
from fabricscope.agent.probes.tcp.hooks import DEFAULT_HOOKS, HOOKS, FlowSettings, hook_cflags
from fabricscope.errors import UserError


def tracefs(tmp_path, events: dict[str, dict[str, str]]):
    """A fake tracefs: {"tcp/tcp_probe": {field: C type}} -> format files."""
    for name, fields in events.items():
        fmt = tmp_path / "events" / name / "format"
        fmt.parent.mkdir(parents=True)
        lines = [f"\tfield:{ctype} {field};\toffset:8;\tsize:4;\tsigned:0;"
                 for field, ctype in fields.items()]
        fmt.write_text(f"name: {name}\nformat:\n" + "\n".join(lines) + "\n")
    return tmp_path


def fields_of(hook):
    return {f: "__u32" for f in HOOKS[hook][1]}


def test_every_default_hook_makes_its_flag(tmp_path):
    fs = tracefs(tmp_path, {h: fields_of(h) for h in DEFAULT_HOOKS})
    assert hook_cflags(DEFAULT_HOOKS, fs) == ["-DFS_WITH_TCP_PROBE", "-DFS_WITH_SET_STATE",
                                              "-DFS_WITH_SEND_RESET", "-DFS_WITH_RECV_RESET"]
    assert hook_cflags(["tcp/tcp_probe"], fs) == ["-DFS_WITH_TCP_PROBE"]
    assert hook_cflags([], fs) == []


def test_reset_reason_enum_is_declared_for_bcc(tmp_path):
    fields = {**fields_of("tcp/tcp_send_reset"), "reason": "enum sk_rst_reason"}
    fs = tracefs(tmp_path, {"tcp/tcp_send_reset": fields})
    assert hook_cflags(["tcp/tcp_send_reset"], fs) == [
        "-DFS_WITH_SEND_RESET", "-DFS_TP_RST_REASON", "-DFS_DECLARE_RST_REASON"]


@pytest.mark.parametrize("hooks,message", [
    (["tcp/tcp_bad_csum"], "tcp_flow_hooks: tcp/tcp_bad_csum is not a hook tcp_flows knows"),
    (["tcp/tcp_receive_reset"], "tracepoint tcp/tcp_receive_reset does not exist"),
    (["tcp/tcp_nope"], "tracepoint tcp/tcp_nope does not exist on this kernel"),
])
def test_unknown_or_missing_tracepoints_make_the_probe_unavailable(tmp_path, hooks, message):
    fs = tracefs(tmp_path, {"tcp/tcp_probe": fields_of("tcp/tcp_probe"),
                            "tcp/tcp_bad_csum": {"skbaddr": "const void *"}})
    with pytest.raises(ProbeUnavailable, match=message):
        hook_cflags(hooks, fs)


def test_a_tracepoint_without_the_fields_we_read_is_unavailable(tmp_path):
    fs = tracefs(tmp_path, {"tcp/tcp_probe": {"saddr": "__u8"}})
    with pytest.raises(ProbeUnavailable, match="lacks field"):
        hook_cflags(["tcp/tcp_probe"], fs)


def test_settings_from_config_and_defaults():
    assert FlowSettings.from_config(None) == FlowSettings()
    cfg = AgentConfig(tcp_window_s=2.0, tcp_max_flows=128, tcp_flow_hooks=["tcp/tcp_probe"])
    assert FlowSettings.from_config(cfg) == FlowSettings(2.0, 128, ("tcp/tcp_probe",))


@pytest.mark.parametrize("kw,message", [
    ({"probes": ["tcp_flows", "tcp_retransmit"]}, "probe tcp_flows includes tcp_retransmit"),
    ({"tcp_window_s": 0.1}, "tcp_window_s 0.1 is shorter than poll_interval_s"),
    ({"tcp_max_flows": 10}, "tcp_max_flows 10 is out of range"),
    ({"tcp_flow_hooks": ["tcp_probe"]}, "'tcp_probe' is not CATEGORY/EVENT"),
])
def test_config_errors_are_one_line(kw, message):
    with pytest.raises(UserError, match=message) as exc:
        AgentConfig(**kw).check()
    assert "\n" not in exc.value.one_line() and "fix:" in exc.value.one_line()


def test_default_config_runs_tcp_flows_not_both():
    cfg = AgentConfig()
    cfg.check()
    assert "tcp_flows" in cfg.probes and "tcp_retransmit" not in cfg.probes
    AgentConfig(probes=["tcp_retransmit", "markers"]).check()
