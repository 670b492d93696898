"""The standalone repro: a plan written as a short script a maintainer can paste and run.

Ops are written as public calls (``torch.acosh(x0)``, ``torch.linalg.slogdet``, a tensor
method) wherever one computes exactly the aten op's result — checked here, on the recorded
inputs, bit for bit — and as ``torch.ops.aten.<op>.<overload>`` otherwise.  Inputs are the
recorded values, exactly: ``torch.tensor`` literals (Python's shortest round-trip floats,
exact for every float dtype) when small, ``torch.frombuffer`` hex when a few KiB, a ``.pt``
side file beyond that.  Never random data.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from triage.numerics.literals import FLOATING, literal
from triage.worker.fingerprint import dtype_name, to_numpy
from triage.worker.graphio import decode
from triage.worker.protocol import INPUTS_FILE

LITERAL_ELEMENTS = 64
HEX_BYTES = 8192


def render_script(server: Any, request: dict[str, Any], overrides: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The script, its ops' public forms, and per op a float64 line ("compute it in float64
    and cast back") that has been run once here on the script's own inputs."""
    graph = server.graph
    sources = request.get("sources") or {}
    names: dict[str, str] = {}
    inputs = [n for n in request["inputs"] if n not in sources]
    for i, name in enumerate(inputs):
        names[name] = f"x{i}"
    for name, source in sources.items():
        names[name] = names[source]
    recorded = {**server.recorded, **graph.leaves, **overrides}
    # The script's backend picks graph nodes by these functions: where one of an op's public
    # forms is one of them, it is written so (`torch.softmax`, `a / b`), or the repro's own
    # compile would match nothing.
    script_backend = request.get("script_backend") if request["style"] == "compile" else None
    preferred = list((script_backend or {}).get("targets") or [])
    lines, forms, float64_lines, uses_device = [], [], {}, False
    for i, name in enumerate(request["plan"]):
        node = graph.nodes[name]
        names[name] = f"v{i}"
        if node["op"] == "getitem":
            lines.append(f"    v{i} = {names[node['of']]}[{node['index']}]")
            continue
        used = sorted(graph.nodes[g]["index"] for g in request["plan"]
                      if graph.nodes[g]["op"] == "getitem" and graph.nodes[g]["of"] == name)
        call, form = _call(graph, name, names, recorded, used, preferred)
        uses_device = uses_device or "device" in _device_args(node)
        forms.append(form)
        line = _float64_line(graph, name, names, recorded, form)
        if line:
            float64_lines[name] = line
        lines.append(f"    v{i} = {call}")
    outputs = [names[o] for o in request["outputs"]]
    params = ", ".join(names[n] for n in inputs)
    body = []
    if uses_device:
        body.append(f"    device = {names[inputs[0]]}.device" if inputs else '    device = torch.device("cpu")')
    body.extend(lines)
    body.append(f"    return {', '.join(outputs)}" if outputs else "    return None")
    definition = [f"def f({params}):", *body]

    side: dict[str, torch.Tensor] = {}
    values = []
    for name in inputs:
        literal = _literal(recorded[name])
        if literal is None:
            side[names[name]] = recorded[name].detach().cpu().clone()
            literal = f"inputs[{names[name]!r}]"
        values.append(_wrapped(f"{names[name]} = {literal}", recorded[name]))
    exact = _runs_in_float64(definition, {names[n]: recorded[n] for n in inputs}, params)
    header = [f"# Minimal repro written by triage: {len(forms)} op(s), "
              + ("inputs reduced to the plainest that still diverge." if overrides else "inputs exactly as recorded."),
              f"# Arms compared: {' vs '.join(request['arms'])} — {request['kind']}."]
    if request["style"] == "plain":
        header += ["# One process cannot run both arms; compare them with:",
                   f"#   triage run minimal.py --arms {','.join(request['arms'])}"]
    text = header + ["import torch"]
    if request["style"] == "settings" and any(k in INDUCTOR_KNOBS for k, _ in _all_knobs(request)):
        text.append("import torch._inductor.config")
    if side:
        text += ["from pathlib import Path", ""]
        text += [f'inputs = torch.load(Path(__file__).with_name("{INPUTS_FILE}"))']
        torch.save(side, Path(request["dir"]) / INPUTS_FILE)
    script_backend = request.get("script_backend")
    if request["style"] == "compile" and script_backend:
        text += ["", "", "# The script's own compile backend, as the script defines it:",
                 *(line for line in script_backend["definitions"].rstrip("\n").splitlines() if line != "import torch")]
    text += ["", "", *definition, "", ""] + SHOW + ["", ""]
    text += values + ["", "torch.set_printoptions(precision=10)"]
    text += _epilogue(request, params, len(outputs), exact)
    return {"script": "\n".join(text) + "\n", "forms": forms, "side_file": INPUTS_FILE if side else None,
            "float64_lines": float64_lines, "results": _result_names(request)}


