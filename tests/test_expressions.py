"""REPL-style snippets: the AST rewrite that observes top-level expression statements."""
import ast
import textwrap
import traceback

import pytest
import torch

from triage.worker import expressions
from triage.worker.expressions import (
    EXPRESSION_HOOK,
    ExpressionObserver,
    compile_observing_expressions,
    wrap_expression_statements,
)


class StoreStub:
    """What the hook needs of an ObservationStore: add() and holds_current()."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str, torch.Tensor, int | None]] = []

    def add(self, kind: str, label: str, t: torch.Tensor, line: int | None = None) -> None:
        self.added.append((kind, label, t, line))

    def holds_current(self, t: torch.Tensor) -> bool:
        return any(t is seen for _, _, seen, _ in self.added)


def wrapped(source: str) -> list[tuple[int, str]]:
    """(line, label) of each statement the rewrite hands to the hook."""
    source = textwrap.dedent(source)
    tree = wrap_expression_statements(ast.parse(source), source)
    return sorted((node.value.args[2].value, node.value.args[1].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                  and isinstance(node.value.func, ast.Name) and node.value.func.id == EXPRESSION_HOOK)


def run(source: str, tmp_path, hook=None) -> dict:
    path = tmp_path / "snippet.py"
    path.write_text(textwrap.dedent(source))
    code = compile_observing_expressions(path.read_bytes(), str(path))
    namespace = {"__name__": "__main__", EXPRESSION_HOOK: hook or (lambda value, label, line: None)}
    exec(code, namespace)
    return namespace


def test_top_level_expressions_are_wrapped_with_their_source_and_line():
    assert wrapped("""\
        import torch
        x = torch.tensor([3.0, 4.0])
        x.norm()
        x
        y = x - 1
        torch.exp(x) - y
    """) == [(3, "`x.norm()`"), (4, "`x`"), (6, "`torch.exp(x) - y`")]


def test_constants_prints_inplace_calls_and_docstrings_are_left_alone():
    assert wrapped('''\
        """The module docstring."""
        import torch
        ...
        "a string on its own"
        42
        print(torch.ones(2))
        w = torch.ones(2)
        w.normal_()
        torch.nn.init.zeros_(w)
        w.__repr__()
    ''') == [(10, "`w.__repr__()`")]


def test_module_level_compound_bodies_are_wrapped_but_function_and_class_bodies_are_not():
    assert wrapped("""\
        import torch
        x = torch.ones(2)
        for i in range(2):
            x * i
        if x.sum() > 0:
            x + 1
        else:
            x - 1
        with torch.no_grad():
            x.exp()
        try:
            x.log()
        except RuntimeError:
            x.abs()
        finally:
            x.neg()
        while False:
            x.sin()
        def f(t):
            t.cos()
            return t
        class C:
            x.tan()
        f(x)
    """) == [(4, "`x * i`"), (6, "`x + 1`"), (8, "`x - 1`"), (10, "`x.exp()`"), (12, "`x.log()`"),
             (14, "`x.abs()`"), (16, "`x.neg()`"), (18, "`x.sin()`"), (24, "`f(x)`")]


def test_match_case_bodies_are_wrapped():
    assert wrapped("""\
        match 1:
            case 1:
                value
    """) == [(3, "`value`")]


def test_long_and_multiline_labels_are_collapsed_and_truncated():
    [(line, label)] = wrapped("""\
        torch.cat([first_tensor_with_a_long_name,
                   second_tensor_with_a_long_name, third_tensor_with_a_long_name])
    """)
    assert line == 1 and label.startswith("`torch.cat([first_tensor_with_a_long_name, second")
    assert label.endswith("…`") and len(label) == expressions.MAX_LABEL_CHARS + 2


def test_the_rewritten_script_behaves_as_before(tmp_path):
    seen = []
    namespace = run('''\
        """Docstring."""
        from __future__ import annotations
        import torch
        x = torch.tensor([3.0, 4.0])
        x.norm()
        def f(a: torch.Tensor) -> torch.Tensor:
            return a
        (x, 1, x + 1)
        f(x)
    ''', tmp_path, hook=lambda value, label, line: seen.append((label, line, value)))
    assert namespace["__doc__"] == "Docstring."
    assert namespace["f"].__annotations__ == {"a": "torch.Tensor", "return": "torch.Tensor"}  # __future__ still applies
    assert [(label, line) for label, line, _ in seen] == [("`x.norm()`", 5), ("`(x, 1, x + 1)`", 8), ("`f(x)`", 9)]
    assert float(seen[0][2]) == 5.0


def test_line_numbers_in_tracebacks_are_unchanged(tmp_path):
    with pytest.raises(ZeroDivisionError) as info:
        run("""\
            import torch
            torch.ones(2)

            1 / 0
        """, tmp_path)
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert frame.filename == str(tmp_path / "snippet.py") and frame.lineno == 4 and frame.line == "1 / 0"


def test_a_script_the_rewrite_cannot_handle_runs_untransformed(tmp_path, monkeypatch):
    def fail(tree, source):
        raise RecursionError("too deep")

    monkeypatch.setattr(expressions, "wrap_expression_statements", fail)
    path = tmp_path / "snippet.py"
    path.write_text("import torch\nx = torch.ones(2)\nx.sum()\n")
    namespace = {"__name__": "__main__"}  # no hook bound: the untransformed code never calls it
    exec(compile_observing_expressions(path.read_bytes(), str(path)), namespace)
    assert namespace["x"].sum() == 2


@pytest.mark.parametrize("source", [b"x = (\n", b"return 1\n", b"x = '\xff'\n"])
def test_an_uncompilable_script_fails_as_compile_itself_would(tmp_path, source):
    with pytest.raises(SyntaxError) as expected:
        compile(source, "snippet.py", "exec", dont_inherit=True)
    with pytest.raises(SyntaxError) as got:
        compile_observing_expressions(source, "snippet.py")
    assert (got.value.msg, got.value.lineno) == (expected.value.msg, expected.value.lineno)


def test_a_declared_encoding_gives_labels_in_that_encoding(tmp_path):
    seen = []
    path = tmp_path / "snippet.py"
    path.write_bytes("# -*- coding: latin-1 -*-\nnames = {'é': 1}\nnames['é']\n".encode("latin-1"))
    namespace = {EXPRESSION_HOOK: lambda value, label, line: seen.append(label)}
    exec(compile_observing_expressions(path.read_bytes(), str(path)), namespace)
    assert seen == ["`names['é']`"]


def test_the_hook_records_tensors_and_ignores_everything_else():
    store = StoreStub()
    hook = ExpressionObserver(store)
    x = torch.tensor([3.0, 4.0])
    hook(x.norm(), "`x.norm()`", 3)
    hook(None, "`print(x)`", 4)
    hook(1.5, "`x.sum().item()`", 5)
    hook(torch.nn.Linear(2, 2), "`model.eval()`", 6)
    hook((x + 1, "not a tensor", x - 1), "`(x + 1, 'a', x - 1)`", 7)
    hook(x.norm, "`x.norm`", 8)
    assert [(kind, label, line) for kind, label, _, line in store.added] == [
        ("readback", "`x.norm()`", 3), ("readback", "`(x + 1, 'a', x - 1)`[0]", 7),
        ("readback", "`(x + 1, 'a', x - 1)`[2]", 7)]
    assert float(store.added[0][2]) == 5.0


def test_the_hook_does_not_record_a_value_recorded_already():
    store = StoreStub()
    out = torch.ones(2)
    store.add("call", "Linear() call #1", out, 3)  # the module call recorded its output
    ExpressionObserver(store)(out, "`model(x)`", 3)
    assert len(store.added) == 1


def test_the_hook_never_raises():
    class Broken(StoreStub):
        def add(self, *args, **kwargs):
            raise RuntimeError("bookkeeping failed")

    ExpressionObserver(Broken())(torch.ones(2), "`x`", 1)


@pytest.mark.slow
def test_a_repl_snippet_shows_the_value_the_reporter_saw(triage, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text("import torch\nx = torch.tensor([3.0, 4.0])\nx.norm()\n")
    code, report, _, out = triage(script, "cpu", "--no-minimize")
    assert code == 0, out
    [norm] = [o for o in report["observables"] if o["label"] == "`x.norm()`"]
    assert norm["kind"] == "readback" and norm["line"] == 3
    assert norm["fingerprint"]["shape"] == [] and norm["fingerprint"]["sample"] == [5.0]
