"""One command for a lent GPU machine (issue 29): everything CUDA that triage promises, in one run.

    bench/gpu_wheels.sh                                     # here, once: what the GPU machine lacks, into .whl/
    PYTHONUNBUFFERED=1 python bench/gpu_check.py            # there (carrying .whl): writes under $OUT (or --out DIR)
    python bench/gpu_check.py --dry-run --out /tmp/gc       # here, without CUDA: every step, CUDA ones skipped

Steps, in order, each with its own time cap so that the whole run fits in `--budget` seconds
(default 450, inside the 8 minutes a GPU session can spare):

  a. environment: a virtual environment (`--site`, default /tmp/site) over this interpreter's
     packages (a .pth adds its site-packages after the environment's own), holding `.whl/*.whl` (if
     the folder exists; `bench/gpu_wheels.sh` fills it, on a machine that reaches PyPI, with what the
     GPU machine lacks) and triage itself, built from this checkout, all with `pip install --no-index
     --no-deps --target`; every later step runs its Python.  Not PYTHONPATH: triage's workers start
     as `python -I`, which ignores it, and only an installed triage has `triage.templates` (the
     top-level templates/ folder).  Then `import triage, triage.templates, torch, numpy` and every
     top-level module the wheels installed are imported there with `-I`, as a worker would (a wheel
     built for another Python or glibc fails here, not at its first use);
  b. facts: `nvidia-smi` and torch's CUDA facts (version, CUDA, device, capability, TF32
     defaults, cuDNN), from a subprocess — absent ones are recorded, never fatal;
  c. `python -m pytest -m cuda -q` on the test modules that mark CUDA tests, its summary line kept
     (the other modules are not collected there: see step_pytest);
  d. triage on every corpus case whose meta.json says `needs_cuda`, and on the CUDA seeds
     (`fixtures/seeds/`), each `python -m triage run ... --isolation process` with a per-case
     cap, several at once; each case's report, comment and minimal repro go into
     `cases.tar.gz`;
  e. `triage calibrate --device cuda --time-limit` in what is left of the budget, into
     `kernel_errors.json` under the output folder (the shipped table with this GPU's entry, which
     says how far it came): copy it over `triage/worker/kernel_errors.json` here;
  f. `gpu_check.json` and `gpu_check.md` (a table: case, arms, verdict, arm statuses, seconds,
     what meta.json expected) under the output folder.

A failing case or test is a result, not an error: the exit status is non-zero only when the
check itself broke.  `--dry-run` (or a machine without CUDA together with `--dry-run`) runs
steps a, b and e for real, and lists the steps and cases that need CUDA as skipped, with why.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import signal
import site as site_module
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ISSUES = ROOT / "fixtures" / "issues"
SEEDS = ROOT / "fixtures" / "seeds"

# The seed scripts issue 29 names, with the arms and what each should come to on one GPU.
SEED_CASES = [
    ("logdet_cpu_vs_cuda.py", "cpu,cuda", None),
    ("weights_to_gpu.py", "cpu,cuda", None),
    ("training_loop.py", "cpu,cuda", None),
    ("ddp_two_gpus.py", "cpu,cuda", "could-not-run naming the missing second GPU"),
]

FACTS_SCRIPT = r"""
import json, sys
facts = {"python": sys.version.split()[0]}
try:
    import torch