# Printed by every script: the two sides at full precision (a rounding-level difference is
# invisible at torch's default 4 decimals), then how far apart they are, in ulps of the dtype.
SHOW = '''
def show(results):
    """Each side at full precision, then how far apart the first two are, in ulps."""
    for name, value in results.items():
        print(f"{name + ':':10}", value.tolist() if value.numel() <= 16 else value)
    (_, a), (_, b) = list(results.items())[:2]
    if a.is_floating_point() and a.dtype == b.dtype:
        info = torch.finfo(a.dtype)
        a, b = a.cpu().double(), b.cpu().double()
        both = a.isfinite() & b.isfinite()
        diff = (a - b)[both].abs()
        ulps = diff / (info.eps * a[both].abs().clamp(min=info.tiny).log2().floor().exp2())
        most = (diff.max().item(), ulps.max().item()) if diff.numel() else (0.0, 0.0)
        print(f"max |diff| {most[0]:.6g} = {most[1]:.3g} ulp; "
              f"nonfinite on one side only: {(a.isfinite() != b.isfinite()).sum().item()}")
'''.strip("\n").splitlines()

INDUCTOR_KNOBS = ("fallback_random", "emulate_precision_casts")
# How a script sets each knob itself (`triage.worker.envinfo.apply_knobs` sets them for an
# arm): (the expression reading the current value, the statement setting it).
KNOB_CODE = {
    "threads": ("torch.get_num_threads()", "torch.set_num_threads({})"),
    "mkldnn": ("torch.backends.mkldnn.enabled", "torch.backends.mkldnn.enabled = {}"),
    "deterministic": ("torch.are_deterministic_algorithms_enabled()",
                      "torch.use_deterministic_algorithms({}, warn_only=True)"),
    "cudnn_benchmark": ("torch.backends.cudnn.benchmark", "torch.backends.cudnn.benchmark = {}"),
    "tf32": ("torch.backends.cuda.matmul.allow_tf32",
             "torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = {}"),
    "reduced_precision": ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
                          "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = "
                          "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = {}"),
    "fallback_random": ("torch._inductor.config.fallback_random", "torch._inductor.config.fallback_random = {}"),
    "emulate_precision_casts": ("torch._inductor.config.emulate_precision_casts",
                                "torch._inductor.config.emulate_precision_casts = {}"),
}


def _knob_value(name: str, value: str) -> str:
    return value if name == "threads" else repr(value in ("on", "1", "true"))


