"""The parent trusts nothing an arm writes (issue 16, item 3).

The script runs in the worker's interpreter, so result.json, values.npz, the op graph, the
control messages and anything in the arm's (or the warm worker's) directory are the script's
to forge.  Fast tests inject forged outputs at the boundary — `triage.arms.run.run_isolated` is
replaced by a stand-in that writes them into the arm's `out/` and returns the messages — and
run the real CLI in-process; every outcome must be a report that validates, exit status 0 or
3, bounded memory and time, and no temp directory left.  Tests named `test_case_NNN_…` are the
cases of the hostile-input findings; the slow ones run hostile scripts end to end.
"""
from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import os
import resource
import stat
import struct
import tempfile
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, run_triage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.arms.graph import OpGraph
from triage.arms.output import reply_problem
from triage.cli import main
from triage.report.data import validate_report
from triage.sandbox import ProcessOutcome
from triage.untrusted import UntrustedOutput, load_npz, read_json, remove_tree
from triage.worker.wire import WireError, receive, send

SCRIPT = "import torch\nx = torch.linspace(1, 2, 4)\ny = torch.exp(x)\nprint(y.sum().item())\n"
STARTED = [{"phase": "imported", "torch": "2.x"}, {"phase": "script-start"}]
FINISHED = STARTED + [{"phase": "script-done", "status": "ok"}, {"phase": "done"}]
RSS_GROWTH_BOUND = 300 << 20  # triage's own peak RSS over a whole fuzz run
EXAMPLE_SECONDS = 10.0


# -- a hand-made arm output, shaped as triage/worker/session.py writes it ----------------------
def _fingerprint(a: np.ndarray, dtype: str) -> dict[str, Any]:
    wide = a.astype(np.float64).reshape(-1)
    finite = wide[np.isfinite(wide)]
    return {"shape": list(a.shape), "dtype": dtype, "numel": int(a.size),
            "sha256": hashlib.sha256(a.tobytes()).hexdigest()[:24], "nan": int(np.isnan(wide).sum()),
            "posinf": int(np.isposinf(wide).sum()), "neginf": int(np.isneginf(wide).sum()),
            "min": float(finite.min()), "max": float(finite.max()), "norm": float(np.linalg.norm(finite)),
            "sample": [float(v) for v in wide[:6]]}


