"""A finding (diagnosis/finding.py): its id, its `finding` point (schema-valid, read back
from a real InfluxDB as it was written) and its JSON."""

from __future__ import annotations

import dataclasses

import pytest

from fabricscope.diagnosis.finding import Advice, Evidence, Finding, finding_id, ordered, primary
from fabricscope.diagnosis.present import explain, findings_text
from fabricscope.diagnosis.store import Store
from fabricscope.schema import validate
from fabricscope.services import InfluxServer
from fabricscope.surface.report.html_parts import finding_html

DB = "fabricscope"
START = 1_700_000_025_123_456_789


def lossy(**changes) -> Finding:
    f = Finding(
        "lossy_link", "critical", "198.18.0.1:29500", {"node": "node1", "rank": "1"}, START,
        "Lossy link at node1's port: 1.00% of the payload resent",
        first_seen_ns=START + 2_000_000_000, last_seen_ns=START + 30_000_000_000,
        evidence=[Evidence("tcp_flow", "payload resent on node1->node0", 1.0, "%",
                           START, START + 3_000_000_000, ["node1"]),
                  Evidence("gloo_step", "grad sync per step (baseline 0.300 s)", 0.8, "s",
                           START, START + 3_000_000_000)],
        ruled_out=[{"cause": "straggler_compute", "why": "no rank computes much longer"}],
        advice=[Advice("physical link at the switch port of node1", "reseat the optic",
                       "frames die independent of load")],
        step_seconds_added=0.5, share_of_step=0.3333, explained_share=1.0,
        retransmit_amplification=249.5,
        victims=[{"rank": "0", "node": "node0", "waited_s": 0.5}])
    return dataclasses.replace(f, **{"id": "", **changes}) if changes else f


def test_the_id_is_stable_over_rewrites_and_names_job_cause_place_and_start():
    f = lossy()
    assert f.id == finding_id(f.job, f.cause, f.place, START) and len(f.id) == 12
    # the engine rewrites a finding as it evolves: the id stays
    rewritten = lossy(severity="warning", summary="other words", last_seen_ns=START * 2,
                      end_ns=START + 40_000_000_000)
    assert rewritten.id == f.id
    assert lossy(start_ns=START + 500_000_000).id == f.id     # same second
    assert Finding("lossy_link", "warning", f.job, {"node": "node1", "rank": "1",
                                                    "tor": ""}, START, "").id == f.id
    assert lossy(start_ns=START + 1_000_000_000).id != f.id
    assert lossy(place={"node": "node2", "rank": "2"}).id != f.id
    assert lossy(cause="buffer_saturation").id != f.id
    assert lossy(job="other").id != f.id


def test_unknown_causes_and_severities_are_refused():
    with pytest.raises(ValueError, match="unknown cause"):
        Finding("gremlins", "warning", "j", {}, START, "")
    with pytest.raises(ValueError, match="unknown severity"):
        Finding("lossy_link", "fatal", "j", {}, START, "")


def test_where_names_the_place_for_a_person():
    assert lossy().where == "node1"
    assert lossy(place={"tor": "tor0", "interface": "uplink"}).where == "tor0 uplink"
    assert lossy(place={"peer": "198.18.0.254:9000"}).where == "peer 198.18.0.254:9000"
    assert lossy(place={"node": "node1", "interface": "eth0"}).where == "node1 (eth0)"
    assert lossy(place={}).where == "job 198.18.0.1:29500"


def test_primary_is_the_most_severe_then_the_costliest():
    small = lossy(step_seconds_added=0.1)
    big = lossy(step_seconds_added=0.9)
    info = lossy(severity="info", step_seconds_added=5.0)
    assert primary([small, info, big]) is big
    assert primary([]) is None


