"""Hostile repro scripts from the reliability review (/work/shared/findings/hostile-cases.md):
each test runs the case's script through the real CLI (or, for the parser limits, through
`triage.extract`) and checks what triage reports now."""
import json
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import FIXTURES, run_triage

from triage.extract import IN_PROCESS_PARSE_BYTES, TOO_COMPLEX, compile_problem, extract_repro, parse_python

QUICK = ("--no-minimize", "--no-ablate", "--minimal", "-")


def run_script(tmp_path, source: str, *extra: str, name: str = "repro.py"):
    """`triage run` on `source` (one cpu arm); returns (exit code, report, output, seconds)."""
    script = tmp_path / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(textwrap.dedent(source))
    started = time.monotonic()
    code, report, _, out = run_triage(script, "cpu", tmp_path, *QUICK, *extra)
    return code, report, out, time.monotonic() - started


def only_arm(report: dict) -> dict:
    (arm,) = report["arms"]
    return arm


# --- R7: output and the crash site survive a crash, a hang and os._exit -------------------

@pytest.mark.slow
def test_case_065_output_printed_before_os_exit_is_kept(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import os, torch
        x = torch.ones(3) * 2
        print(x)
        print("partial line without a newline", end="")
        os._exit(0)
    """)
    arm = only_arm(report)
    assert code == 3 and arm["status"] == "crashed", out
    assert "os._exit" in arm["failure"]
    assert arm["stdout"] == "tensor([2., 2., 2.])\npartial line without a newline"


@pytest.mark.slow
def test_case_066_segfault_keeps_output_and_faulthandler_trace(tmp_path):
    code, report, out, _ = run_triage(FIXTURES / "bad" / "segfault.py", "cpu", tmp_path, *QUICK)
    arm = only_arm(report)
    assert code == 3 and arm["status"] == "crashed", out
    assert arm["stdout"] == "2.0\n"
    assert "Fatal Python error: Segmentation fault" in arm["stderr"]
    assert arm["failure"].startswith("the process died with SIGSEGV (segmentation fault); last script frame: File ")
    assert 'segfault.py", line 4 in <module>' in arm["failure"]


@pytest.mark.slow
def test_case_067_output_printed_before_a_hang_is_kept(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import time, torch          # --timeout 8: the report's stdout is empty
        x = torch.ones(3) * 2
        print("IMPORTANT OUTPUT BEFORE THE HANG", x)
        while True:
            time.sleep(0.5)
    """, "--timeout", "8")
    arm = only_arm(report)
    assert code == 3 and arm["status"] == "timeout", out
    assert "IMPORTANT OUTPUT BEFORE THE HANG tensor([2., 2., 2.])" in arm["stdout"]


# --- R6: threads and atexit handlers that outlive the script ------------------------------

@pytest.mark.slow
def test_case_062_a_non_daemon_thread_does_not_hold_the_worker(tmp_path):
    code, report, out, seconds = run_script(tmp_path, """
        import threading, time, torch
        threading.Thread(target=lambda: time.sleep(1000)).start()   # non-daemon
        x = torch.ones(3) * 2
        print(x)
    """, "--timeout", "20")
    arm = only_arm(report)
    assert code == 0 and arm["status"] == "ok" and arm["failure"] is None, out
    assert report["observables"] and seconds < 60


@pytest.mark.slow
def test_case_063_a_slow_atexit_handler_does_not_hold_the_worker(tmp_path):
    code, report, out, seconds = run_script(tmp_path, """
        import atexit, time, torch
        atexit.register(lambda: time.sleep(1000))
        x = torch.ones(3) * 2
        print(x)
    """, "--timeout", "20")
    arm = only_arm(report)
    assert code == 0 and arm["status"] == "ok" and arm["failure"] is None, out
    assert arm["stdout"] == "tensor([2., 2., 2.])\n" and seconds < 60


# --- R8: modes the script enters and never leaves ----------------------------------------

