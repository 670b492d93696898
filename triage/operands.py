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
import re

from triage.worker.protocol import CHECKED_OPERAND, DIFFERENCE_CLAIMS

MAX_NAME = 40  # longer expressions make worse names than triage's own labels
MAX_SPAN = 20  # lines a call may span and still name the values compared on one of them
MAX_NODES_PER_LINE = 200


@functools.lru_cache(maxsize=8)
def _by_line(source: str) -> dict[int, list[ast.AST]] | None:
    """The script's calls, comparisons and subtractions by each line they span, parsed once: a
    script may be thousands of lines with thousands of observed values."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    index: dict[int, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Call, ast.Compare)) or isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            for line in range(node.lineno, min(node.end_lineno or node.lineno, node.lineno + MAX_SPAN) + 1):
                index.setdefault(line, []).append(node)
    return index


def operand_names(source: str, line: int | None, func: str) -> tuple[str, str] | None:
    """The source text of the two values compared by the call to `func` (a dotted name such
    as `torch.testing.assert_close`, `==` for an operator, or the two sides of the line's one
    subtraction for an error measure) at `line`; None where the line holds no such call, or
    several that disagree."""
    index = _by_line(source) if line is not None else None
    if index is None:
        return None
    last = func.rsplit(".", 1)[-1]
    found: set[tuple[str, str]] = set()
    for node in index.get(line, [])[:MAX_NODES_PER_LINE]:
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
        elif func in DIFFERENCE_CLAIMS and isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            pair = (node.left, node.right)  # `(a - b).abs().max()`: the script's error measure of a and b
        elif func in DIFFERENCE_CLAIMS and isinstance(node, ast.Call) and _called_name(node.func) == "sub" \
                and len(node.args) == 2:
            pair = (node.args[0], node.args[1])
        if pair is not None:
            texts = tuple(_segment(source, x) for x in pair)
            if all(texts) and all(len(t) <= MAX_NAME and "\n" not in t for t in texts):
                found.add(texts)  # type: ignore[arg-type]
    return found.pop() if len(found) == 1 else None



def checked_operand(label: str) -> tuple[str, int] | None:
    """(comparison symbol, 0-based operand) of a readback the worker labels as an operand of
    an elementwise comparison the script checks (`(pred32 != pred16).sum().item()`:
    "`!=` operand 2 in a check"); None for any other label."""
    m = re.fullmatch(rf"`(.+?)` operand(?: (\d))?{re.escape(CHECKED_OPERAND)}", label)
    return (m.group(1), int(m.group(2) or 1) - 1) if m else None

@functools.lru_cache(maxsize=8)
def _lines(source: str) -> list[bytes]:
    return [line.encode() for line in source.splitlines()]


def _segment(source: str, node: ast.AST) -> str:
    """The node's source text on one line ('' across lines): `ast.get_source_segment` splits
    the whole source on every call, which a long script with many values cannot afford."""
    lines = _lines(source)
    if node.lineno != node.end_lineno or not 0 < node.lineno <= len(lines):
        return ""
    return lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode(errors="replace")


# Checks of torch's own that compare two values they compute themselves with `torch.allclose`:
# what those two values are, in the order the check passes them.
LIBRARY_CHECKS = {"gradcheck": ("analytical Jacobian", "finite-difference Jacobian"),
                  "gradgradcheck": ("analytical second derivatives", "finite-difference second derivatives")}


def library_check_operands(source: str, line: int | None, func: str) -> tuple[str, tuple[str, str]] | None:
    """The check of torch's own the script's `line` calls (`torch.autograd.gradcheck`), where
    the comparison recorded is its `torch.allclose`, and the two values it compares: the
    analytical Jacobian against central differences, not "torch.allclose operand 1 and 2"."""
    index = _by_line(source) if line is not None else None
    if index is None or func.rsplit(".", 1)[-1] != "allclose":
        return None
    checks = {_called_name(node.func) for node in index.get(line, [])[:MAX_NODES_PER_LINE]
              if isinstance(node, ast.Call)} & set(LIBRARY_CHECKS)
    if len(checks) != 1:
        return None
    check = checks.pop()
    return check, tuple(f"`{check}`'s {what}" for what in LIBRARY_CHECKS[check])  # type: ignore[return-value]


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


# Python's comparison operators, as a verdict names the script's comparison.
COMPARISON_SYMBOLS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def compared_expressions(source: str, line: int | None) -> list[tuple[str, str, str]]:
    """(left, right, operator) of each one-operator comparison starting on `line`, as the
    script spells its two sides (`e32.item() == e64.item()`): two Python numbers compared,
    which no tensor op shows the worker."""
    index = _by_line(source) if line is not None else None
    found = []
    for node in (index or {}).get(line, [])[:MAX_NODES_PER_LINE]:
        if isinstance(node, ast.Compare) and node.lineno == line and len(node.ops) == 1 \
                and type(node.ops[0]) in COMPARISON_SYMBOLS:
            left, right = _segment(source, node.left), _segment(source, node.comparators[0])
            if left and right:
                found.append((left, right, COMPARISON_SYMBOLS[type(node.ops[0])]))
    return found


def spelled_on_line(source: str, line: int | None, expression: str | None) -> str | None:
    """`expression` (a worker's word for a readback's call) where line `line` of the script
    spells it so, short and on one line, with nothing that would end a code span; else None."""
    if not expression or line is None or len(expression) > MAX_NAME or "`" in expression \
            or not expression.isprintable():
        return None
    lines = source.splitlines()
    return expression if 0 < line <= len(lines) and expression in lines[line - 1] else None


def as_receiver(expression: str) -> str:
    """`expression` as the receiver of a method call: parenthesized where it is an operation
    (`(a / n).item()`, not `a / n.item()`)."""
    try:
        node = ast.parse(expression, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return expression
    atoms = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple)
    return expression if isinstance(node, atoms) and not expression.startswith("-") else f"({expression})"

@functools.lru_cache(maxsize=8)
def _assignments(source: str) -> dict[int, ast.Assign]:
    """The script's one-line assignments to one plain name, by line."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    return {node.lineno: node for node in ast.walk(tree) if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.end_lineno == node.lineno}


