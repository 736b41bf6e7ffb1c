"""A stand-in for the kubelet's /pods endpoint and the API server's /api/v1/pods.

No cluster runs here, so tests serve real PodList JSON (the fixtures under
tests/unit/kube_fixtures/, in the shape `kubectl get pods -o json` and the kubelet's
/pods return) from an HTTP(S) server on 127.0.0.1:

    GET /pods                                               every pod
    GET /api/v1/pods?fieldSelector=spec.nodeName=NODE       the pods of NODE

With `token` set, a request without `Authorization: Bearer <token>` gets 401, as
from a kubelet with webhook authentication. `fail_with(code)` makes it answer
that HTTP status until `fail_with(None)`. Every request is recorded before it is
answered (a client that has its answer finds its request listed), and
`wait_requests(n)` blocks until n have been answered.
"""

from __future__ import annotations

import json
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandInKubelet:
    def __init__(self, pod_list: dict, token: str = "", certfile: str = "", keyfile: str = ""):
        self.pod_list = pod_list
        self.token = token
        self.requests: list[str] = []
        self.answered = 0
        self._status: int | None = None
        self._answered = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.scheme = "http"
        if certfile:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(certfile, keyfile)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "StandInKubelet":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def fail_with(self, status: int | None) -> None:
        self._status = status

    def wait_requests(self, n: int, timeout: float = 10.0) -> bool:
        with self._answered:
            return self._answered.wait_for(lambda: self.answered >= n, timeout)

    def _answer(self, path: str, auth: str) -> tuple[int, dict]:
        if self._status is not None:
            return self._status, {"kind": "Status", "code": self._status}
        if self.token and auth != f"Bearer {self.token}":
            return 401, {"kind": "Status", "code": 401, "reason": "Unauthorized"}
        url = urllib.parse.urlsplit(path)
        if url.path == "/pods":
            return 200, self.pod_list
        if url.path == "/api/v1/pods":
            selector = urllib.parse.parse_qs(url.query).get("fieldSelector", [""])[0]
            node = selector.removeprefix("spec.nodeName=")
            items = [p for p in self.pod_list.get("items", [])
                     if not node or (p.get("spec") or {}).get("nodeName") == node]
            return 200, {**self.pod_list, "items": items}
        return 404, {"kind": "Status", "code": 404}

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                with stand_in._answered:
                    stand_in.requests.append(self.path)
                code, body = stand_in._answer(self.path, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                with stand_in._answered:
                    stand_in.answered += 1
                    stand_in._answered.notify_all()

            def log_message(self, *args):
                pass

        return Handler
