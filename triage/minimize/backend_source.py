"""The script's own compile backend, cut out of its source for the minimizer.

A script that passes its own function to `torch.compile(..., backend=fn)` (a lowering pass,
a precision cast, a vendor plugin) makes the divergence a property of `fn`: replayed under
inductor, the candidate op sets show nothing.  The minimizer's compile worker and the minimal
repro therefore need `fn` itself — not the whole script, which would re-run the report.  This
module takes from the script's syntax tree the definitions `fn` needs: every top-level import,
`fn`'s own definition, and, transitively, the top-level functions, classes and assignments
its body names.  The text is run only inside the jailed worker and the verification arms,
like the script itself.
"""
from __future__ import annotations

import ast

MAX_DEFINITIONS_BYTES = 256 * 1024


def backend_definitions(source: str, name: str) -> str | None:
    """Source text defining `name` and what it needs (None where the script does not define
    it at top level, or the text would be too large)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    defined: dict[str, ast.stmt] = {}
    for stmt in tree.body:
        for target in _names_defined(stmt):
            defined.setdefault(target, stmt)
    if name not in defined or not isinstance(defined[name], (ast.FunctionDef, ast.ClassDef)):
        return None
    needed: list[ast.stmt] = []
    pending = [name]
    while pending:
        stmt = defined.get(pending.pop())
        if stmt is None or stmt in needed:
            continue
        needed.append(stmt)
        pending.extend(n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id in defined)
    imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    kept = sorted(set(imports) | set(needed), key=lambda s: s.lineno)
    lines = source.splitlines()
    text = "\n".join("\n".join(lines[_first_line(s) - 1:s.end_lineno]) for s in kept) + "\n"
    return text if len(text.encode()) <= MAX_DEFINITIONS_BYTES else None


def _names_defined(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [stmt.target.id]
    return []


def _first_line(stmt: ast.stmt) -> int:
    """Where the statement starts, its decorators included."""
    return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])


def torch_level_targets(definitions: str) -> list[str]:
    """The functions a backend picks graph nodes by, where they are torch-level callables
    (`node.target is F.gelu`, `n.target in (torch.log1p, operator.add)`), as the script
    spells them. Dynamo hands a backend such targets; the minimizer's candidates are graphs
    of aten ops (`aten.gelu.default`), where a test for them matches nothing. Tests through
    `torch.ops` (or an alias of it named `aten`/`ops`) are aten-level and not listed."""
    try:
        tree = ast.parse(definitions)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        if not any(isinstance(o, ast.Attribute) and o.attr == "target" for o in operands):
            continue
        for o in operands:
            for item in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o]):
                spelled = _dotted(item)
                if spelled and not spelled.endswith(".target") and not _aten_level(spelled) and spelled not in found:
                    found.append(spelled)
    return found


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` for a chain of attributes of a name, else None (a call, a constant, a subscript)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _aten_level(spelled: str) -> bool:
    parts = spelled.split(".")
    return "ops" in parts or parts[0] in ("aten", "prims")
