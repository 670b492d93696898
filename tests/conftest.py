import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
# Real PyTorch issue repros with their meta.json, and the seed articles' scripts (fixtures/README.md).
ISSUES = FIXTURES / "issues"
SEEDS = FIXTURES / "seeds"


# Environment variables of the test process a sweep must not see: a token (the fake GitHub
# needs none), CI's job summary (the sweep would append its report to the real one), and
# Ray's own (RAY_ADDRESS: a cluster to join; RAY_AUTH_MODE and others, which an in-process
# `ray.init` of an earlier test leaves behind).
NOT_PASSED = ("GITHUB_TOKEN", "GH_TOKEN", "GITHUB_STEP_SUMMARY")


def sweep_environment(environ) -> dict[str, str]:
    """The test process's environment as a `triage sweep` subprocess gets it: as from a fresh shell."""
    return {k: v for k, v in environ.items() if k not in NOT_PASSED and not k.startswith("RAY_")}


def run_triage(script, arms, tmp_path, *extra, env=None, timeout=600):
    """Run the real CLI in a subprocess; returns (exit code, report dict or None, comment, output)."""
    report, comment = tmp_path / "report.json", tmp_path / "comment.md"
    argv = [sys.executable, "-m", "triage", "run", str(script), "--json", str(report),
            "--comment", str(comment), *extra]
    if arms is not None:
        argv += ["--arms", arms]
    full_env = dict(os.environ, TRIAGE_TEST_ARMS="1", **(env or {}))
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=tmp_path)
    data = json.loads(report.read_text()) if report.exists() else None
    text = comment.read_text() if comment.exists() else None
    return proc.returncode, data, text, proc.stdout + proc.stderr


# Whether this torch's inductor, with emulate_precision_casts, rounds fixtures/fp16_intermediate_compile.py's
# float16 intermediates as eager does on the CPU (torch 2.13 does; torch 2.11 keeps them in float32 and
# prints the finite values regardless), so that a test asserts the verdict this torch calls for.
EMULATION_PROBE = """
import torch, torch._inductor.config as config
config.emulate_precision_casts = True
f = lambda h: h * 1000 * 1000 / 1000 / 1000
h = torch.tensor([100.0, 200.0, 300.0], dtype=torch.float16)
print(torch.equal(f(h), torch.compile(f)(h)))
"""


def emulated_casts_round_as_eager(env=None) -> bool:
    """The probe above in a fresh process of this interpreter, with `env` added to its environment and
    a cache of inductor's own (code cached for another CPU capability does not build under this one)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="emulation_probe_") as cache:
        proc = subprocess.run([sys.executable, "-c", EMULATION_PROBE], capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, **(env or {})))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[-1] == "True"


@pytest.fixture
def triage(tmp_path):
    return lambda script, arms="cpu", *extra, **kw: run_triage(script, arms, tmp_path, *extra, **kw)
