"""agent/training_join.py: retransmits into collective windows, transfers into phases."""

from __future__ import annotations

from fabricscope.agent.training_join import WINDOW_WAIT_S, TrainingJoin
from fabricscope import schema
from fabricscope.records import Record

MS = 1_000_000
T0 = 10**18
JOB = {"job": "198.18.0.1:29500", "rank": "1"}
OWNER = {"pid": "4242", "comm": "python", **JOB}


def collective(start_ms, seconds, pid=4242):
    return Record("gloo_collective", T0 + start_ms * MS, {**JOB, "op": "AllReduce"},
                  {"seconds": seconds, "bytes": 4 << 20, "pid": pid, "tid": 7})


def step(start_ms, seconds, index):
    return Record("gloo_step", T0 + start_ms * MS, dict(JOB),
                  {"step": index, "seconds": seconds, "sync_seconds": 0.01, "buckets": 2,
                   "bytes": 8 << 20})


def retransmit(at_ms, segs, pid="4242"):
    return Record("tcp_retransmit", T0 + at_ms * MS,
                  {"saddr": "198.18.0.2", "daddr": "198.18.0.3", "sport": "4000",
                   "dport": "5000", "state": "ESTABLISHED", "kind": "fast", "pid": pid},
                  {"segs": segs, "err": 0})


def transfer(start_ms, seconds, bytes_in, bytes_out, owner=OWNER, dport="9000",
             daddr="198.18.0.9"):
    return Record("tcp_transfer", T0 + start_ms * MS,
                  {"saddr": "198.18.0.2", "daddr": daddr, "sport": "41000",
                   "dport": dport, "side": "client", **owner},
                  {"seconds": seconds, "bytes_in": bytes_in, "bytes_out": bytes_out})


def run(records, retransmits_known=True):
    """Feed in one poll, then let the hold and the wait for windows expire; every
    record out, validated."""
    join = TrainingJoin(retransmits_known)
    out = join.feed(records, now_s=100.0) + join.feed([], now_s=103.0) + \
        join.feed([], now_s=100.0 + WINDOW_WAIT_S + 0.1)
    for r in out:
        schema.validate(Record(r.measurement, r.time_ns, {"node": "n1", **r.tags}, r.fields))
    return out, join.stats()


def by(out, measurement):
    return [r for r in out if r.measurement == measurement]


def test_retransmits_inside_the_window_are_counted_on_the_collective_and_the_step():
    out, stats = run([collective(0, 0.010), collective(20, 0.010), step(0, 0.040, 3),
                      retransmit(5, 2), retransmit(9, 1), retransmit(15, 4), retransmit(25, 3),
                      retransmit(50, 9), retransmit(6, 5, pid="999")])
    first, second = by(out, "gloo_collective")
    assert (first.fields["retransmits"], first.fields["retrans_segs"]) == (2, 3)
    assert (second.fields["retransmits"], second.fields["retrans_segs"]) == (1, 3)
    (s,) = by(out, "gloo_step")
    assert (s.fields["retransmits"], s.fields["retrans_segs"]) == (4, 10)   # 5, 9, 15, 25 ms
    assert s.fields["sync_retrans_segs"] == 6                                # 5, 9, 25 ms
    assert len(by(out, "tcp_retransmit")) == 6          # passed through untouched
    assert stats["collectives_joined"] == 2 and stats["steps_joined"] == 1


def test_without_a_tcp_probe_the_fields_are_absent_not_zero():
    out, _ = run([collective(0, 0.010)], retransmits_known=False)
    assert "retrans_segs" not in by(out, "gloo_collective")[0].fields


def test_held_records_wait_for_partners_from_a_later_poll():
    """A collective leaves with the next poll, joined with the retransmits that poll
    drained (they happened inside its window, before it ended)."""
    join = TrainingJoin(True)
    assert join.feed([collective(0, 0.010)], now_s=100.0) == []
    out = join.feed([retransmit(4, 2)], now_s=100.3)
    assert sorted(r.measurement for r in out) == ["gloo_collective", "tcp_retransmit"]
    assert by(out, "gloo_collective")[0].fields["retrans_segs"] == 2
    assert join.feed([], now_s=102.1) == []