@pytest.mark.slow
def test_case_047_modes_left_on_the_stack_are_removed_before_triages_bookkeeping(tmp_path):
    code, report, out, seconds = run_script(tmp_path, """
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.overrides import TorchFunctionMode
        class Lie(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.ops.aten.mul.Tensor:
                    out = out + 1000.0
                return out
        class F(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))
        Lie().__enter__()   # entered, never exited
        F().__enter__()
        x = torch.ones(3)
        y = x * 2
        print(y)
    """)
    arm = only_arm(report)
    assert code == 0 and arm["status"] == "ok", out
    assert arm["stdout"] == "tensor([1002., 1002., 1002.])\n"
    # Only the script's own values: the print and the tensors alive at exit, none of triage's.
    assert len(report["observables"]) <= 4, [o["label"] for o in report["observables"]]
    assert arm["exit_note"] == ("the script left its own torch modes `F`, `Lie` active; triage removed them when "
                                 "the script ended")
    assert seconds < 60


# --- U3: a hook's raise and a bare KeyboardInterrupt are crashes, not claims --------------

@pytest.mark.slow
def test_case_045_a_raise_in_the_scripts_tracer_is_a_crash(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import sys, torch
        x = torch.ones(3)
        print(x * 2)
        events = 0
        def tracer(frame, event, arg):
            global events
            events += 1
            if events > 200000:
                raise RuntimeError("tracer gave up")
            return tracer
        sys.settrace(tracer)
        for _ in range(100000):
            y = x * 2
        print(y)
    """)
    arm = only_arm(report)
    assert arm["status"] == "raised" and arm["exception"]["claim"] is False, out
    assert arm["failure"].startswith("RuntimeError at line 10: tracer gave up")
    # Values were observed before it: they are judged, and the verdict says where it stopped.
    assert_judged_as_far_as_it_got(code, report)


@pytest.mark.slow
def test_case_046_a_raise_in_the_scripts_profile_hook_is_a_crash(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import os, sys, torch
        x = torch.ones(3)
        print(x * 2)
        def profiler(frame, event, arg):
            if "triage/worker" in frame.f_code.co_filename.replace(os.sep, "/"):
                raise RuntimeError("profile hook refuses triage's frames")
        sys.setprofile(profiler)
        y = x * 3
        print(y)
    """)
    arm = only_arm(report)
    assert arm["status"] == "raised" and arm["exception"]["claim"] is False, out
    assert arm["failure"].startswith("RuntimeError at line 7: profile hook refuses triage's frames")
    # Values were observed before it: they are judged, and the verdict says where it stopped.
    assert_judged_as_far_as_it_got(code, report)


@pytest.mark.slow
def test_case_045_046_hooks_are_removed_before_triages_own_work(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import os, sys, threading, torch
        def watch(frame, event, arg):
            if "triage/worker/reference.py" in frame.f_code.co_filename.replace(os.sep, "/"):
                os.write(1, b"HOOK SAW THE FLOAT64 REPLAY\\n")
            return watch
        sys.settrace(watch)
        sys.setprofile(watch)
        threading.settrace(watch)
        x = torch.ones(3)
        print(torch.exp(x * 2))
    """)
    arm = only_arm(report)
    assert code == 0 and arm["status"] == "ok", out
    assert report["arms"][0]["reference"]["status"] == "complete"
    assert "HOOK SAW" not in arm["stdout"]


@pytest.mark.slow
def assert_judged_as_far_as_it_got(code, report):
    v = report["verdict"]
    assert code == 0 and v["kind"] != "could-not-run", v["summary"]
    assert "The script did not finish: `cpu` stopped with" in v["summary"]


def test_case_070_a_bare_keyboard_interrupt_is_a_crash(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import torch
        x = torch.ones(3) * 2
        print(x)
        raise KeyboardInterrupt
    """)
    arm = only_arm(report)
    assert arm["status"] == "raised" and arm["exception"]["claim"] is False and arm["exit_note"] is None, out
    assert arm["failure"].startswith("KeyboardInterrupt at line 5")
    # Values were observed before it: they are judged, and the verdict says where it stopped.
    assert_judged_as_far_as_it_got(code, report)