def valid_output() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(result, values) of a completed arm: two observed values, one with its float64 reference
    and rounding spread, a leaf, a conditioning note, a module call and a claim."""
    y = np.exp(np.linspace(1, 2, 4, dtype=np.float32))
    ref = np.exp(np.linspace(1, 2, 4, dtype=np.float64))
    total = np.float32(y.sum()).reshape(())
    leaf = np.linspace(1, 2, 4, dtype=np.float32)
    observables = [
        {"index": 0, "kind": "call", "label": "Linear() call #1", "line": 3, "fingerprint": _fingerprint(y, "float32"),
         "node": "exp_default", "claim": None,
         "module": {"instance": 0, "variable": "model", "training": False, "train_layers": [],
                    "inputs": ["ab12"], "weights_version": 0,
                    "settings": {"num_threads": 2, "default_dtype": "float32"}},
         "ancestors": [0], "conditioning": [0],
         "reference": {"fingerprint": _fingerprint(ref, "float64"), "note": None, "approximate": False},
         "rounding": {"status": "judged", "reason": None, "samples": 9, "sample_stats": [0.5] * 9, "flips": [],
                      "cancellations": [{"node": "exp_default", "op": "aten.exp", "line": 3, "digits_lost": 1.5,
                                         "hint": None}], "precision": "float32"}},
        {"index": 1, "kind": "readback", "label": ".item()", "line": 4, "fingerprint": _fingerprint(total, "float32"),
         "node": "sum_default", "claim": {"id": 0, "func": "allclose", "operand": 0, "holds": True}, "module": None,
         "ancestors": [0], "conditioning": [],
         "reference": {"fingerprint": None, "note": "not replayed", "approximate": False}, "rounding": None},
    ]
    result = {
        "torch_import_s": 0.7, "environment": None, "environment_error": None,
        "flags_start": {"torch": "2.x", "num_threads": 2, "deterministic_algorithms": False},
        "elapsed_s": 0.01, "flags_end": {"torch": "2.x", "num_threads": 2, "deterministic_algorithms": False},
        "rounding": {"seconds": 0.1, "samples": 9, "note": None},
        "status": "ok", "exception": None, "exit_note": None, "observables": observables,
        "observables_truncated": False,
        "leaves": [{"index": 0, "node": "leaf0", "kind": "data", "op": "linspace", "line": 2,
                    "fingerprint": _fingerprint(leaf, "float32"), "seed": None, "call_line": 2}],
        "conditioning": [{"op": "exp", "shape": [4], "dtype": "float32", "eps": 1.2e-07, "singular": False,
                          "ill_conditioned": False, "cond": 2.0, "rank": None, "order": None, "kind": "growth",
                          "figure": "exp grows", "node": "exp_default", "line": 3}],
        "graph": {"nodes": 3, "leaves": 1, "compiled_graphs": 0, "stopped": None, "dtypes": ["float32"],
                  "export": "ok"},
        "reference": {"status": "partial", "seconds": 0.001, "note": None, "approximate_ops": []},
        "random_before_seed": None, "compiled_random_ops": [],
    }
    values = {"obs0": y, "ref0": ref, "obs1": total,
              **{f"{k}0": np.full(4, 1e-6) for k in ("sig", "up", "dn", "mu", "sd")},
              "nf0": np.ones(4, dtype=np.uint8)}
    values["mu0"], values["up0"], values["dn0"] = ref.copy(), ref * (1 + 1e-7), ref * (1 - 1e-7)
    return result, values


def npz_bytes(values: dict[str, np.ndarray], compressed: bool = False) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **values)
    return buffer.getvalue()


def graph_doc() -> dict[str, Any]:
    return {"format": "triage.opgraph/1", "nodes": [
        {"name": "leaf0", "op": "leaf", "kind": "data", "source": "linspace", "shape": [4], "dtype": "float32",
         "line": 2},
        {"name": "exp_default", "op": "call", "target": "aten.exp.default", "args": [{"node": "leaf0"}],
         "kwargs": {"dict": {}}, "dtype": "float32", "line": 3},
        {"name": "sum_default", "op": "call", "target": "aten.sum.default", "args": [{"node": "exp_default"}],
         "kwargs": {"dict": {}}, "dtype": "float32", "line": 4},
    ]}


# -- injecting outputs at the boundary ------------------------------------------------------
Content = bytes | str | Callable[[Path], None]


def arm_files(result: Any = None, values: dict[str, np.ndarray] | None = None,
              extra: dict[str, Content] | None = None) -> dict[str, Content]:
    """What the worker leaves in `out/`: result.json (a document, or its raw content), values.npz
    and any other file by its path there."""
    files: dict[str, Content] = {}
    if result is not None:
        files["result.json"] = result if isinstance(result, (bytes, str)) or callable(result) else json.dumps(result)
    if values is not None:
        files["values.npz"] = npz_bytes(values)
    files.update(extra or {})
    return files


def write_files(out: Path, files: dict[str, Content]) -> None:
    for name, content in files.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if callable(content):
            content(path)
        else:
            path.write_bytes(content.encode() if isinstance(content, str) else content)


def outcome(messages: list[dict[str, Any]], exit_code: int | None = 0, signal: str | None = None) -> ProcessOutcome:
    return ProcessOutcome(exit_code=exit_code, signal=signal, timed_out=False, memory_exceeded=False, elapsed_s=0.1,
                          stdout="", stderr="", output_dropped=0, messages=messages, peak_rss_bytes=0)


@pytest.fixture
def arms_write(monkeypatch, tmp_path):
    """`arms_write(per_spec)`: from now on each arm's worker "leaves" what `per_spec[spec]`
    says, a (files, messages, exit_code, signal) tuple, instead of running.  Temp directories
    go to a private folder, which `leftovers()` lists."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("triage.arms.run.collect_environment", lambda *a, **k: ("PyTorch version: test", None))
    launched: list[str] = []

    def install(per_spec: dict[str, tuple]) -> list[str]:
        def fake_run_isolated(argv: list[str], **_: Any) -> ProcessOutcome:
            job_file = Path(next(a for a in argv if a.endswith("job.json")))
            spec = json.loads(job_file.read_text())["arm"]["spec"]
            launched.append(spec)
            files, messages, exit_code, signal = per_spec[spec]
            write_files(job_file.parent, files)
            return outcome(messages, exit_code, signal)

        monkeypatch.setattr("triage.arms.run.run_isolated", fake_run_isolated)
        return launched

    install.leftovers = lambda: sorted(p.name for p in temp.iterdir())
    return install


