"""The minimizer's data passes, the script they feed and its "set with" lines (fast: no
arms; the arms are stood in for by numpy functions that diverge by construction).

A stand-in arm pair computes an elementwise function on the candidate's inputs: arm A in
float64 and arm B with a planted overflow (every element above a threshold becomes +inf).  The
passes must shrink 200 recorded elements to one plain literal that still overflows, and never
keep a candidate on which the arms stop diverging the same way."""
import json
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from triage.arms.graph import OpGraph
from triage.minimize import data
from triage.minimize.problem import ReductionProblem, judge
from triage.model import DivergenceKind

OVERFLOW = DivergenceKind("nonfinite", "b:+inf")


def _graph(tmp_path):
    nodes = [{"name": "x", "op": "leaf", "kind": "input", "dtype": "float32", "line": 1},
             {"name": "acosh", "op": "call", "target": "aten.acosh.default", "dtype": "float32",
              "args": [{"node": "x"}], "kwargs": {"dict": {}}, "line": 2}]
    (tmp_path / "graph.json").write_text(json.dumps({"format": "triage.opgraph/1", "nodes": nodes}))
    return OpGraph(tmp_path)


class StandInArm:
    """Answers `inputs` with the recorded value and `run` with the op on the candidate's data."""

    def __init__(self, recorded, compute):
        self.recorded, self.compute = recorded, compute

    def request(self, header, timeout_s, keep_state=False, arrays=None):
        if header["cmd"] == "inputs":
            return {"ok": True, "dtypes": {"x": "float32"}}, {"x": self.recorded}
        x = (arrays or {}).get("x", self.recorded)
        return {"ok": True, "outputs": [{"name": "acosh", "dtype": "float32"}]}, {"acosh": self.compute(x)}


def _eager(x):
    with np.errstate(invalid="ignore"):
        return np.arccosh(x.astype(np.float64)).astype(np.float32)


def _overflowing(x, vector_width=1):
    """The planted bug: x*x overflows float32 (acosh(x) = log(x + sqrt(x*x - 1))), but only in
    blocks of `vector_width` elements (a vectorized kernel; the scalar tail is right)."""
    out = _eager(x)
    full = x.size - x.size % vector_width
    with np.errstate(over="ignore"):
        bad = np.zeros(x.size, dtype=bool)
        bad[:full] = ~np.isfinite(x.reshape(-1)[:full].astype(np.float32) ** 2)
    out.reshape(-1)[bad] = np.inf
    return out


class StandInProblem(ReductionProblem):
    def run(self, plan, upcast=None):
        self.queries += 1
        arrays = self.overrides_for(plan)
        ha, va = self.a.request({"cmd": "run"}, 1, arrays=arrays)
        hb, vb = self.b.request({"cmd": "run"}, 1, arrays=arrays)
        return judge(ha, va, hb, vb)


def _problem(tmp_path, recorded, bug):
    graph = _graph(tmp_path)
    p = StandInProblem(graph, StandInArm(recorded, _eager), StandInArm(recorded, bug), OVERFLOW)
    assert p.diverges(frozenset({"acosh"}))
    return p


def test_an_elementwise_overflow_shrinks_to_one_plain_element(tmp_path):
    rng = np.random.default_rng(0)
    recorded = rng.uniform(1, 3, size=(10, 20)).astype(np.float32)
    recorded[3, 7] = np.float32(4.999999889098154e+22)
    recorded[8, 1] = np.float32(9.000000412866227e+25)
    p = _problem(tmp_path, recorded, _overflowing)
    found = data.reduce_data(p, frozenset({"acosh"}), 1)
    x = p.overrides["x"]
    assert (found.elements_before, found.elements_after) == (200, 1)
    assert x.size == 1 and data.literal(float(x[0]), "float32") == "5e+22"  # the largest error first, plainer
    assert p.diverges(frozenset({"acosh"}))  # what is kept still diverges the same way


