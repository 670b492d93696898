"""An arm knob and the script's own setting of the same switch (`cpu/threads=1` against the
script's `torch.set_num_threads(2)`): recorded in the arm, checked by the parent, said in the notes."""
import json
import subprocess
import sys
import textwrap

import pytest

from triage.arms.output import RESULT
from triage.model import ArmRun
from triage.pipeline import _knob_call_notes

SCRIPT = textwrap.dedent("""\
    import torch

    x = torch.rand(100_000)
    torch.set_num_threads(2)
    a = x.sum()
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    with torch.backends.mkldnn.flags(enabled=False):
        b = x.sum()
    torch.use_deterministic_algorithms(True)
    print("threads", torch.get_num_threads())
    """)

# The worker's watch, in a process of its own (it replaces torch's setters): the script's
# calls, then triage's own after it, which are not the script's.
WATCH = textwrap.dedent("""\
    import json, sys, torch
    from triage.worker import envinfo
    script, knobs = sys.argv[1], {"threads": "1", "mkldnn": "on"}
    envinfo.apply_knobs(knobs)
    calls = envinfo.watch_knob_calls(knobs, script)
    exec(compile(open(script).read(), script, "exec"), {"__name__": "__main__"})
    torch.set_num_threads(3)
    torch.backends.mkldnn.enabled = False
    print(json.dumps(calls))
    """)


def test_the_worker_records_the_scripts_own_calls_only(tmp_path):
    script = tmp_path / "repro.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-c", WATCH, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed, calls = proc.stdout.splitlines()
    assert printed == "threads 1"  # the arm's thread count held
    # set_num_threads(1) asks for the arm's own value; the arm has no `deterministic` knob, so
    # that call is recorded whatever its value (where a setting changes between two values).
    assert json.loads(calls) == [{"setter": "set_num_threads", "value": 2, "line": 4},
                                 {"setter": "_set_mkldnn_enabled", "value": False, "line": 7},
                                 {"setter": "_set_mkldnn_enabled", "value": False, "line": 8},
                                 {"setter": "_set_deterministic_algorithms", "value": True, "line": 10}]


def test_an_arm_without_knobs_records_every_setting_call_and_lets_it_act(tmp_path):
    """With no knob pinning them, the script's calls act as without triage (the thread count is
    the script's) and each is recorded: the report places them between the values they split."""
    script = tmp_path / "repro.py"
    script.write_text(SCRIPT)
    unpinned = WATCH.replace('{"threads": "1", "mkldnn": "on"}', "{}")
    proc = subprocess.run([sys.executable, "-c", unpinned, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed, calls = proc.stdout.splitlines()
    assert printed == "threads 1"  # the script's own last call
    assert json.loads(calls) == [{"setter": "set_num_threads", "value": 2, "line": 4},
                                 {"setter": "set_num_threads", "value": 1, "line": 6},
                                 {"setter": "_set_mkldnn_enabled", "value": False, "line": 7},
                                 {"setter": "_set_mkldnn_enabled", "value": False, "line": 8},
                                 {"setter": "_set_deterministic_algorithms", "value": True, "line": 10}]


@pytest.mark.parametrize("call, refused", [
    ({"setter": "set_num_threads", "value": 2, "line": 4}, False),
    ({"setter": "_set_float32_matmul_precision", "value": "high", "line": 4}, False),
    ({"setter": "os.system", "value": True, "line": 4}, True),
    ({"setter": "set_num_threads", "value": 10 ** 6, "line": 4}, True),
    ({"setter": "set_num_threads", "value": "2; rm -rf /", "line": 4}, True),
    ({"setter": "set_num_threads", "value": 2, "line": 4, "note": "anything"}, True),
    ({"setter": "set_num_threads", "value": 2}, True),
])
def test_the_parent_checks_the_recorded_calls(call, refused):
    assert (RESULT({"status": "ok", "knob_calls": [call]}) is not None) == refused


def test_only_a_call_on_the_arms_own_knob_with_its_own_kind_of_value_is_a_note():
    run = ArmRun(spec="cpu/threads=1", device="cpu", mode="eager", status="ok", knob_calls=[
        {"setter": "set_num_threads", "value": 2, "line": 4},
        {"setter": "set_num_threads", "value": 1, "line": 5},  # the arm's own value: nothing overridden
        {"setter": "_set_mkldnn_enabled", "value": False, "line": 6},  # no mkldnn knob on this arm
        {"setter": "set_num_threads", "value": True, "line": 7},  # not a thread count
    ])
    assert _knob_call_notes(run) == [
        "`cpu/threads=1`: the script calls `torch.set_num_threads(2)` (line 4); the arm's `threads=1` overrode it "
        "(the arm holds its thread count for the whole run, so that call had no effect here)."]


@pytest.mark.slow
def test_a_knob_the_script_also_sets_is_said_in_the_notes(triage, tmp_path):
    script = tmp_path / "repro.py"
    script.write_text(SCRIPT)
    code, report, comment, out = triage(script, "cpu,cpu/threads=1,cpu/mkldnn=on", "--no-minimize", "--no-ablate",
                                        "--rounding-samples", "0")
    assert code == 0, out
    knob_notes = [n for n in report["notes"] if "the script calls" in n or "the script sets" in n]
    assert knob_notes == [
        "`cpu/threads=1`: the script calls `torch.set_num_threads(2)` (line 4); the arm's `threads=1` overrode it "
        "(the arm holds its thread count for the whole run, so that call had no effect here).",
        "`cpu/mkldnn=on`: the script sets `torch.backends.mkldnn.enabled = False` (line 7), overriding the arm's "
        "`mkldnn=on`: the script's setting held from that line until the script set it back, if it did.",
        "`cpu/mkldnn=on`: the script sets `torch.backends.mkldnn.enabled = False` (line 8), overriding the arm's "
        "`mkldnn=on`: the script's setting held from that line until the script set it back, if it did."]
    assert "the script calls <code>torch.<wbr>set\\_num\\_threads(2)</code> (line 4); the arm's <code>threads=1</code> " \
           "overrode it" in comment
    threads_arm = next(a for a in report["arms"] if a["spec"] == "cpu/threads=1")
    assert "threads 1" in threads_arm["stdout"]
