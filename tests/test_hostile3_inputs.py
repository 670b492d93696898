"""Hostile inputs of review 3 (findings 8, 10, 11, 13 and the torch-release note): each the
function at fault, checked directly, plus two end-to-end `triage run`s where only the whole
CLI shows it (a FIFO named as the script; a meta tensor in a script).

- 031/030: the script path is read without bounds (a FIFO blocks, /dev/zero is read until memory
  runs out, a symlink loop is a traceback): `extract.read_script`.
- 043: a fence inside an HTML comment, which GitHub does not show, was run: `extract._blocks`.
- 023/021/052: a meta tensor, or more leaves than result.json holds, cost the arm:
  `worker.fingerprint.readable_fingerprint`, `worker.session._kept` (and, found beside them,
  names of more than 300 characters: `worker.observe._fitted`, `worker.session._shortened`).
- 035: a forged triage-env.json sent triage's .pth file outside the cache: `torch_envs._environment`.
- 038: a results-store row whose report is not JSON was a traceback: `ResultStore._result`.
- 034: `cpu@٢.١٣.٠` passed the version check (Python's \\d is Unicode): `arms.torch_release`.
"""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_hostile_regressions import triage_run
from triage import extract
from triage.arms.spec import ArmSpecError, parse_arm, torch_release
from triage.extract import MAX_SOURCE_BYTES, ScriptUnreadable, extract_issue_body, extract_repro, read_script
from triage.sandbox import torch_envs
from triage.sandbox.torch_envs import TorchEnvError
from triage.sweep.model import ItemResult
from triage.sweep.store import ResultStore
from triage.worker.limits import MAX_LEAVES

DATA = ROOT / "tests" / "data" / "hostile3"


