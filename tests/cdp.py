"""A small Chrome DevTools Protocol driver for the browser test: headless Chromium, no Selenium.

It starts Debian's ``chromium`` with the flags this kind of machine needs (no
sandbox as root, no background networking on a closed network, a fresh
profile), speaks CDP over the ``websockets`` package's synchronous client, and
offers what the report test needs: open a page, collect console errors and
uncaught exceptions, evaluate a script, take a full-page screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)
START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 60.0


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


class Browser:
    """One headless Chromium with one page, driven over CDP."""

    def __init__(self, executable: str) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="kvconform-chromium-"))
        self.process = subprocess.Popen(
            [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self._stack = contextlib.ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(
            connect(self._browser_url(), max_size=None, open_timeout=30)
        )
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)

    def _browser_url(self) -> str:
        # Chromium writes the port it picked (and the browser's path) into the profile.
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with status {self.process.returncode}")
            if port_file.exists():
                lines = port_file.read_text().split()
                if len(lines) >= 2:
                    return f"ws://127.0.0.1:{lines[0]}{lines[1]}"
            time.sleep(0.1)
        raise RuntimeError("chromium did not open its DevTools port")

    def call(self, method: str, *, session: bool = False, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv(timeout=CALL_TIMEOUT_S))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return dict(reply.get("result", {}))
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, event: str) -> dict[str, Any]:
        for seen in self.events:
            if seen["method"] == event:
                self.events.remove(seen)
                return seen
        while True:
            message = json.loads(self.ws.recv(timeout=CALL_TIMEOUT_S))
            if message.get("method") == event:
                return message
            if "method" in message:
                self.events.append(message)

    def open(self, url: str, width: int = 1280, height: int = 900) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session=True,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            session=True,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries seen so far."""
        errors = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a)) for a in params.get("args", [])))
            elif method == "Runtime.exceptionThrown":
                errors.append(str(params.get("exceptionDetails", {}).get("text")))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                errors.append(str(params["entry"].get("text")))
        return errors

    def page_height(self) -> float:
        metrics = self.call("Page.getLayoutMetrics", session=True)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        return float(size["height"])

    def screenshot(self, path: Path, top: float = 0, height: float = 16000) -> Path:
        """A PNG of the page from ``top``, at most ``height`` CSS pixels tall."""
        metrics = self.call("Page.getLayoutMetrics", session=True)
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {
            "x": 0,
            "y": top,
            "width": size["width"],
            "height": max(1, min(size["height"] - top, height)),
            "scale": 1,
        }
        shot = self.call(
            "Page.captureScreenshot",
            session=True,
            format="png",
            captureBeyondViewport=True,
            clip=clip,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:  # noqa: BLE001 - closing a browser that is already gone is fine
            pass
        try:
            self._stack.close()
        finally:
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
