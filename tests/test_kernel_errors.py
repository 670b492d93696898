"""The measured kernel error table (triage/worker/kernel_errors.py): the probe that measures an
aten kernel against float64 on PyTorch's OpInfo samples, the table's lookup, and the
simulation reading it. Every large error here is made on purpose (a custom op whose float32
kernel computes in float16)."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from triage.judge import RoundingSpread
from triage.worker import kernel_errors
from triage.worker.kernel_errors import KernelTable, _Probe, measure, write
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import SimulationOptions, kernel_table, simulate_rounding

LIB = torch.library.Library("triage_kernel_test", "DEF")  # noqa: TOR901 - a test-only namespace
LIB.define("sloppy_exp(Tensor x) -> Tensor")


def _sloppy_exp(x: torch.Tensor) -> torch.Tensor:
    # float32 inputs computed in float16 (about 2^13 u off); float64 exact: a kernel bug on purpose.
    return torch.exp(x.half()).to(x.dtype) if x.dtype == torch.float32 else torch.exp(x)


LIB.impl("sloppy_exp", _sloppy_exp, "CPU")


def test_the_probe_measures_a_kernel_against_float64_and_finds_an_injected_error():
    probe = _Probe()
    x = torch.linspace(-3, 3, 1001)
    with torch.no_grad(), probe:
        torch.exp(x)
        torch.ops.triage_kernel_test.sloppy_exp(x)
    assert probe.seen["exp"]["float32"]["max_u"] < 8  # a faithful libm on every CPU capability
    assert probe.seen["sloppy_exp"]["float32"]["max_u"] > 1000


def test_a_python_float_operand_is_read_at_the_kernels_float32():
    """`x / 0.3`: the kernel divides by float32's 0.3, correctly rounded. The float64 reference
    divided by the double 0.3, and the scalar's own rounding was counted as the kernel's: the
    shipped float32 `div` measured 1.46 u, `mul` 1.53 u, `sub` 1.95 u, so the simulation took
    them for library functions with noise at every element, and moved scores of exactly 0.5
    across a `>=` threshold (a thirty-second new user's planted bug was called rounding)."""
    probe = _Probe()
    x = torch.linspace(-3, 3, 100_001)
    with torch.no_grad(), probe:
        torch.div(x, 0.3)
        torch.mul(x, 0.1)
        torch.sub(x, 0.7)
    for op in ("div", "mul", "sub"):
        assert probe.seen[op]["float32"]["max_u"] <= 1.0, (op, probe.seen[op])
    table = KernelTable.load("cpu", None, torch.__version__)
    for op in ("div", "mul", "sub"):  # the shipped figures, measured so
        assert table.get(op, torch.float32).max_u <= 1.05, op


def test_opmath_is_read_off_the_fp16_results():
    probe = _Probe()
    x = (torch.rand(4096) * 8 - 4).half()
    with torch.no_grad(), probe:
        torch.softmax(x, 0)  # CPU softmax of half accumulates in float32
    entry = kernel_errors._rounded(probe.seen["_softmax"]["float16"])
    assert entry["float32_opmath"] is True


def test_pointwise_backward_error_is_separated_from_the_forward_error():
    """gelu's x·(1 + erf(x/√2))/2 cancels for x ≪ 0 (the float32 kernel returns 0 at -6): a
    large error relative to the result where the function is ill-conditioned is measured
    relative to the input, and the forward error stays that of a faithful kernel."""
    probe = _Probe()
    x = torch.linspace(-7, 4, 4001)
    with torch.no_grad(), probe:
        torch.nn.functional.gelu(x)
    entry = probe.seen["gelu"]["float32"]
    assert entry["max_u"] < 64
    assert 0 < entry["backward_u"] < 16


def test_the_slope_figure_tells_an_accurate_formula_from_one_that_cancels():
    """softplus's log1p(exp(x)) for x ≪ 0 is accurate for its input: its error where it is
    ill-conditioned is about u·|x·f′(x)|, a small figure in those units (and a tiny one in
    u·|x|). GELU's 1 + erf cancels: its error is u·|x|, hundreds of u of its slope's scale.
    Too few ill-conditioned elements give no slope figure at all."""
    probe = _Probe()
    with torch.no_grad(), probe:
        torch.nn.functional.softplus(torch.linspace(-30, -2, 4001))
        torch.nn.functional.gelu(torch.linspace(-7, 4, 4001))
        torch.nn.functional.softplus(torch.linspace(-30, -2, 4001).half())
    softplus = kernel_errors._rounded(probe.seen["softplus"]["float32"])
    gelu = kernel_errors._rounded(probe.seen["gelu"]["float32"])
    assert softplus["sensitivity_u"] <= 2
    assert gelu["sensitivity_u"] > 16 * softplus["sensitivity_u"] and gelu["sensitivity_u"] > 8
    few = dict(probe.seen["softplus"]["float32"], ill_elements=kernel_errors.SENSITIVITY_EVIDENCE - 1)
    assert "sensitivity_u" not in kernel_errors._rounded(few) and "backward_u" in kernel_errors._rounded(few)


def test_measure_runs_opinfo_samples_and_the_table_round_trips(tmp_path):
    pytest.importorskip("expecttest")
    entry = measure(dtypes=("float32", "float16"), only=["exp", "softmax"], samples_per_op=4)
    assert entry["device"] == "cpu" and entry["capability"] == torch.backends.cpu.get_cpu_capability()
    assert {"exp", "_softmax"} <= set(entry["ops"])
    assert entry["ops"]["exp"]["float32"]["elements"] > 0
    path = tmp_path / "table.json"
    write(entry, path)
    write(entry, path)  # the same release, device and capability: replaced, not appended
    assert len(json.loads(path.read_text())["tables"]) == 1
    table = KernelTable.load("cpu", entry["capability"], torch.__version__, path)
    assert table.get("exp", torch.float32) is not None
    assert table.get("exp", torch.bfloat16) is None  # not measured: the simulation's conservative bound


def _table(tmp_path, *entries):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"format": 1, "tables": list(entries)}))
    return path


