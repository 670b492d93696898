"""One arm's run of one script, inside the worker process."""
from __future__ import annotations

import builtins
import contextlib
import dataclasses
import gc
import itertools
import operator
import os
import sys
import time
import traceback
import types
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from triage.worker.claims import OPERAND_BUDGET_SHARE, check_operands, claim_summary, is_claim
from triage.worker.hooks import ScriptHooks, run_script
from triage.worker.limits import MAX_CONDITIONING, MAX_LEAVES
from triage.worker.process import open_file, replace_file, to_json
from triage.worker.protocol import CHECK_OPERAND, OBSERVED, REFERENCE, SPREAD_ARRAYS


def run_job(job: dict[str, Any], emit: Callable[[dict], None]) -> dict[str, Any]:
    t0 = time.monotonic()
    import torch

    from triage.worker import envinfo
    from triage.worker.collapse import DeviceCollapse, install_cuda_shims
    from triage.worker.expressions import (
        CHECK_HOOK,
        EXPRESSION_HOOK,
        CheckOperands,
        ExpressionObserver,
        compile_observing_expressions,
    )
    from triage.worker.fingerprint import readable_fingerprint, to_numpy
    from triage.worker.modes import ModeStacks
    from triage.worker.observe import (
        ObservationStore,
        Observer,
        RootCalls,
        final_tensors,
        install_assert_close,
        install_compile,
        install_fast_paths,
        install_flush_watch,
        install_seed_watch,
    )
    from triage.worker.opgraph import Fault, OpRecorder, floating_dtypes, script_outer_site, script_site
    from triage.worker.reference import replay_fp64

    arm = job["arm"]
    result: dict[str, Any] = {"torch_import_s": round(time.monotonic() - t0, 3)}
    emit({"phase": "imported", "torch": torch.__version__})

    environment, env_error = job.get("collect_env"), None
    if environment is None and job.get("collect_env_timeout"):  # 0: triage's parent collects it
        environment, env_error = envinfo.collect_env(job["collect_env_timeout"])
    result["environment"] = environment
    result["environment_error"] = env_error

    device = torch.device(arm["device"])
    unavailable = _device_unavailable(torch, device)
    if unavailable:
        result.update(status="unavailable", exception=None, unavailable=unavailable)
        return result

    knobs = dict(arm["knobs"])
    fault = None
    if "fault" in knobs:
        fault = Fault.parse(knobs.pop("fault"))
    envinfo.apply_knobs(knobs)
    knob_calls = envinfo.watch_knob_calls(knobs, job["script"])
    seed = job["seed"]
    torch.manual_seed(seed)
    import random

    random.seed(seed)
    np.random.seed(seed)
    result["flags_start"] = envinfo.numerics_flags()

    script = job["script"]
    site = script_site(script)
    recorder = OpRecorder(device, site, fault=fault, max_leaf_bytes=job["max_leaf_bytes"],
                          outer_site=script_outer_site(script))
    store = ObservationStore(recorder, site, job["value_budget"], emit)
    roots = RootCalls(store, script)
    install_cuda_shims(device, script)
    install_compile(store, recorder, arm["mode"] == "compile", arm.get("backend"))
    install_assert_close(store)
    install_fast_paths()
    install_seed_watch(recorder)
    install_flush_watch(recorder)
    warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")

    code = compile_observing_expressions(Path(script).read_bytes(), script)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __builtins__=builtins, __cached__=None)
    module.__dict__[EXPRESSION_HOOK] = ExpressionObserver(store)
    module.__dict__[CHECK_HOOK] = checked = CheckOperands()
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    sys.argv = [script, *job["script_args"]]
    sys.path.insert(0, str(Path(script).parent))

    emit({"phase": "script-start"})
    status, exception, exit_notes, modes_left, operands = "ok", None, [], [], []
    start = time.monotonic()
    hooks = ScriptHooks()
    hooks.install()
    roots.install()
    try:
        with recorder, Observer(store, script), DeviceCollapse(device):
            stacks = ModeStacks.now()
            try:
                run_script(code, module.__dict__)
            finally:
                modes_left = stacks.restore()
    except BaseException as e:  # noqa: BLE001 - whatever the script raises is a result
        if isinstance(e, SystemExit) and e.code in (None, 0):
            exit_notes.append(f"the script called sys.exit({e.code if e.code is not None else ''}) "
                              f"at line {_script_line(e, script)}")
        else:
            status = "raised"
            exception = _exception_info(e, script, observed=bool(store.records), hooks=hooks.codes)
            if exception["claim"]:
                # The script's own check failing: its values are compared, and the note says so.
                exit_notes.append(claim_summary(e, exception["line"]))
                operands = check_operands(e, script, Path(script).read_bytes(), checked.values,
                                          int(OPERAND_BUDGET_SHARE * job["value_budget"]))
    finally:
        hooks.remove()
        roots.remove()
        sys.modules["__main__"] = saved_main
    if modes_left:
        exit_notes.append(_modes_left_note(modes_left))
    exit_note = "; ".join(exit_notes) or None
    result["elapsed_s"] = round(time.monotonic() - start, 3)
    result["knob_calls"] = list(knob_calls)  # the script's calls only: triage's own come next
    emit({"phase": "script-done", "status": status})
    # What the script made (its tensors, the recording's graph: a loop of 100,001
    # `torch.tensor([x])` makes 200,000 nodes) is not garbage the analysis makes: frozen, the
    # collections the analysis's allocations trigger skip it (each walked it, 2 s a time).
    gc.freeze()

    for name, t in final_tensors(module.__dict__):
        store.add("final", f"`{name}` at exit", t, line=None)
    recording = recorder.finish()
    result["flags_end"] = envinfo.numerics_flags()

    by_name = {n.name: n for n in recording.graph.nodes}
    reference: dict[str, Any] = {"status": "off", "seconds": 0.0, "note": None, "approximate_ops": []}
    replay = None
    wanted = {r["node"] for r in store.records if r["node"] is not None}
    if job["reference"]:
        emit({"phase": "reference-start", "nodes": len(by_name)})
        singular = {c["node"]: c.get("exact_rank") for c in recording.conditioning if c.get("exact_singular")}
        domain_inputs = _domain_inputs(recording, by_name)
        replay = replay_fp64(recording.graph, wanted | set(domain_inputs.values()), job["reference_budget_s"],
                             singular)
        _note_checks(recording, by_name, replay.checked)
        _note_domains(recording, domain_inputs, replay.values)
        reference.update(
            status="partial" if (replay.incomplete or replay.failed or recording.stopped) else "complete",
            seconds=round(replay.seconds, 3),
            note=replay.incomplete or recording.stopped,
            approximate_ops=sorted(set(replay.approximate.values())),
        )
    leaf_index = {leaf.node.name: leaf.index for leaf in recording.leaves}
    conditioning_nodes = {c["node"]: i for i, c in enumerate(recording.conditioning)}
    vectors_read: set[str] = set()
    for record in store.records:
        record["ancestors"], record["conditioning"], record["compiled_line"] = _ancestry(
            by_name.get(record["node"]), leaf_index, conditioning_nodes, vectors_read)
    _values_only_notes(recording, vectors_read)
    if replay is not None:
        _mark_uninitialized_reads(recording, store.records, job["reference_budget_s"])
    # Within result.json's limits: the leaves (and conditioning notes) the observed values read
    # first, then the earliest; the observables' references renumbered to the kept entries.
    kept_leaves = _kept(len(recording.leaves), [r["ancestors"] for r in store.records], MAX_LEAVES)
    kept_conditioning = _kept(len(recording.conditioning), [r["conditioning"] for r in store.records],
                              MAX_CONDITIONING)
    for record in store.records:
        record["ancestors"] = [kept_leaves[i] for i in record["ancestors"] if i in kept_leaves]
        record["conditioning"] = [kept_conditioning[i] for i in record["conditioning"] if i in kept_conditioning]
    leaves = []
    for old in kept_leaves:  # in recording order, as renumbered
        leaf = recording.leaves[old]
        leaves.append({"index": len(leaves), "node": leaf.node.name, "kind": leaf.kind, "op": leaf.op,
                       "line": leaf.line, "fingerprint": readable_fingerprint(leaf.value)[0],
                       "seed": leaf.seed, "call_line": leaf.call_line,
                       "literal_rounding": _literal_rounding(leaf), "literal_beyond_range": _literal_beyond_range(leaf)})
    conditioning = [recording.conditioning[old] for old in kept_conditioning]
    left_out = {"leaves": len(recording.leaves) - len(leaves),
                "conditioning": len(recording.conditioning) - len(conditioning)}

    values = dict(store.values)
    # The failing check's operands: their values beside the observed ones, their names here.
    values.update({f"{CHECK_OPERAND}{i}": x.pop("values") for i, x in enumerate(operands)})
    if operands:
        result["check_operands"] = operands
    # A value observed again (a call's output, a claim's operand, at exit) is one node and one
    # replayed value: fingerprinted once (a million float64 elements: tens of ms each).
    reference_fingerprints: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    reference_arrays: dict[str, np.ndarray | None] = {}
    for record in store.records:
        node_name = record["node"]
        ref: dict[str, Any] = {"fingerprint": None, "note": None, "approximate": False}
        record["reference"] = ref
        if replay is None:
            ref["note"] = "the float64 reference is switched off"
            continue
        if node_name is None:
            ref["note"] = recording.stopped or "no recorded op produced this value"
            continue
        value = replay.values.get(node_name)
        if value is None or not isinstance(value, torch.Tensor):
            ref["note"] = replay.failed.get(node_name) or replay.incomplete or "not replayed"
            continue
        fp = record["fingerprint"]
        if fp is None or list(value.shape) != fp["shape"]:
            ref["note"] = "the replay produced a different shape"
            continue
        if node_name not in reference_fingerprints:
            reference_fingerprints[node_name] = readable_fingerprint(value)
        fingerprinted, unreadable = reference_fingerprints[node_name]
        if unreadable:
            ref["note"] = f"the float64 replay's value {unreadable}"
            continue
        ref["fingerprint"] = dict(fingerprinted)
        ref["approximate"] = bool(replay.approximate)
        if node_name not in reference_arrays:
            reference_arrays[node_name] = to_numpy(value)
        wide = reference_arrays[node_name]
        if wide is not None and f"{OBSERVED}{record['index']}" in values:
            values[f"{REFERENCE}{record['index']}"] = wide

    if replay is not None:
        _note_one_changes(recording.graph, store.records, replay.values, frozenset(replay.approximate))
        if operands:
            _note_outside_one_change(recording.graph, store.records, replay.values, values, operands,
                                     Path(script).read_text(errors="replace"), exception["line"],
                                     frozenset(replay.approximate))
    if replay is not None and job.get("rounding"):
        emit({"phase": "rounding-start"})
        result["rounding"] = _simulated(recording.graph, store.records, replay.values, values, job, arm["device"],
                                        result.get("flags_end") or result["flags_start"])
    result.update(
        status=status,
        exception=exception,
        exit_note=exit_note,
        observables=store.records,
        observables_truncated=store.full,
        leaves=leaves,
        conditioning=conditioning,
        left_out=left_out if any(left_out.values()) else None,
        graph={"nodes": len(by_name), "leaves": len(recording.leaves),
               "compiled_graphs": recording.compiled_graphs, "stopped": recording.stopped,
               "dtypes": floating_dtypes(recording.graph), "backends": recorder.script_backends},
        reference=reference,
        random_before_seed=recording.random_before_seed,
        compiled_random_ops=recording.compiled_random_ops,
    )
    out_dir = Path(job["result_dir"])
    np.savez(out_dir / "values.npz", **values)
    if job.get("export_graph") and arm["mode"] == "eager":
        # The op graph the minimizer works on: only a complete eager recording describes the run.
        from triage.worker.graphio import export_graph

        result["graph"]["export"] = recording.stopped or export_graph(recording.graph, out_dir / "graph") or "ok"
    return result


