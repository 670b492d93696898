"""Every CPU-runnable case of fixtures/issues/gh-* against meta.json's torch-2.13-CPU observation.

Each case names the verdicts it accepts and why. One verdict, unless the outcome itself depends on
the host's CPU kernels (ATEN_CPU_CAPABILITY picks them: AVX-512, AVX2 or the scalar default) or
core count: then exactly the two outcomes seen on such hosts, "diverges" and "bit-identical"."""
import json

import pytest
from conftest import ISSUES

pytestmark = pytest.mark.slow
CASES = sorted(p.name for p in ISSUES.glob("gh-*"))

# name -> (verdicts accepted, why).  meta.json's observed_status is the torch 2.13.0 CPU
# observation the acceptance follows; the fixes and bugs named are those of torch 2.13.0, which
# README and .ci/run pin.
ACCEPTED = {
    "gh-100466": ({"not-reproduced"}, "fixed: eager and inductor give the same bits"),
    "gh-100775": ({"not-reproduced"}, "fixed: both arms give the same one-hot softmax rows"),
    # Eager and inductor share asinh's scalar formula but not its vectorized one: with AVX2 or
    # AVX-512 the compiled values differ in the last bits, with ATEN_CPU_CAPABILITY=default
    # (inductor then emits scalar code) they are bit-identical.
    "gh-113151": ({"expected-rounding", "not-reproduced"}, "within tolerance: last bits, on vectorizing hosts"),
    "gh-118087": ({"nondeterministic"}, "a fresh random nn.Linear on every call"),
    "gh-138908": ({"not-reproduced"}, "fixed: the compiled in-place update matches eager"),
    "gh-142345": ({"not-reproduced"}, "fixed: both arms print [0, 0, 0, -9.9035]"),
    "gh-143978": ({"expected-rounding"}, "fixed: the NaN-vs-1 flip is gone, the finite values differ by rounding"),
    "gh-145266": ({"nondeterministic"}, "reads torch.empty's uninitialized memory"),
    "gh-161150": ({"not-reproduced"}, "fixed: both softmax outputs are all NaN"),
    "gh-174074": ({"not-reproduced"}, "fixed: both arms print [[-1.7432, 0.2228]]"),
    "gh-175156": ({"not-reproduced"}, "fixed: integer outputs, equal"),
    "gh-175791": ({"expected-rounding"}, "fixed: the compiled values are within rounding of eager"),
    # The bug is in logit's vectorized strided kernel, which AVX-512 hosts do not take for these
    # shapes: there the strided and contiguous results agree.
    "gh-177839": ({"not-reproduced", "likely-bug"}, "diverges only where the strided kernel is taken"),
    "gh-183767": ({"not-reproduced"}, "fixed: both arms print the same finite values"),
    # The overflow is in inductor's vectorized acosh (AVX2, AVX-512); with ATEN_CPU_CAPABILITY=default
    # inductor emits scalar code and both arms agree.
    "gh-183768": ({"nonfinite-flip", "not-reproduced"}, "inductor's vectorized acosh overflows to +inf on torch 2.13"),
    "gh-187180": ({"nonfinite-flip"}, "float16 softplus overflows the float16 range, float32 does not"),
    # The batched case is deterministic: the first matrix leaves its pivots in the shared JPVT.
    "gh-187411": ({"likely-bug"}, "gelsy's stale column pivots: rank 0 where a correct driver returns 2 or 3"),
    "gh-188225": ({"crash-one-arm"}, "inductor raises on torch 2.13, eager runs"),
    "gh-194347": ({"expected-rounding"}, "-0.0 against +0.0: equal values, a sign-of-zero difference"),
    "gh-2470": ({"not-reproduced"}, "fixed: float32 var equals float64"),
    "gh-4253": ({"could-not-run"}, "F.batch_norm now rejects eps=0 on every arm"),
    "gh-59489": ({"not-reproduced"}, "one arm: the float16 sum is as float64 rounds it"),
    "gh-83863": ({"not-reproduced"}, "fixed: mkldnn on and off agree"),
    # The script switches from 1 to 6 threads between two calls of one Linear with unseeded
    # weights; whether the two calls differ in their last bits depends on the host's kernel, its
    # core count and the draw (both outcomes seen on one 2-core AVX-512 host, run to run).
    "gh-88718": ({"not-reproduced", "expected-precision-mode"}, "the thread switch changes the bits on some runs"),
    "gh-99840": ({"not-reproduced"}, "fixed: no NaN in the compiled output"),
}


def test_every_cpu_case_has_an_acceptance():
    cpu_cases = {n for n in CASES if not json.loads((ISSUES / n / "meta.json").read_text())["needs_cuda"]}
    assert cpu_cases == set(ACCEPTED)


def arms_for(meta):
    return "cpu,cpu/compile" if meta["arms"] == ["eager", "compile"] else "cpu"


@pytest.mark.parametrize("name", CASES)
def test_shared_fixture_verdict(triage, record_property, name):
    meta = json.loads((ISSUES / name / "meta.json").read_text())
    if meta["needs_cuda"]:
        # Its arms are cpu and cuda, and meta.json records no CUDA run to judge against.
        pytest.skip("needs a CUDA device")
    _, report, _, out = triage(ISSUES / name / "repro.py", arms_for(meta), "--timeout", "180", "--no-minimize")
    assert report is not None, out
    record_property("verdict", report["verdict"]["kind"])
    accepted, why = ACCEPTED[name]
    assert report["verdict"]["kind"] in accepted, f"{why}: {report['verdict']['summary']}"
