"""A warm arm worker: ``python -m triage.worker.serve``, one long-lived process per arm.

The minimizer asks thousands of "do the arms still diverge on this sub-graph?" questions;
paying ``import torch`` for each would make that hopeless.  Each arm instead gets one worker,
isolated like an arm run (fresh process, scrubbed environment, own process group, memory
limit), that loads the recorded op graph once and then answers requests read from a pipe
(framing in `triage.worker.wire`):

``setup``        arm settings + graph directory: import torch, apply knobs, load the graph
``prepare``      compute every node on this (reference) arm, keep the values as the
                 recorded intermediates, write them where the other arm can load them
``load_values``  load those recorded intermediates
``run``          execute a plan (eagerly, or compiled with the arm's backend) from recorded
                 inputs and return the outputs' values, or the exception
``localize``     per node: end-to-end difference and the op's local error, both against the
                 recorded intermediates
``inputs``       the current values of a plan's inputs (the data reduction shrinks copies)
``render``       write the standalone repro script for a plan (`triage.worker.render`)

``run``, ``localize`` and ``render`` take *overrides*: arrays sent with the request that replace
some inputs' recorded values (the minimizer's data reduction: fewer elements, plainer values),
cast back to the recorded dtype.

The worker runs no code from the reporter's script but one: where the compile arm used the
script's own backend function, that function's definitions (cut out of the script by
`triage.minimize.backend_source`) are run once at setup, inside this worker's jail, so that
candidates compile with it.  Everything else is aten ops named in the recording.
"""
from __future__ import annotations

import hashlib
import os
import resource
import sys
import traceback
from pathlib import Path
from typing import Any

from triage.worker.process import confine_self, limit_address_space, unbuffered_output


