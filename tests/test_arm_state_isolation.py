"""A script that changes torch's module state cannot reach another arm, nor the fresh runs that
verify the minimal repro.

The probe script reads every piece of state it later changes (a marker attribute on `torch`,
monkeypatched functions and operators, global numerics settings, the seed, the environment, a
file in HOME and in its working directory, a module in `sys.modules`), folds what it found into
`leaks` (one bit per piece), prints `leaks` and adds it to the value it computes; only then does
it change all of that state.  A process that ran the script before therefore computes a
different value, by construction: the fast test below shows it by running the script twice in
one interpreter.  End to end, every arm must print `leaks: 0` and observe the unleaked value.

The minimal repro's verification cannot read the probe (triage writes that script), so there
the construction is the monkeypatch: the script replaces `torch.mm` (and `torch.matmul`, `@`,
`Tensor.mm`, `Tensor.matmul`) with a stand-in that returns zeros without calling `aten.mm`.  The
fault arm perturbs `aten.mm` only, so a verification process that inherited the patch would see
both arms agree, and the minimal repro would not verify.

Not probed: `/tmp` (the jail's scratch under the namespace sandbox, but the host's own in the
process-only fallback, where a probe file would outlive the test) and the compile cache, which
the arms and the verification of one run share on purpose (sandbox/caches.py).
"""
import os
import re
import subprocess
import sys
import textwrap
from math import erf, sqrt

import pytest

PROBE = textwrap.dedent('''\
    import os
    import sys

    import torch

    PROBE_FILES = (os.path.join(os.path.expanduser("~"), "triage_probe"), "triage_probe")
    seen = [
        getattr(torch, "_triage_probe", 0) != 0,
        getattr(torch.nn.functional.gelu, "_triage_probe", False),
        getattr(torch.Tensor.__add__, "_triage_probe", False),
        getattr(torch.mm, "_triage_probe", False) or getattr(torch.Tensor.__matmul__, "_triage_probe", False),
        torch.get_default_dtype() != torch.float32,
        not torch.backends.mkldnn.enabled,
        torch.get_float32_matmul_precision() != "highest",
        torch.are_deterministic_algorithms_enabled(),
        torch.initial_seed() == 20240229,
        "TRIAGE_PROBE" in os.environ,
        "triage_probe_module" in sys.modules,
        any(os.path.exists(p) for p in PROBE_FILES),
    ]
    leaks = sum(1 << i for i, s in enumerate(seen) if s)
    print(f"leaks: {leaks} of {(1 << len(seen)) - 1}")
''')

MODIFY = textwrap.dedent('''\

    def gelu(t, approximate="none"):
        return t


    def add(self, other):
        return torch.sub(self, other)


    def mm(a, b, *, out=None):  # no aten.mm: the fault arm's fault cannot fire
        return torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype)


    for patched in (gelu, add, mm):
        patched._triage_probe = True
    torch._triage_probe = 1
    torch.nn.functional.gelu = gelu
    torch.Tensor.__add__ = add
    torch.mm = torch.matmul = torch.Tensor.mm = torch.Tensor.matmul = torch.Tensor.__matmul__ = mm
    torch.set_default_dtype(torch.float64)
    torch.backends.mkldnn.enabled = False
    torch.set_float32_matmul_precision("medium")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(20240229)
    torch.set_num_threads(1)
    os.environ["TRIAGE_PROBE"] = "1"
    sys.modules["triage_probe_module"] = sys
    for p in PROBE_FILES:
        with open(p, "w") as f:
            f.write("1")
''')

# Elementwise, so bitwise the same whatever the thread count.
GELU = PROBE + textwrap.dedent('''\
    x = torch.linspace(-2.0, 2.0, 16)
    y = torch.nn.functional.gelu(x) + leaks
    print("y:", y)
''') + MODIFY

MATMUL = PROBE + textwrap.dedent('''\
    a = torch.linspace(-1.0, 1.0, 64).reshape(8, 8)
    b = torch.linspace(0.5, 2.0, 64).reshape(8, 8)
    y = torch.mm(a, b) + leaks
    print("y:", y)
''') + MODIFY

