"""`bench/gpu_check.py --dry-run` (issue 29): the one-call GPU check runs every step here, lists the
CUDA cases as skipped with a reason, writes its JSON and markdown, and exits 0 — so it cannot rot
between the rare sessions that have a GPU."""
import json
import os
import subprocess
import sys
import time

from conftest import ISSUES, ROOT, SEEDS

CUDA_SEEDS = ("logdet_cpu_vs_cuda.py", "weights_to_gpu.py", "training_loop.py", "ddp_two_gpus.py")


def test_gpu_check_dry_run(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seconds < 60, f"the dry run took {seconds:.0f} s"

    result = json.loads((out / "gpu_check.json").read_text())
    assert result["dry_run"] is True
    assert result["wheels"]["import_triage"]["ok"], result["wheels"]
    # The workers' `python -I` sees triage installed in the check's environment, templates and all,
    # not the checkout on PYTHONPATH (which it ignores, and whose triage/ has no templates).
    assert result["wheels"]["import_triage"]["output"].strip().startswith(result["wheels"]["site_packages"]), result["wheels"]
    assert "torch" in result["facts"]["torch"], result["facts"]
    assert result["pytest"]["status"] == "skipped" and result["pytest"]["reason"]

    cases = {c["case"]: c for c in result["cases"]}
    expected = {f"seeds/{name}" for name in CUDA_SEEDS if (SEEDS / name).exists()}
    expected |= {m.parent.name for m in ISSUES.glob("*/meta.json") if json.loads(m.read_text()).get("needs_cuda")}
    assert expected and expected <= set(cases), sorted(expected - set(cases))
    for name in expected:
        case = cases[name]
        assert case["status"] == "skipped" and case["reason"], case
        assert case["arms"] and "cuda" in case["arms"], case
    assert cases["seeds/ddp_two_gpus.py"]["expected"].startswith("could-not-run")

    table = (out / "gpu_check.md").read_text()
    assert "| case | arms | verdict | arm statuses | seconds | expected (meta.json) |" in table
    for name in expected:
        assert f"| {name} |" in table
    assert "[gpu_check" in proc.stdout and "done in" in proc.stdout


def test_gpu_check_reruns_chosen_cases_without_calibrating(tmp_path):
    """A rerun after a fix: only the cases named, no table measured; a name that is no CUDA case
    is refused before anything runs."""
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    check = [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(tmp_path / "out")]
    refused = subprocess.run(check + ["--cases", "gh-183402,gh-0"], capture_output=True, text=True, timeout=60,
                             env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "no CUDA case named gh-0" in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()
    proc = subprocess.run(check + ["--cases", "gh-183402,seeds/ddp_two_gpus.py", "--no-calibrate"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert sorted(c["case"] for c in result["cases"]) == ["gh-183402", "seeds/ddp_two_gpus.py"]
    assert result["calibrate"] == {"status": "skipped", "reason": "--no-calibrate"}


def wheel(folder, dist: str, module: str, source: str):
    """A minimal pure-Python wheel `dist` 1.0 holding `module/__init__.py` with `source`."""
    import base64
    import hashlib
    import zipfile

    info = f"{dist}-1.0.dist-info"
    files = {f"{module}/__init__.py": source,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def test_gpu_check_imports_every_wheel_it_installs(tmp_path):
    """Step a imports each module the carried wheels installed: one that breaks on import (a wheel for
    another Python or glibc) is named, beside the ones that import."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels, "carried_ok", "carried_ok", "VALUE = 1\n")
    wheel(wheels, "carried_broken", "carried_broken", "raise ImportError('built for another interpreter')\n")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--dry-run", "--out", str(out),
                           "--wheels", str(wheels)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "gpu_check.json").read_text())["wheels"]
    assert sorted(result["wheels"]) == ["carried_broken-1.0-py3-none-any.whl", "carried_ok-1.0-py3-none-any.whl"]
    assert result["pip"]["rc"] == 0, result["pip"]
    assert result["import_triage"]["ok"], result
    imported = result["import_wheels"]
    assert imported["ok"] is False
    assert set(imported["failed"]) == {"carried_broken"}, imported
    assert "built for another interpreter" in imported["failed"]["carried_broken"]
    assert imported["modules"] == {"carried_broken-1.0.dist-info": ["carried_broken"],
                                   "carried_ok-1.0.dist-info": ["carried_ok"]}
    assert "import FAILED: carried_broken" in (out / "gpu_check.md").read_text()
