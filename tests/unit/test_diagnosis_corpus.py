"""The engine over a committed corpus of recorded runs: exact findings, every time.

tests/corpus/diagnosis/ holds runs of the scenario space (bench/scenario_space.py)
recorded live with FABRICSCOPE_MATRIX_DUMP: each one's raw measurements as the
store answered them, compressed, with the faults that were set. They cover every
cause the space draws and several places of each. Each is loaded into a real
InfluxDB on loopback and the engine runs over it second by second as the live one
would have seen it arrive (bench/matrix_replay, `diagnose --recompute`'s path).

Two assertions per run: it is judged right as the live matrix judges (the primary
warning names a fault's cause and place, every fault that cost >= 10 % of the step
is named, nothing else is warned of), and its warnings are exactly those recorded
in expected.json (cause, place, severity). A change to the engine that changes a
finding fails here until expected.json is written anew
(`python -m fabricscope.bench.matrix_replay --record tests/corpus/diagnosis`) and the change
is reviewed. How accurate the engine is, is measured by `fabricscope bench
diagnosis-matrix` on runs nobody tuned it to, not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabricscope.bench.matrix_replay import replay_dump, warnings_of
from fabricscope.services import InfluxServer

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "diagnosis"
DUMPS = sorted(p.name for p in CORPUS.glob("*.json.gz"))
EXPECTED = json.loads((CORPUS / "expected.json").read_text()) if DUMPS else {}


@pytest.fixture(scope="module")
def influx():
    with InfluxServer() as server:
        yield server


def test_the_corpus_covers_every_cause_the_space_draws():
    causes = {e["cause"] for name in DUMPS for e in EXPECTED[name]["expected"]}
    assert causes >= {"lossy_link", "buffer_saturation", "straggler_compute", "input_stall"}
    assert any(not EXPECTED[name]["expected"] for name in DUMPS), "no healthy run"
    assert set(EXPECTED) == set(DUMPS)


#: how each network cause's sentence opens (diagnosis/detect_network.py _summary)
OPENING = {"lossy_link": "Lossy link at ", "buffer_saturation": "Buffer saturation at ",
           "straggler_network": "Slow link at "}


@pytest.mark.parametrize("name", DUMPS)
def test_a_recorded_run_gives_its_findings(influx, name):
    out = replay_dump(str(CORPUS / name), influx)
    judged = out["judged"]
    assert judged.ok, (out["params"], out["replay"], judged.false_alarms)
    assert warnings_of(out) == [tuple(w) for w in EXPECTED[name]["warnings"]], out["params"]
    # a finding's sentence is its cause's, however often the evidence read otherwise
    assert all(summary.startswith(OPENING[cause]) for cause, summary in out["sentences"]
               if cause in OPENING), out["sentences"]