def run_cli(folder: Path, arms: str = "cpu", *extra: str) -> tuple[int, dict[str, Any] | None, str]:
    """`triage run` in-process; (exit status, report.json's data, output)."""
    script = folder / "repro.py"
    script.write_text(SCRIPT)
    report = folder / "report.json"
    args = ["run", str(script), "--arms", arms, "--json", str(report), "--comment", str(folder / "comment.md"),
            "--minimal", "-", "--no-ablate", "--quiet", *extra]
    if "--minimize" not in extra:
        args.append("--no-minimize")
    result = CliRunner().invoke(main, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, json.loads(report.read_text()) if report.exists() else None, result.output


def crashed_arm(folder: Path, arms_write: Any, files: dict[str, Content], messages: list[dict[str, Any]] = FINISHED,
                exit_code: int | None = 0, signal: str | None = None) -> dict[str, Any]:
    """Run one `cpu` arm leaving `files`; the arm's report entry, once the report has been
    checked to be whole (it validates, exit status 3) and the temp folders gone."""
    arms_write({"cpu": (files, messages, exit_code, signal)})
    code, data, output = run_cli(folder)
    assert data is not None and validate_report(data) == [], output
    assert code == 3, output
    assert arms_write.leftovers() == []
    (arm,) = data["arms"]
    assert arm["status"] == "crashed"
    assert "bug in triage" not in arm["failure"]
    return arm


# -- the safe readers -------------------------------------------------------------------------
@pytest.mark.parametrize("make, says", [
    (lambda p: os.symlink("/dev/zero", p), "regular file"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: open(p, "wb").truncate(1 << 30), "more than"),
    (lambda p: p.write_text("[" * 100000 + "]" * 100000), "nested"),
    (lambda p: p.write_text("1" * 5000), "not valid JSON"),
])
def test_readers_refuse_links_fifos_folders_huge_and_deep_files_at_once(tmp_path, make, says):
    path = tmp_path / "result.json"
    make(path)
    started = time.monotonic()
    with pytest.raises(UntrustedOutput, match=says):
        read_json(path, 1 << 20)
    with pytest.raises(UntrustedOutput):
        load_npz(path, 1 << 20, 10)
    assert time.monotonic() - started < 2


def test_a_link_to_a_folder_is_not_followed(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "result.json").write_text("{}")
    os.symlink(tmp_path / "real", tmp_path / "out")
    with pytest.raises(UntrustedOutput, match="directory"):
        read_json(tmp_path / "out" / "result.json", 1 << 20)


def _bomb(path: Path, claimed: int = 1 << 27, inflated: int = 64 << 20) -> None:
    """An npz member whose header claims `claimed` float64s, `inflated` bytes of zeros
    deflated behind it (a few hundred KB on disk), written without allocating them."""
    header = {"descr": "<f8", "fortran_order": False, "shape": (claimed,)}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("obs0.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            zeros = bytes(1 << 20)
            for _ in range(inflated >> 20):
                member.write(zeros)


def test_npz_reader_checks_each_header_before_allocating(tmp_path):
    _bomb(tmp_path / "values.npz")
    assert os.path.getsize(tmp_path / "values.npz") < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(UntrustedOutput, match="more than the"):
            load_npz(tmp_path / "values.npz", 64 << 20, 10)
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("values, says", [
    ({"obs0": np.array([{"a": 1}], dtype=object)}, "object"),
    ({"obs0": np.array(["text"])}, "not a numeric"),
    ({"obs0": np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")])}, "not a numeric"),
    ({"obs0": np.array(["2020-01-01"], dtype="datetime64[D]")}, "not a numeric"),
])
def test_npz_reader_refuses_arrays_that_are_not_numbers(tmp_path, values, says):
    (tmp_path / "values.npz").write_bytes(npz_bytes(values))
    with pytest.raises(UntrustedOutput, match=says):
        load_npz(tmp_path / "values.npz", 1 << 20, 10)


def test_npz_reader_keeps_every_numeric_layout(tmp_path):
    values = {"obs0": np.arange(6, dtype=">f4").reshape(2, 3), "obs1": np.asfortranarray(np.ones((2, 3), np.complex64)),
              "obs2": np.array([True, False]), "obs3": np.float64(2.5).reshape(()), "obs4": np.zeros((0, 3), np.int8)}
    for compressed in (False, True):
        (tmp_path / "values.npz").write_bytes(npz_bytes(values, compressed))
        read = load_npz(tmp_path / "values.npz", 1 << 20, 10)
        assert read.keys() == values.keys()
        for key, value in values.items():
            assert read[key].dtype == value.dtype and np.array_equal(read[key], value)


def test_remove_tree_removes_fifos_links_and_read_only_folders(tmp_path):
    root = tmp_path / "arm"
    (root / "locked" / "deeper").mkdir(parents=True)
    (root / "locked" / "deeper" / "f").write_text("x")
    os.mkfifo(root / "fifo")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    os.symlink(outside, root / "link")
    os.chmod(root / "locked" / "deeper", 0)
    os.chmod(root / "locked", stat.S_IRUSR | stat.S_IXUSR)
    remove_tree(root)
    assert not root.exists()
    assert (outside / "keep").read_text() == "kept"


# -- one test per case of the findings --------------------------------------------------------
def test_case_026_blank_worker_error_then_exit_is_a_crashed_arm(tmp_path, arms_write):
    arm = crashed_arm(tmp_path, arms_write, {}, STARTED + [{"phase": "worker-error", "error": "   \n  "}], exit_code=1)
    assert "the script ended the process" in arm["failure"]


def test_case_027_worker_error_that_is_not_text_is_a_crashed_arm(tmp_path, arms_write):
    arm = crashed_arm(tmp_path, arms_write, {}, STARTED + [{"phase": "worker-error", "error": 12345}], exit_code=1)
    assert "status 1" in arm["failure"]


def test_case_u4_a_worker_error_after_the_script_started_is_reported_neutrally(tmp_path, arms_write):
    forged = STARTED + [{"phase": "worker-error", "error": "Traceback…\nRuntimeError: triage is broken"}]
    arm = crashed_arm(tmp_path, arms_write, {}, forged, exit_code=70)
    assert arm["failure"].startswith("the worker reported an error after the script had started")
    assert "RuntimeError: triage is broken" in arm["failure"]


def test_a_worker_error_after_the_script_finished_says_the_script_ran_to_its_end(tmp_path, arms_write):
    forged = FINISHED[:-1] + [{"phase": "worker-error", "error": "Traceback…\nAssertionError: Invalid device id"}]
    arm = crashed_arm(tmp_path, arms_write, {}, forged, exit_code=70)
    assert arm["failure"].startswith("the worker reported an error after the script had finished, while analysing")
    assert arm["failure"].endswith(": AssertionError: Invalid device id")


def test_case_u4_a_worker_error_before_the_script_started_is_triages(tmp_path, arms_write):
    arms_write({"cpu": ({}, [{"phase": "worker-error", "error": "Traceback…\nKeyError: 'arm'"}], 70, None)})
    code, data, output = run_cli(tmp_path)
    assert code == 3 and validate_report(data) == []
    assert data["arms"][0]["failure"] == ("triage's worker failed before the script started (a bug in triage): "
                                          "KeyError: 'arm'")


@pytest.mark.parametrize("text", ["{this is not json", "[1, 2, 3]", '{"hello": 1}', "", "\xff\xfe"])
def test_case_031_to_033_result_json_that_is_not_a_result_is_a_crashed_arm(tmp_path, arms_write, text):
    arm = crashed_arm(tmp_path, arms_write, arm_files(text))
    assert arm["failure"].startswith("the arm's output is not valid: result.json")


def test_case_034_wrong_typed_observables_and_exception_name_the_field(tmp_path, arms_write):
    result, values = valid_output()
    result["observables"][1]["label"] = ["not", "text"]
    arm = crashed_arm(tmp_path, arms_write, arm_files(result, values))
    assert arm["failure"] == "the arm's output is not valid: result.json: observables/1/label: a list, not a string"
    result, values = valid_output()
    result.update(status="raised", exception={"type": None, "message": 5})
    arm = crashed_arm(tmp_path, arms_write, arm_files(result, values))
    assert "exception/type: null, not a string" in arm["failure"]


def test_case_035_a_huge_result_json_is_refused_unread(tmp_path, arms_write):
    def huge(path: Path) -> None:
        with open(path, "wb") as f:
            f.write(b'{"status": "ok", "pad": "')
            f.truncate(400 << 20)  # sparse: no disk, and nothing in memory unless read

    tracemalloc.start()
    try:
        arm = crashed_arm(tmp_path, arms_write, arm_files(huge))
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()
    assert "more than the" in arm["failure"]


@pytest.mark.parametrize("values_npz, says", [
    (b"PK\x03\x04 not really a zip", "not a zip"),
    (npz_bytes({"obs0": np.array([{"a": 1}], dtype=object)}), "object"),
])
def test_case_036_037_values_npz_not_a_zip_or_an_object_array_is_a_crashed_arm(tmp_path, arms_write, values_npz, says):
    result, _ = valid_output()
    arm = crashed_arm(tmp_path, arms_write, {"result.json": json.dumps(result), "values.npz": values_npz})
    assert arm["failure"].startswith("the arm's output is not valid: values.npz") and says in arm["failure"]


def test_case_038_an_npz_bomb_is_refused_without_allocating_it(tmp_path, arms_write):
    result, _ = valid_output()
    tracemalloc.start()
    try:
        arm = crashed_arm(tmp_path, arms_write, {"result.json": json.dumps(result), "values.npz": _bomb})
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()
    assert "1073741824 bytes, more than the" in arm["failure"]


@pytest.mark.parametrize("name", ["result.json", "values.npz"])
@pytest.mark.parametrize("make", [os.mkfifo, lambda p: os.symlink("/dev/zero", p), os.mkdir])
def test_case_039_r2_fifo_link_or_folder_in_place_of_an_output_is_a_crashed_arm(tmp_path, arms_write, name, make):
    result, values = valid_output()
    files = arm_files(result, values)
    files[name] = make
    started = time.monotonic()
    arm = crashed_arm(tmp_path, arms_write, files)
    assert time.monotonic() - started < EXAMPLE_SECONDS
    assert f"{name} " in arm["failure"]


def _diverging_arms(arms_write: Any, graph: Content) -> None:
    """Two eager arms whose headline value differs, arm `cpu` with the op graph `graph`."""
    result, values = valid_output()
    other = {k: v.copy() for k, v in values.items()}
    other["obs0"] = (other["obs0"] * np.float32(1.01)).astype(np.float32)
    moved = copy.deepcopy(result)
    moved["observables"][0]["fingerprint"] = _fingerprint(other["obs0"], "float32")
    arms_write({"cpu": (arm_files(result, values, {"graph/graph.json": graph}), FINISHED, 0, None),
                "cpu/threads=1": (arm_files(moved, other), FINISHED, 0, None)})


@pytest.mark.parametrize("graph, says", [
    ("{}", "graph.json: nodes is not a list"),
    (os.mkfifo, "graph.json is not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "graph.json cannot be opened as a regular file"),
])
def test_case_040_r2_a_forged_graph_json_means_not_minimized(tmp_path, arms_write, graph, says):
    _diverging_arms(arms_write, graph)
    code, data, output = run_cli(tmp_path, "cpu,cpu/threads=1", "--minimize")
    assert code == 0 and validate_report(data) == [], output
    assert any(n.startswith(f"Not minimized: the op graph cpu recorded is not valid ({says}") for n in data["notes"]), \
        data["notes"]
    assert arms_write.leftovers() == []


def test_case_040_r2_a_graph_folder_that_is_a_link_is_not_followed(tmp_path, arms_write):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "graph.json").write_text(json.dumps(graph_doc()))
    result, values = valid_output()
    arms_write({"cpu": (arm_files(result, values, {"graph": lambda p: os.symlink(elsewhere, p)}), FINISHED, 0, None)})
    code, data, output = run_cli(tmp_path)
    assert code == 0 and validate_report(data) == [], output
    assert (elsewhere / "graph.json").exists() and arms_write.leftovers() == []


def test_case_040_graph_json_must_read_only_earlier_nodes(tmp_path):
    doc = graph_doc()
    doc["nodes"][1]["args"] = [{"node": "sum_default"}]
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    with pytest.raises(UntrustedOutput, match="nodes/1: a call that reads no earlier node"):
        OpGraph(tmp_path)


def test_case_041_what_a_process_leaves_in_the_warm_scratch_folder_is_removed(tmp_path):
    from triage.minimize.arm_worker import ArmWorker

    worker = ArmWorker.__new__(ArmWorker)  # its process parts are the sandbox's; close() is the point
    worker.workdir = str(tmp_path / "triage-warm-x")
    worker.requests, worker.proc, worker.sandboxed, worker.cgroup = io.BytesIO(), None, None, None
    trap = Path(worker.workdir) / "trap" / "deeper"
    trap.mkdir(parents=True)
    os.mkfifo(Path(worker.workdir) / "fifo")
    os.chmod(trap, 0)
    os.chmod(trap.parent, stat.S_IRUSR | stat.S_IXUSR)
    worker.close()
    assert not os.path.exists(worker.workdir)


def test_case_087_an_output_path_in_a_missing_folder_is_a_usage_error_before_any_arm(tmp_path, arms_write):
    launched = arms_write({"cpu": ({}, FINISHED, 0, None)})
    script = tmp_path / "repro.py"
    script.write_text(SCRIPT)
    for option in ("--json", "--comment", "--minimal"):
        result = CliRunner().invoke(main, ["run", str(script), "--arms", "cpu", option, "/nonexistent/dir/r.out"])
        assert result.exit_code == 2, result.output
        assert f"{option} /nonexistent/dir/r.out: the folder /nonexistent/dir does not exist" in result.output
    result = CliRunner().invoke(main, ["run", str(script), "--arms", "cpu", "--json", str(tmp_path)])
    assert result.exit_code == 2 and "is a folder" in result.output
    assert launched == []


def test_case_087_an_issue_out_folder_that_cannot_be_made_is_a_usage_error_before_any_arm(tmp_path, arms_write):
    launched = arms_write({"cpu": ({}, FINISHED, 0, None)})
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"issue": {"number": 1, "title": "t", "body": "x", "html_url": "u",
                                           "user": {"login": "a"}}, "repository": {"full_name": "o/r"}}))
    result = CliRunner().invoke(main, ["issue", "--event", str(event), "--out", str(blocker / "out"), "--arms", "cpu"])
    assert result.exit_code == 2 and "cannot make the folder" in result.output, result.output
    assert launched == []


def test_case_087_a_write_failing_at_the_end_still_writes_the_rest(tmp_path, arms_write):
    result, values = valid_output()
    gone = tmp_path / "gone"
    gone.mkdir()
    arms_write({"cpu": (arm_files(result, values, {"vanish": lambda _: gone.rmdir()}), FINISHED, 0, None)})
    script = tmp_path / "repro.py"
    script.write_text(SCRIPT)
    cli = CliRunner().invoke(main, ["run", str(script), "--arms", "cpu", "--json", str(gone / "r.json"),
                                    "--comment", str(tmp_path / "c.md"), "--no-minimize", "--no-ablate", "--quiet"])
    assert cli.exit_code == 1, cli.output
    assert f"could not write {gone / 'r.json'}" in cli.output
    assert (tmp_path / "c.md").read_text().startswith("<!-- triage:report")


def test_case_117_r10_the_arm_folder_goes_when_triage_itself_fails(tmp_path, arms_write, monkeypatch):
    arms_write({"cpu": ({}, FINISHED, 0, None)})

    def broken(*_: Any) -> None:
        raise RuntimeError("a bug in triage's own reading")

    monkeypatch.setattr("triage.arms.run._arm_run", broken)
    with pytest.raises(RuntimeError, match="a bug in triage"):
        run_cli(tmp_path)
    assert arms_write.leftovers() == []


def test_case_117_r10_a_failing_arm_takes_no_other_arms_graph_folder_with_it(tmp_path, arms_write, monkeypatch):
    result, values = valid_output()
    arms_write({"cpu": (arm_files(result, values, {"graph/graph.json": json.dumps(graph_doc())}), FINISHED, 0, None),
                "cpu/threads=1": ({}, FINISHED, 0, None)})
    real = __import__("triage.arms.run", fromlist=["_arm_run"])._arm_run

    def broken_on_threads(arm: Any, *rest: Any) -> Any:
        if arm.spec == "cpu/threads=1":
            time.sleep(0.2)  # the other arm is done and has moved its graph out
            raise RuntimeError("a bug in triage's own reading")
        return real(arm, *rest)

    monkeypatch.setattr("triage.arms.run._arm_run", broken_on_threads)
    with pytest.raises(RuntimeError):
        run_cli(tmp_path, "cpu,cpu/threads=1")
    assert arms_write.leftovers() == []


def test_case_118_not_minimized_leaves_no_minimal_folder(tmp_path, arms_write, monkeypatch):
    from triage.minimize.arm_worker import WorkerFailed

    def no_worker(spec: Any, *_: Any, **__: Any) -> None:
        raise WorkerFailed(f"the {spec.spec} worker could not start: no torch here")

    monkeypatch.setattr("triage.minimize.steps.ArmWorker", no_worker)
    _diverging_arms(arms_write, json.dumps(graph_doc()))
    code, data, output = run_cli(tmp_path, "cpu,cpu/threads=1", "--minimize")
    assert code == 0 and validate_report(data) == [], output
    assert "Not minimized: the cpu worker could not start: no torch here." in data["notes"]
    assert arms_write.leftovers() == []


# -- the warm worker's replies and the wire ----------------------------------------------------
@pytest.mark.parametrize("header, says", [
    ({"ok": True, "lost": "pretend"}, "only triage's side"),
    ({"ok": "yes"}, "ok: a string"),
    ({"ok": True, "side_file": "../../etc/passwd"}, "side_file"),
    ({"ok": True, "script": 5}, "script: an integer"),
    ({"ok": True, "rows": {"op": {"local": {"kind": "equal", "extra": 1}}}}, "unexpected field"),
    ({"ok": True, "rows": {"__whole__": {"no": "error"}}}, "rows/__whole__: error is missing"),
    ({"ok": False, "error": "text"}, "error: a string, not an object"),
    ({"ok": True, "float64_lines": {"acosh": "x\n| forged | row |"}}, "float64_lines"),
    ({"ok": True, "results": ["__import__('os')"]}, "results"),
])
def test_a_warm_reply_not_shaped_as_serve_sends_it_is_refused(header, says):
    assert says in (reply_problem(header) or "")


def test_valid_warm_replies_pass():
    for header in ({"ok": True, "torch": "2.x"}, {"ok": True, "values": 3, "digests": {"a": "ff"}, "bytes": 12},
                   {"ok": True, "outputs": [{"name": "mul", "dtype": "float32"}], "arrays": []},
                   {"ok": True, "rows": {"mul": {"end_to_end": {"kind": "mismatch", "detail": "", "max_abs": 1.0,
                                                                "max_ulps": 3.0, "nonfinite": 0}, "local": None},
                                         "__whole__": {"error": "RuntimeError: x"}}},
                   {"ok": True, "script": "import torch\n", "forms": ["torch.acosh"], "side_file": "minimal_inputs.pt",
                    "float64_lines": {"acosh": "torch.acosh(x0.double()).to(torch.float32)"},
                    "results": ["eager", "compiled"]},
                   {"ok": True, "dtypes": {"x": "bfloat16"}},
                   {"ok": False, "error": {"type": "RuntimeError", "message": "no"}}):
        assert reply_problem(header) is None, header


def test_a_malformed_warm_reply_ends_the_reading_and_says_why():
    import queue

    from triage.minimize.arm_worker import ArmWorker

    worker = ArmWorker.__new__(ArmWorker)
    stream = io.BytesIO()
    send(stream, {"ok": True, "torch": "2.x"})
    send(stream, {"ok": True, "side_file": "../../home/user/.bashrc", "script": "x"})
    send(stream, {"ok": True, "torch": "never read"})
    stream.seek(0)
    replies: queue.Queue = queue.Queue()
    worker._read(stream, replies)
    assert replies.get_nowait()[0] == {"ok": True, "torch": "2.x", "arrays": []}
    assert replies.get_nowait() is None and replies.empty()
    assert worker.refused.startswith("side_file:")


def test_the_wire_refuses_a_header_nested_past_the_recursion_limit():
    with pytest.raises(WireError):
        receive(io.BytesIO(b"[" * 100000 + b"]" * 100000 + b"\n"))


@pytest.mark.parametrize("spec", [
    {"name": "x", "dtype": "|O", "shape": [1], "nbytes": 8},
    {"name": "x", "dtype": "<f8", "shape": [1 << 40], "nbytes": 8 << 40},
    {"name": "x", "dtype": "<f8", "shape": [2], "nbytes": 8},
    {"name": "x", "dtype": "<f8", "shape": [-1], "nbytes": -8},
    {"name": "x", "dtype": "not a dtype", "shape": [1], "nbytes": 1},
    "not a spec",
])
def test_the_wire_refuses_arrays_it_cannot_bound(spec):
    stream = io.BytesIO(json.dumps({"ok": True, "arrays": [spec]}).encode() + b"\n" + bytes(16))
    with pytest.raises(WireError):
        receive(stream)


def test_the_wire_still_carries_arrays():
    stream = io.BytesIO()
    send(stream, {"ok": True}, {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True])})
    stream.seek(0)
    header, arrays = receive(stream)
    assert header["ok"] and arrays["a"].shape == (2, 3) and arrays["b"].dtype == np.bool_


