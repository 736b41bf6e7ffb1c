"""Self-observation endpoint shared by agent and collector: /metrics and /readyz.

`/metrics` serves the process's prometheus_client registry; `/readyz` answers 200
once the component called `mark_ready()` (agent: probes attached; collector:
server listening) and 503 before, with the reason in the body.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from fabricscope.errors import UserError


class Readiness:
    def __init__(self) -> None:
        self._ready = threading.Event()
        self.reason = "starting"

    def mark_ready(self) -> None:
        self.reason = "ready"
        self._ready.set()

    def mark_not_ready(self, reason: str) -> None:
        self.reason = reason
        self._ready.clear()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()


class SelfMetricsServer:
    """A small HTTP server on its own thread. Port 0 picks a free port (see .port)."""

    def __init__(self, host: str, port: int, readiness: Readiness,
                 registry: CollectorRegistry = REGISTRY):
        self.readiness = readiness
        handler = _make_handler(readiness, registry)
        try:
            self._httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise UserError(f"cannot serve /metrics on {host}:{port}: {exc.strerror}",
                            "pick a free port with --metrics-port (0 picks one)") from None
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="selfmetrics",
                                        daemon=True)

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    def start(self) -> "SelfMetricsServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _make_handler(readiness: Readiness, registry: CollectorRegistry):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype, code = generate_latest(registry), CONTENT_TYPE_LATEST, 200
            elif path == "/readyz":
                code = 200 if readiness.ready else 503
                body, ctype = (readiness.reason + "\n").encode(), "text/plain"
            elif path == "/healthz":
                body, ctype, code = b"ok\n", "text/plain", 200
            else:
                body, ctype, code = b"not found\n", "text/plain", 404
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # keep stderr for our own log lines
            pass

    return Handler
