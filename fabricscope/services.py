"""A real InfluxDB for the demo, the lab and benches (and tests), on loopback.

`InfluxServer` runs the distribution's `/usr/bin/influxd` (1.x) with all state in a
fresh temporary directory and HTTP on 127.0.0.1:<free port>; `LocalServer` is what
any such server shares (the test suite's Prometheus, Alertmanager and VictoriaMetrics
in tests/support/servers.py build on it). Each is a context manager; leaving the block (also through an exception or KeyboardInterrupt)
terminates the process by pid, kills it when it does not exit in time, and
removes the directory. `stop_process()` / `start_process()` stop and restart the
server on the same port and data, so tests can simulate an outage.

    with InfluxServer() as influx:
        ...write to influx.url...
        rows = influx.query("SELECT count(*) FROM tcp_retransmit", db="fabricscope")
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from fabricscope.errors import UserError

INFLUXD = "/usr/bin/influxd"

_INFLUX_CONFIG = """\
reporting-disabled = true
bind-address = "127.0.0.1:{rpc_port}"

[meta]
  dir = "{dir}/meta"
  logging-enabled = false

[data]
  dir = "{dir}/data"
  wal-dir = "{dir}/wal"
  wal-fsync-delay = "0s"
  query-log-enabled = false
  index-version = "inmem"

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[continuous_queries]
  enabled = false
  log-enabled = false

[retention]
  enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{http_port}"
  log-enabled = false
  suppress-write-log = true
  pprof-enabled = false
  flux-enabled = false

[logging]
  level = "warn"
  suppress-logo = true
"""


def terminate(proc: subprocess.Popen, timeout_s: float = 10.0) -> int | None:
    """Stop a process we started, by pid: SIGTERM, then SIGKILL after timeout_s.
    Returns its exit code (None if it would not even die of SIGKILL in 5 s)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
    return proc.returncode


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0; one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: free_port() draws above the well-known and registered services' usual ports
_LOWEST_PORT = 10000


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port(rng: random.Random = random.SystemRandom()) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, chosen outside the kernel's
    ephemeral range: a port the kernel hands out (bind to 0) can be given, once it is
    released, to any outgoing connection on this machine as its local port before the
    server meant for it binds it; ports outside the range only go to who asks for them
    by number."""
    lo, hi = _ephemeral_range()
    pool = [r for r in (range(_LOWEST_PORT, lo), range(hi + 1, 65536)) if len(r)]
    for _ in range(200 if pool else 0):
        span = rng.choices(pool, weights=[len(r) for r in pool])[0]
        port = rng.choice(span)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:          # every draw taken: let the kernel pick one
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET url; (status, body). Connection failures raise OSError."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class LocalServer:
    """One server process with a temp dir; subclasses say how to start and probe it."""

    name = "server"
    binary = ""
    start_timeout_s = 30.0

    def __init__(self, port: int | None = None):
        self._pick_ports = port is None      # ours to change if another process takes them
        self.port = port or free_port()
        self.dir: Path | None = None          # created by start(), removed by stop()
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # -- subclass hooks
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _is_up(self) -> bool:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Write config files into self.dir before the first start."""

    @property
    def _log(self) -> Path:
        return self.dir / "server.log"

    # -- lifecycle
    def start(self) -> "LocalServer":
        """Create the directory and start; on any failure leave nothing behind."""
        if not os.access(self.binary, os.X_OK):
            raise UserError(f"{self.binary} is missing", "run `make setup` (installs OS packages)")
        try:
            self.dir = Path(tempfile.mkdtemp(prefix=f"fabricscope-{self.name}-"))
            for attempt in range(3):
                self._prepare()
                try:
                    self.start_process()
                    return self
                except RuntimeError as exc:
                    # free_port() can race with other tests on this machine: pick again.
                    if not self._pick_ports or "address already in use" not in str(exc) \
                            or attempt == 2:
                        raise
                    self._new_ports()
        except BaseException:
            self.stop()
            raise
        return self

    def _new_ports(self) -> None:
        self.port = free_port()

    def start_process(self) -> None:
        """Start (or restart) the process on the same port and data directory."""
        if self._proc is not None and self._proc.poll() is None:
            return
        with open(self._log, "ab") as log:
            # Own session: a Ctrl-C in the terminal reaches the test, which stops us by pid.
            self._proc = subprocess.Popen(self._argv(), stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            if self._await_up():
                return
        except BaseException:       # KeyboardInterrupt while waiting: no orphan server
            self.stop_process()
            raise
        code = self._proc.poll()
        tail = self.log_tail()
        self.stop_process()
        state = f"exited with {code}" if code is not None else "did not answer in time"
        raise RuntimeError(f"{self.name} on port {self.port} {state}; log tail:\n{tail}")

    def _await_up(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                if self._is_up():
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def stop_process(self, timeout_s: float = 10.0) -> None:
        """Terminate the process by pid (kill after timeout_s); keep the data directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc, timeout_s)

    def stop(self) -> None:
        """Stop the process and remove its directory. Safe to call twice."""
        try:
            self.stop_process()
        finally:
            if self.dir is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None

    def log_tail(self, lines: int = 20) -> str:
        if self.dir is None:
            return "(no log)"
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class InfluxServer(LocalServer):
    """InfluxDB 1.x (`influxd`) with only the HTTP API; no stats, no reporting."""

    name = "influxd"
    binary = INFLUXD

    def __init__(self, port: int | None = None):
        super().__init__(port)
        self.rpc_port = free_port()

    def _new_ports(self) -> None:
        super()._new_ports()
        self.rpc_port = free_port()

    def _prepare(self) -> None:
        (self.dir / "influxd.conf").write_text(_INFLUX_CONFIG.format(
            dir=self.dir, rpc_port=self.rpc_port, http_port=self.port))

    def _argv(self) -> list[str]:
        return [self.binary, "-config", str(self.dir / "influxd.conf")]

    def _is_up(self) -> bool:
        return http_get(self.url + "/ping", timeout=1.0)[0] == 204

    def query(self, influxql: str, db: str = "") -> list[dict]:
        """Run InfluxQL; rows as dicts {column: value, "_series": name, "_tags": {...}}.

        Raises RuntimeError with InfluxDB's message on a query error."""
        params = {"q": influxql, "epoch": "ns"}
        if db:
            params["db"] = db
        status, body = http_get(f"{self.url}/query?{urllib.parse.urlencode(params)}")
        data = json.loads(body or b"{}")
        if status != 200 or "error" in data:
            raise RuntimeError(f"query {influxql!r} failed: {status} {data.get('error', body)}")
        rows: list[dict] = []
        for result in data.get("results", []):
            if "error" in result:
                raise RuntimeError(f"query {influxql!r} failed: {result['error']}")
            for series in result.get("series", []):
                for values in series.get("values", []):
                    row = dict(zip(series["columns"], values))
                    row["_series"] = series.get("name")
                    row["_tags"] = series.get("tags", {})
                    rows.append(row)
        return rows

    def field_types(self, measurement: str, db: str) -> dict[str, str]:
        """{field: integer|float|string|boolean} as InfluxDB stored them."""
        rows = self.query(f'SHOW FIELD KEYS FROM "{measurement}"', db)
        return {r["fieldKey"]: r["fieldType"] for r in rows}
