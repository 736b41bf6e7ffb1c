"""NCCL debug-log parser: golden records from NCCL-format text (tests/unit/nccl_fixtures)."""

import time
from pathlib import Path

import pytest

from fabricscope.agent.probes.nccl.logparse import (
    BLANK, FOREIGN, GARBLED, IGNORED, RECORD, parse_facts, parse_line, parse_timestamp,
    split_line)
from fabricscope.agent.probes.nccl.logparse_facts import NetDevices, NetKind
from fabricscope import schema

FIXTURE = Path(__file__).parent / "nccl_fixtures" / "debug_info.log"
NOW = 1_800_000_000_000_000_000


def fixture_lines() -> list[str]:
    return [line for line in FIXTURE.read_text().splitlines() if not line.startswith("#")]


def parsed():
    return [parse_line(line, NOW) for line in fixture_lines()]


def local_ns(text: str) -> int:
    return int(time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))) * 1_000_000_000


def test_every_line_gets_an_outcome_and_records_are_valid():
    outcomes = [o for o, _ in parsed()]
    assert {o: outcomes.count(o) for o in set(outcomes)} == {
        RECORD: 27, IGNORED: 3, FOREIGN: 3, GARBLED: 3, BLANK: 4}
    for _, recs in parsed():
        for rec in recs:
            rec.tags["node"] = "n1"
            schema.validate(rec)


def records(measurement: str):
    return [r for _, recs in parsed() for r in recs if r.measurement == measurement]


def test_coll_lines():
    allreduce, allgather, bcast = records("nccl_log_coll")
    assert allreduce.tags == {"host": "node-a", "pid": "4242", "op": "AllReduce",
                              "datatype": "float32", "redop": "sum", "comm": "0x55d0c8a3e2b0"}
    assert allreduce.fields == {"op_count": 0x1A, "count": 26214400, "root": 0, "nranks": 16,
                                "stream": "0x55d0c7f0a5e0", "tid": 4242, "dev": 0,
                                "bytes": 104857600, "size_bytes": 104857600}
    assert allreduce.time_ns == NOW        # INFO lines carry no timestamp
    # AllGather: count is per rank; S = 1048576 x 2 (bfloat16) x 16
    assert allgather.fields["bytes"] == 2097152 and allgather.fields["size_bytes"] == 33554432
    assert bcast.fields["root"] == 3 and bcast.fields["stream"] == "0x0"   # (nil)
    assert bcast.tags["datatype"] == "uint8"


def test_topology_lines():
    topo = records("nccl_topology")
    kinds = [(r.tags["kind"], r.tags.get("transport"), r.tags.get("direction")) for r in topo]
    assert kinds == [("ring_order", None, None), ("ring", None, None), ("tree", None, None),
                     ("tree", None, None), ("channel", "P2P", "-"), ("channel", "NET", "receive"),
                     ("channel", "NET", "send"), ("channel", "SHM", "-")]
    order, ring, tree0, tree1, p2p, net_recv, net_send, shm = topo
    assert order.fields == {"channel": 0, "nchannels": 2, "nranks": 16, "dev": 0,
                            "order": " ".join(str(i) for i in range(16))}
    assert ring.fields == {"channel": 0, "prev": 15, "rank": 0, "next": 1, "dev": 0}
    assert tree0.fields == {"channel": 0, "up": -1, "rank": 0, "down": "1/8/-1", "dev": 0}
    assert tree1.fields["up"] == 1
    assert net_recv.fields == {"channel": 0, "conn": 0, "src_rank": 15, "src_dev": 7,
                               "dst_rank": 0, "dst_dev": 0, "via": "NET/IB/0/GDRDMA",
                               "net": "IB", "net_dev": 0, "gdrdma": True, "shared": False,
                               "dev": 0}
    assert net_send.fields["via"] == "NET/IB/1(1)/GDRDMA/Shared"
    assert "conn" not in shm.fields and shm.fields["channel"] == 1
    assert p2p.fields["via"] == "P2P/CUMEM/read"


def test_network_lines():
    net = {r.tags["kind"]: r.fields for r in records("nccl_net")}
    assert net == {
        "bootstrap_devices": {"devices": "[0]lo:127.0.0.1<0>", "ndevices": 1, "nics": 1,
                              "dev": 0},
        "network": {"network": "IB", "dev": 0},
        "ib_devices": {"devices": "[0]mlx5_0:1/IB [1]mlx5_1:1/RoCE", "oob": "eth0:10.1.0.11<0>",
                       "ndevices": 2, "nics": 2, "relaxed_ordering": True, "dev": 0},
        "socket_devices": {"devices": "[0]eth0:10.1.0.11<0> [1]eth1:10.2.0.11<0>",
                           "ndevices": 2, "nics": 2, "dev": 0},
        "socket_threads": {"threads": 2, "sockets_per_thread": 8, "dev": 0},
    }


def test_comm_init_lines_carry_the_comm_id():
    start, complete, split = records("nccl_log_comm")
    assert start.tags["event"] == "init_start" and complete.tags["event"] == "init_complete"
    assert start.tags["comm_id"] == complete.tags["comm_id"] == "0x6afe1cc17717e1f4"
    assert complete.fields == {"rank": 0, "nranks": 16, "cuda_dev": 0, "nvml_dev": 0,
                               "bus_id": "18000", "func": "ncclCommInitRank", "dev": 0}
    assert "comm_id" not in split.tags
    assert (split.fields["parent"], split.fields["color"], split.fields["key"],
            split.fields["nranks"]) == ("0x55d0c8a3e2b0", 0, 1, 8)


