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


@pytest.fixture
def triage(tmp_path):
    return lambda script, arms="cpu", *extra, **kw: run_triage(script, arms, tmp_path, *extra, **kw)
