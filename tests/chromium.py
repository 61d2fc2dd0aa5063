"""Headless Chromium driven over the DevTools protocol (the protocol Puppeteer and Playwright speak), with
nothing between the test and the browser but a WebSocket: pages are loaded, fields filled and buttons
clicked in the real browser, so forms post what a person's would (the CSRF field included) and links are
followed as rendered.

Actions run as DOM calls through ``Runtime.evaluate``, which the page's Content-Security-Policy (no
script at all) does not govern: the page under test keeps its real headers."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

REQUIRE_TOOLS = os.environ.get("MEMLANE_REQUIRE_TOOLS") == "1"


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if REQUIRE_TOOLS:
            pytest.fail("chromium is not installed (Debian: apt-get install chromium)")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    return path


class Browser:
    def __init__(self, profile: Path, *, width: int = 1280, height: int = 900) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        self._ids = itertools.count(1)
        self._events: list[str] = []  # event names read while waiting for a reply
        browser = connect(f"ws://127.0.0.1:{port}{path}", max_size=None)
        target = self._call(browser, "Target.createTarget", url="about:blank")["targetId"]
        browser.close()
        self._ws: ClientConnection = connect(f"ws://127.0.0.1:{port}/devtools/page/{target}", max_size=None)
        self.send("Page.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )

    def _call(self, ws: ClientConnection, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            reply = json.loads(ws.recv(timeout=60))
            if "method" in reply:
                self._events.append(reply["method"])
            if reply.get("id") == call_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        return self._call(self._ws, method, **params)

    def _until_loaded(self) -> None:
        """Reads events until the page's load event (a navigation, a form post, a followed link); the
        events were cleared before the action, so a load seen already is this action's."""
        deadline = time.monotonic() + 60
        while "Page.loadEventFired" not in self._events:
            if time.monotonic() > deadline:
                raise TimeoutError("the page did not load")
            event = json.loads(self._ws.recv(timeout=60))
            self._events.append(event.get("method", ""))

    def goto(self, url: str) -> None:
        self._events.clear()
        self.send("Page.navigate", url=url)
        self._until_loaded()

    def js(self, expression: str) -> Any:
        out = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails']}")
        return out["result"].get("value")

    def _element(self, selector: str) -> str:
        return f"document.querySelector({json.dumps(selector)})"

    def fill(self, selector: str, value: str) -> None:
        assert self.js(f"!!{self._element(selector)}"), f"no {selector} on {self.url}"
        self.js(f"{self._element(selector)}.value = {json.dumps(value)}")

    def check(self, selector: str) -> None:
        assert self.js(f"!!{self._element(selector)}"), f"no {selector} on {self.url}"
        self.js(f"{self._element(selector)}.checked = true")

    def click(self, selector: str) -> None:
        """Clicks an element that navigates (a link, a submit button) and waits for the new page."""
        assert self.js(f"!!{self._element(selector)}"), f"no {selector} on {self.url}"
        self._events.clear()
        self.js(f"{self._element(selector)}.click()")
        self._until_loaded()

    def text(self, selector: str = "body") -> str:
        return str(self.js(f"{self._element(selector)}?.innerText ?? ''"))

    @property
    def url(self) -> str:
        return str(self.js("location.href"))

    def screenshot(self, path: Path) -> Path:
        """PNG, or JPEG (smaller, for docs) when the name ends in .jpg."""
        jpeg = path.suffix == ".jpg"
        params: dict[str, Any] = {"format": "jpeg", "quality": 45} if jpeg else {"format": "png"}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        self._proc.terminate()
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
