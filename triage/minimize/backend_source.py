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