def _literal_rounding(leaf: Any) -> float | None:
    """How far, relatively at most, the leaf's dtype rounded the numbers the script wrote
    (`Leaf.literal`); None for a leaf not written as numbers its dtype misses."""
    if leaf.literal is None or not leaf.literal.numel():
        return None
    moved = float(((leaf.value.double() - leaf.literal).abs() / leaf.literal.abs().clamp_min(2.0 ** -1074)).max())
    return moved if moved < float("inf") else None  # past the dtype's range: inf, which JSON does not carry


def _literal_beyond_range(leaf: Any) -> float | None:
    """The largest number the script wrote for the leaf that its dtype's range does not reach
    (`torch.tensor(1e40)`: inf from the start); None where every written number is in range."""
    if leaf.literal is None:
        return None
    beyond = leaf.literal.isfinite() & ~leaf.value.isfinite()
    return float(leaf.literal[beyond].abs().max()) if bool(beyond.any()) else None


def _mark_uninitialized_reads(recording: Any, records: list[dict[str, Any]], budget_s: float) -> None:
    """Set each record's `uninitialized`: whether its value depends on bytes a `torch.empty`
    (an uninitialized leaf) held. Being downstream is not enough (`buf[:] = x` overwrites every
    one), so the float64 replay is run again with those leaves' floating elements NaN, and with
    them 0: a value NaN in the first where it is not in the second read them. The arm's own
    replay reads the same bytes, so such a value agrees with its reference and with another arm
    that happened to hold them."""
    import torch

    from triage.worker.reference import replay_fp64

    garbage = {leaf.index: leaf for leaf in recording.leaves
               if leaf.kind == "uninitialized" and leaf.value.is_floating_point()}
    suspects = [r for r in records if r["node"] is not None and garbage.keys() & set(r["ancestors"])]
    for r in records:  # a suspect stays unknown (None) until its replays are compared below
        r["uninitialized"] = None if r["node"] is None else False
    for r in suspects:
        r["uninitialized"] = None
    if not suspects:
        return
    saved = {i: leaf.node.meta["leaf"] for i, leaf in garbage.items()}
    filled = {}
    # NaN bytes and zero bytes: the arm's own bytes may be NaN already (an allocator's reused
    # block), so a value reads them where the NaN-filled replay is NaN and the zero-filled not.
    for fill in (float("nan"), 0.0):
        for i, leaf in garbage.items():
            leaf.node.meta["leaf"] = dataclasses.replace(leaf, value=torch.full_like(leaf.value, fill))
        try:
            filled[fill == 0.0] = replay_fp64(recording.graph, {r["node"] for r in suspects}, budget_s)
        finally:
            for i, leaf in garbage.items():
                leaf.node.meta["leaf"] = saved[i]
    for r in suspects:
        clean, dirty = filled[True].values.get(r["node"]), filled[False].values.get(r["node"])
        if isinstance(clean, torch.Tensor) and isinstance(dirty, torch.Tensor) and clean.shape == dirty.shape:
            r["uninitialized"] = bool((dirty.isnan() & ~clean.isnan()).any())