def test_a_step_that_ended_before_its_poll_began_leaves_with_that_poll():
    """Its retransmits were in the kernel's buffers when the poll began draining, so
    they are in the same poll: it goes on at once, joined with them. A collective
    still running when the poll began waits for the next poll, as without a clock."""
    wall = [T0 + 50 * MS]
    join = TrainingJoin(True, wall_ns=lambda: wall[0])
    join.begin_poll()
    out = join.feed([collective(0, 0.010), step(0, 0.040, 3), collective(45, 0.010),
                     retransmit(4, 2), retransmit(30, 1), retransmit(47, 5)], now_s=100.0)
    assert sorted(r.measurement for r in out) == ["gloo_collective", "gloo_step",
                                                  "tcp_retransmit", "tcp_retransmit",
                                                  "tcp_retransmit"]
    assert by(out, "gloo_collective")[0].fields["retrans_segs"] == 2
    assert by(out, "gloo_step")[0].fields["retrans_segs"] == 3
    wall[0] = T0 + 1050 * MS
    join.begin_poll()
    late = join.feed([retransmit(52, 4)], now_s=101.0)
    assert [(r.time_ns, r.fields["retrans_segs"]) for r in by(late, "gloo_collective")] == \
        [(T0 + 45 * MS, 9)]


def test_without_a_clock_a_finished_step_still_waits_for_the_next_poll():
    join = TrainingJoin(True)
    join.begin_poll()
    assert join.feed([step(0, 0.040, 3)], now_s=100.0) == []
    assert by(join.feed([], now_s=101.0), "gloo_step")[0].fields["step"] == 3


def test_transfers_inside_collectives_are_folded_and_the_others_become_phases():
    out, stats = run([collective(0, 0.010), collective(10, 0.010), step(0, 0.040, 3),
                      step(40, 0.040, 4),
                      transfer(2, 0.006, 3 << 20, 3 << 20, daddr="198.18.0.3"),  # the ring
                      transfer(12, 0.006, 3 << 20, 3 << 20, daddr="198.18.0.3"),
                      transfer(25, 0.003, 1 << 20, 16),              # a batch read
                      transfer(60, 0.020, 200, 5 << 20, dport="9001")])  # a checkpoint
    phases = by(out, "gloo_phase")
    assert [(p.tags["phase"], p.fields["step"], p.fields["bytes_in"], p.fields["bytes_out"])
            for p in phases] == [("data_load", 3, 1 << 20, 16), ("checkpoint", 4, 200, 5 << 20)]
    assert phases[0].fields["peer"] == "198.18.0.9:9000" and phases[0].fields["pid"] == 4242
    assert phases[0].time_ns == T0 + 25 * MS and phases[0].fields["seconds"] == 0.003
    assert phases[0].tags == {**JOB, "phase": "data_load"}
    assert len(by(out, "tcp_transfer")) == 2
    assert (stats["transfers_folded"], stats["transfers_written"],
            stats["phases_inferred"]) == (2, 2, 2)


def test_a_ring_flow_is_folded_also_outside_the_windows_and_the_store_is_control():
    ring = "198.18.0.3"
    out, stats = run([transfer(1, 0.0001, 96, 0, daddr=ring),     # a peer's early send
                      collective(10, 0.010), collective(30, 0.010),
                      transfer(12, 0.005, 2 << 20, 2 << 20, daddr=ring),
                      transfer(31, 0.005, 2 << 20, 2 << 20, daddr=ring),
                      transfer(50, 0.0001, 300, 200, daddr="198.18.0.1", dport="29500")])
    assert by(out, "gloo_phase") == [] and by(out, "tcp_transfer") == []
    assert (stats["transfers_folded"], stats["transfers_control"]) == (3, 1)