def within(seconds: float, call, *args):
    """`call(*args)`, failing (not hanging the suite) when it takes longer than `seconds`."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = call(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call.__name__} blocked for more than {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


# == 031/030: the script path ==================================================================
def test_a_fifo_as_the_script_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.py"
    os.mkfifo(fifo)  # no writer: open() without O_NONBLOCK would wait for ever
    repro = within(10, extract_repro, str(fifo))
    assert repro.problem == (f"{fifo} is a FIFO (named pipe), not a regular file; triage reads the script from a "
                             "regular file")
    from triage.cli import _source  # what chooses the default arms reads the script too

    assert within(10, _source, str(fifo)) is None


@pytest.mark.parametrize("device, kind", [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_a_device_as_the_script_is_refused_unread(device, kind):
    assert extract_repro(device).problem == f"{device} is {kind}, not a regular file; triage reads the script " \
                                           "from a regular file"


def test_symlinks_a_loop_and_a_dangling_one(tmp_path):
    real = tmp_path / "real.py"
    real.write_text("import torch\nprint(torch.ones(2))\n")
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "link.py").symlink_to(real)
    (tmp_path / "loop.py").symlink_to(tmp_path / "loop.py")
    (tmp_path / "dangling.py").symlink_to(tmp_path / "nowhere.py")
    linked = extract_repro(tmp_path / "links" / "link.py")
    assert linked.problem is None and linked.path == str(real) and linked.name == "link.py"
    assert extract_repro(tmp_path / "loop.py").problem == f"{tmp_path / 'loop.py'} is a symlink loop (it never " \
                                                          "reaches a file)"
    assert extract_repro(tmp_path / "dangling.py").problem == (
        f"no such file: {tmp_path / 'dangling.py'} (a symlink to {str(tmp_path / 'nowhere.py')!r}, which does not "
        "exist)")
    assert extract_repro(tmp_path / "links").problem == f"{tmp_path / 'links'} is a directory, not a Python script"


def test_an_oversized_script_is_refused_before_it_is_read(tmp_path, monkeypatch):
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(MAX_SOURCE_BYTES + 1)  # sparse: nothing to read, only its size says no
    with monkeypatch.context() as m:
        m.setattr(extract.os, "read", lambda *a: pytest.fail("read a file its size refuses"))
        problem = extract_repro(big).problem
    assert problem == f"{big} is {MAX_SOURCE_BYTES + 1} bytes; a repro script is expected to be under " \
                      f"{MAX_SOURCE_BYTES >> 20} MiB"


def _stat_says_regular(monkeypatch, target: Path, size: int) -> None:
    """os.stat reports `target` as a small regular file: what a name swapped between triage's
    stat and its open looks like."""
    real_stat = os.stat
    regular = real_stat(__file__)

    def fake(path, *args, **kwargs):
        if os.fspath(path) == os.fspath(target):
            return os.stat_result((regular.st_mode, *tuple(regular)[1:6], size, *tuple(regular)[7:10]))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(extract.os, "stat", fake)


def test_what_is_opened_is_checked_again_and_read_within_the_cap(tmp_path, monkeypatch):
    fifo = tmp_path / "swapped.py"
    os.mkfifo(fifo)
    _stat_says_regular(monkeypatch, fifo, 10)
    with pytest.raises(ScriptUnreadable, match="is a FIFO"):  # O_NONBLOCK: the open returns; fstat refuses
        within(10, read_script, fifo)
    grown = tmp_path / "grown.py"
    grown.write_bytes(b"x = 1\n" * 100)
    _stat_says_regular(monkeypatch, grown, 10)
    with pytest.raises(ScriptUnreadable, match="is more than 64 bytes"):
        read_script(grown, max_bytes=64)


@pytest.mark.slow
def test_a_fifo_named_to_triage_run_is_a_could_not_run_report(tmp_path):
    os.mkfifo(tmp_path / "fifo.py")
    run = triage_run(tmp_path, None, name="fifo.py")  # no traceback, the report validates
    assert run.code == 3 and run.seconds < 60, run.output
    assert run.report["verdict"]["kind"] == "could-not-run" and run.report["arms"] == []
    assert run.report["repro"]["problem"].endswith("fifo.py is a FIFO (named pipe), not a regular file; triage "
                                                   "reads the script from a regular file")


# == 043: HTML comments in an issue body =======================================================
SHOWN = "```python\nimport torch\nprint(torch.ones(2) * 3)\n```\n"
HIDDEN = "```python\nimport torch\nHIDDEN = 1\nprint(torch.ones(2) * HIDDEN)\n```\n"


def test_the_review_body_runs_only_its_visible_fence():
    found = extract_issue_body((DATA / "043-body-hidden-html-comment.md").read_text())
    assert found.problem is None and "HIDDEN" not in found.script
    assert found.script == "import torch\nx = torch.linspace(1, 2, 8)\nprint(torch.exp(x))"


@pytest.mark.parametrize("body", [
    f"Bug:\n\n{SHOWN}\n<!--\n{HIDDEN}-->\n",                       # a multi-line comment around a fence
    f"Bug:\n\n{SHOWN}\n<!-- note\n\n{HIDDEN}\nstill hidden -->\n",  # a blank line does not end it (type 2)
    f"Bug:\n{SHOWN}text right above\n<!--\n{HIDDEN}-->\n",          # it interrupts a paragraph
    f"> quoted\n> <!--\n> {HIDDEN.replace(chr(10), chr(10) + '> ')}-->\n\n{SHOWN}",  # inside a blockquote
    f"{SHOWN}\n<!-- unterminated: GitHub hides the rest of the document\n\n{HIDDEN}",
    f"   <!-- three spaces still start one -->\n{SHOWN}<!--\n{HIDDEN}-->",
], ids=["multi-line", "blank-line", "after-paragraph", "blockquote", "unterminated", "indented"])
def test_a_fence_inside_an_html_comment_is_not_run(body):
    found = extract_issue_body(body)
    assert found.problem is None and found.script == "import torch\nprint(torch.ones(2) * 3)", found.script


def test_comment_markers_in_code_stay_code():
    in_fence = "```python\nimport torch\nx = '<!--'\nprint(torch.ones(2), x)\n```\n\nsee `<!--` above\n"
    assert extract_issue_body(in_fence).script == "import torch\nx = '<!--'\nprint(torch.ones(2), x)"
    # Four spaces of indent make an indented code block, not an HTML block.
    indented = "Repro:\n\n    import torch\n    <!--\n    print(torch.ones(2))\n"
    assert "<!--" in "\n".join(b.text for b in extract._blocks(indented))
    # A fence after the closing line is shown, and run.
    after = f"<!-- a template hint -->\n{SHOWN}"
    assert extract_issue_body(after).script == "import torch\nprint(torch.ones(2) * 3)"


@pytest.mark.parametrize("body", [
    "<!--\n```python\nx\n```\n-->\nafter\n", "a\n<!-- b\nc\n\nd --> e\nf\n", "<!--\nnever closed\n\nstill\n",
    "- item\n  <!--\n  ```python\n  x\n  ```\n  -->\n- next\n", "> <!--\n> x\ny -->\n",
])
def test_comments_are_found_where_commonmark_finds_html_block_type_2(body):
    """The same line ranges as markdown-it's own (CommonMark) HTML-block rule, on bodies whose
    only HTML is comments."""
    from markdown_it import MarkdownIt

    ours = [t.map for t in extract._markdown().parse(body) if t.type == "html_comment"]
    spec = [t.map for t in MarkdownIt("commonmark").parse(body) if t.type == "html_block"]
    assert ours == spec and ours


# == 023/021/052: values the worker cannot read, and too many leaves ===========================
def test_a_meta_tensor_has_no_fingerprint_and_a_note():
    import torch

    from triage.worker.fingerprint import readable_fingerprint, to_numpy

    fp, note = readable_fingerprint(torch.ones(3, device="meta") * 2)
    assert fp is None and note == "a meta tensor: it has a shape and a dtype but no data to compare"
    assert to_numpy(torch.ones(3, device="meta")) is None

    class Unreadable(torch.Tensor):
        def detach(self):  # noqa: ANN201
            raise KeyError("no")

    odd = torch.ones(2).as_subclass(Unreadable)
    assert readable_fingerprint(odd) == (None, "cannot be read (KeyError)")
    assert readable_fingerprint(torch.ones(2))[0]["sample"] == [1.0, 1.0]


def test_kept_entries_prefer_what_the_observed_values_read():
    from triage.worker.session import _kept

    assert _kept(3, [[0, 2]], 5) == {0: 0, 1: 1, 2: 2}
    # 10 entries, room for 4: the read ones (8, 9) first, then the earliest (0, 1), renumbered in order.
    assert _kept(10, [[9], [8, 9]], 4) == {0: 0, 1: 1, 8: 2, 9: 3}
    assert _kept(10, [list(range(10))], 3) == {0: 0, 1: 1, 2: 2}


WORKER = """
import json, sys
from pathlib import Path
from triage.worker import session
session.MAX_LEAVES, session.MAX_CONDITIONING = 5, 2  # the real limits, scaled down
job = json.loads(sys.argv[1])
session.write_result(session.run_job(job, lambda message: None), Path(job["result_dir"]))
"""


def run_worker(tmp_path: Path, source: str) -> dict:
    """The worker's own run_job on `source` (in a subprocess, without the sandbox), and its
    result.json as the parent reads it: `read_result` raises where the parent would crash the arm."""
    from triage.arms.output import read_result

    script = tmp_path / "script.py"
    script.write_text(source)
    out = tmp_path / "out"
    out.mkdir()
    job = {"script": str(script), "script_args": [], "seed": 0, "collect_env": None, "collect_env_timeout": 0,
           "arm": {"spec": "cpu", "device": "cpu", "mode": "eager", "backend": None, "knobs": {}},
           "reference": True, "reference_budget_s": 30, "value_budget": 1 << 20, "max_leaf_bytes": 1 << 30,
           "export_graph": False, "rounding": None, "result_dir": str(out)}
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(job)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return read_result(out / "result.json", script_started=True)
SCRIPT = """
import torch
small = [torch.tensor([float(i)]) for i in range(20)]   # 20 leaves, more than the 5 kept
for i in range(4):                                      # 4 conditioning notes, more than the 2 kept
    torch.linalg.inv(torch.eye(2) * (i + 2))
