"""struct tcp_info (include/uapi/linux/tcp.h), as sock_diag's INET_DIAG_INFO
attribute and getsockopt(TCP_INFO) return it: the fields the receive-side
sampler reads, decoded by offset.

The struct only grows at its end (4.19 returns 224 bytes, 5.4 232, 6.18 280), and
the kernel returns as many bytes as it knows of. A field is decoded only when the
returned bytes hold it whole: on a kernel before 5.4 `rcv_ooopack` is absent, not 0.

    struct tcp_info {                     offset
        __u8  tcpi_state;                      0
        ...   (ca_state .. fastopen bits)      1-7
        __u32 tcpi_rto, ato, snd_mss, rcv_mss; 8
        ...   (unacked .. reordering)         24
        __u32 tcpi_rcv_rtt;                   92  receiver's RTT estimate, us (0: none)
        __u32 tcpi_rcv_space;                 96  receive buffer autotuning target, bytes
        __u32 tcpi_total_retrans;            100
        __u64 tcpi_pacing_rate, max_pacing;  104
        __u64 tcpi_bytes_acked;              120
        __u64 tcpi_bytes_received;           128
        __u32 tcpi_segs_out;                 136
        __u32 tcpi_segs_in;                  140  segments received (GRO: each segment)
        __u32 tcpi_notsent_bytes, min_rtt;   144
        __u32 tcpi_data_segs_in;             152  of them with payload
        __u32 tcpi_data_segs_out;            156
        ...   (delivery_rate .. sndbuf_lim.) 160
        __u32 tcpi_delivered;                192
        __u32 tcpi_delivered_ce;             196
        ...   (bytes_sent .. reord_seen)     200
        __u32 tcpi_rcv_ooopack;              224  out-of-order packets received (5.4+)
        __u32 tcpi_snd_wnd;                  228
        ...   (rcv_wnd, rehash, rto totals, AccECN counters: not read)
    };

The u32 counters wrap; their deltas are taken modulo 2^32 (counter_delta).
"""

from __future__ import annotations

import struct

#: field -> (offset, struct format): the decoded part of struct tcp_info
FIELDS: dict[str, tuple[int, str]] = {
    "state": (0, "B"),
    "rcv_mss": (20, "I"),
    "rcv_rtt": (92, "I"),
    "rcv_space": (96, "I"),
    "bytes_received": (128, "Q"),
    "segs_in": (140, "I"),
    "data_segs_in": (152, "I"),
    "delivered": (192, "I"),
    "rcv_ooopack": (224, "I"),
}
#: the fields the sampler needs; a shorter struct (before 4.6) is not decoded at all
REQUIRED = ("rcv_rtt", "data_segs_in")
#: the sampler's optional field, and the kernel it came with
OOO = "rcv_ooopack"
_CODECS = {name: (off, struct.Struct("=" + fmt)) for name, (off, fmt) in FIELDS.items()}
U32_WRAP = 1 << 32


def _end(name: str) -> int:
    return _CODECS[name][0] + _CODECS[name][1].size


def _packed(names: tuple[str, ...]) -> struct.Struct:
    """One Struct reading the named fields (in offset order) from the struct's start:
    one unpack per socket instead of one per field (a busy node has thousands)."""
    fmt, at = "=", 0
    for name in sorted(names, key=lambda n: FIELDS[n][0]):
        off, code = FIELDS[name]
        fmt += f"{off - at}x{code}" if off > at else code
        at = _end(name)
    return struct.Struct(fmt)


MIN_SIZE = max(_end(n) for n in REQUIRED)
_RX = _packed(REQUIRED)                     # rcv_rtt, data_segs_in
_RX_OOO = _packed((*REQUIRED, OOO))         # rcv_rtt, data_segs_in, rcv_ooopack


def decode_tcp_info(raw: bytes | memoryview) -> dict[str, int]:
    """{field: value} of the FIELDS whose bytes raw holds whole.

    Raises ValueError when raw is shorter than MIN_SIZE (the sampler's fields missing)."""
    if len(raw) < MIN_SIZE:
        raise ValueError(f"tcp_info of {len(raw)} bytes is shorter than the {MIN_SIZE} "
                         "the receive-side fields need (kernel before 4.6)")
    return {name: codec.unpack_from(raw, off)[0]
            for name, (off, codec) in _CODECS.items() if off + codec.size <= len(raw)}


def counter_delta(now: int, before: int) -> int:
    """Increase of a u32 tcp_info counter between two reads (one wrap allowed)."""
    return (now - before) % U32_WRAP


def decode_rx(buf, at: int, size: int) -> tuple[int, int, int | None] | None:
    """(rcv_rtt, data_segs_in, rcv_ooopack or None when the kernel lacks it) of the
    tcp_info of `size` bytes at buf[at:]; None when it is shorter than MIN_SIZE."""
    if size >= _RX_OOO.size:
        return _RX_OOO.unpack_from(buf, at)
    if size >= MIN_SIZE:
        return (*_RX.unpack_from(buf, at), None)
    return None