def test_a_read_that_starts_before_a_late_collective_return_stays_a_data_load():
    # the main thread reads the next batch while the gloo thread has not returned yet
    reads = [transfer(t, 0.001, 1 << 20, 16) for t in (22, 62, 102)]
    out, stats = run([collective(0, 0.0225), collective(40, 0.010), collective(80, 0.010),
                      *reads])
    assert len(by(out, "gloo_phase")) == 3 and stats["transfers_folded"] == 0


def test_a_transfer_after_the_last_written_step_is_in_the_step_in_progress():
    out, _ = run([step(0, 0.040, 3), transfer(50, 0.002, 1 << 20, 0)])
    assert by(out, "gloo_phase")[0].fields["step"] == 4
    out, _ = run([transfer(50, 0.002, 1 << 20, 0)])           # no step known yet
    assert by(out, "gloo_phase")[0].fields["step"] == -1


def test_a_transfer_of_a_process_without_a_job_is_written_without_a_phase():
    out, stats = run([transfer(5, 0.002, 1 << 20, 0, owner={"pid": "77", "comm": "curl"}),
                      transfer(9, 0.002, 1 << 20, 0, owner={})])
    assert len(by(out, "tcp_transfer")) == 2 and by(out, "gloo_phase") == []
    assert stats["phases_inferred"] == 0


def test_flush_releases_everything_held():
    join = TrainingJoin(True)
    join.feed([collective(0, 0.010), transfer(30, 0.001, 1 << 20, 0)], now_s=5.0)
    out = join.flush()
    assert sorted(r.measurement for r in out) == ["gloo_collective", "gloo_phase",
                                                  "tcp_transfer"]


def test_a_long_transfer_over_several_collectives_and_the_compute_between_is_ring_traffic():
    ring = "198.18.0.3"
    # collectives 0-10, 12-22, 24-34 ms; transfers over them, reported while they ran
    out, stats = run([transfer(0, 0.030, 6 << 20, 6 << 20, daddr=ring),
                      transfer(31, 0.004, 2 << 20, 2 << 20, daddr=ring),
                      collective(0, 0.010), collective(12, 0.010), collective(24, 0.010)])
    assert by(out, "tcp_transfer") == [] and stats["transfers_folded"] == 2


def test_nccl_calls_of_a_communicator_created_before_attach_get_rank_from_its_log_line():
    init = Record("nccl_log_comm", T0, {"host": "h", "pid": "77", "event": "init_complete",
                                        "comm": "0x55d0c8a0", "comm_id": "0xabc"},
                  {"rank": 3, "nranks": 8, "cuda_dev": 3, "nvml_dev": 3, "bus_id": "1b000"})
    call = Record("nccl_call", T0 + MS, {"op": "AllReduce", "pid": "77", "timing": "enqueue",
                                         "comm": "0x55d0c8a0"},
                  {"api": "ncclAllReduce", "count": 1024, "bytes": 4096, "duration_ns": 900,
                   "ret": 0, "seq": 1, "tid": 77})
    other = Record("nccl_call", T0 + MS, {"op": "AllReduce", "pid": "78", "timing": "enqueue",
                                          "comm": "0x55d0c8a0"}, dict(call.fields))
    out, stats = run([init, call, other])
    done = [r for r in by(out, "nccl_call") if r.tags["pid"] == "77"][0]
    assert (done.fields["rank"], done.fields["nranks"], done.tags["comm_id"]) == (3, 8, "0xabc")
    assert "rank" not in [r for r in by(out, "nccl_call") if r.tags["pid"] == "78"][0].fields
    assert stats["nccl_calls_completed_from_logs"] == 1


def test_transfers_of_other_processes_are_capped_per_second_training_ones_never():
    join = TrainingJoin(True, transfers_per_s=2)
    other = {"pid": "9", "comm": "nginx"}
    records = [transfer(t, 0.001, 1 << 20, 0, owner=other) for t in (1, 2, 3, 1001)]
    records += [transfer(t, 0.001, 1 << 20, 0) for t in (4, 5, 6)]           # a rank's reads
    out = join.feed(records, now_s=0.0) + join.flush()
    mine = [r for r in by(out, "tcp_transfer") if r.tags["pid"] == "9"]
    assert [r.time_ns for r in mine] == [T0 + MS, T0 + 2 * MS, T0 + 1001 * MS]
    assert len(by(out, "gloo_phase")) == 3 and join.stats()["transfers_unlisted"] == 1


