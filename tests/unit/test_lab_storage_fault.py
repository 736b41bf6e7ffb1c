"""Slow storage without root: parsing, the pacing arithmetic, the state-file watcher,
and a real data server (--lab, on 127.0.0.1) picking up a fault while it runs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricscope.errors import UserError
from fabricscope.lab.dataserver import DataClient
from fabricscope.lab.model import plan
from fabricscope.lab.storage_fault import (MIN_CHUNK, Pacer, StorageFault, Watcher, chunk_bytes, pace_wait)

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def test_parse_and_record():
    fault = StorageFault.parse("20mbit", "50ms")
    assert fault == StorageFault(rate_bps=20_000_000, delay_s=0.05) and fault
    assert fault.to_dict() == {"rate_bps": 20_000_000, "delay_s": 0.05}
    assert StorageFault.from_dict(fault.to_dict()) == fault
    assert fault.describe() == "rate 20mbit, delay 50ms"
    assert StorageFault.parse(delay="5ms") == StorageFault(delay_s=0.005)
    none = StorageFault.parse()
    assert not none and none.to_dict() == {} and none.describe() == "none"
    assert StorageFault.from_dict({}) == StorageFault.from_dict(None) == none


@pytest.mark.parametrize("rate,delay", [("fast", None), ("0mbit", None), (None, "soon"),
                                        (None, "-5ms"), (None, 0)])
def test_bad_storage_faults_are_user_errors(rate, delay):
    with pytest.raises(UserError):
        StorageFault.parse(rate, delay)


def test_chunks_are_2_ms_at_the_rate_within_bounds():
    assert chunk_bytes(1_000_000_000, MiB) == 250_000      # 125 MB/s x 2 ms
    assert chunk_bytes(20_000_000, MiB) == MIN_CHUNK       # never under one block ...
    assert MIN_CHUNK > 65536                               # ... a transfer the agent reports
    assert chunk_bytes(10**12, MiB) == MiB                 # never over the I/O chunk


def test_pace_wait_holds_bytes_to_the_rate():
    assert pace_wait(2_500_000, 20_000_000, 0.0) == pytest.approx(1.0)
    assert pace_wait(2_500_000, 20_000_000, 0.4) == pytest.approx(0.6)
    assert pace_wait(2_500_000, 20_000_000, 1.5) == 0.0


def test_a_pacer_pays_before_it_sends():
    now = [10.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s
    pacer = Pacer(8_000, clock=lambda: now[0], sleep=sleep)   # 1000 bytes/s
    pacer.wait(500)
    assert now[0] == pytest.approx(10.5)
    now[0] += 2.0                                            # late: no more waiting
    pacer.wait(1000)
    assert len(slept) == 1
    pacer.wait(3000)
    assert now[0] == pytest.approx(13.0)
    with pytest.raises(ValueError):
        Pacer(0)


class CountingWatcher(Watcher):
    reads = 0

    def _read(self):
        self.reads += 1
        return super()._read()


def test_the_watcher_rereads_the_state_file_only_when_it_changes(tmp_path):
    path = tmp_path / "demo.json"
    seen = []
    watch = CountingWatcher(str(path), seen.append)
    assert watch.current() == StorageFault() and seen == []      # no file: no fault
    lab = plan("demo", 2, "198.18.4.0/24")
    lab.storage_fault = {"rate_bps": 8_000_000, "delay_s": 0.0}
    _replace(path, lab.to_dict())
    assert watch.current() == StorageFault(rate_bps=8_000_000)
    assert watch.current() == StorageFault(rate_bps=8_000_000)
    assert watch.reads == 1                                      # unchanged: one stat only
    _replace(path, {**lab.to_dict(), "storage_fault": {}})
    assert watch.current() == StorageFault() and watch.reads == 2
    path.write_text("{half a fil")
    assert watch.current() == StorageFault()                     # unreadable: no fault
    path.unlink()
    assert watch.current() == StorageFault()
    assert seen == [StorageFault(rate_bps=8_000_000), StorageFault()]


def _replace(path: Path, data: dict) -> None:
    """Write as Lab.save does: a new file renamed over the old one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@pytest.fixture
def lab_server(tmp_path, monkeypatch):
    """Lab 'demo' (state in tmp_path) and its data server on 127.0.0.1: (lab, addr, log)."""
    monkeypatch.setenv("FABRICSCOPE_LAB_DIR", str(tmp_path))
    lab = plan("demo", 2, "198.18.4.0/24")
    lab.save()
    log = tmp_path / "server.out"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "fabricscope.lab.dataserver", "--lab", "demo",
                                 "--listen", "127.0.0.1:0"], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not log.read_text().endswith("\n"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield lab, json.loads(log.read_text().splitlines()[0])["listening"], log
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_running_server_applies_a_fault_set_in_the_lab_state(lab_server):
    lab, addr, log = lab_server
    rate, n = 16_000_000, MiB                      # 2 MB/s: 1 MiB takes >= 0.52 s
    with DataClient(addr) as client:
        assert client.get(n) == n                  # no fault yet
        lab.storage_fault = StorageFault(rate_bps=rate).to_dict()
        lab.save()
        start = time.monotonic()
        assert client.get(n) == n
        assert time.monotonic() - start >= n * 8 / rate
        start = time.monotonic()
        assert client.put(bytes(n)) == n
        assert time.monotonic() - start >= n * 8 / rate
        lab.storage_fault = StorageFault(delay_s=0.2).to_dict()
        lab.save()
        start = time.monotonic()
        assert client.get(10) == 10 and client.put(b"x") == 1
        assert time.monotonic() - start >= 2 * 0.2
        lab.storage_fault = {}
        lab.save()
        assert client.get(n) == n
    announced = [json.loads(ln)["storage_fault"] for ln in log.read_text().splitlines()
                 if ln.startswith('{"storage_fault"')]
    assert announced == [{"rate_bps": rate, "delay_s": 0.0}, {"rate_bps": None, "delay_s": 0.2},
                         {}]
