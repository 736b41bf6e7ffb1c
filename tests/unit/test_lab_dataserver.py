"""fabricscope.lab.dataserver (the lab's storage stand-in) as a real subprocess on 127.0.0.1, its
client, one real single-rank train_worker against it, and start_training's checks
of the data-server arguments (no root)."""

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricscope.errors import UserError
from fabricscope.services import free_port
from fabricscope.lab.dataserver import MAX_LENGTH, OP_GET, DataClient, parse_addr, request
from fabricscope.lab.training import read_io_log, start_training

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """One stdout line of proc, or AssertionError with its stderr at the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout_s):
            raise AssertionError(f"no line from the data server within {timeout_s} s")
        return proc.stdout.readline()
    finally:
        sel.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


@pytest.fixture
def server():
    """(Popen, 'ADDR:PORT') of a fresh data server; always stopped by pid."""
    proc = subprocess.Popen([sys.executable, "-m", "fabricscope.lab.dataserver", "--listen", "127.0.0.1:0"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        line = _read_line(proc, 60)
        assert line, f"data server exited: {proc.stderr.read()}"
        yield proc, json.loads(line)["listening"]
    finally:
        _stop(proc)


def _stopped_stats(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])["stopped"]


def test_get_put_many_requests_on_one_connection(server):
    proc, addr = server
    host, port = parse_addr(addr)
    assert host == "127.0.0.1" and port > 0
    with DataClient(addr) as client:
        assert client.get(MiB) == MiB
        assert client.put(os.urandom(3 * MiB)) == 3 * MiB
        for n in (0, 1, 4097, 65536):
            assert client.get(n) == n
            assert client.put(b"x" * n) == n
    stats = _stopped_stats(proc)
    assert stats == {"connections": 1, "gets": 5, "puts": 5, "bytes_sent": MiB + 69634,
                     "bytes_received": 3 * MiB + 69634, "bad_requests": 0, "aborted": 0}


def test_get_returns_exactly_the_bytes_asked_for(server):
    _, addr = server
    with socket.create_connection(parse_addr(addr), timeout=30) as sock:
        sock.sendall(request(OP_GET, 1000))
        assert _recv(sock, 1000) == bytes(1000)
        sock.sendall(request(OP_GET, 5))
        sock.sendall(b"FSDS")                     # half a request: the server must wait
        assert _recv(sock, 5) == bytes(5)         # nothing more than asked was sent...
        sock.sendall(b"G\0\0\0" + (3).to_bytes(8, "big"))
        assert _recv(sock, 3) == bytes(3)         # ...and a header split in two still works


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "server closed early"
        data += chunk
    return data


@pytest.mark.parametrize("header", [
    b"XXXXG\0\0\0" + (1).to_bytes(8, "big"),                    # bad magic
    b"FSDSQ\0\0\0" + (1).to_bytes(8, "big"),                    # bad op
    b"FSDSG\0\1\0" + (1).to_bytes(8, "big"),                    # non-zero padding
    b"FSDSG\0\0\0" + (MAX_LENGTH + 1).to_bytes(8, "big"),       # over 1 GiB
])
def test_bad_request_closes_only_that_connection(server, header):
    proc, addr = server
    with DataClient(addr) as good:
        assert good.get(10) == 10
        with socket.create_connection(parse_addr(addr), timeout=30) as bad:
            bad.sendall(header)
            assert bad.recv(16) == b""                           # closed by the server
        assert good.get(20) == 20                                # the other one still served
    with DataClient(addr) as later:
        assert later.put(b"abc") == 3
    stats = _stopped_stats(proc)
    assert (stats["bad_requests"], stats["connections"], stats["gets"], stats["puts"]) == \
        (1, 3, 2, 1)


def test_sigterm_exits_zero_with_a_connection_open(server):
    proc, addr = server
    client = DataClient(addr)
    try:
        assert client.get(1) == 1
        assert _stopped_stats(proc)["connections"] == 1
    finally:
        client.close()


def test_bad_listen_address_is_one_line():
    out = subprocess.run([sys.executable, "-m", "fabricscope.lab.dataserver", "--listen", "nonsense"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.startswith("fabricscope: error: address 'nonsense' is not ADDR:PORT")
    assert "Traceback" not in out.stderr


def test_client_rejects_bad_sizes_and_addresses(server):
    _, addr = server
    for bad in ("host", "host:0", ":80", "h:99999", "h:x"):
        with pytest.raises(UserError):
            DataClient(bad)
    with DataClient(addr) as client:
        for n in (-1, MAX_LENGTH + 1, True):
            with pytest.raises(UserError):
                client.get(n)


@pytest.mark.parametrize("kwargs,cause", [
    ({"data_bytes": 5}, "need a data server"),
    ({"checkpoint_every": 2}, "need a data server"),
    ({"data_server": "127.0.0.1:9", "data_bytes": -1}, "data size -1"),
    ({"data_server": "127.0.0.1:9", "data_bytes": 1.5}, "data size 1.5"),
    ({"data_server": "127.0.0.1:9", "data_bytes": MAX_LENGTH + 1}, "over the data server"),
    ({"data_server": "127.0.0.1:9", "checkpoint_every": -3}, "checkpoint interval -3"),
    ({"data_server": "127.0.0.1:0"}, "is not ADDR:PORT"),
    ({"data_server": "nohostport"}, "is not ADDR:PORT"),
    ({"data_server": 9000}, "is not ADDR:PORT"),
])
def test_start_training_checks_data_server_arguments_first(kwargs, cause):
    # checked before root and before the lab is loaded: no lab named "nolab" exists
    with pytest.raises(UserError, match=cause):
        start_training("nolab", 3, **kwargs)


def test_read_io_log_skips_a_line_still_being_written(tmp_path):
    path = tmp_path / "rank0.jsonl"
    assert read_io_log(str(path)) == []
    path.write_text('{"kind": "data_load", "step": 0}\n{"kind": "checkp')
    assert read_io_log(str(path)) == [{"kind": "data_load", "step": 0}]


def test_single_rank_worker_logs_data_loads_and_checkpoints(server, tmp_path):
    """A real train_worker (world size 1, gloo on loopback) against the real server."""
    proc, addr = server
    io_log = tmp_path / "rank0.jsonl"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
           "FABRICSCOPE_MARKERS_DIR": str(tmp_path / "markers"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    env.pop("FABRICSCOPE_LAB_PARENT", None)
    before = time.time_ns()
    run = subprocess.run([sys.executable, "-m", "fabricscope.lab.train_worker", "--steps", "5",
                          "--model-mb", "0.25", "--batch", "4", "--data-server", addr,
                          "--data-bytes", str(MiB), "--checkpoint-every", "2",
                          "--io-log", str(io_log)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    events = read_io_log(str(io_log))
    assert [(e["kind"], e["step"]) for e in events] == [
        ("data_load", 0), ("data_load", 1), ("checkpoint", 1), ("data_load", 2),
        ("data_load", 3), ("checkpoint", 3), ("data_load", 4)]
    assert all(e["rank"] == 0 and before <= e["start_ns"] <= e["end_ns"] for e in events)
    assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(events, events[1:]))
    loads = [e["bytes"] for e in events if e["kind"] == "data_load"]
    ckpts = [e["bytes"] for e in events if e["kind"] == "checkpoint"]
    assert loads == [MiB] * 5
    # a state_dict of ~0.25 MiB of float32 parameters, serialized by torch.save
    assert len(set(ckpts)) == 1 and 0.25 * MiB < ckpts[0] < 0.3 * MiB
    stats = _stopped_stats(proc)
    # one connection reads the dataset, another writes checkpoints
    assert (stats["connections"], stats["gets"], stats["puts"]) == (2, 5, 2)
    assert (stats["bytes_sent"], stats["bytes_received"]) == (5 * MiB, sum(ckpts))
