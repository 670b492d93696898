"""compare + classify on hand-built ArmRuns: each rung of the ladder, without subprocesses."""
import dataclasses
import hashlib
import math

import numpy as np
import pytest

from triage.classify.ladder import classify
from triage.compare import compare
from triage.model import ArmRun, Observable, Repro
from triage.worker.protocol import DIFFERENCE_CLAIM

REPRO = Repro(path="/x/repro.py", name="repro.py", source="")


def fp(v: np.ndarray, dtype: str = "float32") -> dict:
    v = np.asarray(v)
    finite = v[np.isfinite(v)]
    return {"shape": list(v.shape), "dtype": dtype, "numel": int(v.size),
            "sha256": hashlib.sha256(v.tobytes() + dtype.encode()).hexdigest()[:24],
            "nan": int(np.isnan(v).sum()), "posinf": int(np.isposinf(v).sum()), "neginf": int(np.isneginf(v).sum()),
            "min": float(finite.min()) if finite.size else None, "max": float(finite.max()) if finite.size else None,
            "norm": None, "sample": [float(x) for x in v.reshape(-1)[:6]]}


def obs(i, value, ref, kind="call", label="Model() call #1", dtype="float32", ancestors=(0,), claim=None, cond=()):
    value = np.asarray(value, dtype=np.float16 if dtype == "float16" else np.float32)
    ref = np.asarray(ref, dtype=np.float64)
    return Observable(index=i, kind=kind, label=label, line=10 + i, fingerprint=fp(value, dtype),
                      reference={"fingerprint": fp(ref, "float64"), "note": None, "approximate": False},
                      ancestors=list(ancestors), claim=claim, conditioning=list(cond), value=value, reference_value=ref)


LEAF = {"index": 0, "kind": "input", "op": None, "line": 3, "fingerprint": {"shape": [3], "dtype": "float32", "sha256": "aa"}}


def arm(spec, observables, status="ok", leaves=(LEAF,), conditioning=(), exception=None, mode="eager"):
    return ArmRun(spec=spec, device="cpu", mode=mode, status=status, observables=list(observables),
                  leaves=list(leaves), conditioning=list(conditioning), exception=exception,
                  failure=None if status == "ok" else "RuntimeError at line 4: boom")


def verdict(*runs):
    return classify(REPRO, compare(list(runs)))


def test_bitwise_equal_arms_are_not_reproduced():
    v = verdict(arm("cpu", [obs(0, [1, 2], [1, 2])]), arm("cuda", [obs(0, [1, 2], [1, 2])]))
    assert v.kind == "not-reproduced"


def test_within_tolerance_is_expected_rounding():
    v = verdict(arm("cpu", [obs(0, [1.0, 2.0], [1, 2])]), arm("cuda", [obs(0, [1.0000001, 2.0], [1, 2])]))
    assert (v.kind, v.expected) == ("expected-rounding", True)


def test_one_arm_far_from_float64_is_likely_bug():
    v = verdict(arm("cpu", [obs(0, [1.0, 2.0], [1, 2])]), arm("cuda", [obs(0, [1.5, 2.0], [1, 2])]))
    assert (v.kind, v.expected) == ("likely-bug", False) and "`cuda`" in v.summary


def test_one_value_far_from_float64_whose_rounding_was_not_simulated_is_no_claim():
    """gh-158310 on a busy machine: a correct fp16 LogSoftmax of inputs near -20,000 (float16's
    spacing there is 16), its rounding not simulated (over budget), was "far from the float64
    value … neither rounding nor an ill-conditioned input explains it": `likely-bug`. The per-op
    figures flag what they model, not what a chain of fp16 ops accumulates; without the spread
    no claim, and the reason is said. Two arms, one of them near float64, still decide."""
    budget = "one replay of its 17 ops takes 39.63 s: 9 samples do not fit the 60 s budget"
    o = obs(0, [-304.0, -0.0004], [-302.566, -0.0002], dtype="float16", label="LogSoftmax() call #1")
    o.rounding = {"status": "not-judged", "reason": budget}
    v = verdict(arm("cpu", [o]))
    assert (v.kind, v.expected) == ("inconclusive", None), v.summary
    assert budget in v.summary and "`--rounding-budget`" in v.summary and "float16" in v.summary
    # Its -inf where float64 is finite (the reporter's value): no claim either.
    flipped = obs(0, [-np.inf, -0.0004], [-302.566, -0.0002], dtype="float16", label="LogSoftmax() call #1")
    flipped.rounding = {"status": "not-judged", "reason": budget}
    v = verdict(arm("cpu", [flipped]))
    assert (v.kind, v.expected) == ("inconclusive", None) and "1 non-finite element(s)" in v.summary, v.summary
    near = obs(0, [-302.5, -0.0002], [-302.566, -0.0002], dtype="float16", label="LogSoftmax() call #1")
    near.rounding = {"status": "not-judged", "reason": budget}
    v = verdict(arm("cuda", [near]), arm("cpu", [o]))
    assert (v.kind, v.expected) == ("likely-bug", False) and "`cpu`" in v.summary, v.summary


def test_inf_on_one_arm_only_is_a_nonfinite_flip_naming_the_wrong_arm():
    v = verdict(arm("cpu", [obs(0, [52.9], [52.9])]), arm("cpu/compile", [obs(0, [np.inf], [52.9])], mode="compile"))
    assert (v.kind, v.expected) == ("nonfinite-flip", False)
    assert "agrees with `cpu`" in v.summary


def test_inf_beyond_the_dtype_range_is_expected_overflow():
    fp16 = obs(0, [np.inf], [693147.6], kind="readback", label=".item()", dtype="float16")
    fp32 = obs(1, [693147.6], [693147.6], kind="readback", label=".item()")
    v = verdict(arm("cpu", [fp16, fp32]))
    assert (v.kind, v.expected, v.policy_section) == ("nonfinite-flip", True, "Extremal values")


def test_two_finite_values_of_a_singular_logdet_are_ill_conditioned_not_a_conflict():
    # Seen on an H200: the CPU and CUDA arms' logdet of a rank-1 matrix, -114.6 and -108.3,
    # whose replays are finite in some roundings and -inf in others (a tight finite cluster).
    def judged(value):
        o = obs(0, [value], [-np.inf], kind="readback", label="`cpu_log.item()`")
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": [1.0] * 29, "flips": [],
                      "precision": "float32", "unmeasured": []}
        o.spread = {"sig": np.array([1e-5]), "up": np.array([-114.585]), "dn": np.array([-114.585]),
                    "mu": np.array([-114.585]), "sd": np.array([1e-5]), "nf": np.array([1 | 4], np.uint8)}
        return o

    v = verdict(arm("cpu", [judged(-114.585)]), arm("cuda", [judged(-108.34)]))
    assert (v.kind, v.expected, v.conflicts) == ("expected-ill-conditioned", True, []), v.summary
    assert "not finite under some of its simulated roundings" in v.summary and "around 0" not in v.summary


def test_a_compiled_sum_in_the_directed_envelope_names_inductors_order_not_a_generic_example():
    """nu23's c01: `((pred - target) ** 2).sum()` over 1M float32 terms, eager against
    `torch.compile`: the compiled total lies outside the unbiased spread but inside the
    envelope. The order to name is inductor's generated reduction, not "such as stagnation
    in a long running sum"."""
    def judged(value, spec, mode="eager"):
        o = obs(0, [value], [2097568.18], kind="readback", label="`compiled`")
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": list(np.linspace(0.0, 2.0, 29)),
                      "flips": [], "precision": "float32", "unmeasured": []}
        o.spread = {"sig": np.array([0.16]), "up": np.array([2097571.0]), "dn": np.array([2097565.0]),
                    "mu": np.array([2097568.18]), "sd": np.array([1e-3]), "nf": np.array([1], np.uint8)}
        return arm(spec, [o], mode=mode)

    v = verdict(judged(2097568.0, "cpu"), judged(2097567.0, "cpu/compile", "compile"))
    assert (v.kind, v.expected) == ("expected-rounding", True), v.summary
    assert "inside the envelope" in v.summary and "order a reduction differently" in v.summary, v.summary
    assert "stagnation in a long running sum" not in v.summary


def _count(value, reference, sigma, flips):
    """A count (int64) observed at exit, with the spread its simulated roundings gave."""
    o = Observable(index=0, kind="readback", label="`(a != b).sum().item()`", line=13,
                   fingerprint=fp(np.array([value], dtype=np.int64), "int64"),
                   reference={"fingerprint": fp(np.array([reference], dtype=np.int64), "int64"), "note": None,
                              "approximate": False},
                   ancestors=[0], value=np.array([value], dtype=np.int64),
                   reference_value=np.array([reference], dtype=np.float64))
    o.rounding = {"status": "judged", "samples": 29, "sample_stats": list(np.linspace(0.99, 1.01, 29) if sigma else np.zeros(29)), "flips": flips,
                  "precision": "float32", "unmeasured": []}
    o.spread = {"sig": np.array([sigma]), "up": np.array([float(reference)]), "dn": np.array([float(reference)]),
                "mu": np.array([float(reference) + sigma]), "sd": np.array([sigma / 100]), "nf": np.array([1], np.uint8)}
    return o


def test_a_count_rounding_decides_is_expected_rounding_and_one_it_does_not_is_a_bug():
    ne = [{"node": "ne", "op": "aten.ne", "line": 13, "replays": 11, "of": 11}]
    v = verdict(arm("cpu", [_count(33419, 195, 33200.0, ne)]))
    assert (v.kind, v.expected) == ("expected-rounding", True), v.summary
    assert "`aten.ne` (line 13) decides otherwise than the replay rounded to nearest in 11 of 11" in v.summary and "one outcome of many" in v.summary
    # The same count where no rounding moves it (every replay gives float64's): outside, a bug.
    v = verdict(arm("cpu", [_count(33419, 195, 0.0, [])]))
    assert (v.kind, v.expected) == ("likely-bug", False), v.summary


def test_a_nonfinite_flip_is_explained_by_the_notes_of_its_nonfinite_side():
    # gh-44350: one line's var of fp16 40000s (finite) and of float32 3e38s (inf).
    squares = {"op": "var", "line": 25, "shape": [3], "dtype": "float16", "kind": "intermediate-overflow",
               "ill_conditioned": True, "overflow": True, "singular": False, "node": "a",
               "figure": "max |x| = 4e+04, so x² = 1.6e+09 exceeds the largest float16"}
    total = dict(squares, dtype="float32", node="b",
                 figure="the sum of its terms reaches 9e+38, beyond the largest float32 (3.4e+38)")
    half = obs(0, [0.0], [0.0], kind="readback", label="`c`", dtype="float16", cond=[0])
    single = obs(1, [np.inf], [0.0], kind="readback", label="`c`", cond=[1])
    v = verdict(arm("cpu", [half, single], conditioning=[squares, total]))
    assert (v.kind, v.expected, v.policy_section) == ("nonfinite-flip", True, "Extremal values"), v.summary
    assert "the sum of its terms reaches 9e+38" in v.summary and "x² = 1.6e+09" not in v.summary


def test_singular_matrix_makes_a_finite_answer_rounding_noise():
    note = {"op": "_linalg_slogdet", "line": 17, "shape": [4, 4], "dtype": "float32", "cond": 1.8e49, "rank": 1,
            "order": 4, "singular": True, "ill_conditioned": True, "exact_singular": True, "node": "n"}
    run = arm("cpu", [obs(0, [-114.58], [-np.inf], cond=[0])], conditioning=[note])
    v = verdict(run)
    assert (v.kind, v.expected) == ("nonfinite-flip", True) and "singular" in v.summary


def test_singular_matrix_whose_minus_inf_agrees_is_ill_conditioned_on_one_arm():
    note = {"op": "_linalg_slogdet", "line": 17, "shape": [4, 4], "dtype": "float32", "cond": 1e30, "rank": 1,
            "order": 4, "singular": True, "ill_conditioned": True, "exact_singular": True, "node": "n"}
    v = verdict(arm("cpu", [obs(0, [-np.inf], [-np.inf], cond=[0])], conditioning=[note]))
    assert (v.kind, v.expected) == ("expected-ill-conditioned", True) and "agrees with the float64 reference" in v.summary