def _script_backend(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The script's backend callable, from its definitions (imports, the function, what it
    names), run in a module namespace of their own; and the torch-level functions it picks
    graph nodes by (`spec["targets"]`, spelled as there: `F.gelu`), by their `__name__`."""
    namespace: dict[str, Any] = {"__name__": "__triage_script_backend__"}
    exec(compile(spec["definitions"], "<the script's backend definitions>", "exec", dont_inherit=True), namespace)
    backend = namespace.get(spec["name"])
    if not callable(backend):
        raise TypeError(f"the script's backend {spec['name']!r} is not callable")
    targets: dict[str, Any] = {}
    for spelled in spec.get("targets") or ():
        root, *attrs = spelled.split(".")
        fn = namespace.get(root)
        for attr in attrs:
            fn = getattr(fn, attr, None)
        if callable(fn) and isinstance(getattr(fn, "__name__", None), str):
            targets.setdefault(fn.__name__, fn)
    return backend, targets


class Server:
    def __init__(self, setup: dict[str, Any]) -> None:
        import torch

        from triage.worker import envinfo
        from triage.worker.graphio import LoadedGraph
        from triage.worker.opgraph import Fault

        self.torch = torch
        arm = setup["arm"]
        self.device = torch.device(arm["device"])
        knobs = dict(arm["knobs"])
        fault = knobs.pop("fault", None)
        self.fault = Fault.parse(fault) if fault else None
        envinfo.apply_knobs(knobs)
        self.compile = arm["mode"] == "compile"
        self.backend = arm.get("backend") or "inductor"
        # The script's own backend sees torch-level graphs from dynamo, so candidates are built
        # from torch functions for it (graphio.torch_function).
        self.torch_level = bool(self.compile and setup.get("script_backend"))
        self.backend_targets: dict[str, Any] = {}
        if self.torch_level:
            self.backend, self.backend_targets = _script_backend(setup["script_backend"])
        self.graph = LoadedGraph(Path(setup["graph_dir"]))
        self.recorded: dict[str, Any] = {}
        self.compiled: dict[str, Any] = {}

    # -- helpers -------------------------------------------------------------------------
    def _after_op(self, fn: Any, out: Any) -> Any:
        if self.fault is not None and self.fault.matches(fn):
            return self.fault.apply(out)
        return out

    def recorded_value(self, name: str) -> Any:
        value = self.graph.leaves.get(name)
        return self.recorded[name] if value is None else value

    def overridden(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """The request's override arrays as tensors of the recorded inputs' dtypes (bfloat16
        travels widened to float32, which is exact)."""
        torch = self.torch
        values = {}
        for name, array in arrays.items():
            recorded = self.recorded_value(name)
            values[name] = torch.from_numpy(array.copy()).to(recorded.dtype)
        return values

    def _inputs(self, names: list[str], sources: dict[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        values: dict[str, Any] = {}
        sources = sources or {}
        overrides = overrides or {}
        for name in names:
            if name in sources:
                continue
            value = overrides[name] if name in overrides else self.recorded_value(name)
            # Fresh copies every time: a plan's in-place ops must not touch the recorded values.
            values[name] = value.detach().clone().to(self.device) if isinstance(value, self.torch.Tensor) else value
        for name, source in sources.items():
            values[name] = values[source]  # one tensor passed twice, as a merged input
        return values

    def _execute(self, request: dict[str, Any], overrides: dict[str, Any] | None = None) -> list[Any]:
        plan, input_names, outputs = request["plan"], request["inputs"], request["outputs"]
        upcast = frozenset(request.get("upcast") or ())
        inputs = self._inputs(input_names, request.get("sources"), overrides)
        if not self.compile:
            env = self.graph.run_eager(plan, inputs, self.device, self._after_op, upcast=upcast)
            return [env[name] for name in outputs]
        # One compiled function per plan, upcast set and input shapes: the data passes change
        # shapes, and one function recompiled past dynamo's recompile limit silently runs eager.
        shapes = [tuple(v.shape) if isinstance(v, self.torch.Tensor) else None for v in inputs.values()]
        key = request["key"] + ("|float64:" + ",".join(sorted(upcast)) if upcast else "") + f"|{shapes}"
        fn = self.compiled.get(key)
        if fn is None:
            gm = self.graph.to_module(plan, input_names, outputs, self.device, upcast,
                                      torch_level=self.backend_targets if self.torch_level else None)
            from triage.worker.observe import compile_backend

            fn = self.torch.compile(gm, backend=compile_backend(self.backend, None, None, False),
                                    fullgraph=True, dynamic=False)
            self.compiled[key] = fn
        return list(fn(*(inputs[name] for name in input_names)))

    # -- commands ------------------------------------------------------------------------
    def prepare(self, request: dict[str, Any], arrays: dict[str, Any]) -> tuple[dict, dict]:
        torch = self.torch
        keep = {}

        def store(name: str, value: Any) -> None:
            if isinstance(value, torch.Tensor):
                keep[name] = value.detach().clone().cpu()

        self.graph.run_eager(request["plan"], self._inputs(request["inputs"]), self.device,
                             self._after_op, keep=store)
        self.recorded = keep
        torch.save(keep, request["path"])
        digests = {name: _digest(t) for name, t in {**keep, **self.graph.leaves}.items()}
        return {"ok": True, "values": len(keep), "digests": digests,
                "bytes": sum(t.numel() * t.element_size() for t in keep.values())}, {}

    def load_values(self, request: dict[str, Any], arrays: dict[str, Any]) -> tuple[dict, dict]:
        self.recorded = self.torch.load(request["path"], weights_only=True)
        return {"ok": True, "values": len(self.recorded)}, {}

    def run(self, request: dict[str, Any], arrays: dict[str, Any]) -> tuple[dict, dict]:
        from triage.worker.fingerprint import dtype_name, to_numpy

        out = self._execute(request, self.overridden(arrays))
        values, specs = {}, []
        for name, value in zip(request["outputs"], out, strict=False):
            if isinstance(value, self.torch.Tensor):
                array = to_numpy(value)
                if array is not None:
                    values[name] = array
                specs.append({"name": name, "dtype": dtype_name(value.dtype)})
        return {"ok": True, "outputs": specs}, values

    def localize(self, request: dict[str, Any], arrays: dict[str, Any]) -> tuple[dict, dict]:
        """End-to-end: the whole plan on this arm vs the recorded values.  Local: each listed
        op alone, from the recorded values of its inputs, vs its recorded output."""
        from triage.numerics.errors import value_errors
        from triage.worker.fingerprint import dtype_name, to_numpy

        torch = self.torch

        def errors(name: str, value: Any) -> dict[str, Any] | None:
            ref = self.recorded.get(name)
            if not isinstance(value, torch.Tensor) or ref is None:
                return None
            a, b = to_numpy(ref), to_numpy(value)
            if a is None or b is None:
                return None
            return value_errors(a, b, dtype_name(ref.dtype))

        rows: dict[str, dict[str, Any]] = {}
        try:
            values = self._execute(dict(request["whole"]))
            for name, value in zip(request["whole"]["outputs"], values, strict=False):
                rows.setdefault(name, {})["end_to_end"] = errors(name, value)
        except Exception as e:  # noqa: BLE001 - an arm failing on the whole plan is a finding
            rows["__whole__"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        for single in request["local"]:
            try:
                values = self._execute(single)
                for name, value in zip(single["outputs"], values, strict=False):
                    rows.setdefault(name, {})["local"] = errors(name, value)
            except Exception as e:  # noqa: BLE001
                rows.setdefault(single["outputs"][0], {})["local"] = {
                    "kind": "raises", "detail": type(e).__name__, "max_abs": None, "max_ulps": None, "nonfinite": 0}
        return {"ok": True, "rows": rows}, {}

    def inputs(self, request: dict[str, Any], arrays: dict[str, Any]) -> tuple[dict, dict]:
        from triage.worker.fingerprint import dtype_name, to_numpy

        found, dtypes = {}, {}
        for name in request["names"]:
            value = self.recorded_value(name)
            array = to_numpy(value) if isinstance(value, self.torch.Tensor) else None
            if array is not None:
                found[name], dtypes[name] = array, dtype_name(value.dtype)
        return {"ok": True, "dtypes": dtypes}, found

    def render(self, request: dict[str, Any], arrays: dict[str, Any]) -> tuple[dict, dict]:
        from triage.worker.render import render_script

        return {"ok": True, **render_script(self, request, self.overridden(arrays))}, {}


def _digest(t: Any) -> str:
    """Identity of a value's exact bits, shape and dtype (input consolidation merges equal ones)."""
    from triage.worker.fingerprint import to_numpy

    array = to_numpy(t)
    raw = array.tobytes() if array is not None else repr(t).encode()
    return hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + raw).hexdigest()[:24]