meta = torch.ones(3, device="meta") * 2                 # no data to read
print(meta)
late = torch.full((2,), 7.0)                            # the 22nd leaf, read by the printed value
print(late * 3)
"""


def test_the_worker_keeps_its_arm_within_the_parents_limits(tmp_path):
    """The worker's own run_job (its limits scaled down) on a script with a meta tensor, more
    leaves and conditioning notes than it keeps: result.json passes the parent's checks, the
    printed values are kept, the leaf they read among those kept, and the counts left out said."""
    from triage.model import ArmRun
    from triage.pipeline import _left_out_note

    result = run_worker(tmp_path, SCRIPT)
    assert result["status"] == "ok"
    assert len(result["leaves"]) == 5 and result["graph"]["leaves"] > 20
    assert result["left_out"] == {"leaves": result["graph"]["leaves"] - 5, "conditioning": 2}
    assert len(result["conditioning"]) == 2
    by_label = {o["label"]: o for o in result["observables"]}
    meta = by_label["print/repr (no values: a meta tensor: it has a shape and a dtype but no data to compare)"]
    assert meta["fingerprint"] is None
    printed = next(o for o in result["observables"] if o["fingerprint"] and o["fingerprint"]["sample"] == [21.0, 21.0])
    read = [result["leaves"][i] for i in printed["ancestors"]]
    assert [leaf["fingerprint"]["sample"] for leaf in read] == [[7.0, 7.0]]  # the late leaf was kept
    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok", left_out=result["left_out"])
    assert _left_out_note(run.spec, run.left_out) == (
        f"`cpu`: the script created more than triage records per arm; left out {result['left_out']['leaves']} of "
        f"its recorded leaf tensors (it keeps {MAX_LEAVES}: those the observed values read first, then the earliest) "
        "and 2 conditioning notes (it keeps 100000). Its observed values are kept and compared.")



def test_a_graph_of_more_leaves_than_the_minimizer_takes_is_not_exported(tmp_path, monkeypatch):
    """A loop of 100,001 `torch.tensor([x])` spent 13 s of the 30 s after its script saving
    every leaf for the minimizer, and under load lost its result to the deadline: past
    MAX_EXPORTED_LEAVES the graph is not exported, and the reason is the export's status."""
    import torch

    from triage.worker import graphio
    from triage.worker.opgraph import OpRecorder

    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        total = sum(torch.tensor([float(i)]) for i in range(8))
    graph = recorder.finish().graph
    assert total.item() == 28.0
    monkeypatch.setattr(graphio, "MAX_EXPORTED_LEAVES", 5)
    assert graphio.export_graph(graph, tmp_path / "small") == ("the script made 8 leaf tensors; the minimizer takes "
                                                                  "graphs of up to 5")
    assert not (tmp_path / "small").exists()
    monkeypatch.setattr(graphio, "MAX_EXPORTED_LEAVES", 8)
    assert graphio.export_graph(graph, tmp_path / "fits") is None and (tmp_path / "fits" / "graph.json").exists()