# -- fuzzing every output at once ---------------------------------------------------------------
def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, prefix + (i,))
    return found


def _deep(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


REPLACEMENTS = [None, True, 0, -1, 7.0, 1.5, math.nan, math.inf, "x", "nan", [], {}, [1, 2], {"a": 1}, 10 ** 30,
                "x" * 300_000, _deep(100), [[1]], {"shape": [3]}, ["a", None]]


def mutate(doc: Any, path: tuple, how: str, replacement: Any) -> Any:
    """`doc` with the value at `path` dropped or replaced (None: the whole document dropped);
    unchanged where an earlier mutation took the path away."""
    if not path:
        return None if how == "drop" else replacement
    doc = copy.deepcopy(doc)
    parent = doc
    try:
        for key in path[:-1]:
            parent = parent[key]
        if how == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    except (KeyError, IndexError, TypeError):
        pass
    return doc


def mutate_all(doc: Any, mutations: list[tuple]) -> Any:
    for mutation in mutations:
        if doc is None:
            break
        doc = mutate(doc, *mutation)
    return doc


BASE_RESULT, BASE_VALUES = valid_output()
result_mutations = st.lists(st.tuples(st.sampled_from(_paths(BASE_RESULT)), st.sampled_from(["drop", "retype"]),
                                      st.sampled_from(REPLACEMENTS)), min_size=1, max_size=3)


def _npz_member(name: str, raw: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, raw)
    return buffer.getvalue()


def _npy(header: str, data: bytes = b"") -> bytes:
    text = header.encode().ljust(118) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + data


VALUES_MUTATIONS: dict[str, Content | None] = {
    "intact": npz_bytes(BASE_VALUES),  # the forgery is in result.json alone
    "missing": None,
    "empty": b"", "text": b"not a zip", "noise": bytes(range(64)),
    "object array": npz_bytes(dict(BASE_VALUES, obs0=np.array([{"a": 1}], dtype=object))),
    "string array": npz_bytes(dict(BASE_VALUES, obs0=np.array(["text"]))),
    "value of another shape": npz_bytes(dict(BASE_VALUES, obs0=np.zeros(5, np.float32))),
    "reference of another shape": npz_bytes(dict(BASE_VALUES, ref0=np.zeros((2, 2)))),
    "spread of another shape": npz_bytes(dict(BASE_VALUES, sig0=np.zeros(3))),
    "complex value": npz_bytes(dict(BASE_VALUES, obs0=BASE_VALUES["obs0"].astype(np.complex64))),
    "integer value": npz_bytes(dict(BASE_VALUES, obs0=BASE_VALUES["obs0"].astype(np.uint8))),
    "boolean value": npz_bytes(dict(BASE_VALUES, obs0=np.ones(4, dtype=bool))),
    "nonfinite values": npz_bytes(dict(BASE_VALUES, obs0=np.array([np.nan, np.inf, -np.inf, 1e38], np.float32),
                                       ref0=np.array([np.inf, np.nan, 0.0, -0.0]))),
    "nonfinite spread": npz_bytes(dict(BASE_VALUES, sig0=np.full(4, np.nan), sd0=np.full(4, -1.0),
                                       mu0=np.full(4, np.inf), nf0=np.full(4, 255, np.uint8))),
    "spread of another dtype": npz_bytes(dict(BASE_VALUES, nf0=np.full(4, 0.5), up0=np.ones(4, np.complex128))),
    "value of no observable": npz_bytes(dict(BASE_VALUES, obs99=np.zeros(1))),
    "unknown member": npz_bytes(dict(BASE_VALUES, unrelated=np.zeros(1))),
    "header claiming 1 GiB": _npz_member("obs0.npy", _npy("{'descr': '<f8', 'fortran_order': False, "
                                                           "'shape': (134217728,), }")),
    "truncated data": _npz_member("obs0.npy", _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                                                    b"\0" * 3)),
    "object header": _npz_member("obs0.npy", _npy("{'descr': 'O', 'fortran_order': False, 'shape': (1,), }")),
    "code in the header": _npz_member("obs0.npy", _npy("__import__('os').system('true')")),
    "unknown npy version": _npz_member("obs0.npy", b"\x93NUMPY\x09\x00garbage"),
    "path as a member": _npz_member("../obs0.npy", b"x"),
    "deflate bomb": _bomb,
    "fifo": os.mkfifo,
    "link to /dev/zero": lambda p: os.symlink("/dev/zero", p),
}

