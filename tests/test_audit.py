"""The evidence audit (triage/audit.py): each invariant on hand-built evidence, and the
inconclusive verdict a conflict turns a verdict into."""
import numpy as np
from test_ladder import REPRO, arm, obs

from triage import audit
from triage.audit import Evidence
from triage.classify.ladder import classify
from triage.compare import compare
from triage.model import Judgement, Verdict


def verdict_of(*runs):
    return classify(REPRO, compare(list(runs)))


def plain(kind: str, expected=True) -> Verdict:
    return Verdict(kind=kind, expected=expected, policy_section="", policy_url="", labels=[], summary="s")


# -- printed numbers ------------------------------------------------------------------------
def test_numbers_the_arms_print_differently_withdraw_not_reproduced():
    a = arm("cpu", [obs(0, [1.0], [1.0])])
    b = arm("cpu/compile", [obs(0, [1.0], [1.0])], mode="compile")
    a.stdout, b.stdout = "max_diff: 0.0\n", "max_diff: 1.97\n"
    v = verdict_of(a, b)
    assert (v.kind, v.expected, v.withdrawn) == ("inconclusive", None, "not-reproduced")
    assert v.labels == ["triage review"]
    assert "`cpu` prints `max_diff: 0.0` where `cpu/compile` prints `max_diff: 1.97`" in v.summary
    assert v.conflicts and all(c in " ".join(v.evidence) for c in v.conflicts)


def test_timings_and_equal_numbers_printed_by_the_arms_are_no_conflict():
    a = arm("cpu", [obs(0, [1.0], [1.0])])
    b = arm("cpu/compile", [obs(0, [1.0], [1.0])], mode="compile")
    a.stdout = "eager took 0.51 s\nresult: 3.25\nloss 1e-3\n"
    b.stdout = "eager took 0.77 s\nresult: 3.25\nloss 0.001\n"
    assert verdict_of(a, b).kind == "not-reproduced"


def test_the_script_printing_its_own_comparison_false_withdraws_not_reproduced():
    run = arm("cpu", [obs(0, [1.0], [1.0])])
    run.stdout = "final loss run 1: 0.1201\nfinal loss run 2: 0.1160\nreproducible: False\n"
    v = verdict_of(run)
    assert v.kind == "inconclusive" and "prints `reproducible: False`" in v.summary


def test_a_failed_check_of_one_arm_is_never_every_comparison_holds():
    exc = {"type": "AssertionError", "message": "Expected rank 2, but got 0", "claim": True, "line": 9, "traceback": ""}
    run = arm("cpu", [obs(0, [1.0], [1.0])], status="raised", exception=exc)
    run.exit_note = "the script's own check failed at line 9 (AssertionError: Expected rank 2, but got 0)"
    v = verdict_of(run)
    assert v.kind == "inconclusive" and "Expected rank 2, but got 0" in v.summary
    assert "same kernels" in v.summary and v.withdrawn == "not-reproduced"


# -- the figures a sentence rests on --------------------------------------------------------
def _claim_comparison(gap: float, sigma: float):
    a = obs(0, [1.0, 2.0], [1.0, 2.0], kind="claim", label="`mine`",
            claim={"id": 0, "func": "torch.allclose", "operand": 0, "holds": False})
    b = obs(1, [1.0 + gap, 2.0], [1.0 + gap, 2.0], kind="claim", label="`theirs`",
            claim={"id": 0, "func": "torch.allclose", "operand": 1, "holds": False})
    for o in (a, b):
        o.spread = {"sig": np.full(2, sigma)}
    c = compare([arm("cpu", [a, b])])
    c.divergence.judgements = [Judgement(arm="cpu", observable=i, label=lab, line=10, dtype="float32",
                                         status="judged", zone="inside") for i, lab in ((0, "`mine`"), (1, "`theirs`"))]
    return Evidence(c)


def test_rounding_must_reach_the_difference_it_explains():
    found = audit.rounding_explains_difference(plain("expected-rounding"), _claim_comparison(0.025, 1e-7))
    assert len(found) == 1 and "differ by 0.025 at element 0" in found[0] and "±1e-07" in found[0]


def test_a_difference_inside_the_spreads_is_no_conflict():
    assert audit.rounding_explains_difference(plain("expected-rounding"), _claim_comparison(0.025, 0.01)) == []
    # Other kinds do not say "rounding gives differences this large".
    assert audit.rounding_explains_difference(plain("likely-bug", False), _claim_comparison(0.025, 1e-7)) == []


