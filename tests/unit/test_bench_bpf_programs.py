"""bench/bpf_programs.py: the per-program breakdown from two fdinfo snapshots."""

from __future__ import annotations

from fabricscope.bench import bpf_programs as bp


def test_breakdown_sums_programs_of_one_name_and_leaves_idle_ones_out(monkeypatch):
    names = {1: "tcp__tcp_probe", 2: "tcp__tcp_probe", 3: "fs_nic_egress", 4: "idle"}
    monkeypatch.setattr(bp, "prog_name_by_id", names.__getitem__)
    before = {1: (100, 10_000), 2: (0, 0), 3: (50, 50_000), 4: (7, 700)}
    after = {1: (1100, 210_000), 2: (1000, 100_000), 3: (1050, 600_000), 4: (7, 700)}
    rows = bp.breakdown(before, after, seconds=2.0)
    assert [r[0] for r in rows] == ["fs_nic_egress", "tcp__tcp_probe"]   # by core share
    nic, probe = rows
    assert nic == ("fs_nic_egress", 500.0, 550.0, 550_000 / 2 / 1e7)
    assert probe[1:3] == (1000.0, 150.0)          # 2000 runs, 300 us


def test_a_program_that_went_away_has_no_name():
    assert bp.prog_name_by_id(2**31 - 1) == "?"
