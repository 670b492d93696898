"""Whether the exception that ended a script is the script's own check failing.

A reporter's script usually ends by checking the values it computed: ``assert``,
``torch.testing.assert_close``, ``numpy.testing.assert_allclose``, ``sys.exit(1)`` after a
comparison, or a ``raise`` in a helper of its own.  Such a failure is the script's *claim*
about those values, and the values are what triage compares; it is not a failure to run.
An error raised inside torch or the compiler (an op's RuntimeError, a shape error, an
InductorError) stays a crash, and so does a check that fails before the script observed
anything (``assert torch.cuda.is_available()`` at the top): that is about the machine, not
about values.  Neither is a ``raise`` inside a trace or profile hook the script installed
(the interpreter calls it, not the script's check), nor a ``KeyboardInterrupt`` or other
exception outside ``Exception`` that the script raises itself.

The numbers such a check read by name (`check_operands`) are kept too: ``assert abs(t - n) <
1e-5`` where ``n`` came from NumPy or plain Python is a comparison with a value triage never
recorded, and the parent weighs it against the recorded side's float64 replay.
"""
from __future__ import annotations

import ast
import dis
import math
import os
from collections.abc import Collection
from types import CodeType, FrameType, TracebackType
from typing import Any

import numpy as np

RAISE_OPCODE = dis.opmap["RAISE_VARARGS"]  # both `raise` and a failing `assert` end in it
TESTING_HELPERS = ("torch/testing/", "numpy/testing/")
# A failing check's operands kept for the parent: at most this many names, each at most this
# many elements (a 256×256 result; larger arrays are left out, not cut).
MAX_OPERANDS = 8
MAX_OPERAND_ELEMENTS = 1 << 16
# Floating values kept, by their exact type (a subclass of the script's may compute anything
# when read): Python floats and NumPy's float scalars and arrays.
FLOAT_SCALARS = (float, np.float16, np.float32, np.float64)
TRIAGE_WORKER = "triage/worker/"
EXIT_BUILTINS = "_sitebuiltins"  # exit() and quit() raise SystemExit from here (frozen or not)


def is_claim(e: BaseException, script: str, observed: bool, hooks: Collection[CodeType] = ()) -> bool:
    """True when `e` is the script's own check failing after it observed at least one value.
    `hooks`: the code of the trace and profile functions the script installed."""
    return observed and _chain_is_checks(e, script, hooks)


def claim_summary(e: BaseException, line: int | None) -> str:
    """What people read for a failed claim: the script's check, not triage, stopped the run."""
    where = f" at line {line}" if line is not None else ""
    if isinstance(e, SystemExit) and isinstance(e.code, int):
        how = f"it exited with status {e.code}"
    elif isinstance(e, SystemExit):
        how = f"it exited with the message {str(e.code)[:300]!r}"
    else:
        message = next((part.strip() for part in str(e).splitlines() if part.strip()), "")
        how = f"{type(e).__name__}: {message[:300]}" if message else type(e).__name__
    return f"the script's own check failed{where} ({how})"


def _chain_is_checks(e: BaseException, script: str, hooks: Collection[CodeType]) -> bool:
    """`e` and whatever it was raised from or while handling are all the script's checks:
    ``except RuntimeError: sys.exit(1)`` around a torch error is still a crash."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if not _raised_by_check(current, script, hooks):
            return False
        current = current.__cause__ or current.__context__
    return True


def _raised_by_check(e: BaseException, script: str, hooks: Collection[CodeType]) -> bool:
    if not isinstance(e, (Exception, SystemExit)):
        return False
    frames = [tb for tb in _walk(e.__traceback__) if TRIAGE_WORKER not in _filename(tb)]
    if not frames or any(tb.tb_frame.f_code in hooks for tb in frames):
        return False
    if isinstance(e, SystemExit):
        callers = [tb for tb in frames if EXIT_BUILTINS not in _filename(tb)]
        return e.code not in (None, 0) and bool(callers) and callers[-1].tb_frame.f_code.co_filename == script
    innermost = frames[-1]
    if isinstance(e, AssertionError) and any(part in _filename(innermost) for part in TESTING_HELPERS):
        return any(tb.tb_frame.f_code.co_filename == script for tb in frames)
    if innermost.tb_frame.f_code.co_filename != script:
        return False
    # Raised by a `raise` or `assert` statement itself, not by an expression evaluated on the
    # same line (`assert (a @ b).sum() > 0` where the matmul fails is a crash).
    code = innermost.tb_frame.f_code.co_code
    return 0 <= innermost.tb_lasti < len(code) and code[innermost.tb_lasti] == RAISE_OPCODE


def _walk(tb: TracebackType | None) -> list[TracebackType]:
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    return entries


def _filename(tb: TracebackType) -> str:
    return tb.tb_frame.f_code.co_filename.replace(os.sep, "/")


def check_operands(e: BaseException, script: str, source: str | bytes) -> list[dict[str, Any]]:
    """The floating-point numbers the script's failing check read by name, from the frame
    it failed in: the test of an ``assert`` (or of the ``if`` around a ``raise``), or the
    positional arguments of a testing helper's call (``np.testing.assert_allclose(t, n)``).
    Each as {name, dtype, shape, values}; values flattened, nonfinite ones as "nan", "inf",
    "-inf". Only values of the exact float types (`FLOAT_SCALARS`, ``np.ndarray``) are read,
    so nothing of the script's runs here; tensors are left out (the recording has them)."""
    frame, line = _check_frame(e, script)
    if frame is None or line is None:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[dict[str, Any]] = []
    for name in _names_read(tree, line):
        scope = frame.f_locals if name in frame.f_locals else frame.f_globals
        if name not in scope:
            continue
        kept = _floats(scope[name])
        if kept is not None:
            found.append({"name": name, **kept})
        if len(found) == MAX_OPERANDS:
            break
    return found


def _check_frame(e: BaseException, script: str) -> tuple[FrameType | None, int | None]:
    """The innermost frame of the script's own code in `e`'s traceback, and its line."""
    frame, line = None, None
    for tb in _walk(e.__traceback__):
        if tb.tb_frame.f_code.co_filename == script:
            frame, line = tb.tb_frame, tb.tb_lineno
    return frame, line


def _names_read(tree: ast.AST, line: int) -> list[str]:
    """The names the check at `line` compares, in source order, each once."""
    parts: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and node.lineno <= line <= (node.end_lineno or node.lineno):
            parts.append(node.test)
        elif isinstance(node, ast.If) and any(isinstance(stmt, ast.Raise) and stmt.lineno <= line
                                              <= (stmt.end_lineno or stmt.lineno) for stmt in node.body):
            parts.append(node.test)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            parts.extend(node.value.args)
    names = [n.id for part in parts for n in ast.walk(part) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(names))


def _floats(value: Any) -> dict[str, Any] | None:
    """{dtype, shape, values} of a Python or NumPy float value or float array; None for
    anything else, or an array over MAX_OPERAND_ELEMENTS."""
    if type(value) in FLOAT_SCALARS:
        array = np.asarray(value)
    elif type(value) is np.ndarray and value.dtype.kind == "f" and value.size <= MAX_OPERAND_ELEMENTS:
        array = value
    else:
        return None
    flat = array.astype(np.float64).reshape(-1).tolist()
    return {"dtype": "float64" if type(value) is float else str(array.dtype), "shape": list(array.shape),
            "values": [x if math.isfinite(x) else "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"
                       for x in flat]}
