"""nccl probe data contract: C/Python agreement, golden event bytes, records (no root)."""

import re
import struct
from pathlib import Path

import pytest

from fabricscope.agent.probes.base import Clock
from fabricscope.agent.probes.nccl.layout import (
    API_BY_ID, APIS, EVENT_SIZE, F_ID, F_OUT, F_RETURNED, NONE, DecodeError, comm_id_hash,
    decode, header_api_ids)
from fabricscope.agent.probes.nccl.records import CommInfo, CommTable, observe, to_record
from fabricscope import schema

BPF = Path(__file__).resolve().parents[2] / "bpf" / "nccl.bpf.c"
# The C layout, written out independently of the ctypes class (bpf/nccl.h).
EVENT = struct.Struct("<9Q 2I 2H 8i I")


def pack(**kw) -> bytes:
    v = dict(ts_ns=0, ret_ts_ns=0, seq=0, count=0, comm=0, stream=0, aux=0, parent=0,
             id_hash=0, pid=0, tid=0, api=1, flags=0, ret=0, datatype=NONE, redop=NONE,
             peer=NONE, nranks=NONE, rank=NONE, color=NONE, key=NONE)
    v.update(kw)
    return EVENT.pack(v["ts_ns"], v["ret_ts_ns"], v["seq"], v["count"], v["comm"], v["stream"],
                      v["aux"], v["parent"], v["id_hash"], v["pid"], v["tid"], v["api"],
                      v["flags"], v["ret"], v["datatype"], v["redop"], v["peer"], v["nranks"],
                      v["rank"], v["color"], v["key"], 0)


def test_event_size_matches_the_c_layout():
    assert EVENT.size == EVENT_SIZE == 120


def test_api_ids_agree_between_c_and_python():
    ids = header_api_ids()
    entries = re.findall(r"^ENTRY\((\w+), (\w+), FS_NCCL_API_(\w+)\)", BPF.read_text(), re.M)
    assert len(entries) == len(APIS) == len(ids)
    c_ids = {sym: ids[name] for sym, _layout, name in entries}
    assert c_ids == {a.symbol: a.id for a in APIS}


def test_every_api_has_its_entry_function():
    text = BPF.read_text()
    for api in APIS:
        assert f"ENTRY({api.symbol}," in text, api.entry_fn


GOLDEN_ALLREDUCE = bytes.fromhex(
    "e8030000000000002c0b000000000000"   # ts_ns 1000, ret_ts_ns 2860
    "05000000000000000010000000000000"   # seq 5, count 4096
    "00c0a8d0555500005151000000000000"   # comm 0x5555d0a8c000, stream 0x5151
    "00000000000000000000000000000000"   # aux, parent
    "0000000000000000"                   # id_hash
    "39300000"                           # pid 12345
    "3a300000"                           # tid 12346
    "0100" "0100"                        # api 1 (ncclAllReduce), flags RETURNED
    "04000000" "09000000" "02000000"     # ret 4, datatype 9 (bfloat16), redop 2 (max)
    "ffffffff" "ffffffff" "ffffffff" "ffffffff" "ffffffff" "00000000")


def test_golden_allreduce_bytes_decode():
    assert GOLDEN_ALLREDUCE == pack(ts_ns=1000, ret_ts_ns=2860, seq=5, count=4096,
                                    comm=0x5555D0A8C000, stream=0x5151, pid=12345, tid=12346,
                                    api=1, flags=F_RETURNED, ret=4, datatype=9, redop=2)
    ev = decode(GOLDEN_ALLREDUCE)
    assert (ev.api.symbol, ev.api.op, ev.count, ev.datatype, ev.redop) == \
        ("ncclAllReduce", "AllReduce", 4096, 9, 2)
    assert (ev.pid, ev.tid, ev.ret, ev.duration_ns, ev.seq) == (12345, 12346, 4, 1860, 5)
    assert ev.comm == 0x5555D0A8C000 and ev.stream == 0x5151 and ev.id_hash is None


def test_entry_only_event_has_no_return():
    ev = decode(pack(api=18, count=3, datatype=7, peer=1))
    assert ev.ret is None and ev.duration_ns is None and ev.api.op == "Send"


@pytest.mark.parametrize("raw,msg", [(b"\0" * 10, "expected 120"),
                                     (pack(api=999), "unknown api id 999")])
def test_bad_event_bytes_raise_decode_error(raw, msg):
    with pytest.raises(DecodeError, match=msg):
        decode(raw)