def test_a_transfer_waits_past_the_hold_for_the_windows_of_its_time():
    # the ring transfer is reported; its collective's window comes 3 s later (a
    # loaded machine, or a long poll interval): it is still folded, not a phase
    ring = "198.18.0.3"
    join = TrainingJoin(True)
    out = join.feed([collective(0, 0.010), transfer(1, 0.004, 2 << 20, 2 << 20, daddr=ring),
                     transfer(5, 0.004, 2 << 20, 2 << 20, daddr=ring)], now_s=100.0)
    out += join.feed([transfer(13, 0.008, 4 << 20, 4 << 20, daddr=ring)], now_s=100.5)
    out += join.feed([], now_s=102.6)          # past the hold: the third still waits
    assert join.stats()["transfers_awaited"] == 1 and join.stats()["transfers_folded"] == 2
    out += join.feed([collective(12, 0.010)], now_s=103.0)
    out += join.feed([], now_s=100.0 + WINDOW_WAIT_S + 1)
    assert by(out, "tcp_transfer") == [] and by(out, "gloo_phase") == []
    assert join.stats()["transfers_folded"] == 3


def test_collective_windows_are_kept_as_their_union():
    """Overlapping windows (two gloo threads) and a long first barrier: the coverage a
    transfer is judged by is the union, answered without walking every window."""
    from fabricscope.agent.training_join import _Process
    proc = _Process()
    for start, end in [(0, 2000), (2500, 2600), (2550, 2700), (3000, 3100), (2700, 2800),
                       (100, 200), (5000, 5000)]:
        proc.add_window(start, end)
    assert proc.windows == [(0, 2000), (2500, 2800), (3000, 3100), (5000, 5000)]
    assert proc.newest_end_ns == 5000
    assert proc.in_window(1500, 1500) and not proc.in_window(2200, 2200)
    assert proc.in_window(2400, 2900)                 # 300 of 500 inside
    assert proc.in_window(2700, 3100)                 # 200 of 400 inside: half counts
    assert not proc.in_window(2750, 3050)             # 100 of 300
    assert not proc.in_window(1900, 2650)             # 250 of 750, across two windows
    proc.retrans = [(1999, 3), (2300, 1), (2750, 2), (5000, 1)]
    assert proc.retransmits_in_windows(0, 6000) == (3, 6)


def test_a_transfer_falls_in_the_step_whose_span_holds_it():
    join = TrainingJoin(retransmits_known=True)
    for i in range(5):
        join._learn_step(step(100 * i, 0.1 if i < 4 else None, i))
    key = (JOB["job"], JOB["rank"])
    assert [join._step_at(key, T0 + ms * MS) for ms in (-5, 0, 150, 399, 400, 10_000)] \
        == [-1, 0, 1, 3, 4, 4]


def test_a_small_piece_right_after_a_checkpoint_is_its_tail_not_a_read():
    """The store's 8-byte acknowledgment came 3.5 ms after the checkpoint's last byte
    (the store was descheduled): still the checkpoint. A small piece long after, or a
    big one right after, is classified by its own bytes."""
    def piece(start_ms, bytes_in, bytes_out, gap_s=None):
        r = transfer(start_ms, 0.001, bytes_in, bytes_out)
        if gap_s is not None:
            r.fields["gap_s"] = gap_s
        return r
    out, _ = run([collective(0, 0.010), piece(20, 0, 4_200_309), piece(29, 8, 0, 0.0035),
                  piece(60, 8, 0, 0.030), piece(100, 0, 4_200_309, 0.069),
                  piece(104, 2 << 20, 16, 0.003)])
    phases = sorted(by(out, "gloo_phase"), key=lambda r: r.time_ns)
    assert [(p.tags["phase"], p.fields["bytes"]) for p in phases] == [
        ("checkpoint", 4_200_309), ("checkpoint", 8), ("data_load", 8),
        ("checkpoint", 4_200_309), ("data_load", (2 << 20) + 16)]