def test_failure_on_every_arm_is_could_not_run():
    exc = {"type": "RuntimeError", "message": "boom", "claim": False, "line": 4, "traceback": ""}
    v = verdict(arm("cpu", [], status="raised", exception=exc), arm("cuda", [], status="raised", exception=exc))
    assert v.kind == "could-not-run" and "the same way" in v.summary


def test_failure_on_one_arm_is_crash_one_arm():
    exc = {"type": "InductorError", "message": "boom", "claim": False, "line": 4, "traceback": ""}
    v = verdict(arm("cpu", [obs(0, [1], [1])]), arm("cpu/compile", [], status="raised", exception=exc, mode="compile"))
    assert (v.kind, v.expected) == ("crash-one-arm", False) and "`cpu/compile` fails" in v.summary


def test_the_scripts_own_failed_assert_is_a_result_not_a_crash():
    exc = {"type": "AssertionError", "message": "", "claim": True, "line": 9, "traceback": ""}
    v = verdict(arm("cpu", [obs(0, [1], [1])], status="raised", exception=exc),
                arm("cpu/compile", [obs(0, [1], [1])], status="raised", exception=exc))
    assert v.kind == "not-reproduced"


def test_claim_operands_from_different_random_draws_are_nondeterministic():
    leaves = [dict(LEAF), {"index": 1, "kind": "random", "op": "uniform_", "line": 5, "fingerprint": {"shape": [2, 4], "sha256": "b"}},
              {"index": 2, "kind": "random", "op": "uniform_", "line": 5, "fingerprint": {"shape": [2, 4], "sha256": "c"}}]
    a = obs(0, [0.3], [0.3], kind="claim", label="torch.allclose operand 1", ancestors=(0, 1),
            claim={"id": 0, "func": "torch.allclose", "operand": 0, "holds": False})
    b = obs(1, [0.9], [0.9], kind="claim", label="torch.allclose operand 2", ancestors=(0, 2),
            claim={"id": 0, "func": "torch.allclose", "operand": 1, "holds": False})
    v = verdict(arm("cpu", [a, b], leaves=leaves))
    assert (v.kind, v.expected) == ("nondeterministic", True) and "uniform_" in v.summary


def test_single_arm_agreeing_with_float64_is_not_reproduced():
    v = verdict(arm("cpu", [obs(0, [1.0, 2.0], [1.0000000001, 2.0])]))
    assert v.kind == "not-reproduced" and "agrees with the float64" in v.summary


def test_misaligned_observables_are_reported():
    c = compare([arm("cpu", [obs(0, [1], [1], label="A() call #1")]), arm("cuda", [obs(0, [1], [1], label="B() call #1")])])
    assert c.aligned == 0 and "alignment broke" in c.alignment_note


# -- the rungs added for "why it diverges" -----------------------------------------------------
SETTINGS = {"num_threads": 2, "deterministic": False, "mkldnn": True}


def call(i, value, training=True, layers=(), settings=SETTINGS, weights=0, reference=None):
    o = obs(i, value, value if reference is None else reference, label=f"Net() call #{i + 1}")
    o.module = {"instance": 0, "variable": "net", "training": training, "train_layers": list(layers),
                "inputs": ["same-digest"], "weights_version": weights, "settings": dict(settings)}
    return o


DROPOUT = {"path": "block.drop", "type": "Dropout", "effect": "zeroes a random 0.5 of its inputs on every call"}


def test_claim_operands_a_module_in_training_mode_drew_apart_name_its_layer_and_fix():
    """Two losses of one module called twice under `no_grad`, its dropout in training mode: the
    differing leaf is dropout's `bernoulli_`, and the verdict names the layer by path and the
    `.eval()` of the module's variable (it said "call model.eval()" and named no module)."""
    leaves = [dict(LEAF), {"index": 1, "kind": "random", "op": "bernoulli_", "line": 12, "fingerprint": {"shape": [64, 32], "sha256": "b"}},
              {"index": 2, "kind": "random", "op": "bernoulli_", "line": 13, "fingerprint": {"shape": [64, 32], "sha256": "c"}}]
    first, second = call(2, [0.5], layers=[DROPOUT]), call(3, [0.5], layers=[DROPOUT])
    a = obs(0, [1.1], [1.1], kind="claim", label="torch.equal operand 1", ancestors=(0, 1),
            claim={"id": 0, "func": "torch.equal", "operand": 0, "holds": False})
    b = obs(1, [1.2], [1.2], kind="claim", label="torch.equal operand 2", ancestors=(0, 2),
            claim={"id": 0, "func": "torch.equal", "operand": 1, "holds": False})
    v = verdict(arm("cpu", [first, second, a, b], leaves=leaves))
    assert (v.kind, v.expected) == ("nondeterministic", True), v.summary
    assert "`net` is in training mode, and `net.block.drop` (Dropout) draws new numbers on every call" in v.summary
    assert "call `net.eval()` before comparing" in v.summary


def test_train_mode_layer_between_two_calls_is_nondeterministic_with_the_fix():
    v = verdict(arm("cpu", [call(0, [1.0, 0.0], layers=[DROPOUT]), call(1, [0.5, 0.5], training=False)]))
    assert (v.kind, v.expected) == ("nondeterministic", True)
    assert "`net.block.drop` (Dropout)" in v.summary and "`net.eval()`" in v.summary
    assert "training mode, the second in eval mode" in v.summary


def test_a_setting_changed_between_two_calls_is_a_precision_mode():
    v = verdict(arm("cpu", [call(0, [1.0, 2.0]), call(1, [1.0000001, 2.0], settings=dict(SETTINGS, num_threads=6))]))
    assert (v.kind, v.expected) == ("expected-precision-mode", True)
    assert "`torch.set_num_threads(2)` → `torch.set_num_threads(6)`" in v.summary


def test_changed_weights_are_not_a_repeat():
    v = verdict(arm("cpu", [call(0, [1.0, 2.0]), call(1, [1.5, 2.0], weights=3)]))
    assert v.kind == "not-reproduced"  # an optimizer step in between: a different computation


def test_unexplained_repeat_points_at_a_nondeterministic_kernel():
    # One op sequence on the same inputs: one float64 replay for both calls.
    v = verdict(arm("cpu", [call(0, [1.0, 2.0], training=False, reference=[1.2, 2.0]),
                            call(1, [1.5, 2.0], training=False, reference=[1.2, 2.0])]))
    assert (v.kind, v.expected) == ("nondeterministic", None) and "deterministic=on" in v.summary


def test_a_repeat_whose_float64_replays_differ_is_not_a_nondeterministic_kernel():
    # The calls computed different things (a keyword argument, a cache outside the parameters).
    v = verdict(arm("cpu", [call(0, [1.0, 2.0], training=False), call(1, [1.5, 2.0], training=False)]))
    assert v.kind != "nondeterministic" and "nondeterministic run to run" not in v.summary


def test_float64_replays_a_few_float64_roundings_apart_are_one_computation():
    """MKL's float64 GEMM rounds with its buffers' alignment: two float64 replays of one
    computation may differ in their last bits, and two calls that only drew apart so are still
    one computation on the same inputs (a nondeterministic kernel), not two."""
    ulp = [1.2 + 2.0 ** -52, 2.0]
    v = verdict(arm("cpu", [call(0, [1.0, 2.0], training=False, reference=[1.2, 2.0]),
                            call(1, [1.5, 2.0], training=False, reference=ulp)]))
    assert (v.kind, v.expected) == ("nondeterministic", None) and "deterministic=on" in v.summary
    apart = [1.2 * (1 + 1e-9), 2.0]  # float32's rounding of a formula's difference is far wider
    v = verdict(arm("cpu", [call(0, [1.0, 2.0], training=False, reference=[1.2, 2.0]),
                            call(1, [1.5, 2.0], training=False, reference=apart)]))
    assert v.kind != "nondeterministic"


def test_an_agreeing_ablation_names_the_cause():
    from triage.model import Ablation

    runs = [arm("cpu", [obs(0, [1.0, 2.0], [1, 2])]), arm("cpu/threads=1", [obs(0, [1.0000001, 2.0], [1, 2])])]
    agree = Ablation(switch="threads=1", arms=["cpu/threads=1", "cpu/threads=1"], outcome="agree-bitwise",
                     detail="the two sides are bit-identical", section="Numerical accuracy (introduction)",
                     setting="torch.set_num_threads(1)", supports="expected-precision-mode")
    v = classify(REPRO, compare(runs), [agree])
    assert (v.kind, v.expected) == ("expected-precision-mode", True) and "the reduction order" in v.summary
    still = Ablation(**{**agree.__dict__, "outcome": "still-diverges"})
    assert classify(REPRO, compare(runs), [still]).kind == "expected-rounding"


def test_signed_zero_only():
    v = verdict(arm("cpu", [obs(0, [-0.0], [0.0])]), arm("cpu/compile", [obs(0, [0.0], [0.0])], mode="compile"))
    assert v.kind == "expected-rounding" and "sign of a zero" in v.summary


def test_one_unseeded_run_among_reseeded_ones():
    def leaf(i, draws, call_line):
        return {"index": i, "kind": "random", "op": "uniform_", "line": 16, "call_line": call_line,
                "fingerprint": {"shape": [5, 10], "sha256": f"s{draws}"}, "seed": {"line": 9, "value": 42, "draws": draws}}

    run = arm("cpu", [obs(0, [1.0], [1.0], kind="readback", label="format")],
              leaves=[leaf(0, 0, 37), leaf(1, 0, 38), leaf(2, 3, 39)])
    repro = Repro(path="/x/r.py", name="r.py", source="\n" * 38 + "w3 = train()\n")
    v = classify(repro, compare([run]))
    assert v.kind == "nondeterministic" and "line 39 (`w3 = train()`)" in v.summary


def test_an_arm_that_cannot_run_here_is_never_a_pass():
    missing = ArmRun(spec="cuda", device="cuda", mode="eager", status="unavailable",
                     failure="no CUDA device is available to this torch build on this machine")
    v = verdict(arm("cpu", [obs(0, [1, 2], [1, 2])]), missing)
    assert v.kind == "could-not-run" and v.kind != "not-reproduced"
    assert "Not tested here" in v.summary and "--arms cpu,cuda" in v.summary
    assert "`cpu`" in v.summary  # what did run is still said


@pytest.mark.parametrize("message", ["Invalid device id", "CUDA error: invalid device ordinal",
                                     "No CUDA GPUs are available"])
def test_a_gpu_arm_whose_script_addresses_a_gpu_not_here_did_not_run_and_is_no_crash(message):
    # gh-183402 on one GPU: the script sets CUDA_VISIBLE_DEVICES=1 for its reporter's second GPU.
    lacking = ArmRun(spec="cuda", device="cuda", mode="eager", status="raised",
                     failure=f"AssertionError at line 7: {message}",
                     exception={"type": "AssertionError", "message": message, "line": 7})
    v = verdict(arm("cpu", [obs(0, [1, 2], [1, 2])]), lacking)
    assert v.kind == "could-not-run" and "Not tested here" in v.summary, v.summary
    assert "a CUDA device this machine does not have" in v.summary
    # The same message from a CPU arm, or another error from the GPU arm, is a crash.
    other = dataclasses.replace(lacking, exception={"type": "RuntimeError", "message": "CUDA error: an illegal "
                                                    "memory access was encountered", "line": 7})
    assert verdict(arm("cpu", [obs(0, [1, 2], [1, 2])]), other).kind == "crash-one-arm"
    on_cpu = dataclasses.replace(lacking, spec="cpu/compile", device="cpu", mode="compile")
    assert verdict(arm("cpu", [obs(0, [1, 2], [1, 2])]), on_cpu).kind == "crash-one-arm"


