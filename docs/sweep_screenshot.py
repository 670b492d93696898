"""A screenshot of the sweep report's HTML page, taken with headless Chromium.

    python docs/sweep_screenshot.py [--png docs/sweep.png] [--html docs/sweep.html] [--width 1280]

The page is rendered by triage's own renderer (`triage.sweep.report.render_html`) from the
sweep in tests/data/sweep/items.json: real report.json files of `triage run`, as ItemResults on
two torch builds. Chromium is driven over its DevTools protocol on a pipe
(--remote-debugging-pipe), with the standard library only: the page is laid out at the given
width, checked for anything wider than the window, and captured whole. Nothing is fetched.

`DevTools` and `load_results` are shared with tests/test_sweep_report.py.

Exit status: 0 done; 1 the page is wider than the window (the screenshot is still written);
2 usage, or Chromium missing or failing.
"""
from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from triage.sweep.model import ItemResult
from triage.sweep.report import SweepReport, build_report, render_html

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
DATA = ROOT / "tests" / "data" / "sweep"
MANIFEST = DATA / "items.json"
# Run in the page: how far its content reaches beyond the window, and each table that is wider
# than its own box (one that would scroll sideways).
OVERFLOW = """(() => {
  const page = document.documentElement;
  const wide = Array.from(document.querySelectorAll("table"))
    .filter(t => t.scrollWidth > t.clientWidth + 1 || t.getBoundingClientRect().right > page.clientWidth + 1)
    .map(t => (t.previousElementSibling ? t.previousElementSibling.textContent.trim() : "table")
              + `: ${t.scrollWidth} px`);
  return {pageWidth: page.scrollWidth, windowWidth: page.clientWidth, height: page.scrollHeight, wide};
})()"""
_PLACE_PIPES = """import os, sys
commands, replies = int(sys.argv[1]), int(sys.argv[2])
os.dup2(commands, 3)
os.dup2(replies, 4)
os.close(commands)
os.close(replies)
os.execv(sys.argv[3], sys.argv[3:])
"""


def load_results(manifest: Path = MANIFEST) -> tuple[list[ItemResult], dict[str, Any]]:
    """The sweep `manifest` describes (see its "about"), and the manifest itself."""
    meta = json.loads(manifest.read_text(encoding="utf-8"))
    results = []
    for entry in meta["items"]:
        entry = dict(entry)
        report_file, content_of = entry.pop("report", None), entry.pop("content_of", None)
        report = json.loads((manifest.parent / report_file).read_text(encoding="utf-8")) if report_file else None
        verdict = (report or {}).get("verdict") or {}
        # The item's text is the script its report ran; an entry that reuses another item's
        # report on a build names the report whose script is its own.
        source_report = json.loads((manifest.parent / content_of).read_text(encoding="utf-8")) if content_of else report
        text = ((source_report or {}).get("repro") or {}).get("source") or entry["key"]
        results.append(ItemResult(
            **{"outcome": "triaged", "seconds": (report or {}).get("seconds", 0.0), **entry},
            content_sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
            verdict_kind=verdict.get("kind"), expected=verdict.get("expected"), summary=verdict.get("summary") or "",
            report=report, finished_at=meta["started"]))
    return results, meta


def sample_report(manifest: Path = MANIFEST) -> SweepReport:
    results, meta = load_results(manifest)
    return build_report(results, title="triage sweep: numerical-discrepancy backlog", torch_builds=meta["torch_builds"],
                        sources=meta["sources"], started=meta["started"], seconds=meta["seconds"])


