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
import os
from collections.abc import Collection
from types import CodeType, FrameType, TracebackType
from typing import Any

import numpy as np

RAISE_OPCODE = dis.opmap["RAISE_VARARGS"]  # both `raise` and a failing `assert` end in it
TESTING_HELPERS = ("torch/testing/", "numpy/testing/")
# A failing check's operands kept for the parent: at most this many, each at most this many
# elements (a 2048×2048 result; larger arrays are left out, not cut), within the worker's
# value budget (OPERAND_BUDGET_SHARE of it, as float64).
MAX_OPERANDS = 8
MAX_OPERAND_ELEMENTS = 1 << 22
OPERAND_BUDGET_SHARE = 0.5
# Calls and methods whose arguments (receiver) are what a check compares, not one operand: a
# difference's magnitude, its largest element, a closeness test.
COMBINING_CALLS = {"abs", "fabs", "max", "min", "amax", "amin", "all", "any", "allclose", "isclose", "array_equal"}
# Calls that compare their first two arguments (`np.testing.assert_allclose(t, n)`).
TESTING_CALLS = {"assert_allclose", "assert_array_almost_equal", "assert_almost_equal", "assert_array_equal",
                 "assert_equal", "assert_close", "assertEqual", "assertAlmostEqual", "isclose", "allclose",
                 "array_equal"}
MAX_OPERAND_TEXT = 120
EXIT_CALLS = {"exit", "quit", "_exit"}  # `sys.exit(1)` in an `if` is a check, as a `raise` is
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


def check_operands(e: BaseException, script: str, source: str | bytes,
                   kept: dict[tuple[int, str], Any] | None = None, max_bytes: int = 1 << 62) -> list[dict[str, Any]]:
    """The floating-point numbers the script's failing check compared: the operands of a
    top-level check as the rewritten script kept them (`kept`, by check line and source text:
    worker/expressions.py), and the names the check reads, from the frame it failed in (the
    test of an ``assert`` or of the ``if`` around a ``raise``, or the positional arguments of
    a call such as ``np.testing.assert_allclose(t, n)``). Each as {name (the source text),
    dtype, shape, values: a float64 array}, together within `max_bytes`. Only values of the
    exact float types (`FLOAT_SCALARS`, ``np.ndarray``) are read, so nothing of the script's
    runs here; tensors are left out (the recording has them)."""
    frame, line = _check_frame(e, script)
    if frame is None or line is None:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    starts = {node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno)}
    found: list[dict[str, Any]] = []
    read = [(text, value) for (at, text), value in (kept or {}).items() if at in starts]
    for name in _names_read(tree, line):
        scope = frame.f_locals if name in frame.f_locals else frame.f_globals
        if name in scope:
            read.append((name, scope[name]))
    for name, value in read:
        held = _floats(value)
        if held is None or any(x["name"] == name for x in found) or held["values"].nbytes > max_bytes:
            continue
        max_bytes -= held["values"].nbytes
        found.append({"name": name, **held})
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


def check_parts(tree: ast.AST, line: int) -> list[tuple[str, ast.AST]]:
    """The parts of the script's check at `line`, in the tree's order: ("assert", its test)
    for an ``assert`` spanning the line; ("if", its test) for an ``if`` whose own body fails
    there (a ``raise``, ``sys.exit``, ``assert False``: the test names the failure, not what
    passes), ("else", its test) for one whose ``else`` fails there (the test names what
    passes); ("call", the call) for a call statement spanning it
    (``np.testing.assert_allclose(t, n)``). Of nested blocks, only the innermost ``if``: an
    outer one's test guards the check, it is not the check."""
    parts: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        spans = isinstance(node, ast.stmt) and _spans(node, line)
        if isinstance(node, ast.Assert) and spans:
            parts.append(("assert", node.test))
        elif isinstance(node, ast.If) and spans:
            for kind, block in (("if", node.body), ("else", node.orelse)):
                if any(_spans(s, line) and not isinstance(s, BLOCKS) for s in block):
                    parts.append((kind, node.test))
        elif isinstance(node, ast.Expr) and spans and isinstance(node.value, ast.Call):
            parts.append(("call", node.value))
    return parts


# Statements holding other statements: a check fails in a simple statement of an `if`'s own
# body, not in one of these inside it.
BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
          ast.AsyncFunctionDef, ast.ClassDef, ast.Match) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


def _spans(statement: ast.stmt, line: int) -> bool:
    return statement.lineno <= line <= (statement.end_lineno or statement.lineno)


def _names_read(tree: ast.AST, line: int) -> list[str]:
    """The names the check at `line` compares (`operands`), in source order, each once: a
    test's, or a call's first two arguments."""
    compared = [a for kind, part in check_parts(tree, line)
                for a in ([part] if kind != "call" else [a for a in part.args[:2] if not isinstance(a, ast.Starred)])]
    names = [n.id for part in compared for n in operands(part) if isinstance(n, ast.Name)]
    return list(dict.fromkeys(names))


