"""Headless Chromium, driven over its DevTools protocol: open a page, collect what its console says,
check its media and pictures, take a screenshot. For the report test (tests/test_report.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--mute-audio", "--disable-dev-shm-usage",
         "--remote-debugging-port=0", "--remote-allow-origins=*", "--window-size=1280,900"]
REQUIRE_ENV = "VOICESMITH_REQUIRE_CHROMIUM"  # set by .ci/run: a missing browser fails, never skips


def find_chromium() -> Optional[str]:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageCheck:
    """What the browser saw: console errors, exceptions, and the state of every <audio> and <img>."""

    errors: list[str] = field(default_factory=list)
    audio: list[dict] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)


class DevTools:
    """One page target over one websocket: send a command, wait for its answer, keep the events."""

    def __init__(self, websocket_url: str):
        import websocket

        self.socket = websocket.create_connection(websocket_url, timeout=30)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params: Any) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, event: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(message.get("method") == event for message in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout} s")
            self.events.append(json.loads(self.socket.recv()))

    def close(self) -> None:
        self.socket.close()


@contextmanager
def chromium(binary: str, profile: Path) -> Iterator[int]:
    """A headless Chromium with a fresh profile; yields its DevTools port."""
    process = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield _devtools_port(profile, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _devtools_port(profile: Path, process: subprocess.Popen, timeout: float = 30.0) -> int:
    """Chromium writes the port it picked to DevToolsActivePort in its profile."""
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode} before opening DevTools")
        if marker.is_file() and marker.read_text().strip():
            return int(marker.read_text().splitlines()[0])
        time.sleep(0.1)
    raise TimeoutError(f"chromium wrote no {marker} within {timeout} s")


AUDIO_STATE = """Promise.all([...document.querySelectorAll('audio')].map(a => new Promise(done => {
  const report = () => done({src: a.getAttribute('src'), readyState: a.readyState, duration: a.duration,
                              error: a.error ? a.error.code : null});
  if (a.readyState >= 1 || a.error) return report();
  a.addEventListener('loadedmetadata', report, {once: true});
  a.addEventListener('error', report, {once: true});
  setTimeout(report, 10000);
})))"""
IMAGE_STATE = """[...document.images].map(i => ({src: i.getAttribute('src').slice(0, 60), complete: i.complete,
  width: i.naturalWidth, height: i.naturalHeight}))"""


class Browser:
    """One headless Chromium page: open a file, wait for it and its media, report what it saw."""

    def __init__(self, tools: DevTools):
        self.tools = tools
        for domain in ("Page", "Runtime", "Log"):
            tools.call(f"{domain}.enable")

    def check(self, page: Path, screenshot: Path) -> PageCheck:
        tools = self.tools
        tools.events.clear()  # what the browser says from here on is about this page
        tools.call("Page.navigate", url=page.resolve().as_uri())
        tools.wait_for("Page.loadEventFired", timeout=30)
        check = PageCheck(audio=tools.evaluate(AUDIO_STATE), images=tools.evaluate(IMAGE_STATE))
        shot = tools.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        check.errors = _errors(tools.events)
        return check


@contextmanager
def browser(binary: str, profile: Path) -> Iterator[Browser]:
    with chromium(binary, profile) as port:
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        target = next(t for t in targets if t.get("type") == "page")
        tools = DevTools(target["webSocketDebuggerUrl"])
        try:
            yield Browser(tools)
        finally:
            tools.close()


def _errors(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and failed loads (Log.entryAdded reports those)."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console: " + " ".join(str(arg.get("value", arg.get("description")))
                                                 for arg in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
    return errors


def chromium_or_skip() -> str:
    """The browser binary; without one the test skips, except under .ci/run, where it fails."""
    import pytest

    binary = find_chromium()
    if binary is None:
        message = "headless Chromium is not installed (apt-get install chromium)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{message}, and {REQUIRE_ENV} says this run must open the report in it")
        pytest.skip(message)
    return binary