def test_comm_id_hash_golden():
    # Value the BPF program computed for this id in the kernel test (bytes 0..127);
    # NCCL logs it as "commId 0x6afe1cc17717e1f4".
    assert comm_id_hash(bytes(range(128))) == 0x6AFE1CC17717E1F4
    assert comm_id_hash(bytes(128)) != comm_id_hash(bytes(127) + b"\1")
    with pytest.raises(ValueError):
        comm_id_hash(b"short")


CLOCK = Clock(offset_ns=1_700_000_000_000_000_000)


def records_of(*raws):
    comms = CommTable()
    out = []
    for raw in raws:
        ev = decode(raw)
        out.append(to_record(ev, comms, CLOCK))
        observe(ev, comms)
    return out, comms


def valid(record):
    record.tags["node"] = "n1"
    schema.validate(record)
    return record


def test_init_then_collective_carries_comm_identity():
    init = pack(api=22, flags=F_RETURNED | F_ID | F_OUT, ts_ns=10, ret_ts_ns=510, comm=0xABC0,
                aux=0x7FFF0000, nranks=16, rank=3, id_hash=0x6AFE1CC17717E1F4, pid=7, tid=7)
    gather = pack(api=5, flags=F_RETURNED, ts_ns=600, ret_ts_ns=700, comm=0xABC0, count=1000,
                  datatype=7, pid=7, tid=7, seq=1)
    (r_init, r_gather), comms = records_of(init, gather)
    assert valid(r_init).measurement == "nccl_comm"
    assert r_init.tags == {"event": "init", "pid": "7", "comm": "0xabc0",
                           "comm_id": "0x6afe1cc17717e1f4", "node": "n1"}
    assert r_init.fields["nranks"] == 16 and r_init.fields["rank"] == 3
    assert r_init.fields["duration_ns"] == 500 and r_init.time_ns == CLOCK.to_wall(10)
    assert valid(r_gather).tags["comm_id"] == "0x6afe1cc17717e1f4"
    assert r_gather.tags["timing"] == "enqueue" and r_gather.tags["datatype"] == "float32"
    f = r_gather.fields
    assert (f["count"], f["bytes"], f["size_bytes"], f["nranks"], f["rank"]) == \
        (1000, 4000, 64000, 16, 3)       # AllGather: S = count x 4 x 16
    assert len(comms) == 1


def test_destroy_forgets_the_communicator_and_failed_init_is_not_remembered():
    init = pack(api=22, flags=F_RETURNED | F_OUT, comm=0xABC0, nranks=2, rank=0, pid=7)
    destroy = pack(api=28, flags=F_RETURNED, comm=0xABC0, pid=7)
    failed = pack(api=22, flags=F_RETURNED | F_OUT, comm=0, ret=1, nranks=2, rank=0, pid=7)
    _, comms = records_of(init, destroy, failed)
    assert len(comms) == 0


def test_rooted_p2p_and_group_records():
    (bcast, send, group), _ = records_of(
        pack(api=11, flags=F_RETURNED, count=10, datatype=0, peer=1, ret=4),
        pack(api=18, flags=F_RETURNED, count=12345, datatype=7, peer=5, ret=4),
        pack(api=20, flags=F_RETURNED, ret=0))
    assert valid(bcast).tags["op"] == "Broadcast" and bcast.fields["api"] == "ncclBcast"
    assert bcast.fields["root"] == 1 and "peer" not in bcast.fields
    assert valid(send).fields["peer"] == 5 and send.fields["bytes"] == 49380
    assert "size_bytes" in send.fields          # Send needs no nranks
    assert valid(group).tags == {"op": "GroupStart", "pid": "0", "timing": "enqueue",
                                 "node": "n1"}
    assert "count" not in group.fields


def test_unknown_datatype_keeps_the_call_without_bytes():
    (rec,), _ = records_of(pack(api=1, flags=F_RETURNED, count=8, datatype=77, redop=0))
    assert valid(rec).tags["datatype"] == "dtype77" and "bytes" not in rec.fields


def test_comm_table_is_bounded_and_prunes_exited_processes():
    table = CommTable(capacity=2)
    for pid in (1, 2, 3):
        table.put(pid, 0x10, CommInfo(None, None, None))
    assert len(table) == 2 and table.evicted == 1
    assert table.drop_pids({3}) == 1 and len(table) == 1


def test_every_api_id_decodes():
    for api_id, api in API_BY_ID.items():
        assert decode(pack(api=api_id)).api is api
