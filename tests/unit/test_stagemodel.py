"""fabricscope.stagemodel on simulated GPipe schedules: blocking sends and receives
meet (a transfer ends for both sides at the later of the two posts plus its own
time), stages run their programs in order, and the slow stage is found by what it
computes, whatever the rank order; a slow link leaves the stages balanced."""

from __future__ import annotations

import pytest

from fabricscope.jobclass import JobClass, Observation, classify
from fabricscope.stagemodel import SLOW_STAGE_COST, stage_model, step_bubble

MS = 1_000_000


def gpipe(compute_ms, micro=4, steps=3, transfer_ms=0.2, hop_ms=None, ranks=None,
          nbytes=65_536) -> list[Observation]:
    """Observations of `steps` GPipe steps: stage s computes compute_ms[s] per
    micro-batch and pass; hop_ms[(a, b)] is a transfer's time from stage a to b;
    ranks[s] is stage s's rank."""
    p = len(compute_ms)
    ranks = ranks or list(range(p))
    hop_ms = hop_ms or {}
    programs = []
    for s in range(p):
        prog = []
        for _ in range(steps):
            for _mb in range(micro):
                if s > 0:
                    prog.append(("recv", s - 1))
                prog.append(("compute", compute_ms[s]))
                if s < p - 1:
                    prog.append(("send", s + 1))
            for _mb in range(micro):
                if s < p - 1:
                    prog.append(("recv", s + 1))
                prog.append(("compute", compute_ms[s]))
                if s > 0:
                    prog.append(("send", s - 1))
        programs.append(prog)
    clock, pc, out = [0.0] * p, [0] * p, []
    while any(pc[s] < len(programs[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if pc[s] >= len(programs[s]):
                continue
            kind, arg = programs[s][pc[s]]
            if kind == "compute":
                clock[s] += arg
                pc[s] += 1
                moved = True
                continue
            peer = arg
            want = "recv" if kind == "send" else "send"
            if pc[peer] < len(programs[peer]) and programs[peer][pc[peer]] == (want, s):
                src, dst = (s, peer) if kind == "send" else (peer, s)
                end = max(clock[s], clock[peer]) + hop_ms.get((src, dst), transfer_ms)
                for side, op, other in ((src, "Send", dst), (dst, "Recv", src)):
                    out.append(Observation(op, nbytes, int(clock[side] * MS), int(end * MS),
                                           rank=ranks[side], peer=ranks[other]))
                    clock[side] = end
                    pc[side] += 1
                moved = True
        assert moved, "the simulated schedule deadlocked"
    return out


def test_balanced_stages_name_no_slow_stage():
    model = stage_model(gpipe([2.0, 2.0, 2.0]))
    assert model.slow_stage is None and model.cost_share == 0.0
    assert 0 < model.bubble_share < 0.6
    assert model.reason.startswith("stages balanced")


def test_a_stage_that_computes_twice_as_long_is_the_slow_stage():
    model = stage_model(gpipe([2.0, 4.0, 2.0]))
    assert model.slow_stage == 1 and model.cost_share >= SLOW_STAGE_COST
    assert "slow stage rank 1" in model.reason
    # spans open at a stage's first transfer: the edges leave its ratio near, not at, 2
    (mine,) = [s for s in model.stages if s.rank == 1]
    others = [s.compute_s for s in model.stages if s.rank != 1]
    assert 1.8 < mine.compute_s / (sum(others) / 2) < 2.3
    # the others wait for it: their time in transfers exceeds its own
    waits = {s.rank: s.wait_share for s in model.stages}
    assert waits[1] < waits[0] and waits[1] < waits[2]


def test_the_slow_stage_is_found_by_its_compute_whatever_the_rank_order():
    model = stage_model(gpipe([2.0, 2.0, 3.5, 2.0], ranks=[3, 0, 2, 1]))
    assert model.slow_stage == 2


def test_a_slow_link_between_two_stages_leaves_them_balanced_with_a_larger_bubble():
    fine = stage_model(gpipe([2.0, 2.0, 2.0]))
    slow_link = stage_model(gpipe([2.0, 2.0, 2.0], hop_ms={(1, 2): 3.0, (2, 1): 3.0}))
    assert slow_link.slow_stage is None
    assert slow_link.bubble_share > fine.bubble_share + 0.1


def test_a_small_imbalance_is_below_the_cost_that_names_it():
    model = stage_model(gpipe([2.0, 2.1, 2.0]))
    assert model.slow_stage is None


def test_too_few_transfers_or_stages_are_no_model():
    assert stage_model(gpipe([2.0, 2.0], micro=1, steps=1)) is None
    assert stage_model([o for o in gpipe([2.0, 4.0]) if o.rank == 0]) is None


def test_a_pipeline_is_classified_with_its_stage_model():
    result = classify(gpipe([2.0, 4.0, 2.0], steps=5))
    assert result.job_class is JobClass.PIPELINE
    assert result.stages is not None and result.stages.slow_stage == 1
    assert "slow stage rank 1" in result.reason
    assert result.to_dict()["stages"]["slow_stage"] == 1
    # the period is the step, though a middle stage's calls repeat every micro-batch:
    # the first stage's 4 sends and 4 receives repeat once per step
    assert result.collectives_per_step == 8 and result.period_s is not None


@pytest.mark.parametrize("slow", [0, 2])
def test_the_first_or_last_stage_can_be_the_slow_one(slow):
    compute = [2.0, 2.0, 2.0]
    compute[slow] = 4.0
    assert stage_model(gpipe(compute)).slow_stage == slow


def test_a_steps_bubble_is_the_ranks_mean_share_of_it_in_transfers():
    """step_bubble clips each transfer to the step: rank 0 sends for 30 of the step's
    100 ms (10 of them before it began), rank 1 receives for 50; one rank alone is no
    pipeline."""
    obs = [Observation("Send", 1, -10 * MS, 30 * MS, rank=0, peer=1),
           Observation("Recv", 1, 50 * MS, 100 * MS, rank=1, peer=0),
           Observation("Recv", 1, 100 * MS, 150 * MS, rank=1, peer=0),
           Observation("AllReduce", 1, 0, 100 * MS, rank=0)]
    assert step_bubble(obs, 0, 100 * MS) == pytest.approx((0.3 + 0.5) / 2)
    assert step_bubble(obs[:1], 0, 100 * MS) is None
    assert step_bubble(obs, 100 * MS, 100 * MS) is None


def test_a_simulated_pipelines_step_bubble_grows_with_a_slow_stage():
    balanced, skewed = gpipe([2.0, 2.0], steps=1), gpipe([2.0, 4.0], steps=1)
    end = max(o.end_ns for o in skewed)
    assert step_bubble(skewed, 0, end) > step_bubble(balanced, 0, end)
