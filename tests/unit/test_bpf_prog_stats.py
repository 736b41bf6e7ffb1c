"""agent/bpf.py: ProgStats from /proc/self/fdinfo (run time, runs, skipped runs), and the
ring buffer callback guard (open_ring)."""

from __future__ import annotations

from fabricscope.agent import bpf


def test_prog_stats_sum_the_fdinfo_of_each_program(monkeypatch, tmp_path):
    (tmp_path / "3").write_text("prog_type:\t5\nprog_tag:\tab12\nrun_time_ns:\t100\n"
                                "run_cnt:\t4\nrecursion_misses:\t2\nverified_insns:\t9\n")
    (tmp_path / "4").write_text("prog_type:\t3\nrun_time_ns:\t50\nrun_cnt:\t1\n")  # < 5.12
    monkeypatch.setattr(bpf, "Path", lambda path: tmp_path / path.rsplit("/", 1)[1])
    assert bpf.prog_stats([3, 4, 5]) == bpf.ProgStats(run_ns=150, runs=5, missed=2)   # 5: gone
    assert bpf.prog_stat_counters([3]) == {"bpf_run_ns": 100, "bpf_runs": 4, "missed_hits": 2}
    assert sum([bpf.ProgStats(1, 2, 3), bpf.ProgStats(10, 20, 30)], bpf.ProgStats()) == \
        bpf.ProgStats(11, 22, 33)


class _Ring:
    """The one call of a BCC ring buffer table that open_ring makes."""

    def open_ring_buffer(self, callback):
        self.callback = callback


def test_a_ring_callback_that_raises_counts_the_event_and_logs_once(caplog):
    ring, errors, seen = _Ring(), [], []

    def handler(_ctx, _data, size):
        if size < 0:
            raise RuntimeError("a bug in a decoder")
        seen.append(size)
        return 0

    bpf.open_ring(ring, handler, lambda: errors.append(1), "gloo")
    with caplog.at_level("WARNING", logger="fabricscope.agent.bpf"):
        results = [ring.callback(None, None, size) for size in (-1, 8, -1)]
    assert results == [0, 0, 0] and seen == [8] and len(errors) == 2
    warned = [r for r in caplog.records if "handler_errors" in r.getMessage()]
    assert len(warned) == 1 and warned[0].exc_info is not None