def test_leaves_pair_by_identity_not_position():
    from triage.compare import pair_leaves

    def leaf(i, kind, line, sha):
        return {"index": i, "kind": kind, "op": "uniform_", "line": line,
                "fingerprint": {"shape": [4], "dtype": "float32", "sha256": sha}}

    eager = [leaf(0, "random", 12, "w"), leaf(1, "random", 13, "b")]
    # The compile arm records the same weights after an extra leaf (a transposed copy).
    compiled = [leaf(0, "compiled", 20, "wT"), leaf(1, "random", 13, "b"), leaf(2, "random", 12, "w")]
    assert all(not differs for _, _, differs in pair_leaves(eager, compiled))
    redrawn = [leaf(0, "random", 12, "other"), leaf(1, "random", 13, "b")]
    [(x, y, differs)] = [p for p in pair_leaves(eager, redrawn) if p[2]]
    assert x["line"] == 12 and y["fingerprint"]["sha256"] == "other"


def test_nothing_diverging_from_an_ill_conditioned_matrix_says_what_another_machine_may_give():
    # inv of a 3×3 with cond 1e6 agrees with float64 here; a reporter's host may not: said,
    # with the figure, and the accuracy note's linear-algebra section.
    note = {"op": "linalg_inv_ex", "line": 7, "shape": [3, 3], "dtype": "float32", "cond": 1.0e6, "rank": 3,
            "order": 3, "singular": False, "ill_conditioned": True, "exact_singular": None, "eps": 2.0 ** -23,
            "node": "n"}
    v = verdict(arm("cpu", [obs(0, [1.0, 2.0], [1.0, 2.0], cond=[0])], conditioning=[note]))
    assert v.kind == "not-reproduced" and v.expected is None
    assert "cond = 1e+06" in v.summary and "cond·u = 0.06" in v.summary and "linalg_inv_ex" in v.summary
    assert "linear algebra" in v.policy_section.lower() and any("linalg_inv_ex" in e for e in v.evidence)
    singular = dict(note, op="_linalg_det", singular=True, exact_singular=True, rank=2, cond=3e16)
    v = verdict(arm("cpu", [obs(0, [0.0], [0.0], cond=[0])], conditioning=[singular]))
    assert v.kind == "not-reproduced" and "exactly 0 in rational arithmetic" in v.summary
    assert "no reliable digit" in v.summary
    # A well-conditioned matrix, or one that feeds no observed value, adds nothing.
    calm = dict(note, cond=3.0, ill_conditioned=False)
    for run in (arm("cpu", [obs(0, [1.0], [1.0], cond=[0])], conditioning=[calm]),
                arm("cpu", [obs(0, [1.0], [1.0])], conditioning=[note])):
        v = verdict(run)
        assert v.kind == "not-reproduced" and "need not agree" not in v.summary


def test_why_two_compared_values_round_apart_is_said_from_the_facts():
    from triage.classify.wording import rounding_cause
    from triage.model import Divergence, Side

    def divergence(dtypes=("float32", "float32"), paths=None, source="claim"):
        a, b = (Side(arm="cpu", observable=i, label=f"`{n}`", line=8 + i, dtype=t, summary="1 (x)")
                for i, (n, t) in enumerate(zip(("total", "chunked"), dtypes, strict=True)))
        return Divergence(source=source, observable_label="`total` vs `chunked`", line=13, a=a, b=b, dtype=dtypes[0],
                          bitwise_equal=False, within_tolerance=True, rtol=1.3e-6, atol=1e-5, max_abs_diff=0.03,
                          nonfinite_mismatch=0, numel=1, paths=paths)

    flags = {"num_threads": 2, "mkldnn_enabled": True}
    run = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok", flags_start=flags, flags_end=flags)
    assert rounding_cause(divergence(), run) == ""  # nothing to say beyond rounding
    text = rounding_cause(divergence(("float32", "bfloat16")), run)
    assert "`chunked` in bfloat16" in text and "8-bit significand" in text
    parted = {"only_a": [{"op": "aten.sum.default", "line": 8}], "only_a_count": 1,
              "only_b": [{"op": "aten.sum.dim_IntList", "line": 9}], "only_b_count": 1}
    text = rounding_cause(divergence(paths=parted), run)
    assert "different operations" in text and "`aten.sum.dim_IntList` (line 9)" in text
    # The same steps at two precisions: named so, not as other operations.
    same = dict(parted, precisions={"a": "float32", "b": "float64"})
    text = rounding_cause(divergence(paths=same), run)
    assert "same operations at different precisions (`total` computed in float32, `chunked` in float64)" in text
    assert "different operations" not in text
    threads = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok", flags_start=flags,
                     flags_end=dict(flags, num_threads=1))
    text = rounding_cause(divergence(), threads)
    assert "torch.set_num_threads(2)` at the start" in text and "torch.set_num_threads(1)` at the end" in text
    assert rounding_cause(divergence(("float32", "bfloat16"), source="arms"), threads) == ""  # arms: their own cause
    # The script sets the thread count before each of two sums and ends where it began: the
    # call between the lines computing the two values is named, a `with` block's restore on
    # its own line is not, and a call outside the two lines says nothing.
    calls = [{"setter": "set_num_threads", "value": 1, "line": 6}, {"setter": "set_num_threads", "value": 2, "line": 8},
             {"setter": "_set_mkldnn_enabled", "value": False, "line": 8},
             {"setter": "_set_mkldnn_enabled", "value": True, "line": 8}]
    switching = ArmRun(spec="cpu", device="cpu", mode="eager", status="ok", flags_start=flags, flags_end=flags,
                       knob_calls=calls)
    placed = divergence()
    placed.computed_at = (7, 9)
    text = rounding_cause(placed, switching)
    assert ("`torch.set_num_threads(2)` at line 8, `torch.backends.mkldnn.enabled = False` at line 8, after `total` "
            "(line 7) and before `chunked` (line 9)") in text, text
    assert "set_num_threads(1)" not in text and "enabled = True" not in text
    placed.computed_at = (9, 12)
    assert rounding_cause(placed, switching) == ""


def test_two_indices_that_differ_are_counted_not_measured():
    """Indices (topk's of float16 and float32 scores) differ in which, not by how much: "by 28
    (beyond int64 tolerance)" read an index as a magnitude."""
    from triage.classify.wording import difference_text, digits_text
    from triage.model import Divergence, Judgement, Side

    a, b = (Side(arm="cpu", observable=i, label=f"`{n}`", line=11, dtype="int64", summary="2279")
            for i, n in enumerate(("idx32", "idx16")))
    d = Divergence(source="claim", observable_label="`idx32` vs `idx16`", line=11, a=a, b=b, dtype="int64",
                   bitwise_equal=False, within_tolerance=False, rtol=0.0, atol=0.0, max_abs_diff=28.0,
                   nonfinite_mismatch=0, numel=160, differing=2)
    assert difference_text(d) == ("differs between `idx32` and `idx16` (arm `cpu`) in 2 of 160 elements (int64: "
                                  "compared exactly)")
    j = Judgement(arm="cpu", observable=1, label="`idx16`", line=11, dtype="int64", status="judged", digits=16.0)
    assert digits_text([j]) == ""


def test_why_two_arms_round_apart_is_said_from_their_specs():
    from triage.classify.wording import rounding_cause
    from triage.model import Divergence, Side

    def between(a, b):
        sides = [Side(arm=arm, observable=0, label="`y`", line=9, dtype="float32", summary="1 (x)") for arm in (a, b)]
        return rounding_cause(Divergence(source="arms", observable_label="`y`", line=9, a=sides[0], b=sides[1],
                                         dtype="float32", bitwise_equal=False, within_tolerance=True, rtol=1.3e-6,
                                         atol=1e-5, max_abs_diff=1e-7, nonfinite_mismatch=0, numel=1), None)

    assert "`cpu/compile` runs inductor's compiled graph, whose generated kernels fuse" in between("cpu", "cpu/compile")
    assert "split across threads" in between("cpu", "cpu/threads=1")
    assert "oneDNN" in between("cpu/mkldnn=off", "cpu")
    assert "different devices" in between("cpu", "cuda")
    assert "torch 2.15.0" in between("cpu/compile", "cpu/compile@2.15.0")
    assert "`cpu/compile=aot_eager` runs aot_eager's compiled graph." in between("cpu", "cpu/compile=aot_eager")
    assert between("cpu", "cpu") == "" and between("cuda:0", "cuda:1") == ""


def test_nothing_diverging_from_cancelling_terms_says_so_under_the_general_section():
    note = {"op": "cumsum", "line": 9, "shape": [500000], "dtype": "float16", "kind": "cancellation",
            "figure": "Σ|x| / |Σx| = 285: the terms cancel", "ill_conditioned": True, "node": "n"}
    v = verdict(arm("cpu", [obs(0, [1.0], [1.0], cond=[0])], conditioning=[note]))
    assert v.kind == "not-reproduced" and "`cumsum` at line 9 is ill-conditioned (Σ|x| / |Σx| = 285" in v.summary
    assert "LAPACK" not in v.summary and "linear algebra" not in v.policy_section.lower()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_bit_identical_gpu_named_values_say_where_they_were_computed(device):
    """New user m24: `out_gpu` computed by `.cuda()` calls that ran on the CPU arm (no GPU here)
    is bit-identical to `out_cpu`; "moving a tensor between devices copies its bits" was false
    there. On a CUDA arm, the device move is what makes them equal."""
    values = [0.25, 0.5]
    run = arm(device, [obs(0, values, values, kind="final", label="`out_cpu` at exit"),
                       obs(1, values, values, kind="final", label="`out_gpu` at exit")])
    run.device = device
    v = verdict(run)
    assert v.kind == "not-reproduced" and "bit-identical" in v.summary, v.summary
    if device == "cpu":
        assert "both were computed on `cpu`" in v.summary and "copies its bits" not in v.summary
    else:
        assert "copies its bits exactly" in v.summary


def test_without_a_spread_two_sides_whose_float64_values_part_are_not_called_rounding():
    """A new user's GELU with erf(x/1.414) against F.gelu, with the simulation unavailable:
    each side is within 4e-7 of its own float64 value, so dynamo's rule passed and the verdict
    was expected-rounding, while the two float64 values differ by 4.4e-5."""
    def operand(i, value, ref):
        return obs(i, [value], [ref], kind="claim", label=f"operand {i}",
                   claim={"id": 0, "func": "torch.testing.assert_close", "operand": i, "holds": False})

    v = verdict(arm("cpu", [operand(0, 0.10004, 0.1000443), operand(1, 0.1, 0.1000000015)]))
    assert (v.kind, v.expected) == ("inconclusive", None), v.summary
    assert "the float64 values of the two sides themselves differ by up to 4.43e-05" in v.summary
    # One quantity rounded twice (the float64 values agree): rounding, as before.
    v = verdict(arm("cpu", [operand(0, 0.1000001, 0.1), operand(1, 0.1, 0.1)]))
    assert (v.kind, v.expected) == ("expected-rounding", True), v.summary


def test_two_readbacks_the_script_compares_as_python_numbers_are_a_pair():
    """`e32.item() == e64.item()`: no tensor op shows the worker that comparison, and the two
    values' float64 replays differ (float32's linspace is another leaf), so nothing paired
    them and a printed `equal: False` stood against "nothing diverges"."""
    source = "\n" * 10 + "print('equal:', e32.item() == e64.item())\n"

    def readback(i, value, ref, dtype, spelled):
        o = obs(i, [value], [ref], kind="readback", label=".item()", dtype=dtype)
        o.line, o.expression = 11, spelled
        return o

    runs = [arm("cpu", [readback(0, 0.4997, 0.49970001, "float32", "e32.item()"),
                        readback(1, 0.49970003, 0.49970003, "float64", "e64.item()")])]
    c = compare(runs, source)
    assert c.divergence is not None and c.divergence.how == "==", c.divergence
    assert c.divergence.observable_label == "`e32.item()` vs `e64.item()` (`==`)"
    # A spelling the source does not have on that line pairs nothing.
    runs[0].observables[1].expression = "forged.item()"
    runs[0].observables[1].name = None
    forged = compare(runs, source).divergence
    assert forged is None or forged.how != "=="


