"""The tcp_flows probe's settings and the tracepoints it hooks (-D flags per hook).

Each hook is optional (config `tcp_flow_hooks`): dropping tcp/tcp_probe saves its
per-segment cost and leaves windows with retransmits only. A hook whose
tracepoint this kernel lacks, or that the probe does not know, makes the probe
unavailable (one log line, probe_attached=0; the agent runs on without it).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricscope.agent.probes.base import ProbeUnavailable
from fabricscope.agent.probes.tcp.common import tracepoint_field_types

#: hook -> (cflag, fields the program reads)
HOOKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tcp/tcp_probe": ("-DFS_WITH_TCP_PROBE",
                      ("saddr", "daddr", "snd_una", "snd_nxt", "snd_cwnd", "ssthresh", "srtt",
                       "skaddr", "data_len", "family")),
    "sock/inet_sock_set_state": ("-DFS_WITH_SET_STATE",
                                 ("skaddr", "oldstate", "newstate", "sport", "dport",
                                  "family", "protocol", "saddr", "daddr", "saddr_v6",
                                  "daddr_v6")),
    "tcp/tcp_send_reset": ("-DFS_WITH_SEND_RESET", ("state", "saddr", "daddr")),
    "tcp/tcp_receive_reset": ("-DFS_WITH_RECV_RESET",
                              ("sport", "dport", "family", "saddr", "daddr", "saddr_v6",
                               "daddr_v6")),
}
DEFAULT_HOOKS = tuple(HOOKS)
#: budget of the per-CPU flow map: tcp_max_flows shrinks (logged) to fit it
MAX_FLOW_MAP_BYTES = 256 << 20


@dataclass(frozen=True)
class FlowSettings:
    window_s: float = 1.0
    max_flows: int = 4096
    hooks: tuple[str, ...] = DEFAULT_HOOKS
    transfer_gap_us: int = 2000
    transfer_min_bytes: int = 65536
    transfer_tail_us: int = 20000
    rx_info: bool = True                 # agent config tcp_rx_info

    @classmethod
    def from_config(cls, cfg) -> "FlowSettings":
        """From AgentConfig (already checked); None (tests, benches): the defaults."""
        if cfg is None:
            return cls()
        return cls(float(cfg.tcp_window_s), int(cfg.tcp_max_flows), tuple(cfg.tcp_flow_hooks),
                   int(cfg.tcp_transfer_gap_us), int(cfg.tcp_transfer_min_bytes),
                   int(cfg.tcp_transfer_tail_us), bool(cfg.tcp_rx_info))

    def transfer_cflags(self) -> list[str]:
        return [f"-DFS_TRANSFER_GAP_NS={self.transfer_gap_us * 1000}",
                f"-DFS_TRANSFER_MIN_BYTES={self.transfer_min_bytes}",
                f"-DFS_TRANSFER_TAIL_NS={self.transfer_tail_us * 1000}"]


def hook_cflags(hooks, tracefs=None) -> list[str]:
    """-D flags for the hooks; ProbeUnavailable naming the first that cannot attach."""
    kw = {"tracefs": tracefs} if tracefs is not None else {}
    flags: list[str] = []
    for hook in hooks:
        category, _, event = hook.partition("/")
        types = tracepoint_field_types(category, event, **kw)
        if types is None:
            raise ProbeUnavailable(f"tracepoint {hook} does not exist on this kernel")
        if hook not in HOOKS:
            raise ProbeUnavailable(f"tcp_flow_hooks: {hook} is not a hook tcp_flows knows "
                                   f"(known: {', '.join(HOOKS)})")
        flag, needed = HOOKS[hook]
        missing = [f for f in needed if f not in types]
        if missing:
            raise ProbeUnavailable(f"tracepoint {hook} lacks field(s) {', '.join(missing)}")
        flags.append(flag)
        if hook == "tcp/tcp_send_reset" and "reason" in types:
            flags.append("-DFS_TP_RST_REASON")
            if types["reason"] == "enum sk_rst_reason":
                # BCC copies the field's C type into its args struct; the 6.1 headers it
                # compiles with lack this enum, so we declare one of the same size.
                flags.append("-DFS_DECLARE_RST_REASON")
    return flags
