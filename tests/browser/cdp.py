"""Debian's Chromium, headless, driven over --remote-debugging-port with the Chrome DevTools Protocol:
a WebSocket client of a few dozen lines on the standard library (no package to install, and no
protocol version to match as Playwright's would), one page, and what its console reported."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """$EDGE_CHROMIUM, else the first browser on PATH (Debian's package installs `chromium`)."""
    given = os.environ.get("EDGE_CHROMIUM")
    if given:
        return given if Path(given).is_file() else None
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class WebSocket:
    """A client WebSocket (RFC 6455) on loopback: text frames out (masked), whole messages in."""

    def __init__(self, url: str, timeout: float = 30.0):
        m = re.match(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert m, url
        self.sock = socket.create_connection((m[1], int(m[2])), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {m[3]} HTTP/1.1\r\nHost: {m[1]}:{m[2]}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("the browser closed the DevTools connection during the handshake")
            head += chunk
        head, self.buffer = head.split(b"\r\n\r\n", 1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError(f"DevTools handshake refused: {head[:200]!r}")

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("the browser closed the DevTools connection")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def send(self, text: str) -> None:
        payload = text.encode()
        head = bytes([0x81])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def receive(self) -> str:
        message = b""
        while True:
            first, second = self._read(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            payload = self._read(n)
            opcode = first & 0x0F
            if opcode == 0x8:
                raise ConnectionError("the browser closed the DevTools connection")
            if opcode in (0x9, 0xA):  # ping / pong: Chromium does not ping its clients
                continue
            message += payload
            if first & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class Browser:
    """One headless Chromium with one page of 1280x800. `errors` collects what the page's console
    and runtime reported as errors (console.error, uncaught exceptions, failed loads)."""

    def __init__(self, executable: str, timeout: float = 30.0):
        self.profile = tempfile.mkdtemp(prefix="edge-chromium-")
        self.log = Path(self.profile) / "stderr.log"  # a file, not a pipe nobody reads once started
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [
                executable,
                "--headless=new",
                "--no-sandbox",  # as root (CI) Chromium refuses to start with its sandbox
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}",
                "--window-size=1280,800",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self._log_file,
        )
        port = self._devtools_port(timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = WebSocket(pages[0]["webSocketDebuggerUrl"], timeout)
        self._id = 0
        self.errors: list[str] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
        )

    def _devtools_port(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            if m := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", text):
                return int(m[1])
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("Chromium did not start its DevTools server:\n" + self.log.read_text()[-2000:])

    def _note(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = params["args"]
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in args))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.errors.append(f"{entry.get('text', '')} {entry.get('url', '')}".strip())

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params or {}}))
        while True:
            message = json.loads(self.ws.receive())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._note(message)

    def evaluate(self, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """The expression's value once it is truthy (polled every 0.1 s), else a TimeoutError naming it."""
        deadline, error = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:  # a page mid-navigation has no body yet: try again
                value, error = None, exc
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(
            f"the page never made this true: {expression}" + (f" (last: {error})" if error else "")
        )

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self._log_file.close()
            shutil.rmtree(self.profile, ignore_errors=True)
