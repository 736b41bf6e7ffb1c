"""Decoding sock_diag answers and struct tcp_info: a golden answer captured on this
kernel (6.18) with its expected decode beside it, the struct's shorter forms of older
kernels, and tcp_info read from real loopback sockets."""

import errno
import socket
import struct

import pytest

from fabricscope.agent.probes.tcp.common import addr_key
from fabricscope.agent.probes.tcp.rx_diag import (_NLMSG, NLMSG_DONE, NLMSG_ERROR, SockRx,
                                      parse_rx_messages)
from fabricscope.agent.probes.tcp.tcp_info import (FIELDS, MIN_SIZE, counter_delta, decode_rx,
                                       decode_tcp_info)

#: One SOCK_DIAG_BY_FAMILY answer (idiag_ext = INET_DIAG_INFO) for the accepting side
#: of a loopback connection that received 10 bytes in order, then a 100-byte segment
#: forged 1000 bytes past rcv_nxt (queued out of order). Captured on Linux 6.18.
GOLDEN = bytes.fromhex("".join([
    # nlmsghdr: len 408, SOCK_DIAG_BY_FAMILY, NLM_F_MULTI
    "980100001400020001000000d82b0000",
    # inet_diag_msg: AF_INET ESTABLISHED, 127.0.0.1:41685 <- 127.0.0.1:45422, cookie 45677
    "02010000a2d5b16e7f0000010000000000000000000000007f00000100000000",
    "0000000000000000000000006db2000000000000000000000000000000000000",
    "00000000dee90100",
    # rtattrs SHUTDOWN, MARK, CGROUP_ID, SOCKOPT
    "050008000000000008000f00000000000c001500010000000000000006001600",
    "52000000",
    # rtattr INET_DIAG_INFO, 284 bytes
    "1c010200",
    # struct tcp_info (280 bytes)
    "010000000007aa01400d0300409c0000cbff0000180200000000000000000000",
    "000000000000000000000000c800000000000000c8000000c8000000ffff0000",
    "00000100140000000a000000ffffff7f0a000000cbff00000300000000000000",
    "cbff00000000000000e4dee60a000000ffffffffffffffff0000000000000000",
    "0a00000000000000040000000500000000000000140000000200000000000000",
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "0100000000fcff03000001000000000000000000000000000000000000000000",
    "000000000000000000000000000000000000000000000000",
]))
GOLDEN_SOCK = SockRx(cookie=45677, flow=("127.0.0.1", 41685, "127.0.0.1", 45422),
                     rcv_rtt=0, data_segs_in=2, rcv_ooopack=1)
GOLDEN_INFO = {"state": 1, "rcv_mss": 536, "rcv_rtt": 0, "rcv_space": 65483,
               "bytes_received": 10, "segs_in": 5, "data_segs_in": 2, "delivered": 1,
               "rcv_ooopack": 1}
INFO_AT = 128
LOOPBACK = frozenset({addr_key("127.0.0.1")})


def parse(buf: bytes, own=LOOPBACK) -> tuple[list[SockRx], dict]:
    out: list[SockRx] = []
    counts: dict[str, int] = {}
    parse_rx_messages(buf, own, out, counts)
    return out, counts


def with_info_size(size: int) -> bytes:
    """The golden answer as a kernel whose struct tcp_info has `size` bytes sends it."""
    length = INFO_AT + size
    return (struct.pack("=I", length) + GOLDEN[4:INFO_AT - 4]
            + struct.pack("=HH", 4 + size, 2) + GOLDEN[INFO_AT:length])


def test_the_golden_answer_decodes_to_its_socket_and_receive_counters():
    assert parse(GOLDEN) == ([GOLDEN_SOCK], {})
    assert decode_tcp_info(GOLDEN[INFO_AT:]) == GOLDEN_INFO


def test_every_field_offset_lies_inside_the_struct_of_6_18():
    assert all(off + struct.calcsize("=" + code) <= 280 for off, code in FIELDS.values())
    assert MIN_SIZE == 156


def test_a_struct_from_before_5_4_decodes_without_out_of_order_packets():
    socks, counts = parse(with_info_size(224))          # 4.19: ends at tcpi_reord_seen
    assert socks == [GOLDEN_SOCK._replace(rcv_ooopack=None)] and counts == {}
    assert "rcv_ooopack" not in decode_tcp_info(GOLDEN[INFO_AT:INFO_AT + 224])
    assert decode_rx(GOLDEN, INFO_AT, 228)[2] == 1      # 5.4: ends at tcpi_snd_wnd


def test_a_tcp_info_too_short_for_data_segments_is_counted_not_decoded():
    socks, counts = parse(with_info_size(104))          # 4.1: no tcpi_data_segs_in
    assert socks == [] and counts == {"rx_info_undecodable": 1}
    with pytest.raises(ValueError, match="shorter than the 156"):
        decode_tcp_info(GOLDEN[INFO_AT:INFO_AT + 104])


def test_an_answer_without_tcp_info_is_skipped():
    """A time-wait socket (a FIN_WAIT2 minisock) answers without INET_DIAG_INFO: it
    receives nothing more, so it is neither a flow nor undecodable."""
    socks, counts = parse(struct.pack("=I", INFO_AT - 4) + GOLDEN[4:INFO_AT - 4])
    assert socks == [] and counts == {}


def test_sockets_on_other_addresses_are_left_out():
    assert parse(GOLDEN, own=frozenset({addr_key("10.0.0.1")})) == ([], {})
    assert parse(GOLDEN, own=None)[0] == [GOLDEN_SOCK]


def test_answers_are_read_until_done_and_errors_raise_oserror():
    done = _NLMSG.pack(20, NLMSG_DONE, 2, 1, 0) + bytes(4)
    out: list[SockRx] = []
    assert parse_rx_messages(GOLDEN + GOLDEN, LOOPBACK, out, {}) is False
    assert parse_rx_messages(GOLDEN + done, LOOPBACK, out, {}) is True
    assert len(out) == 3
    error = _NLMSG.pack(36, NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -errno.EPERM) + bytes(16)
    with pytest.raises(OSError) as err:
        parse_rx_messages(error, LOOPBACK, [], {})
    assert err.value.errno == errno.EPERM
    with pytest.raises(OSError):
        parse_rx_messages(_NLMSG.pack(4, 20, 0, 1, 0), LOOPBACK, [], {})


def test_u32_counters_are_differenced_across_a_wrap():
    assert counter_delta(5, 3) == 2
    assert counter_delta(2, 0xFFFFFFFE) == 4


def test_tcp_info_of_a_real_loopback_socket_counts_what_it_received():
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        peer, _ = server.accept()
        with peer:
            client.sendall(b"x" * 5000)
            got = 0
            while got < 5000:
                got += len(peer.recv(65536))
            raw = peer.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 512)
    info = decode_tcp_info(raw)
    assert info["state"] == 1 and info["bytes_received"] == 5000
    assert 1 <= info["data_segs_in"] <= info["segs_in"]
    assert info["rcv_ooopack"] == 0
    assert decode_rx(raw, 0, len(raw)) == (info["rcv_rtt"], info["data_segs_in"], 0)