except Exception as e:
    facts["torch_error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(facts)); raise SystemExit(0)
facts["torch"] = torch.__version__
facts["torch_cuda"] = torch.version.cuda
try:
    facts["cuda_available"] = bool(torch.cuda.is_available())
    facts["device_count"] = torch.cuda.device_count()
except Exception as e:
    facts["cuda_available"] = False
    facts["cuda_error"] = f"{type(e).__name__}: {e}"
if facts.get("cuda_available"):
    try:
        facts["devices"] = [{"name": torch.cuda.get_device_name(i),
                             "capability": list(torch.cuda.get_device_capability(i)),
                             "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                            for i in range(torch.cuda.device_count())]
    except Exception as e:
        facts["devices_error"] = f"{type(e).__name__}: {e}"
try:
    facts["tf32_matmul_default"] = torch.backends.cuda.matmul.allow_tf32
    facts["tf32_cudnn_default"] = torch.backends.cudnn.allow_tf32
    facts["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    facts["fp16_reduced_precision_reduction"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
except Exception as e:
    facts["tf32_error"] = f"{type(e).__name__}: {e}"
try:
    facts["cudnn_available"] = torch.backends.cudnn.is_available()
    facts["cudnn_version"] = torch.backends.cudnn.version() if facts["cudnn_available"] else None
except Exception as e:
    facts["cudnn_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(facts))
"""


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_capped(argv, *, timeout, env=None, cwd=ROOT, echo: str | None = None):
    """Run argv in its own process group, killed whole at `timeout`; returns a dict, never raises.
    With `echo`, each line of its output is printed as it comes, behind that prefix."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=cwd, start_new_session=True, errors="replace")
    except OSError as e:
        return {"rc": None, "error": f"{type(e).__name__}: {e}", "output": "", "seconds": 0.0, "timed_out": False}
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if echo is not None:
                print(f"{echo}{line.rstrip()}", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=max(1.0, timeout))
        timed_out = False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        timed_out = True
    reader.join(timeout=10)
    return {"rc": proc.returncode, "output": "".join(lines), "seconds": round(time.monotonic() - t0, 1),
            "timed_out": timed_out}


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.splitlines()[-n:])


# --- a. wheels and `import triage` ----------------------------------------------------------

# The top-level modules each installed distribution put into the site folder, read from its
# RECORD (top_level.txt is setuptools' alone; hatch, flit and maturin wheels have none).
MODULES_SCRIPT = r"""
import json, sys
from pathlib import Path
site = Path(sys.argv[1])
modules = {}
for info in sorted(site.glob("*.dist-info")):
    record = info / "RECORD"
    names = set()
    for line in (record.read_text().splitlines() if record.exists() else []):
        first = line.split(",", 1)[0].split("/", 1)
        if len(first) == 2:
            top = first[0]
            if top.endswith((".dist-info", ".data", ".libs")) or top in ("..", "__pycache__", "bin"):
                continue
        else:
            top = first[0]
            if top.endswith(".py"):
                top = top[:-3]
            elif top.endswith(".so"):
                top = top.split(".", 1)[0]
            else:
                continue
        if top.isidentifier():
            names.add(top)
    modules[info.name] = sorted(names)
print(json.dumps(modules))
"""

IMPORT_SCRIPT = r"""
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as e:
        failed[name] = f"{type(e).__name__}: {e}"
print(json.dumps(failed))
"""


# Run by the environment's Python: its own site-packages folder.
SITE_PACKAGES_SCRIPT = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def make_environment(venv: Path, cap: float) -> tuple[Path, Path, dict]:
    """A virtual environment at `venv` whose Python also sees this interpreter's packages (torch,
    numpy, ...): a .pth line, run at every start (`-I` too), adds each of this interpreter's
    site-packages folders after the environment's own, .pth files included.  Returns its Python,
    its site-packages folder and what making it printed."""
    r = run_capped([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], timeout=cap)
    python = venv / "bin" / "python"
    probe = run_capped([str(python), "-I", "-c", SITE_PACKAGES_SCRIPT], timeout=cap)
    if r["rc"] != 0 or probe["rc"] != 0:
        raise RuntimeError(f"python -m venv {venv}: rc {r['rc']}: {tail(r['output'] + probe['output'], 5)}")
    venv_site = Path(probe["output"].strip().splitlines()[-1])
    outer = [p for p in dict.fromkeys(site_module.getsitepackages()) if os.path.isdir(p)]
    (venv_site / "_gpu_check_outer.pth").write_text(
        # One line, exec'd by site.py: no comprehension, whose own scope does not see `site` before 3.12.
        f"import site; list(map(site.addsitedir, {outer!r}))\n")
    return python, venv_site, {"rc": r["rc"], "outer_site_packages": outer}


def pip_install(args: list[str], venv_site: Path, cap: float, what: str) -> dict:
    r = run_capped([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(venv_site), *args], timeout=cap)
    if r["rc"] != 0:
        log(f"a. pip install of {what} failed (rc {r['rc']}): {tail(r['output'], 5)}")
    return {"rc": r["rc"], "seconds": r["seconds"], "timed_out": r["timed_out"], "output": tail(r["output"])}


def step_wheels(env: dict, site: Path, cap: float, wheel_dir: Path = ROOT / ".whl") -> dict:
    wheels = sorted(glob.glob(str(wheel_dir / "*.whl")))
    result: dict = {"wheels": [Path(w).name for w in wheels], "site": str(site), "python": sys.executable}
    try:
        python, venv_site, made = make_environment(site, cap)
    except (RuntimeError, OSError, IndexError) as e:
        log(f"a. the environment could not be made: {e}")
        result["environment_error"] = str(e)
        result["import_triage"] = {"ok": False, "output": str(e), "seconds": 0.0}
        return result
    result.update(python=str(python), site_packages=str(venv_site), environment=made)
    if wheels:
        log(f"a. installing {len(wheels)} wheel(s) from {wheel_dir} into {venv_site}")
        result["pip"] = pip_install(wheels, venv_site, cap, "the wheels")
    else:
        log(f"a. no wheels in {wheel_dir} to install")
    # Built from a copy of what the package is made of, so that the build's own build/ and egg-info
    # (and stale modules a build/ left there would add) stay out of the checkout; without build
    # isolation, so that it runs offline, on this interpreter's setuptools (torch needs it).
    log(f"a. installing triage from {ROOT} into {venv_site}")
    with tempfile.TemporaryDirectory(prefix="gpu_check_triage_") as source:
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, source)
        for name in ("triage", "templates"):
            shutil.copytree(ROOT / name, Path(source) / name, ignore=shutil.ignore_patterns("__pycache__"))
        result["pip_triage"] = pip_install(["--no-build-isolation", source], venv_site, cap, "triage")
    # Not the checkout, whose triage/ has no templates: the installed copy runs (no step's cwd is ROOT but pytest's).
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and os.path.abspath(p) != str(ROOT))
    r = run_capped([str(python), "-I", "-c", "import triage, triage.templates, torch, numpy; print(triage.__file__)"],
                   timeout=cap, env=env, cwd=venv_site.anchor)
    result["import_triage"] = {"ok": r["rc"] == 0, "output": tail(r["output"], 10), "seconds": r["seconds"]}
    log(f"a. import triage (python -I): {'ok' if r['rc'] == 0 else 'FAILED'} ({tail(r['output'], 1)})")
    if wheels and result["pip"]["rc"] == 0:
        result["import_wheels"] = import_wheels(env, python, venv_site, cap, exclude={"triage"})
    return result


def import_wheels(env: dict, python: Path, site: Path, cap: float, exclude: set[str] = frozenset()) -> dict:
    """Import every top-level module the wheels installed, as a worker would (`-I`)."""
    r = run_capped([str(python), "-I", "-c", MODULES_SCRIPT, str(site)], timeout=cap, env=env)
    try:
        modules = json.loads(r["output"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"ok": False, "error": f"listing the installed modules failed: {tail(r['output'], 10)}"}
    modules = {dist: ms for dist, ms in modules.items() if not set(ms) & exclude}
    names = sorted({m for ms in modules.values() for m in ms})
    r = run_capped([str(python), "-I", "-c", IMPORT_SCRIPT, *names], timeout=cap, env=env, cwd=site.anchor)
    try:
        failed = json.loads(r["output"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        failed = {"*": f"rc {r['rc']}, timed out {r['timed_out']}: {tail(r['output'], 10)}"}
    empty = sorted(dist for dist, ms in modules.items() if not ms)
    ok = not failed and not empty
    log(f"a. import of the wheels' {len(names)} module(s): "
        + ("ok" if ok else f"FAILED {failed or ''} {('no module found for ' + ', '.join(empty)) if empty else ''}"))
    return {"ok": ok, "modules": modules, "failed": failed, "without_modules": empty}


# --- b. facts ------------------------------------------------------------------------------

def step_facts(env: dict, python: str, cap: float) -> dict:
    result: dict = {}
    smi = shutil.which("nvidia-smi")
    if smi:
        r = run_capped([smi], timeout=cap, env=env)
        result["nvidia_smi"] = r["output"] if r["rc"] == 0 else f"rc {r['rc']}: {r['output']}"
    else:
        result["nvidia_smi"] = None
        result["nvidia_smi_note"] = "nvidia-smi not found on PATH"
    log("b. nvidia-smi:\n" + (result["nvidia_smi"] or result.get("nvidia_smi_note", "")))
    r = run_capped([python, "-c", FACTS_SCRIPT], timeout=cap, env=env)
    try:
        result["torch"] = json.loads(r["output"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        result["torch"] = {"error": f"rc {r['rc']}, timed out {r['timed_out']}: {tail(r['output'], 10)}"}
    log("b. torch facts: " + json.dumps(result["torch"]))
    return result


# --- c. pytest -m cuda -----------------------------------------------------------------------

SUMMARY = re.compile(r"^=*\s*(?:\d+ (?:passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)[ ,]*)+.*$")


def step_pytest(env: dict, python: str, cap: float, skip_reason: str | None) -> dict:
    if skip_reason:
        log(f"c. pytest -m cuda: skipped ({skip_reason})")
        return {"status": "skipped", "reason": skip_reason}
    argv = [python, "-m", "pytest", "-m", "cuda", "-q", "-rfEs", "-p", "no:cacheprovider",
            # a test module whose imports are missing there (no wheel carried) must not stop the CUDA tests
            "--continue-on-collection-errors"]
    probe = run_capped([python, "-c", "import xdist"], timeout=30, env=env)
    if probe["rc"] == 0:  # pytest-xdist there: the CUDA tests (each a few triage runs) side by side
        argv += ["-n", "4"]
    # Only the modules that mark CUDA tests: the checkout shadows the installed triage in the
    # others' imports there (`python -m` puts the working directory first, and the checkout has
    # no `triage.templates`, which the build maps from templates/), and ray is not carried.
    argv += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.cuda" in p.read_text())
    log(f"c. {' '.join(argv[1:])} (cap {cap:.0f} s)")
    r = run_capped(argv, timeout=cap, env=env, echo="   pytest| ")
    lines = [l for l in r["output"].splitlines() if SUMMARY.match(l.strip())]
    summary = lines[-1].strip("= ") if lines else ("timed out" if r["timed_out"] else "no summary line")
    log(f"c. pytest -m cuda: rc {r['rc']}, {summary} ({r['seconds']} s)")
    return {"status": "timed-out" if r["timed_out"] else "ran", "rc": r["rc"], "summary": summary,
            "command": " ".join(argv[1:]),
            "seconds": r["seconds"], "output_tail": tail(r["output"], 80)}


# --- d. the CUDA cases -------------------------------------------------------------------------

def cuda_cases() -> list[dict]:
    """The CUDA seeds issue 29 names (first: they run before the budget can run out), then every
    corpus case whose meta.json says `needs_cuda`."""
    cases = []
    for name, arms, expected in SEED_CASES:
        path = SEEDS / name
        if path.exists():
            cases.append({"case": f"seeds/{name}", "script": str(path.relative_to(ROOT)), "arms": arms,
                          "expected": expected})
        else:
            cases.append({"case": f"seeds/{name}", "script": None, "arms": arms, "expected": expected,
                          "status": "skipped", "reason": f"fixtures/seeds/{name} is not in this checkout"})
    for meta_path in sorted(ISSUES.glob("*/meta.json")):
        try:
            meta = json.loads(meta_path.read_text())
        except ValueError as e:
            cases.append({"case": meta_path.parent.name, "script": None, "error": f"meta.json unreadable: {e}"})
            continue
        if not meta.get("needs_cuda"):
            continue
        script = meta_path.parent / "repro.py"
        # The reporter compared eager with compiled: both on the GPU; otherwise the CPU against the GPU.
        compiled = any("compile" in str(a).lower() for a in meta.get("arms") or [])
        cases.append({"case": meta_path.parent.name, "script": str(script.relative_to(ROOT)),
                      "arms": "cuda,cuda/compile" if compiled else "cpu,cuda",
                      "expected": meta.get("classification_expected"),
                      "meta_arms": meta.get("arms"), "observed_status_cpu": meta.get("observed_status")})
    return cases


SECOND_GPU = re.compile(r"(two|2|second|several|multiple|more than one|world.?size)[^.\n]{0,60}(gpu|cuda device|device)"
                        r"|(gpu|cuda device|device)[^.\n]{0,60}(two|2|second|several|more than one)", re.I)


def run_case(case: dict, work: Path, env: dict, python: str, cap: float, arm_timeout: float,
             memory: str | None = None) -> dict:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", case["case"])
    report, comment, minimal = work / f"{stem}.json", work / f"{stem}.md", work / f"{stem}.minimal.py"
    budget = max(10, int(cap * 0.25))
    argv = [python, "-m", "triage", "run", str(ROOT / case["script"]), "--arms", case["arms"],
            "--json", str(report), "--comment", str(comment), "--minimal", str(minimal),
            "--isolation", "process", "--timeout", str(int(arm_timeout)), "--jobs", "2",
            "--minimize-budget", str(budget), "--rounding-budget", str(budget), "--ablate-budget", str(budget),
            "--quiet"] + (["--memory", memory] if memory else [])
    r = run_capped(argv, timeout=cap, env=env, cwd=work)  # not ROOT: its triage/ would shadow the installed one
    (work / f"{stem}.log").write_text(r["output"])
    out = {"rc": r["rc"], "seconds": r["seconds"], "timed_out": r["timed_out"], "command": " ".join(argv[1:])}
    data = None
    if report.exists():
        try:
            data = json.loads(report.read_text())
        except ValueError as e:
            out["report_error"] = str(e)
    if data:
        verdict = data.get("verdict") or {}
        out["verdict"] = verdict.get("kind")
        out["verdict_expected"] = verdict.get("expected")
        out["summary"] = verdict.get("summary")
        out["arms_status"] = {a.get("spec"): a.get("status") for a in data.get("arms") or []}
        out["arm_failures"] = {a.get("spec"): a.get("failure") for a in data.get("arms") or [] if a.get("failure")}
        out["ablations"] = [(a.get("switch"), a.get("outcome")) for a in data.get("ablations") or []]
        minimal = data.get("minimal") if isinstance(data.get("minimal"), dict) else {}
        out["minimal_ops"] = minimal.get("ops")
        out["minimal_verified"] = minimal.get("verified")
        out["isolation"] = (data.get("isolation") or {}).get("kind")
    else:
        out["verdict"] = "timed-out" if r["timed_out"] else "no-report"
        out["output_tail"] = tail(r["output"], 20)
    if case.get("expected") == "could-not-run naming the missing second GPU":
        text = " ".join([str(out.get("summary") or "")] + [str(v) for v in (out.get("arm_failures") or {}).values()])
        out["expectation_met"] = out.get("verdict") == "could-not-run" and bool(SECOND_GPU.search(text))
    return out


def step_cases(cases: list[dict], env: dict, python: str, work: Path, deadline: float, case_cap: float, jobs: int,
               skip_reason: str | None, memory: str | None = None) -> list[dict]:
    runnable = [c for c in cases if c.get("script") and c.get("status") != "skipped"]
    if skip_reason:
        for c in runnable:
            c.update(status="skipped", reason=skip_reason)
        log(f"d. {len(runnable)} CUDA case(s) listed, all skipped ({skip_reason})")
        return cases
    log(f"d. {len(runnable)} CUDA case(s), {jobs} at once, at most {case_cap:.0f} s each")

    def one(case):
        left = deadline - time.monotonic()
        if left < 15:
            case.update(status="skipped", reason="the check's time budget ran out before this case started")
            log(f"d. {case['case']}: skipped (out of time)")
            return
        cap = min(case_cap, left)
        log(f"d. {case['case']} --arms {case['arms']} (cap {cap:.0f} s) ...")
        try:
            case.update(status="ran", **run_case(case, work, env, python, cap, arm_timeout=max(10, cap * 0.4), memory=memory))
        except Exception as e:  # a bug in the check for this case: recorded, the others go on
            case.update(status="check-error", reason=f"{type(e).__name__}: {e}")
        log(f"d. {case['case']}: {case.get('verdict', case.get('status'))}, arms {case.get('arms_status')},"
            f" {case.get('seconds')} s")

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, runnable))
    return cases


# --- e. the outputs ----------------------------------------------------------------------------

def wheel_note(wheels: dict) -> str:
    if wheels.get("pip") and wheels["pip"]["rc"] != 0:
        return " (pip install FAILED)"
    imported = wheels.get("import_wheels")
    if not imported:
        return ""
    if imported["ok"]:
        return f", their {sum(len(m) for m in imported['modules'].values())} module(s) import"
    return (f", import FAILED: {', '.join(sorted(imported.get('failed') or {}))}"
            + (f"; no module found for {', '.join(imported['without_modules'])}" if imported.get("without_modules") else "")
            + (f"; {imported['error']}" if imported.get("error") else ""))


# --- e. the CUDA kernel table ---------------------------------------------------------------

def step_calibrate(env: dict, python: str, out: Path, deadline: float, skip_reason: str | None) -> dict:
    """`triage calibrate --device cuda` in what is left of the budget, into a copy of the
    shipped table under the output folder (its entry says how far it came if time ran out):
    the table the simulation of a CUDA arm reads, measured on this GPU."""
    if skip_reason:
        log(f"e. calibrate: skipped ({skip_reason})")
        return {"status": "skipped", "reason": skip_reason}
    left = deadline - time.monotonic() - 30
    if left < 30:
        log("e. calibrate: skipped (the check's time budget ran out)")
        return {"status": "skipped", "reason": "the check's time budget ran out"}
    table = out / "kernel_errors.json"
    shutil.copy(ROOT / "triage" / "worker" / "kernel_errors.json", table)
    argv = [python, "-I", "-m", "triage", "calibrate", "--device", "cuda", "--time-limit", f"{left:.0f}",
            "--table", str(table)]
    log(f"e. {' '.join(argv[3:])}")
    r = run_capped(argv, timeout=left + 120, env=env)
    summary = (r["output"].strip().splitlines() or [""])[-1][:400]
    log(f"e. calibrate: rc={r['rc']} in {r['seconds']} s: {summary}")
    return {"status": "ran", "rc": r["rc"], "seconds": r["seconds"], "timed_out": r["timed_out"],
            "summary": summary, "table": table.name}


def markdown(result: dict) -> str:
    facts = result["facts"].get("torch", {})
    dev = (facts.get("devices") or [{}])[0]
    lines = ["# GPU check", "",
             f"- mode: {'dry run' if result['dry_run'] else 'real run'}; host {result['host']}; {result['seconds']} s",
             f"- torch {facts.get('torch')}, CUDA {facts.get('torch_cuda')}, cuda available {facts.get('cuda_available')}, "
             f"device {dev.get('name')} (capability {dev.get('capability')}), cuDNN {facts.get('cudnn_version')}, "
             f"TF32 matmul default {facts.get('tf32_matmul_default')}, cudnn {facts.get('tf32_cudnn_default')}",
             f"- import triage: {'ok' if result['wheels']['import_triage']['ok'] else 'FAILED'}; "
             f"wheels: {len(result['wheels']['wheels'])}" + wheel_note(result["wheels"]),
             f"- pytest -m cuda: {result['pytest'].get('summary') or result['pytest'].get('status')}"
             + (f" ({result['pytest']['reason']})" if result['pytest'].get('reason') else ""),
             f"- calibrate --device cuda: {result['calibrate'].get('summary') or result['calibrate'].get('status')}"
             + (f" ({result['calibrate']['reason']})" if result['calibrate'].get('reason') else ""),
             "", "| case | arms | verdict | arm statuses | seconds | expected (meta.json) |",
             "|---|---|---|---|---|---|"]
    for c in result["cases"]:
        if c.get("status") == "ran":
            verdict = str(c.get("verdict"))
            if "expectation_met" in c:
                verdict += " (as expected)" if c["expectation_met"] else " (NOT as expected)"
            statuses = ", ".join(f"{k}: {v}" for k, v in (c.get("arms_status") or {}).items()) or "—"
            secs = c.get("seconds")
        else:
            verdict = f"{c.get('status')}: {c.get('reason') or c.get('error')}"
            statuses, secs = "—", "—"
        cells = [c["case"], c.get("arms") or "—", verdict, statuses, secs, c.get("expected") or "—"]
        lines.append("| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu_check_out"),
                   help="output folder (default $OUT, else ./gpu_check_out)")
    p.add_argument("--dry-run", action="store_true", help="skip the CUDA steps (listed as skipped), exit 0")
    p.add_argument("--budget", type=float, default=450, help="seconds for the whole check (default 450)")
    p.add_argument("--pytest-timeout", type=float, default=150)
    p.add_argument("--case-timeout", type=float, default=150)
    p.add_argument("--jobs", type=int, default=6, help="cases at once (default 6)")
    p.add_argument("--memory", default=None,
                   help="triage's --memory per arm (default: triage's own, a share of RAM; gh-36582's "
                        "154M-element tensor needed more than 7.1 GiB on an 8 GiB machine)")
    p.add_argument("--site", default=None, help="the virtual environment the wheels and triage go into "
                                                "(default /tmp/site, a temp folder in a dry run)")
    p.add_argument("--wheels", default=str(ROOT / ".whl"),
                   help="the folder of wheels step a installs (default .whl/, which bench/gpu_wheels.sh fills)")
    p.add_argument("--cases", default=None,
                   help="only these cases, comma-separated (gh-183402,seeds/training_loop.py): a rerun after a fix")
    p.add_argument("--no-calibrate", action="store_true", help="skip step e (a rerun that needs no new table)")
    args = p.parse_args(argv)
    chosen = cuda_cases()
    if args.cases is not None:
        names = set(args.cases.split(","))
        unknown = names - {c["case"] for c in chosen}
        if unknown:
            p.error(f"--cases: no CUDA case named {', '.join(sorted(unknown))}")
        chosen = [c for c in chosen if c["case"] in names]

    t0 = time.monotonic()
    deadline = t0 + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_check_cases_"))
    site = Path(args.site or (tempfile.mkdtemp(prefix="gpu_check_site_") if args.dry_run else "/tmp/site"))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    log(f"start: {'dry run' if args.dry_run else 'real run'}, output to {out}, budget {args.budget:.0f} s")

    wheels = step_wheels(env, site, cap=120, wheel_dir=Path(args.wheels))
    python = wheels["python"]
    facts = step_facts(env, python, cap=30)
    torch_facts = facts.get("torch", {})
    skip = None
    if args.dry_run:
        skip = "dry run" + ("" if torch_facts.get("cuda_available") else ": no CUDA device on this machine")
    elif not wheels["import_triage"]["ok"]:
        skip = "import triage failed (step a)"
    elif not torch_facts.get("cuda_available"):
        log("WARNING: torch sees no CUDA device; the CUDA steps run anyway and will report could-not-run")

    pytest_cap = max(10.0, min(args.pytest_timeout, deadline - time.monotonic() - 60))
    pytest_result = step_pytest(env, python, pytest_cap, skip)
    cases = step_cases(chosen, env, python, work, deadline, args.case_timeout, args.jobs, skip, args.memory)
    archive = None
    if any(work.iterdir()):
        archive = out / "cases.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(work, arcname="cases")
    shutil.rmtree(work, ignore_errors=True)
    calibrate = step_calibrate(env, python, out, deadline, "--no-calibrate" if args.no_calibrate else skip)

    result = {"dry_run": args.dry_run, "host": os.uname().nodename, "seconds": round(time.monotonic() - t0, 1),
              "budget_s": args.budget, "wheels": wheels, "facts": facts, "pytest": pytest_result, "cases": cases,
              "cases_archive": archive.name if archive else None, "calibrate": calibrate}
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(result))
    log(f"done in {result['seconds']} s: {out / 'gpu_check.json'}, {out / 'gpu_check.md'}")
    print(markdown(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