def test_a_difference_the_directed_replays_reach_is_no_conflict():
    """A distance of points far from the origin, float32 against float64: most samples clamp
    the cancelled square to 0 (σ: its distance to 0), while rounding every op up gives 5.5
    and down 0. A gap of 1.7 is rounding's; beyond the directed replays it is not."""
    e = _claim_comparison(1.7, 0.047)
    a = e.comparison.arms[0].observables[0]
    a.spread.update(up=np.array([5.5, 2.0]), dn=np.array([0.0, 2.0]))
    assert audit.rounding_explains_difference(plain("expected-ill-conditioned"), e) == []
    a.spread.update(up=np.array([1.2, 2.0]), dn=np.array([0.0, 2.0]))
    assert len(audit.rounding_explains_difference(plain("expected-ill-conditioned"), e)) == 1


def test_a_side_computed_in_bfloat16_reaches_two_of_its_roundings():
    """Autocast's `out.float()` is float32 as read and bfloat16 as computed: 1 + 2^-8 beside
    the float32 side is one bfloat16 rounding, though its samples (all rounding to the same
    neighbour) scatter by 1e-7. At float32 precision it stays a conflict."""
    e = _claim_comparison(2.0 ** -8, 1e-7)
    e.comparison.divergence.judgements[0].dtype = "bfloat16"
    assert audit.rounding_explains_difference(plain("expected-rounding"), e) == []
    assert len(audit.rounding_explains_difference(plain("expected-rounding"), _claim_comparison(2.0 ** -8, 1e-7))) == 1


def test_an_element_some_roundings_make_non_finite_bounds_no_difference():
    # The logdet of a singular matrix on two GPUs' arms (-114.6 and -108.3, seen on an H200):
    # the finite replays' spread (±1e-7 here) says nothing, since other replays give -inf.
    e = _claim_comparison(6.24, 1e-7)
    for o in e.comparison.arms[0].observables:
        o.spread["nf"] = np.array([1 | 4, 1], np.uint8)  # element 0: finite in some replays, -inf in others
    assert audit.rounding_explains_difference(plain("expected-ill-conditioned"), e) == []
    for o in e.comparison.arms[0].observables:
        o.spread["nf"] = np.array([1, 1], np.uint8)  # finite in every replay: the difference is a conflict
    assert len(audit.rounding_explains_difference(plain("expected-ill-conditioned"), e)) == 1


def _judged(**kw) -> Judgement:
    base = dict(arm="cpu", observable=0, label=".item()", line=5, dtype="float16", status="judged")
    return Judgement(**{**base, **kw})


def _with_judgement(j: Judgement):
    c = compare([arm("cpu", [obs(0, [1.5], [1.0])])])
    c.divergence.judgements = [j]
    return Evidence(c)


def test_finite_where_every_rounding_is_not_contradicts_an_unstable_decision():
    j = _judged(zone="outside", nonfinite="outside: 1 element(s) finite where every rounding of this computation is not",
                unstable=["1 element(s) are finite under some roundings and not under others"])
    found = audit.finite_claim_consistent(plain("nonfinite-flip", False), _with_judgement(j))
    assert len(found) == 1 and "finite under some roundings" in found[0]
    j.unstable = []
    assert audit.finite_claim_consistent(plain("nonfinite-flip", False), _with_judgement(j)) == []


def test_an_inf_no_rounding_gives_is_no_finite_claim_to_contradict():
    # A faulted logdet of a singular matrix: +inf on the arm, where the replays give -inf or a
    # finite value (their sign's `eq` flips): still a value no rounding gives, no conflict.
    unstable = ["`aten.eq` (line 20) decides otherwise than the replay rounded to nearest in 16 of 31 replays",
                "1 element(s) are finite under some roundings and not under others"]
    j = _judged(zone="outside", nonfinite="outside: 1 element(s) +inf where no rounding of this computation gives +inf",
                unstable=unstable)
    assert audit.finite_claim_consistent(plain("nonfinite-flip", False), _with_judgement(j)) == []
    # A finite claim names the finite-under-some note, not the first unstable line.
    j.nonfinite = "outside: 1 element(s) finite where every rounding of this computation is not"
    found = audit.finite_claim_consistent(plain("nonfinite-flip", False), _with_judgement(j))
    assert len(found) == 1 and found[0].endswith("finite under some roundings and not under others"), found


