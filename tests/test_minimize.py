"""The minimizer: graph planning, reduction passes, divergence kinds (fast), and end to end
on real arms: the compiled acosh and the faulted slogdet reduce to one op, verified (slow)."""
import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import FIXTURES

from triage.arms.graph import OpGraph
from triage.minimize import passes
from triage.model import DivergenceKind
from triage.numerics.errors import divergence_kind


def _chain(tmp_path, n, extra=()):
    """leaf0 -> op0 -> op1 -> ... -> op{n-1}; `extra` adds (name, reads) side ops."""
    nodes = [{"name": "leaf0", "op": "leaf", "kind": "input", "dtype": "float32", "line": 1}]
    prev = "leaf0"
    for i in range(n):
        nodes.append({"name": f"op{i}", "op": "call", "target": "aten.sin.default", "dtype": "float32",
                      "args": [{"node": prev}], "kwargs": {"dict": {}}, "line": i + 2})
        prev = f"op{i}"
    for name, reads in extra:
        nodes.append({"name": name, "op": "call", "target": "aten.add.Tensor", "dtype": "float32",
                      "args": [{"node": r} for r in reads], "kwargs": {"dict": {}}, "line": 99})
    (tmp_path / "graph.json").write_text(json.dumps({"format": "triage.opgraph/1", "nodes": nodes}))
    return OpGraph(tmp_path)


class PlantedProblem:
    """A stand-in for `ReductionProblem`: the arms diverge iff the planted op runs on a sink path."""

    def __init__(self, graph, planted, target=DivergenceKind("mismatch")):
        self.graph, self.planted, self.target, self.merge, self.queries = graph, planted, target, {}, 0
        self.cache = {}

    def plan(self, ops, outputs=None):
        return self.graph.plan(ops, outputs=outputs, merge=self.merge)

    def diverging_outputs(self, ops):
        plan = self.plan(ops)
        return [o for o in plan.outputs if self.planted in self.graph.cone(o) and self.planted in ops]

    def diverges(self, ops):
        key = self.plan(ops).key
        if key not in self.cache:
            self.queries += 1
            self.cache[key] = bool(ops) and bool(self.diverging_outputs(ops))
        return self.cache[key]


def test_plan_inputs_outputs_and_cone(tmp_path):
    g = _chain(tmp_path, 5, extra=[("side", ["op1", "leaf0"])])
    plan = g.plan(frozenset({"op2", "op3"}))
    assert plan.nodes == ["op2", "op3"]
    assert plan.inputs == ["op1"]  # a recorded intermediate becomes an input
    assert plan.outputs == ["op3"]
    assert g.cone("op3") == frozenset({"op0", "op1", "op2", "op3"})
    assert g.cone("leaf0") == frozenset()
    assert g.plan(frozenset({"side", "op1"})).outputs == ["side"]
    assert g.plan(frozenset({"op2"})).key != g.plan(frozenset({"op3"})).key


@pytest.mark.parametrize("n,planted", [(50, 17), (500, 3), (2500, 2400)])
def test_passes_reach_the_planted_op(tmp_path, n, planted):
    g = _chain(tmp_path, n)
    p = PlantedProblem(g, f"op{planted}")
    cone = g.cone(f"op{n - 1}")
    assert p.diverges(cone)
    result = passes.reduce(p, cone)
    assert result == frozenset({f"op{planted}"})
    assert p.queries < 4 * (n.bit_length() + 4), p.queries


def test_ddmin_and_one_minimal_find_a_pair(tmp_path):
    g = _chain(tmp_path, 30)

    class NeedsTwo(PlantedProblem):
        def diverges(self, ops):
            return {"op5", "op20"} <= set(ops)

    p = NeedsTwo(g, "op5")
    assert passes.one_minimal(p, passes.ddmin(p, g.cone("op29"))) == frozenset({"op5", "op20"})