def test_warnings_and_error_traces():
    cuda, null_comm, trace4, ib_new, trace6, ib_old = records("nccl_warn")
    assert cuda.time_ns == null_comm.time_ns == local_ns("2026-11-29 19:15:00")
    assert null_comm.tags == {"host": "vm", "pid": "14333", "level": "WARN",
                              "file": "misc/argcheck.cc", "func": "PtrCheck"}
    assert null_comm.fields == {"message": "Send : comm argument is NULL", "line": 32,
                                "tid": 14333, "dev": 0}
    assert trace4.tags["level"] == "INFO" and trace4.tags["func"] == "CommCheck"
    assert (trace4.fields["code"], trace4.fields["status"]) == (4, "ncclInvalidArgument")
    assert (ib_new.fields["code"], ib_new.fields["status"]) == (12, "IBV_WC_RETRY_EXC_ERR")
    assert ib_new.time_ns == local_ns("2026-11-29 19:20:31")
    assert (trace6.fields["code"], trace6.fields["status"]) == (6, "ncclRemoteError")
    # NCCL < 2.20 format: "with error 12," and no (func), no timestamp
    assert (ib_old.fields["code"], ib_old.fields["status"]) == (12, "IBV_WC_RETRY_EXC_ERR")
    assert "func" not in ib_old.tags and ib_old.tags["host"] == "node-b"
    assert ib_old.time_ns == NOW


@pytest.mark.parametrize("line,outcome", [
    ("", BLANK),
    ("   ", BLANK),
    ("hello world", FOREIGN),
    ("NCCL version 2.32.3+cuda12.9", RECORD),         # older releases print it bare
    ("h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] junk", GARBLED),
    ("h:1:2 [0] NCCL INFO threadThresholds 8/8/64 | x", GARBLED),
    ("h:1:2 [0] NCCL TRACE 1.0 f:1 x", IGNORED),
    ("h:1:2 [0] NCCL INFO Ring 00 : 1[0] <- 0[0] via P2P/CUMEM", IGNORED),
    ("h:1:2 [0] NCCL INFO Ring 00 : x -> y", GARBLED),
    ("h:1:2 [0] NCCL INFO AllReduce: opCount zz", GARBLED),
    ("h:1:2 [0] NCCL INFO", IGNORED),
    ("h:1:2 [0] NCCL WARN", FOREIGN),            # WARN needs file:line
    ("h:1:2 [0] x.cc:3 NCCL WARN", RECORD),
    ("\x00\xff" * 500, FOREIGN),
])
def test_edge_lines_never_raise(line, outcome):
    assert parse_line(line, NOW)[0] == outcome


def test_prefix_and_timestamps():
    ll = split_line("[2026-01-02 03:04:05] h-1:10:11 [-1] a/b.cc:7 (fn) NCCL WARN boom\n")
    assert (ll.host, ll.pid, ll.tid, ll.cuda_dev, ll.level, ll.file, ll.line, ll.func,
            ll.message) == ("h-1", 10, 11, -1, "WARN", "a/b.cc", 7, "fn", "boom")
    assert ll.time_ns == local_ns("2026-01-02 03:04:05")
    assert parse_timestamp("2026-01-02 03:04:05.250") == \
        local_ns("2026-01-02 03:04:05") + 250_000_000
    assert parse_timestamp("Jan 2 03:04:05") is None     # custom format: read time is used


def test_a_comm_id_above_2_63_is_read_not_dropped():
    line = ("h:1:2 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 7000 "
            "commId 0xffffffffffffffff - Init COMPLETE")
    outcome, (rec,) = parse_line(line, NOW)
    assert outcome == RECORD and rec.tags["comm_id"] == "0xffffffffffffffff"


def test_torchrun_and_mpirun_prefixes_give_the_launchers_rank():
    torchrun = "[rank3]:node-7:901:955 [3] NCCL INFO Using network IB"
    mpirun = "[1,5]<stderr>:node-7:902:956 [5] NCCL INFO Using network Socket"
    (_, (t,)), (_, (m,)) = parse_line(torchrun, NOW), parse_line(mpirun, NOW)
    assert (t.tags["host"], t.fields["launcher"], t.fields["launcher_rank"], t.fields["dev"]) \
        == ("node-7", "torchrun", 3, 3)
    assert (m.fields["launcher"], m.fields["launcher_rank"]) == ("mpirun", 5)


def test_an_ib_line_without_devices_reads_relaxed_ordering_and_oob():
    # net_ib.cc "NET/IB : Using%s %s; OOB %s:%s" with no device left after NCCL_IB_HCA
    facts = parse_facts("h:1:2 [0] NCCL INFO NET/IB : Using [RO]; OOB eth0:10.0.0.1<0>").facts
    assert facts == (NetDevices(NetKind.IB, (), True, "eth0:10.0.0.1<0>"),)


def test_a_ray_version_line_takes_rays_pid():
    _, (rec,) = parse_line("(RayTrainWorker pid=615, ip=10.72.7.6) NCCL version 2.21.5+cuda12.4",
                           NOW)
    assert rec.tags == {"host": "-", "pid": "615", "kind": "version"}
    assert rec.fields == {"version": "2.21.5", "cuda": "12.4", "launcher": "ray",
                          "launcher_ip": "10.72.7.6"}


def test_a_split_child_of_2_26_reads_without_the_space_before_its_dash():
    line = ("h:1:2 [0] NCCL INFO ncclCommSplit comm 0x9 rank 1 nranks 4 cudaDev 1 nvmlDev 1 "
            "busId 1b000 parent 0x5 splitCount 1 color 7 key 1- Init START")
    (fact,) = parse_facts(line).facts
    assert (fact.parent, fact.color, fact.key, fact.comm_id) == ("0x5", 7, 1, None)
