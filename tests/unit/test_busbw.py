"""fabricscope.busbw: nccl-tests size and bandwidth definitions, hand-computed values."""

import pytest

from fabricscope import busbw


def test_datatype_sizes_match_nccl_h():
    sizes = {code: size for code, (_, size) in busbw.DATATYPES.items()}
    assert sizes == {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}
    assert busbw.datatype_name(7) == "float32" and busbw.datatype_name(9) == "bfloat16"
    assert busbw.datatype_name(42) == "dtype42" and busbw.datatype_size(42) is None


def test_names_of_redops_and_results():
    assert [busbw.redop_name(i) for i in range(5)] == ["sum", "prod", "max", "min", "avg"]
    assert busbw.redop_name(7) == "user7"
    assert busbw.result_name(4) == "ncclInvalidArgument"
    assert busbw.result_name(99) == "ncclResult99"


@pytest.mark.parametrize("op,count,size,n,expected", [
    ("AllReduce", 1000, 4, 8, 4000),          # S = count x size
    ("Broadcast", 1000, 2, 8, 2000),
    ("Send", 10, 8, None, 80),                 # nranks not needed
    ("AllGather", 1000, 4, 8, 32000),          # count is per rank: x n
    ("ReduceScatter", 1000, 4, 8, 32000),
    ("AlltoAll", 64, 4, 4, 1024),
    ("Gather", 5, 4, 2, 40),
    ("AllGather", 1000, 4, None, None),        # unknown without nranks
])
def test_message_bytes(op, count, size, n, expected):
    assert busbw.message_bytes(op, count, size, n) == expected


@pytest.mark.parametrize("op,n,factor", [
    ("AllReduce", 8, 1.75), ("AllReduce", 2, 1.0), ("AllReduce", 1, 0.0),
    ("AllGather", 4, 0.75), ("ReduceScatter", 16, 0.9375), ("AlltoAll", 2, 0.5),
    ("Broadcast", 8, 1.0), ("Reduce", 8, 1.0), ("SendRecv", 2, 1.0),
])
def test_bus_factor(op, n, factor):
    assert busbw.bus_factor(op, n) == pytest.approx(factor)


def test_algbw_and_busbw_hand_computed():
    # AllReduce of 1e9 bytes in 0.1 s on 8 ranks: algbw 10 GB/s, busbw 10 x 14/8 = 17.5
    assert busbw.algbw_gbs(1_000_000_000, 0.1) == pytest.approx(10.0)
    assert busbw.busbw_gbs("AllReduce", 1_000_000_000, 0.1, 8) == pytest.approx(17.5)
    # AllGather, 1e6 float32 per rank, 4 ranks: S = 16e6 B; in 1 ms algbw 16, busbw 12
    s = busbw.message_bytes("AllGather", 1_000_000, 4, 4)
    assert s == 16_000_000
    assert busbw.busbw_gbs("AllGather", s, 0.001, 4) == pytest.approx(12.0)


def test_ring_wire_model():
    assert busbw.ring_bytes_per_rank("AllReduce", 100, 4) == pytest.approx(150.0)   # 2S(n-1)/n
    assert busbw.ring_bytes_per_rank("AllGather", 100, 4) == pytest.approx(75.0)    # S(n-1)/n
    assert busbw.ring_bytes_per_rank("Broadcast", 100, 4) == pytest.approx(100.0)   # S


@pytest.mark.parametrize("call", [
    lambda: busbw.bus_factor("AllReduce", 0),
    lambda: busbw.bus_factor("Allreduce", 4),
    lambda: busbw.algbw_gbs(10, 0),
    lambda: busbw.message_bytes("AllReduce", -1, 4, 2),
])
def test_bad_input_is_a_clear_value_error(call):
    with pytest.raises(ValueError):
        call()
