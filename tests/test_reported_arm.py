"""The reported arm end to end (triage/reported/): a CUDA report judged on this machine from
the numbers its reporter posted. Every script here uses CUDA, which the arms collapse onto
the CPU, so what is tested holds on any machine without a GPU; with one, `triage issue` runs
the CUDA arm instead and these tests are skipped."""
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, ROOT, SEEDS, run_triage
from triage.arms.spec import cuda_present
from triage.report.data import validate_report

# Under pytest-xdist (--dist loadgroup): the five shared runs (a module fixture) are made once, on
# one worker.
pytestmark = [pytest.mark.skipif(cuda_present(), reason="the reported arm stands in for a CUDA arm this machine lacks"),
              pytest.mark.xdist_group("reported-arm")]

# A sum and a mean of 4097 evenly spaced values in [0, 1]: 2048.5 and 0.5 in exact arithmetic.
SUMS = """import torch
x = torch.linspace(0, 1, 4097, device="cuda")
print("sum:", x.sum().item())
print("mean:", x.mean().item())
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Five runs, shared by the tests: the seed article's logdet with the reporter's output;
    the sums with one posted value inside its spread and one far outside; the same with posted
    text that holds no value; a CPU script whose reporter's CPU printed another mean; the sums
    as a transcript's expressions with the values the reporter saw displayed."""
    base = tmp_path_factory.mktemp("reported")
    script = base / "sums.py"
    script.write_text(SUMS)
    transcript = base / "transcript.py"  # a `>>>` session's code: its expressions display, not print
    transcript.write_text(SUMS.replace('print("sum:", x.sum().item())', "x.sum()").replace(
        'print("mean:", x.mean().item())', "x.mean()"))
    cpu_script = base / "cpu_mean.py"
    cpu_script.write_text(SUMS.replace(', device="cuda"', "").replace('print("sum:", x.sum().item())\n', ""))
    out = {}
    for name, target, posted, arms in [
        # The comparison the reporter made, asked for outright: its CUDA arm cannot run here.
        ("logdet", SEEDS / "logdet_cpu_vs_cuda.py", "CPU logdet: -inf\nGPU logdet: -108.34196472167969\n", "cpu,cuda"),
        ("sums", script, "Warning: something about TF32\nsum: 2048.5\nmean: 0.6000000238418579\n", None),
        ("prose", script, "the GPU gives a different mean, I think\n", None),
        ("cpu", cpu_script, "mean: 0.7\n", None),
        ("transcript", transcript, "tensor(2048.5000, device='cuda:0')\ntensor(0.6000, device='cuda:0')\n", None),
    ]:
        where = base / name
        where.mkdir()
        (where / "posted.txt").write_text(posted)
        out[name] = run_triage(target, arms, where, "--reported", str(where / "posted.txt"), "--minimal", "-",
                               "--no-minimize")
    return out


def test_the_seed_articles_finite_gpu_logdet_is_a_rounding_of_a_singular_matrix(runs):
    """Asked for `cpu,cuda` on a machine without CUDA, the posted GPU value stands in for the
    arm: a verdict (exit 0), not "not tested here" (exit 5)."""
    code, report, comment, output = runs["logdet"]
    assert code == 0 and validate_report(report) == [], output
    v = report["verdict"]
    assert (v["kind"], v["expected"]) == ("nonfinite-flip", True), v["summary"]
    assert v["summary"].startswith("Judged from the numbers the reporter posted") and "singular" in v["summary"]
    gpu = next(x for x in report["reported"]["values"] if x["printed"] == "-108.34196472167969")
    # What this machine printed on the same line: -inf where LU leaves the singular matrix's
    # exact zeros, a finite logdet where it does not (MKL on an Intel CPU: -114.6).
    cpu = next(a for a in report["arms"] if a["spec"] == "cpu")
    assert gpu["how"] == "line" and f"CPU logdet: {gpu['here']}" in cpu["stdout"], (gpu, cpu["stdout"])
    assert gpu["judgement"]["zone"] == "inside"
    assert "**Reported arm**" in comment and "-108." in comment


def test_a_posted_value_no_rounding_gives_is_a_bug_to_confirm_on_a_gpu(runs):
    code, report, comment, output = runs["sums"]
    assert code == 0 and validate_report(report) == [], output
    v = report["verdict"]
    assert v["kind"] == "likely-bug" and "needs GPU confirmation" in v["labels"], v["summary"]
    assert "high priority" not in v["labels"]
    zones = {x["printed"]: (x["judgement"] or {}).get("zone") for x in report["reported"]["values"]}
    assert zones == {"2048.5": "inside", "0.6000000238418579": "outside"}
    assert "judged from the numbers" in v["summary"].lower() and "`x.mean().item()`" in v["summary"]


def test_posted_text_with_no_value_changes_nothing_and_says_so(runs):
    code, report, _, output = runs["prose"]
    assert code == 0 and validate_report(report) == [], output
    assert report["reported"]["values"] == [] and not report["verdict"]["summary"].startswith("Judged from")


def test_triage_issue_judges_the_output_in_the_body_by_default(tmp_path):
    """The issue form of the seed article: its output fence is the reported arm, unasked."""
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_TOKEN", "GITHUB_STEP_SUMMARY")}
    proc = subprocess.run([sys.executable, "-m", "triage", "issue", "--event",
                           str(FIXTURES / "issues" / "logdet_event.json"), "--out", str(tmp_path), "--no-minimize",
                           "--quiet"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    report = json.loads((tmp_path / "report.json").read_text())
    assert validate_report(report) == [], proc.stderr
    assert report["reported"]["source"] == "the issue body" and report["reported"]["torch"] == "2.1.0+cu121"
    assert report["verdict"]["kind"] == "nonfinite-flip", report["verdict"]["summary"]


def test_a_cpu_report_is_set_beside_this_cpu_and_their_disagreement_is_said(runs):
    """No GPU in sight: the reporter's device is a CPU, the arm that ran here is one too, and a
    posted mean no rounding gives, which this CPU does not print, did not reproduce here."""
    code, report, _, output = runs["cpu"]
    assert code == 0 and validate_report(report) == [], output
    (mean,) = report["reported"]["values"]
    assert report["reported"]["device"] == "cpu" and mean["device_agrees"] is False
    assert mean["judgement"]["zone"] == "outside" and mean["device_here"].startswith("0.5")
    v = report["verdict"]
    assert v["kind"] == "not-reproduced" and "The cpu arm here prints" in v["summary"], v["summary"]


def test_a_transcripts_displayed_values_line_up_with_its_expressions(runs):
    code, report, _, output = runs["transcript"]
    assert code == 0 and validate_report(report) == [], output
    shown = {x["printed"]: (x["how"], x["label"], (x["judgement"] or {}).get("zone"))
             for x in report["reported"]["values"]}
    assert shown == {"tensor(2048.5000, device='cuda:0')": ("displayed", "`x.sum()`", "inside"),
                     "tensor(0.6000, device='cuda:0')": ("displayed", "`x.mean()`", "outside")}
    assert report["verdict"]["kind"] == "likely-bug"