def test_a_divergence_that_needs_a_full_vector_keeps_it(tmp_path):
    # The bug shows only in whole blocks of 4: one element is not enough, and the passes must
    # not keep a candidate on which the arms agree.
    recorded = np.full(40, 2.0, dtype=np.float32)
    recorded[5] = np.float32(7.000000069917397e+21)
    bug = lambda x: _overflowing(x, vector_width=4)  # noqa: E731
    p = _problem(tmp_path, recorded, bug)
    data.reduce_data(p, frozenset({"acosh"}), 1)
    x = p.overrides["x"]
    assert x.size == 4 and p.diverges(frozenset({"acosh"}))
    assert all(len(data.literal(float(v), "float32")) <= 5 for v in x)  # 1.0, 0.0, 7e+21, …


def test_shrinking_dimensions_of_a_reduction(tmp_path):
    # A "sum" whose arm B drops the last row.
    recorded = np.arange(64 * 48, dtype=np.float32).reshape(64, 48) / 7
    graph = _graph(tmp_path)
    a = StandInArm(recorded, lambda x: x.sum(axis=0, keepdims=True).astype(np.float32))
    b = StandInArm(recorded, lambda x: x[:-1].sum(axis=0, keepdims=True).astype(np.float32))
    p = StandInProblem(graph, a, b, DivergenceKind("mismatch"))
    found = data.reduce_data(p, frozenset({"acosh"}), 1)
    x = p.overrides["x"]
    # One row (arm B sums none of it), one column, not the zero at [0, 0]; then the plainest value.
    assert x.shape == (1, 1) and x[0, 0] == 1.0, x
    assert found.elements_after == 1 and p.diverges(frozenset({"acosh"}))


def test_literals_are_the_shortest_exact_decimal():
    assert data.literal(float(np.float32(4.999999889098154e+22)), "float32") == "5e+22"
    assert data.literal(float(np.float32(0.1)), "float32") == "0.1"
    assert data.literal(float(np.float16(0.1)), "float16") == "0.1"
    assert data.literal(data.to_dtype(0.1, "bfloat16"), "bfloat16") == "0.1"
    assert data.to_dtype(0.1, "bfloat16") == float(torch.tensor(0.1).bfloat16().float())
    assert data.literal(-0.0, "float32") == "-0"
    assert data.literal(float("inf"), "float32") == 'float("inf")'


def test_positions_point_at_the_largest_differences():
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([1.0, 2.5, 3.0, 40.0], dtype=np.float32)
    outcome = judge({"ok": True, "outputs": [{"name": "o", "dtype": "float32"}]}, {"o": a},
                    {"ok": True}, {"o": b})
    assert outcome.positions["o"] == ((4,), [3, 1])


# -- the script ---------------------------------------------------------------------------------
def _server(tmp_path, value):
    from triage.worker.graphio import FORMAT, LoadedGraph

    nodes = [{"name": "x", "op": "leaf", "kind": "input", "dtype": "float32", "line": 1},
             {"name": "elu", "op": "call", "target": "aten.elu.default", "dtype": "float32",
              "args": [{"node": "x"}], "kwargs": {"dict": {}}, "line": 2},
             {"name": "mul", "op": "call", "target": "aten.mul.Tensor", "dtype": "float32",
              "args": [{"node": "elu"}, {"node": "x"}], "kwargs": {"dict": {}}, "line": 3}]
    (tmp_path / "graph.json").write_text(json.dumps({"format": FORMAT, "nodes": nodes}))
    torch.save({"x": value}, tmp_path / "leaves.pt")
    graph = LoadedGraph(tmp_path)
    recorded = graph.run_eager(["elu", "mul"], {"x": value}, torch.device("cpu"))
    return types.SimpleNamespace(graph=graph, recorded={k: v for k, v in recorded.items() if k != "x"})


def _render(tmp_path, style, arms, knobs, overrides=None):
    from triage.worker.render import render_script

    server = _server(tmp_path, torch.linspace(-2, 2, 300, dtype=torch.float32))
    request = {"plan": ["elu", "mul"], "inputs": ["x"], "outputs": ["mul"], "sources": {}, "style": style,
               "devices": arms if style == "devices" else [], "backend": "inductor", "arms": arms, "knobs": knobs, "kind": "values differ",
               "dir": str(tmp_path)}
    return render_script(server, request, overrides or {})