COMMANDS = ("prepare", "load_values", "run", "localize", "inputs", "render")


def main() -> int:
    confine_self()
    # Only now: numpy (which the wire imports) starts OpenBLAS's threads, and a process is
    # confined before any thread runs beside it (sandbox/confine.py).
    from triage.worker.wire import WireError, receive, send

    unbuffered_output()
    requests = os.fdopen(int(os.environ.pop("TRIAGE_REQUEST_FD")), "rb")
    replies = os.fdopen(int(os.environ.pop("TRIAGE_REPLY_FD")), "wb")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        setup, _ = receive(requests)
    except WireError:
        return 1
    if setup.get("address_space_limit"):
        limit_address_space(int(setup["address_space_limit"]))
    try:
        server = Server(setup)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which reports it to people
        send(replies, {"ok": False, "error": {"type": type(e).__name__, "message": str(e)[:2000],
                                              "traceback": traceback.format_exc()[-4000:]}})
        return 1
    send(replies, {"ok": True, "torch": server.torch.__version__})
    while True:
        try:
            request, arrays = receive(requests)
        except WireError:
            return 0
        cmd = request.get("cmd")
        if cmd not in COMMANDS:
            send(replies, {"ok": False, "error": {"type": "ValueError", "message": f"unknown command {cmd!r}"}})
            continue
        try:
            header, arrays = getattr(server, cmd)(request, arrays)
        except Exception as e:  # noqa: BLE001 - the arm raising is an answer, not a worker failure
            header, arrays = {"ok": False, "error": {"type": type(e).__name__, "message": str(e)[:2000]}}, {}
        send(replies, header, arrays)


if __name__ == "__main__":
    sys.exit(main())
