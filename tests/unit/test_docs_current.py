"""Documents rendered from code are current (the others: test_schema, test_config), and
docs/DIAGNOSIS.md's generated blocks render, check and fail as they should."""

import json
import re
import shutil
from importlib import import_module
from pathlib import Path

import pytest

import fabricscope.bench.diagnosis_matrix as matrix
from fabricscope.bench.scenarios import Outcome
from fabricscope.diagnosis import causes, docs
from fabricscope.diagnosis.thresholds import render_markdown

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "DIAGNOSIS.md"


def test_diagnosis_md_has_the_current_thresholds_table():
    assert render_markdown() in DOC.read_text(), \
        "run `python -m fabricscope.diagnosis.thresholds` and put its table into docs/DIAGNOSIS.md"


def test_the_generated_blocks_of_diagnosis_md_are_current():
    assert docs.stale() == [], "run `python -m fabricscope.diagnosis.docs`"


def test_every_cause_has_its_severity_evidence_and_what_it_rules_out():
    for table in (causes.MEANING, causes.SEVERITY_RULE, causes.EVIDENCE, causes.RULES_OUT):
        assert set(table) == set(causes.Cause)
    assert docs.causes_table().count("\n| `") == len(causes.Cause)


def test_a_threshold_a_cause_names_is_shown_with_its_value_and_unit():
    assert docs.with_values("at least `loss_ratio` resent") == "at least `loss_ratio` (0.002) resent"
    assert docs.with_values("`rtt_excess_us` above") == "`rtt_excess_us` (1000 us) above"
    assert docs.with_values("for `evaluation.UNEXPLAINED_AFTER_S` s") == \
        "for `UNEXPLAINED_AFTER_S` (5) s"


def test_a_name_that_is_no_threshold_stops_the_render_with_one_line(monkeypatch, capsys):
    monkeypatch.setitem(causes.EVIDENCE, causes.Cause.LOSSY_LINK, "above `loss_ration`")
    assert docs.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert "`loss_ration`" in err and "fix:" in err and err.count("\n") == 1


def test_every_module_constant_the_document_names_exists():
    named = set(re.findall(r"`(\w+)\.(\w+)`", DOC.read_text()))
    assert named, "the document names no module constant: the check checks nothing"
    for module, name in sorted(named):
        assert hasattr(import_module(f"diagnosis.{module}"), name), f"{module}.{name}"


@pytest.fixture
def repo(tmp_path):
    """A repository holding only docs/DIAGNOSIS.md, as the code renders it (no results)."""
    (tmp_path / "docs").mkdir()
    shutil.copy(DOC, tmp_path / "docs" / "DIAGNOSIS.md")
    assert docs.main(["--root", str(tmp_path)]) == 0
    return tmp_path


def test_check_names_a_stale_block_and_writes_nothing(repo, capsys):
    doc = repo / "docs" / "DIAGNOSIS.md"
    edited = doc.read_text().replace("| `lossy_link`: ", "| `lossy_link` (edited): ", 1)
    doc.write_text(edited)
    assert docs.main(["--check", "--root", str(repo)]) == 2
    assert "stale generated blocks in docs/DIAGNOSIS.md: causes;" in capsys.readouterr().err
    assert doc.read_text() == edited
    assert docs.main(["--root", str(repo)]) == 0
    assert docs.main(["--check", "--root", str(repo)]) == 0


def test_the_prose_around_the_blocks_is_kept(repo):
    doc = repo / "docs" / "DIAGNOSIS.md"
    doc.write_text(doc.read_text().replace("## Lifecycle", "## Lifecycle, by hand", 1))
    assert docs.main(["--root", str(repo)]) == 0
    assert "## Lifecycle, by hand" in doc.read_text()


def test_a_document_without_a_blocks_markers_fails_with_one_line(repo, capsys):
    doc = repo / "docs" / "DIAGNOSIS.md"
    doc.write_text(doc.read_text().replace("<!-- END generated space -->", "", 1))
    assert docs.main(["--root", str(repo)]) == 2
    err = capsys.readouterr().err
    assert "lacks the markers of the generated block 'space'" in err and err.count("\n") == 1


def test_an_unmeasured_set_says_so_with_the_command_that_measures_it(repo):
    block = docs.blocks(repo)["accuracy-eval"]
    assert block.startswith("Not measured yet: `python -m fabricscope.bench.diagnosis_matrix --set eval ")
    assert "--json bench/results/diagnosis-eval.json`" in block


def _results() -> dict:
    """What `python -m fabricscope.bench.diagnosis_matrix --set eval --runs 3 --json` writes."""
    loss = [{"cause": "lossy_link", "place": {"node": "node1"}, "required": True}]
    shape = [{"cause": "buffer_saturation", "place": {"tor": "tor0"}, "required": True}]
    runs = [
        Outcome("healthy", "-", "j0", seed=90000),
        Outcome("loss", "loss 2 % at node1's port", "j1", seed=90001, expected=loss,
                named=[True], primary={"cause": "lossy_link", "place": {"node": "node1"}},
                primary_ok=True, cause_ok=True, all_found=True, every_found=True,
                warnings=1, right_warnings=1, latency_s=[2.5], cost=0.4),
        Outcome("shape", "shape 200 Mbit/s at tor0's uplink", "j2", seed=90002,
                expected=shape, named=[False],
                primary={"cause": "lossy_link", "place": {"node": "node0"}},
                warnings=1, false_alarms=["lossy_link at node0's port (warning)"], cost=0.3)]
    return {"summary": matrix.summarize(runs), "runs": [o.to_dict() for o in runs]}


def test_a_results_file_renders_as_its_sets_table_with_its_command(tmp_path, capsys):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps(_results()))
    assert matrix.main(["--render", str(path)]) == 0
    table = capsys.readouterr().out
    assert f"`python -m fabricscope.bench.diagnosis_matrix --set eval --runs 3 --json {path}`" in table
    assert "seeds 90000-90002" in table
    assert "| 50.0% (1 of 2) |" in table                       # right: loss yes, shape no
    assert "| precision: warnings that name a fault | 50.0% (1 of 2) |" in table
    assert "| shape | 1 | 1 | 0 |" in table
    assert "buffer_saturation -> lossy_link: 1" in table


def test_a_measured_set_is_embedded_as_the_bench_renders_it(repo):
    (repo / "bench" / "results").mkdir(parents=True)
    rel = "bench/results/diagnosis-dev.json"
    (repo / rel).write_text(json.dumps(_results()))
    assert docs.blocks(repo)["accuracy-dev"] == matrix.markdown(_results(), rel)
    assert docs.main(["--check", "--root", str(repo)]) == 2


@pytest.mark.parametrize("text, said", [
    ("{not json", "is not JSON"), ('{"summary": {}, "runs": []}', "holds no runs")],
    ids=["garbled", "empty"])
def test_a_bad_results_file_is_refused_with_one_line(tmp_path, capsys, text, said):
    path = tmp_path / "r.json"
    path.write_text(text)
    assert matrix.main(["--render", str(path)]) == 2
    err = capsys.readouterr().err
    assert said in err and "fix:" in err and err.count("\n") == 1


def test_a_missing_results_file_is_refused_with_one_line(tmp_path, capsys):
    assert matrix.main(["--render", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and err.count("\n") == 1