def assigned_readback(source: str, line: int | None, label: str) -> str | None:
    """The name line `line` assigns the readback labelled `label` to, where the line is
    `name = <that readback>` (`acc32 = (pred == y).float().mean().item()`): the script's own
    name for the value, where the expression read back is too long to be one."""
    node = _assignments(source).get(line) if line is not None else None
    call = node.value if node is not None else None
    if not isinstance(call, ast.Call):
        return None
    if label in METHOD_READBACKS and isinstance(call.func, ast.Attribute) \
            and call.func.attr == METHOD_READBACKS[label] and not call.args \
            or label in CALL_READBACKS and label != "print/repr" and _called_name(call.func) == CALL_READBACKS[label]:
        return node.targets[0].id
    return None

def readback_name(source: str, line: int | None, label: str) -> str | None:
    """The expression whose value the readback labelled `label` (`.item()`, `print/repr`…)
    reads at `line`: the receiver of the one `.item()` call there, the one tensor argument
    of the one `print(...)`; None where the line is ambiguous."""
    index = _by_line(source) if line is not None else None
    if index is None or (label not in METHOD_READBACKS and label not in CALL_READBACKS):
        return None
    found = set()
    for node in index.get(line, [])[:MAX_NODES_PER_LINE]:
        if not isinstance(node, ast.Call) or node.lineno != line:
            continue
        if label in METHOD_READBACKS and isinstance(node.func, ast.Attribute) \
                and node.func.attr == METHOD_READBACKS[label] and not node.args:
            found.add(_segment(source, node.func.value))
        elif label in CALL_READBACKS and _called_name(node.func) == CALL_READBACKS[label]:
            values = [a for a in node.args if not isinstance(a, (ast.Constant, ast.JoinedStr))]
            # A name another argument indexes with is an index, not the tensor printed:
            # `print("sample", i, "logits:", logits[i])`.
            indices = {n.id for a in values for sub in ast.walk(a) if isinstance(sub, ast.Subscript)
                       for n in ast.walk(sub.slice) if isinstance(n, ast.Name)}
            values = [a for a in values if not (isinstance(a, ast.Name) and a.id in indices)]
            if len(values) == 1:
                found.add(_segment(source, values[0]))
            else:
                found.add("")  # several values printed at once: which one is this?
    name = found.pop() if len(found) == 1 else ""
    return name if name and len(name) <= MAX_NAME and "\n" not in name else None