LONG = "N" + "x" * 400
NAMES = f"""
import torch
class {LONG}(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = type("{LONG}Drop", (torch.nn.Dropout,), {{}})(0.5)
    def forward(self, x):
        return self.drop(x) * 0 + x * 2
{LONG.lower()} = {LONG}()
print({LONG.lower()}(torch.ones(2)))
class {LONG}Error(Exception):
    pass
raise {LONG}Error("the script's own error")
"""


def test_names_the_script_chooses_at_any_length_do_not_cost_the_arm(tmp_path):
    """A module class, its variable, a layer and an exception class named with 400 characters:
    result.json stays within the parent's limits (each field shortened, or no name to paste)."""
    result = run_worker(tmp_path, NAMES)
    assert result["status"] == "raised" and result["exception"]["message"] == "the script's own error"
    assert len(result["exception"]["type"]) == 300 and result["exception"]["type"].endswith("…")
    call = next(o for o in result["observables"] if o["kind"] == "call")
    assert len(call["label"]) == 300 and call["label"].startswith(LONG[:50]) and call["label"].endswith("…")
    assert call["module"]["variable"] is None
    assert [len(layer["type"]) for layer in call["module"]["train_layers"]] == [300]


@pytest.mark.slow
def test_a_script_with_a_meta_tensor_keeps_its_arm(tmp_path):
    run = triage_run(tmp_path, (DATA / "023-weird-dtypes.py").read_text())
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    notes = [o["label"] for o in run.report["observables"] if o["fingerprint"] is None]
    assert "print/repr (no values: a meta tensor: it has a shape and a dtype but no data to compare)" in notes
    assert sum(o["fingerprint"] is not None for o in run.report["observables"]) >= 10  # the others are kept


