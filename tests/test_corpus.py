"""Every CPU-runnable case of ../shared/fixtures/issues against meta.json's torch-2.13-CPU observation."""
import json

import pytest

from conftest import SHARED

pytestmark = pytest.mark.slow
ISSUES = SHARED / "issues"
CASES = sorted(p.name for p in ISSUES.iterdir()) if ISSUES.exists() else []
# expected-precision-mode is rounding with its cause shown (an ablation, or a setting the
# script changes between two calls), so it stands wherever rounding does.
NOT_DIVERGING = {"not-reproduced", "expected-rounding", "expected-precision-mode"}
# What each observed_status admits.  "still diverges" must keep the reporter's kind, except
# where the maintainers' kind is rounding-level (within-tolerance) or is a testing mistake.
BY_KIND = {"nonfinite-flip": {"nonfinite-flip"}, "crash-one-arm": {"crash-one-arm"},
           "nondeterministic": {"nondeterministic"}, "within-tolerance": {"expected-rounding", "expected-precision-mode"},
           "beyond-tolerance-finite": {"likely-bug", "expected-ill-conditioned", "expected-rounding"}}
# Reproduces only on some CPUs: on AVX-512 machines logit's strided and contiguous paths agree.
MACHINE_DEPENDENT = {"gh-177839": NOT_DIVERGING}


def arms_for(meta):
    return "cpu,cpu/compile" if meta["arms"] == ["eager", "compile"] else "cpu"


def accepted(name, meta):
    status = meta["observed_status"]
    if status == "still diverges":
        return BY_KIND[meta["classification_expected"]] | MACHINE_DEPENDENT.get(name, set())
    if status.startswith("error"):
        return {"could-not-run"}
    return NOT_DIVERGING


@pytest.mark.skipif(not CASES, reason="../shared/fixtures/issues is absent")
@pytest.mark.parametrize("name", CASES)
def test_shared_fixture_verdict(triage, name):
    meta = json.loads((ISSUES / name / "meta.json").read_text())
    if meta["needs_cuda"]:
        pytest.skip("needs CUDA")
    _, report, _, out = triage(ISSUES / name / "repro.py", arms_for(meta), "--timeout", "180", "--no-minimize")
    assert report is not None, out
    assert report["verdict"]["kind"] in accepted(name, meta), report["verdict"]["summary"]
    if report["verdict"]["kind"] != "could-not-run":
        assert report["verdict"]["kind"] != "likely-bug" or meta["classification_expected"] != "nondeterministic"
