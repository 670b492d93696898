"""The script's own names for the values it compares (stage 3).

The worker labels a comparison's operands by the function (`torch.testing.assert_close
operand 1`); the script's source says what they are (`mine`, `F.layer_norm(x, (64,))`).  A
verdict that says "`mine` and `theirs` differ" tells the reporter which value is accused; one
that says "operand 1 and operand 2" does not.  Read from the script's syntax tree, never by
running anything.
"""
from __future__ import annotations

import ast
import functools

MAX_NAME = 40  # longer expressions make worse names than triage's own labels


@functools.lru_cache(maxsize=8)
def _tree(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def operand_names(source: str, line: int | None, func: str) -> tuple[str, str] | None:
    """The source text of the two values compared by the call to `func` (a dotted name such
    as `torch.testing.assert_close`, or `==` for an operator) at `line`; None where the line
    holds no such call, or several that disagree."""
    tree = _tree(source) if line is not None else None
    if tree is None:
        return None
    last = func.rsplit(".", 1)[-1]
    found: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) is None or not (node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        pair = None
        if isinstance(node, ast.Call) and _called_name(node.func) == last:
            args = list(node.args)
            if isinstance(node.func, ast.Attribute) and len(args) == 1 and _is_method_call(node.func, func):
                args = [node.func.value] + args  # a.allclose(b), a.equal(b)
            if len(args) >= 2:
                pair = (args[0], args[1])
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and len(node.comparators) == 1 \
                and _symbol(node.ops[0]) == func:
            pair = (node.left, node.comparators[0])
        if pair is not None:
            texts = tuple(ast.get_source_segment(source, x) or "" for x in pair)
            if all(texts) and all(len(t) <= MAX_NAME and "\n" not in t for t in texts):
                found.add(texts)  # type: ignore[arg-type]
    return found.pop() if len(found) == 1 else None


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _is_method_call(attr: ast.Attribute, func: str) -> bool:
    """`a.allclose(b)`: a method of the first operand, not `torch.allclose(a, b)`."""
    root = attr.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return not (isinstance(root, ast.Name) and root.id in {"torch", "np", "numpy", "F", "testing"})


def _symbol(op: ast.cmpop) -> str | None:
    return {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}.get(type(op))


METHOD_READBACKS = {".item()": "item", ".tolist()": "tolist", ".numpy()": "numpy"}
CALL_READBACKS = {"float()": "float", "int()": "int", "np.asarray()": "asarray", "print/repr": "print"}


def readback_name(source: str, line: int | None, label: str) -> str | None:
    """The expression whose value the readback labelled `label` (`.item()`, `print/repr`…)
    reads at `line`: the receiver of the one `.item()` call there, the one tensor argument
    of the one `print(...)`; None where the line is ambiguous."""
    tree = _tree(source) if line is not None else None
    if tree is None or (label not in METHOD_READBACKS and label not in CALL_READBACKS):
        return None
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or getattr(node, "lineno", None) != line:
            continue
        if label in METHOD_READBACKS and isinstance(node.func, ast.Attribute) \
                and node.func.attr == METHOD_READBACKS[label] and not node.args:
            found.add(ast.get_source_segment(source, node.func.value) or "")
        elif label in CALL_READBACKS and _called_name(node.func) == CALL_READBACKS[label]:
            values = [a for a in node.args if not (isinstance(a, ast.Constant) and isinstance(a.value, str))
                      and not isinstance(a, ast.JoinedStr)]
            if len(values) == 1:
                found.add(ast.get_source_segment(source, values[0]) or "")
            else:
                found.add("")  # several values printed at once: which one is this?
    name = found.pop() if len(found) == 1 else ""
    return name if name and len(name) <= MAX_NAME and "\n" not in name else None