def test_an_asserted_comparison_of_two_indices_heads_before_a_printed_pair_of_values():
    """`assert i32.item() == i16.item()` fails (a thirtieth new user's kthvalue indices, float32
    against float16), after a print of the values `v32.item()`, `v16.item()`: the verdict
    explained the printed values and never the failing check, since Python's `==` of two
    numbers leaves no record that it failed. The AssertionError at its line does."""
    source = ("\n" * 7 + "print(v32.item(), i32.item())\nprint(v16.item(), i16.item())\n"
              "assert i32.item() == i16.item()\n")

    def readback(i, value, ref, dtype, spelled, line):
        o = obs(i, [value], [ref], kind="readback", label=".item()", dtype=dtype)
        o.line, o.expression = line, spelled
        if dtype == "int64":
            o.fingerprint["dtype"] = "int64"
        return o

    def runs(raised):
        exception = {"type": "AssertionError", "line": 10, "claim": True, "message": ""} if raised else None
        return [arm("cpu", [readback(0, 0.5, 0.5, "float32", "v32.item()", 8),
                            readback(1, 1000.0, 1000.0, "int64", "i32.item()", 8),
                            readback(2, 0.5005, 0.5, "float16", "v16.item()", 9),
                            readback(3, 1001.0, 1001.0, "int64", "i16.item()", 9),
                            readback(4, 1000.0, 1000.0, "int64", "i32.item()", 10),
                            readback(5, 1001.0, 1001.0, "int64", "i16.item()", 10)], exception=exception)]

    d = compare(runs(True), source).divergence
    assert (d.line, d.how) == (10, "=="), d.observable_label
    # Without the failing assert the printed values head, as before.
    assert compare(runs(False), source).divergence.a.dtype.startswith("float")


def test_a_compile_arm_that_compiled_nothing_is_not_the_comparison_asked_for():
    """`--arms cpu,cpu/compile` on a script that never calls torch.compile: the compile arm
    runs the eager program again, and its agreement was "does not reproduce here"."""
    def runs(compiled):
        compiled_arm = arm("cpu/compile", [obs(0, [1, 2], [1, 2])], mode="compile")
        compiled_arm.graph = {"nodes": 3, "leaves": 1, "compiled_graphs": compiled}
        return arm("cpu", [obs(0, [1, 2], [1, 2])]), compiled_arm

    v = verdict(*runs(0))
    assert v.kind == "could-not-run" and "did not compile anything" in v.summary, v.summary
    assert "Compile the model or function in the script" in v.summary
    assert verdict(*runs(1)).kind == "not-reproduced"


def _checked_determinant(conditioning):
    """A float32 determinant printed and checked with `== 0.0` (which fails), inside its own
    rounding spread around the float64 replay's 0."""
    source = "import torch\nA = torch.ones(5, 5)\nd = torch.linalg.det(A)\nprint(d.item())\nassert d.item() == 0.0\n"
    o = obs(0, [6.7e-9], [0.0], kind="readback", label="`d.item()`", cond=[0] if conditioning else ())
    o.line, o.name = 5, "`d.item()`"
    o.rounding = {"status": "judged", "samples": 9, "sample_stats": [0.5] * 9}
    o.spread = {"sig": np.array([2.5e-6]), "up": np.array([4e-6]), "dn": np.array([-4e-6]), "mu": np.array([1e-7]),
                "sd": np.array([2.5e-6]), "nf": np.array([1], np.uint8)}
    exc = {"type": "AssertionError", "message": "", "claim": True, "line": 5, "traceback": ""}
    run = arm("cpu", [o], status="raised", exception=exc, conditioning=conditioning)
    return classify(Repro(path="/x/repro.py", name="repro.py", source=source), compare([run]))


def test_an_exact_check_of_a_singular_determinant_names_the_matrix():
    """`assert det == 0.0` on an exactly singular matrix: rounding lands next to the exact 0,
    and the matrix's singularity (rank in rational arithmetic) is why every digit is noise.
    The distance from 0 is the value itself, not "inf ulp"."""
    plain = _checked_determinant(())
    assert plain.kind == "expected-rounding" and "6.7e-09 from 0.0" in plain.summary and "ulp" not in plain.summary
    note = {"op": "_linalg_det", "line": 3, "shape": [5, 5], "order": 5, "dtype": "float32", "cond": 3e17,
            "singular": True, "exact_singular": True, "rank": 3, "exact_rank": 3, "ill_conditioned": True}
    v = _checked_determinant([note])
    assert (v.kind, v.expected) == ("expected-ill-conditioned", True), v.summary
    assert "The matrix fed to `_linalg_det` at line 3 is singular" in v.summary and "isclose" in v.summary


def test_uninitialized_reads_repeated_in_a_loop_are_named_once_beside_the_failed_check():
    """Three calls of one padded-buffer sum, all reading `torch.empty`'s bytes, then the
    script's `assert r == 10.0` failing on them: one expression with its count, and not
    "nothing diverges here" beside the garbage the script just rejected."""
    empty = {"index": 1, "kind": "uninitialized", "op": "empty", "line": 3,
             "fingerprint": {"shape": [1000], "dtype": "float32", "sha256": "bb"}}
    reads = [obs(i, [v], [v], label=".item()", ancestors=(1,)) for i, v in enumerate([2.4e34, -9.3e30, -14127.0])]
    for o in reads:
        o.line, o.uninitialized = 9, True
    failed = {"type": "AssertionError", "line": 11, "claim": True, "message": ""}
    v = verdict(arm("cpu", reads, status="raised", leaves=(LEAF, empty), exception=failed))
    assert v.kind == "nondeterministic", v.summary
    assert ".item() (line 9, 3 calls) read memory that `torch.empty` at line 3 leaves uninitialized" in v.summary
    assert "the script's own check at line 11 failed on the bytes this run read" in v.summary, v.summary
    assert "nothing diverges" not in v.summary


def test_a_tolerance_met_only_through_atol_says_how_far_apart_the_values_are():
    """1 - cos(x) of tiny x against 2 sin²(x/2): 2e-8 apart, 'within float32 tolerance' by
    atol = 1e-5 alone, while relatively the values are 100% apart."""
    c = compare([arm("cpu", [obs(0, [2e-7, 3e-7], [1e-7, 3e-7])]), arm("cuda", [obs(0, [1e-7, 3e-7], [1e-7, 3e-7])])])
    assert c.divergence.within_tolerance and c.divergence.hidden_by_atol == pytest.approx(0.5)
    v = classify(REPRO, c)
    assert "only through atol: relatively 50% apart" in v.summary, v.summary
    c = compare([arm("cpu", [obs(0, [1.0000001, 1.0], [1, 1])]), arm("cuda", [obs(0, [1.0, 1.0], [1, 1])])])
    assert c.divergence.within_tolerance and c.divergence.hidden_by_atol is None
    # A near-zero element among O(1) ones is what atol is for: nothing hidden.
    c = compare([arm("cpu", [obs(0, [2e-7, 1.0, 2.0], [1e-7, 1, 2])]), arm("cuda", [obs(0, [1e-7, 1.0, 2.0], [1e-7, 1, 2])])])
    assert c.divergence.within_tolerance and c.divergence.hidden_by_atol is None


def test_random_draws_are_listed_once_per_op_and_line_with_their_calls():
    """A DataLoader's `random_` and `randperm` drawn for each of two training runs: one line per
    op, naming both calls (the evidence repeated 'for the call at line 25' four times)."""
    from triage.classify.ladder import _draw_lines

    draws = [{"op": op, "line": 18, "call_line": call} for call in (25, 26) for op in ("random_", "randperm")]
    assert _draw_lines(draws + draws) == ["random draw `aten.random_` line 18, for the calls at lines 25, 26",
                                          "random draw `aten.randperm` line 18, for the calls at lines 25, 26"]
    assert _draw_lines([{"op": "normal_", "line": 3, "call_line": None}]) == ["random draw `aten.normal_` line 3"]


def test_uninitialized_memory_is_named_first_whether_or_not_its_bytes_happened_to_match():
    """gh-145266: a value reading both a fresh `uniform_` draw and `torch.empty`'s memory. Whether
    the empty bytes matched between the two calls is the allocator's doing, and the verdict
    named one cause or the other by it; it names both, the uninitialized read first."""
    def leaves(random_bits):
        fp = {"shape": [4], "dtype": "float32"}
        return (LEAF, {"index": 1, "kind": "uninitialized", "op": "empty", "line": 10, "fingerprint": dict(fp, sha256="ee")},
                {"index": 2, "kind": "random", "op": "uniform_", "line": 21, "fingerprint": dict(fp, sha256=random_bits)})
    a = arm("cpu", [obs(0, [1.0, 2.0], [1.0, 2.0], ancestors=(0, 1, 2))], leaves=leaves("r1"))
    b = arm("cpu/compile", [obs(0, [1.5, 2.5], [1.5, 2.5], ancestors=(0, 1, 2))], leaves=leaves("r2"), mode="compile")
    v = verdict(a, b)
    assert v.kind == "nondeterministic", v.summary
    first, second = v.summary.index("`torch.empty` at line 10"), v.summary.index("`aten.uniform_` at line 21")
    assert first < second, v.summary


def test_an_alignment_broken_by_a_compiled_call_says_so():
    # The eager arm sees each module call of a compiled function; the compile arm one call.
    eager = arm("cpu", [obs(0, [1.0], [1.0], label="GRUCell() call #1"), obs(1, [2.0], [2.0], label="GRUCell() call #2")])
    compiled = arm("cpu/compile", [obs(0, [1.0], [1.0], label="GRUCell() call #1"),
                                   obs(1, [2.0], [2.0], label="compiled `run` call #1")], mode="compile")
    note = compare([eager, compiled]).alignment_note
    assert "one compiled call" in note and "control flow" not in note
    branched = arm("cpu/threads=1", [obs(0, [1.0], [1.0], label="GRUCell() call #1"),
                                     obs(1, [2.0], [2.0], label="Linear() call #1")])
    assert "value-dependent control flow?" in compare([eager, branched]).alignment_note


def test_two_error_measures_both_zero_in_float64_are_not_one_quantity():
    # Every error measure of two equal values is 0 in float64: an equal reference says nothing
    # about two measures being the same quantity (a GRU's output and hidden-state differences).
    def measured(i, value, claim_id):
        claim = {"id": claim_id, "func": DIFFERENCE_CLAIM, "holds": None, "measure": i}
        return [obs(i, [value], [0.0], kind="readback", label=".item()"),
                obs(i + 1, [1.0], [1.0], kind="claim", claim=claim | {"operand": 0}),
                obs(i + 2, [1.0], [1.0], kind="claim", claim=claim | {"operand": 1})]
    runs = [arm("cpu", measured(0, 1e-7, 0) + measured(3, 3e-8, 1))]
    assert not [c for c in compare(runs).claims if c["how"] == "implicit"]
    # Two values that are 0 in float64 and not error measures (the determinant of a singular
    # matrix in float32 and in float64) may be one quantity computed two ways.
    zeros = [arm("cpu", [obs(0, [1e-7], [0.0], kind="readback", label=".item()"),
                         obs(1, [3e-8], [0.0], kind="readback", label=".item()")])]
    assert [c for c in compare(zeros).claims if c["how"] == "implicit"]
    same = [arm("cpu", [obs(0, [1.5], [1.25], kind="readback", label=".item()"),
                        obs(1, [1.0], [1.25], kind="readback", label=".item()")])]
    assert [c for c in compare(same).claims if c["how"] == "implicit"]


def test_the_readback_of_an_error_measure_is_judged_as_its_claim_not_against_float64():
    # One arm: the measure `max |a - b|` read back is 1e-3 where float64 gives 0; its claim
    # (a against b) is what the script reports and what is judged, the readback no second value.
    claim = {"id": 0, "func": DIFFERENCE_CLAIM, "holds": None, "measure": 0}
    runs = [arm("cpu", [obs(0, [1e-3], [0.0], kind="readback", label=".item()"),
                        obs(1, [1.0, 2.0], [1.0, 2.0], kind="claim", claim=claim | {"operand": 0}),
                        obs(2, [1.0, 2.001], [1.0, 2.0], kind="claim", claim=claim | {"operand": 1})])]
    c = compare(runs)
    assert c.divergence.source == "claim" and c.divergence.how == DIFFERENCE_CLAIM
    assert c.divergences == 1


