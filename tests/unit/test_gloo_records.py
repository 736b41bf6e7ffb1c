"""gloo probe records and process attribution (no root): schema, figures, tags."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from fabricscope.agent.probes.gloo.layout import Collective
from fabricscope.agent.probes.gloo.procs import ProcessTable, describe
from fabricscope.agent.probes.gloo.records import ProcessState, collective_record
from fabricscope.agent.probes.nic.history import BinHistory
from fabricscope.agent.procmaps import parse_environ
from fabricscope import schema
from fabricscope.lineschema import canonical_line

MS = 1_000_000
INFO = describe(7, {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "198.18.0.1",
                    "MASTER_PORT": "29500"}, True)


def valid(r) -> None:
    """Schema check as the collector does it (the agent's pipeline adds `node`)."""
    schema.validate(type(r)(r.measurement, r.time_ns, {**r.tags, "node": "n0"}, r.fields))


def to_wall(ns: int) -> int:
    return ns + 1_700_000_000 * 10**9


def allreduce(start_ms: float, end_ms: float, nbytes: int = 4_198_400,
              sent: int = 5_597_872, op: str = "AllReduce") -> Collective:
    return Collective(pid=7, tid=8, op=op, model=op, start_ns=int(start_ms * MS),
                      end_ns=int(end_ms * MS), nranks=3, rank=1, bytes=nbytes,
                      bytes_source="options", sent_bytes=sent, recv_bytes=sent, sends=8,
                      recvs=8)


def test_parse_environ_and_job_rules():
    env = parse_environ(b"A=1\0RANK=2\0EMPTY=\0junk\0MASTER_PORT=29500\0MASTER_ADDR=10.0.0.1\0")
    assert env == {"A": "1", "RANK": "2", "EMPTY": "", "MASTER_PORT": "29500",
                   "MASTER_ADDR": "10.0.0.1"}
    info = describe(9, env, True)
    assert (info.job, info.rank, info.world_size) == ("10.0.0.1:29500", "2", None)
    named = describe(9, {**env, "FABRICSCOPE_JOB": "llm-7", "WORLD_SIZE": "4"}, True)
    assert (named.job, named.world_size) == ("llm-7", 4)
    bare = describe(9, {}, False)
    assert (bare.job, bare.rank, bare.local) == ("9", "-", False)


def test_process_table_attributes_by_network_namespace(tmp_path: Path):
    for pid, ns in ((10, "a"), (11, "b")):
        base = tmp_path / str(pid)
        (base / "ns").mkdir(parents=True)
        (tmp_path / ns).touch()
        os.symlink(tmp_path / ns, base / "ns" / "net")
        (base / "environ").write_bytes(b"RANK=%d\0" % pid)
    own = os.stat(tmp_path / "a").st_ino
    table = ProcessTable(tmp_path, own_netns=own)
    assert table.get(10).local and table.get(10).rank == "10"
    assert not table.get(11).local and table.get(11).rank == "-"   # foreign: env unread
    assert table.get(12) is None and not table.alive(12)
    assert table.alive(10) and sorted(table.pids()) == [10, 11]
    table.forget(10)
    assert sorted(table.pids()) == [11]


def test_collective_record_figures():
    r = collective_record(allreduce(0, 20), INFO, to_wall)
    valid(r)
    assert r.tags == {"job": "198.18.0.1:29500", "rank": "1", "op": "AllReduce"}
    assert r.time_ns == to_wall(0)
    f = r.fields
    assert f["seconds"] == pytest.approx(0.020)
    assert f["algbw_gbs"] == pytest.approx(4_198_400 / 0.020 / 1e9)
    assert f["busbw_gbs"] == pytest.approx(f["algbw_gbs"] * 4 / 3)
    assert f["ring_bytes"] == round(4_198_400 * 4 / 3)
    assert f["wire_efficiency"] == pytest.approx(f["ring_bytes"] / 5_597_872)
    assert (f["nranks"], f["comm_rank"], f["bytes_source"]) == (3, 1, "options")


def test_collective_record_without_size_or_model():
    c = Collective(pid=7, tid=8, op="Barrier", model=None, start_ns=MS, end_ns=2 * MS,
                   nranks=None, rank=None, bytes=None, bytes_source="unknown", sent_bytes=0,
                   recv_bytes=0, sends=2, recvs=2)
    r = collective_record(c, INFO, to_wall)
    valid(r)
    assert not {"bytes", "nranks", "busbw_gbs", "ring_bytes", "wire_efficiency"} & set(r.fields)


def test_process_state_emits_steps_phases_and_a_model():
    state = ProcessState(INFO, model_window_s=60)
    records = state.on_collective(allreduce(0, 30, 8_396_800, 16_793_600, "Broadcast"), to_wall)
    t = 100.0
    for _ in range(30):
        records += state.on_collective(allreduce(t, t + 20), to_wall)
        records += state.on_collective(allreduce(t + 1, t + 21), to_wall)
        t += 50
    records += state.flush(to_wall)
    for r in records:
        valid(r)
    steps = [r for r in records if r.measurement == "gloo_step"]
    assert len(steps) == 30
    assert {r.fields["bytes"] for r in steps} == {8_396_800}     # the broadcast's hint
    assert {r.fields["buckets"] for r in steps} == {2}
    full = [r for r in steps if "seconds" in r.fields]
    assert {round(r.fields["seconds"], 6) for r in full} == {0.05}
    assert full[0].fields["comm_fraction"] == pytest.approx(0.021 / 0.05)
    assert full[0].fields["busbw_gbs"] == pytest.approx(8_396_800 / 0.021 / 1e9 * 4 / 3)
    phases = {r.tags["phase"] for r in records if r.measurement == "gloo_phase"}
    assert phases == {"param_broadcast", "grad_sync", "compute"}
    model = next(r for r in records if r.measurement == "traffic_model")   # at exit
    valid(model)
    assert model.tags["series"] == "gloo_sent"
    assert model.fields["period_s"] == pytest.approx(0.050, rel=0.01)
    assert model.fields["duty_cycle"] == pytest.approx(0.021 / 0.05, abs=0.03)
    assert model.fields["network_bound"] is False


def test_model_needs_enough_recent_traffic():
    state = ProcessState(INFO, model_window_s=1)
    for i in range(3):
        state.on_collective(allreduce(i * 50, i * 50 + 20), to_wall)
    assert state.model_record(200 * MS, to_wall) is None
    for i in range(3, 8):
        state.on_collective(allreduce(i * 50, i * 50 + 20), to_wall)
    assert state.model_record(400 * MS, to_wall) is not None
    assert state.model_record(5000 * MS, to_wall) is None          # nothing new since


def test_a_job_whose_steps_outlast_the_window_is_modelled_over_its_last_collectives():
    """Steps of 0.8 s against a 1 s window: never more than two collectives in it, so
    the model is fitted to the last MIN_MODEL_WINDOWS of them, however slow they are."""
    from fabricscope.agent.probes.gloo.records import MIN_MODEL_WINDOWS
    state = ProcessState(INFO, model_window_s=1)
    for i in range(10):
        state.on_collective(allreduce(i * 800, i * 800 + 20), to_wall)
        state.on_collective(allreduce(i * 800 + 30, i * 800 + 60), to_wall)
    model = state.model_record(10 * 800 * MS, to_wall)
    assert model is not None and len(state.windows) == MIN_MODEL_WINDOWS
    assert model.fields["window_s"] == pytest.approx(1.66, abs=0.01)    # steps 7-9


def test_a_process_that_exits_between_two_models_keeps_its_last_one():
    """The periodic model runs every gloo_model_interval_s; a process that exits before
    the next one (or lives shorter than the interval) gets its model at exit, over the
    window ending at its last collective, and no second one when nothing ended since."""
    state = ProcessState(INFO, model_window_s=60)
    for i in range(10):
        state.on_collective(allreduce(i * 50, i * 50 + 20), to_wall)
    models = [r for r in state.flush(to_wall) if r.measurement == "traffic_model"]
    assert len(models) == 1
    valid(models[0])
    assert models[0].time_ns == to_wall(470 * MS)
    assert models[0].fields["window_s"] == pytest.approx(0.470, abs=0.002)
    assert models[0].fields["period_s"] == pytest.approx(0.050, rel=0.01)

    modelled = ProcessState(INFO, model_window_s=60)
    for i in range(10):
        modelled.on_collective(allreduce(i * 50, i * 50 + 20), to_wall)
    assert modelled.model_record(480 * MS, to_wall) is not None
    assert not [r for r in modelled.flush(to_wall) if r.measurement == "traffic_model"]


def test_the_rescan_learns_every_process_mapping_libtorch_while_it_lives():
    from types import SimpleNamespace

    from fabricscope.agent.probes.gloo.probe import GlooProbe
    asked = []
    probe = GlooProbe.__new__(GlooProbe)        # no BPF: only the rescan's bookkeeping
    probe._uprobes = SimpleNamespace(files={(1, 2): SimpleNamespace(pids={41, 42}),
                                            (1, 3): SimpleNamespace(pids={43})})
    probe._procs = SimpleNamespace(get=asked.append)
    probe._learn_mapping_processes()
    assert sorted(asked) == [41, 42, 43]


def test_without_the_buffer_hooks_the_payload_is_left_out_not_zero():
    """gloo_buffer_hooks off: sent and posted payload are unknown, so the records carry
    no sent_bytes, recv_bytes, sends or wire_efficiency (a 0 would read as 'nothing
    sent); the traffic model is still written, its series the ring model's bytes."""
    state = ProcessState(INFO, model_window_s=60, payload_known=False)
    records = []
    for i in range(12):
        c = dataclasses.replace(allreduce(i * 40, i * 40 + 20), sent_bytes=0, recv_bytes=0,
                                sends=0, recvs=0)
        records += state.on_collective(c, to_wall)
    colls = [r for r in records if r.measurement == "gloo_collective"]
    steps = [r for r in records if r.measurement == "gloo_step"]
    assert colls and steps
    for r in colls + steps:
        assert not {"sent_bytes", "recv_bytes", "sends", "wire_efficiency"} & set(r.fields), r
        assert canonical_line(r)
    assert all(r.fields["bytes"] > 0 for r in colls)
    model = state.model_record(12 * 40 * 10**6, to_wall)
    assert model is not None and model.tags["series"] == "gloo_ring"
    with_payload = collective_record(allreduce(0, 20), INFO, to_wall)
    assert {"sent_bytes", "recv_bytes", "sends"} <= set(with_payload.fields)


def test_the_probe_attaches_the_buffer_hooks_only_when_configured():
    from types import SimpleNamespace

    from fabricscope.agent.probes.gloo import probe as gloo
    from fabricscope.agent.probes.base import Clock, ProbeContext
    names = {}
    for on in (True, False):
        cfg = SimpleNamespace(gloo_buffer_hooks=on, poll_interval_s=1.0)
        probe = gloo.GlooProbe(ProbeContext("n0", frozenset(), Clock(), cfg))
        names[on] = {h.entry_fn for h in probe._uprobes.hooks}
    assert {"buffer_send", "buffer_recv"} <= names[True]
    assert not {"buffer_send", "buffer_recv"} & names[False]
    assert names[False] == {h.entry_fn for h in gloo.COLLECTIVE_HOOKS + gloo.P2P_HOOKS}
    assert {"p2p_send_call", "p2p_recv_work", "p2p_wait_entry"} <= names[False]


def test_the_step_in_progress_is_a_gloo_progress_record_at_the_steps_start():
    state = ProcessState(INFO, model_window_s=60)
    state.on_collective(allreduce(0, 30, 8_396_800, 16_793_600, "Broadcast"), to_wall)
    assert state.progress(90 * MS, None, to_wall) == []        # no steps known yet
    t = 100.0
    for _ in range(3):
        state.on_collective(allreduce(t, t + 20), to_wall)
        state.on_collective(allreduce(t + 1, t + 21), to_wall)
        t += 50
    (r,) = state.progress(int((t - 50 + 40) * MS), None, to_wall)   # 19 ms computing
    valid(r)
    assert (r.measurement, r.time_ns, r.tags) == ("gloo_progress", to_wall(int((t - 50) * MS)),
                                                  {"job": "198.18.0.1:29500", "rank": "1"})
    assert r.fields["seconds"] == pytest.approx(0.040)
    assert r.fields["sync_seconds"] == pytest.approx(0.021)
    assert r.fields["compute_seconds"] == pytest.approx(0.019)
    assert r.fields["waiting"] is False and "throttled_seconds" not in r.fields


def _bins_of(windows_ms, ring_bytes: int, load_bytes: int) -> BinHistory:
    """Received 100 us bins: `ring_bytes` in every bin of each collective window (its
    first a third full), and a data load at `load_bytes` per bin between them."""
    h = BinHistory(100_000)
    index, nbytes = [], []
    for start, end in windows_ms:
        first, last = int(start * 10), int(end * 10)
        for b in range(first, last + 1):
            index.append(b)
            nbytes.append(ring_bytes // 3 if b == first else ring_bytes)
        for b in range(last + 50, last + 60):
            index.append(b)
            nbytes.append(load_bytes)
    h.add("eth0", np.array(index), np.array(nbytes), None)
    h.drained(0, max(index) + 1)
    return h


def test_without_the_buffer_hooks_the_model_has_t_from_the_ring_bytes_d_from_the_windows():
    """The default: no UnboundBuffer hooks, yet T, D and B (from the NIC's bins inside
    the windows, not the data load's faster ones outside) are all there."""
    state = ProcessState(INFO, model_window_s=60, payload_known=False)
    windows = [(100 + 50 * i, 120 + 50 * i) for i in range(30)]
    for start, end in windows:
        state.on_collective(dataclasses.replace(allreduce(start, end), sent_bytes=0), to_wall)
    nic = _bins_of(windows, ring_bytes=12_500, load_bytes=37_500)     # 1 and 3 Gbit/s
    model = state.model_record(windows[-1][1] * MS, to_wall, nic)
    valid(model)
    f = model.fields
    assert model.tags["series"] == "gloo_ring"
    assert f["period_s"] == pytest.approx(0.050, rel=0.01)
    assert f["duty_cycle"] == pytest.approx(0.020 / 0.05, abs=0.02)
    assert f["burst_bytes_per_s"] == pytest.approx(12_500 / 1e-4)     # 1 Gbit/s, not 3
    assert (f["burst_interface"], f["burst_windows"]) == ("eth0", 30)
    assert "burst_util" not in f                                      # no line rate
    assert f["mean_bytes_per_s"] > 0


def test_b_is_a_share_of_the_line_rate_where_the_link_has_one():
    state = ProcessState(INFO, model_window_s=60)
    windows = [(100 + 50 * i, 120 + 50 * i) for i in range(10)]
    for start, end in windows:
        state.on_collective(allreduce(start, end), to_wall)
    nic = _bins_of(windows, ring_bytes=12_500, load_bytes=0)
    nic.add("eth0", np.zeros(0, np.int64), np.zeros(0, np.int64), 10**10)
    model = state.model_record(windows[-1][1] * MS, to_wall, nic)
    assert model.fields["burst_util"] == pytest.approx(0.1)
    valid(model)


def test_without_a_nic_probe_the_model_has_no_b_rather_than_an_average():
    state = ProcessState(INFO, model_window_s=60)
    for i in range(10):
        state.on_collective(allreduce(100 + 50 * i, 120 + 50 * i), to_wall)
    model = state.model_record(700 * MS, to_wall)
    assert not {"burst_bytes_per_s", "burst_interface", "burst_util"} & set(model.fields)
    assert model.fields["period_s"] == pytest.approx(0.050, rel=0.01)


def test_collectives_of_unknown_size_still_give_t_and_d_from_their_windows():
    state = ProcessState(INFO, model_window_s=60, payload_known=False)
    for i in range(20):
        c = dataclasses.replace(allreduce(100 + 50 * i, 120 + 50 * i), bytes=None,
                                bytes_source="unknown", sent_bytes=0)
        state.on_collective(c, to_wall)
    model = state.model_record(1100 * MS, to_wall)
    valid(model)
    assert model.tags["series"] == "gloo_windows"
    assert model.fields["period_s"] == pytest.approx(0.050, rel=0.01)
    assert model.fields["duty_cycle"] == pytest.approx(0.4, abs=0.02)
    assert "mean_bytes_per_s" not in model.fields


def p2p(op: str, start_ms: float, end_ms: float, peer: int, nbytes: int = 65_536) -> Collective:
    return Collective(pid=7, tid=8, op=op, model=op, start_ns=int(start_ms * MS),
                      end_ns=int(end_ms * MS), nranks=3, rank=None, bytes=nbytes,
                      bytes_source="buffer", sent_bytes=0, recv_bytes=0, sends=0, recvs=0,
                      peer=peer)


def test_a_pipelines_sends_and_recvs_are_records_with_their_peer_and_no_steps():
    """A pipeline stage's transfers are gloo_collective records (a Recv claims no ring
    bytes: a receiver sends nothing) and its traffic model's windows; they open no
    DDP step and no parameter-broadcast phase."""
    state = ProcessState(INFO, model_window_s=60, payload_known=False)
    out = []
    for k in range(6):
        out += state.on_collective(p2p("Recv", 10 * k, 10 * k + 4, peer=0), to_wall)
        out += state.on_collective(p2p("Send", 10 * k + 6, 10 * k + 7, peer=2), to_wall)
    assert {r.measurement for r in out} == {"gloo_collective"}
    for r in out:
        valid(r)
    recv, send = out[0], out[1]
    assert (recv.tags["op"], recv.fields["peer"], recv.fields["bytes"]) == ("Recv", 0, 65_536)
    assert "ring_bytes" not in recv.fields and recv.fields["bytes_source"] == "buffer"
    assert send.fields["peer"] == 2 and send.fields["ring_bytes"] == 65_536
    assert not state.tracker.init_done and state.tracker.init is None
    assert len(state.windows) == 12


class _PidMap(dict):
    """A BPF hash keyed by ctypes integers, as BCC's table takes them: kept by value."""

    def __setitem__(self, key, value):
        super().__setitem__(key.value, value)

    def __delitem__(self, key):
        super().__delitem__(key.value)


def test_a_late_event_of_a_reaped_foreign_process_does_not_deny_its_pid_again(tmp_path: Path):
    """A foreign process is denied in the kernel while it lives and undenied when it is
    reaped; its events still in the ring then must not deny its pid again, or the entry
    outlives it and silences the local rank that takes the pid next."""
    import ctypes

    from fabricscope.agent.probes.gloo import layout
    from fabricscope.agent.probes.gloo.probe import GlooProbe
    base = tmp_path / "11"
    (base / "ns").mkdir(parents=True)
    (tmp_path / "own").touch()
    (tmp_path / "other").touch()
    os.symlink(tmp_path / "other", base / "ns" / "net")
    probe = GlooProbe.__new__(GlooProbe)        # no BPF: only the event's attribution
    probe._procs = ProcessTable(tmp_path, own_netns=os.stat(tmp_path / "own").st_ino)
    probe._denied, probe._states, probe._counters = set(), {}, {"foreign_processes": 0}
    deny = _PidMap()
    probe._bpf = {b"deny": deny}
    probe._forget_cpu = lambda: None
    event = layout.GlooEvent(pid=11)

    def deliver():
        probe._on_event(None, ctypes.addressof(event), ctypes.sizeof(event))

    deliver()
    assert list(deny) == [11] and probe._counters["foreign_processes"] == 1
    (base / "ns" / "net").unlink()              # it exits; the rescan reaps it
    probe._reap()
    assert not deny
    deliver()                                   # a late event, drained after the reap
    assert not deny and probe._counters["foreign_processes"] == 1
