"""REPL-style snippets: observe the value of every top-level expression statement.

Bug reports are often pasted interactive input — ``x.norm()``, ``torch.exp(x)``, ``y - z``
on lines of their own — and what the reporter compares is what the REPL *displayed* for
those lines.  Run as a script, the same lines compute the value and drop it, so nothing
would be observed.  This module rewrites the script's syntax tree so that each such
statement's value is handed to a hook that records its tensors as readbacks, as if printed.

Which statements: the ones Python's interactive mode displays — expression statements at
module level, including those nested in module-level ``if``/``for``/``while``/``with``/
``try``/``match`` bodies, but not inside function or class bodies.  Left alone: docstrings
and other constants (``...``, strings), ``await``/``yield``, calls that display their own
argument (``print``), and in-place calls (``w.normal_()``, run for their effect on a tensor
that is observed wherever the script reads it).

The rewrite only wraps an expression's value in a call: statements, line numbers, column
offsets, ``from __future__`` imports and docstrings are unchanged, and the tree is compiled
with the script's own filename, so tracebacks and the script's behaviour are the same.  A
script whose tree cannot be rewritten runs untransformed.
"""
from __future__ import annotations

import ast
import importlib.util
from types import CodeType
from typing import Any

import torch

from triage.worker.observe import MAX_TENSORS_PER_CALL, ObservationStore

# The name the hook is bound to in the script's namespace: not one a script would use.
EXPRESSION_HOOK = "__triage_observe_expression_statement__"
MAX_LABEL_CHARS = 60
DISPLAY_CALLS = {"print", "display", "pprint"}  # they show their argument and return None
COMPOUND_BODIES = ("body", "orelse", "finalbody")
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # the REPL displays nothing inside them


def compile_observing_expressions(source: bytes, filename: str) -> CodeType:
    """The script's code with its top-level expression statements observed; the code of the
    untransformed source when the tree cannot be rewritten."""
    try:
        tree = ast.parse(source, filename)
        wrap_expression_statements(tree, importlib.util.decode_source(source))
        return compile(tree, filename, "exec", dont_inherit=True)
    except Exception:  # noqa: BLE001 - an odd script runs as it is, with nothing extra observed
        return compile(source, filename, "exec", dont_inherit=True)


def wrap_expression_statements(tree: ast.Module, source: str) -> ast.Module:
    """Rewrite `tree` in place: each displayed expression statement `e` becomes
    `EXPRESSION_HOOK(e, label, line)`."""
    for statement in _displayed_statements(tree.body):
        value = statement.value
        hook = ast.copy_location(ast.Name(id=EXPRESSION_HOOK, ctx=ast.Load()), value)
        label = ast.copy_location(ast.Constant(_label(source, value)), value)
        line = ast.copy_location(ast.Constant(value.lineno), value)
        statement.value = ast.copy_location(ast.Call(func=hook, args=[value, label, line], keywords=[]), value)
    return ast.fix_missing_locations(tree)


class ExpressionObserver:
    """The hook: records the tensors of an expression statement's value (a tensor, or a
    tuple or list of tensors) as readbacks; anything else is left alone."""

    def __init__(self, store: ObservationStore) -> None:
        self.store = store

    def __call__(self, value: Any, label: str, line: int) -> None:
        try:
            if isinstance(value, torch.Tensor):
                self._record(label, value, line)
            elif isinstance(value, (tuple, list)):
                tensors = [(i, v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
                for i, t in tensors[:MAX_TENSORS_PER_CALL]:
                    self._record(f"{label}[{i}]", t, line)
        except Exception:  # noqa: BLE001 - observing must never change what the script does
            return

    def _record(self, label: str, t: torch.Tensor, line: int) -> None:
        # A module call's or compiled call's output is recorded as that call already.
        if not self.store.holds_current(t):
            self.store.add("readback", label, t, line)


def _displayed_statements(body: list[ast.stmt]) -> list[ast.Expr]:
    found: list[ast.Expr] = []
    for statement in body:
        if isinstance(statement, SCOPES):
            continue
        if isinstance(statement, ast.Expr):
            if _displayed(statement.value):
                found.append(statement)
            continue
        for field in COMPOUND_BODIES:
            found.extend(_displayed_statements(getattr(statement, field, None) or []))
        for handler in getattr(statement, "handlers", None) or []:
            found.extend(_displayed_statements(handler.body))
        for case in getattr(statement, "cases", None) or []:
            found.extend(_displayed_statements(case.body))
    return found


def _displayed(value: ast.expr) -> bool:
    if isinstance(value, (ast.Constant, ast.Await, ast.Yield, ast.YieldFrom)):
        return False
    if isinstance(value, ast.Call):
        name = value.func.id if isinstance(value.func, ast.Name) else (
            value.func.attr if isinstance(value.func, ast.Attribute) else None)
        if name in DISPLAY_CALLS:
            return False
        if name is not None and name.endswith("_") and not name.endswith("__"):
            return False
    return True


def _label(source: str, value: ast.expr) -> str:
    text = ast.get_source_segment(source, value) or ast.unparse(value)
    text = " ".join(text.split())
    if len(text) > MAX_LABEL_CHARS:
        text = text[:MAX_LABEL_CHARS - 1] + "…"
    return f"`{text}`"