def _printed(names_lines, values=((1.0,), (1.5,)), refs=((1.0,), (1.5,)), dtypes=("float32", "float32")):
    observables = []
    for i, ((name, line), value, ref, dtype) in enumerate(zip(names_lines, values, refs, dtypes, strict=True)):
        o = obs(i, list(value), list(ref), kind="readback", label=".item()", dtype=dtype)
        o.name, o.line = f"`{name}`", line
        observables.append(o)
    return compare([arm("cpu", observables)])


@pytest.mark.parametrize("names, paired", [
    ((("lp_ref.item()", 9), ("lp_low.item()", 10)), True),  # one quantity, two versions
    ((("builtin.item()", 17), ("manual.item()", 18)), True),
    ((("out32", 5), ("out64", 6)), True),
    ((("y_cpu", 5), ("y_gpu", 5)), True),
    ((("loss.item()", 9), ("acc.item()", 10)), False),  # two quantities
    ((("x.min()", 9), ("x.max()", 10)), False),
    ((("loss_train", 9), ("loss_val", 10)), False),
    ((("lp_ref.item()", 9), ("lp_low.item()", 14)), False),  # not side by side
    ((("y.sum()", 9), ("y_ref.sum()", 10)), True),
    ((("out", 9), ("ref", 10)), True),
    ((("out[1]", 9), ("out[2]", 10)), False),  # two elements of one value
    ((("run1", 9), ("run2", 10)), True),
    ((("my_softmax(scores)[2]", 10), ("F.softmax(scores, dim=-1)[2]", 11)), True),  # keywords and modules aside
    ((("torch.mean(x, dim=0)", 10), ("torch.mean(x, dim=1)", 11)), False),  # no version told apart
    ((("F.relu(x)", 10), ("F.gelu(x)", 11)), False),
])
def test_two_versions_of_one_quantity_printed_side_by_side_are_compared(names, paired):
    """A reporter prints two values that should agree, one above the other, and compares
    them only by eye (`print(lp_ref.item())`, `print(lp_low.item())`): nothing diverged."""
    c = _printed(names)
    assert bool([x for x in c.claims if x["how"] == "printed"]) == paired
    if paired:
        assert c.divergence.how == "printed"


def test_a_side_nonfinite_in_every_rounding_is_no_evidence_of_another_function():
    """fp16 log-density that overflows to -inf in every rounding, beside its float32 version:
    its float64 value (from fp16-rounded inputs) differs from the float32 side's beyond the
    float32 spread, but a spread of 0 (every rounding -inf) measures nothing: range overflow,
    not a different function."""
    c = _printed((("lp_ref.item()", 9), ("lp_low.item()", 10)), values=((-8.5741e7,), (-math.inf,)),
                 refs=((-8.5741e7,), (-8.5705e7,)), dtypes=("float32", "float16"))
    for o, sig in zip(c.arms[0].observables, (25.0, 0.0), strict=True):
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": [0.5] * 29}
        o.spread = {"sig": np.array([sig]), "up": o.value.astype(np.float64), "dn": o.value.astype(np.float64),
                    "mu": o.value.astype(np.float64), "sd": np.array([sig]),
                    "nf": np.array([1 if np.isfinite(o.value[0]) else 4], np.uint8)}
    v = classify(REPRO, compare(c.arms))
    assert v.kind == "nonfinite-flip" and v.expected, v.summary


@pytest.mark.parametrize("a, b, said", [
    (0.07248, 0.7248, ", by a factor of exactly 10: `mine` = `ref` / 10"),  # a sum over numel, not batch
    (1.5, 0.5, ", by a factor of exactly 3: `mine` = 3 × `ref`"),
    (0.07248, 0.7249, ""),  # a ratio near 10 is no whole factor
    (2.156, 2.543, ""),
    # A loss averaged over all 32 targets against the 21 not ignored: a ratio of small numbers.
    (1.7320508 * 21 / 32, 1.7320508, ", by a factor of exactly 21/32: `mine` = 21/32 × `ref`"),
    (1.7320508 * 0.6562, 1.7320508, ""),  # a ratio near 21/32 is none
])
def test_one_value_against_one_names_a_whole_factor_or_a_ratio_of_small_numbers(a, b, said):
    from triage.classify.wording import difference_shape
    assert difference_shape(np.array([a * 1.0]), np.array([b * 1.0]), ("`mine`", "`ref`")) == said


@pytest.mark.parametrize("change, said", [
    ({"op": "aten.add", "line": 7, "kind": "sign", "argument": "other", "was": "add", "to": "sub",
      "operand": {"op": "aten.mul", "line": 7}},
     "`aten.add` at line 7 adds its second operand (from `aten.mul` at line 7): subtracting it instead, `a` equals "
     "`b` in float64 — the sign is the difference."),
    ({"op": "aten.add", "line": 3, "kind": "dropped", "argument": "other", "was": "add", "to": "without",
      "operand": {"op": "aten.sin", "line": 3}},
     "`aten.add` at line 3 adds a term, its second operand (from `aten.sin` at line 3): without that term, `a` "
     "equals `b` in float64 on this input — that term is where they part: it should not be there, the other side "
     "lacks it, or what it is made of differs"),
    # A step taken away agrees on this input: the other side may undo it there (0.5·d² against
    # 0.5·d²/β at β = 0.5), so the text does not call the step the mistake.
    ({"op": "aten.mul", "line": 13, "kind": "without", "argument": "other", "was": 0.5, "to": None},
     "`aten.mul` at line 13 multiplies by 0.5: without that step, `a` equals `b` in float64 on this input — that step "
     "is where they part: it should not be there, or the other side has a step that undoes it here."),
    ({"op": "aten.mm", "line": 9, "kind": "transposed", "argument": "mat2", "was": False, "to": True,
      "operand": None},
     "`aten.mm` at line 9 takes its `mat2` operand as it is: transposed, `a` equals `b` in float64"),
    ({"op": "aten.slice", "line": 9, "kind": "shifted", "argument": "end", "was": 9, "to": 8, "places": 7,
      "also": [{"op": "aten.slice", "line": 9}] * 6},
     "`aten.slice` at line 9 and the other 6 slices along the same dimension: with each `end` one less, `a` "
     "equals `b` in float64 — an index off by one, in every slice, is the difference."),
    ({"op": "aten.tril", "line": 15, "kind": "triangle", "argument": "diagonal", "was": -1, "to": 1},
     "`aten.tril` at line 15 keeps the lower triangle from diagonal -1: the upper triangle from diagonal 1 instead, "
     "`a` equals `b` in float64 — the mask's triangle is the difference."),
    ({"op": "aten.div", "line": 9, "kind": "without", "argument": "other", "was": 2.0, "to": 1.0,
      "written": {"op": "aten.div_", "line": 5}},
     "`aten.div` at line 9 reads a value that `aten.div_` at line 5 had already changed in place, and `b` reads that "
     "change too: without the step at line 9, `a` equals `b` in float64. The in-place `aten.div_` at line 5 is the "
     "likelier mistake"),
    ({"op": "aten.tril", "line": 4, "kind": "argument", "argument": "diagonal", "was": -1, "to": 0},
     "`aten.tril` at line 4 takes `diagonal=-1`: with `diagonal=0`, `a` equals `b` in float64"),
])
def test_the_one_change_is_said_as_the_mistake_it_points_at(change, said):
    assert said in _change_said(change, "")


def _change_said(change, source):
    from types import SimpleNamespace

    from triage.classify.ladder import _one_change_text

    a, b = SimpleNamespace(label="`a`"), SimpleNamespace(label="`b`")
    found = {id(a): (None, SimpleNamespace(reference={"one_change": change})), id(b): None}
    comparison = SimpleNamespace(find=lambda side: found[id(side)])
    return _one_change_text(comparison, SimpleNamespace(a=a, b=b), source)


def test_a_step_a_library_call_takes_points_at_the_side_that_leaves_it_out():
    """`H_auto = hessian(f)(x)` against a hand-written `diag(3 * x) + A + A.T` for f = Σx³ + xᵀAx:
    without autograd's × 2 (x³'s second derivative 6x is 3x²'s derivative times 2) the two
    agree. Line 2 writes no 2 and no `*`: the step is the library's, and the hand-written side
    likelier drops it. A step its line writes keeps the hedged text."""
    change = {"op": "aten.mul", "line": 2, "kind": "without", "argument": "other", "was": 2.0, "to": None}
    source = "x = torch.randn(6)\nH_auto = hessian(f)(x)  # 2 x 2 blocks\nH_mine = torch.diag(3 * x) + A + A.T\n"
    said = _change_said(change, source)
    assert "a step of the library call on that line" in said and "`b` leaves this step out" in said
    assert "it should not be there" not in said
    written = source.replace("hessian(f)(x)", "2.0 * hessian(f)(x)")
    assert "it should not be there, or the other side has a step that undoes it" in _change_said(change, written)
    assert "it should not be there" in _change_said(change, source.replace("hessian(f)(x)", "hessian(f)(x) * k"))


def test_a_compiled_models_dropout_in_training_mode_is_named_with_the_eval_fix():
    """A model left in training mode compiled and compared with its eager call: its Dropout
    draws a mask on every call, eager or compiled; the fix is `model.eval()`, which
    `fallback_random` alone is not (two eager calls differ too)."""
    dropout = {"path": "2", "type": "Dropout", "effect": "zeroes a random 0.1 of its inputs on every call"}

    def model_call(i, value):
        o = obs(i, value, [1, 2])
        o.module = {"variable": "model", "training": True, "train_layers": [dropout]}
        return o

    eager = arm("cpu", [model_call(0, [1.0, 2.0])])
    compiled = arm("cpu/compile", [model_call(0, [1.5, 2.0])], mode="compile")
    compiled.compiled_random_ops = ["dropout"]
    v = verdict(eager, compiled)
    assert (v.kind, v.expected) == ("nondeterministic", True), v.summary
    assert "because `model` is in training mode: `model.2` (Dropout)" in v.summary
    assert "Fix: call `model.eval()`" in v.summary
    assert "two eager calls differ too" in v.summary
    # The script seeds before each call (nu23's c08): two eager calls draw one mask, and
    # `fallback_random` is a fix too.
    mask = {"shape": [32, 128], "dtype": "float32", "sha256": "0c63d6004699665ff8437540"}
    eager.leaves = [LEAF] + [{"index": i, "kind": "random", "op": "bernoulli_", "line": line, "fingerprint": mask,
                              "seed": {"line": line - 2, "value": 1234, "draws": 0}} for i, line in ((1, 15), (2, 18))]
    v = verdict(eager, compiled)
    assert (v.kind, v.expected) == ("nondeterministic", True), v.summary
    assert "two eager calls differ too" not in v.summary and "two eager calls draw the same numbers" in v.summary
    assert "(`torch.manual_seed(1234)` at lines 13 and 16)" in v.summary
    assert "or set `torch._inductor.config.fallback_random = True` to make the compiled call draw as eager" in v.summary
    # Masks that differ (a seed left alone): the first wording.
    eager.leaves[2] = dict(eager.leaves[2], fingerprint=dict(mask, sha256="ffff"))
    assert "two eager calls differ too" in verdict(eager, compiled).summary
    # The same draws with no module in training mode: inductor's generator, as before.
    compiled.observables[0].module, eager.observables[0].module = {}, {}
    assert "inductor's generator differs from eager's. Compare with" in verdict(eager, compiled).summary