# --- U4: a script that replaces what triage's worker uses --------------------------------

@pytest.mark.slow
def test_case_044_replaced_print_and_json_dumps_do_not_break_the_worker(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import builtins, json, torch
        builtins.print = lambda *a, **k: None
        json.dumps = lambda *a, **k: "not json"
        json.JSONEncoder.encode = lambda self, o: "not json"
        x = torch.ones(3) * 2
        print(x)
    """)
    arm = only_arm(report)
    assert code == 0 and arm["status"] == "ok" and arm["failure"] is None, out
    assert report["verdict"]["kind"] == "not-reproduced" and report["observables"]


# --- U5: torch's default device collapses onto the arm -----------------------------------

@pytest.mark.slow
def test_case_050_default_device_cuda_collapses_onto_a_cpu_arm(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import torch
        torch.set_default_device("cuda")
        x = torch.ones(3)
        with torch.device("cuda:0"):
            z = torch.zeros(2)
        y = torch.exp(x * 2)
        print(y, z.device)
    """)
    arm = only_arm(report)
    assert code == 0 and arm["status"] == "ok", out
    assert arm["stdout"] == "tensor([7.3891, 7.3891, 7.3891]) cpu\n"
    assert report["arms"][0]["reference"]["status"] == "complete"


# --- U2 and U6: the failures say what went wrong -----------------------------------------

@pytest.mark.slow
def test_case_058_relative_data_file_gets_a_hint(tmp_path):
    (tmp_path / "repro").mkdir()
    (tmp_path / "repro" / "data.txt").write_text("2.0\n")
    code, report, out, _ = run_script(tmp_path, """
        import sys, torch
        print(sys.argv, __file__, __name__)
        x = torch.ones(3)
        with open("data.txt") as f:
            scale = float(f.read())
        print(x * scale)
    """, name="repro/repro.py")
    arm = only_arm(report)
    assert code == 3 and arm["status"] == "raised", out
    assert arm["failure"] == ("FileNotFoundError at line 5: [Errno 2] No such file or directory: 'data.txt' — the "
                              "script opens 'data.txt' by a relative path; triage runs it in an empty scratch "
                              "directory and does not copy the files next to it")


@pytest.mark.slow
def test_case_060_spawn_without_main_guard_names_the_real_reason(tmp_path):
    code, report, out, _ = run_script(tmp_path, """
        import multiprocessing as mp, torch
        def work(q):
            q.put(torch.ones(3).sum().item())
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=work, args=(q,))
        p.start()
        p.join()
        print(q.get(timeout=1))
    """)
    arm = only_arm(report)
    assert code == 3 and arm["status"] == "raised", out
    assert arm["failure"].startswith("Empty at line 10")
    assert "`if __name__ == '__main__':`" in arm["failure"] and "bootstrapping phase" in arm["stderr"]


@pytest.mark.slow
def test_case_074_nul_byte_names_its_line(tmp_path):
    script = tmp_path / "nul.py"
    script.write_bytes(b"import torch\nx = torch.ones(3)\n\nprint(x)\x00\n")
    code, report, _, out = run_triage(script, "cpu", tmp_path, *QUICK)
    assert code == 3 and report["verdict"]["kind"] == "could-not-run", out
    summary = report["verdict"]["summary"]
    assert "nul.py contains a NUL (zero) byte, which Python source cannot contain (line 4)" in summary
    assert "None" not in summary