# == 035: a forged torch environment record ====================================================
def _forged_env(cache: Path, marker: object, python: bool = True) -> Path:
    folder = cache / "torch-envs" / "2.13.0"
    (folder / "lib" / "site-packages").mkdir(parents=True)
    if python:
        (folder / "bin").mkdir()
        (folder / "bin" / "python").write_text("#!/bin/sh\n")
        (folder / "bin" / "python").chmod(0o755)
    (folder / torch_envs.MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    return folder


@pytest.mark.parametrize("marker, python", [
    ({"purelib": "../../../outside", "build": "2.13.0 (forged)"}, True),    # out of the cache
    ({"purelib": "lib/../../../outside", "build": "2.13.0"}, True),          # out, through the folder
    ({"purelib": "/tmp", "build": "2.13.0"}, True),                          # absolute
    ({"purelib": "lib/missing", "build": "2.13.0"}, True),                   # not there
    ({"purelib": "lib/site-packages", "build": "2.13.0\n<b>x</b>"}, True),   # not a label
    ({"purelib": "lib/site-packages", "build": "2.13.0"}, False),            # no interpreter
    ("[1, 2]", True),
    ("{" * 100000, True),
])
def test_a_forged_environment_record_is_built_again_never_followed(tmp_path, monkeypatch, marker, python):
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = _forged_env(tmp_path / "cache", marker, python)
    assert torch_envs._environment(folder) is None

    def build(folder, version, log):
        raise TorchEnvError("pip install torch==2.13.0 failed: (no index in this test)")

    monkeypatch.setattr(torch_envs, "_build", build)
    lines: list[str] = []
    with pytest.raises(TorchEnvError, match="pip install torch==2.13.0 failed"):
        torch_envs.torch_env("2.13.0", str(tmp_path / "cache"), log=lines.append)
    assert lines == [f"the environment of torch 2.13.0 in {folder} is not a finished build triage can use (its "
                     f"{torch_envs.MARKER} is missing, unreadable or names paths outside it); building it again"]
    assert list(outside.iterdir()) == []


def test_a_sound_environment_record_is_used(tmp_path):
    folder = _forged_env(tmp_path, {"purelib": "lib/./site-packages", "build": "2.13.0 (git 0123abcd)"})
    assert torch_envs._environment(folder)["purelib"] == "lib/site-packages"
    (folder / "lib" / "site-packages").rmdir()
    (folder / "lib" / "site-packages").symlink_to(tmp_path)  # inside by name, outside once followed
    assert torch_envs._environment(folder) is None


# == 038: a results-store row that is not JSON =================================================
def _result(key: str) -> ItemResult:
    return ItemResult(key=key, kind="script", title=key, content_sha256="0" * 64, torch_build="2.13.0+cpu",
                      arms="cpu", outcome="triaged", verdict_kind="not-reproduced", expected=True, summary="same",
                      report={"verdict": {"kind": "not-reproduced"}}, extra={"n": 1})


def test_a_row_whose_report_is_not_json_is_read_as_failed_the_others_kept(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultStore(path) as store:
        store.put(_result("bad.py"))
        store.put(_result("good.py"))
    con = sqlite3.connect(path)
    row = con.execute("SELECT id FROM results WHERE key = 'bad.py'").fetchone()[0]
    con.execute("UPDATE results SET report = '{not json' WHERE id = ?", (row,))
    con.execute("UPDATE results SET extra = '[1]' WHERE key = 'good.py'")
    con.commit()
    con.close()
    with ResultStore(path, readonly=True) as store:
        results = {r.key: r for r in store.results()}
        assert store.get("bad.py", "0" * 64, "2.13.0+cpu", "cpu") == results["bad.py"]
        assert store.latest("bad.py") == [results["bad.py"]]
    bad = results["bad.py"]
    assert (bad.outcome, bad.report, bad.verdict_kind, bad.summary) == ("failed", None, None, "same")
    assert bad.error == (f"the stored result cannot be read: row {row} of the results store: its report column is "
                         "not a JSON object (Expecting property name enclosed in double quotes: line 1 column 2 "
                         f"(char 1)). Delete the row (DELETE FROM results WHERE id = {row}) to run the item again.")
    good = results["good.py"]  # its report is kept; only its extra is unreadable
    assert good.outcome == "failed" and good.report == {"verdict": {"kind": "not-reproduced"}} and good.extra == {}
    assert "its extra column is not a JSON object (a JSON list, not an object)" in good.error


# == 034: torch release names ==================================================================
@pytest.mark.parametrize("text, says", [
    ("\u0662.\u0661\u0663.\u0660", "it holds '\u0662' (U+0662); a version is written in ASCII digits"),
    ("\uff12.\uff11\uff13.\uff10", "it holds '\uff12' (U+FF12)"),
    ("2.13.\u00b2", "it holds '\u00b2' (U+00B2)"),
    ("99999999999999999999.0", "the number 99999999999999999999 is longer than the 4 digits"),
    ("9" * 5000 + ".0", "the number 999999999999999999999999… is longer than the 4 digits"),
    ("2.13.0.dev123456789", "the number 123456789 is longer than the 8 digits"),
    ("2.13.0 --index-url=http://127.0.0.1:9/", "is not a torch release version (e.g. 2.15.0)"),
])
def test_release_names_are_ascii_and_bounded(text, says):
    with pytest.raises(TorchEnvError, match="is not a torch release version") as refused:
        torch_release(text)
    assert says in str(refused.value)
    with pytest.raises(ArmSpecError, match="is not a torch release version"):
        parse_arm(f"cpu@{text}")


@pytest.mark.parametrize("text", ["2.13.0", "2.16.0rc1", "2.7.0.dev20250310+cpu", "\u200b2.15.0", "2.14.1+cu128"])
def test_real_release_names_still_pass(text):
    assert torch_release(text) == text.lstrip("\u200b")


@pytest.mark.parametrize("arm, says", [("cuda:\u0662", "unknown device 'cuda:\u0662'"),
                                       ("cpu/threads=\u00b2", "threads must be a positive integer"),
                                       ("cpu/threads=\u0662", "threads must be a positive integer"),
                                       ("cpu/threads=123456", "threads must be a positive integer")])
def test_other_numbers_in_arm_specs_are_ascii(arm, says):
    with pytest.raises(ArmSpecError, match=says):
        parse_arm(arm)


def test_sweep_torch_refuses_unicode_digits_and_leaves_no_lock(tmp_path):
    cache, arabic = tmp_path / "cache", "\u0662.\u0661\u0663.\u0660"
    done = subprocess.run([sys.executable, "-m", "triage", "sweep", str(tmp_path), "--torch", arabic],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TRIAGE_CACHE_DIR=str(cache)))
    assert done.returncode == 2 and f"--torch: '{arabic}' is not a torch release version" in done.stderr
    assert "Traceback" not in done.stderr and not (cache / "torch-envs").exists()



@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_small_values_are_fingerprinted_from_python_floats_as_from_tensor_ops(monkeypatch, dtype):
    # 052: 100,001 one-element leaves, each fingerprinted after the script (20 s of tensor ops).
    import math

    import torch

    from triage.worker import fingerprint as fingerprints

    g = torch.Generator().manual_seed(11)
    for n in (1, 2, 7, 64):
        for specials in ([], [math.nan], [math.inf, -math.inf, math.nan], [0.0, -0.0]):
            t = (torch.randn(n, generator=g, dtype=torch.float64) * 100).to(getattr(torch, dtype))
            t[:len(specials)] = torch.tensor(specials[:n], dtype=torch.float64).to(t.dtype)
            small = fingerprints.fingerprint(t)
            monkeypatch.setattr(fingerprints, "SMALL_VALUE", 0)
            ops = fingerprints.fingerprint(t)
            monkeypatch.undo()
            norm, ops_norm = small.pop("norm"), ops.pop("norm")
            assert small == ops
            assert (norm is None) == (ops_norm is None) and (norm is None or math.isclose(norm, ops_norm, rel_tol=1e-14))
