"""The layers the code relies on, held by reading its imports (issue 28 item 3): the worker,
inside the jail, imports no parent-side stage; triage/numerics is numpy-only, importable on
both sides; worker/protocol.py imports nothing; and the two scorings of the rounding
statistic T, one per side, agree."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from triage.judge.decide import deviation_stat as parent_stat
from triage.worker.rounding import deviation_stat as worker_stat

PACKAGE = Path(__file__).resolve().parent.parent / "triage"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function: `from triage import x`
    counts as `triage.x` (x may be a module)."""
    found = set()
    tree = ast.parse(path.read_text(), str(path))
    # Imports for type checkers only never run: they make no dependency.
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
                   for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            assert node.level == 0, f"{path}: a relative import (the checks below read absolute ones)"
            found.add(node.module)
            base = PACKAGE.parent.joinpath(*node.module.split("."))
            found |= {f"{node.module}.{a.name}" for a in node.names
                      if (base / f"{a.name}.py").exists() or (base / a.name).is_dir()}
    return found


MODULES = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


# What the worker may import of triage: itself, the shared numerics, the accuracy note's
# tables, and the confinement it applies to itself.
WORKER_MAY_IMPORT = ("triage.worker", "triage.numerics", "triage.policy", "triage.sandbox.confine")
# What the numerics may import of triage: each other, the dtype tables, the DivergenceKind record.
NUMERICS_MAY_IMPORT = ("triage.numerics", "triage.policy", "triage.model")


def test_the_module_walk_sees_the_imports_it_checks():
    assert "triage.numerics.errors" in MODULES["triage.worker.serve"]  # a function-local import
    assert "triage.policy" in MODULES["triage.worker.rounding"]  # `from triage import policy`
    assert "torch" in MODULES["triage.worker.rounding"]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _under(m, "triage.worker")))
def test_the_worker_imports_no_parent_side_stage(module):
    parent = sorted(i for i in MODULES[module] if _under(i, "triage") and i != "triage"
                    and not _under(i, *WORKER_MAY_IMPORT))
    assert parent == [], f"{module} imports {parent}: code inside the jail would import a parent-side stage"


def test_the_numerics_import_neither_torch_nor_a_stage_even_through_what_they_import():
    seen, todo = set(), [m for m in MODULES if _under(m, "triage.numerics")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        imports = MODULES[module]
        assert not any(_under(i, "torch") for i in imports), f"{module} imports torch"
        inside = [i for i in imports if _under(i, "triage") and i != "triage"]
        assert all(_under(i, *NUMERICS_MAY_IMPORT) for i in inside), f"{module} imports {inside}"
        todo += [i for i in inside if i in MODULES]
    assert {"triage.numerics.errors", "triage.numerics.literals", "triage.model", "triage.policy"} <= seen


def test_the_protocol_imports_nothing():
    """The fork server imports it before anything else, the worker before torch."""
    assert MODULES["triage.worker.protocol"] == set()


# -- the statistic T, scored on each side ---------------------------------------------------
def _cases():
    rng = np.random.default_rng(28)
    for _ in range(40):
        n = int(rng.integers(1, 50))
        ref = rng.normal(size=n) * 10.0 ** rng.integers(-6, 6)
        sigma = np.abs(rng.normal(size=n)) * 10.0 ** rng.integers(-9, 0)
        value = ref + rng.normal(size=n) * sigma * rng.uniform(0, 8)
        yield value, ref, sigma
    ref = np.array([1.0, 2.0, 0.0, -3.0, 5.0])
    yield np.array([1.0, 2.5, 0.0, -3.0, 5.0]), ref, np.array([0.1, 0.0, 0.0, 0.0, 1.0])  # σ 0, value off: inf
    yield ref.copy(), ref, np.zeros(5)  # σ 0 everywhere, the value exact: 0
    yield np.array([np.inf, 2.1, np.nan, -3.0, 5.0]), ref, np.full(5, 0.1)  # nonfinite values are left out
    yield np.array([1.0, 2.1, 0.5, -3.0, 5.0]), np.array([np.nan, 2.0, -np.inf, -3.0, 5.0]), np.full(5, 0.1)
    yield np.full(3, np.nan), np.ones(3), np.ones(3)  # nothing finite in both: 0
    yield np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-12]), np.array([np.inf, 1e-13])  # an infinite σ


@pytest.mark.parametrize("value, ref, sigma", list(_cases()))
def test_the_parent_scores_a_value_as_the_worker_scores_its_samples(value, ref, sigma):
    """The Monte Carlo p-value compares the parent's T of the arm's value (judge/decide.py,
    numpy) with the worker's T of each sample (worker/rounding.py, torch): one statistic."""
    expected = worker_stat(torch.from_numpy(value), torch.from_numpy(ref), torch.from_numpy(sigma))
    got, _ = parent_stat(value, ref, sigma)
    assert got == expected or (np.isnan(got) and np.isnan(expected))


def _module_graph() -> dict[str, set[str]]:
    """Module -> the triage modules it imports (a package counts as its __init__)."""
    return {m: {i for i in imports if i in MODULES and i != m} for m, imports in MODULES.items()}


def test_no_module_imports_itself_through_others():
    graph = _module_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for nxt in sorted(graph[module]):
            # A package's __init__ importing its own submodules is how a package presents itself.
            if _under(nxt, module):
                continue
            assert state.get(nxt) != 1, "import cycle: " + " -> ".join(path[path.index(nxt):] + [nxt]) \
                if nxt in path else f"import cycle through {nxt}"
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


# The stages in the order their imports may run (triage/__init__.py's map): a stage may import
# an earlier one, never a later one. The judge is the service compare, the reported arm and
# classify call; the audit is the check classify runs on its own verdict.
STAGES = ["triage.extract", "triage.arms", "triage.judge", "triage.compare", "triage.reported",
          "triage.ablate", "triage.minimize", "triage.audit", "triage.classify", "triage.report", "triage.github"]
# Siblings that run side by side: neither imports the other.
SIBLINGS = [("triage.ablate", "triage.minimize")]


@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_imports_a_later_stage(stage):
    later = STAGES[STAGES.index(stage) + 1:]
    for module in (m for m in MODULES if _under(m, stage)):
        against = sorted(i for i in MODULES[module] if _under(i, *later))
        assert against == [], f"{module} imports {against}, a later stage of the pipeline"


@pytest.mark.parametrize("a,b", SIBLINGS)
def test_side_by_side_stages_do_not_import_each_other(a, b):
    for x, y in ((a, b), (b, a)):
        assert not any(_under(i, y) for m in MODULES if _under(m, x) for i in MODULES[m]), f"{x} imports {y}"


def _top_level_entries() -> list[str]:
    return sorted([p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
                  + [p.name + "/" for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()])


def test_the_package_map_and_the_readme_design_map_name_every_module_and_package():
    """`ls triage/` reads as the pipeline only while the maps that explain it are true."""
    import triage

    readme = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    design = readme[readme.index("## Design"):]
    design = design[:design.index("```", design.index("```") + 3)]
    entries = _top_level_entries()
    assert "arms/" in entries and "report/" in entries and "classify/" in entries
    assert [e for e in entries if e not in triage.__doc__] == []
    assert [e for e in entries if e not in design] == []
