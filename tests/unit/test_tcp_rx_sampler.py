"""The receive-side sampler: per-window deltas per flow, what a first-seen or a gone
socket gives, a socket table that cannot be read, and real loopback sockets (a
segment forged past a hole is counted out of order; a dump of 2,000 connections
reads every socket)."""

import logging
import os
import socket
import struct
import time

import pytest

from fabricscope.agent.probes.tcp.rx_diag import SockRx
from fabricscope.agent.probes.tcp.rx_sampler import RxSampler, merge_into, window_fields
from fabricscope.agent.probes.tcp.window import retrans_only_fields

FLOW = ("10.0.0.1", 5000, "10.0.0.9", 443)
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="raw sockets and TCP_REPAIR need root")


def sock(cookie=1, segs=0, ooo=0, rtt=0, flow=FLOW) -> SockRx:
    return SockRx(cookie, flow, rtt, segs, ooo)


def await_value(fn, what: str, timeout_s: float = 10.0):
    """fn()'s first truthy value (a deadline, not a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while not (value := fn()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


def test_a_socket_seen_for_the_first_time_contributes_nothing():
    fields, kept = window_fields({}, [sock(segs=900, ooo=40, rtt=80)])
    assert fields == {} and kept == {1: (900, 40)}


def test_a_window_gets_the_deltas_and_the_receivers_rtt():
    fields, _ = window_fields({1: (900, 40)}, [sock(segs=1000, ooo=55, rtt=80)])
    assert fields == {FLOW: {"rx_data_segs": 100, "rx_ooo_pkts": 15, "rcv_rtt_us": 80}}


def test_an_idle_socket_gives_zeros_and_no_stale_rtt():
    fields, _ = window_fields({1: (1000, 55)}, [sock(segs=1000, ooo=55, rtt=80)])
    assert fields == {FLOW: {"rx_data_segs": 0, "rx_ooo_pkts": 0}}


def test_counters_that_wrapped_give_the_increase():
    fields, _ = window_fields({1: (0xFFFFFFF0, 0)}, [sock(segs=0x10, ooo=0)])
    assert fields[FLOW]["rx_data_segs"] == 0x20


def test_a_kernel_without_rcv_ooopack_gives_no_out_of_order_field():
    fields, _ = window_fields({1: (10, None)}, [sock(segs=20, ooo=None)])
    assert fields == {FLOW: {"rx_data_segs": 10}}


def test_gone_sockets_are_forgotten_and_a_new_cookie_starts_over():
    _, kept = window_fields({1: (10, 0)}, [sock(cookie=2, segs=5)])
    assert kept == {2: (5, 0)}


def test_rx_fields_join_a_flows_record_or_make_one_when_data_came_in():
    quiet = ("10.0.0.1", 5001, "10.0.0.9", 443)
    unseen = ("10.0.0.1", 5002, "10.0.0.9", 443)
    by_flow = {FLOW: {"segs_in": 3}}
    merge_into(by_flow, {FLOW: {"rx_data_segs": 0, "rx_ooo_pkts": 0},
                         quiet: {"rx_data_segs": 0, "rx_ooo_pkts": 0},
                         unseen: {"rx_data_segs": 7, "rx_ooo_pkts": 2}}, 1.0)
    assert by_flow[FLOW] == {"segs_in": 3, "rx_data_segs": 0, "rx_ooo_pkts": 0}
    assert quiet not in by_flow
    assert by_flow[unseen] == {**retrans_only_fields(1.0), "rx_data_segs": 7, "rx_ooo_pkts": 2}


def test_a_socket_table_that_cannot_be_read_is_logged_once_counted_and_starts_over(caplog):
    answers = [[sock(segs=10)], OSError(1, "Operation not permitted"),
               OSError(1, "Operation not permitted"), [sock(segs=30)], [sock(segs=35)]]

    def dump(_own, _counts):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    sampler = RxSampler({"10.0.0.1"}, dump=dump)
    with caplog.at_level(logging.WARNING, logger="fabricscope.agent.tcp_rx"):
        assert sampler.sample() == {}
        assert sampler.sample() == {} and sampler.sample() == {}
        assert sampler.sample() == {}           # the counters before the failure are gone
        assert sampler.sample() == {FLOW: {"rx_data_segs": 5, "rx_ooo_pkts": 0}}
    assert sampler.counts["rx_info_errors"] == 2
    assert len(caplog.records) == 1 and "Operation not permitted" in caplog.text


def _pair(server: socket.socket) -> tuple[socket.socket, socket.socket]:
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    return client, peer


def _recv_exactly(peer: socket.socket, n: int) -> None:
    while n > 0:
        n -= len(peer.recv(min(n, 1 << 20)))


def _key(s: socket.socket) -> tuple[str, int, str, int]:
    return (*s.getsockname(), *s.getpeername())


def test_loopback_windows_count_the_data_segments_each_side_received():
    sampler = RxSampler({"127.0.0.1"})
    with socket.create_server(("127.0.0.1", 0)) as server:
        client, peer = _pair(server)
        with client, peer:
            sampler.sample()
            client.sendall(b"x" * 200_000)
            _recv_exactly(peer, 200_000)
            rx = sampler.sample()
            received, sent = rx[_key(peer)], rx[_key(client)]
    assert received["rx_data_segs"] >= 200_000 // 65_483      # loopback's MSS
    assert received["rx_ooo_pkts"] == 0
    assert sent["rx_data_segs"] == 0


TCP_REPAIR, TCP_REPAIR_QUEUE, TCP_QUEUE_SEQ = 19, 20, 21
TCP_RECV_QUEUE, TCP_SEND_QUEUE = 1, 2


def _queue_seq(s: socket.socket, queue: int) -> int:
    """rcv_nxt (TCP_RECV_QUEUE) or write_seq (TCP_SEND_QUEUE), read in repair mode."""
    s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 1)
    try:
        s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR_QUEUE, queue)
        return struct.unpack("=I", s.getsockopt(socket.IPPROTO_TCP, TCP_QUEUE_SEQ, 4))[0]
    finally:
        s.setsockopt(socket.IPPROTO_TCP, TCP_REPAIR, 0)


def _checksum(data: bytes) -> int:
    data += bytes(len(data) % 2)
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _send_past_a_hole(client: socket.socket, peer: socket.socket, gap: int) -> None:
    """A 100-byte segment from client to peer starting `gap` bytes past the peer's
    rcv_nxt: what the peer sees when the `gap` bytes before it were lost."""
    seq = (_queue_seq(peer, TCP_RECV_QUEUE) + gap) & 0xFFFFFFFF
    ack = _queue_seq(peer, TCP_SEND_QUEUE)
    payload = b"z" * 100
    header = struct.pack("!HHIIBBHHH", client.getsockname()[1], peer.getsockname()[1], seq,
                         ack, 5 << 4, 0x18, 65535, 0, 0)           # PSH|ACK, no options
    pseudo = socket.inet_aton("127.0.0.1") * 2 + struct.pack("!BBH", 0, socket.IPPROTO_TCP,
                                                             len(header) + len(payload))
    header = header[:16] + struct.pack("!H", _checksum(pseudo + header + payload)) + header[18:]
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP) as raw:
        raw.sendto(header + payload, ("127.0.0.1", 0))


@ROOT
def test_a_segment_arriving_past_a_hole_is_counted_out_of_order():
    sampler = RxSampler({"127.0.0.1"})
    with socket.create_server(("127.0.0.1", 0)) as server:
        client, peer = _pair(server)
        with client, peer:
            client.sendall(b"a" * 10)
            _recv_exactly(peer, 10)
            sampler.sample()
            _send_past_a_hole(client, peer, gap=1000)
            key = _key(peer)
            rx = await_value(lambda: sampler.sample().get(key, {}).get("rx_ooo_pkts"),
                             "the forged segment to be queued out of order")
    assert rx == 1


def test_one_dump_reads_every_socket_of_2000_loopback_connections():
    sampler = RxSampler({"127.0.0.1"})
    pairs = []
    try:
        with socket.create_server(("127.0.0.1", 0), backlog=4096) as server:
            for _ in range(2000):
                pairs.append(_pair(server))
            sampler.sample()
            for client, _ in pairs:
                client.send(b"q")
            for _, peer in pairs:
                _recv_exactly(peer, 1)
            rx = sampler.sample()
            for client, peer in pairs:
                assert rx[_key(peer)]["rx_data_segs"] == 1
                assert rx[_key(client)]["rx_data_segs"] == 0
    finally:
        for client, peer in pairs:
            client.close()
            peer.close()
    assert sampler.counts["rx_info_errors"] == 0
    assert sampler.counts["rx_info_undecodable"] == 0


def test_the_sampler_is_on_by_default_and_off_with_tcp_rx_info_false():
    from fabricscope.agent.config import AgentConfig
    from fabricscope.agent.probes.tcp.hooks import FlowSettings

    assert FlowSettings.from_config(AgentConfig()).rx_info is True
    assert FlowSettings().rx_info is True
    assert FlowSettings.from_config(AgentConfig(tcp_rx_info=False)).rx_info is False
