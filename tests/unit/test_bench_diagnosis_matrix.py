"""`python -m fabricscope.bench.diagnosis_matrix` ends with one line, not a traceback, when it is
interrupted (SIGINT, or SIGTERM, which the lab turns into KeyboardInterrupt) or its
lab cannot start."""

from __future__ import annotations

import pytest

import fabricscope.bench.diagnosis_matrix as matrix
from fabricscope.errors import UserError


@pytest.mark.parametrize("raised, code, said", [
    (KeyboardInterrupt(), 130, "interrupted"),
    (UserError("the lab needs root", "run it as root"), 2, "the lab needs root")],
    ids=["interrupted", "user-error"])
def test_the_bench_ends_with_one_line(monkeypatch, capsys, raised, code, said):
    def run_set(*args, **kwargs):
        raise raised
    monkeypatch.setattr(matrix, "run_set", run_set)
    assert matrix.main(["--set", "dev", "--runs", "1"]) == code
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1 and "Traceback" not in err