def test_with_the_tail_rule_off_every_piece_is_classified_by_its_own_bytes():
    join = TrainingJoin(True, tail_s=0)
    first, tail = transfer(20, 0.001, 0, 4_200_309), transfer(29, 0.001, 8, 0)
    tail.fields["gap_s"] = 0.0035
    out = join.feed([first, tail], now_s=100.0) + join.flush()
    assert [p.tags["phase"] for p in sorted(by(out, "gloo_phase"), key=lambda r: r.time_ns)] \
        == ["checkpoint", "data_load"]


def test_a_read_on_a_flow_settled_apart_goes_on_with_its_own_poll():
    """Two 1 MiB reads outside the collective windows settle the data server's flow
    apart from the ring; a slow read's next piece then goes out with the poll that
    drained it, as a data_load phase, without waiting for the windows of its time
    (a ring transfer of the same poll still waits)."""
    join = TrainingJoin(True)
    join.feed([collective(0, 0.010), transfer(20, 0.002, 1 << 20, 16),
               transfer(40, 0.002, 1 << 20, 16), collective(50, 0.010)], now_s=100.0)
    join.feed([], now_s=101.0)
    assert join.stats()["phases_inferred"] == 2
    ring = transfer(1200, 0.004, 2 << 20, 2 << 20, daddr="198.18.0.3")
    out = join.feed([transfer(1100, 0.001, 80_000, 0), ring], now_s=102.0)
    (phase,) = by(out, "gloo_phase")
    assert phase.time_ns == T0 + 1100 * MS and phase.tags["phase"] == "data_load"
    assert by(out, "tcp_transfer")[0].time_ns == T0 + 1100 * MS
    assert join.stats()["transfers_settled"] == 1


def test_a_flow_with_a_transfer_still_waiting_keeps_its_order():
    """While one of its transfers waits for the windows of its time, the flow's next
    transfer waits behind it, settled or not, and they go on in their order (a
    checkpoint's tail piece takes the phase of the transfer before it)."""
    join = TrainingJoin(True)
    out = join.feed([collective(0, 0.010), transfer(20, 0.002, 1 << 20, 16),
                     transfer(40, 0.002, 1 << 20, 16), transfer(70, 0.002, 1 << 20, 16),
                     collective(50, 0.010)], now_s=100.0)
    out += join.feed([], now_s=101.0)     # 20 and 40 go on; 70 waits for its windows
    assert [p.time_ns for p in by(out, "gloo_phase")] == [T0 + 20 * MS, T0 + 40 * MS]
    out += join.feed([transfer(1100, 0.001, 80_000, 0)], now_s=102.0)
    assert len(by(out, "gloo_phase")) == 2 and join.stats()["transfers_settled"] == 0
    out += join.feed([collective(1200, 0.010)], now_s=103.0)
    assert [p.time_ns for p in by(out, "gloo_phase")][2:] == [T0 + 70 * MS, T0 + 1100 * MS]


def test_a_ring_flow_is_never_settled_apart():
    """A flow whose transfers lie inside the windows is folded, each transfer waiting
    for the windows of its time, however many came before."""
    ring = "198.18.0.3"
    join = TrainingJoin(True)
    out = join.feed([collective(0, 0.010), transfer(1, 0.004, 2 << 20, 2 << 20, daddr=ring),
                     collective(20, 0.010), transfer(21, 0.004, 2 << 20, 2 << 20, daddr=ring)],
                    now_s=100.0)
    out += join.feed([], now_s=101.0)
    out += join.feed([transfer(41, 0.004, 2 << 20, 2 << 20, daddr=ring)], now_s=102.0)
    assert join.stats()["transfers_settled"] == 0
    out += join.feed([collective(40, 0.010)], now_s=103.0)
    out += join.feed([], now_s=104.0)
    assert by(out, "gloo_phase") == [] and join.stats()["transfers_folded"] == 3
