"""The fourth hostile-input review (28 cases: the minimizer's workers, the process sandbox,
triage's own memory and time on what an arm or a reporter hands it, invisible characters),
each attack made on purpose here so that it stays stopped on any machine.
"""
from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_triage

# Definitions added to fixtures/judge/expm1_backend.py (a compile backend that rewrites expm1
# as exp - 1: a real divergence to minimize), whose backend the script then compiles with: the
# minimizer runs them in the compile arm's warm worker. From there they plant, in every triage
# folder they can see, a `render` folder and links named like the files triage writes, each
# pointing at a host path.
PLANTER = textwrap.dedent("""\
    import os
    import re
    import threading
    import time

    TARGET = {target!r}


    def _plant():
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                mounts = open("/proc/self/mountinfo").read()
            except OSError:
                mounts = ""
            folders = set(re.findall(r"(/[^ ]*?triage-[a-z]+-[A-Za-z0-9_]{{8}})", mounts))
            for folder in folders:
                for place in (folder, os.path.join(folder, "render")):
                    try:
                        os.makedirs(place, exist_ok=True)
                    except OSError:
                        continue
                    for name in ("minimal.py", "minimal_inputs.pt"):
                        try:
                            os.symlink(TARGET, os.path.join(place, name))
                        except OSError:
                            pass
            time.sleep(0.005)


    _STARTED = []


    def planting_backend(gm, example_inputs):
        if not _STARTED:
            _STARTED.append(threading.Thread(target=_plant, daemon=True))
            _STARTED[0].start()
        return exp_minus_one_backend(gm, example_inputs)


""")


def planting_script(target: Path) -> str:
    source = (FIXTURES / "judge" / "expm1_backend.py").read_text()
    head, call = source.split("\n\ndef f(x):")
    assert "backend=exp_minus_one_backend" in call
    return (head + "\n\n" + PLANTER.format(target=str(target)) + "def f(x):"
            + call.replace("backend=exp_minus_one_backend", "backend=planting_backend"))


@pytest.mark.slow
def test_the_script_s_backend_in_the_minimizer_writes_nothing_triage_reads(tmp_path):
    """Case 001/002: the minimizer runs the script's backend in the compile arm's worker,
    which once shared a writable folder with the worker that renders the minimal script, and
    triage wrote the script there by path (through a link the backend planted: any host file,
    with triage's permissions), or failed on a folder the backend made first (no report). The
    backend's worker now only reads the values it is given, and triage writes the script it
    is sent into its own folder, by descriptor."""
    target = Path(f"/tmp/triage-test-canary-{uuid.uuid4().hex}")
    script = tmp_path / "repro.py"
    script.write_text(planting_script(target))
    try:
        code, report, _, output = run_triage(script, "cpu,cpu/compile", tmp_path, "--no-ablate", "--no-reference",
                                             "--minimal", str(tmp_path / "minimal.py"), "--quiet")
        assert not target.exists() and not target.is_symlink(), output[-2000:]
        assert report is not None and code == 0, output[-2000:]
        minimal = report.get("minimal") or {}
        assert minimal.get("verified") is True and minimal.get("ops") == ["aten.expm1"], (minimal, output[-2000:])
        assert (tmp_path / "minimal.py").is_file() and not (tmp_path / "minimal.py").is_symlink()
    finally:
        if target.exists() or target.is_symlink():
            target.unlink()


def test_a_long_printed_line_is_read_in_one_pass(monkeypatch):
    """Cases 050–052: 50,000 bracketed values in one printed line (an issue's output block,
    --reported, the script's own output). The next `tensor(` was searched for from every
    bracket, each search to the line's end (minutes); now once per `tensor(` passed."""
    from triage.reported import printed

    searches = []
    pattern = printed._TENSOR_START

    class Counting:
        def search(self, text, pos=0):
            searches.append(pos)
            return pattern.search(text, pos)

    monkeypatch.setattr(printed, "_TENSOR_START", Counting())
    spans = printed._bracketed("tensor([1.5, 2.5]) " + "[0] " * 5000 + "tensor([3.5])")
    assert len(spans) == 5002 and spans[0][2] == spans[-1][2] == "tensor"
    assert len(searches) <= 3, len(searches)