def _run(tmp_path, script):
    path = tmp_path / "minimal.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_script_sets_both_arms_settings_and_shows_the_values_in_full(tmp_path):
    reply = _render(tmp_path, "settings", ["cpu", "cpu/threads=1"], [[], [["threads", "1"]]],
                    {"x": torch.tensor([-1.5, 0.1, 3.0])})
    script = reply["script"]
    assert "default_threads = torch.get_num_threads()" in script
    assert script.index("torch.set_num_threads(default_threads)") < script.index("cpu = f(x0)")
    assert script.index("cpu = f(x0)") < script.index("torch.set_num_threads(1)") < script.index("cpu_threads_1 = f(x0)")
    assert "x0 = torch.tensor([-1.5, 0.1, 3.0], dtype=torch.float32)" in script
    assert reply["results"] == ["cpu", "cpu_threads_1"]
    out = _run(tmp_path, script)
    lines = dict(line.split(":", 1) for line in out.splitlines() if line.startswith(("cpu", "float64")))
    assert set(lines) == {"cpu", "cpu/threads=1", "float64"}
    # Full precision: float32 values printed as their exact doubles, float64 differently.
    assert "1.16530475977" in lines["float64"] and lines["cpu"] != lines["float64"]
    assert out.strip().splitlines()[-1] == "max |diff| 0 = 0 ulp; nonfinite on one side only: 0"


def test_every_float64_line_runs_and_is_written_from_the_recorded_call(tmp_path):
    reply = _render(tmp_path, "plain", ["cpu", "cpu/fault=elu"], [[], [["fault", "elu"]]])
    lines = reply["float64_lines"]
    # elu has no torch.elu: the public form is the functional one; mul takes both of its inputs.
    assert lines["elu"] == "torch.nn.functional.elu(x0.double()).to(torch.float32)"
    assert lines["mul"].startswith("torch.mul(v0.double(), x0.double())")
    scope = {"torch": torch, "x0": torch.ones(3), "v0": torch.ones(3)}
    for line in lines.values():
        assert eval(line, scope).dtype == torch.float32  # noqa: S307 - the lines under test
    assert "triage run minimal.py --arms cpu,cpu/fault=elu" in reply["script"]


def test_the_compile_script_shows_eager_compiled_and_float64(tmp_path):
    reply = _render(tmp_path, "compile", ["cpu", "cpu/compile"], [[], []], {"x": torch.tensor([0.5])})
    script = reply["script"]
    assert 'compiled = torch.compile(f, backend="inductor", fullgraph=True)(x0)' in script
    assert 'show({"eager": eager, "compiled": compiled, "float64": exact})' in script
    assert reply["results"] == ["eager", "compiled"]


@pytest.mark.parametrize("knob, value", [("mkldnn", "off"), ("deterministic", "on"), ("threads", "2"),
                                         ("cudnn_benchmark", "off"), ("tf32", "off"), ("reduced_precision", "off")])
def test_each_knob_a_script_sets_is_code_that_runs(tmp_path, knob, value):
    reply = _render(tmp_path, "settings", ["cpu", f"cpu/{knob}={value}"], [[], [[knob, value]]],
                    {"x": torch.tensor([0.5])})
    out = _run(tmp_path, reply["script"])
    assert f"cpu/{knob}={value}:" in out


def test_a_cancellation_keeps_its_size_in_ulps(tmp_path):
    # Arm B writes expm1 as exp(x) - 1 in float32: thousands of ulps off at x ~ 1e-5, one ulp at
    # x = 1.  Both differ "within tolerance"; the reduced input must still show the cancellation.
    recorded = np.linspace(1e-5, 2e-5, 50, dtype=np.float32)

    def cancelling(x):
        return (np.exp(x.astype(np.float32)) - np.float32(1)).astype(np.float32)

    graph = _graph(tmp_path)
    a = StandInArm(recorded, lambda x: np.expm1(x.astype(np.float64)).astype(np.float32))
    b = StandInArm(recorded, cancelling)
    p = StandInProblem(graph, a, b, DivergenceKind("rounding"))
    before = p.largest_ulps(frozenset({"acosh"}))
    assert before > 100
    data.reduce_data(p, frozenset({"acosh"}), 1)
    x = p.overrides["x"]
    assert x.size == 1 and abs(float(x[0])) < 1e-3, x
    assert p.largest_ulps(frozenset({"acosh"})) >= before / data.SEVERITY_KEPT