# What the script changes, as the worker's numerics flags show it: (at the start of every arm, at its end).
CHANGED_FLAGS = {"default_dtype": ("float32", "float64"), "mkldnn_enabled": (True, False),
                 "float32_matmul_precision": ("highest", "medium"), "deterministic_algorithms": (False, True)}


def _write(tmp_path, source):
    script = tmp_path / "probe.py"
    script.write_text(source)
    return script


def _leaks(stdout):
    """[(bits of state found changed, all bits)] for each run of the probe."""
    return [(int(a), int(b)) for a, b in re.findall(r"^leaks: (\d+) of (\d+)$", stdout, re.M)]


def _assert_state_changed_in_every_arm_and_started_clean(report):
    for arm in report["arms"]:
        assert [found for found, _ in _leaks(arm["stdout"])] == [0], (arm["spec"], arm["stdout"])
        start = {k: arm["flags_start"][k] for k in CHANGED_FLAGS}
        end = {k: arm["flags_end"][k] for k in CHANGED_FLAGS}
        assert start == {k: v[0] for k, v in CHANGED_FLAGS.items()}, (arm["spec"], start)
        # The script did change the state (else the test would prove nothing).
        assert end == {k: v[1] for k, v in CHANGED_FLAGS.items()}, (arm["spec"], end)


@pytest.mark.parametrize("source", [GELU, MATMUL], ids=["gelu", "matmul"])
def test_probe_sees_every_change_of_a_previous_run_in_the_same_process(tmp_path, source):
    """The construction itself: run twice in one interpreter (what a harness that reused the
    arm's process would do), the second run finds every piece of state the first changed,
    and computes another value."""
    script = _write(tmp_path, source)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    twice = ("import runpy, sys\n"
             "for _ in range(2):\n"
             "    runpy.run_path(sys.argv[1], run_name='__main__')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRIAGE_PROBE"}
    done = subprocess.run([sys.executable, "-c", twice, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=work, env=dict(env, HOME=str(home)))
    assert done.returncode == 0, done.stderr
    (clean, every), (found, _) = _leaks(done.stdout)
    assert (clean, found) == (0, every), done.stdout
    first, second = (run.split("y:", 1)[1] for run in done.stdout.split("leaks:")[1:])
    assert first != second, done.stdout


@pytest.mark.slow
def test_state_a_script_changes_in_one_arm_does_not_reach_the_other(triage, tmp_path):
    code, report, _, out = triage(_write(tmp_path, GELU), "cpu,cpu/threads=1")
    assert code == 0, out
    _assert_state_changed_in_every_arm_and_started_clean(report)
    assert report["verdict"]["kind"] == "not-reproduced", report["verdict"]["summary"]
    assert report["comparison"]["divergence"] is None
    # Every arm observed the unleaked value: gelu on the grid (a leak adds at least 1, or the
    # patched gelu/`+` change it), and both arms the same bits.
    printed = [o for o in report["observables"] if o["label"] == "print/repr"]
    assert sorted(o["arm"] for o in printed) == ["cpu", "cpu/threads=1"]
    assert len({o["fingerprint"]["sha256"] for o in printed}) == 1
    grid = [-2.0 + 4.0 * i / 15 for i in range(16)]
    gelu = [v * 0.5 * (1.0 + erf(v / sqrt(2.0))) for v in grid]
    for o in printed:
        assert o["fingerprint"]["min"] == pytest.approx(min(gelu), abs=1e-5), o["fingerprint"]
        assert o["fingerprint"]["max"] == pytest.approx(max(gelu), abs=1e-5), o["fingerprint"]


@pytest.mark.slow
def test_state_a_diverging_script_changes_does_not_reach_the_minimal_repros_verification(triage, tmp_path):
    code, report, _, out = triage(_write(tmp_path, MATMUL), "cpu,cpu/fault=mm", "--no-ablate")
    assert code == 0, out
    _assert_state_changed_in_every_arm_and_started_clean(report)
    m = report["minimal"]
    assert m is not None and m["ops"] == ["aten.mm"], out
    # The construction needs the minimal repro to call one of the names the script patched.
    assert re.search(r"torch\.(mm|matmul)\(|\.(mm|matmul)\(| @ ", m["script"]), m["script"]
    assert m["verified"] is True, m["verification"]
    assert m["verification"].startswith("fresh runs on cpu and cpu/fault=mm show it"), m["verification"]