def test_reliability_counts_runs():
    class Flaky:
        target = DivergenceKind("mismatch")
        cache = {}
        calls = 0

        def plan(self, ops):
            class P:
                key = "k"
            return P()

        def cache_key(self, plan):
            return plan.key

        def run(self, plan):
            Flaky.calls += 1
            return passes.Outcome({"o": self.target if Flaky.calls % 2 else None})

    hits, outcomes = passes.reliability(Flaky(), frozenset({"x"}), runs=4)
    assert (hits, len(outcomes)) == (2, 4)


def test_divergence_kinds():
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert divergence_kind(a, a.copy(), "float32") is None
    assert divergence_kind(a, np.nextafter(a, 10).astype(np.float32), "float32") == DivergenceKind("rounding")
    assert divergence_kind(a, a * 1.01, "float32") == DivergenceKind("mismatch")
    b = a.copy()
    b[0] = np.inf
    assert divergence_kind(a, b, "float32") == DivergenceKind("nonfinite", "b:+inf")
    c = a.copy()
    c[1] = np.nan
    assert divergence_kind(c, b, "float32") == DivergenceKind("nonfinite", "a:nan,b:+inf")
    assert divergence_kind(np.array([1, 2]), np.array([1, 3]), "int64") == DivergenceKind("mismatch")
    nan = np.array([np.nan], dtype=np.float32)
    assert divergence_kind(nan, nan.copy(), "float32") is None


@pytest.mark.slow
def test_compiled_acosh_minimizes_to_acosh(triage, tmp_path):
    code, report, comment, out = triage(FIXTURES / "compile_acosh.py", "cpu,cpu/compile")
    assert code == 0, out
    if {a["flags_start"]["cpu_capability"] for a in report["arms"]} == {"DEFAULT"}:
        # gh-183768's overflow is in inductor's vectorized acosh; with ATEN_CPU_CAPABILITY=default
        # inductor emits scalar code, which is right: there is nothing to minimize.
        assert report["verdict"]["kind"] == "not-reproduced", report["verdict"]["summary"]
        pytest.skip("gh-183768 needs inductor's vectorized acosh (ATEN_CPU_CAPABILITY is default)")
    m = report["minimal"]
    assert m["ops"] == ["aten.acosh"], out
    assert m["verified"] is True, m["verification"]
    assert "torch.acosh(x0)" in m["script"] and "torch.compile(f" in m["script"]
    # The data reduced: a short literal that keeps a value whose square overflows float32.
    x0 = re.search(r"^x0 = torch\.tensor\((\[.*\]), dtype=torch\.float32\)$", m["script"], re.M)
    assert x0 and m["inputs_file"] is None and "frombuffer" not in m["script"], m["script"]
    assert m["timings"]["elements_after"] <= 16 and re.search(r"\de\+2\d", x0.group(1)), x0.group(1)
    assert comment.index("Minimal repro") < comment.index("Original repro")
    first = report["localization"][0]
    assert first["op"] == "aten.acosh" and first["first"] and first["role"] == "introduced"
    upcast = next(a for a in report["ablations"] if a["switch"] == "float64=acosh")
    assert upcast["outcome"] == "agree-bitwise"  # acosh alone in float64: the compiled inf is gone
    assert any("`aten.acosh` alone computed in float64" in e for e in report["verdict"]["evidence"])
    assert any("x² overflows float32" in e for e in report["verdict"]["evidence"])
    run = subprocess.run([sys.executable, str(tmp_path / "minimal.py")], capture_output=True, text=True,
                         timeout=300)
    shown = dict(line.split(":", 1) for line in run.stdout.splitlines() if ":" in line)
    assert "inf" in shown["compiled"] and "inf" not in shown["eager"] and "inf" not in shown["float64"], run.stdout
    assert re.search(r"nonfinite on one side only: [1-9]", run.stdout), run.stdout