def _note_one_changes(graph: Any, records: list[dict[str, Any]], values: dict[str, Any],
                      native: frozenset[str]) -> None:
    """For each claim whose two float64 values differ (two functions, not rounding), the one
    change to one side's ops that makes them agree (triage/worker/counterfactual.py), noted
    in that side's reference. The search replays ops with arguments the script never gave
    them, and a native kernel that trusts its arguments may crash the process (oneDNN's RNN
    layer, `instance_norm` without running statistics): it runs in a forked child, and a
    child that dies, overruns or raises costs the notes, never the arm."""
    from triage.worker.counterfactual import BUDGET_S, one_change

    operands: dict[int, dict[int, dict[str, Any]]] = {}
    for r in records:
        if r["kind"] == "claim" and r.get("claim") and r["node"] is not None and r["reference"]["fingerprint"]:
            operands.setdefault(r["claim"]["id"], {})[r["claim"]["operand"]] = r
    pairs = {claim: pair for claim, pair in operands.items() if len(pair) == 2 and pair[0]["node"] != pair[1]["node"]}
    if not pairs:
        return

    def search() -> dict[str, Any]:
        deadline = time.monotonic() + BUDGET_S
        found = {}
        for claim, pair in pairs.items():
            if time.monotonic() > deadline:
                break
            change = one_change(graph, pair[0]["node"], pair[1]["node"], values, deadline, native)
            if change is not None:
                found[str(claim)] = change
        return found

    for claim, change in (_in_a_child(search, BUDGET_S + ONE_CHANGE_GRACE_S) or {}).items():
        pair = pairs.get(int(claim))
        if pair is not None and isinstance(change, dict):
            changed = pair[0] if change.pop("side", None) == pair[0]["node"] else pair[1]
            changed["reference"]["one_change"] = change


