"""A stand-in for remote storage: dataset shards to read, a checkpoint store to write.

    python -m fabricscope.lab.dataserver --listen ADDR:PORT [--metrics-listen ADDR:PORT] [--lab NAME]

Real training reads its data from, and writes its checkpoints to, a storage
service (NFS, object store, a data-loader fleet). None exists in the lab, so
this server plays it over plain TCP, which is what the agent sees of the real
thing anyway: bulk bytes into a rank (data loading) or out of it (checkpoints),
on a connection to a peer that is not a rank. The payloads are zeros; only the
byte counts and the timing matter.

Protocol (big endian), many requests per persistent connection:

    request, 16 bytes:  0 char[4] magic "FSDS"  4 char op  5 u8[3] zero  8 u64 length L
      op "G" (get): the server replies exactly L payload bytes.
      op "P" (put): the client then sends L bytes; the server reads all of them
                    and replies u64 = the number of bytes it received.

A bad magic, op or padding, or L > 1 GiB: the server closes that connection and
counts it (bad_requests). On start it prints one JSON line {"listening":
"ADDR:PORT"} (PORT 0 picks a free port); on SIGTERM/SIGINT it prints
{"stopped": {counters}} and exits 0. With --metrics-listen the same counters are
served as Prometheus metrics (fabricscope_lab_dataserver_*). Under a launcher
that sets FABRICSCOPE_LAB_PARENT it leaves when the launcher dies.

With --lab NAME it is that lab's storage and can be slowed while it runs: the
lab's storage fault (fabricscope.lab.faults.storage: a rate and/or a per-request delay, see
lab/storage_fault.py) applies to every request that starts after it was set; the
server prints {"storage_fault": {...}} when it sees the fault change.

Python side: DataClient (one persistent connection) and running_dataserver(lab)
(the server inside a lab node's namespace, always stopped by pid on exit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

from fabricscope.errors import UserError
from fabricscope.lab.storage_fault import Pacer, StorageFault, pacer_for

MAGIC = b"FSDS"
OP_GET, OP_PUT = b"G", b"P"
MAX_LENGTH = 1 << 30
HEADER = struct.Struct(">4sc3sQ")            # magic, op, padding, length
ACK = struct.Struct(">Q")
CHUNK = 1 << 20
_ZEROS = bytes(CHUNK)                        # shared, read-only: every GET sends slices of it
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_addr(text: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """'ADDR:PORT' -> (ADDR, PORT); UserError naming the bad part."""
    host, sep, port = str(text).rpartition(":")
    low = 0 if allow_port_zero else 1
    if not sep or not host or not port.isdigit() or not low <= int(port) <= 65535:
        raise UserError(f"address {text!r} is not ADDR:PORT",
                        f"give e.g. 198.18.0.1:9000 (port {low}-65535)")
    return host, int(port)


def request(op: bytes, length: int) -> bytes:
    return HEADER.pack(MAGIC, op, b"\0\0\0", length)


# -- server ---------------------------------------------------------------------------------

@dataclass
class Stats:
    """What the server did; bad_requests and aborted are connections it lost or closed."""

    connections: int = 0
    gets: int = 0
    puts: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    bad_requests: int = 0       # closed: bad magic/op/padding or length > 1 GiB
    aborted: int = 0            # the peer went away in the middle of a request


class _Handler(socketserver.BaseRequestHandler):
    server: "DataServer"

    def handle(self) -> None:
        self.server.add(connections=1)
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        scratch = bytearray(CHUNK)
        try:
            while True:
                header = _recv_exact(sock, HEADER.size, at_boundary=True)
                if header is None:
                    return                                  # clean close between requests
                magic, op, pad, length = HEADER.unpack(header)
                if magic != MAGIC or op not in (OP_GET, OP_PUT) or pad != b"\0\0\0" \
                        or length > MAX_LENGTH:
                    self.server.add(bad_requests=1)
                    return                                  # socketserver closes it
                # Counted before the reply goes out: a client that has its reply
                # finds the request in any later snapshot (handler threads are not
                # joined at exit). A reply that then fails counts as aborted too.
                fault = self.server.fault()
                if op == OP_GET:
                    self.server.add(gets=1, bytes_sent=length)
                    _pause(fault.delay_s)
                    _send_zeros(sock, length, pacer_for(fault))
                else:
                    got = _drain(sock, length, scratch, pacer_for(fault))
                    self.server.add(puts=1, bytes_received=got)
                    _pause(fault.delay_s)
                    sock.sendall(ACK.pack(got))
        except (ConnectionError, OSError):
            self.server.add(aborted=1)


class DataServer(socketserver.ThreadingTCPServer):
    daemon_threads = True               # open connections never block exit
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], fault=StorageFault):
        """fault: called at the start of every request for the StorageFault to apply
        (default: none)."""
        super().__init__(address, _Handler)
        self.stats = Stats()
        self.fault = fault
        self._lock = threading.Lock()

    def add(self, **deltas: int) -> None:
        with self._lock:
            for key, value in deltas.items():
                setattr(self.stats, key, getattr(self.stats, key) + value)

    def snapshot(self) -> dict:
        with self._lock:
            return asdict(self.stats)


def _recv_exact(sock: socket.socket, n: int, at_boundary: bool = False) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if at_boundary and got == 0:
                return None
            raise ConnectionError(f"peer closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _pause(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def _send_zeros(sock: socket.socket, length: int, pacer: Pacer | None = None) -> None:
    """Send `length` zero bytes; with a pacer, each chunk only once the rate allows it."""
    zeros = memoryview(_ZEROS)
    step = pacer.chunk(CHUNK) if pacer else CHUNK
    sent = 0
    while sent < length:
        n = min(length - sent, step)
        if pacer:
            pacer.wait(sent + n)
        sock.sendall(zeros[:n])
        sent += n


def _drain(sock: socket.socket, length: int, scratch: bytearray,
           pacer: Pacer | None = None) -> int:
    """Read exactly `length` bytes into nowhere; ConnectionError if the peer stops early.
    With a pacer, reads no faster than its rate (the peer's sends back up behind it)."""
    view, got = memoryview(scratch), 0
    step = pacer.chunk(len(scratch)) if pacer else len(scratch)
    while got < length:
        k = sock.recv_into(view, min(step, length - got))
        if k == 0:
            raise ConnectionError(f"peer closed after {got} of {length} bytes")
        got += k
        if pacer:
            pacer.wait(got)
    return got


def _serve_metrics(server: DataServer, listen: str) -> None:
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily

    class _Collector:
        def collect(self):
            for key, value in server.snapshot().items():
                yield CounterMetricFamily(f"fabricscope_lab_dataserver_{key}",
                                          f"lab data server: {key.replace('_', ' ')}",
                                          value=value)

    registry = CollectorRegistry()
    registry.register(_Collector())
    host, port = parse_addr(listen, allow_port_zero=True)
    start_http_server(port, addr=host, registry=registry)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fabricscope.lab.dataserver",
                                     description="Lab stand-in for dataset/checkpoint storage.")
    parser.add_argument("--listen", required=True, help="ADDR:PORT (port 0: pick a free one)")
    parser.add_argument("--metrics-listen", help="ADDR:PORT for Prometheus /metrics")
    parser.add_argument("--lab", metavar="NAME",
                        help="the lab whose storage this is: apply its storage fault")
    args = parser.parse_args(argv)
    from fabricscope.lab.train_worker import exit_with_parent
    try:
        host, port = parse_addr(args.listen, allow_port_zero=True)
        fault = _lab_fault(args.lab) if args.lab else StorageFault
        try:
            server = DataServer((host, port), fault)
        except OSError as exc:
            raise UserError(f"cannot listen on {args.listen}: {exc.strerror}",
                            "give a local address and a free port (or port 0)") from None
        if args.metrics_listen:
            _serve_metrics(server, args.metrics_listen)
    except UserError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code
    exit_with_parent()

    def stop(signum, frame):
        # shutdown() waits for serve_forever() to return: it must run in another thread
        threading.Thread(target=server.shutdown, name="dataserver-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bound = server.server_address
    print(json.dumps({"listening": f"{bound[0]}:{bound[1]}"}), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    print(json.dumps({"stopped": server.snapshot()}), flush=True)
    return 0


def _lab_fault(lab: str):
    """The lab's storage fault as the server reads it: a Watcher on its state file."""
    from fabricscope.lab import naming
    from fabricscope.lab.storage_fault import Watcher

    def announce(fault: StorageFault) -> None:
        print(json.dumps({"storage_fault": fault.to_dict()}), flush=True)

    return Watcher(naming.state_file(naming.check_name(lab)), announce).current


# -- client ---------------------------------------------------------------------------------

class DataClient:
    """One persistent connection to a data server; requests run one at a time."""

    def __init__(self, addr: str, timeout_s: float | None = 120.0):
        host, port = parse_addr(addr)
        self.addr = addr
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._scratch = bytearray(CHUNK)

    def get(self, n: int) -> int:
        """Fetch n payload bytes (discarded); returns how many arrived (always n)."""
        _check_length(n)
        self.sock.sendall(request(OP_GET, n))
        return _drain(self.sock, n, self._scratch)

    def put(self, payload: bytes) -> int:
        """Store payload; returns the byte count the server acknowledged."""
        _check_length(len(payload))
        self.sock.sendall(request(OP_PUT, len(payload)))
        self.sock.sendall(payload)
        ack = _recv_exact(self.sock, ACK.size)
        return ACK.unpack(ack)[0]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "DataClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_length(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_LENGTH:
        raise UserError(f"payload size {n!r} is not valid", f"give 0 to {MAX_LENGTH} bytes")


# -- in a lab -------------------------------------------------------------------------------

@contextlib.contextmanager
def running_dataserver(lab, node_index: int | None = 0, timeout_s: float = 60.0,
                       grace_s: float = 3.0):
    """Run the server in a lab node's namespace on the node's address; yields 'ADDR:PORT'.

    node_index None: in the root namespace on the lab's gateway (bridge) address, a
    peer that is no rank's node, so every rank's transfers cross its NIC (a server on
    node 0 serves rank 0 over that namespace's loopback). It applies the lab's
    storage fault (fabricscope.lab.faults.storage), also one set while it runs. Always stopped
    by pid on exit (SIGTERM, SIGKILL after grace_s), also on errors."""
    from fabricscope.lab.stack import await_condition
    from fabricscope.services import terminate
    from fabricscope.lab import exec_argv
    from fabricscope.lab.topology import load
    lab = load(lab) if isinstance(lab, str) else lab
    node = lab.node(node_index) if node_index is not None else None
    where = f"node {node_index}" if node else "the lab's gateway"
    log_dir = node.dir if node else lab.dir
    os.makedirs(log_dir, exist_ok=True)
    fd, log_path = tempfile.mkstemp(prefix="dataserver-", suffix=".log", dir=log_dir)
    env = {**os.environ, "FABRICSCOPE_LAB_PARENT": str(os.getpid()), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([REPO_ROOT] + [
               p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    argv = [sys.executable, "-m", "fabricscope.lab.dataserver", "--lab", lab.name,
            "--listen", f"{node.address if node else lab.gateway}:0"]
    argv = exec_argv(node, argv) if node else argv
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                env=env, cwd=REPO_ROOT, start_new_session=True)
    try:
        def listening():
            addr = _listening_line(log_path)
            if addr is None and proc.poll() is not None:
                raise RuntimeError(f"data server on {where} exited with status "
                                   f"{proc.returncode}: {_tail(log_path)} (log: {log_path})")
            return addr
        try:
            addr = await_condition(listening, timeout_s, f"the data server on {where}")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; log tail: {_tail(log_path)}") from None
        yield addr
    finally:
        terminate(proc, grace_s)


def _listening_line(path: str) -> str | None:
    with open(path, errors="replace") as fh:
        for line in fh:
            if line.startswith('{"listening"') and line.endswith("\n"):
                return json.loads(line)["listening"]
    return None


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as fh:
            return " | ".join(ln.strip() for ln in fh.read().splitlines()[-lines:] if ln.strip())
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
