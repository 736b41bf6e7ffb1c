"""The lab's kinds of job without running them: flags, knobs and the pure helpers of
lab/workloads/ (the runs themselves: test_lab_kinds_run.py, tests/kernel)."""

from __future__ import annotations

import statistics

import pytest

from fabricscope.errors import UserError
from fabricscope.lab.training import kind_args
from fabricscope.lab.workloads import Kind
from fabricscope.lab.workloads.common import width_for
from fabricscope.lab.workloads.moe import zipf_weights
from fabricscope.lab.workloads.pipeline import micro_batches, stage_layers
from fabricscope.lab.workloads.serve import arrivals


def test_ddp_without_knobs_adds_no_flag_so_its_command_line_is_unchanged():
    assert kind_args("ddp", None, 3) == []
    assert kind_args(Kind.DDP, {}, 3) == []


def test_a_kind_and_its_knobs_become_worker_flags():
    assert kind_args("pipeline", {"slow_stage": 1, "stage_skew": 2.0}, 3) == [
        "--kind", "pipeline", "--slow-stage", "1", "--stage-skew", "2.0"]
    assert kind_args("moe", {"skew": 1.2}, 2) == ["--kind", "moe", "--skew", "1.2"]


@pytest.mark.parametrize("kind, knobs, world, words", [
    ("gpt", None, 3, "not known"),
    ("ddp", {"skew": 1.0}, 3, "no knobs"),
    ("moe", {"hotness": 1.0}, 3, "unknown knob"),
    ("moe", {"skew": "high"}, 3, "not a float"),
    ("moe", {"skew": -1.0}, 3, "--skew"),
    ("pipeline", {}, 1, "2 or more ranks"),
    ("pipeline", {"slow_stage": 3}, 3, "not a stage of 3"),
    ("pipeline", {"micro_batches": 64}, 3, "more than --batch"),
    ("serve", {"rate": 0.0}, 3, "--rate"),
])
def test_knobs_that_cannot_run_are_refused_with_one_line(kind, knobs, world, words):
    with pytest.raises(UserError) as err:
        kind_args(kind, knobs, world)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_other_kinds_refuse_the_data_server():
    with pytest.raises(UserError, match="ddp only"):
        kind_args("fsdp", {}, 3, data_server=True)


def test_zipf_routing_is_uniform_at_zero_and_makes_the_first_experts_hot():
    assert zipf_weights(6, 0.0) == pytest.approx([1 / 6] * 6)
    hot = zipf_weights(6, 1.2)
    assert sum(hot) == pytest.approx(1.0)
    assert hot == sorted(hot, reverse=True) and hot[0] > 0.3 > hot[-1] * 3


def test_arrivals_are_poisson_at_the_rate_and_the_same_on_every_rank():
    times = arrivals(20.0, 2000)
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 20, rel=0.1)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.1)
    assert arrivals(20.0, 50) == arrivals(20.0, 50)


def test_micro_batches_add_up_to_the_batch():
    assert micro_batches(32, 4) == [8, 8, 8, 8]
    assert micro_batches(10, 4) == [3, 3, 2, 2]


def test_only_the_slow_stage_gets_stage_skew_times_the_layers():
    assert [stage_layers(r, 2, 1, 2.0) for r in range(3)] == [2, 4, 2]
    assert [stage_layers(r, 2, -1, 2.0) for r in range(3)] == [2, 2, 2]


def test_width_gives_about_the_asked_parameter_bytes():
    w = width_for(4.0, 4)
    assert 4 * (w * w + w) * 4 == pytest.approx(4 * 2**20, rel=0.01)


def test_the_cli_takes_kinds_and_knobs_and_a_serve_command():
    import argparse

    from fabricscope.lab.cli import add_arguments, kind_knobs
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["train", "--name", "l", "--steps", "3", "--kind", "pipeline",
                              "--slow-stage", "1", "--stage-skew", "2.0"])
    assert args.kind == "pipeline" and kind_knobs(args) == {"slow_stage": 1, "stage_skew": 2.0}
    args = parser.parse_args(["serve", "--name", "l", "--requests", "9", "--rate", "5",
                              "--mode", "pipeline"])
    assert (args.requests, args.rate, args.mode) == (9, 5.0, "pipeline")
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--name", "l", "--steps", "3", "--kind", "serve"])