def _entry(capability, max_u, torch_version="2.13.0", device="cpu", **extra):
    return {"torch": torch_version, "device": device, "capability": capability,
            "ops": {"erf": {"float32": {"max_u": max_u, "elements": 10, "calls": 1, "backward_u": 0.5, **extra}},
                    "upsample_bilinear2d": {"float32": {"max_u": 5000.0, "elements": 10, "calls": 1}},
                    "_softmax": {"float32": {"max_u": 3.0, "elements": 10, "calls": 1}}}}


def test_the_backward_pass_measures_the_pointwise_backward_kernels_a_gradient_calls():
    """`tanh`'s and `silu`'s gradients call `tanh_backward` and `silu_backward`, which no
    forward sample does: measured, with their conditioning figures. The gradients' other
    calls (`mul`) are forward ops, left to the forward samples; with the forward pass the
    forward ops are measured too."""
    pytest.importorskip("expecttest")
    backward = measure(dtypes=("float32",), only=["tanh", "nn.functional.silu"], samples_per_op=3,
                       passes=("backward",))
    assert set(backward["ops"]) == {"tanh_backward", "silu_backward"}
    assert backward["ops"]["silu_backward"]["float32"]["elements"] > 0
    assert "backward_u" in backward["ops"]["tanh_backward"]["float32"]  # pointwise: a conditioning figure
    both = measure(dtypes=("float32",), only=["tanh"], samples_per_op=3)
    assert {"tanh", "tanh_backward"} <= set(both["ops"])


