"""REPL-style snippets: observe the value of every top-level expression statement; and keep
the operands of the script's own top-level checks.

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

A check's operands are what an ``assert`` (or the test of an ``if`` whose body raises, or a
testing call such as ``np.testing.assert_allclose``) compares: ``assert x.sum().item() ==
sum(x.tolist())`` keeps both sides' values, ``abs(a.var().item() - np.var(b)) < 1e-5`` the
two inside the difference. A failing check's floats (worker/claims.py) let the parent weigh
a value computed outside torch against the recorded one. Module level only, as for
expressions: a check inside a function may run under ``torch.compile``, where a call of the
hook would change the graph.

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

import numpy as np
import torch

from triage.worker.claims import FLOAT_SCALARS, TESTING_CALLS, callee, operand_text, operands, stops
from triage.worker.observe import MAX_TENSORS_PER_CALL, ObservationStore

# The name the hook is bound to in the script's namespace: not one a script would use.
EXPRESSION_HOOK = "__triage_observe_expression_statement__"
MAX_LABEL_CHARS = 60
DISPLAY_CALLS = {"print", "display", "pprint"}  # they show their argument and return None
COMPOUND_BODIES = ("body", "orelse", "finalbody")
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # the REPL displays nothing inside them


# The name the check-operand hook is bound to in the script's namespace (`CheckOperands`).
CHECK_HOOK = "__triage_check_operand__"


def compile_observing_expressions(source: bytes, filename: str) -> CodeType:
    """The script's code with its top-level expression statements observed and its top-level
    checks' operands kept; the code of the untransformed source when the tree cannot be
    rewritten."""
    try:
        tree = ast.parse(source, filename)
        text = importlib.util.decode_source(source)
        wrap_check_operands(tree, text)
        wrap_expression_statements(tree, text)
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


def wrap_check_operands(tree: ast.Module, source: str) -> ast.Module:
    """Rewrite `tree` in place: each operand `e` of a top-level check (`check_operands`)
    becomes `CHECK_HOOK(e, line, text)`, line the check statement's first line."""
    for statement, parts in _checks(tree.body):
        wrap = _Wrap({id(operand) for part in parts for operand in operands(part) if not isinstance(operand, ast.Name)},
                     statement.lineno, source)
        if isinstance(statement, (ast.Assert, ast.If)):
            statement.test = wrap.visit(statement.test)
        else:
            statement.value = wrap.visit(statement.value)
    return ast.fix_missing_locations(tree)


class CheckOperands:
    """The hook: the last value each check operand took, by (check line, source text), where
    it is a float, a NumPy array or a list (`t.tolist()`: worker/claims.py reads it only where
    the check fails, and only a list of plain numbers; a tensor, the recording has, is not
    held on to)."""

    def __init__(self) -> None:
        self.values: dict[tuple[int, str], Any] = {}

    def __call__(self, value: Any, line: int, text: str) -> Any:
        if type(value) in FLOAT_SCALARS or type(value) in (np.ndarray, list):
            self.values[(line, text)] = value
        return value


def _checks(body: list[ast.stmt]) -> list[tuple[ast.stmt, list[ast.expr]]]:
    """Top-level checks and the expressions whose operands they compare."""
    found: list[tuple[ast.stmt, list[ast.expr]]] = []
    for statement in body:
        if isinstance(statement, SCOPES):
            continue
        if isinstance(statement, ast.Assert):
            found.append((statement, [statement.test]))
        elif isinstance(statement, ast.If) and any(stops(s) for s in statement.body):
            found.append((statement, [statement.test]))
        elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call) \
                and callee(statement.value) in TESTING_CALLS:
            found.append((statement, [a for a in statement.value.args[:2] if not isinstance(a, ast.Starred)]))
        for field in COMPOUND_BODIES:
            found.extend(_checks(getattr(statement, field, None) or []))
        for handler in getattr(statement, "handlers", None) or []:
            found.extend(_checks(handler.body))
    return found


class _Wrap(ast.NodeTransformer):
    """Each of `targets` (by identity) becomes `CHECK_HOOK(e, line, text)`."""

    def __init__(self, targets: set[int], line: int, source: str) -> None:
        self.targets, self.line, self.source = targets, line, source

    def visit(self, node: ast.AST) -> ast.AST:
        if id(node) not in self.targets:
            return self.generic_visit(node)
        text = operand_text(self.source, node)
        hook = ast.copy_location(ast.Name(id=CHECK_HOOK, ctx=ast.Load()), node)
        return ast.copy_location(ast.Call(func=hook, args=[node, ast.copy_location(ast.Constant(self.line), node),
                                                           ast.copy_location(ast.Constant(text), node)],
                                          keywords=[]), node)


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
