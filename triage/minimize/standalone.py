"""Stage 4b: the minimal op set as a standalone script, re-run in fresh arms before it is reported.

Arm A's warm worker writes the script (`triage.worker.render`: public torch calls, exact
input literals).  Its last lines show both arms' values where one process can: eager and
compiled side by side for a compile arm, a loop over devices for a device pair; otherwise they
print the value and name the arms to compare.  Verification runs the script through the same
isolated arm runner as the reporter's script (fresh processes, both arms) and holds when some
value differs between the arms with the same `DivergenceKind` the minimizer preserved.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from triage.arms.run import run_arms
from triage.extract import extract_repro
from triage.model import ArmRun, ArmSpec, DivergenceKind
from triage.numerics.errors import divergence_kind
from triage.settings import RunSettings
from triage.untrusted import UntrustedOutput, open_regular
from triage.worker.protocol import INPUTS_FILE

SCRIPT_NAME = "minimal.py"


def script_style(a: ArmSpec, b: ArmSpec) -> tuple[str, list[str]]:
    """How the script shows both arms: ``compile``, ``devices`` (with the devices), ``settings``
    (both arms' knobs set by the script itself, one after the other) or ``plain`` — always
    where the arms run different torch releases, which one process cannot hold both of."""
    if a.torch != b.torch:
        return "plain", []
    same_knobs = a.knobs == b.knobs
    fault = any(k == "fault" for k, _ in a.knobs + b.knobs)  # triage's own test knob: no public setting
    if a.device == b.device and same_knobs and {a.mode, b.mode} == {"eager", "compile"}:
        return "compile", []
    if a.device != b.device and same_knobs and a.mode == b.mode == "eager":
        return "devices", [a.device, b.device]
    if a.device == b.device and not same_knobs and not fault and a.mode == b.mode == "eager":
        return "settings", []
    return "plain", []


def render(worker: Any, plan_request: dict[str, Any], a: ArmSpec, b: ArmSpec, kind: DivergenceKind,
           rendered: Path, directory: Path, timeout_s: float,
           overrides: dict[str, Any] | None = None) -> tuple[str | None, dict[str, Any]]:
    """Ask arm A's worker for the script (`overrides`: the reduced inputs); (error, reply). The
    worker writes the inputs too large for literals into `rendered`, its own folder; triage
    writes the script it was sent, and a copy of that inputs file, into `directory`, its own:
    by descriptor, never through a link, and nothing of a name it does not expect."""
    style, devices = script_style(a, b)
    compiled = b if b.mode == "compile" else a
    request = dict(plan_request, cmd="render", style=style, devices=devices, backend=compiled.backend,
                   arms=[a.spec, b.spec], knobs=[list(a.knobs), list(b.knobs)], kind=kind.describe(),
                   dir=str(rendered))
    header, _ = worker.request(request, timeout_s, arrays=overrides)
    if not header.get("ok"):
        return f"{header.get('lost') or header.get('error')}", header
    try:
        with _created(directory / SCRIPT_NAME) as out:
            out.write(str(header["script"]).encode())
        if (rendered / INPUTS_FILE).exists() or (rendered / INPUTS_FILE).is_symlink():
            with open_regular(rendered / INPUTS_FILE, MAX_INPUTS_BYTES) as src, _created(directory / INPUTS_FILE) as out:
                shutil.copyfileobj(src, out)
    except (OSError, UntrustedOutput) as e:
        return f"the script's files could not be written: {e}", header
    return None, header


# The reduced inputs too large for literals: at most the value budget the minimizer records.
MAX_INPUTS_BYTES = 1 << 30


def _created(path: Path) -> Any:
    """A new regular file at `path`, opened for writing, never through a link: what was there
    (an earlier run's script, where --minimal points) is removed first, a link itself and not
    what it names."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.fdopen(os.open(path, flags, 0o644), "wb")
    except FileExistsError:
        os.unlink(path)
        return os.fdopen(os.open(path, flags, 0o644), "wb")


def verify(directory: Path, a: ArmSpec, b: ArmSpec, target: DivergenceKind, options: RunSettings,
           results: list[str] | None = None) -> tuple[bool, str]:
    """Run the script on both arms in fresh processes; (verified, what was seen).  `results`:
    the script's names for arm A's and arm B's values when it computes both itself (eager and
    compiled, both settings); the divergence then also counts when it shows between those two
    in arm A's own run, which is what a maintainer running `python minimal.py` sees."""
    repro = extract_repro(str(directory / SCRIPT_NAME))
    if repro.problem:
        return False, f"the script triage wrote does not load: {repro.problem}"
    # The run's own settings, less what does not apply to triage's own script: the verdict is read
    # off the printed values (no float64 replay, so no rounding simulation), nothing is minimized
    # further (no op graphs), and the reporter's arguments were for the reporter's script.
    runs = run_arms(repro, [a, b], dataclasses.replace(options, reference=False, export_graphs=False, script_args=()))
    for run in runs:
        if not run.completed:
            return False, f"the script failed on {run.spec}: {run.failure}"
    seen = _kinds(runs[0], runs[1])
    if target in seen:
        return True, f"fresh runs on {a.spec} and {b.spec} show it: {target.describe()}"
    shown_itself = _within(runs[0], results or [])
    if target in shown_itself:
        return True, f"run once on {a.spec}, the script shows it between its own {' and '.join(results or [])}: " \
                     f"{target.describe()}"
    seen += shown_itself
    shown = ", ".join(sorted({k.describe() for k in seen})) or "bitwise-equal values"
    return False, f"fresh runs on {a.spec} and {b.spec} show {shown}, not {target.describe()}"


def _within(run: ArmRun, results: list[str]) -> list[DivergenceKind]:
    """How the script's two named results differ within one run (nothing unless both exist)."""
    labels = {o.label: o for o in run.observables}
    pair = [labels.get(f"`{name}` at exit") for name in results[:2]]
    if len(pair) < 2 or any(o is None or o.value is None for o in pair):
        return []
    x, y = pair
    kind = divergence_kind(x.value, y.value, (x.fingerprint or {}).get("dtype", "?"))
    return [kind] if kind is not None else []


def _kinds(ra: ArmRun, rb: ArmRun) -> list[DivergenceKind]:
    found = []
    for x, y in zip(ra.observables, rb.observables, strict=False):
        if x.value is None or y.value is None or x.label != y.label:
            continue
        kind = divergence_kind(x.value, y.value, (x.fingerprint or {}).get("dtype", "?"))
        if kind is not None:
            found.append(kind)
    return found