def test_a_backward_pass_alone_is_merged_into_the_machines_entry(tmp_path):
    pytest.importorskip("expecttest")
    table = tmp_path / "kernels.json"
    for passes in (["--pass", "forward"], ["--pass", "backward"]):
        done = subprocess.run([sys.executable, "-m", "triage", "calibrate", "--op", "tanh", "--dtype", "float32",
                               "--table", str(table), *passes], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    entry, = json.loads(table.read_text())["tables"]
    assert {"tanh", "tanh_backward"} <= set(entry["ops"])


def test_the_table_of_this_release_and_capability_is_chosen_else_the_largest_error(tmp_path):
    path = _table(tmp_path, _entry("AVX2", 3.0), _entry("AVX512", 12.0))
    exact = KernelTable.load("cpu", "AVX2", "2.13.0+cpu", path)
    assert exact.get("erf", torch.float32).max_u == 3.0
    other = KernelTable.load("cpu", "DEFAULT", "2.13.0+cpu", path)
    assert other.get("erf", torch.float32).max_u == 12.0 and "largest" in other.source
    assert KernelTable.load("cuda", "H100", "2.13.0", path).ops == {}
    assert "no measurement for device cuda" in KernelTable.load("cuda", "H100", "2.13.0", path).source


def test_the_slope_ratio_floors_and_needs_the_figure_in_every_entry_merged(tmp_path):
    path = _table(tmp_path, _entry("AVX2", 3.0, sensitivity_u=0.5), _entry("AVX512", 12.0))
    avx2 = KernelTable.load("cpu", "AVX2", "2.13.0+cpu", path)
    # max(LIBRARY_FLOOR_U, MARGIN·0.5) in units of input_u's MARGIN·0.5
    assert avx2.sensitivity_ratio("erf", torch.float32) == kernel_errors.LIBRARY_FLOOR_U / (kernel_errors.MARGIN * 0.5)
    assert avx2.sensitivity_ratio("_softmax", torch.float32) is None
    # merged with an entry that did not measure it: the input's scale alone
    assert KernelTable.load("cpu", "DEFAULT", "2.13.0+cpu", path).sensitivity_ratio("erf", torch.float32) is None
    # a kernel that erred by more than a backward-stable one's slope figure: none either
    cancelling = KernelTable.load("cpu", "AVX2", "2.13.0+cpu",
                                  _table(tmp_path, _entry("AVX2", 3.0, sensitivity_u=kernel_errors.BACKWARD_STABLE_U * 2)))
    assert cancelling.sensitivity_ratio("erf", torch.float32) is None


def test_a_half_kernel_computing_in_float32_inherits_float32s_error_where_ill_conditioned():
    """bfloat16 GELU's gradient computes in float32: where GELU's tail cancels, its error is
    float32's, which in bfloat16's units measured 0. Float32's bound, in bfloat16's units,
    and float32's slope figure with it; a kernel not computing in float32 inherits nothing."""
    E = kernel_errors.KernelError
    table = KernelTable({"gelu_backward": {"float32": E(18.3, 800, 8, None, 1.17, 0.5),
                                           "bfloat16": E(0.99, 800, 8, True, 0.0, 0.0)},
                         "erf": {"float32": E(2.0, 800, 8, None, 3.0), "bfloat16": E(0.9, 800, 8, False, 0.0)}}, "test")
    inherited = kernel_errors.MARGIN * 1.17 * 2.0 ** -24 / 2.0 ** -8
    assert table.input_u("gelu_backward", torch.bfloat16) == inherited
    assert table.sensitivity_ratio("gelu_backward", torch.bfloat16) == table.sensitivity_ratio("gelu_backward",
                                                                                                torch.float32)
    assert table.input_u("erf", torch.bfloat16) == 0.0


def test_a_gpu_torch_can_no_longer_name_gets_any_gpus_entry(monkeypatch):
    """The table is read after the script, which may have hidden the GPU CUDA started on (a
    CUDA_VISIBLE_DEVICES set after; seen on an H200 as "Invalid device id")."""
    def hidden(*args):
        raise AssertionError("Invalid device id")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", hidden)
    kernel_table.cache_clear()
    try:
        table = kernel_table("cuda")
    finally:
        kernel_table.cache_clear()
    assert table.source == KernelTable.load("cuda", None, torch.__version__).source


def test_bounds_floor_margin_and_caps(tmp_path):
    table = KernelTable.load("cpu", "AVX2", "2.13.0", _table(tmp_path, _entry("AVX2", 1.0)))
    assert table.library_u("erf", torch.float32) == kernel_errors.LIBRARY_FLOOR_U
    assert table.input_u("erf", torch.float32) == kernel_errors.MARGIN * 0.5  # error beyond two roundings
    assert table.input_u("_softmax", torch.float32) == 0.0  # not pointwise: no input-scale error
    # A non-pointwise op's huge measurement met an ill-conditioned sample: capped.
    assert table.library_u("upsample_bilinear2d", torch.float32) == kernel_errors.MARGIN * kernel_errors.FUSED_CAP
    assert table.fused_u("_softmax", torch.float32) == kernel_errors.MARGIN * 3.0
    assert table.library_u("lgamma", torch.float32) is None


def test_a_missing_or_broken_table_leaves_every_op_unmeasured(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert KernelTable.load("cpu", "AVX2", "2.13.0", broken).ops == {}
    assert KernelTable.load("cpu", "AVX2", "2.13.0", tmp_path / "absent.json").ops == {}


def test_the_shipped_table_measures_this_release_on_cpu():
    table = KernelTable.load("cpu", None, torch.__version__)
    assert table.get("exp", torch.float32) is not None
    assert table.get("_softmax", torch.float16).float32_opmath is True


# -- the simulation reading the table -----------------------------------------------------------
def _spread(fn, x, kernels):
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        out = fn(x)
    recording = recorder.finish()
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    sim = simulate_rounding(recording.graph, {node.name: reference}, SimulationOptions(samples=29, kernels=kernels),
                            {node.name: out.dtype})
    return sim.spreads[node.name], RoundingSpread.of_simulation(sim.spreads[node.name], reference.numpy(), "float32")


def test_an_unmeasured_library_op_gets_the_conservative_bound_and_is_named():
    x = torch.linspace(0.5, 2.0, 64)
    raw, spread = _spread(torch.erf, x, KernelTable({}, "no measured table"))
    assert raw.unmeasured == ["aten.erf"]
    measured = KernelTable({"erf": {"float32": kernel_errors.KernelError(0.6, 100, 1, None, 0.0)}}, "test")
    raw_measured, narrow = _spread(torch.erf, x, measured)
    assert raw_measured.unmeasured == []
    assert float(np.median(narrow.sigma / spread.sigma)) < 0.5  # 4 u instead of 16 u


def test_a_measured_opmath_keeps_an_fp16_norm_finite():
    """linalg.vector_norm of half inputs accumulates in float32 on CPU: 300² overflows fp16
    but not the kernel, so the simulation must not overflow either."""
    x = torch.full((10,), 300.0, dtype=torch.float16)
    spread, _ = _spread(torch.linalg.vector_norm, x, kernel_table("cpu"))
    assert spread.status == "judged"
    assert int(spread.nonfinite) == 1  # every replay finite


def _fp16_cumsum_spread(opmath: bool | None):
    """An fp16 cumsum of 4,000 terms simulated with a table that measured its kernel adding in
    float32 (True), in half (False), or not at all (None, on a device whose unmeasured kernels
    may add in half); with the half-sequential cumsum such a kernel gives."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4000, generator=g).half()
    ops = {} if opmath is None else {"cumsum": {"float16": kernel_errors.KernelError(1.0, 400, 10, opmath, None)}}
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        out = torch.cumsum(x, 0)
    recording = recorder.finish()
    node = recorder.lookup(out)
    reference = replay_fp64(recording.graph, {node.name}, 60).values[node.name]
    options = SimulationOptions(samples=29, kernels=KernelTable(ops, "test"), half_accumulation=opmath is None)
    sim = simulate_rounding(recording.graph, {node.name: reference}, options, {node.name: out.dtype})
    spread = RoundingSpread.of_simulation(sim.spreads[node.name], reference.numpy(), "float16")
    half_sequential = np.cumsum(x.numpy(), dtype=np.float16)  # numpy rounds every partial sum to half
    z = np.abs(half_sequential.astype(np.float64) - reference.numpy()) / np.maximum(spread.sigma, 1e-300)
    return spread, z


def test_a_kernel_measured_adding_in_half_widens_its_reductions_spread():
    """CUDA's fp16 cumsum scans in half (measured on an H200): a table saying so makes the
    simulation add in half, so that kernel's result lies inside its spread. With float32 opmath
    the same result is far outside (the gh-180150 cumsum was called a bug on CUDA that way);
    a device's unmeasured reduction is given half accumulation too."""
    wide, z_half = _fp16_cumsum_spread(False)
    narrow, z_float = _fp16_cumsum_spread(True)
    unmeasured, z_unmeasured = _fp16_cumsum_spread(None)
    assert float(np.median(wide.sigma[1:] / narrow.sigma[1:])) > 10  # [0]: one term, nothing added
    assert float(np.quantile(z_half, 0.99)) < 4 and float(np.quantile(z_unmeasured, 0.99)) < 4
    assert float(np.quantile(z_float, 0.5)) > 10
    cuda = KernelTable.load("cuda", None, torch.__version__)
    assert cuda.get("cumsum", torch.float16).float32_opmath is False  # the shipped H200 measurement


def test_a_float32_cumsum_on_the_cpu_adds_in_double():
    """The CPU's float32 cumsum keeps its running sum in double and rounds each output once:
    its own result is inside a spread of about one rounding, and a float32 scan of the same
    terms (each partial sum rounded, as a kernel adding in float32 gives) is far outside. The
    spread of a device whose kernel may add in any order (CUDA) keeps the float32 walk."""
    from conftest import recorded

    x = torch.rand(20000, generator=torch.Generator().manual_seed(1))
    graph, wanted, dtypes, out = recorded(lambda t: torch.cumsum(t, 0), x)
    (name, reference), = wanted.items()
    float32_scan = np.cumsum(x.numpy(), dtype=np.float32)

    def z(any_order: bool) -> tuple[np.ndarray, np.ndarray]:
        sim = simulate_rounding(graph, wanted, SimulationOptions(samples=29, any_order=any_order), dtypes)
        sigma = RoundingSpread.of_simulation(sim.spreads[name], reference.numpy(), "float32").sigma
        return [np.abs(np.asarray(v, np.float64) - reference.numpy()) / np.maximum(sigma, 1e-300)
                for v in (out.numpy(), float32_scan)]

    own, scan = z(any_order=False)
    assert float(own.max()) < 4 and float(np.median(scan[1000:])) > 20
    _, scan_any_order = z(any_order=True)
    assert float(np.quantile(scan_any_order, 0.99)) < 4


def test_kernels_are_measured_with_tf32_off_and_the_flags_restored(monkeypatch):
    pytest.importorskip("expecttest")
    seen = {}
    monkeypatch.setattr(kernel_errors, "_run_samples", lambda op_db, *a: seen.update(
        matmul=torch.backends.cuda.matmul.allow_tf32, cudnn=torch.backends.cudnn.allow_tf32) or len(op_db))
    with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=True):
        measure("cpu", ("float32",), ["exp"])
        assert seen == {"matmul": False, "cudnn": False}
        assert torch.backends.cudnn.allow_tf32 is True  # restored


def test_a_time_limited_measurement_keeps_what_it_measured_and_says_how_far_it_came():
    pytest.importorskip("expecttest")
    from torch.testing._internal.common_methods_invocations import op_db

    entry = measure("cpu", ("float32",), None, time_limit=0.0)
    assert entry["ops"] == {} and entry["coverage"].startswith(f"the first 0 of {len(op_db)} OpInfo entries")
    whole = measure("cpu", ("float32",), ["exp"], time_limit=600.0)
    assert "exp" in whole["ops"] and "coverage" not in whole


def test_calibrate_command_writes_this_machines_entry(tmp_path):
    pytest.importorskip("expecttest")
    table = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, "-m", "triage", "calibrate", "--op", "exp", "--dtype", "float32",
                           "--table", str(table)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "aten ops" in done.stdout
    entry = json.loads(table.read_text())["tables"][0]
    assert "exp" in entry["ops"] and entry["torch"] == torch.__version__


@pytest.mark.parametrize("op, extra", [
    (torch.ops.aten.lerp.Scalar, (0.3,)), (torch.ops.aten.lerp.Tensor, ()), (torch.ops.aten.addcmul.default, ()),
    (torch.ops.aten.addcdiv.default, ()), (torch.ops.aten.addcdiv.default, ({"value": -0.7},)),
    (torch.ops.aten.tanh_backward.default, ()), (torch.ops.aten.sigmoid_backward.default, ())])
def test_the_exact_sensitivity_of_a_closed_form_op_is_the_central_differences(monkeypatch, op, extra):
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(64, generator=g, dtype=torch.float64) for _ in range(3))
    if op is torch.ops.aten.tanh_backward.default:  # a gradient and tanh's outputs, some within 1e-6 of ±1
        args = (a, torch.tanh(3 * b).clamp(-1 + 1e-6, 1 - 1e-6))
    elif op is torch.ops.aten.sigmoid_backward.default:
        args = (a, torch.sigmoid(4 * b))
    elif op is torch.ops.aten.lerp.Scalar:
        args = (a, b) + extra
    elif op is torch.ops.aten.lerp.Tensor:
        args = (a, b, torch.rand(64, generator=g, dtype=torch.float64))
    else:
        args = (a, b, c + torch.sign(c))  # a divisor away from 0
    kwargs = extra[0] if extra and isinstance(extra[0], dict) else {}
    exact = kernel_errors.input_sensitivity(op, args, kwargs, torch.float64, a.shape)
    monkeypatch.setattr(kernel_errors, "_closed_form_terms", lambda *_: None)
    differences = kernel_errors.input_sensitivity(op, args, kwargs, torch.float64, a.shape)
    assert torch.allclose(exact, differences, rtol=1e-6, atol=0)