def test_the_indices_a_check_compares_head_the_verdict_before_the_scores_behind_them():
    """`torch.equal(idx32, idx16)` of two top-k results: the check is about the indices, not
    the float16 scores they come from (which also differ from float64, at exit)."""
    scores = obs(0, [1.5, 2.25], [1.51, 2.26], kind="final", label="`scores16` at exit", dtype="float16")
    a = obs(1, [3, 1], [3, 1], kind="claim", label="`idx32`", dtype="int64",
            claim={"id": 0, "func": "torch.equal", "operand": 0, "holds": False})
    b = obs(2, [1, 3], [3, 1], kind="claim", label="`idx16`", dtype="int64",
            claim={"id": 0, "func": "torch.equal", "operand": 1, "holds": False})
    c = compare([arm("cpu", [scores, a, b])])
    assert c.divergence.source == "claim" and {c.divergence.a.label, c.divergence.b.label} == {"`idx32`", "`idx16`"}
    # A boolean the script derives still ranks below the floating value it summarizes.
    a.fingerprint["dtype"] = b.fingerprint["dtype"] = "bool"
    assert compare([arm("cpu", [scores, a, b])]).divergence.a.label == "`scores16` at exit"


def test_a_check_asking_for_less_than_its_dtype_holds_says_so():
    """`assert_close(q32, q64.float(), rtol=1e-8, atol=0)` on float32 values: the difference is
    within float32's tolerance, and the summary says the check's own rtol is below float32's
    unit roundoff (a new user's quantile: the verdict never said the tolerance was the issue)."""
    import torch

    from triage.classify.wording import difference_text
    from triage.worker.observe import _tolerance_of

    def pair(tolerance):
        claim = {"id": 0, "func": "torch.testing.assert_close", "holds": False, "tolerance": tolerance}
        a = obs(0, [1.0, 2.0], [1.0, 2.0], kind="claim", label="operand 1", claim=claim | {"operand": 0})
        b = obs(1, [1.0, 2.0000002], [1.0, 2.0000002], kind="claim", label="operand 2", claim=claim | {"operand": 1})
        return compare([arm("cpu", [a, b])]).divergence

    text = difference_text(pair({"rtol": 1e-8, "atol": 0.0}))
    assert "not within the script's own rtol=1e-08, atol=0: that rtol is below float32's unit roundoff" in text, text
    assert "the script's own" not in difference_text(pair({"rtol": 1e-5, "atol": 1e-8}))  # it holds
    # Tighter than assert_close's float32 defaults (rtol 1.3e-6, atol 1e-5), and failing there.
    text = difference_text(pair({"rtol": 1e-8, "atol": 1e-8}))
    assert "rtol=1e-08, atol=1e-08: that rtol is below float32's unit roundoff" in text, text
    text = difference_text(pair({"rtol": 1e-7, "atol": 1e-8}))
    assert ("not within the script's own rtol=1e-07, atol=1e-08, tighter than `assert_close`'s float32 defaults "
            "(rtol=1.3e-06, atol=1e-05), which it meets") in text, text
    assert "the script's own" not in difference_text(pair(None))
    # What an allclose call asks for: positional, by keyword, or its defaults; equal asks for none.
    x = torch.ones(2)
    assert _tolerance_of(torch.allclose, (x, x, 1e-9, 0.0), {}) == {"rtol": 1e-9, "atol": 0.0}
    assert _tolerance_of(torch.isclose, (x, x), {"atol": 1e-3}) == {"rtol": 1e-5, "atol": 1e-3}
    assert _tolerance_of(torch.allclose, (x, x), {}) == {"rtol": 1e-5, "atol": 1e-8}
    assert _tolerance_of(torch.equal, (x, x), {}) is None


def test_a_check_finer_than_the_precision_a_side_was_computed_at_says_so():
    """A float16 `std` cast to float32 and checked with rtol=1e-5, a bfloat16 group norm cast
    back and checked at `assert_close`'s float32 defaults (a thirtieth new user's s03, s12):
    the values are held in float32, so the check asks for float32's tolerance of a result
    computed at the coarser precision. Said, with that precision's own tolerance."""
    from triage.classify.wording import difference_text
    from triage.model import Judgement

    def pair(tolerance, computed="float16"):
        claim = {"id": 0, "func": "torch.testing.assert_close", "holds": False, "tolerance": tolerance}
        a = obs(0, [2.0039], [2.00387], kind="claim", label="operand 1", claim=claim | {"operand": 0})
        b = obs(1, [2.00387], [2.00387], kind="claim", label="operand 2", claim=claim | {"operand": 1})
        d = compare([arm("cpu", [a, b])]).divergence
        d.judgements = [Judgement(arm="cpu", observable=0, label="`std16.float()`", line=8, dtype=computed,
                                  status="judged", stored="float32"),
                        Judgement(arm="cpu", observable=1, label="`std32`", line=8, dtype="float32", status="judged")]
        return d

    text = difference_text(pair({"rtol": 1e-5, "atol": 1e-5}))
    assert ("`std16.float()` was computed at float16: the check's rtol=1e-05 is below float16's unit roundoff, "
            "0.00049, which no float16 result is promised to meet (`assert_close`'s float16 tolerance is rtol=0.001, "
            "atol=1e-05)") in text, text
    text = difference_text(pair(None, "bfloat16"))
    assert ("the check's rtol=1.3e-06 (`assert_close`'s float32 default, from the dtype the values are held in) is "
            "below bfloat16's unit roundoff") in text, text
    # A check as coarse as the computed precision's rounding: nothing said.
    assert "unit roundoff" not in difference_text(pair({"rtol": 1e-3, "atol": 1e-8}))


def test_a_cancellation_is_said_with_its_typical_loss_and_a_zero_everywhere_is_not_the_figure():
    """A Welford loop's `row - mean` (a thirtieth new user's s14): exactly 0 at every element in
    its first update (the mean is that row), 6.6 digits at its worst and 3.0 at a typical
    element later. The summary said "losing every digit" of a value keeping 4.2."""
    from triage.classify.wording import cancellation_site

    def said(*sites):
        claim = {"id": 0, "func": "torch.equal", "holds": False}
        a = obs(0, [1.0, 2.0], [1.0, 2.0], kind="claim", label="operand 1", claim=claim | {"operand": 0})
        b = obs(1, [1.0, 2.5], [1.0, 2.5], kind="claim", label="operand 2", claim=claim | {"operand": 1})
        a.rounding = {"status": "judged", "cancellations": list(sites)}
        c = compare([arm("cpu", [a, b])])
        return cancellation_site(c, c.divergence)

    zero = {"op": "aten.sub", "line": 12, "kind": "cancels", "digits_lost": "inf", "typical_digits_lost": None}
    later = {"op": "aten.sub", "line": 10, "kind": "cancels", "digits_lost": 6.6, "typical_digits_lost": 3.0}
    assert said(zero, later) == "`aten.sub` at line 10 cancels its operands, losing 6.6 digits at its worst element and 3.0 at a typical one"
    assert said(zero) == "`aten.sub` at line 12 cancels its operands, losing every digit"
    some = dict(zero, typical_digits_lost=2.7)
    assert said(some, later) == ("`aten.sub` at line 12 cancels its operands, losing every digit where they are equal "
                                 "and 2.7 digits at a typical element")
    assert said(dict(later, typical_digits_lost=6.1)) == "`aten.sub` at line 10 cancels its operands, losing 6.6 digits"


def test_two_exact_sides_whose_float64_values_differ_say_so_without_a_warning():
    """An int8 accumulator that wraps against `sum()`: both sides exact (spreads of no width),
    their float64 values apart. The evidence read "inf× their combined width", and NumPy's
    overflow warning leaked from the division."""
    import warnings

    def side(i, values, operand):
        claim = {"id": 0, "func": "torch.equal", "holds": False, "operand": operand}
        o = obs(i, values, values, kind="claim", label=f"operand {operand + 1}", claim=claim)
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": [0.0] * 29, "flips": [],
                      "precision": "int64", "unmeasured": []}
        o.spread = {"sig": np.zeros(2), "up": np.array(values, dtype=np.float64), "dn": np.array(values, dtype=np.float64),
                    "mu": np.array(values, dtype=np.float64), "sd": np.zeros(2), "nf": np.ones(2, np.uint8)}
        return o

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v = verdict(arm("cpu", [side(0, [-24.0, 100.0], 0), side(1, [1000.0, 100.0], 1)]))
    assert v.kind == "likely-bug", v.summary
    line = next(e for e in v.evidence if "their rounding" in e)
    assert "values no rounding moves" in line and "inf" not in line, line


def test_other_operations_round_apart_by_the_order_of_additions_only_where_they_add():
    """`torch.round(x, decimals=2)` against Python's `round`, or an angle through `polar`: no
    addition among the parting ops, where the summary said "floating-point addition is not
    associative" all the same (a new user's two correct scripts)."""
    from triage.classify.wording import _why_orders_differ

    rounding = {"only_a": [{"op": "aten.mul.Tensor"}, {"op": "aten.round.decimals"}], "only_a_count": 2,
                "only_b": [{"op": "aten.div.Tensor"}], "only_b_count": 1}
    assert _why_orders_differ(rounding) == "each operation rounds its own result, and the two sides round at different steps"
    assert _why_orders_differ(dict(rounding, only_b=[{"op": "aten.sum.dim_IntList"}])) \
        == "floating-point addition is not associative"
    # Ops left unlisted may add: the order of additions stays the likely reason.
    assert _why_orders_differ(dict(rounding, only_a_count=12)) == "floating-point addition is not associative"


def _arange_length_run(exception, label="`grid` at exit"):
    """One arm whose `grid` comes from `torch.arange(0.1, 0.4, 0.1)` at line 2, which the worker
    noted: rounding put 4 elements where exact arithmetic gives 3."""
    import torch

    from triage.worker.conditioning import range_length

    note = dict(range_length("arange", 0.1, 0.4, 0.1, 4, torch.float32), node="leaf0", line=2)
    grid = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)
    o = dataclasses.replace(obs(0, grid, grid.astype(np.float64), kind="final", label=label, cond=[0]), line=None)
    return arm("cpu", [o], status="raised", exception=exception, conditioning=[note])


def test_a_check_of_an_arange_length_that_rounding_decided_is_expected_rounding():
    source = "import torch\ngrid = torch.arange(0.1, 0.4, 0.1)\nn = len(grid)\nassert n == 3\n"
    exc = {"type": "AssertionError", "message": "", "claim": True, "line": 4, "traceback": ""}
    v = classify(Repro(path="/x/r.py", name="r.py", source=source), compare([_arange_length_run(exc)], source))
    assert (v.kind, v.expected) == ("expected-rounding", True), v.summary
    assert "3.0000000000000004" in v.summary and "`torch.linspace(0.1, 0.3, 3)`" in v.summary
    # A check of the values, not of the length, is not this rule's (the conflict stays said).
    source = "import torch\ngrid = torch.arange(0.1, 0.4, 0.1)\nn = grid.sum()\nassert n == 3\n"
    v = classify(Repro(path="/x/r.py", name="r.py", source=source), compare([_arange_length_run(exc)], source))
    assert v.kind == "inconclusive", v.summary


def test_a_size_mismatch_at_a_line_reading_such_an_arange_is_expected_rounding():
    source = "import torch\ngrid = torch.arange(0.1, 0.4, 0.1)\nok = torch.allclose(grid, torch.ones(3))\n"
    exc = {"type": "RuntimeError", "claim": False, "line": 3, "traceback": "",
           "message": "The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 0"}
    v = classify(Repro(path="/x/r.py", name="r.py", source=source), compare([_arange_length_run(exc)], source))
    assert (v.kind, v.expected) == ("expected-rounding", True) and "torch stopped the script at line 3" in v.summary
    # Another error at that line is the script's failure to run, as before.
    other = dict(exc, message="expected scalar type Float but found Double")
    v = classify(Repro(path="/x/r.py", name="r.py", source=source), compare([_arange_length_run(other)], source))
    assert v.kind == "could-not-run"


