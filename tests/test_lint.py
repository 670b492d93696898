"""The code is held to pyproject.toml's [tool.ruff] rules (imports sorted, zip(strict=), modern
typing, pyflakes): run as part of the suite, so CI runs it too."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is part of the test extra (pip install -e '.[test]')"
    proc = subprocess.run([ruff, "check", "--no-cache", "triage", "tests", "bench", "docs"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