def test_outside_a_spread_without_digits_or_margin_is_no_finding():
    noise = _judged(zone="outside", digits=0.3, statistic=40.0, max_sample_stat=3.0, p=0.03, samples=29)
    assert "rounding noise" in audit.outside_is_meaningful(plain("likely-bug", False), _with_judgement(noise))[0]
    thin = _judged(zone="outside", digits=6.0, statistic=3.59, max_sample_stat=3.09, p=0.03, samples=29)
    assert "seed can move" in audit.outside_is_meaningful(plain("likely-bug", False), _with_judgement(thin))[0]
    near = _judged(zone="outside", digits=6.0, statistic=6.6, max_sample_stat=3.09, p=0.03, samples=29)
    assert "model of each op's error" in audit.outside_is_meaningful(plain("likely-bug", False), _with_judgement(near))[0]
    clear = _judged(zone="outside", digits=6.0, statistic=40.0, max_sample_stat=3.09, p=0.03, samples=29)
    assert audit.outside_is_meaningful(plain("likely-bug", False), _with_judgement(clear)) == []
    # A difference of two roundings (a computational zero, ±1.3e-6) beside a backend's bfloat16
    # error of 8.5e-3: thousands of times the largest simulated rounding, beyond its noise.
    beyond = _judged(zone="outside", digits=0.4, statistic=6730.0, max_sample_stat=1.45, p=0.03, samples=29)
    assert audit.outside_is_meaningful(plain("likely-bug", False), _with_judgement(beyond)) == []
    zero = _judged(zone="outside", computational_zero=True, statistic=6730.0, max_sample_stat=1.45, p=0.03, samples=29)
    assert audit.outside_is_meaningful(plain("likely-bug", False), _with_judgement(zero)) == []


def test_every_invariant_is_listed_once():
    names = [f.__name__ for f in audit.INVARIANTS]
    assert len(names) == len(set(names)) == 9


def test_a_divergence_the_replayed_graph_does_not_show_is_not_blamed_on_an_arm():
    c = compare([arm("cpu", [obs(0, [1.0, 2.0], [1, 2])]), arm("cpu/threads=2", [obs(0, [1.5, 2.0], [1, 2])])])
    blamed = plain("likely-bug", False)
    quiet = {"arms": ["cpu", "cpu/threads=2"], "hits": 0, "runs": 3, "seen": [], "failed": False,
             "script_backend": False}
    found = audit.replay_shows_the_divergence(blamed, Evidence(c, quiet))
    assert len(found) == 1 and "bitwise-equal values in every one of 3 runs" in found[0]
    assert audit.replay_shows_the_divergence(blamed, Evidence(c, dict(quiet, hits=3))) == []
    assert audit.replay_shows_the_divergence(blamed, Evidence(c, dict(quiet, failed=True))) == []
    assert audit.replay_shows_the_divergence(blamed, Evidence(c, None)) == []
    v = classify(REPRO, c, replay=quiet)
    assert (v.kind, v.withdrawn) == ("inconclusive", "likely-bug")


def test_blame_without_a_reference_or_a_simulation_is_not_a_finding():
    def no_reference(i, value):
        o = obs(i, value, value)
        o.reference, o.reference_value = None, None
        return o

    c = compare([arm("cpu", [no_reference(0, [1.0, 2.0])]), arm("cpu/compile", [no_reference(0, [1.5, 2.0])],
                                                                  mode="compile")])
    v = classify(REPRO, c)
    assert (v.kind, v.withdrawn) == ("inconclusive", "likely-bug") and "no float64 reference" in v.summary
    # With references, the same difference is a finding.
    measured = compare([arm("cpu", [obs(0, [1.0, 2.0], [1, 2])]), arm("cuda", [obs(0, [1.5, 2.0], [1, 2])])])
    assert audit.blame_rests_on_a_measurement(classify(REPRO, measured), Evidence(measured)) == []


