"""The standalone repro: a plan written as a short script a maintainer can paste and run.

Ops are written as public calls (``torch.acosh(x0)``, ``torch.linalg.slogdet``, a tensor
method) wherever one computes exactly the aten op's result — checked here, on the recorded
inputs, bit for bit — and as ``torch.ops.aten.<op>.<overload>`` otherwise.  Inputs are the
recorded values, exactly: ``torch.tensor`` literals (Python's shortest round-trip floats,
exact for every float dtype) when small, ``torch.frombuffer`` hex when a few KiB, a ``.pt``
side file beyond that.  Never random data.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from triage.worker.graphio import decode
from triage.worker.fingerprint import to_numpy

LITERAL_ELEMENTS = 64
HEX_BYTES = 8192
SIDE_FILE = "minimal_inputs.pt"


def render_script(server: Any, request: dict[str, Any]) -> dict[str, Any]:
    graph = server.graph
    sources = request.get("sources") or {}
    names: dict[str, str] = {}
    inputs = [n for n in request["inputs"] if n not in sources]
    for i, name in enumerate(inputs):
        names[name] = f"x{i}"
    for name, source in sources.items():
        names[name] = names[source]
    recorded = {**server.recorded, **graph.leaves}
    lines, forms, uses_device = [], [], False
    for i, name in enumerate(request["plan"]):
        node = graph.nodes[name]
        names[name] = f"v{i}"
        if node["op"] == "getitem":
            lines.append(f"    v{i} = {names[node['of']]}[{node['index']}]")
            continue
        used = sorted(graph.nodes[g]["index"] for g in request["plan"]
                      if graph.nodes[g]["op"] == "getitem" and graph.nodes[g]["of"] == name)
        call, form = _call(graph, name, names, recorded, used)
        uses_device = uses_device or "device" in _device_args(node)
        forms.append(form)
        lines.append(f"    v{i} = {call}")
    outputs = [names[o] for o in request["outputs"]]
    params = ", ".join(names[n] for n in inputs)
    body = []
    if uses_device:
        body.append(f"    device = {names[inputs[0]]}.device" if inputs else '    device = torch.device("cpu")')
    body.extend(lines)
    body.append(f"    return {', '.join(outputs)}" if outputs else "    return None")

    side: dict[str, torch.Tensor] = {}
    values = []
    for name in inputs:
        literal = _literal(recorded[name])
        if literal is None:
            side[names[name]] = recorded[name].detach().cpu().clone()
            literal = f"inputs[{names[name]!r}]"
        values.append(f"{names[name]} = {literal}")
    header = [f"# Minimal repro written by triage: {len(forms)} op(s), inputs exactly as recorded.",
              f"# Arms compared: {' vs '.join(request['arms'])} — {request['kind']}."]
    if request["style"] == "plain":
        header.append(f"# Re-run the comparison with: triage run minimal.py --arms {','.join(request['arms'])}")
    text = header + ["import torch"]
    if side:
        text += ["from pathlib import Path", ""]
        text += [f'inputs = torch.load(Path(__file__).with_name("{SIDE_FILE}"))']
        torch.save(side, Path(request["dir"]) / SIDE_FILE)
    text += ["", "", f"def f({params}):", *body, "", ""]
    text += values + [""]
    text += _epilogue(request, params)
    return {"script": "\n".join(text) + "\n", "forms": forms, "side_file": SIDE_FILE if side else None}


def _epilogue(request: dict[str, Any], params: str) -> list[str]:
    style = request["style"]
    if style == "compile":
        backend = request.get("backend") or "inductor"
        return [f"eager = f({params})",
                f'compiled = torch.compile(f, backend="{backend}", fullgraph=True)({params})',
                'print("eager:   ", eager)', 'print("compiled:", compiled)']
    if style == "devices":
        devices = ", ".join(f'"{d}"' for d in request["devices"])
        return [f"for device in ({devices}):",
                f"    print(device, f(*(t.to(device) for t in ({params}{',' if params else ''}))))"]
    return [f"print(f({params}))"]


# -- calls ----------------------------------------------------------------------------------
def _call(graph: Any, name: str, names: dict[str, str], recorded: dict[str, Any], used: list[int]) -> tuple[str, str]:
    node = graph.nodes[name]
    target = node["target"]
    op = graph.ops[name]
    args_text = [_arg(a, names) for a in node["args"]]
    kwargs_text = [f"{k}={_arg(v, names)}" for k, v in node["kwargs"]["dict"].items()]
    for text, form in _public_forms(target.split(".")[1], args_text, kwargs_text):
        if _same_result(op, text, node, recorded, names, used):
            return text, form
    return f"torch.ops.{target}({', '.join(args_text + kwargs_text)})", target


def _public_forms(packet: str, args: list[str], kwargs: list[str]) -> list[tuple[str, str]]:
    joined = ", ".join(args + kwargs)
    bare = packet.lstrip("_")
    forms = []
    if not packet.startswith("_") and callable(getattr(torch, packet, None)):
        forms.append((f"torch.{packet}({joined})", f"torch.{packet}"))
    for prefix, module in (("linalg_", "linalg"), ("special_", "special"), ("fft_", "fft")):
        short = bare[len(prefix):]
        if bare.startswith(prefix) and callable(getattr(getattr(torch, module), short, None)):
            forms.append((f"torch.{module}.{short}({joined})", f"torch.{module}.{short}"))
    if not packet.startswith("_") and callable(getattr(torch.nn.functional, packet, None)):
        forms.append((f"torch.nn.functional.{packet}({joined})", f"torch.nn.functional.{packet}"))
    if args and not packet.startswith("_") and callable(getattr(torch.Tensor, packet, None)):
        rest = ", ".join(args[1:] + kwargs)
        forms.append((f"{args[0]}.{packet}({rest})", f"Tensor.{packet}"))
    return forms


def _same_result(op: Any, text: str, node: dict[str, Any], recorded: dict[str, Any], names: dict[str, str],
                 used: list[int]) -> bool:
    """Does the public form compute exactly what the aten op does, on the recorded inputs?"""
    by_var = {}
    for ref, var in names.items():
        value = recorded.get(ref)
        if isinstance(value, torch.Tensor):
            by_var[var] = value

    def fresh() -> dict[str, Any]:
        return {var: t.clone() for var, t in by_var.items()}

    env_aten = {ref: recorded[ref].clone() for ref in names if isinstance(recorded.get(ref), torch.Tensor)}
    try:
        cpu = torch.device("cpu")
        expected = op(*decode(node["args"], env_aten, cpu), **decode(node["kwargs"], env_aten, cpu))
        got = eval(text, {"torch": torch, "device": cpu}, fresh())  # noqa: S307 - text built above from op names
    except Exception:  # noqa: BLE001 - a form that does not run is simply not used
        return False
    if isinstance(expected, torch.Tensor):
        return isinstance(got, torch.Tensor) and _bits_equal(expected, got)
    if isinstance(expected, (tuple, list)) and isinstance(got, (tuple, list)):
        return all(i < len(got) and _bits_equal(expected[i], got[i]) for i in used) and bool(used)
    return False


def _bits_equal(a: Any, b: Any) -> bool:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = to_numpy(a), to_numpy(b)
    return x is not None and y is not None and x.tobytes() == y.tobytes()


def _device_args(node: dict[str, Any]) -> str:
    return str(node["args"]) + str(node["kwargs"])


def _arg(value: Any, names: dict[str, str]) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_arg(v, names) for v in value) + "]"
    if isinstance(value, dict):
        if "node" in value:
            return names[value["node"]]
        if "float" in value:
            return f'float("{value["float"]}")'
        if "dtype" in value:
            return f"torch.{value['dtype']}"
        if "layout" in value:
            return f"torch.{value['layout']}"
        if "memory_format" in value:
            return f"torch.{value['memory_format']}"
        if "device" in value:
            return "device"
        if "complex" in value:
            return f"complex({value['complex'][0]!r}, {value['complex'][1]!r})"
        if "dict" in value:
            return "{" + ", ".join(f"{k!r}: {_arg(v, names)}" for k, v in value["dict"].items()) + "}"
    return repr(value)


# -- literals -------------------------------------------------------------------------------
def _literal(t: torch.Tensor) -> str | None:
    t = t.detach().cpu()
    dtype = f"torch.{str(t.dtype).replace('torch.', '')}"
    if t.numel() <= LITERAL_ELEMENTS and not t.is_complex() and t.dtype != torch.complex32:
        values = t.double().tolist() if t.is_floating_point() else t.tolist()
        return f"torch.tensor({_nested(values)}, dtype={dtype})"
    if t.numel() * t.element_size() <= HEX_BYTES:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()
        shape = ", ".join(str(s) for s in t.shape)
        return (f'torch.frombuffer(bytearray.fromhex("{raw}"), dtype={dtype})'
                f".reshape({shape}{',' if t.dim() == 1 else ''})")
    return None


def _nested(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_nested(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    return repr(value)
