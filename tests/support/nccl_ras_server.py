"""A stand-in for NCCL's RAS service on 127.0.0.1: NOT NCCL, no job behind it.

NCCL (>= 2.24) runs RAS in every process and listens for clients on port 28028
(NCCL_RAS_ADDR). This server speaks the same client protocol, as read from NVIDIA/nccl
src/ras/client_support.cc (server side) and src/ras/client.cc (the `ncclras` client):
newline-terminated commands, case-insensitive:

    CLIENT PROTOCOL <n>   ->  SERVER PROTOCOL 2
    TIMEOUT <secs>        ->  OK            (ERROR: Invalid timeout value ... when bad)
    SET FORMAT json|text  ->  OK            (ERROR: Invalid format ...; older NCCL:
                                             ERROR: Unknown command ...)
    STATUS                ->  the status document, then the server closes the connection
    anything else         ->  ERROR: Unknown command <cmd>

The status document it serves is given by the test (`status`), e.g. a file rendered
the way client_support.cc's jsonWrite* functions print it
(tests/unit/nccl_fixtures/ras/).
"""

from __future__ import annotations

import socket
import threading


class RasStandIn:
    def __init__(self, status: str, json_format: bool = True, silent: bool = False):
        self.status = status
        self.json_format = json_format      # False: an NCCL whose RAS predates SET FORMAT
        self.silent = silent                # accept, then never answer (a stuck process)
        self.commands: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self.address = "127.0.0.1:%d" % self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return          # closed
            with conn:
                self._client(conn)

    def _client(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                cmd = line.decode().rstrip("\r")
                self.commands.append(cmd)
                if self.silent:
                    continue
                reply = self._answer(cmd)
                if reply is None:       # STATUS: the document, then close
                    conn.sendall(self.status.encode())
                    return
                conn.sendall(reply.encode())

    def _answer(self, cmd: str) -> str | None:
        low = cmd.lower()
        if low.startswith("client protocol "):
            return "SERVER PROTOCOL 2\n"
        if low.startswith("timeout "):
            value = cmd[len("timeout "):]
            return "OK\n" if value.isdigit() else f"ERROR: Invalid timeout value {value}\n"
        if low.startswith("set format ") and self.json_format:
            fmt = cmd[len("set format "):]
            return "OK\n" if fmt.lower() in ("json", "text") else f"ERROR: Invalid format {fmt}\n"
        if low in ("status", "verbose status"):
            return None
        return f"ERROR: Unknown command {cmd}\n"

    def close(self) -> None:
        self._sock.close()