def test_rounding_beyond_tolerance_needs_the_sides_computation_replayed():
    """A compiled backward's gradient continues from buffers its fused kernels wrote where
    triage records no ops (`stale` leaves): 'inside its own spread' then vouches only for the
    ops after them, not enough for 'rounding' of two values beyond tolerance."""
    stale = {"index": 1, "kind": "stale", "op": None, "line": 9, "fingerprint": {"shape": [2], "dtype": "float32"}}
    eager = arm("cpu", [obs(0, [1.0, 2.0], [1.0, 2.0])])
    compiled = arm("cpu/compile", [obs(0, [1.5, 2.0], [1.5, 2.0], ancestors=(0, 1))], leaves=(stale,), mode="compile")
    compiled.leaves = [{"index": 0, "kind": "input", "op": None, "line": 3,
                        "fingerprint": {"shape": [3], "dtype": "float32", "sha256": "aa"}}, stale]
    c = compare([eager, compiled])
    c.divergence.judgements = [_judged(arm="cpu", zone="inside"), _judged(arm="cpu/compile", zone="inside")]
    [found] = audit.rounding_covers_the_computation(plain("expected-rounding"), Evidence(c))
    assert found.startswith("`cpu/compile` .item() is called rounding of its own computation, but it continues from 1")
    assert "own backend" not in found
    # The arm compiling with the script's own backend: that backend's graph is where to look.
    compiled.graph = {"backends": [{"name": "fast_math_backend", "line": 6}]}
    [found] = audit.rounding_covers_the_computation(plain("expected-rounding"), Evidence(c))
    assert found.endswith("compiles with the script's own backend `fast_math_backend` (line 6), whose graph those "
                          "values come from: the place to look first"), found
    c.divergence.within_tolerance = True  # the agreement itself then supports it
    assert audit.rounding_covers_the_computation(plain("expected-rounding"), Evidence(c)) == []


def test_a_compiled_side_within_dynamos_rule_is_no_compiler_bug_on_triages_model_alone():
    """A compiled Simpson integral 37.5σ outside triage's model of its compiled computation
    (inductor's `linspace` is 1 ulp off eager's at 1,170 of 20,001 points, and sin at 200 rad
    amplifies it), while within dynamo's float64 rule: the two measures disagree."""
    eager = arm("cpu", [obs(0, [1.0, 2.0], [1.0, 2.0])])
    compiled = arm("cpu/compile", [obs(0, [1.5, 2.0], [1.0, 2.0])], mode="compile")
    c = compare([eager, compiled])
    c.divergence.judgements = [_judged(arm="cpu", zone="inside"),
                               _judged(arm="cpu/compile", zone="outside", statistic=37.5, max_sample_stat=3.75)]
    c.divergence.fp64_rule = "pass: RMSE(cpu/compile .item(), fp64) = 1.86e-06 ≤ 3·RMSE(cpu .item(), fp64) + 0.001/10"
    [found] = audit.compiled_blame_meets_pytorchs_rule(plain("likely-bug", False), Evidence(c))
    assert "outside triage's model of its compiled computation (37.5σ)" in found and "dynamo's float64 rule" in found
    # Past dynamo's rule, or on an eager arm, or through the script's own backend: no conflict.
    c.divergence.fp64_rule = "fail: RMSE(cpu/compile .item(), fp64) = 0.5 > 3·RMSE(cpu .item(), fp64) + 0.001/10"
    assert audit.compiled_blame_meets_pytorchs_rule(plain("likely-bug", False), Evidence(c)) == []
    c.divergence.fp64_rule = "pass: ..."
    compiled.mode = "eager"
    assert audit.compiled_blame_meets_pytorchs_rule(plain("likely-bug", False), Evidence(c)) == []
    compiled.mode, compiled.graph = "compile", {"backends": [{"name": "my_backend", "line": 3}]}
    assert audit.compiled_blame_meets_pytorchs_rule(plain("likely-bug", False), Evidence(c)) == []


def test_a_failing_dynamo_rule_beside_two_sides_inside_their_rounding_says_why_it_fails():
    """An eager/compiled sum 1 ulp apart at 6e5, both inside their own rounding: the evidence
    line read "dynamo float64 rule … fail" with nothing reconciling it with `expected-rounding`."""
    from triage.classify.wording import evidence_lines

    eager = arm("cpu", [obs(0, [1.0, 2.0], [1.0, 2.0])])
    compiled = arm("cpu/compile", [obs(0, [1.5, 2.0], [1.0, 2.0])], mode="compile")
    c = compare([eager, compiled])
    c.divergence.judgements = [_judged(arm="cpu", zone="inside"), _judged(arm="cpu/compile", zone="inside")]
    c.divergence.fp64_rule = "fail: RMSE(cpu/compile .item(), fp64) = 0.214 > 3·RMSE(cpu .item(), fp64) + 0.001/10"
    [line] = [x for x in evidence_lines(c.divergence) if x.startswith("dynamo float64 rule")]
    assert "fails where the other lands much nearer float64 than its rounding need" in line, line
    c.divergence.judgements[1] = _judged(arm="cpu/compile", zone="outside", statistic=9.0, max_sample_stat=3.0)
    [line] = [x for x in evidence_lines(c.divergence) if x.startswith("dynamo float64 rule")]
    assert "lands much nearer" not in line and "the verdict rests on each side's own rounding" in line
