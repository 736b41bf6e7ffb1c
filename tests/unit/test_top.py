"""`fabricscope top` (surface/top.py): the frame at a few sizes from data built here,
the tables read back from a real InfluxDB holding a synthetic job, and its bad
input as one line."""

from __future__ import annotations

import re
import subprocess
import sys
import threading

import pytest

from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Finding
from fabricscope.diagnosis.store import Store
from fabricscope.errors import UserError
from fabricscope.jobclass import Observation, classify
from fabricscope.records import Record
from fabricscope.services import InfluxServer
from fabricscope.surface.top import (MIN_HEIGHT, MIN_WIDTH, Collective, Link, RankStep, Reader, TopData,
                         frame, read)
from tests.unit.test_diagnosis_evidence import T0, build, to_records
from tests.unit.test_report_cli import (JOB, LOSSY, NOWHERE, ROOT, fabric_records,
                                        one_line_error)

LONG = ("Lossy link at node1's port: 2.09% of the payload on node1->node0, node2->node1 "
        "resent with the RTT at its floor (drops independent of load); steps 0.62 -> 1.25 s")


def top_data(links: int = 3, findings: int = 2, virtual: tuple[int, ...] = ()) -> TopData:
    """`virtual`: the links (by index) without a line rate."""
    found = [Finding("lossy_link", "critical", "job-a", {"node": "node1", "interface": "eth0"},
                     T0 * SECOND, LONG, step_seconds_added=0.61),
             Finding("microburst", "info", "job-a", {}, T0 * SECOND, "bursts, normal")]
    return TopData(
        (T0 + 10) * SECOND, None,
        links=[Link(f"node{k}", "eth0", 1.6e8, 1.7e8, peak_bps=1.1e9,
                    peak_util=None if k in virtual else 1.1,
                    retrans_ratio=0.0154 if k == 1 else 0.0002, rtt_p90_us=2474.0)
               for k in range(links)],
        steps=[RankStep("job-a", str(k), f"node{k}", 15, 0.88, 0.94, 170, 3.2) for k in range(3)],
        collectives=[Collective("job-a", "AllReduce", 96, 0.298, 0.802, 0.0192)],
        findings=found[:findings])


def texts(width: int, height: int, data: TopData | None = None, *,
          built: bool = True) -> list[str]:
    data = data if data is not None or not built else top_data()
    return [line.text for line in frame(data, width, height)]


@pytest.mark.parametrize("width, height", [(160, 45), (100, 30), (80, 24), (60, 16)])
def test_every_line_fits_the_terminal(width, height):
    lines = texts(width, height)
    assert len(lines) <= height
    assert all(len(line) < width for line in lines)
    titles = [t for t in lines if t.split("  (")[0] in (
        "LINKS (last 5 s)", "STEPS (latest per rank)", "COLLECTIVES (last 10 s)",
        "OPEN FINDINGS")]
    assert len(titles) == 4, lines
    assert lines[0].startswith("fabricscope top  job all  ")


def test_a_wide_terminal_shows_every_row_and_the_summary_to_the_width():
    lines = texts(160, 45)
    assert [ln.split()[0] for ln in lines if re.match(r"node\d", ln)] == ["node0", "node1",
                                                                           "node2"]
    node1 = next(ln for ln in lines if ln.startswith("node1"))
    assert node1.split()[2:] == ["160.0", "170.0", "1100.0", "110%", "1.54%", "2474"]
    assert not any("line rate unknown" in ln for ln in lines)
    (critical,) = [ln for ln in lines if ln.startswith("CRITICAL")]
    assert critical.split()[:4] == ["CRITICAL", "lossy_link", "node1", "(eth0)"]
    assert "+0.61s" in critical and len(critical) == 159
    assert LONG.startswith(critical.split("+0.61s  ")[1])
    assert sum(ln.startswith("job-a") for ln in lines) == 4      # 3 ranks, 1 collective


