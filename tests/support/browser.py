"""Debian's Chromium, headless, driven over the DevTools protocol: what the report's
tests open a report with (test support; not part of the product).

    with Browser() as b:
        page = b.open("file:///tmp/report.html", ready="document.body.dataset.rendered")
        page.errors          # console errors, uncaught exceptions, error log entries
        page.requests        # every URL the page asked for
        b.evaluate("document.title")
        b.screenshot("/tmp/report.png")          # the whole page, not just the viewport

The browser runs on 127.0.0.1 with a fresh profile in a temporary folder, no
network helpers (background networking, component updates, sync), in a process
group of its own. On exit, also when the block raises, the whole group is
stopped and awaited before the profile is removed: Chromium's renderer and
utility processes outlive its main process for a moment and keep writing to the
profile, so removing it right after the main process ended raced with them.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-default-apps", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0"]


@dataclass
class Page:
    url: str
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    ready: object = None             # the value of the `ready` expression that ended the wait


class Browser:
    def __init__(self, width: int = 1400, height: int = 1000, timeout_s: float = 60.0):
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self._proc: subprocess.Popen | None = None
        self._profile: tempfile.TemporaryDirectory | None = None
        self._ws = None
        self._ids = itertools.count(1)
        self._page: Page | None = None

    # -- life ------------------------------------------------------------------------
    def __enter__(self) -> "Browser":
        import websocket
        self._profile = tempfile.TemporaryDirectory(prefix="fabricscope-chromium-")
        profile = Path(self._profile.name)
        with open(profile / "chromium.log", "wb") as log:
            self._proc = subprocess.Popen(
                [CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                 f"--window-size={self.width},{self.height}", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                start_new_session=True)
        try:
            port = self._await(lambda: _active_port(profile), "Chromium's DevTools port")
            target = self._await(lambda: _page_target(port), "Chromium's first page")
            self._ws = websocket.create_connection(target, timeout=self.timeout_s,
                                                   suppress_origin=True)
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.call(f"{domain}.enable")
            self.call("Emulation.setDeviceMetricsOverride", width=self.width,
                      height=self.height, deviceScaleFactor=1, mobile=False)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        from fabricscope.services import terminate
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        if self._proc is not None:
            terminate(self._proc)
            _stop_group(self._proc.pid, self.timeout_s)
            self._proc = None
        if self._profile is not None:
            self._profile.cleanup()
            self._profile = None

    def _await(self, check, what: str):
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"Chromium exited ({self._proc.returncode}) before {what}")
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} after {self.timeout_s:.0f} s")
            time.sleep(0.05)

    # -- the protocol ------------------------------------------------------------------
    def call(self, method: str, **params) -> dict:
        """Send one command; events that arrive meanwhile are recorded on the page."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self._ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error'].get('message')}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict) -> None:
        page, method, p = self._page, msg.get("method"), msg.get("params", {})
        if page is None:
            return
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            page.errors.append("console: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            page.errors.append("exception: " + str(d.get("exception", {}).get(
                "description", d.get("text", ""))))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            page.errors.append(f"log: {p['entry'].get('text', '')} {p['entry'].get('url', '')}")
        elif method == "Network.requestWillBeSent":
            page.requests.append(p.get("request", {}).get("url", ""))

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    def _poll(self, expression: str):
        try:
            return self.evaluate(expression)
        except RuntimeError:        # the document is not there yet (navigating)
            return None

    def open(self, url: str, ready: str = "document.readyState === 'complete'") -> Page:
        """Navigate and wait until the expression `ready` is truthy; the page's errors and
        requests are recorded from the navigation on."""
        self._page = Page(url)
        self.call("Page.navigate", url=url)
        self._page.ready = self._await(lambda: self._poll(ready), f"{ready!r} on {url}")
        self.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 0)))")
        return self._page

    def screenshot(self, path: str | os.PathLike, selector: str = "") -> Path:
        """The whole page as PNG (beyond the viewport), or the element `selector` finds."""
        if selector:
            box = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                ".getBoundingClientRect(); return {x: r.x + scrollX, y: r.y + scrollY, "
                "width: r.width, height: r.height}; })()")
        else:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            box = {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={**box, "scale": 1})
        out = Path(path)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out


def _active_port(profile: Path) -> int | None:
    """Chromium writes the port it chose to DevToolsActivePort in the profile."""
    try:
        first = (profile / "DevToolsActivePort").read_text().splitlines()[0]
        return int(first)
    except (OSError, IndexError, ValueError):
        return None


def _page_target(port: int) -> str | None:
    from fabricscope.services import http_get
    try:
        status, body = http_get(f"http://127.0.0.1:{port}/json/list", timeout=2.0)
    except OSError:
        return None
    if status != 200:
        return None
    pages = [t for t in json.loads(body) if t.get("type") == "page"]
    return pages[0]["webSocketDebuggerUrl"] if pages else None


def _stop_group(pgid: int, timeout_s: float) -> None:
    """Stop what is left of the process group Chromium leads (its children) and wait
    until none of it is left: SIGTERM, SIGKILL at the deadline. A group that still
    answers 5 s after SIGKILL holds only zombies (a PID 1 that reaps none), which
    write nothing."""
    import signal
    deadline = time.monotonic() + timeout_s
    sig = signal.SIGTERM
    while True:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return                      # the group is empty: nothing writes the profile
        if time.monotonic() > deadline + 5:
            return
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.05)