@pytest.mark.slow
def test_faulted_slogdet_minimizes_to_slogdet_on_the_singular_matrix(triage):
    # The fault sets logdet to +inf; the fixture's matrix is singular by construction (a zero
    # row), so the unfaulted arm's logdet is -inf on any CPU.
    code, report, _, out = triage(FIXTURES / "singular_logdet_rows.py", "cpu,cpu/fault=linalg_slogdet:inf")
    assert code == 0, out
    m = report["minimal"]
    assert m["ops"] == ["aten._linalg_slogdet"], out
    assert m["verified"] is True, m["verification"]
    assert m["original_ops"] > 5
    rows = re.findall(r"\[([-0-9.e, ]+)\]", m["script"].split("x0 = torch.tensor(")[1].split("dtype")[0])
    # Reduced from the recorded 4x4 matrix, still singular (arm A's -inf is kept): a zero row.
    assert 1 <= len(rows) <= 4 and any(all(float(x) == 0 for x in r.split(",")) for r in rows), rows
    assert m["timings"]["elements_after"] < m["timings"]["elements_before"] == 16


@pytest.mark.slow
def test_no_minimize_flag_and_single_arm(triage):
    _, report, _, _ = triage(FIXTURES / "matmul_chain.py", "cpu,cpu/fault=mm", "--no-minimize")
    assert report["minimal"] is None and report["localization"] == []
    _, report, _, _ = triage(FIXTURES / "matmul_chain.py", "cpu")
    assert report["minimal"] is None


@pytest.mark.slow
def test_lost_worker_is_restarted(tmp_path):
    from triage.arms.run import run_arms
    from triage.arms.spec import parse_arms
    from triage.extract import extract_repro
    from triage.minimize.arm_worker import ArmWorker
    from triage.settings import RunSettings

    arm = parse_arms("cpu")[0]
    run = run_arms(extract_repro(str(FIXTURES / "compile_acosh.py")), [arm], RunSettings(reference=False))[0]
    graph = OpGraph(run.graph_dir)
    worker = ArmWorker(arm, run.graph_dir, 4 << 30)
    try:
        plan = graph.plan(frozenset(graph.ops))
        assert worker.request(dict(plan.request(), cmd="run"), 60)[0]["ok"]
        worker.sandboxed.kill()  # the worker's whole sandbox is lost (as a crash or the OOM killer would)
        worker.proc.wait()
        # The namespace's other processes die after its PID 1, asynchronously: until the worker's
        # reply pipe has closed (its reader queues None), the worker could still answer.
        deadline = time.monotonic() + 60
        while None not in list(worker.replies.queue) and time.monotonic() < deadline:
            time.sleep(0.05)
        lost, _ = worker.request(dict(plan.request(), cmd="run"), 60)
        assert not lost["ok"] and "died" in lost["lost"]
        again, values = worker.request(dict(plan.request(), cmd="run"), 60)
        assert again["ok"] and worker.restarts == 1 and values
    finally:
        worker.close()


def test_the_run_has_one_compile_cache_its_verification_uses(tmp_path, monkeypatch):
    """The minimal script's verification compiles into the triage run's cache (warm from the
    arms), not one of its own: it is triage's script, run for this run only."""
    from triage.arms.spec import parse_arms
    from triage.minimize import standalone
    from triage.settings import RunSettings

    seen = {}

    def run_arms(repro, arms, options, reporter=None):
        seen["options"] = options
        raise RuntimeError("stop here: the options are what this test is about")

    monkeypatch.setattr(standalone, "run_arms", run_arms)
    (tmp_path / "minimal.py").write_text("import torch\n")
    a, b = parse_arms("cpu,cpu/compile")
    options = RunSettings(compile_cache=str(tmp_path / "cache"), isolation="process", script_args=("--n", "1"))
    with pytest.raises(RuntimeError, match="stop here"):
        standalone.verify(tmp_path, a, b, DivergenceKind("mismatch"), options)
    assert seen["options"].compile_cache == str(tmp_path / "cache")
    assert seen["options"].isolation == "process" and seen["options"].script_args == ()


