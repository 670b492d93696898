"""Regression tests for the hostile-input cases the security review found already handled
(PASS / PASS* in the "All cases" table of the review), so that they stay handled.

Each test is named after its case number and runs the review's script (condensed where
needed) through the real CLI in a subprocess, or posts with `triage post` against the local
GitHub server (tests/github_server.py).  What they assert is what the table's "expected"
column asks of triage; nothing depends on this machine's numerics (a deliberate 1 % fault on
one arm is the only divergence), so they also pass with ATEN_CPU_CAPABILITY=default.

The failing cases of the review are tested in test_hostile.py, test_hostile_post.py,
test_hostile_outputs.py and test_hostile_scripts.py.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.github_server import FakeGitHub
from triage import __version__
from triage.classify.ladder import classify
from triage.extract import extract_issue_body
from triage.github import body_sha256
from triage.model import Issue, Report, Repro
from triage.report.comment import MARKER
from triage.report.data import report_json, validate_report

CONTROL_FD = """
def control_fd():   # the control pipe: named in /proc/self/environ of a spawned worker; in a
    import fcntl     # forked one, the write-only pipe above the standard streams
    for kv in open('/proc/self/environ', 'rb').read().split(b'\\0'):
        if kv.startswith(b'TRIAGE_CONTROL_FD='):
            return int(kv.split(b'=')[1])
    for fd in sorted(int(f) for f in os.listdir('/proc/self/fd')):
        if fd > 2 and os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:') \\
                and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY:
            return fd
