"""The Perfetto / Chrome trace JSON of `tilec profile`, loaded by a real trace viewer in a headless browser.

Chromium's DevTools ships the Performance panel's trace engine (`models/trace/trace.js` under
devtools://devtools/bundled/), the parser that opens trace-event JSON files in Chrome. This test starts a headless
Chromium (Debian's `chromium` package; CI installs it), talks to it over the DevTools protocol on a pipe
(`--remote-debugging-pipe`: NUL-terminated JSON messages on file descriptors 3 and 4, so no websocket client is
needed), has that engine parse the trace, and checks that it imported every track and slice the JSON holds: the
same thread names, and per thread the same slices (name, start, duration). chrome://tracing itself is no longer
served by current Chromium ("ERR_FAILED"), and the perfetto wheel's trace_processor downloads its binary at first use.
"""
from __future__ import annotations

import fcntl
import json
import os
import pathlib
import select
import shutil
import subprocess
import time
from collections import Counter

import pytest

import tilec_cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROGRAM = ROOT / "examples" / "conv_bias_maxpool.tl"
SIZES = ["-D", "N=1", "-D", "C=128", "-D", "K=128", "-D", "H=18", "-D", "W=18"]
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
TIMEOUT_S = 60.0

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")

# Runs inside the DevTools page: parse the trace with the Performance panel's engine, return what it imported.
PARSE_JS = """(async () => {
  const Trace = await import('./models/trace/trace.js');
  const model = Trace.TraceModel.Model.createWithAllHandlers();
  await model.parse(JSON.parse(%s).traceEvents, {metadata: {}, isFreshRecording: false});
  const threads = [];
  for (const [pid, proc] of model.parsedTrace(0).data.Renderer.processes) {
    for (const [tid, thread] of proc.threads) {
      threads.push({pid, tid, name: thread.name,
                    slices: thread.entries.map(e => [e.name, e.ts, e.dur ?? 0])});
    }
  }
  return JSON.stringify(threads);
})()"""


class Browser:
    """A headless Chromium driven over the DevTools protocol on a pipe."""

    def __init__(self, profile_dir: pathlib.Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def to_fds_3_and_4() -> None:  # in the child: the protocol pipes must be exactly fds 3 and 4
            r, w = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self._proc = subprocess.Popen(
            [str(CHROMIUM), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=to_fds_3_and_4)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id, self._buffer = 0, b""

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message: dict[str, object] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                    raise TimeoutError(f"chromium did not answer {method} within {TIMEOUT_S:.0f} s")
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium closed the DevTools pipe during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply["result"]

    def close(self) -> None:
        try:
            self.send("Browser.close")
            self._proc.wait(timeout=20)
        except Exception:
            self._proc.kill()
            self._proc.wait()
        finally:
            os.close(self._to_chrome)
            os.close(self._from_chrome)


def parse_in_devtools(trace_text: str, profile_dir: pathlib.Path) -> list[dict]:
    browser = Browser(profile_dir)
    try:
        target = browser.send("Target.createTarget", {"url": "devtools://devtools/bundled/trace_app.html"})
        session = browser.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        deadline = time.monotonic() + TIMEOUT_S
        while browser.send("Runtime.evaluate", {"expression": "document.readyState", "returnByValue": True},
                           session)["result"].get("value") != "complete":
            assert time.monotonic() < deadline, "the DevTools page did not finish loading"
            time.sleep(0.1)
        result = browser.send("Runtime.evaluate", {"expression": PARSE_JS % json.dumps(trace_text),
                                                   "awaitPromise": True, "returnByValue": True}, session)
        assert "exceptionDetails" not in result, f"the trace engine failed: {result['exceptionDetails']}"
        return json.loads(result["result"]["value"])
    finally:
        browser.close()


def test_chromium_trace_engine_imports_every_track_and_slice(tmp_path: pathlib.Path) -> None:
    trace_path = tmp_path / "conv.trace.json"
    assert tilec_cli.main(["profile", str(PROGRAM), *SIZES, "-o", str(trace_path)]) == 0
    trace_text = trace_path.read_text()
    events = json.loads(trace_text)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    expected = {names[tid]: Counter((e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X" and e["tid"] == tid)
                for tid in names}

    threads = parse_in_devtools(trace_text, tmp_path / "chromium-profile")

    imported = {t["name"]: Counter((name, ts, dur) for name, ts, dur in t["slices"]) for t in threads}
    assert len(threads) == len(imported) == len(names)  # one track per engine / DMA queue, none merged or lost
    assert imported.keys() == expected.keys()
    for track, slices in expected.items():
        assert imported[track] == slices, f"track {track!r}: the browser imported other slices than the JSON holds"
    assert sum(len(t["slices"]) for t in threads) == sum(e["ph"] == "X" for e in events) > 0
    assert {"TensorE", "VectorE"} <= imported.keys() and sum(k.startswith("DMA queue ") for k in imported) >= 3