@pytest.mark.parametrize("op, extra", [
    (torch.ops.aten.lerp.Scalar, (0.3,)), (torch.ops.aten.lerp.Tensor, ()), (torch.ops.aten.lerp.Tensor, ("row",)),
    (torch.ops.aten.addcmul.default, ()), (torch.ops.aten.addcdiv.default, ({"value": -0.7},)),
    (torch.ops.aten.addcmul.default, ("row",)), (torch.ops.aten.tanh_backward.default, ())])
def test_the_numpy_conditioning_of_a_small_closed_form_op_is_torchs_bit_for_bit(monkeypatch, op, extra):
    # Half the elements cancel (the start is minus the other terms, up to a few ulp), so both
    # paths find ill-conditioned elements, zeros and well-conditioned ones to tell apart.
    g = torch.Generator().manual_seed(5)
    a, b, c = (torch.randn(4, 64, generator=g, dtype=torch.float64) for _ in range(3))
    c = c + torch.sign(c)  # a divisor away from 0
    if op is torch.ops.aten.lerp.Scalar:
        args, kwargs = (a, b, 0.3), {}
        a[:, ::2] = -b[:, ::2] * 0.3 / 0.7
    elif op is torch.ops.aten.lerp.Tensor:
        w = torch.rand(1, 64, generator=g, dtype=torch.float64) if extra else torch.rand(4, 64, generator=g,
                                                                                         dtype=torch.float64)
        args, kwargs = (a, b, w), {}
        a[:, ::2] = (-b * w / (1 - w))[:, ::2]
    elif op is torch.ops.aten.tanh_backward.default:  # 1 − y² cancels where tanh saturates
        y = torch.tanh(b)
        y[:, ::2] = torch.sign(b[:, ::2]) * (1 - 1e-9)
        args, kwargs = (a, y), {}
    else:
        kwargs = extra[0] if extra and isinstance(extra[0], dict) else {}
        if extra == ("row",):
            c = c[:1]
        args = (a, b, c)
        term = kwargs.get("value", 1) * (b * c if op is torch.ops.aten.addcmul.default else b / c)
        a[:, ::2] = -term[:, ::2]
    a[0, 1] = 0.0
    b[0, 1] = 0.0
    numpy_scale = kernel_errors.ill_conditioned_scale(op, args, kwargs)
    numpy_sloped = kernel_errors.ill_conditioned_scale(op, args, kwargs, 0.25)
    monkeypatch.setattr(kernel_errors, "NUMPY_CONDITIONING_ELEMENTS", 0)
    torch_scale = kernel_errors.ill_conditioned_scale(op, args, kwargs)
    torch_sloped = kernel_errors.ill_conditioned_scale(op, args, kwargs, 0.25)
    assert torch_scale is not None and bool((torch_scale > 0).any()) and bool((torch_scale == 0).any())
    assert numpy_scale is not None and torch.equal(numpy_scale, torch_scale)
    assert torch_sloped is not None and bool((torch_sloped < torch_scale).any())  # the slope's scale is smaller somewhere
    assert numpy_sloped is not None and torch.equal(numpy_sloped, torch_sloped)


