"""The nccl_ras source against a stand-in RAS service on 127.0.0.1 speaking NCCL's client
protocol (tests/support/nccl_ras_server.py), serving a status in NCCL's JSON format
(tests/unit/nccl_fixtures/ras/)."""

import logging
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from fabricscope.agent.probes.base import Clock, ProbeContext, ProbeUnavailable
from fabricscope.agent.sources.nccl_ras import NcclRasSource, status_records
from fabricscope.records import Record
from fabricscope.schema import validate
from tests.support.nccl_ras_server import RasStandIn
from tests.unit.test_ncclprof_probe import FakeProc

STATUS = (Path(__file__).parent / "nccl_fixtures" / "ras" / "status_missing_ranks.json").read_text()


def make_source(tmp_path, address, job="", addresses=()):
    proc = FakeProc(tmp_path / "proc")
    proc.add(4101, b"RANK=0\0FABRICSCOPE_JOB=llm-9\0")
    ctx = ProbeContext(node="n0", addresses=frozenset(addresses), clock=Clock(0),
                       config=SimpleNamespace(nccl_ras_address=address, nccl_ras_job=job,
                                              nccl_ras_interval_s=3600.0))
    return NcclRasSource(ctx, procs=proc.table())


@pytest.fixture
def ras():
    server = RasStandIn(STATUS)
    yield server
    server.close()


def valid(records):
    for r in records:
        validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n0"}, r.fields))
    return records


def test_the_client_speaks_the_ncclras_protocol_and_reads_the_json_status(ras, tmp_path):
    src = make_source(tmp_path, ras.address, job="llm")
    src.attach(start_thread=False)
    src.query_once()
    assert ras.commands == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "SET FORMAT json", "STATUS"]
    out = valid(src.poll())
    comms = {r.tags["comm"]: r for r in out if r.measurement == "nccl_ras_comm"}
    big = comms["0x5c2e3bd0ab2d3b6f"].fields
    assert (big["nranks"], big["ranks_seen"], big["missing"]) == (4, 3, 1)
    assert (big["dead"], big["unresponsive"], big["errors"], big["healthy"]) == (1, 0, 1, False)
    assert big["collection_seconds"] == pytest.approx(5.012) and big["timeouts"] == 1
    ranks = {(r.tags["comm"], r.tags["rank"]): r for r in out if r.measurement == "nccl_ras_rank"}
    assert {k: r.tags["state"] for k, r in ranks.items()} == {
        ("0x5c2e3bd0ab2d3b6f", "3"): "dead", ("0x5c2e3bd0ab2d3b6f", "2"): "error",
        ("0x9d1f0e7a66c41e02", "1"): "unresponsive"}
    dead = ranks[("0x5c2e3bd0ab2d3b6f", "3")].fields
    assert (dead["host"], dead["pid"]) == ("10.0.0.2", 5101)
    assert ranks[("0x5c2e3bd0ab2d3b6f", "2")].fields["async_error"] == 6
    assert all(r.tags["job"] == "llm" for r in out)
    assert src.poll() == []


def test_the_job_comes_from_a_local_rank_process_when_not_configured(ras, tmp_path):
    src = make_source(tmp_path, ras.address, addresses=("10.0.0.1",))
    src.attach(start_thread=False)
    src.query_once()
    assert {r.tags["job"] for r in src.poll()} == {"llm-9"}


def test_a_job_with_no_local_rank_is_named_by_the_ras_address(ras, tmp_path):
    src = make_source(tmp_path, ras.address)
    src.attach(start_thread=False)
    src.query_once()
    assert {r.tags["job"] for r in src.poll()} == {f"ras:{ras.address}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ras_is_one_log_line_and_a_counter(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="fabricscope.agent.nccl_ras")
    address = f"127.0.0.1:{free_port()}"
    src = make_source(tmp_path, address)
    src.attach(start_thread=False)
    for _ in range(3):
        src.query_once()
    assert src.poll() == [] and src.stats()["unreachable"] == 3
    (line,) = [r.getMessage() for r in caplog.records]
    assert "cannot connect to NCCL RAS" in line and "NCCL_RAS_ADDR" in line
    assert "\n" not in line and not caplog.records[0].exc_info


def test_an_nccl_without_json_status_is_counted_unsupported(tmp_path):
    server = RasStandIn(STATUS, json_format=False)
    try:
        src = make_source(tmp_path, server.address)
        src.attach(start_thread=False)
        src.query_once()
        assert src.poll() == [] and src.stats()["unsupported"] == 1
        assert "STATUS" not in server.commands
    finally:
        server.close()


def test_a_document_that_is_not_ras_json_is_counted_malformed(tmp_path):
    server = RasStandIn('{"communicators": [{"hash": "0x1"}]}\n')
    try:
        src = make_source(tmp_path, server.address)
        src.attach(start_thread=False)
        src.query_once()
        assert src.poll() == [] and src.stats()["malformed"] == 1
    finally:
        server.close()


def test_the_query_thread_delivers_to_the_next_poll(ras, tmp_path):
    src = make_source(tmp_path, ras.address, job="llm")
    delivered = []
    original = src.query_once

    def query_and_signal():
        original()
        delivered.append(True)
        src._stop.set()             # one query is enough here

    src.query_once = query_and_signal
    src.attach()
    src._thread.join(timeout=30)    # awaits the query, no sleep
    assert delivered and any(r.measurement == "nccl_ras_comm" for r in src.poll())
    src.detach()


@pytest.mark.parametrize("address,match", [("", "off by default"),
                                           ("localhost", "not host:port")])
def test_a_missing_or_bad_address_makes_the_source_unavailable(tmp_path, address, match):
    with pytest.raises(ProbeUnavailable, match=match):
        make_source(tmp_path, address).attach()


def test_a_healthy_communicator_gets_no_rank_records():
    doc = {"communicators": [{"hash": "0x1", "size": 2, "ranks_count": 2,
                              "missing_ranks_count": 0, "missing_ranks": [],
                              "ranks": [{"rank": 0, "status": {"init_state": 0,
                                                               "async_error": 0}}]}],
           "ras": {"collection_time_sec": 0.001, "timeouts_count": 0}}
    (rec,) = status_records(doc, "j", 5)
    assert rec.measurement == "nccl_ras_comm" and rec.fields["healthy"] is True