"""


# -- running the CLI ----------------------------------------------------------------------------
@dataclass
class Run:
    code: int
    report: dict[str, Any] | None
    comment: str | None
    output: str
    seconds: float
    folder: Path

    @property
    def arm(self) -> dict[str, Any]:
        assert self.report is not None, self.output
        return self.report["arms"][0]

    def observed(self, arm: str = "cpu") -> dict[str, Any]:
        """label -> fingerprint sample of the observables of `arm`."""
        return {o["label"]: (o["fingerprint"] or {}).get("sample") for o in self.report["observables"]
                if o.get("arm", arm) == arm}


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY", "GITHUB_REPOSITORY", "GITHUB_API_URL")
           and not k.startswith("TRIAGE_")}
    env["TRIAGE_TEST_ARMS"] = "1"  # the test-only `fault` knob
    env.update(extra or {})
    return env


def _cli(argv: list[str], folder: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "triage", *argv], capture_output=True, text=True, cwd=folder,
                          env=_env(env), timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def triage_run(tmp_path: Path, source: str | bytes | None, *extra: str, arms: str = "cpu", name: str = "repro.py",
               script_arg: str | None = None, env: dict[str, str] | None = None) -> Run:
    """`triage run` on `source` (written to tmp_path/name) with one cpu arm, no minimizer,
    ablation or float64 reference; the report is checked against the schema triage posts."""
    script = tmp_path / name
    if source is not None:
        script.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            script.write_bytes(source)
        else:
            script.write_text(textwrap.dedent(source).lstrip("\n"))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    report_path, comment_path = out / "r.json", out / "c.md"
    code, output, seconds = _cli(["run", script_arg or str(script), "--arms", arms, "--json", str(report_path),
                                  "--comment", str(comment_path), "--minimal", "-", "--no-minimize", "--no-ablate",
                                  "--no-reference", *extra], tmp_path, env)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    comment = comment_path.read_text() if comment_path.exists() else None
    assert "Traceback (most recent call last)" not in output, output  # never one of triage's own
    if report is not None:
        assert validate_report(report) == [], output
    return Run(code, report, comment, output, seconds, tmp_path)


def triage_issue(tmp_path: Path, event: Any) -> Run:
    """`triage issue --event` on an `issues` payload (a dict, or the file's text)."""
    path = tmp_path / "event.json"
    path.write_text(event if isinstance(event, str) else json.dumps(event))
    out = tmp_path / "triage-out"
    code, output, seconds = _cli(["issue", "--event", str(path), "--out", str(out), "--arms", "cpu", "--no-minimize",
                                  "--no-ablate", "--no-reference", "--quiet"], tmp_path)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    assert "Traceback (most recent call last)" not in output, output
    if report is not None:
        assert validate_report(report) == [], output
    return Run(code, report, None, output, seconds, out)


def event(body: Any, number: Any = 7, user: Any = None) -> dict[str, Any]:
    return {"action": "labeled", "repository": {"full_name": "octo/demo"},
            "issue": {"number": number, "title": "numbers differ", "body": body, "html_url": "u",
                      "user": {"login": "reporter"} if user is None else user}}


def outside_fences(markdown: str) -> str:
    """The text of `markdown` that is not inside a fenced code block (CommonMark's rule: a
    fence closes only on a line of the same character, at least as long, and nothing else)."""
    kept, fence = [], None
    for line in markdown.splitlines():
        stripped = line.lstrip(" ")
        if fence is None:
            m = re.match(r"(`{3,}|~{3,})", stripped)
            info = stripped[len(m.group(1)):] if m else ""
            if m and len(line) - len(stripped) <= 3 and not (m.group(1)[0] == "`" and "`" in info):
                fence = m.group(1)
            else:
                kept.append(line)
        elif re.fullmatch(re.escape(fence[0]) + "{" + str(len(fence)) + ",}[ \t]*", stripped):
            fence = None
    return "\n".join(kept)


# == process ===================================================================================
@pytest.mark.slow
def test_case_006_script_ignoring_sigterm_sigint_sighup_is_killed_at_the_timeout(tmp_path):
    run = triage_run(tmp_path, """
        import signal, torch
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        x = torch.ones(3) * 2
        while True:
            pass
        """, "--timeout", "5")
    assert run.code == 3 and run.arm["status"] == "timeout", run.output
    assert run.arm["signal"] == "SIGKILL"
    assert run.arm["failure"] == ("killed after running past the 5 s limit while running the script "
                                  "(raise it with --timeout)")
    assert run.arm["elapsed_s"] < 20 and run.seconds < 40


@pytest.mark.slow
def test_case_009_killing_its_own_process_group_is_a_reported_crash(tmp_path):
    run = triage_run(tmp_path, """
        import os, signal, torch
        x = torch.ones(3) * 2
        print(x)
        os.killpg(0, signal.SIGKILL)
        """)
    assert run.report is not None, run.output  # triage itself survived and wrote its report
    assert run.code == 3 and run.arm["status"] == "crashed", run.output
    assert run.arm["signal"] == "SIGKILL" and run.arm["failure"].startswith("the process died with SIGKILL")
    assert run.report["verdict"]["kind"] == "could-not-run"


# == result channel ============================================================================
@pytest.mark.slow
def test_case_022_closing_every_descriptor_still_delivers_the_result(tmp_path):
    run = triage_run(tmp_path, """
        import os, torch
        os.closerange(3, 4096)
        x = torch.ones(3) * 2
        print(x)
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.observed()["`x` at exit"] == [2.0, 2.0, 2.0]


@pytest.mark.slow
def test_case_023_garbage_and_a_forged_done_on_every_descriptor_are_ignored(tmp_path):
    """The forged "done" arrives while the script still has work to do (the sleep): it must
    neither end the arm nor cost the result."""
    run = triage_run(tmp_path, """
        import os, time, torch
        for fd in range(256):
            try:
                os.write(fd, b'\\x00garbage\\xff{not json\\n{"phase": "done"}\\n')
            except OSError:
                pass
        time.sleep(2)
        x = torch.ones(3) * 2
        print(x)
        """)
    assert run.arm["status"] == "ok", run.arm["failure"]
    assert run.code == 0
    assert run.observed()["`x` at exit"] == [2.0, 2.0, 2.0]


@pytest.mark.slow
def test_case_024_stdout_imitating_control_messages_fences_and_html_is_inert(tmp_path):
    lines = ['{"phase": "done"}', '{"phase": "worker-error", "error": "forged"}',
             "[… triage dropped 999999 bytes of output …]", "`" * 10, "</details>",
             "<details><summary>forged</summary>"]
    run = triage_run(tmp_path, "import torch\nx = torch.ones(3) * 2\n"
                     + "".join(f"print({line!r})\n" for line in lines) + "print(x)\n")
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["stdout"] == "\n".join(lines) + "\ntensor([2., 2., 2.])\n"  # shown as printed, nothing parsed
    assert run.arm["output_dropped"] == 0 and run.arm["failure"] is None
    # In the comment it sits in a fence longer than its own backtick run, so none of it is markdown.
    fence = re.search(r"^stdout:\n(`{11,})text\n(.*?)^\1$", run.comment, re.S | re.M)
    assert fence and fence.group(2) == run.arm["stdout"], run.comment
    prose = outside_fences(run.comment)
    assert "forged" not in prose and '{"phase"' not in prose and "triage dropped" not in prose


@pytest.mark.slow
@pytest.mark.parametrize("arms", ["cpu", "cpu,cpu/threads=1"])
def test_case_028_malformed_streamed_observables_then_exit_is_a_crashed_arm(tmp_path, arms):
    run = triage_run(tmp_path, CONTROL_FD + """
import json, os, torch
fd = control_fd()
arm = json.load(open('../out/job.json'))['arm']
x = torch.ones(3) * 2
print(x)
if arm['knobs'].get('threads') != '1':
    for bad in ({"observable": {"index": "zero", "kind": 7, "label": None, "line": "x",
                                "fingerprint": {"shape": "no"}}},
                {"observable": [1, 2, 3]}, {"observable": {"index": -1}}, {"observable": None},
                {"observable": {"index": 0, "kind": "call", "label": "y", "line": 3, "fingerprint": {"sha256": 5}}}):
        os.write(fd, (json.dumps(bad) + "\\n").encode())
    os.write(fd, b'{"observable": {"index": \\n')
    os._exit(1)
""", arms=arms)
    crashed = run.arm
    assert crashed["spec"] == "cpu" and crashed["status"] == "crashed", run.output
    assert crashed["exit_code"] == 1 and "before triage could collect a result" in crashed["failure"]
    # Only what the worker itself streamed survives: the printed x, none of the forged ones.
    assert [(o["label"], o["fingerprint"]["sample"]) for o in run.report["observables"] if o["arm"] == "cpu"] \
        == [("print/repr", [2.0, 2.0, 2.0])]
    if arms == "cpu":
        assert run.code == 3 and run.report["verdict"]["kind"] == "could-not-run"
    else:
        assert run.report["arms"][1]["status"] == "ok"
        assert run.code == 0 and run.report["verdict"]["kind"] == "crash-one-arm"


# == script behaviour ==========================================================================
@pytest.mark.slow
def test_case_042_patched_allclose_and_equal_do_not_fool_triage(tmp_path):
    """The script's own (patched) checks pass; triage compares the recorded values itself, so
    the 1 % fault on one arm is still found."""
    run = triage_run(tmp_path, """
        import torch
        torch.allclose = torch.equal = lambda *a, **k: True
        a = torch.linspace(1, 2, 8)
        b = a * 3
        assert torch.allclose(b, a * 3.0001)
        assert torch.equal(a, b)
        print("the script says they agree")
        """, arms="cpu,cpu/fault=mul")
    assert run.code == 0 and [a["status"] for a in run.report["arms"]] == ["ok", "ok"], run.output
    assert all(a["stdout"] == "the script says they agree\n" for a in run.report["arms"])
    divergence = run.report["comparison"]["divergence"]
    assert divergence is not None and divergence["observable_label"] == "`b` at exit", run.report["comparison"]
    assert divergence["within_tolerance"] is False and divergence["bitwise_equal"] is False
    assert run.report["verdict"]["kind"] != "not-reproduced"


@pytest.mark.slow
def test_case_043_tensor_repr_and_format_that_raise_do_not_affect_triage(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        def boom(*a, **k):
            raise RuntimeError("no repr for you")
        torch.Tensor.__repr__ = boom
        torch.Tensor.__format__ = boom
        x = torch.ones(3) * 2
        try:
            print(x)
        except RuntimeError as e:
            print("print failed:", e)
        y = x + 1
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["stdout"] == "print failed: no repr for you\n"
    observed = run.observed()
    assert observed["`x` at exit"] == [2.0, 2.0, 2.0] and observed["`y` at exit"] == [3.0, 3.0, 3.0]


@pytest.mark.slow
def test_case_048_default_dtype_float64_runs_and_the_flags_say_so(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        torch.set_default_dtype(torch.float64)
        x = torch.ones(3) * 2
        print(x)
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["flags_end"]["default_dtype"] == "float64"
    assert {o["fingerprint"]["dtype"] for o in run.report["observables"]} == {"float64"}


@pytest.mark.slow
def test_case_049_default_device_meta_at_the_end_does_not_break_triage(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        x = torch.ones(3) * 2
        print(x)
        torch.set_default_device('meta')
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.observed() == {"print/repr": [2.0, 2.0, 2.0], "`x` at exit": [2.0, 2.0, 2.0]}


@pytest.mark.slow
def test_case_051_unbounded_recursion_is_a_raised_arm(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        x = torch.ones(3) * 2
        def f(n): return f(n + 1)
        f(0)
        """)
    assert run.code == 3 and run.arm["status"] == "raised", run.output
    assert run.arm["exception"]["type"] == "RecursionError" and run.arm["exception"]["line"] == 3
    assert run.arm["failure"].startswith("RecursionError at line 3")


@pytest.mark.slow
def test_case_052_recursion_with_a_huge_limit_is_killed_for_memory(tmp_path):
    run = triage_run(tmp_path, """
        import sys, torch
        sys.setrecursionlimit(10**7)
        x = torch.ones(3) * 2
        def f(n): return f(n + 1) + 1
        f(0)
        """, "--memory", "1G")
    assert run.code == 3 and run.arm["status"] == "crashed", run.output
    assert run.arm["failure"] == "killed for using more than 1.0 GiB of memory (raise it with --memory)"
    assert run.seconds < 120


@pytest.mark.slow
def test_case_053_recursion_error_in_repr_is_a_raised_arm(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        class A:
            def __repr__(self):
                return repr(self)
        x = torch.ones(3) * 2
        print(A())
        """)
    assert run.code == 3 and run.arm["status"] == "raised", run.output
    assert run.arm["exception"]["type"] == "RecursionError" and run.arm["exception"]["line"] == 4


@pytest.mark.slow
def test_case_054_tensor_subclass_with_recursive_repr_and_failing_numpy(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        class T(torch.Tensor):
            def __repr__(self, *a, **k):
                return repr(self)
            def numpy(self, *a, **k):
                raise RuntimeError("no numpy for you")
        x = (torch.ones(3) * 2).as_subclass(T)
        y = x * 3
        print(y.sum().item())
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["stdout"] == "18.0\n"
    assert run.observed()["`y` at exit"] == [6.0, 6.0, 6.0]


@pytest.mark.slow
def test_case_055_more_ops_than_the_graph_cap_stops_recording_not_the_run(tmp_path):
    """The review's 10**6 adds, cut to just past the 200,000-op cap of the recorder."""
    run = triage_run(tmp_path, """
        import torch
        x = torch.zeros(())
        for _ in range(210_000):
            x = x + 1
        print(x)
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["stdout"] == "tensor(210000.)\n"
    assert run.arm["graph"]["stopped"] == "the script ran more than 200000 ops"
    assert run.arm["graph"]["nodes"] <= 200_010


@pytest.mark.slow
def test_case_056_a_3_gb_allocation_is_killed_for_memory(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        x = torch.ones(3) * 2
        big = torch.ones(3 * 1024**3 // 4)
        print(big.sum())
        """, "--memory", "1G")
    assert run.code == 3 and run.arm["status"] == "crashed", run.output
    assert run.arm["failure"] == "killed for using more than 1.0 GiB of memory (raise it with --memory)"
    assert run.report["verdict"]["kind"] == "could-not-run"


@pytest.mark.slow
def test_case_057_200_mb_of_stderr_keeps_head_and_tail(tmp_path):
    run = triage_run(tmp_path, """
        import sys, torch
        x = torch.ones(3) * 2
        sys.stderr.write("STDERR-HEAD-MARKER\\n")
        line = 'E' * 1023 + '\\n'
        for _ in range(200 * 1024):
            sys.stderr.write(line)
        print("STDOUT-AFTER", x)
        sys.stderr.write("STDERR-TAIL-MARKER\\n")
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    stderr = run.arm["stderr"]
    assert stderr.startswith("STDERR-HEAD-MARKER\n") and stderr.endswith("STDERR-TAIL-MARKER\n")
    assert len(stderr) < 2 << 20 and run.arm["output_dropped"] > 190 << 20
    assert f"[… triage dropped {run.arm['output_dropped']} bytes of output …]" in stderr
    assert run.arm["stdout"] == "STDOUT-AFTER tensor([2., 2., 2.])\n"
    assert len(json.dumps(run.report)) < 4 << 20


@pytest.mark.slow
def test_case_059_multiprocessing_spawn_with_a_main_guard_runs(tmp_path):
    run = triage_run(tmp_path, """
        import multiprocessing as mp, torch
        def work(q):
            q.put(float((torch.ones(3) * 2).sum()))
        if __name__ == '__main__':
            ctx = mp.get_context('spawn')
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q,))
            p.start()
            v = q.get(timeout=60)
            p.join()
            x = torch.tensor([v]) * 2
            print("child said", v, x)
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["stdout"] == "child said 6.0 tensor([12.])\n"


@pytest.mark.slow
def test_case_061_torch_multiprocessing_spawn_runs(tmp_path):
    run = triage_run(tmp_path, """
        import torch, torch.multiprocessing as tmp
        def work(rank):
            print("rank", rank, float((torch.ones(3) * (rank + 1)).sum()), flush=True)
        if __name__ == '__main__':
            tmp.spawn(work, nprocs=2)
            x = torch.ones(3) * 2
            print("spawned", x)
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert sorted(run.arm["stdout"].splitlines()) == ["rank 0 3.0", "rank 1 6.0", "spawned tensor([2., 2., 2.])"]


@pytest.mark.slow
def test_case_064_sigalrm_is_a_reported_crash(tmp_path):
    run = triage_run(tmp_path, """
        import signal, time, torch
        x = torch.ones(3) * 2
        signal.alarm(1)
        time.sleep(60)
        """, "--timeout", "30")
    assert run.code == 3 and run.arm["status"] == "crashed", run.output
    assert run.arm["signal"] == "SIGALRM" and run.arm["failure"].startswith("the process died with SIGALRM")
    assert run.arm["elapsed_s"] < 25


@pytest.mark.slow
def test_case_068_sys_exit_3_is_a_raised_arm(tmp_path):
    run = triage_run(tmp_path, """
        import sys, torch
        x = torch.ones(3) * 2
        print(x)
        sys.exit(3)
        """)
    assert run.arm["status"] == "raised", run.output
    exception = run.arm["exception"]
    assert (exception["type"], exception["message"], exception["line"]) == ("SystemExit", "3", 4)
    assert "line 4" in run.arm["failure"] and "status 3" in run.arm["failure"]


@pytest.mark.slow
def test_case_069_bare_system_exit_keeps_the_values_with_a_note(tmp_path):
    run = triage_run(tmp_path, """
        import torch
        x = torch.ones(3) * 2
        print(x)
        raise SystemExit
        """)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["exit_note"] == "the script called sys.exit() at line 4"
    assert any("sys.exit() at line 4" in n for n in run.report["notes"]), run.report["notes"]
    assert run.observed()["`x` at exit"] == [2.0, 2.0, 2.0]


# == source / CLI ==============================================================================
@pytest.mark.slow
def test_case_073_non_utf8_source_cannot_run(tmp_path):
    run = triage_run(tmp_path, b'import torch\nx = torch.ones(3) * 2\nprint("caf\xe9", x)\n')
    assert run.code == 3 and run.report["verdict"]["kind"] == "could-not-run", run.output
    assert run.report["repro"]["problem"] == "repro.py is not valid UTF-8 (and declares no other encoding) (line 3)"
    assert run.report["arms"] == []


@pytest.mark.slow
def test_case_075_latin1_coding_declaration_runs(tmp_path):
    run = triage_run(tmp_path, b'# -*- coding: latin-1 -*-\nimport torch\nx = torch.ones(3) * 2\nprint("caf\xe9", x)\n')
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert run.arm["stdout"] == "caf\u00e9 tensor([2., 2., 2.])\n"


@pytest.mark.slow
def test_case_076_a_50_mb_source_cannot_run(tmp_path):
    source = b"import torch\nx = torch.ones(3) * 2\n# " + b"x" * (50 << 20) + b"\nprint(x)\n"
    run = triage_run(tmp_path, source)
    assert run.code == 3 and run.report["verdict"]["kind"] == "could-not-run", run.output
    assert run.report["repro"]["problem"].endswith(
        f"is {len(source)} bytes; a repro script is expected to be under 2 MiB")
    assert run.report["arms"] == [] and run.seconds < 60


@pytest.mark.slow
@pytest.mark.parametrize("case, name, argument", [
    ("079", "my repro with spaces.py", None),
    ("080", "répro_数値_🔥.py", None),
    ("081", "--arms=cuda.py", "./--arms=cuda.py"),  # a name that looks like an option
], ids=["case_079_spaces", "case_080_unicode_and_emoji", "case_081_option_lookalike"])
def test_case_079_080_081_odd_file_names_run(tmp_path, case, name, argument):
    run = triage_run(tmp_path, f"import torch\nx = torch.ones(3) * 2\nprint({case!r}, x)\n", name=name,
                     script_arg=argument)
    assert run.code == 0 and run.arm["status"] == "ok", run.output
    assert [a["spec"] for a in run.report["arms"]] == ["cpu"]  # not an arm named by the file
    assert run.report["repro"]["name"] == name
    assert run.arm["stdout"] == f"{case} tensor([2., 2., 2.])\n"


@pytest.mark.slow
@pytest.mark.parametrize("arms, says", [
    ("cpu,cdua", "unknown device 'cdua'"),
    ("cpu/tf32=of", "knob 'tf32' in arm 'cpu/tf32=of' must be one of on, off, not 'of'"),
    ("cpu/compile=nonexistent_backend", "unknown compile backend 'nonexistent_backend'"),
    ("", "--arms is empty"),
    ("cpu,cpu", "arm 'cpu' is given twice"),
])
def test_case_082_bad_arm_specs_are_usage_errors(tmp_path, arms, says):
    run = triage_run(tmp_path, "import torch\nprint(torch.ones(2))\n", arms=arms)
    assert run.code == 2 and says in run.output, run.output
    assert run.report is None and run.seconds < 30  # refused before any arm


@pytest.mark.slow
@pytest.mark.parametrize("option, value, says", [
    ("--timeout", "0", "Invalid value for '--timeout'"),
    ("--jobs", "0", "Invalid value for '--jobs'"),
    ("--memory", "abc", "'abc' is not a size"),
])
def test_case_083_bad_option_values_are_usage_errors(tmp_path, option, value, says):
    run = triage_run(tmp_path, "import torch\nprint(torch.ones(2))\n", option, value)
    assert run.code == 2 and says in run.output, run.output
    assert run.report is None and run.seconds < 30


@pytest.mark.slow
@pytest.mark.parametrize("what", ["missing file", "directory", "cuda arm without CUDA"])
def test_case_086_missing_file_directory_or_unavailable_device_cannot_run(tmp_path, what):
    if what == "missing file":
        run = triage_run(tmp_path, None, name="nonexistent.py")
        assert run.report["repro"]["problem"] == f"no such file: {tmp_path / 'nonexistent.py'}"
        assert run.report["arms"] == []
    elif what == "directory":
        (tmp_path / "adir").mkdir()
        run = triage_run(tmp_path, None, name="adir")
        assert run.report["repro"]["problem"] == f"{tmp_path / 'adir'} is a directory, not a Python script"
        assert run.report["arms"] == []
    else:  # a CPU machine, wherever the test runs: no device is visible to the arm
        run = triage_run(tmp_path, "import torch\nprint(torch.ones(2))\n", arms="cuda",
                         env={"CUDA_VISIBLE_DEVICES": ""})
        assert run.arm["status"] == "unavailable"
        assert run.arm["failure"].startswith("no CUDA device is available to this torch build on this machine")
    assert run.code == 3 and run.report["verdict"]["kind"] == "could-not-run", run.output


# == issue body / event ========================================================================
@pytest.mark.slow
@pytest.mark.parametrize("body", [
    "`" * 1_100_000,
    "# heading\n" * 120_000,
    ">>> import torch\n>>> torch.ones(3) * 2\ntensor([2., 2., 2.])\n" * 19_000,
], ids=["backticks", "headings", "transcript"])
def test_case_089_oversize_bodies_are_refused_cleanly(tmp_path, body):
    run = triage_issue(tmp_path, event(body))
    assert run.code == 3 and run.report["verdict"]["kind"] == "could-not-run", run.output
    assert run.report["issue"]["extraction"]["problem"] == \
        f"the issue body is {len(body)} characters; triage reads bodies up to 1048576 characters"
    assert run.report["arms"] == [] and not (run.folder / "repro.py").exists()
    assert run.seconds < 30


HOSTILE_BODIES = {
    "30000_fences": "```python\nimport torch\n```\n" * 30_000,
    "20000_nested_fences": "".join("`" * (3 + i % 50) + "python\n" for i in range(20_000))
                           + "import torch\nprint(torch.ones(2))\n",
    "1_mb_string_literal": "```python\nimport torch\ns = '" + "a" * 1_000_000
                           + "'\nprint(torch.ones(2) * len(s))\n```\n",
    "nul_and_esc_in_code": "```python\nimport torch\nx = torch.ones(2)\x00\x1b]0;PWNED\x07\nprint(x)\n```\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(HOSTILE_BODIES))
def test_case_090_hostile_bodies_are_bounded(tmp_path, kind):
    run = triage_issue(tmp_path, event(HOSTILE_BODIES[kind]))
    assert run.report is not None and run.seconds < 60, run.output
    arms = run.report["arms"]
    if kind == "30000_fences":
        assert run.code == 0 and [a["status"] for a in arms] == ["ok"], run.output
        notes = run.report["issue"]["extraction"]["notes"]
        assert "used code block 1 of 30000 (the largest that imports torch)" in notes
    elif kind == "1_mb_string_literal":
        assert run.code == 0 and [a["status"] for a in arms] == ["ok"], run.output
        assert arms[0]["stdout"] == "tensor([1000000., 1000000.])\n"
    else:
        assert run.code == 3 and run.report["verdict"]["kind"] == "could-not-run" and arms == [], run.output
        if kind == "nul_and_esc_in_code":
            assert "contains a NUL (zero) byte" in run.report["repro"]["problem"]


@pytest.mark.slow
def test_case_091_lone_surrogate_in_the_body_is_a_usage_error(tmp_path):
    body = "```python\nimport torch\nprint('\ud800', torch.ones(2))\n```\n"
    run = triage_issue(tmp_path, json.dumps(event(body)))  # ASCII JSON: "\ud800" as an escape
    assert run.code == 2, run.output
    assert "cannot read the event" in run.output and "surrogates not allowed" in run.output
    assert run.report is None


@pytest.mark.slow
@pytest.mark.parametrize("field", ["number_as_string", "body_as_list", "user_as_string"])
def test_case_093_wrongly_typed_event_fields_are_clean(tmp_path, field):
    if field == "number_as_string":
        run = triage_issue(tmp_path, event("```python\nimport torch\n```\n", number="7"))
        assert run.code == 2 and "the event's issue.number '7' is not an issue number" in run.output, run.output
        assert run.report is None
    elif field == "body_as_list":
        run = triage_issue(tmp_path, event(["```python", "import torch", "print(torch.ones(2))", "```"]))
        assert run.code == 3 and run.report["issue"]["extraction"]["problem"] == "the issue body is empty", run.output
    else:
        run = triage_issue(tmp_path, event("numbers differ on my machine, no code", user="mallory"))
        assert run.code == 3 and run.report["issue"]["author"] == "", run.output
        assert run.report["verdict"]["kind"] == "could-not-run"


# == posting (`triage post` against the local GitHub server) =====================================
REPO, NUMBER, TRIGGER = "octo/demo", 7, "bot: triage"
BODY = "### 🐛 Describe the bug\n\n```python\nimport torch\nprint(torch.ones(3))\n```\n"
BODY_13 = "### 🐛 Describe the bug\n\n```python\nimport torch\nprint(torch.zeros(3))\n```\n"
ALLOWED = ["needs reproduction", "module: numerical-stability"]


@pytest.fixture
def github():
    server = FakeGitHub().start()
    server.add_issue(REPO, NUMBER, BODY, labels=[TRIGGER])
    server.add_issue(REPO, 13, BODY_13, labels=[])  # same repo, not labelled for triage
    server.add_issue("evil/other", NUMBER, BODY, labels=[TRIGGER])
    yield server
    server.stop()


def make_report(number: int = NUMBER, body: str = BODY, repo: str = REPO, labels: list[str] | None = None) -> dict:
    repro = Repro(path="", name="repro.py", source="import torch\n", problem="no such file")
    verdict = classify(repro, None)
    verdict.labels = list(ALLOWED if labels is None else labels)
    issue = Issue(repo=repo, number=number, title="t", url="u", author="reporter", body_sha256=body_sha256(body),
                  extraction=extract_issue_body(body))
    data = report_json(Report(repro=repro, arms_requested=["cpu"], comparison=None, verdict=verdict,
                              triage_version=__version__, seconds=0.1, issue=issue))
    assert validate_report(data) == []
    return data


def post(github: FakeGitHub, tmp_path: Path, report: dict | str, *args: str, token: str = "bot-token",
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`triage post` as the Action's post step runs it (a token, the API URL, the caller's options)."""
    path = tmp_path / "report.json"
    path.write_text(report if isinstance(report, str) else json.dumps(report))
    return subprocess.run([sys.executable, "-m", "triage", "post", "--report", str(path), "--api-url", github.api_url,
                           *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=_env({"GITHUB_TOKEN": token, **(env or {})}))


BOUND = ("--repo", REPO, "--expect-issue", str(NUMBER), "--trigger-label", TRIGGER)


def _labels(github: FakeGitHub, number: int = NUMBER, repo: str = REPO) -> list[str]:
    return github.issues[(repo, number)]["labels"]


@pytest.mark.slow
def test_case_095_a_valid_report_is_posted_labelled_and_the_trigger_removed(github, tmp_path):
    proc = post(github, tmp_path, make_report(), *BOUND)
    assert proc.returncode == 0, proc.stderr
    [comment] = github.comments
    assert (comment["repo"], comment["number"], comment["login"]) == (REPO, NUMBER, "triage-bot")
    assert comment["body"].startswith(MARKER) and "could-not-run" in comment["body"]
    assert sorted(_labels(github)) == sorted(ALLOWED)  # suggested labels added, trigger label removed
    assert "created comment" in proc.stderr and f"removed '{TRIGGER}'" in proc.stderr


@pytest.mark.slow
def test_case_096_report_about_another_repository_is_refused(github, tmp_path):
    proc = post(github, tmp_path, make_report(repo="evil/other"), "--expect-issue", str(NUMBER),
                "--trigger-label", TRIGGER, env={"GITHUB_REPOSITORY": REPO})
    assert proc.returncode == 2, proc.stderr
    assert "the report is about evil/other, not octo/demo" in proc.stderr and "Traceback" not in proc.stderr
    assert github.requests == [] and github.comments == []
    assert _labels(github, repo="evil/other") == [TRIGGER]


@pytest.mark.slow
def test_case_099_issue_without_the_trigger_label_is_refused(github, tmp_path):
    proc = post(github, tmp_path, make_report(number=13, body=BODY_13), "--repo", REPO, "--expect-issue", "13",
                "--trigger-label", TRIGGER)
    assert proc.returncode == 4, proc.stderr
    assert f"not posted: {REPO}#13 no longer carries the trigger label '{TRIGGER}'; nothing posted" in proc.stderr
    assert github.writes() == [] and github.comments == [] and _labels(github, 13) == []


@pytest.mark.slow
def test_case_101_body_changed_since_the_run_is_refused(github, tmp_path):
    proc = post(github, tmp_path, make_report(body=BODY + "\nedited after the run\n"), *BOUND)
    assert proc.returncode == 4, proc.stderr
    assert f"the body of {REPO}#{NUMBER} changed after the repro was run; nothing posted" in proc.stderr
    assert github.writes() == [] and github.comments == [] and _labels(github) == [TRIGGER]


@pytest.mark.slow
def test_case_103_huge_issue_number_is_a_clean_failure(github, tmp_path):
    data = make_report()
    data["issue"]["number"] = 10**30
    proc = post(github, tmp_path, data, "--repo", REPO, "--expect-issue", str(10**30), "--trigger-label", TRIGGER)
    assert proc.returncode in (2, 4), proc.stderr
    assert "Traceback" not in proc.stderr
    assert "is not a report triage will post" in proc.stderr or "not posted:" in proc.stderr
    assert github.writes() == [] and github.comments == []


@pytest.mark.slow
def test_case_104_unknown_top_level_field_is_refused(github, tmp_path):
    data = dict(make_report(), planted={"anything": 1})
    proc = post(github, tmp_path, data, *BOUND)
    assert proc.returncode == 2 and "'planted' was unexpected" in proc.stderr, proc.stderr
    assert github.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("where, value, says", [
    ("labels", "oncall: pt2", "verdict/labels: 'oncall: pt2' is not of type 'array'"),
    ("seconds", "0.1", "seconds: '0.1' is not valid"),
])
def test_case_107_wrong_types_are_refused(github, tmp_path, where, value, says):
    data = make_report()
    if where == "labels":
        data["verdict"]["labels"] = value
    else:
        data["seconds"] = value
    proc = post(github, tmp_path, data, *BOUND)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert github.requests == []


@pytest.mark.slow
def test_case_108_only_allowlisted_labels_are_applied(github, tmp_path):
    proc = post(github, tmp_path, make_report(labels=["high priority", "oncall: pt2", "module: numerical-stability"]),
                *BOUND)
    assert proc.returncode == 0, proc.stderr
    assert sorted(_labels(github)) == ["module: numerical-stability", "oncall: pt2"]  # the default allowlist
    assert "not on the allowlist: high priority" in proc.stderr
    github.issues[(REPO, NUMBER)]["labels"] = [TRIGGER]
    proc = post(github, tmp_path, make_report(labels=["high priority", "oncall: pt2", "module: numerical-stability"]),
                *BOUND, "--allowed-labels", "module: numerical-stability")
    assert proc.returncode == 0, proc.stderr
    assert _labels(github) == ["module: numerical-stability"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["nan_literal", "100000_deep", "over_64_mib"])
def test_case_113_nan_deep_nesting_and_oversize_reports_are_refused(github, tmp_path, kind):
    text = json.dumps(make_report())
    assert '"seconds": 0.1' in text
    if kind == "nan_literal":
        text = text.replace('"seconds": 0.1', '"seconds": NaN')
        says = "NaN is not JSON"
    elif kind == "100000_deep":
        text = text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
        says = "not JSON"
    else:
        text = text[:-1] + ', "pad": "' + "x" * (65 << 20) + '"}'
        says = "a report is at most 64 MiB"
    proc = post(github, tmp_path, text, *BOUND)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert github.requests == []


@pytest.mark.slow
def test_case_114_pasted_marker_and_unmarked_bot_comment_are_left_alone(github, tmp_path):
    pasted = github.add_comment(REPO, NUMBER, MARKER + " digest=0000000000000000 -->\nfake verdict", login="mallory")
    unmarked = github.add_comment(REPO, NUMBER, "an earlier note by the bot, without the marker", login="triage-bot")
    proc = post(github, tmp_path, make_report(), *BOUND)
    assert proc.returncode == 0 and "created comment" in proc.stderr, proc.stderr
    assert [m for m, _, _ in github.writes()].count("PATCH") == 0  # no comment edited
    assert pasted["body"].endswith("fake verdict") and unmarked["body"].startswith("an earlier note")
    new = [c for c in github.comments_on(REPO, NUMBER) if c["id"] not in (pasted["id"], unmarked["id"])]
    assert len(new) == 1 and new[0]["login"] == "triage-bot" and new[0]["body"].startswith(MARKER)


@pytest.mark.slow
def test_case_115_the_same_report_again_leaves_the_comment_unchanged(github, tmp_path):
    assert post(github, tmp_path, make_report(), *BOUND).returncode == 0
    [comment] = github.comments
    body = comment["body"]
    github.issues[(REPO, NUMBER)]["labels"].append(TRIGGER)  # a maintainer asks again
    writes = len(github.writes())
    proc = post(github, tmp_path, make_report(), *BOUND)
    assert proc.returncode == 0 and "unchanged comment" in proc.stderr, proc.stderr
    assert github.comments == [comment] and comment["body"] == body
    assert [m for m, path, _ in github.writes()[writes:]] == ["DELETE"]  # only the trigger label removed


@pytest.mark.slow
def test_case_115_an_empty_allowlist_applies_no_label(github, tmp_path):
    proc = post(github, tmp_path, make_report(), *BOUND, "--allowed-labels", "")
    assert proc.returncode == 0, proc.stderr
    assert _labels(github) == []  # nothing added; the trigger label removed
    assert "not on the allowlist: needs reproduction, module: numerical-stability" in proc.stderr


@pytest.mark.slow
def test_case_115_a_bad_token_exits_4_and_writes_nothing(github, tmp_path):
    proc = post(github, tmp_path, make_report(), *BOUND, token="not-a-token")
    assert proc.returncode == 4 and "Bad credentials" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert github.writes() == [] and github.comments == [] and _labels(github) == [TRIGGER]