@pytest.mark.parametrize("sd, kind", [
    (0.025, "expected-ill-conditioned"),  # 1.6 digits of float32's 7.2: no accumulation loses that many
    (1e-4, "expected-rounding"),  # 4 digits: what a long accumulation keeps (250,000 terms a bin)
])
def test_a_float32_value_keeping_under_two_digits_is_ill_conditioned_without_a_recorded_figure(sd, kind):
    """A new user's naive inverse filter (an FFT deconvolution dividing by a frequency response
    down to 1.5e-5) kept 1.6 digits at float32 and was "float32's rounding (24-bit
    significand)": with no cancellation or matrix recorded, a wide spread was read as a long
    accumulation's."""
    c = _printed((("rec32", 9), ("rec64", 10)), values=((1.0,), (1.02,)), refs=((1.02,), (1.02,)),
                 dtypes=("float32", "float64"))
    for o, sig in zip(c.arms[0].observables, (sd, 1e-15), strict=True):
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": [0.5] * 29}
        ref = np.array([1.02])
        o.spread = {"sig": np.array([max(sig, 0.02)]), "up": ref + 3 * max(sig, 0.02), "dn": ref - 3 * max(sig, 0.02),
                    "mu": ref, "sd": np.array([sig]), "nf": np.array([1], np.uint8)}
    v = classify(REPRO, compare(c.arms))
    assert (v.kind, v.expected) == (kind, True), v.summary
    if kind == "expected-ill-conditioned":
        assert "No single op recorded explains it" in v.summary


def test_a_wide_spread_resting_on_flipped_decisions_says_so_not_an_amplification():
    """A histogram's counts (a thirtieth new user's `histc` of decimals at bin edges) keep no
    digit: rounding moves values across bin edges. "The computation as a whole amplifies its
    rounding (as a division by values near zero does)" was wrong; the decision is named."""
    c = _printed((("h32", 9), ("h64", 10)), values=((1.0,), (2.0,)), refs=((2.0,), (2.0,)),
                 dtypes=("float32", "float64"))
    for o, sig in zip(c.arms[0].observables, (0.9, 1e-15), strict=True):
        flips = [{"op": "aten.histc", "line": 4, "replays": 11, "of": 11}] if sig > 0.5 else []
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": [0.5] * 29, "flips": flips}
        ref = np.array([2.0])
        o.spread = {"sig": np.array([max(sig, 0.02)]), "up": ref + 3 * max(sig, 0.02), "dn": ref - 3 * max(sig, 0.02),
                    "mu": ref, "sd": np.array([sig]), "nf": np.array([1], np.uint8)}
    v = classify(REPRO, compare(c.arms))
    assert v.kind == "expected-ill-conditioned", v.summary
    assert "No op recorded amplifies its rounding: the value rests on decisions rounding switches — `aten.histc` " \
           "(line 4) decides otherwise" in v.summary, v.summary
    assert "division by values near zero" not in v.summary


def test_one_arm_run_without_a_reference_does_not_claim_it_agrees_with_one():
    """`--no-reference` on one arm: "every observed value agrees with the float64 reference"
    was said of values no reference was computed for."""
    run = arm("cpu", [obs(0, [1.0], [1.0])])
    run.reference = {"status": "off", "seconds": 0.0, "note": None}
    v = classify(REPRO, compare([run]))
    assert v.kind == "not-reproduced" and "without a float64 reference" in v.summary, v.summary
    assert "agrees with the float64" not in v.summary


def test_a_compile_arm_under_the_scripts_own_backend_is_not_said_to_run_inductor():
    """A twenty-fourth new user's x07: a valid backend of the script's rewrote softmax, and the
    rounding sentence said "`cpu/compile` runs inductor's compiled graph, whose generated
    kernels fuse operations"."""
    from triage.classify.wording import _arms_cause

    eager, compiled = arm("cpu", []), arm("cpu/compile", [], mode="compile")
    assert "inductor's compiled graph" in _arms_cause("cpu", "cpu/compile", [eager, compiled])
    compiled.graph = {"backends": [{"name": "lse_backend", "line": 5}]}
    said = _arms_cause("cpu", "cpu/compile", [eager, compiled])
    assert said == " `cpu/compile` runs the graph as the script's own compile backend `lse_backend` rewrites it."


def test_a_bound_on_the_two_sides_difference_below_their_rounding_is_said():
    """A twenty-fourth new user's c05: a bfloat16 cross-entropy of 13.9 against its float32
    value, `assert abs(loss32.item() - loss16.item()) < 1e-4`: rounding, and the verdict did
    not say that the bound asks for less than bfloat16 leaves (its spacing there is 0.0625)."""
    source = ("import torch\n" * 10 + "assert abs(loss32.item() - loss16.item()) < 1e-4, 'bf16 loss differs'\n")

    def side(i, value, dtype, name):
        o = obs(i, [value], [13.9512], kind="claim", label=f"operand {i}", dtype="float32",
                claim={"id": 0, "func": "assert", "operand": i, "holds": False})
        o.line, o.name = 11, f"`{name}`"
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": list(np.linspace(0.1, 2.0, 29)),
                      "flips": [], "precision": dtype, "unmeasured": []}
        sigma = 1e-6 if dtype == "float32" else 0.01
        o.spread = {"sig": np.array([sigma]), "up": np.array([13.9512 + 3 * sigma]),
                    "dn": np.array([13.9512 - 3 * sigma]), "mu": np.array([13.9512]), "sd": np.array([sigma / 10]),
                    "nf": np.array([1], np.uint8)}
        return o

    run = arm("cpu", [side(0, 13.9512, "float32", "loss32.item()"), side(1, 13.955, "bfloat16", "loss16.item()")],
              status="raised", exception={"type": "AssertionError", "message": "", "line": 11, "claim": True})
    v = classify(Repro(path=REPRO.path, name=REPRO.name, source=source), compare([run]))
    assert v.kind == "expected-rounding", v.summary
    assert ("The script's check at line 11 (`abs(loss32.item() - loss16.item()) < 0.0001`) asks the two to agree "
            "within 0.0001; they differ by 0.0038") in v.summary, v.summary


def _read_back(i, label, line, value, reference, dtype, sigma, flips=()):
    """A value the script reads back at `line`, judged inside the spread `sigma` its simulated
    roundings gave (with `flips`: the ops whose comparisons rounding switched)."""
    array = np.asarray(value, dtype=np.int64 if dtype == "int64" else np.float32)
    ref = np.asarray(reference, dtype=np.float64)
    o = Observable(index=i, kind="readback", label=label, line=line, fingerprint=fp(array, dtype),
                   reference={"fingerprint": fp(ref.astype(np.int64) if dtype == "int64" else ref, "float64"),
                              "note": None, "approximate": False},
                   ancestors=[0], value=array, reference_value=ref)
    o.rounding = {"status": "judged", "samples": 29, "sample_stats": list(np.linspace(0.0, 3.0, 29)),
                  "flips": list(flips), "precision": "float32", "unmeasured": []}
    o.spread = {"sig": np.full(ref.shape, sigma), "up": ref + sigma, "dn": ref - sigma, "mu": ref.copy(),
                "sd": np.full(ref.shape, sigma / 100), "nf": np.ones(ref.shape, np.uint8)}
    return o


def test_the_argmaxes_a_script_counts_mismatches_of_are_its_headline_not_the_logits_it_prints():
    """`n = (pred32 != pred16).sum().item(); assert n == 0` after printing one sample's logits
    of both: the check is about the two argmaxes (int64), which rounding alone flips, not the
    printed floats beside it (nu24 c19)."""
    argmax = [{"node": "argmax", "op": "aten.argmax", "line": 12, "replays": 11, "of": 11}]
    run = arm("cpu", [_read_back(0, "`!=` operand 1 in a check", 13, [3, 1], [3, 1], "int64", 1.0),
                      _read_back(1, "`!=` operand 2 in a check", 13, [3, 2], [3, 1], "int64", 1.0, argmax),
                      _read_back(2, "print/repr", 16, [1.0, 2.0], [1.0, 2.0], "float32", 1e-3),
                      _read_back(3, "print/repr", 17, [1.002, 2.0], [1.0, 2.0], "float32", 1e-2)])
    source = "\n" * 12 + "n = (pred32 != pred16).sum().item()\n"
    v = classify(REPRO, compare([run], source))
    assert (v.kind, v.expected) == ("expected-rounding", True), v.summary
    assert v.summary.startswith("`pred32` vs `pred16` (line 13)"), v.summary
    assert "`aten.argmax` (line 12) decides otherwise" in v.summary, v.summary


def test_a_side_keeping_no_digit_where_the_sides_differ_most_is_ill_conditioned():
    """fp16 positional encodings against float32 (nu24 x05): sin of an angle up to 2047 that
    float16 holds to ±0.5 keeps no digit at late positions, where the two differ by 0.78,
    though a typical element keeps several: the conditioning there, not a long sum's rounding."""
    ref = np.array([0.5, -0.25, 0.75, 0.5])
    typical = np.full(4, 1e-6)
    sides = [_read_back(0, "`pe32`", 16, ref, ref, "float32", np.where(np.arange(4) == 3, 1e-3, typical)),
             _read_back(1, "`pe16`", 16, ref + [0, 0, 0, 0.78], ref, "float32", np.where(np.arange(4) == 3, 1.0, typical))]
    for o in sides:
        o.spread["sd"] = o.spread["sig"] / 3  # samples that scatter as far as the value itself at the last element
    v = verdict(arm("cpu", sides))
    assert (v.kind, v.expected) == ("expected-ill-conditioned", True), v.summary
    assert "`cpu` `pe16` keeps no significant digit" in v.summary, v.summary


def test_a_function_ill_conditioned_at_its_inputs_is_the_figure_behind_a_wide_spread():
    """A float16 tanh gradient (nu28 g10): `tanh_backward`'s 1 − y² of a y rounded to 1 keeps
    no digit; the simulation notes the op as amplifying its inputs' rounding, which the
    verdict names as the figure, not "no single op recorded explains it"."""
    ref = np.array([7.07e-2, 2.5e-2, 4.9e-3, 9.9e-4])
    o = _read_back(0, "`x16.grad`", 9, ref * (1 + np.array([0, 0, 0.3, 0.9])), ref, "float16", ref * 0.6)
    o.spread["sd"] = o.spread["sig"] / 2
    o.rounding["cancellations"] = [{"op": "aten.tanh_backward", "line": 9, "kind": "amplifies", "digits_lost": "inf",
                                    "node": "tanh_backward_default", "hint": None}]
    v = verdict(arm("cpu", [o]))
    assert (v.kind, v.expected) == ("expected-ill-conditioned", True), v.summary
    assert "`aten.tanh_backward` at line 9 is ill-conditioned at its inputs" in v.summary, v.summary
    assert "losing every digit" in v.summary


def test_a_norm_of_subnormal_squares_is_the_figure_and_the_extremal_values_section():
    """The gradient of a float32 norm of values near 1e-22 (nu28 g07) keeps 0.4 digits: the
    norm's squares are subnormal (`intermediate-underflow`). That range, not "no single op",
    is the figure, and the accuracy note's section is its extremal values."""
    ref = np.array([1.0])
    o = _read_back(0, "`x.grad.norm().item()`", 13, ref + 0.0083, ref, "float32", np.array([0.12]))
    o.spread["sd"] = o.spread["sig"] / 2
    o.conditioning = [0]
    note = {"op": "linalg_vector_norm", "line": 11, "shape": [16], "dtype": "float32", "singular": False,
            "ill_conditioned": True, "kind": "intermediate-underflow", "node": "n", "cond": None, "rank": None,
            "order": None, "figure": "max |x| = 2.12e-22, so every square x² (at most 4.47e-44) lies below the "
                                     "smallest normal float32 (1.18e-38)"}
    v = verdict(arm("cpu", [o], conditioning=[note]))
    assert (v.kind, v.expected, v.policy_section) == ("expected-ill-conditioned", True, "Extremal values"), v.summary
    assert "`aten.linalg_vector_norm` at line 11, where max |x| = 2.12e-22" in v.summary, v.summary
    assert "No single op recorded explains it" not in v.summary