@pytest.mark.parametrize("linear", [True, False])
def test_a_broadcast_operand_counts_in_the_sensitivity(monkeypatch, linear):
    """`addcdiv(x[:, None], t1[:, None], t2[None])` with x ≈ −t1/t2: every term cancels against
    another, though no operand has the result's shape. Counted over full-size operands only,
    there was no sensitivity at all, and the calibration scored every element as well
    conditioned: addcdiv's cancellation became a 50 u forward error of the kernel, applied to
    every result (an Adam step's parameters got 100 u of noise for about 1 u of error)."""
    g = torch.Generator().manual_seed(7)
    t1 = torch.randn(6, 1, generator=g, dtype=torch.float64)
    t2 = 1 + 1e-4 * torch.rand(1, 5, generator=g, dtype=torch.float64)
    x = -t1 * (1 + 1e-3)
    if not linear:
        monkeypatch.setattr(kernel_errors, "_closed_form_terms", lambda *_: None)
        monkeypatch.setattr(kernel_errors, "NUMPY_CONDITIONING_ELEMENTS", 0)
    op = torch.ops.aten.addcdiv.default
    f = op(x, t1, t2).abs()
    sensitivity = kernel_errors.input_sensitivity(op, (x, t1, t2), {}, torch.float64, f.shape)
    assert sensitivity is not None and bool((sensitivity > 100 * f).all())
    scale = kernel_errors.ill_conditioned_scale(op, (x, t1, t2), {})
    assert scale is not None and bool((scale > 0).all())