CONTROL_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats() | st.text(max_size=20)
    | st.sampled_from(["worker-error", "script-start", "script-done", "done", "   \n  ", "unavailable"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
CONTROL_MESSAGE = st.dictionaries(
    st.sampled_from(["phase", "error", "observable", "status", "index", "kind", "label"]), CONTROL_VALUES, max_size=4)
STREAMED = st.builds(lambda o, k, v: mutate(o, (k,), "retype", v), st.sampled_from(
    [{k: o[k] for k in ("index", "kind", "label", "line", "fingerprint")} for o in BASE_RESULT["observables"]]),
    st.sampled_from(["index", "kind", "label", "line", "fingerprint"]), st.sampled_from(REPLACEMENTS))


class Bounds:
    """Peak RSS of this process before a fuzz run, and the check after each example."""

    def __init__(self) -> None:
        self.rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def check(self, started: float) -> None:
        assert time.monotonic() - started < EXAMPLE_SECONDS
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.rss_before
        assert grown < RSS_GROWTH_BOUND, f"triage's peak RSS grew by {grown >> 20} MB"


def _whole_report(folder: Path, arms_write: Any, files: dict[str, Content], messages: list[dict[str, Any]],
                  exit_code: int | None, signal: str | None, bounds: Bounds,
                  beside_intact: bool = False) -> dict[str, Any]:
    """Run the forged `cpu` arm (`beside_intact`: and a second arm that is intact, so that the
    forged values are compared across arms) and check the outcome is whole and bounded."""
    folder.mkdir()
    per_spec = {"cpu": (files, messages, exit_code, signal)}
    if beside_intact:
        per_spec["cpu/threads=1"] = (arm_files(BASE_RESULT, BASE_VALUES), FINISHED, 0, None)
    arms_write(per_spec)
    started = time.monotonic()
    code, data, output = run_cli(folder, ",".join(per_spec))
    bounds.check(started)
    assert data is not None, output
    assert validate_report(data) == [], output
    assert code in (0, 3), output
    assert arms_write.leftovers() == []
    return data


FUZZ = settings(max_examples=100, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(result_mutations=result_mutations, values=st.sampled_from(sorted(VALUES_MUTATIONS)), two_arms=st.booleans())
def test_fuzz_forged_result_and_values_always_end_in_a_whole_report(tmp_path, arms_write, result_mutations, values,
                                                                       two_arms):
    bounds = Bounds()
    result = mutate_all(BASE_RESULT, result_mutations)
    files: dict[str, Content] = {}
    if result is not None:
        files["result.json"] = json.dumps(result, allow_nan=True)
    if VALUES_MUTATIONS[values] is not None:
        files["values.npz"] = VALUES_MUTATIONS[values]
    report = _whole_report(Path(tempfile.mkdtemp(dir=tmp_path)) / "run", arms_write, files, FINISHED, 0, None, bounds,
                           two_arms)
    arm = report["arms"][0]
    assert arm["status"] in ("ok", "raised", "crashed")
    if arm["status"] == "crashed" and result is not None:
        assert arm["failure"].startswith("the arm's output is not valid: "), arm["failure"]


@FUZZ
@given(messages=st.lists(CONTROL_MESSAGE | st.builds(lambda o: {"observable": o}, STREAMED), max_size=6),
       ending=st.sampled_from([(0, None), (1, None), (70, None), (None, "SIGKILL"), (None, "SIGSEGV")]),
       with_result=st.booleans())
def test_fuzz_forged_control_messages_always_end_in_a_whole_report(tmp_path, arms_write, messages, ending,
                                                                   with_result):
    bounds = Bounds()
    files = arm_files(BASE_RESULT, BASE_VALUES) if with_result else {}
    report = _whole_report(Path(tempfile.mkdtemp(dir=tmp_path)) / "run", arms_write, files, STARTED + messages,
                           *ending, bounds)
    arm = report["arms"][0]
    assert "bug in triage" not in (arm["failure"] or "")


graph_mutations = st.tuples(st.sampled_from(_paths(graph_doc())), st.sampled_from(["drop", "retype"]),
                            st.sampled_from(REPLACEMENTS))


@FUZZ
@given(mutation=graph_mutations)
def test_fuzz_a_forged_graph_is_refused_or_plans_without_error(tmp_path, mutation):
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    doc = mutate(graph_doc(), *mutation)
    (folder / "graph.json").write_text(json.dumps(doc, allow_nan=True))
    try:
        graph = OpGraph(folder)
    except UntrustedOutput:
        return
    for node in graph.nodes:
        cone = graph.cone(node["name"])
        if cone:
            graph.plan(cone)
            graph.op_names(cone)


# -- end to end, on the findings' scripts -------------------------------------------------------
# The worker now ends with os._exit and binds its file functions before the script runs, so the
# findings' atexit forgeries no longer land; these scripts reach into the worker's modules
# instead, which in-process code always can.
FORGE_RESULT = """import sys, torch
session = sys.modules["triage.worker.session"]
write = session.replace_file
def forge(source, target):
    write(source, target)
    if str(target).endswith("result.json"):
        {action}
session.replace_file = forge
print(torch.ones(3) * 2)
"""


@pytest.fixture
def hostile(tmp_path):
    """Run `triage run` (a subprocess, its temp folders in a private TMPDIR) on a hostile
    script; the report, checked whole, and no temp folder left."""
    temp = tmp_path / "temp"
    temp.mkdir()

    def run(source: str, arms: str = "cpu", *extra: str) -> dict[str, Any]:
        script = tmp_path / "hostile.py"
        script.write_text(source)
        code, data, _, output = run_triage(script, arms, tmp_path, "--minimal", "-", "--no-ablate", *extra,
                                           env={"TMPDIR": str(temp)})
        assert data is not None and validate_report(data) == [], output
        assert code in (0, 3), output
        assert os.listdir(temp) == [], output
        return data
    return run


@pytest.mark.slow
def test_case_031_end_to_end_garbage_in_result_json(hostile):
    data = hostile(FORGE_RESULT.format(action="open(target, 'w').write('{this is not json')"), "cpu", "--no-minimize")
    assert data["arms"][0]["failure"].startswith("the arm's output is not valid: result.json is not valid JSON")


@pytest.mark.slow
def test_case_037_end_to_end_object_array_in_values_npz(hostile):
    data = hostile("import numpy as np, torch\n"
                   "save = np.savez\n"
                   "np.savez = lambda file, **values: save(file, obs0=np.array([{'a': 1}], dtype=object))\n"
                   "print(torch.ones(3) * 2)\n", "cpu", "--no-minimize")
    assert "values.npz: obs0.npy is an array of object" in data["arms"][0]["failure"]


@pytest.mark.slow
def test_case_039_end_to_end_fifo_in_place_of_result_json(hostile):
    started = time.monotonic()
    data = hostile(FORGE_RESULT.format(action="import os; os.replace(target, str(target) + '.bak'); os.mkfifo(target)"),
                   "cpu", "--no-minimize", "--timeout", "20")
    assert "result.json is not a regular file" in data["arms"][0]["failure"]
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_case_040_end_to_end_forged_graph_json_is_not_minimized(hostile):
    data = hostile("import json, pathlib, torch\n"
                   "arm = json.load(open('../out/job.json'))['arm']\n"
                   "write = pathlib.Path.write_text\n"
                   "pathlib.Path.write_text = lambda path, text, *a, **k: write(\n"
                   "    path, '{}' if path.name == 'graph.json' else text, *a, **k)\n"
                   "y = torch.exp(torch.linspace(1, 2, 8))\n"
                   "if arm['knobs'].get('threads') == '1':\n"
                   "    y = y * 1.01\n"
                   "print(y)\n", "cpu,cpu/threads=1")
    assert any("graph.json: nodes is not a list" in n for n in data["notes"]), data["notes"]


@pytest.mark.slow
def test_real_worker_output_passes_the_checks(tmp_path):
    """The checks accept what triage's worker really writes (rounding, conditioning, leaves,
    a module call and a claim): a check stricter than the worker would crash every arm."""
    code, data, _, output = run_triage(FIXTURES / "cancelling_sum.py", "cpu", tmp_path, "--no-minimize", "--no-ablate")
    assert code == 0 and all(a["status"] == "ok" for a in data["arms"]), output
    script = tmp_path / "module_claim.py"
    script.write_text("import torch\ntorch.manual_seed(0)\nm = torch.nn.Linear(4, 2)\nx = torch.randn(3, 4)\n"
                      "y = m(x)\nassert torch.allclose(y, m(x))\nprint(y.sum().item())\n")
    code, data, _, output = run_triage(script, "cpu", tmp_path, "--no-minimize", "--no-ablate")
    assert code == 0 and data["arms"][0]["status"] == "ok", output
    kinds = {o["kind"] for o in data["observables"]}
    assert {"call", "claim", "readback"} <= kinds, kinds