def test_every_switch_setting_line_runs_in_a_fresh_process():
    """The "set with" line of each ablation switch is code a maintainer pastes: it must run."""
    from triage.ablate import SWITCHES

    code = "import torch, torch._inductor.config\n" + "".join(
        f"exec({s.setting!r}, {{'torch': torch}})\n" for s in SWITCHES)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_value_only_arm_a_made_nonfinite_is_never_an_input(tmp_path):
    # x -> mul (arm A overflows to inf here, arm B does not) -> div: a candidate of `div` alone
    # would feed arm A's inf to both arms; the op that produced it must stay.
    from triage.minimize.localize import _nonfinite_on_a_only
    from triage.minimize.passes import reduce

    nodes = [{"name": "x", "op": "leaf", "kind": "input", "dtype": "float16", "line": 1},
             {"name": "mul", "op": "call", "target": "aten.mul.Tensor", "dtype": "float16",
              "args": [{"node": "x"}, 1000], "kwargs": {"dict": {}}, "line": 2},
             {"name": "div", "op": "call", "target": "aten.div.Tensor", "dtype": "float16",
              "args": [{"node": "mul"}, 1000], "kwargs": {"dict": {}}, "line": 3}]
    (tmp_path / "graph.json").write_text(json.dumps({"format": "triage.opgraph/1", "nodes": nodes}))
    graph = OpGraph(tmp_path)

    class Arm:
        def __init__(self, inf):
            self.inf = inf

        def request(self, header, timeout_s, keep_state=False, arrays=None):
            value = np.array([np.inf if self.inf else 1.0], dtype=np.float16)
            return {"ok": True, "outputs": [{"name": o, "dtype": "float16"} for o in header["outputs"]]}, \
                {o: value for o in header["outputs"]}

    class Problem(ReductionProblem):
        def run(self, plan, upcast=None):
            self.queries += 1
            request = plan.request(cmd="run")
            return judge(*self.a.request(request, 1), *self.b.request(request, 1))

    p = Problem(graph, Arm(True), Arm(False), DivergenceKind("nonfinite", "a:+inf"))
    assert p.diverges(frozenset({"div"}))  # the stand-in diverges on any candidate
    assert _nonfinite_on_a_only({"kind": "nonfinite", "detail": "a:+inf"})
    assert not _nonfinite_on_a_only({"kind": "nonfinite", "detail": "b:+inf"})
    p.one_arm_values = frozenset({"mul"})
    assert not p.diverges(frozenset({"div"}))
    assert reduce(p, frozenset({"mul", "div"})) == frozenset({"mul"})


def test_the_device_script_computes_on_both_devices(tmp_path):
    reply = _render(tmp_path, "devices", ["cpu", "cuda"], [[], []], {"x": torch.tensor([0.5])})
    script = reply["script"]
    assert "cpu = f(x0.to('cpu'))" in script and "cuda = f(x0.to('cuda'))" in script
    assert 'show({"cpu": cpu, "cuda": cuda, "float64": exact})' in script
    assert reply["results"] == ["cpu", "cuda"]


@pytest.mark.parametrize("value", [torch.linspace(-1, 1, 64), torch.arange(48.0).reshape(6, 8) / 7,
                                   torch.tensor([1e-30, -2.5, float("inf")], dtype=torch.float16)])
def test_a_long_literal_is_wrapped_and_still_exact(value):
    from triage.worker.render import SCRIPT_WIDTH, _literal, _wrapped

    text = _wrapped("x0 = " + _literal(value), value)
    assert max(len(line) for line in text.splitlines()) <= SCRIPT_WIDTH
    scope = {"torch": torch}
    exec(text, scope)  # noqa: S102 - the literal under test
    assert scope["x0"].dtype == value.dtype and torch.equal(scope["x0"], value)
