"""fabricscope.services: the real influxd / victoria-metrics helpers leave nothing behind."""

from __future__ import annotations

import os
import socket

import pytest

from fabricscope.services import InfluxServer
from tests.support.servers import VictoriaMetricsServer


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill 0; its state letter says it is gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def occupied():
    """A listening socket on a free port (what another test could be holding)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("cls", [InfluxServer, VictoriaMetricsServer])
def test_stop_removes_process_and_directory_also_on_exceptions(cls):
    with pytest.raises(RuntimeError, match="boom"):
        with cls() as server:
            pid, directory = server.pid, server.dir
            assert alive(pid) and directory.is_dir()
            raise RuntimeError("boom")
    assert not alive(pid) and not directory.exists()
    server.stop()                       # twice is fine


def test_influx_query_and_restart_on_the_same_port_and_data():
    with InfluxServer() as influx:
        influx.query('CREATE DATABASE "d"')
        port = influx.port
        influx.stop_process()
        assert influx.pid is None
        influx.start_process()
        assert influx.port == port
        assert {"name": "d", "_series": "databases", "_tags": {}} in \
            influx.query("SHOW DATABASES")
        with pytest.raises(RuntimeError, match="error parsing query"):
            influx.query("SELEC nonsense", "d")


@pytest.mark.parametrize("cls", [InfluxServer, VictoriaMetricsServer])
def test_a_taken_free_port_is_replaced(cls, occupied):
    server = cls()
    server.port = occupied              # as if another process took it after free_port()
    with server:
        assert server.port != occupied and alive(server.pid)


def test_a_taken_explicit_port_fails_with_the_log_tail_and_leaves_nothing(occupied):
    server = InfluxServer(port=occupied)
    with pytest.raises(RuntimeError, match="address already in use") as err:
        server.start()
    assert f"influxd on port {occupied} exited with" in str(err.value)
    assert server.dir is None and server.pid is None