def test_an_operand_broadcasts_to_the_result_by_torchs_rule():
    """The hand-written broadcast check (torch's own costs 60–190 µs, asked for every operand of
    an optimizer's every step) agrees with `torch.broadcast_shapes` on every pair of shapes up
    to three dimensions of sizes 0 to 3."""
    import itertools

    def torchs(shape, result):
        try:
            return tuple(torch.broadcast_shapes(shape, result)) == result
        except RuntimeError:
            return False

    shapes = [s for rank in range(4) for s in itertools.product(range(4), repeat=rank)]
    assert all(kernel_errors._broadcasts_to(torch.Size(a), b) == torchs(a, b) for a in shapes for b in shapes)


def test_a_measurement_of_some_ops_is_merged_into_the_machines_entry_not_put_in_its_place(tmp_path):
    """`triage calibrate --op NAME` replaced this CPU's 256-op entry with the four ops named
    (a new user's run): the simulation then had no measurement for the rest. A partial
    measurement replaces only the op × dtype it measured."""
    path = tmp_path / "table.json"
    base = {"torch": "2.13.0+cpu", "device": "cpu", "capability": "AVX2", "machine": "x86_64", "seconds": 100.0,
            "ops": {"exp": {"float32": {"max_u": 1.0}, "float16": {"max_u": 0.5}}, "sin": {"float32": {"max_u": 1.1}}}}
    kernel_errors.write(base, path)
    again = dict(base, seconds=2.0, ops={"exp": {"float32": {"max_u": 3.0}}})
    kernel_errors.write(again, path, partial=True)
    entry, = json.loads(path.read_text())["tables"]
    assert entry["ops"] == {"exp": {"float32": {"max_u": 3.0}, "float16": {"max_u": 0.5}}, "sin": {"float32": {"max_u": 1.1}}}
    assert "merged" in entry["coverage"]
    kernel_errors.write(dict(base, ops={"cos": {"float32": {"max_u": 1.0}}}), path)  # a full one replaces
    assert list(json.loads(path.read_text())["tables"][0]["ops"]) == ["cos"]


def test_a_flat_slope_keeps_the_inputs_scale():
    """`logit(x, eps=0.51)` clamps every x to [0.51, 0.49]: its slope in x is 0, and says nothing
    of the kernel's error, which `log(p / (1 − p))` at p = 0.49 makes about u of its result's
    scale (gh-177839's vectorized and scalar kernels disagree there in sign). The slope's scale
    applies only where the function has a slope (softplus at −18: 2.7e-7 against |x| = 18)."""
    op = torch.ops.aten.logit.default
    x = torch.full((8,), 0.3, dtype=torch.float64)
    flat = kernel_errors.ill_conditioned_scale(op, (x, 0.51), {}, slope_ratio=0.5)
    assert flat is not None and torch.equal(flat, kernel_errors.ill_conditioned_scale(op, (x, 0.51), {}))
    softplus, far_left = torch.ops.aten.softplus.default, torch.full((8,), -18.0, dtype=torch.float64)
    sloped = kernel_errors.ill_conditioned_scale(softplus, (far_left,), {}, slope_ratio=0.5)
    assert sloped is not None and bool((sloped < 1e-6).all())
    assert bool((kernel_errors.ill_conditioned_scale(softplus, (far_left,), {}) == 18).all())
