"""A real headless Chromium, driven over the Chrome DevTools Protocol (CDP), for testing pages as people see them.

Debian's ``chromium`` and ``websocket-client`` are all it needs (no Node, no Playwright). The page
is opened unmodified: the checks run through CDP (``Runtime.evaluate``), which the page's
Content-Security-Policy does not restrict, so a report that forbids scripts is tested as served.
Collected while the page loads: console messages of level error, uncaught exceptions and the
browser's own log errors (a CSP violation, a failed request); then the DOM is queried and a
full-page screenshot taken.

Protocol reference: https://chromedevtools.github.io/devtools-protocol/ (Target.createTarget /
attachToTarget with ``flatten``, Page.loadEventFired, Runtime.consoleAPICalled,
Runtime.exceptionThrown, Log.entryAdded, Page.captureScreenshot).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = (
    "no chromium on PATH: the real-browser test of the HTML report is skipped "
    "(install it with `apt-get install -y chromium` on Debian; .ci/run does so)"
)
_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--remote-allow-origins=*",
]  # fmt: skip


@dataclass
class PageReport:
    """What a person would see: errors raised while loading, the images, the DOM facts asked for, a screenshot."""

    errors: list[str] = field(default_factory=list)  # console errors, exceptions, browser log errors
    images: list[dict] = field(default_factory=list)  # alt, complete, naturalWidth, naturalHeight
    facts: dict = field(default_factory=dict)  # answers to the ``facts`` expressions
    screenshot_png: bytes = b""


class Chromium:
    """One headless Chromium process and its CDP websocket (synchronous, one page at a time)."""

    def __init__(self, profile_dir: Path, timeout_s: float = 60.0):
        import websocket  # websocket-client

        if CHROMIUM is None:
            raise RuntimeError(SKIP_REASON)
        self.timeout_s = timeout_s
        profile_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [CHROMIUM, *_FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = (
            profile_dir / "DevToolsActivePort"
        )  # Chromium writes "<port>\n<browser path>" once listening
        deadline = time.monotonic() + timeout_s
        while not (port_file.is_file() and len(port_file.read_text().splitlines()) >= 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not open its DevTools port (exit {self.process.poll()})")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self.ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}{path}", timeout=timeout_s, suppress_origin=True
        )
        self._next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        """Send one command and return its result; events received meanwhile are kept in ``events``."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"CDP {method} failed: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, session: str) -> dict:
        """The first (kept or new) event ``method`` of ``session``."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for event in self.events:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {self.timeout_s:.0f} s")
            self.events.append(json.loads(self.ws.recv()))

    def inspect(self, url: str, facts: dict[str, str] | None = None, width: int = 1200) -> PageReport:
        """Load ``url`` in a fresh tab and report on it (``facts``: name -> JavaScript expression)."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session)  # fmt: skip
        self.send("Page.navigate", {"url": url}, session)
        self.wait_for("Page.loadEventFired", session)
        report = PageReport()
        report.images = self.evaluate(
            "Array.from(document.images, i => ({alt: i.alt, complete: i.complete, "
            "naturalWidth: i.naturalWidth, naturalHeight: i.naturalHeight}))",
            session,
        )
        report.facts = {
            name: self.evaluate(expression, session) for name, expression in (facts or {}).items()
        }
        shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session)
        report.screenshot_png = base64.b64decode(shot["data"])
        report.errors = _errors(e for e in self.events if e.get("sessionId") == session)
        self.send("Target.closeTarget", {"targetId": target})
        return report

    def evaluate(self, expression: str, session: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                self.send("Browser.close")
            except Exception:  # noqa: BLE001 - the browser may already be gone; it is killed below
                pass
            ws.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _errors(events) -> list[str]:
    out = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            out.append(
                "console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            out.append("exception: " + params["exceptionDetails"].get("text", ""))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            out.append(f"{params['entry'].get('source')}: {params['entry'].get('text')}")
    return out