def _note_outside_one_change(graph: Any, records: list[dict[str, Any]], references: dict[str, Any],
                             values: dict[str, Any], operands: list[dict[str, Any]], source: str, line: int | None,
                             native: frozenset[str]) -> None:
    """For a failing check that equates torch's value (read back: `t = x.mean(0).numpy()`)
    with one the script computed outside torch (`n = np.mean(a, axis=1)`), where their float64
    values differ: the one change to torch's ops that makes its float64 value the outside one
    (a reduction's axis, a variance's correction, a constant), noted on the torch operand
    (`one_change`). In a forked child, as `_note_one_changes`."""
    import numpy as np
    import torch

    from triage.worker.claims import equated_pairs
    from triage.worker.counterfactual import BUDGET_S, one_change

    if line is None:
        return
    arrays = {x["name"]: values.get(f"{CHECK_OPERAND}{i}") for i, x in enumerate(operands)}

    def node_of(value: Any) -> str | None:  # the last record holding the operand's numbers bit for bit
        for r in reversed(records):
            held = values.get(f"{OBSERVED}{r['index']}")
            if r["node"] is not None and isinstance(held, np.ndarray) and held.dtype.kind == "f" \
                    and held.shape == value.shape and np.array_equal(held.astype(np.float64), value, equal_nan=True):
                return r["node"]
        return None

    nodes = {name: node_of(a) for name, a in arrays.items() if isinstance(a, np.ndarray)}
    pairs = [(x, y) for pair in equated_pairs(source, line) if len(pair) == 2
             for x, y in itertools.permutations(pair) if nodes.get(x) and y in nodes and nodes[y] is None]
    if not pairs:
        return

    def search() -> dict[str, Any]:
        deadline = time.monotonic() + BUDGET_S
        for x, y in pairs:
            outside = f"{CHECK_OPERAND}:{y}"
            change = one_change(graph, nodes[x], outside, dict(references, **{outside: torch.from_numpy(arrays[y])}),
                                deadline, native)
            if change is not None:
                change.pop("side", None)
                return {"operand": x, "change": change}
        return {}

    found = _in_a_child(search, BUDGET_S + ONE_CHANGE_GRACE_S) or {}
    for x in operands:
        if isinstance(found.get("change"), dict) and x["name"] == found.get("operand"):
            x["one_change"] = found["change"]