def _all_knobs(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [tuple(k) for side in request.get("knobs") or [] for k in side]


def _identifier(arm: str) -> str:
    return re.sub(r"\W+", "_", arm).strip("_") or "arm"


def _result_names(request: dict[str, Any]) -> list[str]:
    """The script's top-level names holding arm A's and arm B's values."""
    style = request["style"]
    if style == "compile":
        return ["eager", "compiled"]
    if style == "settings":
        return [_identifier(a) for a in request["arms"]]
    if style == "devices":
        return [_identifier(d) for d in request["devices"]]
    return []


def _epilogue(request: dict[str, Any], params: str, outputs: int, exact: bool) -> list[str]:
    style = request["style"]
    call_double = f"f({', '.join(f'{p}.double()' for p in params.split(', '))})" if params else "f()"
    lines: list[str]
    shown: list[tuple[str, str]]
    if style == "compile":
        script_backend = request.get("script_backend")
        backend = script_backend["name"] if script_backend else f'"{request.get("backend") or "inductor"}"'
        lines = [f"eager = f({params})",
                 f"compiled = torch.compile(f, backend={backend}, fullgraph=True)({params})"]
        shown = [("eager", "eager"), ("compiled", "compiled")]
    elif style == "settings":
        lines, shown = _settings_lines(request, params)
    elif style == "devices":
        names = [_identifier(d) for d in request["devices"]]
        lines = [f"{n} = f({', '.join(f'{p}.to({d!r})' for p in params.split(', '))})" if params else f"{n} = f()"
                 for n, d in zip(names, request["devices"], strict=False)]
        shown = [(d, n) for d, n in zip(request["devices"], names, strict=False)]
    else:
        lines, shown = [f"value = f({params})"], [("value", "value")]
    if exact:
        lines.append(f"exact = {call_double}  # the same ops in float64")
        shown.append(("float64", "exact"))
    indices = [f"[{i}]" for i in range(outputs)] if outputs > 1 else [""]
    for index in indices:
        entries = ", ".join(f'"{label}{index}": {name}{index}' for label, name in shown)
        lines.append(f"show({{{entries}}})")
    return lines


def _settings_lines(request: dict[str, Any], params: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Both configurations in one script: arm A's settings, f, arm B's settings, f again."""
    sides = [dict(tuple(k) for k in side) for side in request["knobs"]]
    touched = sorted({k for side in sides for k in side})
    lines = [f"default_{k} = {KNOB_CODE[k][0]}" for k in touched]
    shown = []
    for arm, knobs in zip(request["arms"], sides, strict=False):
        for k in touched:
            value = _knob_value(k, knobs[k]) if k in knobs else f"default_{k}"
            lines.append(KNOB_CODE[k][1].format(value))
        name = _identifier(arm)
        lines.append(f"{name} = f({params})")
        shown.append((arm, name))
    return lines, shown


def _runs_in_float64(definition: list[str], inputs: dict[str, Any], params: str) -> bool:
    """Does the script's f run on its inputs upcast to float64 and give float64 values?"""
    if not inputs or not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in inputs.values()):
        return False
    scope: dict[str, Any] = {"torch": torch}
    try:
        exec("\n".join(definition), scope)  # noqa: S102 - the function written above, from op names
        out = scope["f"](*(inputs[p].detach().cpu().double() for p in params.split(", ")))
    except Exception:  # noqa: BLE001 - no float64 line then
        return False
    outs = out if isinstance(out, tuple) else (out,)
    return all(isinstance(o, torch.Tensor) and o.dtype == torch.float64 for o in outs)


def _float64_line(graph: Any, name: str, names: dict[str, str], recorded: dict[str, Any], form: str) -> str | None:
    """The op's call in the script's own public `form` (which `_call` proved exact) with its
    tensor inputs in float64 and its result cast back, run once here on the recorded inputs;
    None for an op the script calls through torch.ops, or a line that does not run or does not
    give the op's dtype."""
    node = graph.nodes[name]
    expected_dtype = node.get("dtype")
    if not expected_dtype:
        return None
    doubled = {var: f"{var}.double()" for var in names.values()}
    args = [_arg(a, names, doubled) for a in node["args"]]
    kwargs = [f"{k}={_arg(v, names, doubled)}" for k, v in node["kwargs"]["dict"].items()]
    text = next((t for t, f in _public_forms(node["target"].split(".")[1], args, kwargs) if f == form), None)
    if text is None:
        return None
    line = f"{text}.to(torch.{expected_dtype})"
    env = {var: recorded[ref].detach().cpu().clone() for ref, var in names.items()
           if isinstance(recorded.get(ref), torch.Tensor)}
    try:
        got = eval(line, {"torch": torch, "device": torch.device("cpu")}, env)  # noqa: S307 - built from op names
    except Exception:  # noqa: BLE001 - a line that does not run is not shown
        return None
    return line if isinstance(got, torch.Tensor) and str(got.dtype) == f"torch.{expected_dtype}" else None


# -- calls ----------------------------------------------------------------------------------
def _call(graph: Any, name: str, names: dict[str, str], recorded: dict[str, Any], used: list[int],
          preferred: list[str] = ()) -> tuple[str, str]:
    node = graph.nodes[name]
    target = node["target"]
    op = graph.ops[name]
    args_text = [_arg(a, names) for a in node["args"]]
    kwargs_text = [f"{k}={_arg(v, names)}" for k, v in node["kwargs"]["dict"].items()]
    forms = _public_forms(target.split(".")[1], args_text, kwargs_text)
    # A form the script's backend names first: as spelled there, else by its last name (`F.softmax`).
    forms.sort(key=lambda f: (f[1] not in preferred, f[1].rsplit(".", 1)[-1] not in {p.rsplit(".", 1)[-1]
                                                                                    for p in preferred}))
    for text, form in forms:
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
    # Ops scripts reach under another name: `torch.softmax(x, dim=-1)` runs `aten._softmax`,
    # `a / b` `aten.div.Tensor`, `a @ b` `aten.mm` (a backend matching those sees no aten op).
    if packet in ("_softmax", "_log_softmax") and len(args) == 3 and args[2] == "False" and not kwargs:
        public = packet[1:]
        forms += [(f"torch.{public}({args[0]}, dim={args[1]})", f"torch.{public}"),
                  (f"torch.nn.functional.{public}({args[0]}, dim={args[1]})", f"torch.nn.functional.{public}")]
    if packet in BINARY_OPERATORS and len(args) == 2 and not kwargs:
        symbol, function = BINARY_OPERATORS[packet]
        forms.append((f"{args[0]} {symbol} {args[1]}", f"operator.{function}"))
    return forms


# Aten ops a Python operator runs, with the `operator` function dynamo's graphs hold for it.
BINARY_OPERATORS = {"div": ("/", "truediv"), "mm": ("@", "matmul"), "bmm": ("@", "matmul"), "mul": ("*", "mul"),
                    "add": ("+", "add"), "sub": ("-", "sub")}


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


def _arg(value: Any, names: dict[str, str], spelled: dict[str, str] | None = None) -> str:
    """`value` as Python source; `spelled` rewrites variable names (``x0`` -> ``x0.double()``)."""
    if isinstance(value, list):
        return "[" + ", ".join(_arg(v, names, spelled) for v in value) + "]"
    if isinstance(value, dict):
        if "node" in value:
            var = names[value["node"]]
            return (spelled or {}).get(var, var)
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
            return "{" + ", ".join(f"{k!r}: {_arg(v, names, spelled)}" for k, v in value["dict"].items()) + "}"
    return repr(value)


# -- literals -------------------------------------------------------------------------------
def _literal(t: torch.Tensor) -> str | None:
    t = t.detach().cpu()
    dtype = f"torch.{str(t.dtype).replace('torch.', '')}"
    if t.numel() <= LITERAL_ELEMENTS and not t.is_complex() and t.dtype != torch.complex32:
        values = t.double().tolist() if t.is_floating_point() else t.tolist()
        return f"torch.tensor({_nested(values, t.dtype)}, dtype={dtype})"
    if t.numel() * t.element_size() <= HEX_BYTES:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes().hex()
        shape = ", ".join(str(s) for s in t.shape)
        return (f'torch.frombuffer(bytearray.fromhex("{raw}"), dtype={dtype})'
                f".reshape({shape}{',' if t.dim() == 1 else ''})")
    return None


SCRIPT_WIDTH = 96  # a GitHub comment's code block shows about 100 characters without scrolling


def _wrapped(line: str, t: torch.Tensor) -> str:
    """A literal wider than the script's width, broken after its elements (1-D) or rows (2-D)."""
    if len(line) <= SCRIPT_WIDTH or not line.split(" = ", 1)[1].startswith("torch.tensor([") or t.dim() not in (1, 2):
        return line
    head, rest = line.split("([", 1)
    body, tail = rest.rsplit("]", 1)
    t = t.detach().cpu()
    values = t.double().tolist() if t.is_floating_point() else t.tolist()
    items = [_nested(v, t.dtype) for v in values]
    lines, current = [], "   "
    for item in items:
        piece = f" {item},"
        if t.dim() == 2 or len(current) + len(piece) > SCRIPT_WIDTH:
            if current.strip():
                lines.append(current)
            current = "   "
        current += piece
    lines.append(current)
    return "\n".join([f"{head}([", *lines, f"]{tail}"])


def _nested(value: Any, dtype: torch.dtype) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_nested(v, dtype) for v in value) + "]"
    if isinstance(value, float):
        return shortest_literal(value, dtype)
    return repr(value)


def shortest_literal(value: float, dtype: torch.dtype) -> str:
    """`triage.numerics.literals.literal` written as a float (``2.0``, not ``2``); a dtype it does not
    know (float8) keeps Python's repr of the value, which is exact too."""
    name = dtype_name(dtype)
    if name not in FLOATING:
        return literal(value, "float64")
    text = literal(value, name)
    return text if any(c in text for c in ".en") else text + ".0"
