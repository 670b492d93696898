"""The ladder with a reported arm (triage/classify/ladder.py `_with_reported`): what the posted values,
judged, do to the verdict of the runs here. No arm runs here."""
import pytest

from triage import policy
from triage.classify.ladder import _with_reported
from triage.model import Judgement, ReportedArm, ReportedValue, Verdict

HERE_SINGULAR = Verdict(kind="expected-ill-conditioned", expected=True, policy_section=policy.LINALG.title,
                        policy_url=policy.LINALG.url, labels=[policy.LABELS["linalg"]],
                        summary="The matrix is singular.", evidence=["conditioning: rank 1 of 4"])
HERE_AGREES = Verdict(kind="not-reproduced", expected=None, policy_section=policy.NONE.title, policy_url="",
                      labels=[], summary="Nothing diverges here.")


def value(zone, printed="-108.3", here="-inf", device="cuda", same=False, flip=False, racy=(), wide=False):
    j = Judgement(arm="reported", observable=3, label="`gpu_log.item()`", line=29, dtype="float32",
                  status="judged", zone=zone, reference=-1.0, statistic=9.0 if zone == "outside" else 0.5,
                  max_sample_stat=2.0, wide=wide)
    return ReportedValue(printed=printed, record=f"GPU: {printed}", here=here, observable=3, label=j.label, line=29,
                         numbers=1, how="line", same_as_here=same, nonfinite_flip=flip, device=device,
                         order_dependent=list(racy), judgement=j)


def arm(*values, torch="2.1.0+cu121"):
    return ReportedArm(source="the issue body", device="cuda", device_evidence="the script runs on CUDA",
                       model="CUDA's rounding as modelled here", torch=torch, here_torch="2.13.0+cpu",
                       values=list(values))


def test_a_posted_value_inside_keeps_the_explanation_and_says_what_it_rests_on():
    v = _with_reported(HERE_SINGULAR, arm(value("inside", flip=True)))
    assert (v.kind, v.expected) == ("nonfinite-flip", True)
    assert v.summary.startswith("Judged from the numbers the reporter posted") and "The matrix is singular." in v.summary
    assert "module: NaNs and Infs" in v.labels and any("reported `-108.3`" in e for e in v.evidence)


def test_a_gpu_value_outside_is_a_bug_to_confirm_on_a_gpu_never_high_priority():
    v = _with_reported(HERE_AGREES, arm(value("outside", here="1.0")))
    assert v.kind == "likely-bug" and policy.LABELS["gpu_confirmation"] in v.labels
    assert "high priority" not in v.labels and "--arms cpu,cuda" in v.summary


def test_a_gpu_inf_no_rounding_gives_is_a_nonfinite_flip_not_expected():
    v = _with_reported(HERE_AGREES, arm(value("outside", printed="tensor(inf)", here="tensor(1.)", flip=True)))
    assert (v.kind, v.expected) == ("nonfinite-flip", False)
    assert {"module: NaNs and Infs", "needs GPU confirmation"} <= set(v.labels)


def test_outside_through_an_order_dependent_cuda_kernel_is_nondeterminism():
    v = _with_reported(HERE_AGREES, arm(value("outside", here="tensor(0.)", device=None, racy=["aten.scatter"])))
    assert v.kind == "nondeterministic" and "`aten.scatter`" in v.summary


def test_a_cpu_value_outside_that_this_cpu_computes_inside_does_not_reproduce_on_this_release():
    v = _with_reported(HERE_AGREES, arm(value("outside", printed="tensor(-inf)", here="tensor(0.)", device="cpu"),
                                        value("inside", printed="tensor(0.)", here="tensor(0.)", same=True)))
    assert v.kind == "not-reproduced" and "their torch 2.1.0+cu121, here 2.13.0+cpu" in v.summary


def test_a_value_this_machine_printed_too_is_not_evidence_against_either_side():
    v = _with_reported(HERE_AGREES, arm(value("outside", here="-108.3", same=True)))
    assert v.kind == "not-reproduced" and "the posted values are the ones printed here" in v.summary


@pytest.mark.parametrize("wide,kind", [(False, "expected-rounding"), (True, "expected-ill-conditioned")])
def test_a_differing_value_inside_where_nothing_diverges_here_is_rounding(wide, kind):
    v = _with_reported(HERE_AGREES, arm(value("inside", here="-108.2", wide=wide)))
    assert (v.kind, v.expected) == (kind, True)


@pytest.mark.parametrize("kind", ["could-not-run", "crash-one-arm", "nondeterministic", "inconclusive"])
def test_what_the_runs_decide_alone_a_posted_value_does_not_overturn(kind):
    here = Verdict(kind=kind, expected=None, policy_section="", policy_url="", labels=[], summary="s")
    assert _with_reported(here, arm(value("outside"))) is None


def test_nothing_judged_leaves_the_runs_verdict():
    unaligned = ReportedValue(printed="5.59", record="GPU err 5.59", why="no value printed here lines up with it")
    assert _with_reported(HERE_AGREES, arm(unaligned)) is None


def test_an_issue_posts_its_output_as_the_reported_arm_only_where_an_arm_cannot_run_here(monkeypatch):
    """`triage issue`: the body's output is judged where the script uses CUDA and this machine
    has none; a body with no output keeps the runs' verdict (could-not-run where CUDA was asked
    for), and a machine with CUDA runs the CUDA arm instead."""
    from triage import pipeline
    from triage.model import ArmSpec, IssueRepro

    script = "import torch\nprint(torch.ones(2).cuda().sum().item())\n"
    body = IssueRepro(script=script, observed=["2.0"], environment_fields={"PyTorch version": "2.1.0"})
    monkeypatch.setattr(pipeline, "cuda_present", lambda: False)
    posted = pipeline._posted_for_missing_arms(body, [ArmSpec("cpu")])
    assert (posted.text, posted.source, posted.environment["PyTorch version"]) == ("2.0", "the issue body", "2.1.0")
    assert pipeline._posted_for_missing_arms(IssueRepro(script=script), [ArmSpec("cpu")]) is None
    cpu_only = IssueRepro(script="import torch\nprint(torch.ones(2).sum().item())\n", observed=["2.0"])
    assert pipeline._posted_for_missing_arms(cpu_only, [ArmSpec("cpu")]) is None
    monkeypatch.setattr(pipeline, "cuda_present", lambda: True)
    assert pipeline._posted_for_missing_arms(body, [ArmSpec("cpu"), ArmSpec("cuda")]) is None
