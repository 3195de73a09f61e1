"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol, with the
`websockets` package Airflow already installs: no Selenium, no browser downloads."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import connect

# no name resolves but loopback's: a page that needs the internet fails to load
OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-sync", "--hide-scrollbars", "--mute-audio")


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class CdpError(RuntimeError):
    pass


class Browser:
    """One Chromium process and one page (tab) of it."""

    def __init__(self, width: int = 1280, height: int = 900, flags: tuple[str, ...] = ()):
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("no chromium: run scripts/ensure-chromium.sh (make test does)")
        self.profile = Path(tempfile.mkdtemp(prefix="airflow-gpu-chromium-"))
        self.proc = subprocess.Popen(
            [exe, *FLAGS, *flags, "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = self._devtools_port()
            pages = [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list",
                                          timeout=10).json() if t["type"] == "page"]
            self._socket = connect(pages[0]["webSocketDebuggerUrl"], max_size=None,
                                   open_timeout=10)
        except BaseException:
            self._stop()          # no browser left behind when it cannot be driven
            raise
        self.ws = self._socket.__enter__()
        self._ids = itertools.count(1)
        self.events: list[dict] = []
        self.send("Page.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _devtools_port(self) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if active.exists() and active.read_text().strip():
                return int(active.read_text().split()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            time.sleep(0.05)
        raise RuntimeError("chromium did not open its DevTools port within 30 s")

    def send(self, method: str, **params: Any) -> dict:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise CdpError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if len(self.events) < 1000:
                self.events.append(msg)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        got = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in got:
            detail = got["exceptionDetails"]
            raise CdpError(f"{expression[:200]}: "
                           f"{detail.get('exception', {}).get('description') or detail}")
        return got["result"].get("value")

    def wait(self, expression: str, timeout: float = 20, what: str | None = None) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:      # a DOM node (of any frame) has no JSON value: found is true
                value = self.eval(f"(v => v && v.nodeType ? true : v)(({expression}))")
            except CdpError:
                value = None          # e.g. the page is between documents
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for "
                                     f"{what or expression}; page: {self.eval('location.href')}")
            time.sleep(0.1)

    def open(self, url: str, ready: str = "document.readyState === 'complete'") -> None:
        self.send("Page.navigate", url=url)
        self.wait(f"location.href !== 'about:blank' && ({ready})", what=f"{url} to load")

    def text(self, selector: str = "body") -> str:
        return self.eval(f"(document.querySelector({json.dumps(selector)}) || {{}}).innerText"
                         " || ''")

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.setCookie", url=url, name=name, value=value, path="/")

    def clear_cookies(self) -> None:
        self.send("Network.clearBrowserCookies")

    def screenshot(self, path: Path, full_page: bool = False) -> None:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.eval("[document.documentElement.scrollWidth, "
                             "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True, clip={
                "x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1})
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self._socket.__exit__(None, None, None)
        finally:
            self._stop()

    def _stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