# What a forked search may take past its own budget (the fork and its answer's way back).
ONE_CHANGE_GRACE_S = 2.0


def _in_a_child(work: Callable[[], Any], timeout_s: float) -> Any:
    """`work()` run in a forked child on one thread, its JSON result read back through a pipe;
    None where the child dies (a signal), overruns `timeout_s`, raises or answers nothing."""
    import json
    import select
    import signal

    import torch

    read, write = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no process to spare (the arm's task limit): no search, no note
        os.close(read)
        os.close(write)
        return None
    if pid == 0:  # the child: whatever happens, it ends here
        try:
            os.close(read)
            torch.set_num_threads(1)  # no thread pool the fork did not copy
            data = json.dumps(work()).encode()
            view = memoryview(data)
            while view:
                view = view[os.write(write, view):]
        finally:
            os._exit(0)
    os.close(write)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while (left := deadline - time.monotonic()) > 0 and select.select([read], [], [], left)[0]:
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    try:
        return json.loads(b"".join(chunks)) if chunks else None
    except ValueError:  # cut short: the child overran
        return None


def _simulated(graph: Any, records: list[dict[str, Any]], references: dict[str, Any], values: dict[str, Any],
               job: dict[str, Any], device: str, flags: dict[str, Any]) -> dict[str, Any]:
    """The rounding simulation's summary.  It runs after the script, in the script's process: a
    failure there is triage's (perhaps set off by a state the script left) and costs the
    judgement, not the run.  Every value is then left unjudged, saying why, its traceback goes to
    the arm's stderr, and the script's own values and float64 reference are kept."""
    from triage.worker.rounding import simulate_observables

    try:
        # The script's objects are frozen (`run_job`) for good: the worker exits after.
        return simulate_observables(graph, records, references, values, job, device, flags, thaw=False)
    except Exception as e:  # noqa: BLE001 - any failure of the simulation leaves the run's values standing
        traceback.print_exc()
        message = str(e).strip().partition("\n")[0]
        reason = f"triage's rounding simulation failed ({type(e).__name__}: {_shortened(message, 300)})"
        for key in [k for k in values if k.startswith(SPREAD_ARRAYS)]:
            del values[key]
        for r in records:
            r["rounding"] = {"status": "not-judged", "reason": reason, "samples": 0, "sample_stats": [], "flips": [],
                             "cancellations": [], "precision": None, "unmeasured": [], "order_dependent": []
                             } if f"{REFERENCE}{r['index']}" in values else None
        return {"seconds": None, "samples": None, "note": reason, "kernels": None, "reductions_drawn_whole": None}


def _domain_inputs(recording: Any, by_name: dict[str, Any]) -> dict[int, str]:
    """Each domain note's index -> the node whose value it counted (its op's input), whose
    float64 value the reference replay keeps (`_note_domains`)."""
    import torch.fx as fx

    found = {}
    for i, c in enumerate(recording.conditioning):
        node = by_name.get(c.get("node"))
        if c.get("kind") == "domain" and node is not None and node.args and isinstance(node.args[0], fx.Node):
            found[i] = node.args[0].name
    return found


def _note_domains(recording: Any, inputs: dict[int, str], values: dict[str, Any]) -> None:
    """A domain note whose input the float64 replay puts on the edge less often than the arm
    did says so: rounding upstream, not the exact answer, gave the arm's nan/inf."""
    import torch

    from triage.worker.conditioning import domain_counts, domain_figure, exact_at_edge

    for i, name in inputs.items():
        note, value = recording.conditioning[i], values.get(name)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and "outside" in note:
            float64 = domain_counts(note["op"], value)
            note["figure"] = domain_figure(note["op"], note["outside"], note["at_edge"], float64)
            note["exact_edge"] = exact_at_edge(note["outside"], note["at_edge"], float64)


def _note_checks(recording: Any, by_name: dict[str, Any], checked: dict[str, Any]) -> None:
    """The float64 replay's checks against independent answers, in the conditioning notes: a
    linalg call's note gains them; a special function whose float64 kernel strayed from its
    mpmath answer gets a note of its own (only then: agreement is the rule there)."""
    from triage.worker.independent import note_fields

    notes = {c["node"]: c for c in recording.conditioning}
    for name, check in checked.items():
        if name in notes:
            notes[name].update(note_fields(check, "float64"))
        elif check.disagrees and name in by_name:
            node = by_name[name]
            recording.conditioning.append(dict(
                note_fields(check, "float64"), op=check.answer.op, node=name, line=node.meta.get("line"),
                kind="float64-reference-inaccurate", shape=list(check.answer.value.shape),
                dtype="float64", singular=False, ill_conditioned=False,
                figure=(f"the float64 replay's `{check.answer.op}` gives {check.got:.17g} where {check.answer.method} "
                        f"gives {check.exact:.17g}: {check.error:.2g} of max(|f|, |x·f′|) off, where a correct "
                        f"float64 library stays within {check.bound:.2g}. Its formula loses digits there, so the "
                        "reference continues from the independent value")))


def _device_unavailable(torch: Any, device: Any) -> str | None:
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA device is available to this torch build on this machine" + _cuda_init_error(torch)
        if (device.index or 0) >= torch.cuda.device_count():
            return f"{device} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)"
        return None
    if device.type == "mps" and not torch.backends.mps.is_available():
        return "MPS is not available on this machine"
    return None


def _cuda_init_error(torch: Any) -> str:
    """Why CUDA did not start, in the driver's or torch's words: `is_available` only says that
    it did not (no driver, no device node, a driver older than the build, a sandbox rule)."""
    if not torch.version.cuda:
        return " (this torch is a CPU-only build)"
    try:
        torch.cuda.init()
    except Exception as e:  # noqa: BLE001 - the message is the finding
        return f" ({type(e).__name__}: {str(e).strip().splitlines()[0][:300]})" if str(e).strip() else ""
    return ""


def _values_only_notes(recording: Any, vectors_read: set[str]) -> None:
    """An eigen- or singular-vector op whose vectors no observed value reads (`eigvalsh`, which
    under a dispatch mode computes them anyway) gets its matrix's own note, not the vectors'
    figure (the gap between two eigenvalues says nothing of the eigenvalues)."""
    from triage.worker.conditioning import VECTOR_NOTE_KEYS

    for i, values_only in recording.values_only.items():
        if values_only["node"] not in vectors_read:
            recording.conditioning[i] = dict(values_only, **{k: v for k, v in recording.conditioning[i].items()
                                                            if k not in values_only and k not in VECTOR_NOTE_KEYS})


def _ancestry(node: Any, leaf_index: dict[str, int], conditioning_nodes: dict[str, int],
              vectors_read: set[str] | None = None, limit: int = 20000) -> tuple[list[int], list[int], int | None]:
    """The leaves and the conditioning-checked ops an observable's value depends on, and the
    script line of a compiled region it comes through (the nearest; None where none).
    `vectors_read` collects the ops whose outputs past the first (an eigensolver's vectors) the
    value reads."""
    from triage.worker.opgraph import CompiledRegion, value_inputs

    if node is None:
        return [], [], None
    seen, stack, leaves, conditioned, compiled = set(), [node], [], [], None
    while stack and len(seen) < limit:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.name in leaf_index:
            leaves.append(leaf_index[n.name])
        if n.name in conditioning_nodes:
            conditioned.append(conditioning_nodes[n.name])
        if vectors_read is not None and n.target is operator.getitem and n.args[1] != 0 \
                and n.args[0].name in conditioning_nodes:
            vectors_read.add(n.args[0].name)
        if compiled is None and isinstance(n.target, CompiledRegion):
            compiled = n.meta.get("call_line") or n.meta.get("line")
        stack.extend(value_inputs(n))
    return sorted(leaves)[:256], sorted(conditioned), compiled


def _shortened(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _kept(total: int, referenced: list[list[int]], limit: int) -> dict[int, int]:
    """Which of `total` entries to keep, at most `limit`: those `referenced` first (lowest
    first), then the earliest of the rest. {old index: new index}, in the old order."""
    if total <= limit:
        return {i: i for i in range(total)}
    chosen = set(sorted({i for refs in referenced for i in refs if 0 <= i < total})[:limit])
    for i in range(total):
        if len(chosen) >= limit:
            break
        chosen.add(i)
    return {old: new for new, old in enumerate(sorted(chosen))}


def _modes_left_note(names: list[str], shown: int = 5) -> str:
    """The exit note for torch modes the script entered and never left (names shortened: the
    note must stay a sentence whatever the script calls its classes)."""
    listed = ", ".join(f"`{name[:60]}`" for name in names[:shown])
    if len(names) > shown:
        listed += f" and {len(names) - shown} more"
    several = len(names) > 1
    return (f"the script left its own torch mode{'s' if several else ''} {listed} active; triage removed "
            f"{'them' if several else 'it'} when the script ended")


def _script_line(e: BaseException, script: str) -> int | None:
    line = None
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_filename == script:
            line = lineno
    return line


def _exception_info(e: BaseException, script: str, observed: bool, hooks: set[types.CodeType]) -> dict[str, Any]:
    """The exception for the report; `observed`: the script had recorded a value before it;
    `hooks`: the code of the trace and profile functions the script installed."""
    tb = traceback.extract_tb(e.__traceback__)
    # Drop triage's own frames (the exec call) from the traceback shown to people.
    frames = [f for f in tb if "triage/worker" not in f.filename.replace(os.sep, "/")]
    line = _script_line(e, script)
    if isinstance(e, SyntaxError):
        line = e.lineno
    text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(e), e))
    return {
        # The class's names are the script's, at any length: within result.json's limits.
        "type": _shortened(type(e).__name__, 300),
        "qualified_type": _shortened(f"{type(e).__module__}.{type(e).__qualname__}", 1000),
        "message": str(e)[:2000],
        "traceback": text[-8000:],
        "line": line,
        "claim": is_claim(e, script, observed, hooks),
    }


def write_result(result: dict[str, Any], out_dir: Path) -> None:
    tmp = out_dir / "result.json.tmp"
    with open_file(tmp, "w", encoding="utf-8") as f:
        f.write(to_json(result))
    replace_file(tmp, out_dir / "result.json")
