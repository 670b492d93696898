"""CUDA paths of triage, on a real GPU (issue 29): `pytest -m cuda` runs them; without a GPU they skip.

Device collapse onto `cuda`, a CUDA arm that really sees the GPU from inside its sandbox (a silent
CPU fallback would turn it into a CPU arm), the TF32 switch on an fp32 matmul divergence,
`index_add_` under `deterministic=on`, and the CUDA linalg kernels against their independent
answers.  `bench/gpu_check.py` runs these on a lent GPU machine.
"""
import json
import textwrap

import pytest
import torch
from conftest import run_triage

pytestmark = [pytest.mark.cuda, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

QUICK = ("--no-minimize", "--minimal", "-", "--timeout", "120")


def triage_on(tmp_path, source: str, arms: str, *extra: str):
    script = tmp_path / "repro.py"
    script.write_text(textwrap.dedent(source))
    return run_triage(script, arms, tmp_path, *QUICK, *extra, timeout=300)


def arm(report: dict, spec: str) -> dict:
    return next(a for a in report["arms"] if a["spec"] == spec)


def test_device_collapse_onto_cuda(tmp_path):
    """`.cuda()`, `.to("cuda:0")` and a default device run on the arm's device: cuda on `cuda`, cpu on `cpu`."""
    code, report, _, out = triage_on(tmp_path, """
        import torch
        x = torch.arange(1, 5, dtype=torch.float32).cuda()
        w = torch.full((4,), 0.5).to("cuda:0")
        torch.set_default_device("cuda")
        z = torch.ones(4)
        y = torch.exp(x * w) + z
        print(x.device.type, w.device.type, z.device.type, y.device.type)
        print(y)
    """, "cpu,cuda", "--no-ablate")
    assert code == 0 and report is not None, out
    cpu, cuda = arm(report, "cpu"), arm(report, "cuda")
    assert cpu["status"] == "ok" and cuda["status"] == "ok", out
    assert cpu["stdout"].splitlines()[0] == "cpu cpu cpu cpu", cpu["stdout"]
    assert cuda["stdout"].splitlines()[0] == "cuda cuda cuda cuda", cuda["stdout"]
    assert "device='cuda:0'" in cuda["stdout"]
    assert report["observables"], "no values observed on the arms"
    assert report["verdict"]["kind"] != "could-not-run", report["verdict"]


def test_a_script_that_hides_the_gpu_after_cuda_started_is_judged_not_a_crash(tmp_path):
    """gh-183402's script sets CUDA_VISIBLE_DEVICES to its reporter's second GPU. CUDA has started
    in the arm by then, so the script runs on this GPU; but torch could no longer name the GPU
    after the script, triage's simulation failed there (H200: "Invalid device id"), and the arm
    was reported as a crash of its configuration."""
    code, report, _, out = triage_on(tmp_path, """
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = "63"  # a GPU of the reporter's machine, none of this one's
        import torch
        x = torch.tensor([[2.0, 4.0, 6.0], [4.0, 10.0, 12.0], [6.0, 12.0, 18.0]])
        print(x.logdet())
        print(x.cuda().logdet().cpu())
    """, "cpu,cuda", "--no-ablate")
    assert report is not None, out
    assert [a["status"] for a in report["arms"]] == ["ok", "ok"], [a["failure"] for a in report["arms"]]
    assert report["verdict"]["kind"] not in ("crash-one-arm", "could-not-run"), report["verdict"]
    assert "simulation failed" not in json.dumps(report)


@pytest.mark.parametrize("isolation", ["process", "auto"])
def test_cuda_arm_sees_the_gpu_inside_its_sandbox(tmp_path, isolation):
    """A positive check: inside the arm, torch sees the GPU and computes on it."""
    code, report, _, out = triage_on(tmp_path, """
        import torch
        print("cuda available", torch.cuda.is_available(), torch.cuda.device_count())
        x = torch.randn(64, 64, device="cuda")
        print("on", (x @ x).device)
    """, "cuda", "--no-ablate", "--isolation", isolation)
    assert code == 0 and report is not None, out
    a = arm(report, "cuda")
    assert a["status"] == "ok", out
    lines = a["stdout"].splitlines()
    assert lines[0].startswith("cuda available True "), a["stdout"]
    assert int(lines[0].split()[-1]) >= 1
    assert lines[1] == "on cuda:0", a["stdout"]


def test_tf32_on_an_fp32_matmul_divergence(tmp_path):
    """An fp32 GEMM with TF32 on against the CPU: an expected precision mode (or rounding at TF32's
    precision), never a bug; where an ablation runs, `tf32=off` is the switch that explains it."""
    code, report, _, out = triage_on(tmp_path, """
        import torch
        g = torch.Generator().manual_seed(0)
        a = torch.rand(512, 1024, generator=g)  # positive: no cancellation, so no ill-conditioning verdict
        b = torch.rand(1024, 256, generator=g)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        print("tf32", torch.backends.cuda.matmul.allow_tf32)
        c = a.to(dev) @ b.to(dev)
        print(c[:2, :4])
    """, "cpu,cuda/tf32=on", "--all-ablations")
    assert code == 0 and report is not None, out
    cuda = arm(report, "cuda/tf32=on")
    assert cuda["status"] == "ok" and cuda["stdout"].startswith("tf32 True"), cuda["stdout"]
    verdict = report["verdict"]
    assert verdict["kind"] in ("expected-precision-mode", "expected-rounding"), verdict
    assert verdict["expected"] is True, verdict
    tf32 = [a for a in report["ablations"] if a["switch"] == "tf32=off"]
    if verdict["kind"] == "expected-precision-mode":
        assert tf32 and tf32[0]["outcome"] in ("agree-bitwise", "within-tolerance"), report["ablations"]
        assert "tf32" in " ".join(verdict["labels"]).lower() or "TF32" in verdict["summary"], verdict


def test_tf32_off_arm_matches_the_cpu_closer_than_tf32_on(tmp_path):
    """The knob itself: `cuda/tf32=off` computes the fp32 GEMM in IEEE fp32, `cuda/tf32=on` in TF32."""
    code, report, _, out = triage_on(tmp_path, """
        import torch
        g = torch.Generator().manual_seed(1)
        a, b = torch.randn(256, 2048, generator=g), torch.randn(2048, 64, generator=g)
        exact = (a.double() @ b.double())
        c = (a.cuda() @ b.cuda()).cpu()
        print("tf32", torch.backends.cuda.matmul.allow_tf32, "err", (c.double() - exact).abs().max().item())
    """, "cuda/tf32=on,cuda/tf32=off", "--no-ablate")
    assert code == 0 and report is not None, out
    on, off = arm(report, "cuda/tf32=on")["stdout"].split(), arm(report, "cuda/tf32=off")["stdout"].split()
    assert on[1] == "True" and off[1] == "False", (on, off)
    assert float(on[3]) > 10 * float(off[3]), (on, off)  # TF32 keeps 10 mantissa bits, fp32 23


def test_index_add_under_deterministic(tmp_path):
    """`index_add_` with many duplicate indices (atomics on CUDA) against `cuda/deterministic=on`:
    the knob reaches the arm, the deterministic kernel runs (no error), and the difference, if
    any, is judged rounding or nondeterminism — never a bug."""
    code, report, _, out = triage_on(tmp_path, """
        import torch
        g = torch.Generator().manual_seed(0)
        src = torch.rand(200_000, generator=g)  # positive: no cancellation
        idx = torch.randint(0, 8, (200_000,), generator=g)
        out = torch.zeros(8, device="cuda").index_add_(0, idx.cuda(), src.cuda())
        print("deterministic", torch.are_deterministic_algorithms_enabled())
        print(out)
    """, "cuda,cuda/deterministic=on", "--all-ablations")
    assert code == 0 and report is not None, out
    plain, det = arm(report, "cuda"), arm(report, "cuda/deterministic=on")
    assert plain["status"] == "ok" and det["status"] == "ok", out
    assert plain["stdout"].startswith("deterministic False"), plain["stdout"]
    assert det["stdout"].startswith("deterministic True"), det["stdout"]
    verdict = report["verdict"]
    assert verdict["kind"] in ("not-reproduced", "expected-rounding", "nondeterministic"), verdict
    for a in report["ablations"]:
        if a["switch"] == "deterministic=on":
            assert a["outcome"], a


def _correct_linalg_kernels_within_their_answers(device: str, iterations: int = 40) -> dict[str, int]:
    """Every independently answered linalg op, run on `device` on random matrices of several kinds
    (float32 and float64): each check's count by op; a kernel past its bound fails."""
    import random

    from triage.worker.independent import answers

    rng = random.Random(0)
    checked: dict[str, int] = {}
    ops = ("_linalg_det", "_linalg_slogdet", "linalg_inv_ex", "_linalg_svd", "_linalg_eigh", "linalg_lu_factor_ex",
           "linalg_lu", "linalg_cholesky_ex", "linalg_qr", "linalg_pinv", "linalg_eig")
    # The matrix each op is given: symmetric for eigh, positive definite for Cholesky.
    inputs = {"_linalg_eigh": lambda a: a + a.mT,
              "linalg_cholesky_ex": lambda a: a @ a.mT + torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)}
    for _ in range(iterations):
        n = rng.randint(1, 8)
        g = torch.Generator().manual_seed(rng.randrange(1 << 30))
        a = torch.randn(n, n, generator=g, dtype=torch.float64)
        kind = rng.choice(["randn", "graded", "integer", "near-singular"])
        if kind == "graded":
            a = a * torch.logspace(-4, 4, n, dtype=torch.float64)[:, None]
        elif kind == "integer":
            a = torch.randint(-3, 4, (n, n), generator=g).double()
        elif kind == "near-singular" and n > 1:
            a[-1] = a[0] + 1e-5 * torch.randn(n, generator=g, dtype=torch.float64)
        for dtype in (torch.float32, torch.float64):
            x = a.to(device, dtype)
            for name in ops:
                arg = inputs.get(name, lambda t: t)(x)
                try:
                    out = getattr(torch.ops.aten, name)(arg)
                except RuntimeError:
                    continue  # a matrix the kernel refuses
                for answer in answers(name, (arg,), {}):
                    if (check := answer.check(out)) is not None:
                        checked[name] = checked.get(name, 0) + 1
                        assert not check.disagrees, (device, name, kind, n, dtype, answer.output, check.error, check.bound)
            b = torch.randn(n + 2, 2, generator=g, dtype=torch.float64).to(device, dtype)
            tall = torch.cat([x, x[:2] + 1]) if n else x
            if tall.shape[0] == b.shape[0]:
                out = torch.ops.aten.linalg_lstsq(tall, b)
                for answer in answers("linalg_lstsq", (tall, b), {}):
                    if (check := answer.check(out)) is not None:
                        checked["linalg_lstsq"] = checked.get("linalg_lstsq", 0) + 1
                        assert not check.disagrees, (device, "lstsq", kind, n, dtype, answer.output, check.error, check.bound)
    return checked


def test_cuda_linalg_kernels_stay_within_their_independent_answers():
    """cuSOLVER's and MAGMA's kernels (det, slogdet, inverse, SVD and its vectors, eigh and its
    vectors, LU, Cholesky, QR, pinv, general eigenvalues, least squares) against the exact or
    50-digit answer, with the bounds the CPU's LAPACK was calibrated against."""
    checked = _correct_linalg_kernels_within_their_answers("cuda")
    assert sum(checked.values()) > 300 and len(checked) >= 10, checked