def test_a_finding_taken_over_is_never_primary_reads_last_and_points_to_its_taker():
    taker = lossy(place={"tor": "tor0", "interface": "uplink"}, step_seconds_added=0.2)
    moved = lossy(step_seconds_added=0.9, end_ns=START + 4_000_000_000,
                  superseded_by=taker.id)
    assert primary([moved, taker]) is taker and primary([moved]) is None
    assert ordered([moved, taker]) == [taker, moved]
    text = findings_text([moved, taker])
    assert text.startswith("Primary: lossy_link at tor0 uplink")
    assert f"finding {taker.id} took it over" in text
    assert text.count("reseat the optic") == 1            # the taker's advice only
    why = explain(moved)
    assert f"finding {taker.id} took it over" in why and "What to change" not in why
    page = finding_html(moved)
    assert page.startswith("<details") and f'href="#finding-{taker.id}"' in page
    assert "reseat the optic" not in page


@pytest.mark.parametrize("finding", [lossy(), lossy(end_ns=START + 40_000_000_000),
                                     lossy(retransmit_amplification=None,
                                           place={"tor": "tor0", "interface": "uplink"}),
                                     lossy(end_ns=START + 40_000_000_000,
                                           superseded_by="a1b2c3")],
                         ids=["open", "closed", "uplink", "taken over"])
def test_the_record_is_valid_against_the_schema(finding):
    r = finding.to_record()
    validate(r)
    assert r.measurement == "finding" and r.time_ns == finding.start_ns
    assert r.tags["id"] == finding.id
    assert set(r.tags) == {"id", "cause", "job"} | {k for k, v in finding.place.items() if v}
    assert r.fields["open"] is finding.open
    assert ("end_ns" in r.fields) is (not finding.open)


@pytest.fixture(scope="module")
def store():
    with InfluxServer() as influx:
        influx.query(f'CREATE DATABASE "{DB}"')
        yield Store(influx.url, DB)


def read_back(store: Store, finding_id_: str) -> list[Finding]:
    rows = store.query(f"SELECT * FROM finding WHERE id = '{finding_id_}'")
    return [Finding.from_row(row) for row in rows]


@pytest.mark.parametrize("finding", [lossy(), lossy(end_ns=START + 40_000_000_000, job="b"),
                                     lossy(retransmit_amplification=None, job="c",
                                           place={"tor": "tor0", "interface": "uplink"}),
                                     lossy(end_ns=START + 40_000_000_000, job="d",
                                           superseded_by="a1b2c3")],
                         ids=["open", "closed", "uplink", "taken over"])
def test_a_finding_reads_back_from_influxdb_as_it_was_written(store, finding):
    store.write([finding.to_record()])
    assert read_back(store, finding.id) == [finding]


def test_a_rewritten_finding_stays_one_point_holding_its_latest_state(store):
    first = lossy(job="rewrite")
    store.write([first.to_record()])
    later = dataclasses.replace(first, severity="warning", summary="it cleared",
                                last_seen_ns=START + 60_000_000_000,
                                end_ns=START + 60_000_000_000)
    store.write([later.to_record()])
    assert read_back(store, first.id) == [later]


def test_json_round_trip():
    for f in (lossy(), lossy(end_ns=START + 40_000_000_000),
              lossy(end_ns=START + 40_000_000_000, superseded_by="a1b2c3")):
        obj = f.to_json()
        assert list(obj)[0] == "id" and obj["impact"] == {"step_seconds_added": 0.5,
                                                          "share_of_step": 0.3333}
        assert obj["start"] == pytest.approx(START / 1e9)
        back = Finding.from_json(obj)
        # times travel as float seconds: exact to well under a microsecond
        for name in ("start_ns", "first_seen_ns", "last_seen_ns"):
            assert abs(getattr(back, name) - getattr(f, name)) < 1000
        assert (back.end_ns is None) is (f.end_ns is None)
        same_times = dataclasses.replace(back, start_ns=f.start_ns,
                                         first_seen_ns=f.first_seen_ns,
                                         last_seen_ns=f.last_seen_ns, end_ns=f.end_ns)
        assert same_times == f