def test_candidates_for_a_scripts_backend_call_the_functions_dynamo_would_hand_it():
    """A backend picks nodes by the torch-level function in dynamo's graph: `torch.expm1`,
    `F.gelu` (torch has no `gelu`), and the one its own source names where torch has two
    (`F.relu` beside `torch.relu`); a function that does not take the recorded arguments
    (`F.elu` has no `scale`) leaves the aten op."""
    import torch
    import torch.nn.functional as F

    from triage.worker.graphio import torch_function

    aten = torch.ops.aten
    x = torch.ones(2)
    assert torch_function(aten.expm1.default, (x,)) is torch.expm1
    assert torch_function(aten.gelu.default, (x,), {"approximate": "tanh"}) is F.gelu
    assert torch_function(aten.relu.default, (x,)) is torch.relu
    assert torch_function(aten.relu.default, (x,), {}, {"relu": F.relu}) is F.relu
    assert torch_function(aten.elu.default, (x, 1.0, 1.0, 1.0)) is aten.elu.default
    assert torch_function(aten._softmax.default, (x, 0, False)) is aten._softmax.default


def test_an_op_a_backend_matches_under_another_name_is_called_and_written_by_that_name():
    """`torch.softmax` runs as `aten._softmax`, `a / b` as `aten.div.Tensor`: a backend that
    matches `torch.softmax` or `operator.truediv` (nu24 c14, x16) sees them only where the
    candidates call, and the repro writes, the op so. `dim` goes by keyword, as scripts write
    it: a backend that rewrites `node.kwargs["dim"]` must not pass it twice."""
    import operator

    import torch

    from triage.worker.graphio import torch_function
    from triage.worker.render import _public_forms

    aten = torch.ops.aten
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    softmax = torch_function(aten._softmax.default, (x, 0, False), {}, {"softmax": torch.softmax})
    assert torch.equal(softmax(x, 0, False), torch.softmax(x, dim=0))
    # Through dynamo, as the candidates run: the backend sees `torch.softmax` and moves its dim.
    graph = torch.fx.Graph()
    node = graph.call_function(softmax, (graph.placeholder("x"), 0, False))
    graph.output((node,))

    def move_dim(gm, example_inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is torch.softmax:
                n.kwargs = {**n.kwargs, "dim": 1}
        gm.recompile()
        return gm.forward

    compiled = torch.compile(torch.fx.GraphModule(torch.nn.Module(), graph), backend=move_dim)
    assert torch.equal(compiled(x)[0], torch.softmax(x, dim=1))
    divide = torch_function(aten.div.Tensor, (x, 8.0), {}, {"truediv": operator.truediv})
    assert torch.equal(divide(x, 8.0), x / 8.0)
    assert torch_function(aten.div.Tensor, (x, 8.0)) is torch.div  # no backend asks for `/`
    assert ("torch.softmax(x0, dim=-1)", "torch.softmax") in _public_forms("_softmax", ["x0", "-1", "False"], [])
    assert ("x0 / 8.0", "operator.truediv") in _public_forms("div", ["x0", "8.0"], [])
    assert not any("softmax" in form for _, form in _public_forms("_softmax", ["x0", "-1", "True"], []))


def test_a_backend_whose_target_the_candidates_lack_is_named_as_the_minimizers_limit():
    """`node.target is F.layer_norm`: layer norm runs as `aten.native_layer_norm`, so no
    candidate calls `F.layer_norm` — the note says so instead of blaming the script's state."""
    from types import SimpleNamespace

    from triage.arms.spec import parse_arm
    from triage.minimize.steps import _uncaptured

    run = SimpleNamespace(graph={"backends": [{"name": "ln_backend", "line": 5}]})
    comparison = SimpleNamespace(run=lambda spec: run)
    loaded = {"name": "ln_backend", "definitions": "...", "targets": ["F.layer_norm"]}
    note = _uncaptured(comparison, parse_arm("cpu/compile"), loaded)
    assert "picks graph nodes by their torch-level function (`F.layer_norm`)" in note
    assert "a limit of the minimizer" in note and "depends on more than" not in note
    assert "depends on more than the op graph" in _uncaptured(comparison, parse_arm("cpu/compile"),
                                                              dict(loaded, targets=[]))
