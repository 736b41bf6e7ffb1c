"""The nccl_inspector source over NCCL Inspector dump lines in their real format
(tests/unit/nccl_fixtures/inspector/, sources cited in its SOURCES.md)."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from fabricscope.agent.probes.base import Clock, ProbeContext, ProbeUnavailable
from fabricscope.agent.sources.nccl_inspector import Malformed, NcclInspectorSource, parse_line
from fabricscope.records import Record
from fabricscope.schema import validate
from tests.unit.test_ncclprof_probe import FakeProc

FIXTURE = Path(__file__).parent / "nccl_fixtures" / "inspector" / "node7-pid4242.log"
LINES = FIXTURE.read_bytes().split(b"\n")


def source(tmp_path: Path, proc: FakeProc) -> NcclInspectorSource:
    ctx = ProbeContext(node="n0", addresses=frozenset(), clock=Clock(0),
                       config=SimpleNamespace(nccl_inspector_dir=str(tmp_path / "dumps")))
    s = NcclInspectorSource(ctx, procs=proc.table())
    s.attach()
    return s


@pytest.fixture
def env(tmp_path):
    (tmp_path / "dumps").mkdir()
    proc = FakeProc(tmp_path / "proc")
    proc.add(4242, b"RANK=4\0MASTER_ADDR=10.0.0.9\0MASTER_PORT=29500\0")
    return tmp_path / "dumps", proc


def valid(records):
    for r in records:
        validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n0"}, r.fields))
    return records


def test_a_verbose_collective_line_is_timed_at_its_start():
    time_ns, tags, fields = parse_line(LINES[2])
    assert time_ns == 1752867229235059 * 1000
    assert tags == {"op": "ReduceScatter", "kind": "coll", "comm": "0xe62dedaa97644a",
                    "comm_name": "DP Group 0", "host": "node7", "timing": "kernel_gpu"}
    assert fields == {"seq": 1231, "comm_rank": 4, "bytes": 2147483648,
                      "exec_seconds": pytest.approx(0.041057), "nranks": 8, "nnodes": 1,
                      "pid": 4242, "algbw_gbs": pytest.approx(418.439467),
                      "busbw_gbs": pytest.approx(366.134533)}


def test_an_older_line_without_timing_source_or_name_is_read_at_its_dump_time():
    time_ns, tags, fields = parse_line(LINES[0])
    assert time_ns == 1748030377748202 * 1000
    assert tags["timing"] == "unknown" and "comm_name" not in tags
    assert (fields["seq"], fields["bytes"], fields["comm_rank"]) == (1407, 17179869184, 2)


def test_a_p2p_line_carries_its_peer_and_a_nan_bandwidth_is_left_out():
    _, tags, fields = parse_line(LINES[3])
    assert (tags["op"], tags["kind"], fields["peer"]) == ("Send", "p2p", 5)
    _, _, nan = parse_line(LINES[4])
    assert "algbw_gbs" not in nan and "busbw_gbs" not in nan and nan["exec_seconds"] == 0


@pytest.mark.parametrize("line", [LINES[5], LINES[6], b"[1,2]", b'{"header":{}}', LINES[7]])
def test_a_line_that_is_not_an_operation_object_is_malformed(line):
    with pytest.raises(Malformed):
        parse_line(line)


def test_appended_lines_become_records_with_the_process_job_and_bad_ones_are_counted(env,
                                                                                      tmp_path):
    dumps, proc = env
    s = source(tmp_path, proc)
    path = dumps / "node7-pid4242.log"
    path.write_bytes(FIXTURE.read_bytes())
    out = valid(s.poll())
    assert [r.fields["seq"] for r in out] == [1407, 1230, 1231, 88, 1232]
    assert all(r.tags["job"] == "10.0.0.9:29500" and r.tags["rank"] == "4" for r in out)
    assert s.stats()["malformed_lines"] == 2
    # the partial last line is completed by the next write
    with open(path, "ab") as f:
        f.write(LINES[1][len(LINES[7]):] + b"\n")
    (rec,) = valid(s.poll())
    assert rec.fields["seq"] == 1230 and s.stats()["malformed_lines"] == 2
    assert s.poll() == []


def test_a_file_present_at_start_is_followed_from_its_end(env, tmp_path):
    dumps, proc = env
    path = dumps / "node7-pid4242.log"
    path.write_bytes(LINES[0] + b"\n")
    s = source(tmp_path, proc)
    assert s.poll() == []
    with open(path, "ab") as f:
        f.write(LINES[1] + b"\n")
    assert [r.fields["seq"] for r in s.poll()] == [1230]


def test_a_truncated_file_is_read_again_from_its_start(env, tmp_path):
    dumps, proc = env
    s = source(tmp_path, proc)
    path = dumps / "node7-pid4242.log"
    path.write_bytes(b"\n".join(LINES[:3]) + b"\n")
    assert len(s.poll()) == 3
    path.write_bytes(LINES[3] + b"\n")
    assert [r.tags["op"] for r in s.poll()] == ["Send"]
    assert s.stats()["truncated"] == 1


def test_a_process_unknown_here_is_tagged_with_its_pid(env, tmp_path):
    dumps, proc = env
    s = source(tmp_path, proc)
    (dumps / "other-pid77.log").write_bytes(LINES[1].replace(b'"pid":4242', b'"pid":77')
                                            + b"\n")
    (rec,) = s.poll()
    assert (rec.tags["job"], rec.tags["rank"]) == ("77", "-")


def test_without_a_directory_the_source_says_what_to_set(tmp_path):
    ctx = ProbeContext(node="n0", addresses=frozenset(), clock=Clock(0),
                       config=SimpleNamespace(nccl_inspector_dir=""))
    with pytest.raises(ProbeUnavailable, match="NCCL_INSPECTOR_DUMP_DIR"):
        NcclInspectorSource(ctx).attach()