def _floats(value: Any) -> dict[str, Any] | None:
    """{dtype, shape, values (float64)} of a Python or NumPy float value or float array, or of a
    list of Python numbers (`[math.floor(v + 0.5) for v in vals]`, compared with a tensor's
    `.tolist()`; nested lists of one length each, integers exact in float64); None for
    anything else, or an array over MAX_OPERAND_ELEMENTS."""
    if type(value) in FLOAT_SCALARS:
        array = np.asarray(value)
    elif type(value) is np.ndarray and value.dtype.kind == "f" and value.size <= MAX_OPERAND_ELEMENTS:
        array = value
    elif type(value) is list and (numbers := _plain_numbers(value)) is not None:
        array = numbers
    else:
        return None
    return {"dtype": "float64" if type(value) in (float, list) else str(array.dtype), "shape": list(array.shape),
            "values": np.array(array, dtype=np.float64)}


# Integers a float64 holds exactly: a list of larger ones is not read as numbers.
EXACT_INTEGERS = 2 ** 53


def _plain_numbers(value: list) -> np.ndarray | None:
    """A list (of lists) of exact Python ints and floats, regular in shape, as a float64 array;
    None for anything else. Every element's type is checked before any is read, so nothing of
    the script's (a subclass's `__float__`) runs."""
    stack, count = [value], 0
    while stack:
        item = stack.pop()
        if type(item) is list:
            count += len(item)
            if count > MAX_OPERAND_ELEMENTS:
                return None
            stack.extend(item)
        elif type(item) is int:
            if abs(item) > EXACT_INTEGERS:
                return None
        elif type(item) is not float:
            return None
    try:
        array = np.array(value, dtype=np.float64)
    except ValueError:  # ragged
        return None
    return array if array.size else None


def operands(e: ast.expr) -> list[ast.expr]:
    """The values `e` compares: the sides of a comparison or of arithmetic between them, down
    through magnitudes and closeness tests, each a name or a computed value (a call, an
    attribute, an index); constants are known."""
    if isinstance(e, ast.Compare):
        return [x for side in (e.left, *e.comparators) for x in operands(side)]
    if isinstance(e, ast.BoolOp):
        return [x for v in e.values for x in operands(v)]
    if isinstance(e, ast.UnaryOp):
        return operands(e.operand)
    if isinstance(e, ast.BinOp):
        return operands(e.left) + operands(e.right)
    if isinstance(e, ast.Call) and callee(e) in COMBINING_CALLS:
        inner = [a for a in e.args if not isinstance(a, ast.Starred)]
        if isinstance(e.func, ast.Attribute) and not isinstance(e.func.value, ast.Name):
            inner.insert(0, e.func.value)  # `(a - b).abs().max()`: the receiver
        return [x for a in inner for x in operands(a)]
    if isinstance(e, (ast.Name, ast.Call, ast.Attribute, ast.Subscript)):
        return [e]
    return []


def stops(statement: ast.stmt) -> bool:
    """A `raise`, or a call of `sys.exit` (`exit`, `quit`, `os._exit`): how an `if` fails a check."""
    return isinstance(statement, ast.Raise) or (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
                                                and callee(statement.value) in EXIT_CALLS)


def callee(call: ast.Call) -> str | None:
    """The called function's or method's own name."""
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def operand_text(source: str, node: ast.expr) -> str:
    """An operand as the source spells it, on one line (cut at MAX_OPERAND_TEXT)."""
    text = " ".join((ast.get_source_segment(source, node) or ast.unparse(node)).split())
    return text if len(text) <= MAX_OPERAND_TEXT else text[:MAX_OPERAND_TEXT - 1] + "…"


def equated_pairs(source: str, line: int) -> set[frozenset[str]]:
    """The pairs of operands (`operand_text`) the check at `line` expects to be equal or
    close: the two sides of ``==``/``!=``, the two arguments of a closeness test or a testing
    call, the two sides of a difference or a ratio (``abs(t - n) < 1e-5``) — not a measure and
    its bound (``err < tol``)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    pairs: set[frozenset[str]] = set()

    def pair(a: ast.expr, b: ast.expr) -> None:
        for x in operands(a):
            for y in operands(b):
                pairs.add(frozenset((operand_text(source, x), operand_text(source, y))))

    def walk(e: ast.AST) -> None:
        for node in ast.walk(e):
            if isinstance(node, ast.Compare):
                for left, op, right in zip((node.left, *node.comparators), node.ops, node.comparators, strict=False):
                    if isinstance(op, (ast.Eq, ast.NotEq)):
                        pair(left, right)
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Div)):
                pair(node.left, node.right)
            elif isinstance(node, ast.Call) and callee(node) in TESTING_CALLS and len(node.args) >= 2:
                pair(node.args[0], node.args[1])

    for _, part in check_parts(tree, line):
        walk(part)
    return pairs