class DevTools:
    """Headless Chromium (fresh profile, nothing fetched or synced) driven over the DevTools
    protocol on a pipe: JSON messages ended by NUL, commands on the child's fd 3, replies and
    events on its fd 4. One page, `width` × `height` CSS pixels."""

    def __init__(self, chromium: str = CHROMIUM, width: int = 1000, height: int = 800, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="triage-chromium-")
        to_chromium, self._commands = os.pipe()
        self._replies, from_chromium = os.pipe()
        # Chromium's ends numbered 10 and up, so that moving them to 3 and 4 overwrites neither.
        to_chromium, from_chromium = (_renumbered(fd) for fd in (to_chromium, from_chromium))
        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe",
                f"--window-size={width},{height}", "about:blank"]
        # A small Python moves the two pipe ends where Chromium looks for them, fds 3 and 4, and
        # becomes Chromium (a shell's redirections reach fd 9 at most). Chromium leads its own
        # process group, so that what it starts is found and ended with it, and logs to a file,
        # which no amount of logging fills the way it would fill a pipe nobody reads.
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _PLACE_PIPES, str(to_chromium), str(from_chromium), *argv],
            pass_fds=(to_chromium, from_chromium), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self._log, start_new_session=True)
        os.close(to_chromium)
        os.close(from_chromium)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []
        try:
            page = next(t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
            attached = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
            self._session = attached["sessionId"]
            self.send("Page.enable", session=True)
            self.send("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=True)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> DevTools:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Chromium asked to close, then what is left of its process group killed, and its
        profile removed once no process of it can still write there."""
        pid = self._process.pid
        try:
            os.write(self._commands, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except OSError:
            pass  # it is gone already
        deadline = time.monotonic() + 10
        # Not reaped yet (WNOWAIT): while Chromium is a zombie its process group's id stays its own.
        while not _exited(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill_group(pid)
        self._process.wait(timeout=30)
        # Its helpers, killed with the group, are reaped by init; the last one gone ends the group.
        while _group_alive(pid) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        self._log.close()
        for fd in (self._commands, self._replies):
            os.close(fd)
        self._profile.cleanup()

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        """The result of one command; events that arrive meanwhile are kept in `events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"DevTools {method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._replies, 1 << 16) if ready else b""
            if not chunk:
                why = "timed out" if not ready else "closed its pipe"
                raise RuntimeError(f"Chromium {why}: {self._stderr_tail()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _stderr_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:] or "(nothing on stderr)"

    def open(self, url: str) -> None:
        """Load `url` and wait for its load event (its scripts have run)."""
        self.events.clear()
        self.send("Page.navigate", {"url": url}, session=True)
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not finish loading {url}")
            self.events.append(self._read())

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        done = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in done:
            raise RuntimeError(f"{expression[:80]}: {done['exceptionDetails']}")
        return done["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A left click at (x, y) in the window, as a mouse would make it."""
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
                      session=True)

    def screenshot(self, png: Path, width: int, height: int) -> None:
        """The page's top `width` × `height` pixels (beyond the window too) as a PNG."""
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                    "clip": {"x": 0, "y": 0, "width": width, "height": height,
                                                             "scale": 1}}, session=True)["data"]
        png.write_bytes(base64.b64decode(data))


def _exited(pid: int) -> bool:
    """Whether our child `pid` has exited, leaving it unreaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped already
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _renumbered(fd: int, lowest: int = 10) -> int:
    """`fd` moved to the lowest free descriptor from `lowest` up."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
    os.close(fd)
    return moved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "sweep.png")
    parser.add_argument("--html", type=Path, default=ROOT / "docs" / "sweep.html")
    parser.add_argument("--width", type=int, default=1280, help="window width in px (the PNG's width)")
    parser.add_argument("--height", type=int, default=3000,
                        help="the PNG's height at most, in px (it is the page's own height where less)")
    parser.add_argument("--chromium", default=shutil.which("chromium") or CHROMIUM)
    args = parser.parse_args(argv)
    if not os.access(args.chromium, os.X_OK):
        print(f"no Chromium at {args.chromium}: apt-get install chromium", file=sys.stderr)
        return 2
    args.html.write_text(render_html(sample_report()), encoding="utf-8")
    try:
        with DevTools(args.chromium, args.width) as chromium:
            chromium.open(args.html.resolve().as_uri())
            layout = chromium.evaluate(OVERFLOW)
            chromium.screenshot(args.png, args.width, min(layout["height"], args.height))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {args.html} and {args.png}")
    wide = list(layout["wide"])
    if layout["pageWidth"] > layout["windowWidth"]:
        wide.append(f"the page: {layout['pageWidth']} px")
    for what in wide:
        print(f"wider than the {args.width} px window: {what}", file=sys.stderr)
    return 1 if wide else 0


if __name__ == "__main__":
    sys.exit(main())