@pytest.mark.parametrize("size", ["1K", "0", "0.1G"])
def test_case_084_085_memory_below_what_an_arm_needs_is_a_usage_error(tmp_path, size):
    script = tmp_path / "repro.py"
    script.write_text("import torch\nprint(torch.ones(2))\n")
    code, report, _, out = run_triage(script, "cpu", tmp_path, *QUICK, "--memory", size)
    assert code == 2 and report is None
    assert f"Invalid value for --memory: '{size}' is less than the 512M an arm needs to start" in out


# --- R5: sources too deep for Python's parser --------------------------------------------

DEEP_SUBSCRIPTS = "import torch\nx = torch.ones(3)\ny = x" + "[0:3]" * 150000 + "\nprint(y)\n"
MINUS_SIGNS = "import torch\nx = " + "-" * 100000 + "1\n"


@pytest.mark.slow
@pytest.mark.parametrize("source", [DEEP_SUBSCRIPTS, MINUS_SIGNS], ids=["case_077_subscripts", "case_078_minus"])
def test_case_077_078_too_deep_for_the_parser_is_a_could_not_run_report(tmp_path, source):
    script = tmp_path / "deep.py"
    script.write_text(source)
    code, report, _, out = run_triage(script, "cpu", tmp_path, *QUICK)
    assert code == 3 and report["verdict"]["kind"] == "could-not-run", out
    assert f"deep.py {TOO_COMPLEX}" in report["verdict"]["summary"]
    assert "Traceback" not in out


@pytest.mark.slow
def test_case_088_issue_with_a_too_deep_fence_gets_a_report(tmp_path):
    body = "### 🐛 Describe the bug\n\n```python\n" + DEEP_SUBSCRIPTS + "```\n"
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"action": "labeled", "repository": {"full_name": "octo/demo"},
                                 "issue": {"number": 88, "title": "deep", "body": body, "user": {"login": "r"}}}))
    done = subprocess.run([sys.executable, "-m", "triage", "issue", "--event", str(event),
                           "--out", str(tmp_path / "out"), "--arms", "cpu", "--quiet", "--no-minimize", "--no-ablate"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert done.returncode == 3 and report["verdict"]["kind"] == "could-not-run", done.stderr
    assert f"repro.py {TOO_COMPLEX}" in report["verdict"]["summary"]
    assert (tmp_path / "out" / "comment.md").exists()


def test_case_077_078_parser_limits_hold_in_triages_own_process():
    """Every parse of a large source goes through the bounded subprocess and gives up in seconds."""
    for source in (DEEP_SUBSCRIPTS, MINUS_SIGNS, "x = " + "(" * 150000 + "1" + ")" * 150000,
                   "x = " + "[" * 150000 + "]" * 150000):
        started = time.monotonic()
        assert compile_problem(source.encode(), "deep.py") is not None
        assert parse_python(source) is None
        assert time.monotonic() - started < 30


def test_sources_up_to_the_in_process_size_parse_quickly_here():
    """The shapes that make the parser blow up on large inputs stay cheap at the in-process size."""
    chains = ["[0:3]", "-", "(", "[", "f(", ".b", "+1", "lambda: ", "not ", "**1", "<1", "[*", "{1:", " 'a'"]
    for chain in chains:
        source = "x = y" + chain * ((IN_PROCESS_PARSE_BYTES - 8) // len(chain))
        assert len(source) <= IN_PROCESS_PARSE_BYTES
        started = time.monotonic()
        parse_python(source)
        compile_problem(source.encode(), "s.py")
        assert time.monotonic() - started < 2, chain


def test_large_legitimate_source_still_parses(tmp_path):
    """A pasted tensor literal near the 2 MiB source limit goes through the subprocess and passes."""
    rows = ",\n".join("    [0.1234, -0.5678, 1e-3, 2.5]" for _ in range(40000))
    script = tmp_path / "literal.py"
    script.write_text(f"import torch\nx = torch.tensor([\n{rows}\n])\nprint(x.sum())\n")
    assert len(script.read_bytes()) > IN_PROCESS_PARSE_BYTES
    assert extract_repro(script).problem is None
    assert parse_python(script.read_text()) is not None