def test_of_two_cancelling_figures_the_one_leaving_fewer_digits_is_named():
    """A float32 bias after one Adam step where BatchNorm makes its gradient cancel (nu28 g12):
    the forward matmul (recorded first) cancels to Σ|ab|/|Σab| = 2e4, the bias gradient's sum
    over the batch to 4.6e8, which leaves no digit: that one is the figure."""
    ref = np.array([0.0, 0.0, 0.0])
    o = _read_back(0, "`b32`", 30, np.array([7.2e-4, -3e-4, 1e-4]), ref, "float32", np.array([9e-4, 9e-4, 9e-4]))
    o.spread["sd"] = o.spread["sig"] / 2
    o.conditioning = [0, 1]
    base = {"shape": [32], "dtype": "float32", "eps": 1.19e-7, "singular": False, "ill_conditioned": True,
            "kind": "cancellation", "rank": None, "order": None}
    forward = dict(base, op="addmm", line=16, node="addmm", cond=2.06e4, figure="Σ|aᵢbᵢ| / |Σaᵢbᵢ| = 2.06e+04")
    gradient = dict(base, op="sum", line=18, node="sum", cond=4.55e8, figure="Σ|x| / |Σx| = 4.55e+08")
    v = verdict(arm("cpu", [o], conditioning=[forward, gradient]))
    assert (v.kind, v.expected) == ("expected-ill-conditioned", True), v.summary
    assert "`aten.sum` at line 18, where Σ|x| / |Σx| = 4.55e+08" in v.summary and "2.06e+04" not in v.summary


def test_elements_an_absorbing_addition_leaves_no_digit_are_ill_conditioned_whatever_a_typical_one_keeps():
    """`rel = |log(1 + p) - log1p(p)| / log1p(p)` for p down to 1e-9 (nu25 c04): `1 + p` rounds
    p away at the two smallest, where every rounding gives a relative error near 1 and float64
    1e-10; the other elements keep 4 digits. The absorbing addition is the cause, not rounding."""
    ref = np.array([1.1e-13, 6.6e-12, 2e-12, 3e-12, 5.8e-10, 8.3e-8])
    value = np.array([4.66e-5, 1.36e-3, 2.1e-4, 3.3e-4, 0.192, 1.0])
    # Every rounding errs by about the value itself (σ), alike: the samples agree to 4 digits
    # at the larger p and not at all at the two smallest.
    o = _read_back(0, "`rel.tolist()`", 10, value, ref, "float32", value)
    o.spread["mu"] = value.copy()
    o.spread["sd"] = value * np.array([1e-5, 1e-5, 1e-5, 1e-5, 1 / 3, 1 / 3])
    absorbs = {"op": "aten.add", "line": 5, "kind": "absorbs", "digits_lost": "inf", "node": "add",
               "hint": "`torch.log1p(x)` computes `log(1 + x)` without forming 1 + x, so a small x keeps its digits."}
    o.rounding["cancellations"] = [absorbs]
    v = verdict(arm("cpu", [o]))
    assert (v.kind, v.expected) == ("expected-ill-conditioned", True), v.summary
    assert "`aten.add` at line 5 rounds away every digit of its smaller operand" in v.summary and "log1p" in v.summary
    # The same value without the note: no figure, and its typical digits stand.
    o.rounding["cancellations"] = []
    assert verdict(arm("cpu", [o])).kind == "expected-rounding"


def test_inf_no_rounding_gives_on_a_compile_arm_with_the_scripts_backend_names_that_backend():
    """A script backend that rewrites `log_softmax` as `log(softmax(x))` (nu25 c16): +inf the
    recorded computation never reaches under any rounding. The backend is named, as for a
    finite value outside its spread, and no PyTorch correctness label is given."""
    def judged(value, spec, mode="eager"):
        o = obs(0, [value], [4.5], kind="readback", label="`loss`")
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": list(np.linspace(0.0, 2.0, 29)),
                      "flips": [], "precision": "float32", "unmeasured": []}
        o.spread = {"sig": np.array([1e-6]), "up": np.array([4.5000001]), "dn": np.array([4.4999999]),
                    "mu": np.array([4.5]), "sd": np.array([1e-6]), "nf": np.array([1], np.uint8)}
        run = arm(spec, [o], mode=mode)
        if mode == "compile":
            run.graph = {"backends": [{"name": "vendor_backend", "line": 8}]}
        return run

    v = verdict(judged(4.5, "cpu"), judged(np.inf, "cpu/compile", "compile"))
    assert (v.kind, v.expected) == ("nonfinite-flip", False), v.summary
    assert "the script's own compile backend `vendor_backend` (line 8)" in v.summary, v.summary
    assert not any("correctness" in label for label in v.labels)


@pytest.mark.parametrize("reference_error", [1.1e-16, None])
def test_a_float64_gap_within_float64s_own_absorption_is_no_other_function(reference_error):
    """`log(1 + exp(x))` against `torch.log1p(torch.exp(x))` at x = −18, −25, −40: `1 + e⁻⁴⁰` is
    1 in float64 too, so the naive side's float64 value is 0 where the other's is 4.2e-18, and
    at −25 it keeps 5 digits. The gap (up to 1.1e-16) is float64's own rounding where the naive
    side absorbs, u64·|1 + x| (the worker's `reference_error`), not a different function: the
    same function through a formula that loses its digits. A site noted without that figure
    (an older worker) leaves the float64 values exact, and the gap a different function."""
    exact = np.array([1.5229979744712628e-08, 1.3887943864964021e-11, 4.248354255291589e-18])
    naive_ref = np.array([1.5229979744712628e-08 + 5.8e-17, 1.3887943864964021e-11 + 1.1e-16, 0.0])

    def operand(i, value, ref):
        return obs(i, value, ref, kind="claim", label=f"operand {i}",
                   claim={"id": 0, "func": "torch.testing.assert_close", "operand": i, "holds": False})

    run = arm("cpu", [operand(0, np.zeros(3), naive_ref), operand(1, exact, exact)])
    site = {"op": "aten.add", "line": 7, "kind": "absorbs", "digits_lost": math.inf, "hint": None, "node": "add"}
    if reference_error is not None:
        site["reference_error"] = reference_error
    for o, sig, sites in zip(run.observables, (np.zeros(3), 2.0 ** -24 * exact), ([site], []), strict=True):
        o.rounding = {"status": "judged", "samples": 29, "sample_stats": [0.5] * 29, "cancellations": sites}
        o.spread = {"sig": sig, "up": o.value.astype(np.float64), "dn": o.value.astype(np.float64),
                    "mu": o.value.astype(np.float64), "sd": sig, "nf": np.ones(3, np.uint8)}
    v = classify(REPRO, compare([run]))
    if reference_error is None:
        assert v.kind == "likely-bug" and "compute different functions" in v.summary, v.summary
    else:
        assert v.kind != "likely-bug" and "different functions" not in v.summary, v.summary


@pytest.mark.parametrize("factor, said", [
    (1 / 32, "`grad` = `manual` / 32 in every element"),  # cross_entropy's mean over 32 rows
    (4.0, "`grad` = 4 × `manual` in every element"),
    (0.3, "`grad` = 0.3 × `manual` in every element"),
])
def test_a_constant_factor_between_tensors_names_a_whole_divisor(factor, said):
    from triage.classify.wording import difference_shape
    b = np.linspace(-2.0, 3.0, 12) + 0.1
    assert difference_shape(b * factor, b, ("`grad`", "`manual`")) == f", by a constant factor: {said}"



def test_a_matrix_against_its_transpose_is_said_so():
    """A hand-written weight gradient `x.t() @ g_out` where autograd's is `g_out.t() @ x`
    (nu28 g14): square, so the script's comparison runs, and each is the other transposed."""
    from triage.classify.wording import difference_shape
    m = np.arange(16.0).reshape(4, 4) ** 1.5 - 7
    assert "transposed: `g_W` is `W.grad` with its last two dimensions swapped" in difference_shape(
        m.T.copy(), m, ("`g_W`", "`W.grad`"))
    symmetric = m + m.T
    assert "transposed" not in difference_shape(symmetric, symmetric * 1.5, ("`a`", "`b`"))
    assert "transposed" not in difference_shape(m[:, :3].copy(), m[:, 1:].copy(), ("`a`", "`b`"))


@pytest.mark.parametrize("small, large", [(1e-300, 1e300), (1e-160, 1e150)])
def test_a_constant_factor_too_small_to_invert_is_said_as_a_factor(small, large):
    """Ratios that underflow to 0 (1e-300 against 1e300) or whose inverse passes float64's
    range (1e-310) have no whole divisor: said as a factor, not a ZeroDivisionError or an
    OverflowError from triage."""
    from triage.classify.wording import difference_shape
    steps = np.array([1.0, 2.0, 3.0])
    said = difference_shape(small * steps, large * steps, ("`a`", "`b`"))
    assert said.startswith(", by a constant factor: `a` = ") and said.endswith(" × `b` in every element")

def test_the_masking_pitfall_needs_a_mask_in_the_script():
    from triage.classify.facts import masks

    assert masks("y = torch.where(x > 0, torch.log(x), 0)\n")
    assert masks("s = scores.masked_fill(pad, -1e9)\n") and masks("s.masked_fill_(pad, 0)\n")
    assert not masks("d = torch.sqrt(((a - b) ** 2).sum(dim=1))\nnowhere = 1\n")


def test_a_value_below_its_dtypes_smallest_normal_is_said_to_underflow():
    """A float16 gradient of a loss scaled by 1e-8 lies at 1e-8, below float16's smallest normal
    (6.1e-05): its digits go to float16's range, which the explanation says (with the loss
    scale that keeps them), not a cancellation upstream. A normal value gets no such sentence."""
    from types import SimpleNamespace

    from triage.classify.ladder import _underflow

    def case(reference):
        observable = SimpleNamespace(reference_value=np.array(reference))
        c = SimpleNamespace(find=lambda j: (None, observable))
        return _underflow(c, SimpleNamespace(dtype="float16", differ_element=1, label="`w16.grad`"))

    said = case([1e-3, 1.1e-8, 2e-8])
    assert said is not None and said.startswith("`w16.grad`'s float64 value there, 1.1e-08, lies below float16's "
                                                "smallest normal value (6.1e-05)") and "GradScaler" in said, said
    assert case([1e-3, 0.5, 2e-8]) is None and case([1e-3, 0.0, 2e-8]) is None


BATCHNORM = {"path": "bn", "type": "BatchNorm2d",
             "effect": "normalizes with the batch's own statistics and updates running_mean/running_var"}


def test_a_batch_norm_switched_to_eval_between_two_calls_is_not_a_nondeterministic_model():
    """`bn.train(); a = bn(x); bn.eval(); b = bn(x)`: the script compares the two modes on
    purpose, and they are two functions by design (the running variance is the unbiased one).
    "Call bn.eval() before comparing" answered another question; a model left in training mode
    keeps it, and so does dropout."""
    runs = [arm("cpu", [call(0, [1.0, 0.0], layers=[BATCHNORM]), call(1, [0.5, 0.5], training=False)])]
    chosen = Repro(path="/x/repro.py", name="repro.py", source="bn.train()\na = bn(x)\nbn.eval()\nb = bn(x)\n")
    v = classify(chosen, compare(runs))
    assert v.kind != "nondeterministic" and "before comparing" not in v.summary
    # Left in training mode by default (no `.train()` of the script's): the slip, with its fix.
    v = verdict(*runs)
    assert v.kind == "nondeterministic" and "before comparing" in v.summary


def test_an_image_padded_on_one_side_only_is_named_as_a_shift_along_two_dimensions():
    """`F.pad(x, (0, 2, 0, 2))` where `padding=1` pads both sides: the hand-written convolution
    is the library's moved by one row and one column (`mine[i, j] = ref[i + 1, j + 1]` on the
    interior), which the one-axis shift did not see."""
    import numpy as np

    from triage.classify.wording import difference_shape

    ref = np.random.default_rng(0).standard_normal((2, 3, 9, 9))
    mine = np.zeros_like(ref)
    mine[..., :-1, :-1] = ref[..., 1:, 1:]
    text = difference_shape(mine, ref, ("`mine`", "`ref`"))
    assert "along dimensions 2 and 3: `mine[i, j] = ref[i + 1, j + 1]`" in text
    one = np.zeros_like(ref)
    one[..., :-1] = ref[..., 1:]
    assert "along dimension 3: `mine[i] = ref[i + 1]`" in difference_shape(one, ref, ("`mine`", "`ref`"))
