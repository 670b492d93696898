"""Calibration of the simulated spread of matrix decompositions (triage/worker/rounding.py,
triage/worker/arm_choices.py): correct LAPACK kernels on random matrices, each output judged
against its own simulated rounding spread as `triage run` judges it, then with a relative error
injected into the arm's value.

    python bench/decomposition_spreads.py [--matrices N] [--seed S]   # about 2 min for 80 on 2 cores

Cases, each on N matrices of several shapes (tall, square, wide; some with graded columns):
- `linalg.eig` of a real float32 matrix: its eigenvalues, its eigenvectors and a quantity
  read from the vectors (their order and phases are the kernel's choice: the replays take the
  arm's);
- `linalg.qr` of a real float32 matrix: Q and R;
- complex64 `linalg.eigh`, `linalg.svd` (reduced) and `linalg.qr`: the vectors (unique up to a
  complex phase) and R.

Prints, per output: how many of the correct kernel's values fall inside, in the directed
envelope, or outside their spread (a false alarm at the value's level: a verdict needs more,
`triage.judge`'s audit), and how many values with a relative error of 1e-4 and of 1e-5 injected
fall outside (detection).
"""
from __future__ import annotations

import argparse
import collections
import os
import platform
import time

import numpy as np
import torch

from triage.judge import RoundingSpread, judge_value
from triage.worker.opgraph import OpRecorder
from triage.worker.reference import replay_fp64
from triage.worker.rounding import SimulationOptions, simulate_rounding

SHAPES = [(3, 3), (5, 3), (8, 4), (3, 5), (12, 6), (20, 10), (32, 32), (6, 2)]
EPSILONS = (0.0, 1e-4, 1e-5)


def matrix(seed: int, dtype: torch.dtype) -> torch.Tensor:
    m, n = SHAPES[seed % len(SHAPES)]
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, n, generator=g, dtype=torch.complex128 if dtype.is_complex else torch.float64)
    if seed % 3 == 1:  # graded columns
        a = a * torch.logspace(0, -6, n, dtype=torch.float64)
    return a.to(dtype)


def eig_case(a: torch.Tensor) -> dict[str, torch.Tensor]:
    square = a[: min(a.shape), : min(a.shape)]
    values, vectors = torch.linalg.eig(square)
    return {"eig values": values, "eig vectors": vectors, "eig (vectors·values).real.sum(0)":
            (vectors * values).real.sum(0)}


def qr_case(a: torch.Tensor) -> dict[str, torch.Tensor]:
    q, r = torch.linalg.qr(a)
    return {"qr Q": q, "qr R": r}


def complex_case(a: torch.Tensor) -> dict[str, torch.Tensor]:
    _, vectors = torch.linalg.eigh(a.conj().T @ a)
    u, _, vh = torch.linalg.svd(a, full_matrices=False)
    q, r = torch.linalg.qr(a)
    return {"complex eigh vectors": vectors, "complex svd U": u, "complex svd Vh": vh, "complex qr Q": q,
            "complex qr R": r}


CASES = [(eig_case, torch.float32), (qr_case, torch.float32), (complex_case, torch.complex64)]


def judged(case, a: torch.Tensor, seed: int, epsilon: float) -> dict[str, str]:
    """Each output's zone: inside | envelope | outside | not-judged."""
    recorder = OpRecorder(torch.device("cpu"), site=lambda: None)
    with recorder:
        outputs = case(a)
    recording = recorder.finish()
    names = {label: recorder.lookup(t).name for label, t in outputs.items()}
    references = replay_fp64(recording.graph, set(names.values()), 60).values
    arm = {label: outputs[label].detach() * (1 + epsilon) for label in outputs}
    sim = simulate_rounding(recording.graph, {n: references[n] for n in names.values()},
                            SimulationOptions(seed=seed), {n: outputs[label].dtype for label, n in names.items()},
                            {n: arm[label].to(references[n].dtype) for label, n in names.items()})
    zones = {}
    for label, name in names.items():
        spread = sim.spreads[name]
        if spread.status != "judged":
            zones[label] = "not-judged"
            continue
        reference = references[name].numpy()
        if np.iscomplexobj(reference):
            reference = np.stack([reference.real, reference.imag], -1)
        precision = "float32"
        rounding = RoundingSpread.of_simulation(spread, reference, precision)
        zones[label] = judge_value(arm[label].numpy(), rounding, "cpu", 0, label, None).zone or "not-judged"
    return zones


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--matrices", type=int, default=80)
    parser.add_argument("--seed", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.monotonic()
    counts: dict[tuple[str, float], collections.Counter] = collections.defaultdict(collections.Counter)
    for case, dtype in CASES:
        for seed in range(args.seed, args.seed + args.matrices):
            a = matrix(seed, dtype)
            for epsilon in EPSILONS:
                for label, zone in judged(case, a, seed, epsilon).items():
                    counts[(label, epsilon)][zone] += 1
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    print(f"`python bench/decomposition_spreads.py --matrices {args.matrices} --seed {args.seed}` — {os.cpu_count()} "
          f"cores, {cpu} ({torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}, "
          f"{time.monotonic() - start:.0f} s\n")
    print("| output | correct kernel: inside / envelope / outside | 1e-4 injected: outside | 1e-5 injected: outside |")
    print("|---|---|---|---|")
    for label in dict.fromkeys(label for label, _ in counts):
        clean = counts[(label, 0.0)]
        total = sum(clean.values())
        cells = [f"{clean['inside']} / {clean['envelope']} / {clean['outside']} of {total}"
                 + (f" ({clean['not-judged']} not judged)" if clean["not-judged"] else "")]
        for epsilon in EPSILONS[1:]:
            c = counts[(label, epsilon)]
            cells.append(f"{c['outside']} of {sum(c.values())}")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