def test_a_short_terminal_keeps_every_table_and_says_what_it_leaves_out():
    lines = texts(80, MIN_HEIGHT, top_data(links=6))
    assert "LINKS (last 5 s)  (+5 not shown)" in lines
    assert any(ln.startswith("CRITICAL") for ln in lines)        # findings go first
    assert len(lines) == MIN_HEIGHT


def test_a_link_without_a_line_rate_shows_its_peak_rate_and_no_share_of_a_guess():
    lines = texts(160, 45, top_data(virtual=(2,)))
    node2 = next(ln for ln in lines if ln.startswith("node2"))
    assert node2.split()[2:6] == ["160.0", "170.0", "1100.0", "unknown"]
    assert "%" not in node2.split()[5]
    assert sum("line rate unknown" in ln for ln in lines) == 1


def test_a_job_handed_its_classification_shows_its_class_under_the_header():
    ring = [Observation("AllReduce", 4 << 20, (T0 + s) * SECOND + k * 10**7,
                        (T0 + s) * SECOND + k * 10**7 + 5 * 10**6, rank=r)
            for s in range(8) for k in range(3) for r in range(2)]
    data = top_data()
    data.classes["job-a"] = classify(ring)
    lines = texts(160, 45, data)
    assert lines[1].startswith("job job-a: data_parallel: allreduce carries 100% of the "
                               "exchanged bytes")
    data.classes["job-a"] = {"class": "telepathy"}
    with pytest.raises(UserError, match="job class 'telepathy' is none of"):
        texts(160, 45, data)


def test_a_terminal_too_small_says_so():
    for width, height in ((MIN_WIDTH - 1, 40), (120, MIN_HEIGHT - 1), (20, 3)):
        lines = texts(width, height)
        assert lines[0].startswith("terminal too small"[:width - 1])
        assert all(len(line) < width for line in lines) and len(lines) <= height


def test_an_empty_store_and_a_failing_one_show_as_such():
    empty = TopData((T0 + 10) * SECOND, "job-a")
    lines = texts(100, 30, empty)
    assert lines[0].startswith("fabricscope top  job job-a")
    assert lines.count("  (none)") == 4
    empty.error = "InfluxDB at http://x is unreachable (refused)"
    assert "store: InfluxDB at http://x is unreachable" in texts(100, 30, empty)[1]
    # before the first read
    assert texts(100, 30, None, built=False)[-1] == "reading the store..."


@pytest.fixture(scope="module")
def store():
    with InfluxServer() as server:
        server.query('CREATE DATABASE "fabricscope"')
        s = Store(server.url)
        s.write(to_records(build(JOB)) + fabric_records() + [LOSSY.to_record()])
        yield s


def test_the_tables_come_from_the_last_seconds_of_the_store(store):
    data = read(store, None, now_ns=(T0 + 40) * SECOND)
    assert [(k.node, k.interface) for k in data.links] == [(f"node{k}", "eth0")
                                                           for k in range(3)]
    assert all(k.tx_bps == k.rx_bps == 8e6 and k.peak_bps == 9e8 and k.peak_util == 0.9
               for k in data.links)
    assert data.links[1].retrans_ratio > 0.01 > data.links[0].retrans_ratio
    assert all(k.rtt_p90_us == 300.0 for k in data.links)
    assert [(s.job, s.rank, s.node) for s in data.steps] == [(JOB.job, str(k), f"node{k}")
                                                             for k in range(3)]
    assert all(s.seconds == 1.5 and 0 <= s.age_s < 3 for s in data.steps)
    (coll,) = data.collectives
    # one per rank and second, T0+30..T0+40: both ends count, as in Grafana's $timeFilter
    assert (coll.op, coll.count, coll.max_s) == ("AllReduce", 3 * 11, 0.8)
    assert [f.id for f in data.findings] == [LOSSY.id]
    # a job narrows every table; one the store lacks empties them
    assert read(store, JOB.job, now_ns=(T0 + 40) * SECOND).links == data.links
    other = read(store, "other:1", now_ns=(T0 + 40) * SECOND)
    assert (other.steps, other.links, other.findings) == ([], [], [])


