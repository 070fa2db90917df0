"""A real headless Chromium for the tests, driven through the DevTools protocol (Debian's `chromium`;
`.ci/run` installs it).

    with Browser(tmp_path / "profile") as browser:
        browser.open(page.as_uri())                       # waits until the page has loaded
        browser.evaluate("document.title")                # a value computed in the page

`evaluate` runs in the DevTools context, which the page's Content-Security-Policy does not restrict: what
it reads is the page as the browser built it (the layout, the DOM, what the page's own scripts did).
Without Chromium, `CHROMIUM` is None: tests skip, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))),
                None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def require_chromium() -> None:
    if CHROMIUM is not None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail("Chromium is missing in CI: .ci/run installs Debian's chromium package")
    pytest.skip("no Chromium here (Debian: apt install chromium; .ci/run installs it)")


class Browser:
    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        self.profile, self.size = profile, (width, height)
        self.process: subprocess.Popen | None = None
        self.socket = None
        self.next_id = 0

    def __enter__(self) -> Browser:
        import websocket

        require_chromium()
        self.profile.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
             "--remote-allow-origins=*", f"--window-size={self.size[0]},{self.size[1]}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        marker = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text().strip()):
            assert self.process.poll() is None and time.monotonic() < deadline, "Chromium did not start"
            time.sleep(0.1)
        port = int(marker.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as response:
            page = next(target for target in json.load(response) if target["type"] == "page")
        self.socket = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.call("Page.enable")
        return self

    def __exit__(self, *exception: object) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def call(self, method: str, **params: object) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, message["error"]
                return message.get("result", {})

    def evaluate(self, expression: str) -> object:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, url: str, settle: float = 0.5) -> None:
        """Load URL and wait until it has loaded, then SETTLE seconds more (for handlers of failed images)."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        time.sleep(0.2)
        while self.evaluate("document.readyState") != "complete":
            assert time.monotonic() < deadline, f"{url} did not load"
            time.sleep(0.1)
        time.sleep(settle)

    def screenshot(self, path: Path, height: int | None = None) -> Path:
        import base64

        width = self.size[0]
        height = height or int(self.evaluate("document.documentElement.scrollHeight"))
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        data = self.call("Page.captureScreenshot", format="png")["data"]
        self.call("Emulation.clearDeviceMetricsOverride")
        path.write_bytes(base64.b64decode(data))
        return path