def test_a_reporter_s_output_of_thousands_of_values_keeps_the_first_and_says_so():
    """Every value of such a line was kept with its whole line (a 30 MB report), and each
    one's line was re-read whole (`_shown`, the device it names): the first
    MAX_REPORTED_VALUES are lined up, the source says how many there were."""
    from triage.model import ArmRun
    from triage.reported import MAX_REPORTED_VALUES, SHOWN_CHARS, _shown, judge_reported

    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok", observables=[], leaves=[], conditioning=[],
                 exception=None, failure=None, stdout="[0] " * 3000)
    reported = judge_reported(run, "GPU: " + "[0] " * 3000, "the issue body", "cuda", "GPU named", {})
    assert len(reported.values) == MAX_REPORTED_VALUES
    assert reported.source == f"the issue body (its first {MAX_REPORTED_VALUES:,} of 3,000 printed values)"
    assert all(len(v.record) <= SHOWN_CHARS and v.device == "cuda" for v in reported.values)
    for text in ("a  b\n c", "x" * 500, " ".join(["ab"] * 200), ""):
        words = " ".join(text.split())
        assert _shown(text) == (words if len(words) <= SHOWN_CHARS else words[:SHOWN_CHARS - 1] + "…")


def test_a_fifo_given_as_reported_output_is_refused_not_waited_on(tmp_path):
    """Case 053: --reported naming a FIFO with no writer hung triage before any arm ran."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "reported"
    os.mkfifo(fifo)
    script = tmp_path / "repro.py"
    script.write_text("print(1)\n")
    done = subprocess.run([sys.executable, "-m", "triage", "run", str(script), "--reported", str(fifo), "--arms", "cpu"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr[-1000:]


def test_json_an_arm_wrote_is_refused_past_its_value_budget_before_it_is_parsed(tmp_path):
    """Case 031: a result.json of 20 million empty lists (64 MiB) was parsed whole (2.8 GiB in
    triage's own process) before its shape was checked; its values are counted in the bytes."""
    from triage.untrusted import MAX_JSON_VALUES, UntrustedOutput, json_values, read_json

    flood = tmp_path / "result.json"
    flood.write_bytes(b"[" + b"[]," * MAX_JSON_VALUES + b"[]]")
    with pytest.raises(UntrustedOutput, match="holds more than"):
        read_json(flood, 64 << 20)
    assert json_values(b'{"a": [1, 2, {"b": []}]}') >= 6
    small = tmp_path / "small.json"
    small.write_text('{"observables": [[], [1, 2]]}')
    assert read_json(small, 1 << 20) == {"observables": [[], [1, 2]]}


def test_the_control_pipe_keeps_a_bounded_number_of_values(monkeypatch):
    """Case 030: 64 MiB of small JSON objects on the control pipe were all kept (1.6 GiB in
    triage's own process); past MAX_CONTROL_VALUES, lines are read and dropped."""
    import os
    import time

    from triage.sandbox import process

    monkeypatch.setattr(process, "MAX_CONTROL_VALUES", 100)
    read, write = os.pipe()
    channel = process.ControlChannel(read, process.Limits(timeout_s=60, memory_bytes=1 << 30, output_bytes=1 << 20),
                                     time.monotonic(), None)
    with os.fdopen(write, "wb") as f:
        for _ in range(10):
            f.write(b'{"x": [' + b"[]," * 9 + b'[]]}\n')  # 22 values by the bytes' count
    channel.thread.join(10)
    assert [len(m["x"]) for m in channel.messages] == [10] * 4