def test_a_jobs_stored_class_is_read_with_the_frame_and_shown_under_the_header(store):
    from fabricscope.diagnosis.jobclass import job_class_record
    ring = [Observation("AllReduce", 4 << 20, s * SECOND + k * 10**7,
                        s * SECOND + k * 10**7 + 5 * 10**6, rank=r)
            for s in range(8) for k in range(3) for r in range(2)]
    t = (T0 + 500) * SECOND
    store.write([job_class_record(JOB.job, t, classify(ring), 0, 60.0, t)])
    data = read(store, None, now_ns=t + 2 * SECOND)
    assert data.classes[JOB.job]["class"] == "data_parallel"
    assert "data_parallel: allreduce carries 100% of the exchanged bytes" in \
        texts(160, 45, data)[1]
    # a minute on, the point is no longer the job's present class
    assert read(store, None, now_ns=t + 61 * SECOND).classes == {}


def test_a_virtual_link_in_the_store_reads_as_a_peak_rate_with_its_share_unknown(store):
    t = (T0 + 300) * SECOND
    store.write([Record("nic_window", t, {"node": "node7", "interface": "veth0",
                                          "direction": direction},
                        {"bytes": 10**6, "packets": 700, "rate_bps": 8e6, "peak_bps": 5e8,
                         "link_speed_source": "unknown"}) for direction in ("rx", "tx")])
    (link,) = read(store, None, now_ns=t + 2 * SECOND).links
    assert (link.node, link.peak_bps, link.peak_util) == ("node7", 5e8, None)


def test_top_with_the_store_unreachable_or_a_bad_interval_is_one_line():
    def top(*argv):
        return subprocess.run([sys.executable, "-m", "fabricscope", "top", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert "unreachable" in one_line_error(top(*NOWHERE, "--once"))
    assert "--interval 0.0 is not positive" in one_line_error(top(*NOWHERE, "--interval", "0"))


class BlockingStore:
    """A store whose every query waits until released, as a slow store does."""

    def __init__(self, fail: Exception | None = None):
        self.entered, self.release, self.fail = threading.Event(), threading.Event(), fail

    def query(self, *_args, **_kwargs):
        self.entered.set()
        self.release.wait()
        if self.fail:
            raise self.fail
        return []


def test_a_query_in_flight_neither_blocks_the_screen_nor_quitting():
    slow = BlockingStore()
    reader = Reader(slow, "job-a", 0.1)
    reader.start()
    assert slow.entered.wait(30)
    assert reader.data is None            # the screen draws "reading the store..." meanwhile
    reader.stop()                         # returns at once: q needs no answer from the store
    slow.release.set()
    reader._thread.join(30)
    assert not reader._thread.is_alive() and reader.failure is None


def test_a_reader_that_breaks_hands_its_error_to_the_screen():
    broken = BlockingStore(fail=RuntimeError("decoder bug"))
    broken.release.set()
    reader = Reader(broken, None, 0.1)
    reader.start()
    reader._thread.join(30)
    assert isinstance(reader.failure, RuntimeError)


def test_a_short_terminal_gives_the_tables_first_rows_before_the_classes():
    data = top_data()
    data.classes = {f"job-{k}": {"class": "data_parallel", "reason": "r"} for k in range(3)}
    lines = texts(120, MIN_HEIGHT, data)
    assert len(lines) == MIN_HEIGHT and not any(ln.startswith("job job-") for ln in lines)
    assert lines[-1].startswith("CRITICAL")           # the open findings' first row
    assert sum(ln.startswith("job job-") for ln in texts(120, MIN_HEIGHT + 2, data)) == 2
