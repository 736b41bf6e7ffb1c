"""Documents rendered from code are current (the others: test_schema, test_config)."""

from pathlib import Path

from diagnosis.thresholds import render_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_diagnosis_md_has_the_current_thresholds_table():
    assert render_markdown() in (ROOT / "docs" / "DIAGNOSIS.md").read_text(), \
        "run `python -m diagnosis.thresholds` and put its table into docs/DIAGNOSIS.md"
