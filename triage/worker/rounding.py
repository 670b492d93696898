"""Simulated rounding: the spread each observed value would have from its arm's own rounding.

"Is this difference rounding?" is answered by re-doing the arm's rounding, not by asking
which arm is nearer float64 (a float64 replay favours the arm that rounds less). The
recorded op graph is replayed in float64 K times under `RoundingMode`, a dispatch mode that
rounds every aten op's result *stochastically* to the dtype that op ran in on the arm
(Monte Carlo arithmetic in the form of Verrou's unbiased random rounding; Parker et al.,
CiSE 2000; Sohier et al., ACM TOMS 2021), plus two directed replays that round every result
up, then down (Verrou's ``upward``/``downward``), which bound order-dependent, biased
accumulation that unbiased samples miss (300 sequential ``+1.0`` at 2²⁴ stagnate under
round-to-nearest). Per op class:

* every floating result is rounded to the arm dtype's lattice, so exactly representable
  results (``x - x``, ``abs``, views, ``max``) are never perturbed, a narrowing cast
  (``.half()`` mid-graph) rounds where the program says it does, and values beyond the
  dtype's range become ``±inf`` as on the arm;
* library functions (``exp``, ``tanh``, ``erf``, ``pow`` …) are some units of roundoff off
  before that rounding: as many as the kernel measured on PyTorch's own op database
  (`triage.worker.kernel_errors`, twice the largest error seen, at least 4 u), or a
  conservative 16 u for an op the table has not measured (named in the spread); an op
  assumed correctly rounded whose kernel measured more than one rounding is treated the same;
* reductions and contractions accumulate many roundings inside one op: their internal
  error is added as a random walk over a sequential order,
  σ = u·√(n/3)·√(S²/3 + Σt²/2) (S the sum, t the terms, (A∘A)@(B∘B) for matmul); a sum
  or mean of at least 2^16 terms computed from leaves by affine elementwise ops takes its
  terms' rounding whole in most random replays, as one normal error whose covariance a
  full replay measures (`_Collapsed`), instead of rounding every term K times;
* backward-stable linalg (``solve``, ``svd``, ``det`` …) gets its input perturbed by
  √n·u and is re-run in float64, so conditioning shows up by itself;
* composite ops (softmax, layer norm, variance, attention) are replayed through their
  decompositions, so each of their sums and exps is rounded where it happens, at the
  kernel's opmath (fp16/bf16 inputs computed in float32 unless the table measured
  otherwise), their sums walked as a fused kernel's vector lanes add (`lane_walk`), plus the
  error the whole kernel measured;
* random ops are leaves (their recorded values); compiled regions are replayed op by op.

Replays of small values (at most STACKED_VALUE_ELEMENTS elements) run stacked along a new
first dimension, one slice per replay (`RoundingMode.samples`): the two directed replays with
the first samples, then each batch of samples up to the next point where sampling may stop. An
op whose rounding is elementwise runs once on the stack (functorch's batching rules, or plain
broadcasting for pointwise ops); linalg, transforms and kernels whose error is relative to the
output's scale run once per slice; decompositions replay the ops the centre replay noted. The
directed slices give exactly the directed replays' values. Values no replay changes (leaves,
views and selections of them) are computed once, by the centre replay.

The result per observed node is a `NodeSpread`: the per-element RMS deviation of the
samples from the unperturbed float64 value, the directed envelope, which nonfinite values
the samples reached, the statistic T of every sample (for a Monte Carlo p-value, taken by
``triage.judge`` in the parent), and discrete decisions (comparisons, argmax) that flipped.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import importlib
import itertools
import math
import operator
import random
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch._C._functorch import (
    _add_batch_dim,
    _remove_batch_dim,
    _set_vmap_fallback_warning_enabled,
    _vmap_decrement_nesting,
    _vmap_increment_nesting,
)
from torch._decomp import decomposition_table
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from triage import policy
from triage.worker import arm_choices
from triage.worker.composites import COMPOSITES
from triage.worker.conditioning import reduced_dims
from triage.worker.kernel_errors import UNMEASURED_U, KernelTable, ill_conditioned_scale
from triage.worker.modes import TriageDispatchMode
from triage.worker.opclasses import EXACT, UNIT_ROUNDOFF
from triage.worker.protocol import OBSERVED, SPREAD_ARRAYS
from triage.worker.reference import (
    EXACT_OPS,
    cone,
    custom_implementation,
    float32_scales,
    last_uses,
    muted,
    widen,
    widen_dtype,
)

# Mantissa bits (with the implicit one), the largest finite value and the smallest normal.
FORMATS = {
    torch.float32: (24, torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny),
    torch.float16: (11, torch.finfo(torch.float16).max, torch.finfo(torch.float16).tiny),
    torch.bfloat16: (8, torch.finfo(torch.bfloat16).max, torch.finfo(torch.bfloat16).tiny),
    # TF32 tensor cores read fp32 inputs with a 10-bit mantissa (fp32's range).
    "tf32": (11, torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny),
}

# Correctly rounded by IEEE 754: only the rounding to the dtype (a measured error above one
# rounding, CORRECTLY_ROUNDED_U, makes the op a library function: a vectorized division by
# reciprocal, say).
CORRECTLY_ROUNDED_U = 1.05
CORRECTLY_ROUNDED = {"add", "sub", "rsub", "mul", "div", "true_divide", "sqrt", "reciprocal", "square",
                     "neg", "abs", "fmod", "_to_copy", "to", "copy", "copy_", "clone", "fill", "fill_",
                     "addcmul", "addcdiv", "lerp", "hypot", "remainder", "fma"}
# Library functions whose values lie in an interval with ends every dtype holds exactly: a
# correct kernel's result never leaves it (a rounding of a real number within [a, b] is within
# it, and sigmoid's 1/(1 + e^−x) is at most 1 in any precision), so the noise that stands for
# its error does not either: neither its forward error nor its backward error, f(x + δx), a
# value of f too. Past the end, a noisy sigmoid of 25 was 1 + 2⁻²³ in float32, and
# `binary_cross_entropy` of it nan (a nonfinite loss no kernel gives); a noisy exp of −40,
# ill-conditioned there, was negative.
BOUNDED = {"sigmoid": (0.0, 1.0), "tanh": (-1.0, 1.0), "erf": (-1.0, 1.0), "sin": (-1.0, 1.0), "cos": (-1.0, 1.0),
           "erfc": (0.0, 2.0), "exp": (0.0, math.inf), "exp2": (0.0, math.inf), "expm1": (-1.0, math.inf),
           "sqrt": (0.0, math.inf), "rsqrt": (0.0, math.inf), "cosh": (1.0, math.inf), "softplus": (0.0, math.inf)}
# Cumulative ops, whose outputs span the scan's growth: a kernel's error is relative to each.
SCANS = {"cumsum", "cumprod", "logcumsumexp", "cummax", "cummin", "_logcumsumexp"}
# Fused kernels whose every output errs relative to itself, not to the output's scale: a
# softmax is exp(xᵢ − max)/Σ, each factor's error relative. At the scale's error a probability
# of 1e-87 (a logit 200 below the largest) moved by ±2e-7: negative in half the replays, and
# never the 0 float32 underflows it to, so log(softmax(x)) was "−inf no rounding gives".
# Its gradient yᵢ·(gᵢ − Σ gⱼyⱼ) carries each yᵢ's scale: at the output's, the gradients of
# the probabilities far below the largest kept 1.6 digits in float32 (a correct float16
# softmax gradient called ill-conditioned); where gᵢ − Σ cancels, the replayed subtraction
# of rounded operands keeps that cancellation's error.
RELATIVE_KERNELS = SCANS | {"_softmax", "softmax", "_softmax_backward_data"}
# Copies and casts: exact when the result's dtype is at least as precise as the input's.
COPIES = {"_to_copy", "to", "copy", "clone"}
# One accumulation per output element: n terms summed inside the op.
SUMS = {"sum", "nansum", "mean", "cumsum", "prod"}
# An embedding bag's first output is each bag's sum (or mean, or max) of its weight rows:
# ATen's CPU kernel adds a bag's rows in sequence (`_bag_magnitudes`).
EMBEDDING_BAGS = {"_embedding_bag", "_embedding_bag_forward_only"}
# Scans whose CPU kernel keeps its running value in `at::acc_type<T, /*is_cuda=*/false>`,
# double for float32 (ATen's cpu/ReduceOpsKernel.cpp), and rounds each output once: the
# measured float32 cumsum errs below one rounding on OpInfo's samples where sum errs 4.8.
DOUBLE_SCANS = {"cumsum"}
# Moments replayed as one op (prims.var under var's decomposition): their kernels sum the terms.
MOMENTS = {"var", "std"}
# Ops that add their source's terms into the output elements the indices name: each element
# is a sum of as many terms as point at it (a histogram's bin of 3,000 weights), added one
# after another in the output's own dtype (ATen's CPU scatter and index kernels add
# `*self += *src` in scalar_t; CUDA's in atomics, in any order). By name, the source's
# position and keyword, and the out-of-place overload that adds terms as the call does: they
# accumulate only as called to (`accumulate=True`, `reduce="add"`, `scatter_reduce`'s "sum"
# and "mean"); otherwise they only move values.
SCATTER_SUMS = {
    "scatter_add": (3, "src", torch.ops.aten.scatter_add.default),
    "scatter": (3, "src", torch.ops.aten.scatter.reduce),
    "scatter_reduce": (3, "src", torch.ops.aten.scatter_reduce.two),
    "index_add": (3, "source", torch.ops.aten.index_add.default),
    "index_put": (2, "values", torch.ops.aten.index_put.default),
    "_index_put_impl": (2, "values", torch.ops.aten.index_put.default),
    "put": (2, "source", torch.ops.aten.put.default),
}
CONTRACTIONS = {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "convolution",
                "_convolution", "matmul"}
LINALG = {"_linalg_det", "linalg_det", "det", "_linalg_slogdet", "linalg_slogdet", "slogdet", "logdet",
          "linalg_inv_ex", "linalg_inv", "inverse", "_linalg_solve_ex", "linalg_solve", "linalg_solve_ex",
          "linalg_lu_factor_ex", "linalg_lu", "linalg_cholesky_ex", "cholesky", "linalg_lstsq", "triangular_solve",
          "linalg_solve_triangular", "cholesky_solve", "lu_solve", "linalg_lu_solve", "cholesky_inverse",
          "_linalg_svd", "linalg_svd", "_linalg_eigh", "linalg_eigh", "linalg_eig", "_linalg_eigvals",
          "linalg_qr", "geqrf", "linalg_householder_product", "ormqr", "_linalg_check_errors",
          "linalg_matrix_exp", "matrix_exp", "linalg_ldl_factor_ex", "linalg_ldl_factor", "linalg_ldl_solve",
          "linalg_pinv"}
# Eigen- and singular value decompositions (Householder reduction, then QR iterations or
# divide and conquer) err further than their √n·u backward-error model: on random float32
# matrices (n from 2 to 32) the real LAPACK kernel fell outside 199 simulated replays for
# 17 % of eigenvalues, 29 % of eigenvectors and 14 % of singular values. Their input is
# perturbed by this multiple of it and their output by SPECTRAL_LIBRARY_U units of roundoff
# (the vectors' loss of orthogonality, not proportional to 1/gap); with both, none of 150
# fell outside (bench/RESULTS.md, "The spectral decompositions' backward error").
SPECTRAL = {"_linalg_svd", "linalg_svd", "_linalg_eigh", "linalg_eigh", "linalg_eig", "_linalg_eigvals",
            "linalg_pinv"}  # the pseudoinverse: an SVD inside (eigh where hermitian), reaching the mode whole
SPECTRAL_BACKWARD = 4.0
SPECTRAL_LIBRARY_U = 2.0
# Householder QR's backward error is column-wise γ(mn)·‖aⱼ‖ (Higham, theorem 19.4), wider than
# √n·u: the real float32 kernel's Q fell outside its simulated spread for 8 of 160 random tall,
# square and wide matrices (some with graded columns) at √n·u, 3 at twice that and 1 at four
# times (bench/RESULTS.md, "QR's backward error"); an injected 1e-5 is still found on all.
QR_BACKWARD = 2.0
# Each linalg op's input perturbation, as a multiple of √n·u (1 unless measured wider).
BACKWARD_FACTORS = dict.fromkeys(SPECTRAL, SPECTRAL_BACKWARD) | {"linalg_qr": QR_BACKWARD}
# A complex dtype's real and imaginary parts: the precision its linear algebra rounds at.
COMPLEX_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}
# A complex product is not one rounding per part: the kernel computes (ac − bd) + (ad + bc)i
# from its parts, each product and sum rounded (ATen's vectorized and scalar complex `*`), and
# where ac and bd nearly cancel the real part keeps their rounding, not its own
# (`RoundingMode._complex_product`).
COMPLEX_PRODUCTS = {"mul", "square"}
# Ops correctly rounded on real values whose complex kernel combines the parts (a quotient's
# scaled formula, csqrt, the modulus' hypot): library functions of complex values, their error
# relative to the modulus (`RoundingMode._rounded`).
COMPLEX_LIBRARY = {"div", "true_divide", "reciprocal", "sqrt", "abs", "addcmul", "addcdiv", "lerp", "fma"}
# Sampling ops and the position of their grid of coordinates: the kernel unnormalizes each
# coordinate in the grid's dtype, ((x + 1)·size − 1)/2 or ((x + 1)/2)·(size − 1), three roundings that move
# it by up to 3u·(|x| + 1) grid units. That moves a bilinear weight, and flips a nearest or
# border pixel: a discontinuous decision the arm takes at its own precision, which the random
# replays take at theirs (`RoundingMode._moved_coordinates`). The backward kernels unnormalize
# the same grid again: a gradient is piecewise constant in each cell and jumps at its edges, so
# a coordinate rounded across one moves it by a whole cell's difference (grid_sample's float32
# gradients were 10.7σ outside a spread without it).
GRID_SAMPLERS = {"grid_sampler_2d": 1, "grid_sampler_3d": 1, "grid_sampler": 1,
                 "grid_sampler_2d_backward": 2, "grid_sampler_3d_backward": 2}
COORDINATE_ROUNDINGS = 3.0
# Results defined by the dtype's own lattice (the next representable value): computed at the
# arm's dtype itself, where a float64 replay would step to a float64 neighbour instead.
LATTICE_OPS = {"nextafter"}
# Discrete Fourier transforms: a fast transform's error is normwise, about u·log2(n) of the
# output's scale per element (Higham §24.1), not relative to each output element.
FFT_PREFIX = "_fft_"
# Composite ops replayed through their decompositions, so the sums and exps inside them round
# where they happen (softmax's denominator, layer norm's variance, attention's two matmuls).
DECOMPOSED = {"_softmax", "_log_softmax", "softmax", "log_softmax", "native_layer_norm", "native_group_norm",
              "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
              "_native_batch_norm_legit_functional", "var", "std", "var_mean", "std_mean", "logsumexp",
              "linalg_vector_norm", "norm", "frobenius_norm", "_scaled_dot_product_flash_attention_for_cpu",
              "nll_loss_forward", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
              "cross_entropy_loss", "logcumsumexp", "rms_norm", "_fused_rms_norm", "cosine_similarity",
              "avg_pool2d", "avg_pool1d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d", "upsample_bilinear2d",
              "upsample_nearest2d", "native_dropout_backward", "cdist", "_cdist_forward", "_euclidean_dist"}


@dataclass
class SimulationOptions:
    samples: int = 29  # K random replays; the smallest Monte Carlo p is 1/(K+1)
    # An arm value near the Monte Carlo floor after K samples gets more, up to this many,
    # before "outside" is believed: at p ≈ 1/(K+1) one more exceeding sample flips it.
    max_samples: int = 199
    seed: int = 0
    budget_s: float = 60.0
    matmul_tf32: bool = False  # the arm's fp32 matmuls read TF32 inputs
    conv_tf32: bool = False
    reduced_precision: bool = False  # fp16/bf16 GEMMs may accumulate in reduced precision
    min_samples: int = 9
    memory_bytes: int = 512 << 20
    kernels: KernelTable = field(default_factory=lambda: kernel_table("cpu"))  # the arm's device's measured errors
    # A CUDA device (an arm's, or a reporter's GPU triage only models): its kernels' reduction
    # order is not the replay's to know, so sums walk sequentially, the widest order; and
    # fp16/bf16 reductions and contractions its table did not measure may accumulate in their
    # own dtype (CUDA's scans do: measured on an H200, its fp16 cumsum adds in half).
    any_order: bool = False
    half_accumulation: bool = False
    # The cores this simulation may use for large values (None: the script's thread count).
    # Arms run side by side: two arms each on all of a machine's cores oversubscribe it, and
    # OpenMP's waiting threads then cost a million-element replay three times its time.
    threads: int | None = None


class Draws:
    """The random numbers of one random replay (or one stack of them): NumPy's SFC64 bit
    generator, its raw 64-bit words cut to each use. A call takes a microsecond or two where
    torch's generator takes 5–25 for the few hundred elements a training loop's values have
    (a stacked replay of one draws thousands of times), and half the time per element on a
    million. Seeded from the simulation's seed and the replay's position, so a run's samples
    are the same every time."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.SFC64(np.random.SeedSequence(seed % (1 << 64)))
        self._numpy = np.random.Generator(self._bits)

    def integers(self, shape: tuple | torch.Size, bits: int) -> np.ndarray:
        """int64 draws uniform over [0, 2**bits), bits < 64: a word's top bits."""
        words = self._bits.random_raw(math.prod(shape)) >> np.uint64(64 - bits)
        return words.view(np.int64).reshape(shape)

    def uniform(self, shape: tuple | torch.Size) -> np.ndarray:
        """float64 draws uniform over [0, 1), on a grid of 2**-53 (an array, of zero
        dimensions too: NumPy's arithmetic on one gives a scalar, so it is reshaped last)."""
        words = self._bits.random_raw(math.prod(shape)) >> np.uint64(11)
        return (words.astype(np.float64) * 2.0 ** -53).reshape(shape)

    def normal(self, shape: tuple | torch.Size) -> np.ndarray:
        """float64 standard normal draws."""
        return self._numpy.standard_normal(math.prod(shape)).reshape(shape)

    def signed(self, shape: tuple | torch.Size) -> torch.Tensor:
        """float64 draws uniform over [-1, 1), as a tensor."""
        return torch.from_numpy((self.uniform((math.prod(shape),)) * 2 - 1).reshape(shape))


@functools.cache
def kernel_table(device: str) -> KernelTable:
    """The measured kernel errors of this torch release on `device` (cpu: this CPU's
    capability; cuda: this GPU)."""
    if device.startswith("cuda"):
        capability = _gpu_name()
    else:
        capability = torch.backends.cpu.get_cpu_capability()
    return KernelTable.load(device, capability, torch.__version__)


def _gpu_name() -> str | None:
    """This machine's GPU, whose entry of the table applies; None where there is none (a
    modelled CUDA device) or torch can no longer say which it is: any GPU's entry then, the
    largest error.  The table is read after the script, which may have changed what CUDA
    answers in its process (a CUDA_VISIBLE_DEVICES set after CUDA started: "Invalid device id")."""
    try:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except (AssertionError, RuntimeError):
        return None


@dataclass
class NodeSpread:
    """What the simulation says about one observed value (all arrays float64, value-shaped)."""

    status: str  # judged | not-judged
    reason: str | None = None
    samples: int = 0
    sigma: torch.Tensor | None = None  # RMS deviation of the samples from the float64 value
    up: torch.Tensor | None = None  # the directed replays
    down: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    sd: torch.Tensor | None = None  # around the samples' own mean (significant digits)
    nonfinite: torch.Tensor | None = None  # uint8 bits: 1 finite, 2 +inf, 4 -inf, 8 nan (random replays)
    sample_stats: list[float] = field(default_factory=list)  # T_k, leave-one-out
    # Of each sample: its elements off the reference where no other sample is (T_k is inf
    # there), which orders two infinite statistics (`policy.exceeding`).
    sample_unmoved: list[int] = field(default_factory=list)
    flips: list[dict[str, Any]] = field(default_factory=list)
    cancellations: list[dict[str, Any]] = field(default_factory=list)  # where digits are lost upstream
    # The first op upstream whose centre replay leaves its dtype's range (±inf or nan from finite
    # inputs), where the value or the arm's is not finite.
    overflow: dict[str, Any] | None = None
    precision: str | None = None  # the least precise dtype any op of the cone computed in
    unmeasured: list[str] = field(default_factory=list)  # library ops given the conservative bound
    centre: torch.Tensor | None = None  # the replay rounding every op to nearest, as the arm's dtype stores it


@dataclass
class Simulation:
    spreads: dict[str, NodeSpread]
    seconds: float
    samples: int
    note: str | None = None
    drawn_whole: list[str] = field(default_factory=list)  # reductions whose terms' rounding was drawn whole


def simulate_rounding(graph: fx.Graph, wanted: dict[str, torch.Tensor], options: SimulationOptions,
                      out_dtypes: dict[str, torch.dtype],
                      arm_values: dict[str, torch.Tensor] | None = None, thaw: bool = True) -> Simulation:
    """The rounding spread of every node in `wanted` (node name -> its float64 reference).

    `out_dtypes` gives each wanted node's dtype on the arm: every replay's value is rounded to
    it, as the arm stored it. With the arm's own values (`arm_values`), sampling stops early
    once every one of them is certainly inside its spread (a sequential Monte Carlo test).
    `thaw`: the objects frozen for the simulation (below) are thawed after it; the worker,
    which froze the script's objects already and exits after, thaws nothing.
    """
    script_threads = torch.get_num_threads()
    threads = min(options.threads or script_threads, script_threads)
    # Small tensors, many ops: thread hand-offs cost more than they save, and the arms
    # already run side by side on the machine's cores (`_parallel` gives them back for large
    # values).
    torch.set_num_threads(1)
    # Stacked samples run ops without a batching rule through functorch's loop, which warns on
    # stderr each time (the default, which torch has no getter for, is restored).
    _set_vmap_fallback_warning_enabled(False)
    # The objects that exist already (torch's, the script's, the recording's) are not the
    # simulation's: a full collection its allocations trigger would walk them all (0.1 s of a
    # 0.14 s simulation). Frozen, collections see only what the simulation makes. (Not asked
    # with `gc.get_freeze_count()`, which walks every frozen object: 37 ms in the worker.)
    gc.freeze()
    try:
        # The replays compute with infinities and nans on purpose (overflow, inf - inf), as
        # torch's ops do without a warning; NumPy's small-value paths stay as quiet.
        with dynamo_import_deferred(), _freed_blocks_kept(), np.errstate(all="ignore"):
            return _simulate(graph, wanted, options, out_dtypes, arm_values or {}, threads)
    finally:
        torch.set_num_threads(script_threads)
        _set_vmap_fallback_warning_enabled(True)
        if thaw:
            gc.unfreeze()


# glibc's malloc hands a freed block of at least its mmap threshold (128 KiB, raised to the
# largest block freed so far) back to the kernel, and trims the heap's free top past the trim
# threshold: each of a large value's temporaries then faults its pages in afresh, which
# costs about as much as the pass that fills it (a 2M-element float64 `abs`: 4.5 ms, 2.4 ms
# in kept memory). While the simulation runs, blocks below KEPT_MMAP_THRESHOLD come from the
# heap and its free top is kept up to KEPT_TRIM_THRESHOLD; afterwards glibc's defaults return
# (the next free trims the heap's top: an explicit malloc_trim walks every arena, 25 ms).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_MMAP_THRESHOLD = 64 << 20
KEPT_TRIM_THRESHOLD = 512 << 20
DEFAULT_THRESHOLD = 128 << 10


@contextlib.contextmanager
def _freed_blocks_kept() -> Iterator[None]:
    """Large freed blocks kept in the heap for reuse while the simulation runs (glibc only;
    elsewhere nothing changes)."""
    libc = ctypes.CDLL(None)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, KEPT_MMAP_THRESHOLD):
        yield
        return
    mallopt(M_TRIM_THRESHOLD, KEPT_TRIM_THRESHOLD)
    try:
        yield
    finally:
        mallopt(M_MMAP_THRESHOLD, DEFAULT_THRESHOLD)
        mallopt(M_TRIM_THRESHOLD, DEFAULT_THRESHOLD)


@contextlib.contextmanager
def dynamo_import_deferred() -> Iterator[None]:
    """While the replays run, torch's reference decompositions (layer norm, variance, their
    elementwise helpers) skip the `torch._disable_dynamo` wrapper, whose first call imports
    torch._dynamo to build a guard against tracing: a second of an eager arm's life that
    nothing here needs, since nothing is traced until this returns. The wrapper caches what
    it calls on the wrapped function (``__dynamo_disable``); set to the function itself, it
    calls it directly. Undone on exit, and left alone where dynamo is already imported."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    deferred = [fn for fn in _dynamo_disabled_references() if getattr(fn, DYNAMO_DISABLE_ATTRIBUTE, None) is None]
    for fn in deferred:
        setattr(fn, DYNAMO_DISABLE_ATTRIBUTE, fn)
    try:
        yield
    finally:
        for fn in deferred:
            if getattr(fn, DYNAMO_DISABLE_ATTRIBUTE, None) is fn:
                delattr(fn, DYNAMO_DISABLE_ATTRIBUTE)


DYNAMO_DISABLE_ATTRIBUTE = "__dynamo_disable"


@functools.lru_cache(maxsize=1)
def _dynamo_disabled_references() -> tuple[Any, ...]:
    """The functions `torch._disable_dynamo` wraps among the decompositions, torch's
    reference modules and the custom ops' kernels (the prims the references reduce and
    divide with, whose output dtypes the replay asks on stand-ins): found by the wrapper's
    code down each `__wrapped__` chain, read from the wrapper's closure (its `__wrapped__`
    may name what the wrapped function wraps)."""
    from torch._library import custom_ops

    wrapper_code = torch._disable_dynamo(lambda: None).__code__
    wrapped_cell = wrapper_code.co_freevars.index("fn")
    roots = list(decomposition_table.values())
    for module in ("torch._refs", "torch._refs.linalg", "torch._refs.nn.functional", "torch._refs.special"):
        roots.extend(vars(importlib.import_module(module)).values())
    for definition in list(getattr(custom_ops, "OPDEFS", {}).values()):
        roots.extend(getattr(definition, "_backend_fns", {}).values())
    found: dict[int, Any] = {}
    for f in roots:
        for _ in range(16):  # decorators stack a few deep
            if not callable(f):
                break
            inner = getattr(f, "__wrapped__", None)
            if getattr(f, "__code__", None) is wrapper_code:
                target = f.__closure__[wrapped_cell].cell_contents
                found[id(target)] = target
            if inner is None:
                break
            f = inner
    return tuple(found.values())


def _simulate(graph: fx.Graph, wanted: dict[str, torch.Tensor], options: SimulationOptions,
              out_dtypes: dict[str, torch.dtype], arm_values: dict[str, torch.Tensor], threads: int) -> Simulation:
    start = time.monotonic()
    by_name = {n.name: n for n in graph.nodes}
    targets = [by_name[w] for w in wanted if w in by_name]
    order = cone(graph, targets)
    spreads: dict[str, NodeSpread] = {}
    blocked = _unjudgeable(order)
    for w in list(wanted):
        n = by_name.get(w)
        why = blocked.get(n) if n is not None else "no recorded op produced it"
        if why:
            spreads[w] = NodeSpread(status="not-judged", reason=why)
    # A discrete value (a count of differing elements, an argmax, a mask) is simulated too, as
    # float64: where it comes from rounded floats, rounding moves it, and its float64 value is
    # one outcome of many (a count of `a != b` between two formulas is mostly rounding's).
    live = {w: ref if ref.is_floating_point() or ref.is_complex() else ref.double()
            for w, ref in wanted.items() if w not in spreads and isinstance(ref, torch.Tensor)}
    if not live:
        return Simulation(spreads, time.monotonic() - start, 0)
    cache = _CallCache()
    plan = _ReplayPlan.of(order)
    t0, t0_cpu, modules = time.monotonic(), time.process_time(), len(sys.modules)
    _parallel(threads, max((n.meta["leaf"].value.numel() for n in order if n.op == "placeholder"
                            and isinstance(n.meta["leaf"].value, torch.Tensor)), default=0))
    center = _replay(plan, set(live), _centre_mode(options, cache, live, arm_values))
    if center.lost and not center.failed:
        # An op the replay could not take loses the values downstream of it; the others are
        # replanned without it and replayed afresh (their calls' indices start over).
        for w, why in center.lost.items():
            spreads[w] = NodeSpread(status="not-judged", reason=why)
            del live[w]
        order = cone(graph, [by_name[w] for w in live])
        cache, plan = _CallCache(), _ReplayPlan.of(order)
        t0, t0_cpu = time.monotonic(), time.process_time()  # the cost of the replay that stays
        center = _replay(plan, set(live), _centre_mode(options, cache, live, arm_values))
    _parallel(threads, max(center.numel.values(), default=0))
    cancellations = center.cancellations
    if center.failed:
        for w in live:
            spreads[w] = NodeSpread(status="not-judged", reason=center.lost.get(w, center.failed))
        return Simulation(spreads, time.monotonic() - start, 0)
    for w in [w for w, ref in live.items() if getattr(center.values.get(w), "shape", None) != ref.shape]:
        spreads[w] = NodeSpread(status="not-judged", reason="its replay has another shape than the arm's value")
        del live[w]
    if not live:
        return Simulation(spreads, time.monotonic() - start, 0)
    per_replay, k = _samples_that_fit(options, start, t0, t0_cpu)
    if k < options.samples and len(sys.modules) > modules:
        # The centre replay imported modules: a meta function's or a decomposition's first
        # call imports torch's symbolic shapes and sympy (0.6 s here, 40 s on a machine busy
        # with other jobs), once per process, not once per replay. Timed again without them,
        # on a cache of its own (gh-37130's 8 ops and gh-158310's 17 went unjudged under load,
        # and a correct fp16 LogSoftmax was then judged by float64 alone: `likely-bug`).
        t0, t0_cpu = time.monotonic(), time.process_time()
        _replay(plan, set(live), RoundingMode(options, _CallCache(), direction=0, generator=None))
        per_replay, k = _samples_that_fit(options, start, t0, t0_cpu)
    numel = sum(ref.numel() for ref in live.values())
    k = min(k, max(0, options.memory_bytes // max(1, numel * 8) - 2))
    if k < options.min_samples:
        why = (f"one replay of its {len(order)} ops takes {per_replay:.2f} s: {options.min_samples} samples do not "
               f"fit the {options.budget_s:.0f} s budget" if numel * 8 * options.min_samples < options.memory_bytes
               else "the observed values are too large to keep enough samples in memory")
        for w in live:
            spreads[w] = NodeSpread(status="not-judged", reason=why)
        return Simulation(spreads, time.monotonic() - start, 0, note=why)
    collapsed = _exact_terms(order, _collapsible(order, set(live), plan.repeats, center.numel),
                             options)
    calibrating = {s.name for g in collapsed for s in g.sources}
    # Small values, many ops: the replays' cost is the Python around each op, which a stack of
    # replays pays once (`RoundingMode.samples`). Not with reductions drawn whole (their
    # replays differ from sample to sample) nor for large values.
    largest = max(center.numel.values(), default=1)
    per_stack = 0 if collapsed or largest > STACKED_VALUE_ELEMENTS else STACKED_ELEMENTS // max(1, largest)
    directed: dict[int, _Replayed] = {}
    first: list[_Replayed] = []  # the samples stacked with the directed replays
    sampling = time.monotonic()  # the samples' own cost (with the directed replays': the larger) from here
    if per_stack >= 3:  # up, down and the samples up to the first point where sampling may stop
        batch = min(min([c for c in CHECKPOINTS if c < k] + [k]), per_stack - 2)
        directions = torch.tensor([1.0, -1.0] + [0.0] * batch, dtype=torch.float64)
        g = Draws(options.seed * 1_000_003)
        stacked = _replay(plan, set(live), RoundingMode(options, cache, direction=directions, generator=g,
                                                        samples=batch + 2))
        if stacked.failed:  # replayed one at a time, from here on
            per_stack = 0
        else:
            up, down, *first = stacked.split(batch + 2)
            directed = {1: up, -1: down}
    for direction in (1, -1):
        if direction not in directed:
            directed[direction] = _replay(plan, set(live), RoundingMode(options, cache, direction=direction,
                                                                       generator=None))
    failed = next((r.failed for r in directed.values() if r.failed), None)
    if failed:
        for w in live:
            spreads[w] = NodeSpread(status="not-judged", reason=failed)
        return Simulation(spreads, time.monotonic() - start, 0)
    samples: list[_Replayed] = []
    scored: dict[str, tuple[int, NodeSpread]] = {}  # the statistics at the last check, reused if sampling ends there
    # More samples where the arm's value sits near the Monte Carlo floor, within the time and
    # memory budgets: K per replay's cost, and never past max_samples.
    fits_time = int((options.budget_s - (time.monotonic() - start)) / per_replay) - 2
    fits_memory = options.memory_bytes // max(1, numel * 8) - 2
    ceiling = max(k, min(options.max_samples, fits_time, fits_memory))
    i = 0
    while i < k:
        # The samples up to the next point where sampling may stop, as one stack.
        batch = min(min([c for c in CHECKPOINTS if i < c < k] + [k]) - i, per_stack)
        g = Draws(options.seed * 1_000_003 + i)
        reps, first = first, []
        if batch > 1 and not reps:
            stacked = _replay(plan, set(live), RoundingMode(options, cache, direction=0, generator=g, samples=batch))
            reps = [] if stacked.failed else stacked.split(batch)
            if not reps:  # a stack that failed is replayed one sample at a time, from here on
                per_stack = 0
        if not reps and (i < CALIBRATION_REPLAYS or not collapsed):
            reps = [_replay(plan, set(live) | calibrating, RoundingMode(options, cache, direction=0, generator=g))]
        elif not reps:
            drawn = {center.calls[r.name][0]: error for group in collapsed
                     for r, error in zip(group.reductions, group.errors(g), strict=False)}
            reps = [_replay(plan, set(live), RoundingMode(options, cache, direction=0, generator=g, collapsed=drawn),
                            collapsed, center.calls)]
        failed = next((r.failed for r in reps if r.failed), None)
        if failed:
            for w in live:
                spreads[w] = NodeSpread(status="not-judged", reason=failed)
            return Simulation(spreads, time.monotonic() - start, i)
        samples.extend(reps)
        i += len(reps)
        if collapsed and i == CALIBRATION_REPLAYS:
            collapsed = _calibrate(collapsed, samples)
        if len(samples) in CHECKPOINTS and len(samples) < k \
                and _settled(live, samples, arm_values, out_dtypes, directed, scored):
            break
        if i == k and k < ceiling and _near_floor(live, samples, arm_values, out_dtypes, directed, scored):
            # The samples' own cost, not the centre replay's, decides how many more fit the
            # budget (a compiled graph's samples took 0.4 s each against a 0.3 s centre: 199 of
            # them ran 78 s of a 60 s budget).
            each = (time.monotonic() - sampling) / i
            left = options.budget_s - (time.monotonic() - start)
            k = min(ceiling, k + EXTENSION, i + max(0, int(left / each)))
    k = len(samples)
    # The statistics are a few passes over K × numel values: there threads pay.
    torch.set_num_threads(threads)
    cancellations = {**amplification_sites(order, center.calls, cache), **cancellations}
    noted = set(center.discrete) | set(center.unmeasured) | set(cancellations) | set(center.overflows)
    upstream = _upstream(order, {by_name[w] for w in live}, noted, set(cache.constants))
    for w, ref in live.items():
        dtype = out_dtypes.get(w, torch.float32)
        up, down = _stored(directed[1].values[w], dtype), _stored(directed[-1].values[w], dtype)
        count, checked = scored.get(w, (0, None))
        if count == k:
            spreads[w] = checked
            checked.up, checked.down = up, down
        else:
            spreads[w] = _spread(ref, [s.values[w] for s in samples], up, down, stored=dtype)
        dtypes, above = upstream[by_name[w]]
        centre = _stored(center.values[w], dtype)  # a complex one as its real pairs, as σ is
        spreads[w].centre = torch.view_as_real(centre.resolve_conj()) if centre.is_complex() else centre
        spreads[w].flips = _flips(center, samples + [directed[1], directed[-1]], above)
        spreads[w].precision = working_precision(dtypes, dtype)
        spreads[w].unmeasured = sorted(set().union(*(center.unmeasured.get(x, set()) for x in above)))
        spreads[w].cancellations = sorted((dict(site, node=name) for name, site in cancellations.items()
                                           if name in above), key=lambda x: -x["digits_lost"])[:3]
        spreads[w].overflow = next((dict(site, node=name) for name, site in center.overflows.items() if name in above),
                                   None)
    return Simulation(spreads, time.monotonic() - start, k,
                      drawn_whole=[r.name for g in collapsed for r in g.reductions])


def _centre_mode(options: SimulationOptions, cache: _CallCache, live: dict[str, torch.Tensor],
                 arm_values: dict[str, torch.Tensor]) -> RoundingMode:
    """The centre replay's mode. Where a value is not finite (the arm's or its float64 one),
    it notes which op first leaves its dtype's range: one check per op, only then."""
    mode = RoundingMode(options, cache, direction=0, generator=None)
    mode.note_overflows = any(not bool(torch.isfinite(v).all()) for v in list(live.values())
                              + [arm_values[w] for w in live if isinstance(arm_values.get(w), torch.Tensor)]
                              if v.is_floating_point() or v.is_complex())
    return mode


# How far past its budget the clock may run the fewest samples whose own work fits it.
BUDGET_OVERRUN = 1.25


def _samples_that_fit(options: SimulationOptions, start: float, t0: float, t0_cpu: float) -> tuple[float, int]:
    """A replay's cost by the one timed from `t0` (the clock's, and its own work) and the
    samples that fit the rest of the budget at that cost."""
    per_replay = max(time.monotonic() - t0, 1e-4)
    left = options.budget_s - (time.monotonic() - start)
    k = min(options.samples, int(left / per_replay) - 2)
    # Whether the fewest samples fit is decided by the replay's own work (its CPU time, where
    # that is less than the clock's) while the clock overruns the budget by at most a quarter:
    # on a machine busy with other jobs a centre replay's clock time ran 10× its work, one
    # replay short of 9 samples, and a value judged alone went unjudged (`inconclusive`).
    own = max(min(time.monotonic() - t0, time.process_time() - t0_cpu), 1e-4)
    if k < options.min_samples <= int(left / own) - 2 \
            and (options.min_samples + 2) * per_replay <= BUDGET_OVERRUN * left:
        k = options.min_samples
    return per_replay, k


# Values of at least this many elements are replayed on all the arm's threads: each op is
# then passes over megabytes, which threads share (a 2M-element bf16 mean's replays: twice
# as fast on 2 cores), where on small values the hand-offs cost more than the op.
PARALLEL_ELEMENTS = 1 << 16


def _parallel(threads: int, largest: int) -> None:
    """The replays' thread count for values of up to `largest` elements."""
    torch.set_num_threads(threads if largest >= PARALLEL_ELEMENTS else 1)


# -- large reductions, drawn whole ----------------------------------------------------------
# A sum or mean of at least this many terms per output element whose terms are computed
# elementwise from leaves alone: its random replays take the terms' exact value and draw the
# rounding they carry as one normal error per output element (below), instead of rounding
# every term in every replay (K passes of a dozen over millions of elements).
ANALYTIC_TERMS = 1 << 16
# Full random replays that measure that error before the other samples draw it: one gives
# Σδᵢ² over ≥ ANALYTIC_TERMS independent terms, within √(2/n) < 1 % of its expectation.
CALIBRATION_REPLAYS = 1
# Elementwise ops affine in the chain's values (in the one argument that comes from the
# chain, for a product or a quotient's numerator): each term's error is then the sum of
# its roundings, each unbiased, carried linearly, so the reduction's error has mean zero.
# A nonlinear op (x², exp) biases every term by about its second derivative times the
# roundings' variance: n such biases grow faster than the √n of their spread (float16 terms
# of a million-element sum: four times), which the full replays keep and a zero-mean draw
# would not.
AFFINE = {"add", "sub", "rsub", "neg", "_to_copy", "clone"}
SCALED = {"mul", "div"}  # affine when only the first (mul: either) argument comes from the chain


@dataclass
class _Collapsed:
    """Large reductions whose random replays draw their terms' rounding whole. The terms
    (each reduction's input, computed by the elementwise `chain` from leaves) err
    independently from element to element, so their rounding reaches a sum as Σδᵢ: normal
    (central limit), of covariance Σ E[δᵢδ'ᵢ] between two reductions of the same chain (a
    float16 and a float32 mean of one tensor err together), measured from full replays.
    Each reduction's own accumulation is modelled as before (`_accumulate`); the centre and
    directed replays still run every op."""

    reductions: list[fx.Node]
    chain: set[fx.Node]
    exact: dict[fx.Node, torch.Tensor] = field(default_factory=dict)  # each input, float64, no rounding
    factor: torch.Tensor | None = None  # (*output shape, m, m): the errors are factor @ z, z ~ N(0, 1)

    @property
    def sources(self) -> list[fx.Node]:
        return [r.args[0] for r in self.reductions]

    def errors(self, generator: Draws) -> list[torch.Tensor]:
        """One joint draw of the reductions' errors from their terms' rounding."""
        z = torch.from_numpy(generator.normal(self.factor.shape[:-1]))
        drawn = (self.factor @ z.unsqueeze(-1)).squeeze(-1)
        return [drawn[..., j] for j in range(len(self.reductions))]


def _collapsible(order: list[fx.Node], live: set[str], same_as: dict[fx.Node, fx.Node],
                 numel: dict[str, int]) -> list[_Collapsed]:
    """Groups of sums and means of at least ANALYTIC_TERMS elements (`numel`, from the
    centre replay) whose inputs are computed from leaves by affine elementwise ops only,
    every op of those chains read by the chains or the group's reductions alone and none
    observed (reductions that share a chain form one group, drawn jointly): candidates for
    `_Collapsed`, their shapes and numbers of terms per output element checked on the values."""
    inside = set(order)
    shared = set(same_as) | set(same_as.values())
    chains: dict[fx.Node, set[fx.Node]] = {}
    for r in order:
        target = r.target
        if r.op != "call_function" or not isinstance(target, torch._ops.OpOverload) \
                or target.overloadpacket.__name__ not in ("sum", "mean") or not r.args \
                or not isinstance(r.args[0], fx.Node) or r.args[0].op != "call_function" \
                or numel.get(r.args[0].name, 0) < ANALYTIC_TERMS \
                or any(isinstance(a, fx.Node) for a in list(r.args[1:]) + list(r.kwargs.values())):
            continue
        chain: set[fx.Node] = set()
        stack = [r.args[0]]
        while stack and chain is not None:
            m = stack.pop()
            if m in chain or m.op == "placeholder":
                continue
            dtype = m.meta.get("dtype")
            if not (_affine_elementwise(m) and m.name not in live and m not in shared
                    and isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                chain = None
                break
            chain.add(m)
            stack.extend(m.all_input_nodes)
        if chain:
            chains[r] = chain
    groups: list[_Collapsed] = []
    for r, chain in chains.items():  # reductions whose chains meet join one group
        meeting = [g for g in groups if g.chain & chain]
        merged = _Collapsed([r], set(chain))
        for g in meeting:
            groups.remove(g)
            merged.reductions = g.reductions + merged.reductions
            merged.chain |= g.chain
        groups.append(merged)
    return [g for g in groups
            if all(u in g.chain or u in g.reductions for m in g.chain for u in m.users if u in inside)]


def _affine_elementwise(n: fx.Node) -> bool:
    """An elementwise op affine in its computed (non-leaf) arguments (AFFINE, SCALED)."""
    target = n.target
    if n.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or _written(target) \
            or torch.Tag.nondeterministic_seeded in target.tags:
        return False
    name = target.overloadpacket.__name__
    computed = [i for i, a in enumerate(n.args) if isinstance(a, fx.Node) and a.op != "placeholder"]
    if name in SCALED:
        return computed in ([], [0]) or name == "mul" and computed == [1]
    return name in AFFINE


def _reduction_of(r: fx.Node, terms: torch.Tensor) -> tuple[list[int], bool, float]:
    """The dims a sum or mean reduces, its keepdim, and the weight of each term (1/n for a mean)."""
    name = r.target.overloadpacket.__name__
    dims, keepdim = reduced_dims(name, tuple(r.args), dict(r.kwargs), terms)
    n = math.prod(terms.shape[d] for d in dims) if terms.dim() else 1
    return dims, keepdim, (1.0 / max(n, 1) if name == "mean" else 1.0)


def _exact_terms(order: list[fx.Node], candidates: list[_Collapsed], options: SimulationOptions) -> list[_Collapsed]:
    """Each group's terms computed in float64 without rounding (the values its random
    replays are unbiased around), kept where every op of its chains has one shape (no
    broadcast of a computed value) and its reductions add at least ANALYTIC_TERMS terms
    per output element over the same dims."""
    kept = []
    for g in candidates:
        chain_order = [n for n in order if n in g.chain or n.op == "placeholder"
                       and any(n in m.all_input_nodes for m in g.chain)]
        replay = _replay(_ReplayPlan.of(chain_order), {m.name for m in g.chain},
                         RoundingMode(options, _CallCache(), direction=0, generator=None, exact=True))
        values = [replay.values.get(m.name) for m in g.chain]
        if replay.failed or any(not isinstance(v, torch.Tensor) for v in values) \
                or len({tuple(v.shape) for v in values}) != 1:
            continue
        terms = values[0]
        forms = {(tuple(dims), keepdim) for dims, keepdim, _ in (_reduction_of(r, terms) for r in g.reductions)}
        if len(forms) != 1:
            continue
        dims, _ = forms.pop()
        if (math.prod(terms.shape[d] for d in dims) if terms.dim() else 1) < ANALYTIC_TERMS:
            continue
        # An overflow or a nan among the terms: no normal error describes it. One pass each,
        # with no temporary: a float64 sum of finite terms that overflows (past 1e308) only
        # leaves the reductions replayed in full.
        if not all(math.isfinite(float(v.sum())) for v in values):
            continue
        g.exact = {s: replay.values[s.name] for s in g.sources}
        kept.append(g)
    return kept


def _calibrate(groups: list[_Collapsed], replays: list[_Replayed]) -> list[_Collapsed]:
    """Each group's error factor from full replays' terms: the covariance of two reductions'
    errors per output element, Σᵢ wδᵢ·w'δ'ᵢ averaged over the replays (w the terms' weights),
    as a square root that keeps a singular one (two reductions of the same terms); the terms
    are then dropped from the replays (they were kept for this alone). The groups whose
    replays rounded a term to inf or nan are left out: their reductions replay in full."""
    calibrated = []
    for g in groups:
        covariance = None
        for rep in replays:
            deviations = []
            for r, s in zip(g.reductions, g.sources, strict=False):
                dims, keepdim, weight = _reduction_of(r, g.exact[s])
                deviations.append(((rep.values[s.name] - g.exact[s]) * weight, dims, keepdim))
            entries = [[torch.sum(a * b, dims, keepdim=keepdim) for b, _, _ in deviations]
                       for a, dims, keepdim in deviations]
            this = torch.stack([torch.stack(row, -1) for row in entries], -2)
            covariance = this if covariance is None else covariance + this
        for rep in replays:
            for s in g.sources:
                rep.values.pop(s.name, None)
        if not bool(torch.isfinite(covariance).all()):
            continue
        values, vectors = torch.linalg.eigh(covariance / len(replays))
        g.factor = vectors * values.clamp(min=0).sqrt().unsqueeze(-2)
        calibrated.append(g)
    return calibrated


# Sample counts at which sampling may stop (Besag & Clifford's sequential Monte Carlo test):
# once at least EARLY_EXCEEDING samples score as far out as the arm's value, its p-value is at
# least (1 + EARLY_EXCEEDING)/(K + 1) > 0.05 however the remaining samples fall.
CHECKPOINTS = (9, 19)
EARLY_EXCEEDING = 2
# Near the floor: fewer than this many samples score as far out as the arm's value, yet the
# value lies within FRAGILE_MARGIN times the samples' largest score (farther out, more samples
# would not change the call). Sampling then goes on EXTENSION at a time until at least
# ALPHA·(K+1) samples exceed it (certainly inside) or max_samples is reached.
NEAR_FLOOR_EXCEEDING = 2
EXTENSION = 10
# A value past FRAGILE_MARGIN, by up to this factor of the samples' largest score, is sampled
# further too: that largest score grows with the samples and the value's own statistic (its σ
# is estimated from them) firms up, so a value just past the margin at K = 29 is often within
# it at 199 (bench/seeds.py: 1e-5 injections that moved between "a finding" and "fragile" with
# triage's seed sat at 3.4–4.5× the largest score after 29–79 samples, at 3.4–3.9× after
# 199). Sampled to the end, the decision rests on all of them, not on the seed's first 29.
FRAGILE_SAMPLED = 1.5 * policy.FRAGILE_MARGIN


def _settled(live: dict[str, torch.Tensor], samples: list[_Replayed], arm_values: dict[str, torch.Tensor],
             out_dtypes: dict[str, torch.dtype], directed: dict[int, _Replayed],
             scored: dict[str, tuple[int, NodeSpread]]) -> bool:
    """Every observed value of the arm is decided, its non-finite values (if any) already
    occurring in the samples: certainly inside (enough samples at least as far out), or,
    once p ≤ α is possible, in its directed envelope past FRAGILE_MARGIN times every
    sample's score (a stagnating sum): it stays in the envelope unless a later sample lands
    that much farther out than all so far, and the envelope is never "outside"."""
    floor_reached = 1 / (len(samples) + 1) <= policy.ALPHA
    small = _scored_together(live, samples, arm_values, out_dtypes, scored)
    # Smallest first: the first value not yet decided ends the check, before a large one's
    # statistics (K passes over a million elements) are computed for nothing.
    for w, ref in sorted(live.items(), key=lambda item: item[1].numel()):
        value = arm_values.get(w)
        if value is None or ref.is_complex() or value.shape != ref.shape:
            return False
        partial, t, unmoved = small[w] if w in small else _scored(w, ref, value, samples, out_dtypes, scored)
        if bool((~torch.isfinite(value)).any()) or bool((partial.nonfinite != 1).any()):
            return False
        if policy.exceeding(partial.sample_stats, partial.sample_unmoved, t, unmoved) >= EARLY_EXCEEDING:
            continue
        dtype = out_dtypes.get(w, torch.float32)
        beyond = floor_reached and all(math.isfinite(x) for x in partial.sample_stats) \
            and t > policy.FRAGILE_MARGIN * max(partial.sample_stats, default=math.inf)
        if not (beyond and within_envelope(value, ref, _stored(directed[1].values[w], dtype),
                                           _stored(directed[-1].values[w], dtype), dtype)):
            return False
    return True


def _scored(w: str, ref: torch.Tensor, value: torch.Tensor, samples: list[_Replayed],
            out_dtypes: dict[str, torch.dtype],
            scored: dict[str, tuple[int, NodeSpread]]) -> tuple[NodeSpread, float, int]:
    """The spread of the samples so far (noted in `scored`; its directed replays are the
    reference until the end), and the arm's value's statistic and unmoved count against it."""
    stored = out_dtypes.get(w, torch.float32)
    partial = _spread(ref, [s.values[w] for s in samples], ref, ref, stored=stored)
    scored[w] = (len(samples), partial)
    value, slack = value.double(), one_spacing(ref, stored)
    return partial, deviation_stat(value, ref, partial.sigma, slack), unmoved_count(value, ref, partial.sigma, slack)


def _scored_together(live: dict[str, torch.Tensor], samples: list[_Replayed], arm_values: dict[str, torch.Tensor],
                     out_dtypes: dict[str, torch.dtype],
                     scored: dict[str, tuple[int, NodeSpread]]) -> dict[str, tuple[NodeSpread, float, int]]:
    """`_scored` of every small value finite everywhere (reference, samples, the arm's), as
    one pass over their elements side by side: a training loop observes hundreds of values of
    a few elements, each a dozen torch ops of statistics. Each element's figures are the ones
    `_finite_figures` computes; a value's scores are the maxima over its own elements."""
    names = [w for w, ref in live.items()
             if ref.is_floating_point() and 0 < ref.numel() <= NUMPY_ELEMENTS
             and isinstance(arm_values.get(w), torch.Tensor) and arm_values[w].shape == ref.shape
             and all(isinstance(s.values.get(w), torch.Tensor) and not s.values[w].is_complex() for s in samples)]
    if len(names) < 2 or not samples:
        return {}

    def stored_as(w: str) -> torch.dtype:  # as `_stored`: a discrete value is read as float64
        return out_dtypes.get(w, torch.float32) if samples[0].values[w].is_floating_point() else torch.float64

    names.sort(key=lambda w: str(stored_as(w)))  # one cast per stored dtype
    k = len(samples)
    ref = torch.cat([live[w].reshape(-1).double() for w in names]).numpy()
    value = torch.cat([arm_values[w].reshape(-1).double() for w in names]).numpy()
    stack = torch.stack([torch.cat([s.values[w].reshape(-1) for w in names]) for s in samples]).double()
    sizes = [live[w].numel() for w in names]
    offsets = np.cumsum([0] + sizes)
    first = 0
    slack = np.empty_like(ref)  # `one_spacing` of each element's stored dtype
    for dtype, group in itertools.groupby(names, key=stored_as):
        end = first + sum(1 for _ in group)
        columns = slice(int(offsets[first]), int(offsets[end]))
        stack[:, columns] = _stored(stack[:, columns], dtype)
        slack[columns] = one_spacing(torch.from_numpy(ref[columns]), dtype).numpy()
        first = end
    stack = stack.numpy()
    finite = np.isfinite(stack).all(axis=0) & np.isfinite(ref) & np.isfinite(value)
    keep = np.logical_and.reduceat(finite, offsets[:-1])
    # A value with a nonfinite element is scored by `_scored` (`keep`): its figures here are
    # computed and dropped, and where there is no spread the ratio is inf or 0 below.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        dev = stack - ref
        shift = dev.sum(axis=0) / k
        sd = np.sqrt(np.square(dev - shift).sum(axis=0) / max(k - 1, 1))
        sq = np.square(dev)
        total = sq.sum(axis=0)
        sigma = np.sqrt(total / k)
        loo = np.sqrt(np.maximum(total - sq, 0.0) / max(k - 1, 1))
        beyond = np.abs(dev) > slack
        ratio = np.where(loo > 0, np.abs(dev) / np.where(loo > 0, loo, 1.0), np.where(beyond, math.inf, 0.0))
        off = np.abs(value - ref)
        t = np.where(sigma > 0, off / np.where(sigma > 0, sigma, 1.0), np.where(off > slack, math.inf, 0.0))
    stats = np.maximum(np.maximum.reduceat(ratio, offsets[:-1], axis=1), 0.0)
    ts = np.maximum.reduceat(t, offsets[:-1])
    unmoved = np.add.reduceat(((loo == 0) & beyond).astype(np.int64), offsets[:-1], axis=1)
    arm_unmoved = np.add.reduceat(((sigma == 0) & (off > slack)).astype(np.int64), offsets[:-1])
    found = {}
    for i, w in enumerate(names):
        if not keep[i]:
            continue
        part = slice(int(offsets[i]), int(offsets[i + 1]))
        shape, reference = live[w].shape, live[w].double()
        mean = np.where((stack[:, part] == stack[0, part]).all(axis=0), stack[0, part], ref[part] + shift[part])
        partial = NodeSpread(status="judged", samples=k, sigma=torch.from_numpy(sigma[part]).reshape(shape),
                             up=reference, down=reference, mean=torch.from_numpy(mean).reshape(shape),
                             sd=torch.from_numpy(sd[part]).reshape(shape),
                             nonfinite=torch.ones(shape, dtype=torch.uint8), sample_stats=stats[:, i].tolist(),
                             sample_unmoved=unmoved[:, i].tolist())
        scored[w] = (k, partial)
        found[w] = (partial, float(ts[i]), int(arm_unmoved[i]))
    return found


def _near_floor(live: dict[str, torch.Tensor], samples: list[_Replayed], arm_values: dict[str, torch.Tensor],
                out_dtypes: dict[str, torch.dtype], directed: dict[int, _Replayed],
                scored: dict[str, tuple[int, NodeSpread]]) -> bool:
    """Some observed value's Monte Carlo p-value rests on one or two samples: one more sample
    at least as far out would turn "outside" into "inside" (or back). A value within its
    directed envelope cannot be judged outside however the samples fall (they only tell
    "inside" from "envelope", both rounding): it asks for no more samples, each of which
    costs a replay of the whole cone (seconds on a 2M-element tensor)."""
    k = len(samples)
    for w, ref in sorted(live.items(), key=lambda item: item[1].numel()):  # as `_settled`: small ones first
        value = arm_values.get(w)
        if value is None or ref.is_complex() or value.shape != ref.shape:
            continue
        dtype = out_dtypes.get(w, torch.float32)
        if within_envelope(value, ref, _stored(directed[1].values[w], dtype), _stored(directed[-1].values[w], dtype),
                           dtype):
            continue
        partial, t, _ = _scored(w, ref, value, samples, out_dtypes, scored)
        stats = [x for x in partial.sample_stats if math.isfinite(x)]
        if not stats or not math.isfinite(t):
            continue
        exceeding = sum(1 for x in stats if x >= t)
        needed = math.ceil(policy.ALPHA * (k + 1))
        if exceeding < max(NEAR_FLOOR_EXCEEDING, needed) and t <= FRAGILE_SAMPLED * max(stats):
            return True
    return False


def within_envelope(value: torch.Tensor, ref: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                    dtype: torch.dtype) -> bool:
    """Every element finite on all sides lies between the directed replays (and the
    reference), widened by half a unit in the last place of `dtype` for the arm's own final
    rounding: the judge's envelope (`triage.judge.decide`), which rules out "outside"."""
    value = value.double()
    lo = torch.minimum(torch.minimum(up, down), ref)
    hi = torch.maximum(torch.maximum(up, down), ref)
    both = torch.isfinite(value) & torch.isfinite(lo) & torch.isfinite(hi)
    if not bool(both.any()):
        return True
    half_ulp = torch.from_numpy(policy.half_ulp(value.numpy(), str(dtype).removeprefix("torch.")))
    return bool(((value >= lo - half_ulp) & (value <= hi + half_ulp))[both].all())


# -- the statistic ------------------------------------------------------------------------
def one_spacing(ref: torch.Tensor, stored: torch.dtype | None) -> torch.Tensor:
    """`policy.spacing` of the stored dtype at each reference value (a bilinear interpolation's
    weights of 0 and 1 computed another way land on the neighbour of an exact value); 0 for a
    discrete value (None, or not a floating dtype)."""
    if stored is None or not (stored.is_floating_point or stored.is_complex):
        return torch.zeros(ref.shape, dtype=torch.float64)
    return torch.from_numpy(np.asarray(policy.spacing(ref.detach().double().numpy(), str(stored).removeprefix("torch.")),
                                       dtype=np.float64)).reshape(ref.shape)


def unmoved_count(value: torch.Tensor, ref: torch.Tensor, sigma: torch.Tensor, slack: torch.Tensor | float = 0.0
                  ) -> int:
    """Elements, finite in both, where the value is past `slack` (`one_spacing`) from the
    reference and no sample moves (σ 0): each makes T infinite, and their count orders two
    infinite statistics."""
    value, ref, sigma = value.double(), ref.double(), sigma.double()
    both = torch.isfinite(value) & torch.isfinite(ref)
    return int(((sigma == 0) & ((value - ref).abs() > slack) & both).sum())


def deviation_stat(value: torch.Tensor, ref: torch.Tensor, sigma: torch.Tensor,
                   slack: torch.Tensor | float = 0.0) -> float:
    """T = max over elements finite in both of |value - ref| / sigma (inf where sigma is 0
    and the value is past `slack` from the reference, `one_spacing`). One scalar per tensor:
    one test, not one per element."""
    value, ref, sigma = value.double(), ref.double(), sigma.double()
    both = torch.isfinite(value) & torch.isfinite(ref)
    if not bool(both.any()):
        return 0.0
    dev = (value - ref).abs()
    ratio = torch.where(sigma > 0, dev / torch.where(sigma > 0, sigma, torch.ones_like(sigma)),
                        torch.where(dev > slack, torch.full_like(dev, math.inf), torch.zeros_like(dev)))
    return float(ratio[both].max())


def _spread(ref: torch.Tensor, values: list[Any], up: torch.Tensor, down: torch.Tensor,
            stored: torch.dtype | None = None) -> NodeSpread:
    """The samples' statistics around the reference, element by element: σ (their RMS
    deviation), their mean and sd, which nonfinite values they reached, and each sample's
    score T_k. `stored`: the samples are replays' values, each read as the arm stores it
    (`_stored`). Over SPREAD_CHUNK columns at a time: K samples of a million elements are
    a dozen passes over K × 8 MB, which a chunk makes in cache (and never holds whole)."""
    if stored is not None:
        values = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]
    if ref.is_complex():
        # A conjugate view (`fft.ihfft`'s result) has no real view until it is resolved.
        ref = torch.view_as_real(ref.resolve_conj())
        values = [torch.view_as_real((_stored(v, stored) if stored is not None else v).resolve_conj())
                  for v in values]
        up, down, stored = torch.view_as_real(up.resolve_conj()), torch.view_as_real(down.resolve_conj()), None
    k = len(values)
    flat_ref = ref.reshape(-1)
    flat = [v.reshape(-1) for v in values]
    n = flat_ref.numel()
    width = max(1024, SPREAD_CHUNK // max(k, 1))
    slack = one_spacing(flat_ref, stored)

    def figures_of(part: slice) -> tuple[torch.Tensor, ...]:
        return _spread_figures(flat_ref[part], torch.stack([_stored(v[part], stored) if stored is not None else v[part]
                                                            for v in flat]), slack[part])

    if n <= width:
        *figures, scores, unmoved = figures_of(slice(0, n))
    else:
        figures = [torch.empty(n, dtype=torch.float64) for _ in range(3)] + [torch.empty(n, dtype=torch.uint8)]
        scores = torch.full((k,), -1.0, dtype=torch.float64)
        unmoved = torch.zeros(k, dtype=torch.int64)
        for a in range(0, n, width):
            part = slice(a, min(n, a + width))
            *pieces, chunk_scores, chunk_unmoved = figures_of(part)
            for whole, piece in zip(figures, pieces, strict=True):
                whole[part] = piece
            torch.maximum(scores, chunk_scores, out=scores)
            unmoved += chunk_unmoved
    sigma, mean, sd, nonfinite = (f.reshape(ref.shape) for f in figures)
    return NodeSpread(status="judged", samples=k, sigma=sigma, up=up, down=down, mean=mean, sd=sd,
                      nonfinite=nonfinite, sample_stats=[max(float(x), 0.0) for x in scores] if n else [0.0] * k,
                      sample_unmoved=unmoved.tolist() if n else [0] * k)


# Elements of K samples `_spread` takes at a time: 1 MB of float64, whose dozen passes stay
# in the cache (K = 29 samples of 2M elements: 1.0 s, against 3.5 s over the whole stack).
SPREAD_CHUNK = 1 << 17


def _spread_figures(ref: torch.Tensor, stack: torch.Tensor, slack: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_spread`'s figures of one chunk (`ref` (n,), `stack` (K, n)): σ, mean, sd, the
    nonfinite bits, each sample's largest ratio (-1 where none is finite) and its count of
    elements off the reference where no other sample is (`policy.exceeding`)."""
    if bool(torch.isfinite(stack).all()) and bool(torch.isfinite(ref).all()):
        return _finite_figures(ref, stack, slack)
    k = stack.shape[0]
    own_finite = torch.isfinite(stack)
    finite = own_finite & torch.isfinite(ref)
    dev = torch.where(finite, stack - ref, 0.0)
    nfin = finite.sum(0)
    # Mean and sd of the samples from their deviations (shift-invariant, and exact in float64).
    shift = dev.sum(0) / nfin.clamp(min=1)
    mean = torch.where(nfin > 0, ref + shift, torch.where(own_finite, stack, 0.0).sum(0) / own_finite.sum(0).clamp(min=1))
    # Where every finite sample is one value, the mean is that value: ref + shift leaves a
    # residue of the reference's last bits (0 everywhere, ref 0.01: a mean of 1.7e-18), which
    # reads as a spread where there is none.
    common = torch.where(finite, stack, -math.inf).amax(0)
    mean = torch.where((nfin > 0) & (~finite | (stack == common)).all(0), common, mean)
    sd = (torch.where(finite, dev - shift, 0.0).square().sum(0) / (nfin - 1).clamp(min=1)).sqrt()
    sq = dev.square()
    total = sq.sum(0)
    sigma = (total / nfin.clamp(min=1)).sqrt()
    # Each sample scored as the arm's value will be: T_k = max |x_k - ref| / σ without x_k
    # (leave one out), over the elements finite in both.
    loo = ((total - sq).clamp(min=0) / (nfin - finite.to(nfin.dtype)).clamp(min=1)).sqrt()
    beyond = dev.abs() > slack  # where no other sample moves: past the next representable value
    ratio = torch.where(loo > 0, dev.abs() / torch.where(loo > 0, loo, 1.0), torch.where(beyond, math.inf, 0.0))
    unmoved = (finite & (loo == 0) & beyond).reshape(k, -1).sum(1)
    ratio = torch.where(finite, ratio, -1.0).reshape(k, -1)
    scores = ratio.max(1).values if ratio.shape[1] else torch.full((k,), -1.0, dtype=torch.float64)
    # Nonfinite outcomes from the random replays only: rounding every op toward -inf turns an
    # overflow into the largest finite value, which no round-to-nearest arm ever does.
    bits = (own_finite.any(0).to(torch.uint8)
            | (torch.isposinf(stack).any(0).to(torch.uint8) << 1)
            | (torch.isneginf(stack).any(0).to(torch.uint8) << 2)
            | (torch.isnan(stack).any(0).to(torch.uint8) << 3))
    return sigma, mean, sd, bits, scores, unmoved


def _finite_figures(ref: torch.Tensor, stack: torch.Tensor, slack: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_spread_figures` where every sample and the reference are finite (the common case):
    the same statistics without the masks, a third of the passes."""
    k = stack.shape[0]
    dev = stack - ref
    shift = dev.sum(0) / k
    sd = ((dev - shift).square_().sum(0) / max(k - 1, 1)).sqrt_()
    sq = dev.square()
    total = sq.sum(0)
    sigma = (total / k).sqrt()
    # T_k leave one out, as in `_spread_figures`.
    loo = (total - sq).clamp_(min=0).div_(max(k - 1, 1)).sqrt_()
    # No spread left out: a deviation past the next representable value is infinitely far.
    beyond = dev.abs() > slack
    at_zero = torch.where(beyond, math.inf, 0.0)
    unmoved = ((loo == 0) & beyond).reshape(k, -1).sum(1)
    ratio = torch.where(loo > 0, dev.abs_().div_(torch.where(loo > 0, loo, 1.0)), at_zero)
    ratio = ratio.reshape(k, -1)
    scores = ratio.max(1).values if ratio.shape[1] else torch.full((k,), -1.0, dtype=torch.float64)
    mean = torch.where((stack == stack[0]).all(0), stack[0], ref + shift)  # as `_spread_figures`: one value, exactly
    return sigma, mean, sd, torch.ones(ref.shape, dtype=torch.uint8), scores, unmoved


def _stored(v: Any, dtype: torch.dtype) -> torch.Tensor:
    """A replay's value as the arm stores it: rounded to nearest in the arm's dtype."""
    t = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
    if dtype in FORMATS and t.is_floating_point():
        return t.to(dtype).double()
    if not (t.is_floating_point() or t.is_complex()):
        return t.double()  # a discrete value, measured as a number (`_simulate`'s live values)
    return widen(t)


def _flips(center: _Replayed, runs: list[_Replayed], upstream: frozenset[str]) -> list[dict[str, Any]]:
    """Discrete decisions `upstream` of a value (comparisons, argmax, masks) that come out
    differently in some replay than in the unperturbed one: the value rests on a branch that
    rounding alone can switch."""
    out = []
    for name, base in center.discrete.items():
        if name not in upstream:
            continue
        changed = sum(1 for r in runs if name in r.discrete and not _same_decision(r.discrete[name], base))
        if changed:
            node = center.nodes[name]
            # One output of a multi-output op (`topk(...).indices`): the op decides.
            deciding = node.args[0] if node.target is operator.getitem and isinstance(node.args[0], fx.Node) else node
            flip = {"node": name, "op": _op_name(deciding.target), "line": node.meta.get("line"),
                    "replays": changed, "of": len(runs)}
            if deciding.name in center.ties:
                flip["ties"] = True
            out.append(flip)
    return out[:8]


def _same_decision(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two replays' values of a decision alike: a floating one's NaNs (`floor` of a NaN) alike too."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


# Ops whose floating result is a decision rounding switches, as an argmax's: a histogram's
# counts (which bin each value falls in, at a bin edge) and a rounding to an integer (which
# integer, at a half or a whole: `floor(p * 100)` of a price of 0.53 in float32).
DECISIONS = {"histc", "histogram", "histogramdd", "_histogramdd_from_bin_cts", "_histogramdd_from_bin_tensors",
             "floor", "ceil", "round", "trunc", "fix"}


def _decides(n: fx.Node) -> bool:
    """Whether `n`'s floating value is a decision (`DECISIONS`; a getitem of one's outputs)."""
    op = n.args[0].target if n.target is operator.getitem and n.args and isinstance(n.args[0], fx.Node) else n.target
    return isinstance(op, torch._ops.OpOverload) and op.overloadpacket.__name__.rstrip("_") in DECISIONS


def _is_index(a: Any) -> bool:
    """An integer tensor (not a mask): positions an op may read memory at."""
    return isinstance(a, torch.Tensor) and not (a.is_floating_point() or a.is_complex()) and a.dtype != torch.bool


# Selections whose result, where values tie exactly, is the kernel's own choice among them:
# which index comes first (sort is not stable unless asked, topk's order is unspecified) or
# which of the equal extremes an argmax names. The replays round equal values apart, so a
# tie shows as a decision rounding switches; it is not rounding's.
TIE_SELECTIONS = {"sort", "argsort", "msort", "topk", "argmax", "argmin", "max", "min", "kthvalue"}


def _exact_ties(func: Any, args: tuple, kwargs: dict, out: Any) -> bool:
    """Whether a selection (`TIE_SELECTIONS`) on the centre replay's values, which are the
    arm's, picked among exactly equal floating values: an ordering with two equal values, a
    top-k whose k-th value also lies outside it, an extreme that occurs twice along its
    dimension."""
    name = func.overloadpacket.__name__
    x = args[0] if args else None
    if name not in TIE_SELECTIONS or not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() < 2:
        return False
    schema = {a.name: i for i, a in enumerate(func._schema.arguments)}
    dim = kwargs.get("dim", args[schema["dim"]] if "dim" in schema and schema["dim"] < len(args) else None)
    if name in ("max", "min") and dim is None:
        return False  # the value alone: no index to choose
    values = out[0] if isinstance(out, (tuple, list)) else out
    if name in ("sort", "msort", "argsort"):
        d = -1 if dim is None else dim
        ordered = torch.sort(x, dim=d).values
        return bool((ordered.narrow(d, 1, ordered.shape[d] - 1) == ordered.narrow(d, 0, ordered.shape[d] - 1)).any())
    if name in ("topk", "kthvalue"):
        d = -1 if dim is None else dim
        if not isinstance(values, torch.Tensor) or values.numel() == 0:
            return False
        if name == "kthvalue":
            edge = values.unsqueeze(d) if values.dim() < x.dim() else values
            return bool(((x == edge).sum(dim=d) > 1).any())
        # Two equal values picked (their order is the kernel's), or the k-th also left out.
        ordered = torch.sort(values, dim=d).values
        n = ordered.shape[d]
        if n > 1 and bool((ordered.narrow(d, 1, n - 1) == ordered.narrow(d, 0, n - 1)).any()):
            return True
        largest = kwargs.get("largest", args[schema["largest"]] if schema["largest"] < len(args) else True)
        edge = ordered.narrow(d, 0, 1) if largest else ordered.narrow(d, n - 1, 1)
        return bool(((x == edge).sum(dim=d) > 1).any())
    if dim is None:  # argmax/argmin of the flattened value
        extreme = x.max() if name == "argmax" else x.min()
        return bool((x == extreme).sum() > 1)
    extreme = x.amax(dim=dim, keepdim=True) if name in ("argmax", "max") else x.amin(dim=dim, keepdim=True)
    return bool(((x == extreme).sum(dim=dim) > 1).any())


def _upstream(order: list[fx.Node], targets: set[fx.Node], noted: set[str], exact: set[fx.Node] | None = None
              ) -> dict[fx.Node, tuple[frozenset[torch.dtype], frozenset[str]]]:
    """For each target, the floating dtypes its computation ran in (compiled regions' ops
    included) and which of the `noted` nodes it depends on (itself included): one pass over
    the graph for all observed values, where a cone per value walks the graph once each.
    `exact`: values no replay changes (leaves, their views and exact casts, `w / 8`), whose
    dtype rounded nothing: a float64 convolution of float32 inputs ran in float64."""
    found: dict[fx.Node, tuple[frozenset[torch.dtype], frozenset[str]]] = {}
    for n in order:
        dtypes, names = set(), {n.name} & noted
        d = n.meta.get("dtype")
        if isinstance(d, torch.dtype) and _roundoff(d) is not None and n not in (exact or ()):
            dtypes.add(d)
        if n.meta.get("matmul_inputs") == "bf16":  # oneDNN read its float32 inputs as bfloat16
            dtypes.add(torch.bfloat16)
        gm = getattr(n.target, "gm", None)
        for inner in gm.graph.nodes if gm is not None else ():
            value = inner.meta.get("example_value")
            if isinstance(value, torch.Tensor) and value.dtype in UNIT_ROUNDOFF:
                dtypes.add(value.dtype)
        for a in n.all_input_nodes:
            dtypes |= found[a][0]
            names |= found[a][1]
        found[n] = (frozenset(dtypes), frozenset(names))
    return {t: found[t] for t in targets}


def working_precision(dtypes: frozenset[torch.dtype], stored: torch.dtype) -> str:
    """The least precise floating dtype of a value's computation (`dtypes`, and the dtype it
    is stored in): an fp16 sum cast to float32 keeps fp16's precision."""
    found = {d for d in set(dtypes) | {stored} if _roundoff(d) is not None}
    # Of float32 and complex64 (one precision), the one of the value's kind is named.
    least = max(found, key=lambda d: (_roundoff(d), d.is_complex == stored.is_complex)) if found else stored
    return str(least).replace("torch.", "")


def _roundoff(d: torch.dtype) -> float | None:
    """The unit roundoff of a floating dtype, or of a complex dtype's parts; None for others."""
    return UNIT_ROUNDOFF.get(COMPLEX_PARTS.get(d, d))


def _cone_names(target: fx.Node) -> set[str]:
    cached = target.meta.get("_rounding_cone")
    if cached is None:
        cached = {n.name for n in cone(target.graph, [target])}
        target.meta["_rounding_cone"] = cached
    return cached


# -- replaying the graph ------------------------------------------------------------------
@dataclass
class _Replayed:
    values: dict[str, Any]
    discrete: dict[str, torch.Tensor]
    nodes: dict[str, fx.Node]
    failed: str | None = None
    cancellations: dict[str, dict[str, Any]] = field(default_factory=dict)
    overflows: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> where it leaves the range
    unmeasured: dict[str, set[str]] = field(default_factory=dict)  # node -> library ops with no measurement
    calls: dict[str, tuple[int, int]] = field(default_factory=dict)  # node -> the mode's call indices it used
    numel: dict[str, int] = field(default_factory=dict)  # node -> elements of its (tensor) value
    ties: set[str] = field(default_factory=set)  # selections that pick among exactly equal values (`_exact_ties`)
    lost: dict[str, str] = field(default_factory=dict)  # the centre's wanted values downstream of an op it could not replay

    def split(self, samples: int) -> list[_Replayed]:
        """A replay of `samples` stacked samples (`RoundingMode.samples`) as one replay per
        sample; a value that no sample perturbed (not stacked) is the same in each."""
        def sample(v: Any, k: int) -> Any:
            return v[k] if _is_stacked(v) else v

        return [_Replayed(values={w: sample(v, k) for w, v in self.values.items()},
                          discrete={w: sample(v, k) for w, v in self.discrete.items()}, nodes=self.nodes,
                          unmeasured=self.unmeasured) for k in range(samples)]


# Ops whose result is their input's value, unchanged: a replay takes that value as it is.
ALIASES = {torch.ops.aten.detach.default, torch.ops.aten.alias.default, torch.ops.aten.lift_fresh.default}


@dataclass
class _ReplayPlan:
    """What every replay of one cone reads and none changes: its order, where each value is
    last read, and the nodes whose value is an earlier node's (`same_as`: the repeated
    pointwise ops of `_common_subexpressions`, `repeats`, and aliases)."""

    order: list[fx.Node]
    inputs: dict[fx.Node, list[fx.Node]]  # each node's input nodes (fx builds the list anew on every read)
    frees: list[list[fx.Node]]  # by position in `order`: the values last read there
    same_as: dict[fx.Node, fx.Node]
    repeats: dict[fx.Node, fx.Node]
    written: dict[fx.Node, tuple[list[int], set[str]]]  # each in-place op's written positions and names

    @classmethod
    def of(cls, order: list[fx.Node]) -> _ReplayPlan:
        last_use = last_uses(order)
        repeats = _common_subexpressions(order)
        same_as = dict(repeats)
        for n in order:  # an alias is its input's value (a training loop's detaches: hundreds of ops)
            if n.op == "call_function" and n.target in ALIASES and n.args and isinstance(n.args[0], fx.Node):
                same_as[n] = same_as.get(n.args[0], n.args[0])
        for i, n in enumerate(order):
            if n in same_as:  # the first one's value serves the repeat too: keep it until then
                last_use[same_as[n]] = max(last_use.get(same_as[n], i), i)
        written = {n: (_written(n.target), {n.target._schema.arguments[j].name for j in _written(n.target)})
                   for n in order if isinstance(n.target, torch._ops.OpOverload) and _written(n.target)}
        frees: list[list[fx.Node]] = [[] for _ in order]
        for a, i in last_use.items():
            frees[i].append(a)
        return cls(order, {n: n.all_input_nodes for n in order}, frees, same_as, repeats, written)


# Ops that read a tensor's bits as another dtype: of a float64 stand-in they read float64's
# bits, not the arm's (a float32 element is one int32, its float64 stand-in two).
BITCASTS = {torch.ops.aten.view.dtype}


def _unjudgeable(order: list[fx.Node]) -> dict[fx.Node, str]:
    """Nodes whose value a replay cannot reproduce, and everything downstream of them."""
    why: dict[fx.Node, str] = {}
    for n in order:
        if n.op == "call_function" and getattr(n.target, "random", False):
            why[n] = "a compiled region upstream draws random numbers, which a replay cannot reproduce"
        elif n.op == "call_function" and n.target in BITCASTS:
            why[n] = "it reads a floating-point value's bits as another dtype, which a float64 replay does not hold"
        else:
            up = next((why[a] for a in n.all_input_nodes if a in why), None)
            if up:
                why[n] = up
    return why


def _replay(plan: _ReplayPlan, wanted: set[str], mode: RoundingMode,
            collapsed: list[_Collapsed] | None = None, calls: dict[str, tuple[int, int]] | None = None
            ) -> _Replayed:
    """One replay of the cone under `mode`; the centre replay (to nearest, unperturbed) also
    notes cancellations, the mode's call indices of every node and the values no replay
    changes (`_CallCache.constants`), which the later replays take as they are. Recorded aten
    ops go to the mode's handler directly (the dispatcher's round trip through a Python mode
    costs more than the op); a compiled region runs with the mode active, since its graph
    calls torch functions. `collapsed` reductions' chains are not replayed: their input is
    the exact value (the centre replay's `calls` keep every later call at its index)."""
    skipped = {m for c in collapsed or () for m in c.chain}
    exact = {s: v for c in collapsed or () for s, v in c.exact.items()}
    same_as = plan.same_as
    constants = mode.cache.constants
    env: dict[fx.Node, Any] = {}
    result = _Replayed(values={}, discrete={}, nodes={})
    underflows: dict[fx.Node, dict[str, Any]] = {}  # the centre's nodes that rounded a nonzero value to 0
    # The centre replay notes; the exact one (`_exact_terms`, its own cache) only computes.
    center = mode.generator is None and not mode.directed and not mode.exact
    # The centre replay goes on past an op it cannot replay: only what depends on that op is
    # lost (node -> why), and the caller replans the rest. Later replays replay only that rest.
    lost: dict[fx.Node, str] = {}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            for i, n in enumerate(plan.order):
                upstream_loss = next((lost[a] for a in plan.inputs[n] if a in lost), None) if lost else None
                if upstream_loss is None and n in same_as:
                    upstream_loss = lost.get(same_as[n])
                if upstream_loss is not None:
                    lost[n] = upstream_loss
                elif n in skipped:
                    start, end = calls[n.name]
                    mode.calls += end - start
                    if n in exact:
                        env[n] = exact[n]
                elif n in constants and not center:
                    start, end = mode.cache.calls[n]
                    mode.calls += end - start
                    env[n] = constants[n]
                elif n.op == "placeholder":
                    leaf = n.meta["leaf"]
                    if leaf.literal is not None and not center:
                        env[n] = mode.literal(leaf.literal, leaf.value.dtype, leaf.literal_error)
                    else:  # the centre's rounding of a literal, to nearest, is the arm's value
                        env[n] = widen(leaf.value)
                    env[n]._arm_dtype = leaf.value.dtype
                    if center and leaf.literal is None:  # a leaf held as recorded (not widened) is the recording's memory
                        mode.cache.keep(n, env[n], (mode.calls, mode.calls), owned=env[n] is not leaf.value)
                elif n in same_as and same_as[n] in env:
                    env[n] = env[same_as[n]]
                    if center and same_as[n] in constants:
                        mode.cache.keep(n, env[n], (mode.calls, mode.calls))
                elif n.op == "call_function":
                    mode.unmeasured = set()
                    mode.rounded = False
                    mode.underflowed = False
                    mode.flush = bool(n.meta.get("flush_denormal"))
                    mode.matmul_inputs = n.meta.get("matmul_inputs")
                    first_call = mode.calls
                    args = fx.node.map_arg(n.args, lambda a: env[a])
                    # A plain dict: the output dtypes are found on stand-ins given these kwargs,
                    # whose device is set on them (fx's mapped dict is immutable).
                    kwargs = dict(fx.node.map_arg(n.kwargs, lambda a: env[a]))
                    read = args  # what an in-place op reads, before it writes to its copy
                    try:
                        if n.target is operator.getitem:
                            env[n] = args[0][args[1]]
                        elif isinstance(n.target, torch._ops.OpOverload):
                            if n in plan.written:
                                mutable, names = plan.written[n]
                                args = tuple(mode.copy(a) if j in mutable and isinstance(a, torch.Tensor) else a
                                             for j, a in enumerate(args))
                                # out= arguments are keyword-only: copy those too.
                                kwargs = {k: mode.copy(v) if k in names and isinstance(v, torch.Tensor) else v
                                          for k, v in kwargs.items()}
                            try:
                                env[n] = mode.round_op(n.target, args, kwargs)
                            except RuntimeError:
                                if n.target not in VIEWS_OF_CONTIGUOUS or not args[0].is_floating_point() \
                                        or args[0].is_contiguous():
                                    raise
                                # The arm's value was contiguous where the replay's is not: a
                                # `.contiguous()` that copied nothing records no op, and a kernel
                                # replayed by its decomposition (attention's) lays its result out
                                # otherwise. The same values, viewed after a copy.
                                mode.calls = first_call
                                env[n] = mode.round_op(n.target, (_contiguous(args[0]),) + tuple(args[1:]), kwargs)
                            if "arm_choices" in n.meta:  # the order, signs and phases the arm chose
                                env[n] = arm_choices.align(n.target.overloadpacket.__name__, env[n],
                                                            n.meta["arm_choices"])
                        else:  # a compiled region: its dynamo graph, op by op
                            env[n] = mode.each_sample(functools.partial(_run_compiled, n.target, mode), args, {})
                    except Exception as e:  # noqa: BLE001 - the simulation only loses what depends on it
                        why = f"{_op_name(n.target)} could not be replayed: {type(e).__name__}: {str(e)[:160]}"
                        if not center:
                            result.failed = why
                            return result
                        lost[n] = why
                        mode.calls = first_call
                        continue
                    out = env[n]
                    result.calls[n.name] = (first_call, mode.calls)
                    if isinstance(out, torch.Tensor):
                        result.numel[n.name] = out.numel()
                    if mode.unmeasured:
                        result.unmeasured[n.name] = mode.unmeasured
                    if center:
                        # Operands no replay changes carry no rounding error for a cancellation
                        # to amplify: their difference is rounded once, to u (the exact inputs
                        # of a manual distance, `a[:, None] - b[None]`).
                        exact = all(a in constants for a in n.args[:2] if isinstance(a, fx.Node))
                        site = cancellation_at(n, read, out, exact_operands=exact)
                        if site is not None:
                            result.cancellations[n.name] = site
                        if isinstance(n.target, torch._ops.OpOverload) and _exact_ties(n.target, read, kwargs, out):
                            result.ties.add(n.name)
                        if mode.note_overflows:
                            if mode.underflowed:
                                underflows[n] = {"op": _op_name(n.target), "line": n.meta.get("line"),
                                                 "smallest": _smallest_positive(out)}
                            # An in-place op's inputs before its write.
                            left = _leaves_range(n, read, out, [underflows.get(a) for a in plan.inputs[n]])
                            if left is not None:
                                result.overflows[n.name] = left
                        if _unchanging(n, plan.inputs[n], constants, mode) or _representable(
                                n, plan.inputs[n], constants, mode, (first_call, mode.calls), args, kwargs, out):
                            mode.cache.keep(n, out, (first_call, mode.calls))
                    if isinstance(out, torch.Tensor) and (not (out.is_floating_point() or out.is_complex())
                                                          or _decides(n)):
                        result.discrete[n.name] = out
                        result.nodes[n.name] = n
                if n.name in wanted and n not in lost:
                    result.values[n.name] = env[n]
                for a in plan.frees[i]:
                    if a.name not in wanted:
                        env.pop(a, None)
    finally:
        torch.set_default_dtype(previous)
    result.lost = {n.name: why for n, why in lost.items() if n.name in wanted}
    if result.lost and len(result.lost) == len(wanted):
        result.failed = next(iter(result.lost.values()))
    return result


def _leaves_range(n: fx.Node, args: tuple, out: Any, underflows: list[dict[str, Any] | None]
                  ) -> dict[str, Any] | None:
    """Where an op's rounded result is ±inf or nan although every floating input is finite:
    the op, its line, its dtype and that dtype's largest finite value; with the input op that
    rounded a nonzero value to 0 (`underflows`, by input node), where an input holds zeros
    (log(0), x/0: an inf from an underflow, not from a value past the largest). A number the
    script passes is an input too: `masked_fill(mask, float("-inf"))` writes the script's own
    −inf, which leaves no range."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or bool(torch.isfinite(out).all()):
        return None
    if not all(bool(torch.isfinite(a).all()) if isinstance(a, torch.Tensor) else math.isfinite(a) for a in _flat(args)
               if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()) or isinstance(a, float)):
        return None
    dtype = getattr(out, "_arm_dtype", out.dtype)
    if not dtype.is_floating_point:
        return None
    zeros = any(isinstance(a, torch.Tensor) and a.is_floating_point() and bool((a == 0).any()) for a in _flat(args))
    underflow = next((u for u in underflows if u is not None), None) if zeros else None
    return {"op": _op_name(n.target), "line": n.meta.get("line"), "dtype": str(dtype).replace("torch.", ""),
            "largest": torch.finfo(dtype).max, "kind": "overflow" if bool(torch.isinf(out).any()) else "nan",
            "zeros": zeros and _nonfinite_at_zeros(args, out), "underflow": underflow}


def _nonfinite_at_zeros(args: tuple, out: torch.Tensor) -> bool:
    """Whether every non-finite element of `out` sits where an input (broadcast to it) is 0:
    log(0), x/0 — not a cube of large values beside a few zeros, which leaves the range."""
    bad = ~torch.isfinite(out)
    at_zero = torch.zeros_like(bad)
    for a in _flat(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            try:
                at_zero |= torch.broadcast_to(a == 0, out.shape)
            except RuntimeError:  # not elementwise with the result: no element to pair
                return False
    return bool(bad.any()) and bool((at_zero | ~bad).all())


def _smallest_positive(t: Any) -> float | None:
    """The smallest positive value of the arm dtype `t` holds (its smallest subnormal)."""
    dtype = getattr(t, "_arm_dtype", getattr(t, "dtype", None))
    return float(torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps) \
        if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _rounds_alike_when_repeated(target: Any) -> bool:
    """An aten op whose kernel, given the same inputs twice, rounds the same way twice: a
    deterministic pointwise op that writes to none of its inputs."""
    return (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags
            and torch.Tag.nondeterministic_seeded not in target.tags and not _written(target))


def _repeat_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """What makes two calls of such an op (`_rounds_alike_when_repeated`) round alike: the op,
    the same tensors unchanged since (identity and version) and equal other arguments; None
    for any other op."""
    if not _rounds_alike_when_repeated(func):
        return None
    flat, spec = tree_flatten((args, kwargs))
    try:
        parts = tuple((id(a), a._version) if isinstance(a, torch.Tensor) else repr(a) for a in flat)
    except Exception:  # noqa: BLE001 - an argument that does not print: never shared
        return None
    return func, repr(spec), parts


def _run_compiled(region: Any, mode: RoundingMode, *args: Any) -> Any:
    """A compiled region's dynamo graph run op by op under `mode`, on copies of its inputs
    (the graph may write to them). A pointwise op repeated on the same values inside it rounds
    as its first call did (`RoundingMode.repeats`), as `_common_subexpressions` has it for
    the recorded ops: a fused multiply-add contracting one of two equal products (Triton's,
    gh-122260) is a different evaluation, not rounding."""
    copies = tree_map(lambda a: mode.copy(a) if isinstance(a, torch.Tensor) else a, args)
    mode.repeats = {}
    try:
        with mode:
            return region(*copies)
    finally:
        mode.repeats = None


def _unchanging(n: fx.Node, inputs: list[fx.Node], constants: dict[fx.Node, Any], mode: RoundingMode) -> bool:
    """A node whose value is the same in every replay: an op the centre replay did not round
    (`RoundingMode.rounded`: a view, a selection, a widening copy) of values that are the same
    in every replay, and no random draw."""
    target = n.target
    if target is not operator.getitem and (not isinstance(target, torch._ops.OpOverload)
                                           or torch.Tag.nondeterministic_seeded in target.tags):
        return False
    return not mode.rounded and all(a in constants for a in inputs)


def _representable(n: fx.Node, inputs: list[fx.Node], constants: dict[fx.Node, Any], mode: RoundingMode,
                   calls: tuple[int, int], args: tuple, kwargs: dict, out: Any) -> bool:
    """A single correctly rounded op of values that are the same in every replay, whose float64
    result its arm dtype holds exactly: every rounding (to nearest, up, down, at random) leaves
    it as it is, so it is the same in every replay too. Labels cast to float (`(i % 2).float()`)
    are, and `1 - y` of them then cancels nothing a replay could move; so is a one-hot matrix
    cast to float (200,000 × 64: each replay rounded its 12.8M exact elements again, 0.16 s).
    Checked where the value would be kept (one more float64 pass in the centre replay)."""
    start, end = calls
    routed = mode.cache.routes.get(start)
    if (end - start != 1 or routed is None or routed[0] is not n.target or routed[2] != "correctly-rounded"
            or not all(a in constants for a in inputs) or mode.flush
            or not isinstance(out, torch.Tensor)
            or out.numel() * out.element_size() > CONSTANT_BYTES - mode.cache.constant_bytes
            or torch.Tag.nondeterministic_seeded in n.target.tags or _written(n.target)):
        return False  # an in-place or out= op run again would write over the replay's values
    exact = n.target(*args, **kwargs)
    return isinstance(exact, torch.Tensor) and exact.shape == out.shape and exact.is_complex() == out.is_complex() \
        and bool(torch.equal(exact.to(out.dtype), out))


def _power_of_two_scaling(name: str, args: tuple, kwargs: dict) -> bool:
    """A product or quotient by a power of two (`w / 8`, `x * 0.5`): exact wherever its result
    is in range, whether the kernel divides or multiplies by the reciprocal (where the table
    measured `div` beyond rounding: `x / 3` is `x * (1/3)`, two roundings), so rounded as a
    correctly rounded op. A measured kernel error there spread `w / 8`'s exact values, and a
    float64 convolution of them "kept 6 significant digits"."""
    if name.rstrip("_") not in ("mul", "div") or len(args) != 2 or kwargs.get("rounding_mode") is not None:
        return False
    scale = args[1] if name.rstrip("_") == "div" else next(
        (a for a in args if not isinstance(a, torch.Tensor) or a.dim() == 0), None)
    if isinstance(scale, torch.Tensor):
        if scale.dim() != 0 or not scale.is_floating_point() or _is_stacked(scale):
            return False
        scale = float(scale)
    return isinstance(scale, (int, float)) and math.isfinite(scale) and scale != 0 \
        and abs(math.frexp(scale)[0]) == 0.5


def _plain_add(name: str, args: tuple, kwargs: dict) -> bool:
    """`add`/`sub` without a scale (alpha 1): IEEE addition, correctly rounded whatever the
    table measured over OpInfo's samples, whose `alpha` makes a second rounding (or an FMA)."""
    if name.rstrip("_") not in ("add", "sub"):
        return False
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    return not isinstance(alpha, torch.Tensor) and alpha == 1


def _common_subexpressions(order: list[fx.Node]) -> dict[fx.Node, fx.Node]:
    """Each recorded pointwise op that repeats an earlier one — the same aten op on the same
    values with the same arguments — mapped to that earlier one. An elementwise kernel given
    the same inputs twice rounds the same way twice: `x*s - x*s` is exactly 0 on any arm, and
    only a different evaluation (a fused multiply-add contracting one product) makes it
    otherwise, which the simulation must not call rounding. Reductions, contractions and
    convolutions are left alone: their kernel and order follow settings that can change
    between two calls (threads, oneDNN, TF32). A call with flush-to-zero on repeats only
    another with it on."""
    first: dict[tuple, fx.Node] = {}
    same_as: dict[fx.Node, fx.Node] = {}
    canonical = lambda a: same_as.get(a, a)  # noqa: E731 - an argument as its first computation
    for n in order:
        if n.op != "call_function" or not _rounds_alike_when_repeated(n.target):
            continue
        try:
            key = (n.target, repr(fx.node.map_arg(n.args, canonical)), repr(fx.node.map_arg(n.kwargs, canonical)),
                   bool(n.meta.get("flush_denormal")))
        except Exception:  # noqa: BLE001 - an argument that does not print: never merged
            continue
        if key in first:
            same_as[n] = first[key]
        else:
            first[key] = n
    return same_as


CANCELLING = {"add", "sub", "rsub"}
DIGITS_LOST_NOTED = 3.0


def cancellation_at(n: fx.Node, args: tuple, out: Any, exact_operands: bool = False) -> dict[str, Any] | None:
    """Digits an addition or subtraction loses to cancellation, log10(max (|a|+|b|)/|a±b|),
    with the textbook rewrite where the formula has one (exp(x)-1, E[x²]-E[x]²); else the
    digits of its smaller operand it absorbs where a logarithm reads the result
    (`_absorption_at`). Operands no replay changes (`exact_operands`) carry no error for a
    cancellation to amplify, but their sum still rounds the smaller one away."""
    if not isinstance(n.target, torch._ops.OpOverload):
        return None
    if n.target.overloadpacket.__name__ in MATMUL_DISTANCES:
        return _matmul_distance_cancellation(n, args, out)
    if n.target.overloadpacket.__name__.rstrip("_") not in CANCELLING:
        return None
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.numel() == 0:
        return None
    terms = [a.abs() if isinstance(a, torch.Tensor) else abs(float(a)) for a in args[:2]
             if isinstance(a, (torch.Tensor, int, float))]
    if len(terms) < 2:
        return None
    if exact_operands:
        return _absorption_at(n, args, terms, out)
    with torch.no_grad():
        magnitude = torch.as_tensor(terms[0] + terms[1])
        # Over the elements where both are finite (|a±b| = 0 < |a|+|b|: infinitely many digits
        # lost); elsewhere 0: a quotient of nonfinite values is nan or 0, an overflowing |a|+|b|
        # is masked. The quotient alone first (three passes over the op's output: a 2M-element
        # sum's terms are much of the centre replay); the mask only where it found an inf.
        ratio = (magnitude / out.abs()).nan_to_num_(nan=0.0, posinf=math.inf)
        worst = float(ratio.max()) if ratio.numel() else 0.0
        if math.isinf(worst):
            worst = float(torch.where(torch.isfinite(magnitude), ratio, 0.0).max())
    if worst <= 10 ** DIGITS_LOST_NOTED:
        return _absorption_at(n, args, terms, out)
    lost = math.inf if math.isinf(worst) else math.log10(worst)
    return {"op": _op_name(n.target), "line": n.meta.get("line"), "kind": "cancels",
            "digits_lost": round(lost, 1) if math.isfinite(lost) else math.inf, "hint": _rewrite(n),
            "reference_error": _float64_error(_largest_finite(magnitude)),
            "typical_digits_lost": _typical_digits_lost(ratio)}


# Elements of a cancellation's ratio the typical loss is read from: an evenly strided sample
# of a larger value (the median of 2M ratios costs more than the note is worth).
TYPICAL_SAMPLE = 1 << 16


def _typical_digits_lost(ratio: torch.Tensor) -> float | None:
    """The median digits lost, log10((|a|+|b|)/|a±b|), over the elements whose difference is
    not 0: a running update `row - mean` is exactly 0 at a few elements (every digit lost
    there) and loses 2.7 digits at the others, which is what the result keeps a trace of.
    None where every difference is 0."""
    flat = ratio.flatten()
    if flat.numel() > TYPICAL_SAMPLE:
        flat = flat[::flat.numel() // TYPICAL_SAMPLE]
    flat = flat[torch.isfinite(flat) & (flat > 0)]
    if not flat.numel():
        return None
    return round(max(0.0, math.log10(float(flat.median()))), 1)


def _amplification(scale: torch.Tensor, value: torch.Tensor) -> float:
    """The largest ratio of `scale` (a pointwise function's ill-conditioned scale,
    max(Σ|xᵢ|, |f|) where it is ill-conditioned and 0 elsewhere) to the function's result
    |f|: its inputs' relative rounding reaches the result amplified that many times (inf
    where the result is 0 and the scale is not; 1 where it is nowhere ill-conditioned)."""
    s, v = scale.detach().numpy(), np.broadcast_to(np.abs(value.detach().numpy()), scale.shape)
    ill = (s > 0) & np.isfinite(s)
    if not ill.any():
        return 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = s[ill] / v[ill]
    return float(np.nan_to_num(ratio, nan=1.0, posinf=math.inf).max())


def amplification_sites(order: list[fx.Node], calls: dict[str, tuple[int, int]], cache: _CallCache
                        ) -> dict[str, dict[str, Any]]:
    """The pointwise library ops a replay found ill-conditioned at their inputs
    (`RoundingMode._find_ill_conditioned`) by at least DIGITS_LOST_NOTED digits, as notes beside
    the cancellations: `tanh_backward`'s 1 − y² of a float16 y rounded to 1 is no subtraction
    the script wrote, yet it is why the gradient keeps no digit."""
    sites = {}
    for n in order:
        first, end = calls.get(n.name, (0, 0))
        worst = max((entry[2] for entry in (cache.ill_conditioned.get(i) for i in range(first, end))
                     if entry is not None and entry[2] is not None), default=1.0)
        if worst >= 10 ** DIGITS_LOST_NOTED:
            lost = math.log10(worst) if math.isfinite(worst) else math.inf
            sites[n.name] = {"op": _op_name(n.target), "line": n.meta.get("line"), "kind": "amplifies",
                             "digits_lost": round(lost, 1) if math.isfinite(lost) else math.inf, "hint": None}
    return sites


def _float64_error(largest: float) -> float:
    """The largest error float64 itself makes at a site whose operands' magnitudes |a| + |b|
    reach `largest`: one float64 rounding of operands that carry one each, u64·(|a| + |b|). The
    float64 replay is no more exact than that: `1 + e⁻⁴⁰` is 1 in float64 too, and
    log(1 + e⁻⁴⁰) 0 where softplus gives 4.2e-18."""
    return float(f"{2.0 ** -53 * largest:.3g}")


def _largest_finite(magnitude: Any) -> float:
    """The largest finite element of a magnitude (|a|, ≥ 0), by one reduction where every
    element is finite: no copy of a value of 150 million elements (gh-36582's) for a figure."""
    if not isinstance(magnitude, torch.Tensor):
        return float(magnitude) if math.isfinite(float(magnitude)) else 0.0
    if not magnitude.numel():
        return 0.0
    top = float(magnitude.max())
    if math.isfinite(top):
        return top
    return float(torch.where(torch.isfinite(magnitude), magnitude, 0.0).max())


# Ops computing Euclidean distances as ‖x‖² + ‖y‖² − 2x·y (cdist's matmul path).
MATMUL_DISTANCES = {"_cdist_forward", "_euclidean_dist"}


def _matmul_distance_cancellation(n: fx.Node, args: tuple, out: Any) -> dict[str, Any] | None:
    """Digits a distance computed as ‖x‖² + ‖y‖² − 2x·y loses where the points are near:
    that sum's error is u·(‖x‖² + ‖y‖²), its result d², so d keeps log10((‖x‖² + ‖y‖²)/2d²)
    fewer digits (points 1e-3 apart with norms near 40: 8, more than float32 holds)."""
    x1, x2 = args[0], args[1]
    if not (isinstance(x1, torch.Tensor) and isinstance(x2, torch.Tensor) and isinstance(out, torch.Tensor)
            and x1.is_floating_point() and out.numel()):
        return None
    if n.target.overloadpacket.__name__ == "_cdist_forward" and not _euclidean_by_matmul(
            x1, x2, args[2] if len(args) > 2 else 2.0, args[3] if len(args) > 3 else None):
        return None
    with torch.no_grad():
        squares = x1.square().sum(-1).unsqueeze(-1) + x2.square().sum(-1).unsqueeze(-2)
        ratio = (squares / (2 * out.square())).nan_to_num_(nan=0.0, posinf=math.inf)
        worst = float(ratio.max())
    if worst <= 10 ** DIGITS_LOST_NOTED:
        return None
    return {"op": _op_name(n.target), "line": n.meta.get("line"), "kind": "cancels",
            "digits_lost": round(math.log10(worst), 1) if math.isfinite(worst) else math.inf,
            "hint": ("`torch.cdist` computes p = 2 distances between more than 25 rows (or with "
                     "`compute_mode='use_mm_for_euclid_dist'`) as ‖x‖² + ‖y‖² − 2x·y in one matrix product, which "
                     "cancels for near points: `compute_mode='donot_use_mm_for_euclid_dist'` computes each ‖x − y‖ "
                     "from the differences and keeps their digits."),
            "reference_error": _float64_error(_largest_finite(squares))}


# Functions ill-conditioned at 1 (log(1 + δ) ≈ δ: their result is all in the digits of δ), so
# an addition they read that rounds its smaller operand away decides their value.
LOGARITHMS = {"log", "log2", "log10"}


def _absorption_at(n: fx.Node, args: tuple, terms: list, out: torch.Tensor) -> dict[str, Any] | None:
    """Digits of its smaller operand an addition or subtraction read by a logarithm rounds
    away, log10(max |a±b| / min(|a|, |b|)) capped at all of the arm dtype's: `1 + x` of a
    small x keeps none of x in float32 below 6e-8, and log(1 + x) then is 0. Elsewhere an
    absorbed operand is harmless (Adam's `sqrt(v) + eps`) and is not noted."""
    if not any(isinstance(u.target, torch._ops.OpOverload) and u.target.overloadpacket.__name__ in LOGARITHMS
               for u in n.users):
        return None
    with torch.no_grad():
        small = torch.minimum(torch.as_tensor(terms[0], dtype=torch.float64),
                              torch.as_tensor(terms[1], dtype=torch.float64))
        ratio = torch.where(small > 0, out.abs() / small, 0.0)
        ratio = torch.where(torch.isfinite(ratio), ratio, 0.0)
        worst = float(ratio.max()) if ratio.numel() else 0.0
    if worst <= 10 ** DIGITS_LOST_NOTED:
        return None
    bits, _, _ = FORMATS.get(getattr(out, "_arm_dtype", torch.float64), (53, None, None))
    lost = math.log10(worst)
    return {"op": _op_name(n.target), "line": n.meta.get("line"), "kind": "absorbs",
            "digits_lost": math.inf if lost >= bits * math.log10(2) else round(lost, 1),
            "hint": _log1p_rewrite(n, args),
            # max(|a| + |b|) ≤ max |a| + max |b|: no sum of two large values made for it.
            "reference_error": _float64_error(_largest_finite(terms[0]) + _largest_finite(terms[1]))}


def _log1p_rewrite(n: fx.Node, args: tuple) -> str | None:
    """The rewrite of `log(1 ± x)`: one operand the constant 1."""
    name = n.target.overloadpacket.__name__
    ones = [i for i, a in enumerate(args[:2]) if isinstance(a, (int, float)) and a == 1
            or isinstance(a, torch.Tensor) and a.numel() == 1 and float(a) == 1]
    if not ones or name == "sub" and ones != [0]:
        return None
    negated = name == "rsub" or name == "sub"
    sign = "-" if negated else "+"
    return (f"`torch.log1p({'-x' if negated else 'x'})` computes `log(1 {sign} x)` without forming 1 {sign} x, so a "
            "small x keeps its digits.")


def _rewrite(n: fx.Node) -> str | None:
    producers = [a.target.overloadpacket.__name__ if isinstance(a, fx.Node) and isinstance(a.target, torch._ops.OpOverload)
                 else None for a in n.args[:2]]
    constants = [a for a in n.args[:2] if isinstance(a, (int, float))]
    name = n.target.overloadpacket.__name__
    if "exp" in producers and constants and abs(abs(float(constants[0])) - 1.0) == 0:
        return ("`exp(x) - 1` cancels for small x: `torch.expm1(x)` computes the same value without cancelling "
                "(compare against that instead).")
    if name == "sub" and all(p in ("mean", "sum", "pow", "mul", "square") for p in producers if p) and \
            any(p in ("mean", "sum") for p in producers) and any(p in ("pow", "mul", "square") for p in producers):
        return ("`E[x²] − E[x]²` cancels when the mean is large next to the spread: `torch.var(x, unbiased=False)` "
                "(two passes) keeps the digits.")
    return None


class _CallCache:
    """What every replay recomputes identically, keyed by the position of the call in the
    replay (the op sequence is the same in every replay): output dtypes and the magnitude
    figures of reductions and contractions. Each entry names its op and is used only by a
    call of that op: a compiled region's graph may make one more op in one replay than in
    another (a `reshape` that copies), and every later index then names another call."""

    def __init__(self) -> None:
        self.dtypes: dict[tuple, Any] = {}
        self.magnitudes: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self.ill_conditioned: dict[int, tuple[Any, torch.Tensor | None, float | None]] = {}
        self.exact_reductions: dict[int, torch.Tensor] = {}  # collapsed reductions of their exact terms
        # Where an accumulator or a half-precision decomposition may overflow (`RoundingMode._overflowing`,
        # `RoundingMode._overflowing_at`)
        self.overflowing: dict[int, tuple[Any, torch.Tensor | None]] = {}
        self.decompositions: dict[int, tuple[Any, _DecompositionTrace | None]] = {}  # None: not replayable stacked
        self.traces: dict[tuple, _DecompositionTrace] = {}  # by `_signature`
        # op, output arm dtypes, `RoundingMode._route`, the floating inputs' arm dtypes
        self.routes: dict[int, tuple[Any, list, str, list]] = {}
        # Values the same in every replay (leaves, views and selections of them): computed by
        # the centre replay, taken as they are by the others, with the mode's call indices
        # they span (a later call keeps its index). Held for the whole simulation, within
        # CONSTANT_BYTES.
        self.constants: dict[fx.Node, Any] = {}
        self.calls: dict[fx.Node, tuple[int, int]] = {}
        self.constant_bytes = 0
        self.storages: set[int] = set()  # the kept values' storages (their addresses), counted once

    def keep(self, n: fx.Node, value: Any, calls: tuple[int, int], owned: bool = True) -> None:
        """Note `n`'s `value` as the same in every replay, if it fits CONSTANT_BYTES: its
        storage counted once (a view of a kept value, a transposed one-hot matrix, costs none),
        and not at all where the simulation does not own it (`owned`: a leaf as recorded)."""
        new: dict[int, int] = {}
        for t in tree_flatten(value)[0]:
            if isinstance(t, torch.Tensor):
                try:
                    storage = t.untyped_storage()
                    address, size = storage.data_ptr(), storage.nbytes()
                except (RuntimeError, NotImplementedError):  # a layout without one storage (sparse)
                    address, size = id(t), t.numel() * t.element_size()
                if address not in self.storages:
                    new[address] = size if owned else 0
        if self.constant_bytes + sum(new.values()) <= CONSTANT_BYTES:
            self.constant_bytes += sum(new.values())
            self.storages.update(new.keys())
            self.constants[n] = value
            self.calls[n] = calls


# A float32-opmath measurement of a half-precision decomposition resting on fewer elements
# than this cannot rule out that the kernel computes at the half dtype: where that computation
# overflows and float32's does not, both results are possible (`_overflowing_at`).
OPMATH_EVIDENCE_ELEMENTS = 100
# The most bytes of values the same in every replay that one simulation holds on to: a
# 200,000 × 64 one-hot matrix in float64 is 100 MiB, which every replay otherwise makes and
# rounds again (a tenth of the arm's memory limit at the smallest, 2 GiB).
CONSTANT_BYTES = 256 << 20
# Replays are stacked where the centre replay's largest value has at most this many elements:
# a replay of small values costs the Python around each op (tens of microseconds, whatever the
# op's size), which a stack pays once for all of its replays; a large value's arithmetic
# dominates, and the directed replays stacked with random ones compute both kinds of result.
STACKED_VALUE_ELEMENTS = 1 << 14
# Elements of the largest value per stack (8 MiB of float64), which bounds how many replays
# one stack holds.
STACKED_ELEMENTS = 1 << 20


def _each_output(out_vd: list, count: int) -> list:
    """The arm dtype of each of an op's `count` outputs. An op with a list of outputs
    (`unbind`, `split`: all of one dtype) returns as many as its input's size gives, and its
    output dtypes, memoized per op and input dtypes, may come from a call with fewer: the rest
    have the last one's (a GRU's `unbind` over time steps kept the arm dtype of its first step
    alone, and every later step was replayed unrounded, as float64)."""
    if len(out_vd) >= count or not out_vd:
        return list(out_vd[:count]) + [None] * (count - len(out_vd[:count]))
    return list(out_vd) + [out_vd[-1]] * (count - len(out_vd))


def _dtypes(func: Any, stand_ins: list, spec: Any, device: torch.device) -> list:
    args, kwargs = tree_unflatten(stand_ins, spec)
    if "device" in kwargs:
        kwargs["device"] = device
    if func.namespace in ("aten", "prims"):
        out = func(*args, **kwargs)
    else:  # a script's custom op: its own code, with its prints muted
        with muted():
            out = func(*args, **kwargs)
    return [t.dtype if isinstance(t, torch.Tensor) else None for t in tree_flatten(out)[0]]


@dataclass(frozen=True)
class _Ref:
    """In a `_DecompositionTrace`: output `index` of op `step`, or (step -1) input `index`."""

    step: int
    index: int


@dataclass
class _DecompositionTrace:
    """The aten ops one call of a decomposition made in the centre replay, each argument a
    value (a shape, a scalar) or a `_Ref` to the decomposition's inputs or to an earlier op's
    outputs: what its code does for any values of these shapes and dtypes. torch's
    decompositions are written to be traced this way (inductor traces them); a call that read
    a value into Python (``.item()``, a tensor's truth) or made a tensor from Python data is
    not traced."""

    steps: list[tuple[Any, list[Any], Any]]  # (op, its flattened arguments, their spec)
    outputs: list[Any]  # the decomposition's flattened outputs
    spec: Any
    # Whether an op writes to one of its arguments (`torch.polar` writes its real and imaginary
    # parts through views of a tensor it makes). Stacked, that tensor is one value expanded
    # over the samples, which torch refuses to write to, and the whole stack would fail: such
    # a trace is replayed one sample at a time (`_stackable`).
    writes: bool = False

    @classmethod
    def of(cls, args: tuple, kwargs: dict, steps: list[tuple], out: Any) -> _DecompositionTrace | None:
        """The trace of the `steps` (op, args, kwargs, [result]) a decomposition of `args`
        and `kwargs` made to return `out`; None where it cannot be replayed."""
        where: dict[int, _Ref] = {}  # every tensor seen is alive (held by `steps`): ids are not reused
        for i, a in enumerate(tree_flatten((args, kwargs))[0]):
            if isinstance(a, torch.Tensor):
                where.setdefault(id(a), _Ref(-1, i))

        def ref(a: Any) -> Any:
            return where[id(a)] if isinstance(a, torch.Tensor) else a

        traced = []
        try:
            for j, (func, op_args, op_kwargs, result) in enumerate(steps):
                leaves, spec = tree_flatten((op_args, op_kwargs))
                traced.append((func, [ref(a) for a in leaves], spec))
                for i, o in enumerate(tree_flatten(result[0])[0]):
                    if isinstance(o, torch.Tensor):
                        where[id(o)] = _Ref(j, i)
                    elif o is not None:
                        return None
            leaves, spec = tree_flatten(out)
            writes = any(isinstance(func, torch._ops.OpOverload) and _written(func) for func, _, _ in traced)
            return cls(traced, [ref(a) for a in leaves], spec, writes)
        except KeyError:
            return None

    def replay(self, mode: RoundingMode, args: tuple, kwargs: dict) -> Any:
        """The decomposition's ops on `args` (stacked samples), through `mode`."""
        inputs = tree_flatten((args, kwargs))[0]
        outputs: list[list[Any]] = []

        def value(a: Any) -> Any:
            if not isinstance(a, _Ref):
                return a
            return inputs[a.index] if a.step < 0 else outputs[a.step][a.index]

        for func, leaves, spec in self.steps:
            op_args, op_kwargs = tree_unflatten([value(a) for a in leaves], spec)
            outputs.append(tree_flatten(mode.round_op(func, op_args, op_kwargs))[0])
        return tree_unflatten([value(a) for a in self.outputs], self.spec)


def _signature(func: Any, computation: torch.dtype, args: tuple, kwargs: dict) -> tuple | None:
    """What a decomposition's ops depend on (`_DecompositionTrace`): the op, its computation
    dtype, and its arguments but for their tensors' values; None where an argument is not a
    plain value."""
    flat, spec = tree_flatten((args, kwargs))
    parts: list[Any] = []
    for a in flat:
        if isinstance(a, torch.Tensor):
            parts.append((tuple(a.shape), a.stride(), a.dtype, getattr(a, "_arm_dtype", a.dtype), _is_stacked(a)))
        elif a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                         torch.memory_format)):
            parts.append((type(a), a))
        else:
            return None
    return func, computation, str(spec), tuple(parts)


class RoundingMode(TriageDispatchMode):
    """Evaluates aten ops in float64 and rounds each floating result to the arm's dtype:
    stochastically (``generator``), or directed up (+1) / down (-1), or to nearest with no
    perturbation (``direction=0`` without a generator: the centre replay)."""

    def __init__(self, options: SimulationOptions, cache: _CallCache, direction: int | torch.Tensor,
                 generator: Draws | None, exact: bool = False,
                 collapsed: dict[int, torch.Tensor] | None = None, samples: int = 0) -> None:
        super().__init__()
        # With `samples`, this many random replays at once: every value a replay perturbs is
        # stacked along a new first dimension (`_is_stacked`), one slice per sample, each
        # rounded independently; an op whose rounding is not elementwise runs once per sample.
        self.samples = samples
        self.rounded = False  # whether the last node's ops rounded anything (else its value is exact)
        self.traced: list[list[tuple]] = []  # the ops of the decompositions being noted, innermost last
        self.options = options
        self.exact = exact  # no rounding at all: the float64 value every sample is unbiased around
        # Call index -> a collapsed reduction's error from its terms' rounding, this replay's draw
        # (`_Collapsed`): its terms are their exact values.
        self.collapsed = collapsed or {}
        self.cache = cache
        self.note_overflows = False  # the centre replay notes where values leave their range (`_replay`)
        # With `note_overflows`: whether the current node's ops rounded a nonzero value to 0 (an
        # exp(-200) in float32), which a later op may turn into ±inf (its log).
        self.underflowed = False
        # +1 up, -1 down, 0 to nearest or at random; with stacked samples, one sign per sample
        # (a float64 tensor: the directed replays as one stack).
        self.direction = direction
        self.sign_views: dict[int, tuple[torch.Tensor, np.ndarray]] = {}  # `_sign_views`
        self.generator = generator
        # Uniform draws for one-element results, seeded from the replay's own generator.
        self.draws = random.Random(int(generator.integers((), 62))) if generator is not None else None
        self.calls = 0
        # Inside a decomposition, its code reads the float64 stand-ins' dtype: a cast "to
        # float64" there means "to the computation dtype" of the decomposed op's arm dtype.
        self.inner_dtype: list[torch.dtype] = []
        # Per decomposition being replayed, innermost last: whether its kernel adds its terms one
        # after another (`SEQUENTIAL_KERNELS`), not in vector lanes.
        self.sequential: list[bool] = []
        self.unmeasured: set[str] = set()  # library ops of the current node with no measured error
        # While a compiled region runs (`_run_compiled`): each pointwise call's result by what
        # makes a repeat of it round alike (`_repeat_key`).
        self.repeats: dict[tuple, tuple[list, list, Any]] | None = None
        # The node being replayed ran with the script's flush-to-zero on (opgraph's
        # `flush_denormal`): its results below the smallest normal value are 0, as the CPU made them.
        self.flush = False
        # The image of the library function being rounded (`BOUNDED`), or None.
        self.bound: tuple[float, float] | None = None
        # Whether that function may lose a subnormal result's digits (`_below_normal`): a
        # library function's kernel, not IEEE arithmetic (`x * 3` of a subnormal is rounded
        # exactly there, which the script's flush-to-zero alone changes).
        self.loses_subnormals = False
        # The node being replayed is a contraction the CPU's oneDNN computed from inputs of
        # this format (opgraph's `matmul_inputs`: "bf16"), or None.
        self.matmul_inputs: str | None = None

    @property
    def directed(self) -> bool:
        """Every result rounded up or down (the directed replays), not to nearest or at random."""
        return isinstance(self.direction, torch.Tensor) or self.direction != 0

    def _signs(self, t: torch.Tensor) -> int | torch.Tensor:
        """The direction for `t`: shaped to `t`'s stacked samples where each has its own."""
        if isinstance(self.direction, torch.Tensor):
            return self._sign_views(t.dim())[0]
        return self.direction

    def _sign_views(self, dim: int) -> tuple[torch.Tensor, np.ndarray]:
        """The stack's directions shaped for a value of `dim` dimensions, as a tensor and as
        a NumPy array (memoized: thousands of roundings a replay)."""
        views = self.sign_views.get(dim)
        if views is None:
            shaped = self.direction.view((-1,) + (1,) * (dim - 1))
            views = self.sign_views[dim] = (shaped, shaped.numpy())
        return views

    def vdtype(self, t: torch.Tensor) -> torch.dtype:
        """The dtype the value has on the arm: an attribute on the float64 stand-in (set on
        every tensor the replay makes), else its own dtype."""
        return getattr(t, "_arm_dtype", t.dtype)

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A copy an in-place op may write to, still of the arm dtype its value has (and
        stacked if it was)."""
        out = t.clone()
        out._arm_dtype = self.vdtype(t)
        if _is_stacked(t):
            _mark_stacked(out)
        return out

    def each_sample(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """`fn` on each sample's slice of the stacked arguments, one after another, its
        results stacked: the same calls (and call indices) as a replay of one sample makes."""
        if not self.samples:
            return fn(*args, **kwargs)
        samples, self.samples = self.samples, 0
        directions, generator, draws = self.direction, self.generator, self.draws
        start = self.calls
        outs = []
        try:
            for k in range(samples):
                self.calls = start
                if isinstance(directions, torch.Tensor):  # a directed replay draws nothing
                    self.direction = int(directions[k])
                    self.generator, self.draws = (generator, draws) if self.direction == 0 else (None, None)
                outs.append(fn(*_sample_args(args, k), **_sample_kwargs(kwargs, k)))
        finally:
            self.samples = samples
            self.direction, self.generator, self.draws = directions, generator, draws
        return _stack_samples(outs)

    def literal(self, numbers: torch.Tensor, dtype: torch.dtype, error: torch.Tensor | None = None) -> torch.Tensor:
        """A leaf the script wrote as float64 numbers (`Leaf.literal`), rounded to its dtype as
        this replay rounds: exact in the exact replay, one rounding per stacked sample, after
        moving each number by up to `error` where a factory kernel computed them (`linspace`)."""
        if self.exact:
            return numbers.clone()
        if self.samples:
            numbers = numbers.unsqueeze(0).expand(self.samples, *numbers.shape).contiguous()
        if error is not None and (self.generator is not None or self.directed):
            numbers = self._absolute_noise(numbers, error, 1.0)
        if self.samples:
            return _mark_stacked(round_to(numbers, dtype, self._signs(numbers), self.generator))
        return round_to(numbers, dtype, self.direction, self.generator)

    def _stacked_written(self, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments an op writes to, stacked where they are not (a copy of a value no
        sample perturbed): each sample writes its own result into its own slice."""
        written = _written(func)
        if not written:
            return args, kwargs
        names = {func._schema.arguments[j].name for j in written}

        def stacked(a: Any) -> Any:
            if not isinstance(a, torch.Tensor) or _is_stacked(a):
                return a
            out = a.unsqueeze(0).expand(self.samples, *a.shape).clone()
            out._arm_dtype = self.vdtype(a)
            return _mark_stacked(out)

        return (tuple(stacked(a) if j in written else a for j, a in enumerate(args)),
                {k: stacked(v) if k in names else v for k, v in kwargs.items()})

    def _evaluate(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`func` in float64 on the replay's values; with stacked samples, on every sample at
        once (functorch's batching rules, through a vmap level: the op sees one sample's
        shapes), once and repeated for every sample where no argument is stacked, and one
        sample at a time where the op has no batching rule or draws random numbers."""
        scatters_at_offset = func is torch.ops.aten.as_strided_scatter.default
        if not self.samples:
            return func(*(_scatter_from_offset_zero(args) if scatters_at_offset else args), **kwargs)
        if torch.Tag.nondeterministic_seeded not in func.tags:
            flat = _flat(args) + _flat(tuple(kwargs.values()))
            if not any(_is_stacked(a) for a in flat):
                return _stack_outputs(func(*args, **kwargs), self.samples)
            if torch.Tag.pointwise in func.tags and "out" not in kwargs \
                    and all(a.dtype == torch.float64 for a in flat if isinstance(a, torch.Tensor)):
                return _broadcast_stacked(func, args, kwargs, flat)
            out = _stacked_view(func, args, kwargs)
            if out is not None:
                return out
            batched, out = _vmapped(func, args, kwargs, self.samples)
            if batched:
                return out
        samples = [_sample_args(args, k) for k in range(self.samples)]
        if scatters_at_offset:
            samples = [_scatter_from_offset_zero(sample) for sample in samples]
        return _stack_samples([func(*sample, **_sample_kwargs(kwargs, k)) for k, sample in enumerate(samples)])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return self.round_op(func, args, kwargs or {})

    def round_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`func`'s result evaluated in float64 and rounded as the arm rounds it: what the
        mode does with each op, called directly by the replay (torch wraps
        `__torch_dispatch__` to hide it from dynamo, a few microseconds a call)."""
        if func in _STACKED_VIEWS and not kwargs and self.repeats is None and not self.traced:
            out = self._view(func, args)
            if out is not None:
                return out
        key = _repeat_key(func, args, kwargs) if self.repeats is not None and not self.inner_dtype else None
        if key is None:
            return self._round_op(func, args, kwargs)
        # Weak references: the region's values are freed as it runs. An id counts only while
        # its tensor lives (a freed one's id may be reused), and a freed first result cannot
        # be shared (a repeat then rounds anew, as before).
        inputs, outputs, spec = self.repeats.get(key, ((), (), None))
        first = [ref() for ref in outputs]
        if outputs and all(ref() is not None for ref in inputs) and all(t is not None for t in first):
            # Copies: the script may write to one result and not to the other.
            return tree_unflatten([self.copy(t) for t in first], spec)
        out = self._round_op(func, args, kwargs)
        flat, spec = tree_flatten(out)
        if all(isinstance(t, torch.Tensor) for t in flat):
            tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            self.repeats[key] = ([weakref.ref(a) for a in tensors], [weakref.ref(t) for t in flat], spec)
        return out

    def _view(self, func: Any, args: tuple) -> torch.Tensor | None:
        """A view op (`_STACKED_VIEWS`) of a float64 stand-in by the shortest path, the value
        and call index `_dispatch` gives it (a training loop's selections and transposes: a
        third of its ops, each a few microseconds of work in tens of microseconds of routing);
        None where that path does not apply (a view the stack's strides refuse)."""
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or widen(x) is not x:  # `_dispatch` widens it first
            return None
        if not self.samples:
            out = func(*args)
        elif _is_stacked(x):
            try:
                out = _mark_stacked(_STACKED_VIEWS[func](x, x.dim() - 1, *args[1:]))
            except (RuntimeError, IndexError, TypeError):
                return None
        else:  # no sample changed it: the one value, as every sample's
            out = func(*args)
            out = _mark_stacked(out.unsqueeze(0).expand(self.samples, *out.shape))
        self.calls += 1
        out._arm_dtype = self.vdtype(x)
        return out

    def _round_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if not self.samples:
            if not self.traced:
                return self._dispatch(func, args, kwargs)
            step = (func, args, kwargs, [])  # an op of the decomposition being noted
            self.traced[-1].append(step)
            step[3].append(self._dispatch(func, args, kwargs))
            return step[3][0]
        args, kwargs = self._stacked_written(func, args, kwargs)
        if not self._stackable(func, args, kwargs):
            return self.each_sample(lambda *a, **kw: self._round_op(func, a, kw), args, kwargs)
        out = self._dispatch(func, args, kwargs)
        if isinstance(out, torch.Tensor):
            return _mark_stacked(out)
        return tree_map(lambda t: _mark_stacked(t) if isinstance(t, torch.Tensor) else t, out)

    def _route(self, func: Any, name: str, args: tuple, kwargs: dict, flat: list, in_vd: list,
               out_vd: list) -> str:
        """How the op's result is rounded: lattice | transform | decomposed | linalg | exact |
        accumulated | widening (an exact copy) | complex-product | correctly-rounded | library."""
        kind = op_class(func)
        if name in LATTICE_OPS and out_vd and out_vd[0] in FORMATS:
            return "lattice"
        if _scatter_source(name, args, kwargs) is not None:
            return "accumulated"
        if name.startswith(FFT_PREFIX):
            return "transform"
        if name in DECOMPOSED_UP_TO:
            size, limit = DECOMPOSED_UP_TO[name]
            if size(args) > limit:
                return "library"
        if kind in ("decomposed", "linalg", "exact", "accumulated"):
            return kind
        if name.rstrip("_") in COPIES and _widening(flat, in_vd, out_vd):
            return "widening"
        if any(d is not None and d.is_complex for d in in_vd):
            if name.rstrip("_") in COMPLEX_PRODUCTS and out_vd and out_vd[0] in COMPLEX_PARTS:
                return "complex-product"
            if name.rstrip("_") in COMPLEX_LIBRARY:
                return "library"
        if kind == "correctly-rounded" and (_plain_add(name, args, kwargs)
                                            or not self._measured_beyond_rounding(name, out_vd)) \
                or _power_of_two_scaling(name, args, kwargs):
            return "correctly-rounded"
        return "library"

    def _stackable(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """The op's rounding is elementwise, from figures an earlier replay left in the cache
        (output dtypes, a reduction's walk, where a function is ill-conditioned), so stacked
        samples can take it at once. Decompositions, linalg's perturbed inputs, transforms
        and kernels whose error is relative to the output's scale run once per sample."""
        name = func.overloadpacket.__name__
        if func in _STACKED_VIEWS:  # `_dispatch`: a view, stacked or run per sample by `_evaluate`
            return True
        routed = self.cache.routes.get(self.calls)
        if routed is None or routed[0] is not func:
            return False
        _, out_vd, route, _ = routed
        if route == "accumulated":
            return self.calls in self.cache.magnitudes and self._input_format(name, out_vd) is None
        if route == "decomposed":
            trace = self._decomposition_trace(func, self.calls)
            return trace is not None and not trace.writes
        if route == "library":
            backward = self._input_u(func, name, out_vd)
            # Where the function is ill-conditioned is found once, on the first replay that
            # adds the noise: up, the directed stack's first sample (`_find_ill_conditioned`).
            return torch.Tag.pointwise in func.tags and (not backward or self.calls in self.cache.ill_conditioned
                                                         or self.directed)
        return route in ("exact", "widening", "correctly-rounded", "complex-product")

    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        call = self.calls
        self.calls += 1
        name = func.overloadpacket.__name__
        if func in _STACKED_VIEWS and args and isinstance(args[0], torch.Tensor):
            # A view has its input's dtype and rounds nothing: no route to find (a training
            # loop's batches and transposed weights, a third of its ops).
            return self._tag(self._evaluate(func, args if name in EXACT_OPS else _widened(args), kwargs),
                             [self.vdtype(args[0])])
        # The same call of every replay has the same op and arm dtypes, so the same route.
        routed = self.cache.routes.get(call)
        if routed is None or routed[0] is not func:
            flat = _flat(args) + _flat(tuple(kwargs.values()))
            in_vd = [self.vdtype(a) for a in flat
                     if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex())]
            out_vd = self._output_dtypes(func, args, kwargs, flat)
            routed = None
        else:
            _, out_vd, _, in_vd = routed
        written = [args[i] for i in _written(func) if i < len(args) and isinstance(args[i], torch.Tensor)]
        if name not in EXACT_OPS:  # a dtype argument names the arm's precision: compute in float64
            args = float32_scales(name, _widened(args))
        if kwargs:
            kwargs = {k: (widen_dtype(v) if k == "dtype" else torch.device("cpu") if k == "device" and v is not None
                          else _widened(v) if isinstance(v, (list, tuple)) else widen(v)) for k, v in kwargs.items()}
        if _has_float(args, kwargs) and _is_pointwise(func) and _reads_scalars_at_float32(in_vd):
            args, kwargs = _scalars_at_float32(args), {k: _scalars_at_float32(v) for k, v in kwargs.items()}
        if routed is None:
            routed = self.cache.routes[call] = (func, out_vd, self._route(func, name, args, kwargs, flat, in_vd, out_vd),
                                                in_vd)
        route = routed[2]
        if self.flush and route not in ("exact", "widening", "lattice"):
            args = self._denormals_as_zero(args)
        if name in GRID_SAMPLERS and self.generator is not None:
            args = self._moved_coordinates(name, args)
        if route == "lattice":
            lattice = out_vd[0]
            out = func(*[a.to(lattice) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                         for a in args], **kwargs)
            return self._tag(out.to(torch.float64), out_vd)
        if route == "transform":
            return self._transform(func, args, kwargs, out_vd)
        if route == "decomposed":
            return self._decompose(func, args, kwargs, in_vd, out_vd)
        if route == "linalg":
            if name == "linalg_pinv":
                args, kwargs = _pinv_cutoff_at(in_vd[0] if in_vd else torch.float64, args, kwargs)
            out = self._round_all(func(*self._perturb_matrices(args, BACKWARD_FACTORS.get(name, 1.0)), **kwargs),
                                  out_vd, library=SPECTRAL_LIBRARY_U if name in SPECTRAL else 0.0)
        elif route == "exact":
            out = self._evaluate(func, args, kwargs)
            # Exact results of arm-precision inputs are representable; only a narrowing rounds.
            if any(_less_precise(d, i) for d in out_vd if d is not None for i in in_vd):
                out = self._round_all(out, out_vd, library=0.0)
            else:
                out = self._tag(out, out_vd)
        elif route == "accumulated":
            read_as = self._input_format(name, out_vd)
            if read_as is not None:
                args = tuple(round_to(a, read_as, self.direction, self.generator)
                             if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 1 else a
                             for a in args)
            drawn = self.collapsed.get(call)
            if drawn is None:
                out = self._evaluate(func, args, kwargs)
            else:  # the exact terms, the same in every such replay: reduced once
                exact = self.cache.exact_reductions.get(call)
                if exact is None:
                    exact = self.cache.exact_reductions[call] = func(*args, **kwargs)
                out = exact + drawn if drawn.shape == exact.shape else exact.clone()
            if isinstance(out, torch.Tensor) and (out.is_floating_point() or out.is_complex()):
                out = self._accumulate(call, name, func, args, kwargs, out, out_vd)
            elif name in EMBEDDING_BAGS and out[0].is_floating_point():  # the bags, then their indices
                out = (self._accumulate(call, name, func, args, kwargs, out[0], out_vd),) + tuple(out[1:])
            out = self._round_all(out, out_vd, library=0.0)
        elif route == "widening":
            # A copy or cast to a dtype at least as precise as its input's is exact: rounding it
            # (a float64 result gets u of relative noise) costs K passes over the tensor and
            # perturbs what the arm computes exactly.
            out = self._tag(self._evaluate(func, args, kwargs), out_vd)
        elif route == "correctly-rounded":
            out = self._round_all(self._evaluate(func, args, kwargs), out_vd, library=0.0)
        elif route == "complex-product":
            out = self._tag(self._complex_product(args[0], args[0] if name.rstrip("_") == "square" else args[1],
                                                  out_vd[0]), out_vd)
        else:
            backward = self._input_u(func, name, out_vd)
            noisy = bool(backward) and (self.generator is not None or self.directed)
            if noisy:  # before the op: an in-place one writes over an input
                self._find_ill_conditioned(call, func, args, kwargs, out_vd[0])
            out = self._evaluate(func, args, kwargs)
            bound = BOUNDED.get(name.rstrip("_"))
            if noisy and isinstance(out, torch.Tensor):
                out = self._noise_where_ill_conditioned(call, out, backward * UNIT_ROUNDOFF.get(out_vd[0], 2.0 ** -53))
                if bound is not None and out.is_floating_point():  # f(x + δx) is a value of f too
                    out = out.clamp(*bound)
            if torch.Tag.pointwise in func.tags or not isinstance(out, torch.Tensor) or not out.is_floating_point():
                self.bound = bound
                self.loses_subnormals = name.rstrip("_") not in CORRECTLY_ROUNDED
                try:
                    out = self._round_all(out, out_vd, library=self._library_u(name, out_vd))
                finally:
                    self.bound = None
                    self.loses_subnormals = False
            else:
                # A non-pointwise kernel (pooling, interpolation, grid sampling) errs relative to
                # its output's scale, max(|y|, rms y), as it was measured, not to each element:
                # an average of cancelling terms near 0 keeps its neighbours' absolute error.
                d = out_vd[0] if out_vd and out_vd[0] in UNIT_ROUNDOFF else None
                if d is not None:
                    out = self._scaled_noise(out, self._library_u(name, out_vd) * UNIT_ROUNDOFF[d])
                out = self._round_all(out, out_vd, library=0.0)
                if name in MOMENTS and in_vd and in_vd[0] in FORMATS:  # its sum, at float32 opmath
                    out = self._overflow(out, self._overflowing(call, func, name, args, kwargs, out, torch.float32))
        if written and isinstance(out, torch.Tensor) and out is not written[0]:
            # An in-place op: later reads of its target must see the rounded value.
            written[0].copy_(out)
            written[0]._arm_dtype = self.vdtype(out)
            return written[0]
        return out

    def _complex_product(self, x: Any, y: Any, dtype: torch.dtype) -> torch.Tensor:
        """x·y as the kernel computes it from the parts, (ac − bd) + (ad + bc)i, each product
        and sum rounded to the parts' dtype."""
        operands = [a if isinstance(a, torch.Tensor) else torch.tensor(complex(a), dtype=torch.complex128)
                    for a in (x, y)]
        if self.samples:  # every operand stacked: each rounding draws per sample
            rank = max(a.dim() - _is_stacked(a) for a in operands)
            operands = [a.reshape(a.shape[:1] + (1,) * (rank + 1 - a.dim()) + a.shape[1:]) if _is_stacked(a)
                        else a.expand((self.samples,) + (1,) * (rank - a.dim()) + a.shape) for a in operands]
            shape = torch.broadcast_shapes(*(a.shape for a in operands))
            operands = [a.expand(shape) for a in operands]
        (a, b), (c, d) = ((t.real, t.imag) if t.is_complex() else (t, torch.zeros_like(t)) for t in operands)
        part = COMPLEX_PARTS.get(dtype, torch.float64)
        self.rounded = True

        def rounded(t: torch.Tensor) -> torch.Tensor:
            return self._round(t.contiguous(), part, 0.0)

        return torch.complex(rounded(rounded(a * c) - rounded(b * d)), rounded(rounded(a * d) + rounded(b * c)))

    def _denormals_as_zero(self, args: tuple) -> tuple:
        """The op's floating inputs with their values below the smallest normal value of their
        arm dtype read as zeros: x86's flush-to-zero mode (`torch.set_flush_denormal(True)`)
        sets denormals-are-zero too, so arithmetic reads a subnormal input (a leaf made before
        the call) as 0. Copies and views move its bits unchanged, and are not routed here."""
        def read(a: Any) -> Any:
            if isinstance(a, (list, tuple)):
                return type(a)(read(x) for x in a)
            d = self.vdtype(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else None
            if d not in FORMATS:
                return a
            out = _flushed_to_zero(a, FORMATS[d][2])
            out._arm_dtype = d
            return _mark_stacked(out) if _is_stacked(a) else out

        return tuple(read(a) for a in args)

    def _find_ill_conditioned(self, call: int, func: Any, args: tuple, kwargs: dict, dtype: torch.dtype) -> None:
        """Where a pointwise function is ill-conditioned on this call's inputs
        (`well_conditioned` false, by its sensitivity Σ|xᵢ·∂f/∂xᵢ|), found once per call and
        kept for every replay: the scale max(Σ|xᵢ|, |f|) there, or less where the kernel's error
        at `dtype` was measured to follow the function's slope (`KernelTable.sensitivity_ratio`).
        Stacked, on the first sample,
        as a replay of it alone would (the directed pair's up replay, the first replay that
        adds this noise); an in-place op through its out-of-place form, on its inputs before
        it writes to them."""
        cached = self.cache.ill_conditioned.get(call)
        if cached is not None and cached[0] is func:
            return
        first_args, first_kwargs = (_sample_args(args, 0), _sample_kwargs(kwargs, 0)) if self.samples else (args, kwargs)
        try:
            slope_ratio = self.options.kernels.sensitivity_ratio(func.overloadpacket.__name__.rstrip("_"), dtype)
            value = _out_of_place(func)(*first_args, **first_kwargs)
            scale = ill_conditioned_scale(_out_of_place(func), first_args, first_kwargs, slope_ratio, value)
            cached = (func, scale, None if scale is None else _amplification(scale, value))
        except Exception:  # noqa: BLE001 - no sensitivity (nor an out-of-place form): the forward bound alone
            cached = (func, None, None)
        self.cache.ill_conditioned[call] = cached

    def _noise_where_ill_conditioned(self, call: int, out: torch.Tensor, bound: float) -> torch.Tensor:
        """A pointwise kernel's measured error where the function is ill-conditioned
        (`_find_ill_conditioned`): `bound` times the scale found there added to the result (`bound`
        in absolute units: the measured multiple of u times u); elsewhere the forward bound
        holds."""
        scale = self.cache.ill_conditioned[call][1]
        if scale is None or scale.shape != self._sample_shape(out):
            return out
        return self._absolute_noise(out, scale, bound)

    def _sample_shape(self, t: torch.Tensor) -> torch.Size:
        """One sample's shape of a result (without the stack's first dimension)."""
        return t.shape[1:] if self.samples else t.shape

    def _input_u(self, func: Any, name: str, out_vd: list) -> float:
        """The error bound, in units of u·max(Σ|xᵢ|, |f|), a library kernel may add where its
        function is ill-conditioned: the measured one (`KernelTable.input_u`), or for a
        pointwise op the table has not measured, the conservative UNMEASURED_U. A correct
        kernel whose formula cancels near a root of its result (`silu_backward`'s
        1 + x(1 − σ(x)) at x ≈ −1.28, `tanh_backward`'s 1 − y² where tanh saturates) errs by
        u of its inputs there, which no bound relative to the result covers: a correct
        `silu_backward` was 38σ outside its spread, and blamed."""
        d = out_vd[0] if out_vd else None
        if d is None:
            return 0.0
        op = name.rstrip("_")
        if self.options.kernels.get(op, d) is None and torch.Tag.pointwise in func.tags and d in FORMATS:
            return UNMEASURED_U
        return self.options.kernels.input_u(op, d)

    def _library_u(self, name: str, out_vd: list) -> float:
        """Units of roundoff a library kernel may be off before its result is rounded: the
        measured bound, else the conservative one (and the op is noted as unmeasured)."""
        op = name.rstrip("_")
        d = out_vd[0] if out_vd else None
        measured = self.options.kernels.library_u(op, d) if d is not None else None
        if measured is not None:
            return measured
        # The table measures float32, float16 and bfloat16 kernels: a float64 one is named so.
        self.unmeasured.add(f"aten.{op}" if d in (torch.float32, torch.float16, torch.bfloat16)
                            else f"aten.{op} ({str(d).removeprefix('torch.')})")
        return UNMEASURED_U

    def _measured_beyond_rounding(self, name: str, out_vd: list) -> bool:
        """An op assumed correctly rounded whose kernel measured more than one rounding off,
        where well conditioned or where not (`lerp`'s formula cancels)."""
        e = self.options.kernels.get(name.rstrip("_"), out_vd[0]) if out_vd and out_vd[0] is not None else None
        return e is not None and (e.max_u > CORRECTLY_ROUNDED_U or (e.backward_u or 0.0) > CORRECTLY_ROUNDED_U)

    def _reduced_accumulation(self, name: str, dtype: torch.dtype) -> bool:
        """The table measured this fp16/bf16 reduction or contraction not computing in float32
        opmath (the CPU's addbmm adds each batch's product into the half output, a transposed
        convolution scatters its columns in half; CUDA's cumsum scans in half)."""
        e = self.options.kernels.get(name, dtype)
        return e is not None and e.float32_opmath is False

    def _transform(self, func: Any, args: tuple, kwargs: dict, out_vd: list) -> Any:
        """A discrete Fourier transform: computed in float64, plus normwise noise of
        max(4, 2·log2 n)·u of the output's scale, then rounded to the arm's dtype."""
        out = func(*args, **kwargs)
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        d = out_vd[0] if out_vd else None
        if not isinstance(out, torch.Tensor) or x is None or d is None:
            return self._round_all(out, out_vd, library=0.0)
        real = COMPLEX_PARTS.get(d, d)
        bound = max(4.0, 2 * math.log2(max(2, x.numel()))) * UNIT_ROUNDOFF.get(real, 2.0 ** -53)
        if out.is_complex():
            parts = self._scaled_noise(torch.view_as_real(out.resolve_conj()).contiguous(), bound)
            out = torch.view_as_complex(parts.contiguous())
        else:
            out = self._scaled_noise(out, bound)
        return self._round_all(out, out_vd, library=0.0)

    def _decompose(self, func: Any, args: tuple, kwargs: dict, in_vd: list, out_vd: list) -> Any:
        """Replay a composite op through its decomposition, each inner op rounded, at the
        kernel's opmath: fp16/bf16 inputs are computed in float32 (their stand-ins tagged so)
        where the table measured the kernel doing so, else at their own dtype (wider, so
        safer: a flash attention kernel rounds its probabilities to bf16 between its GEMMs).
        The outputs are rounded to the op's own arm dtypes (the decomposition casts back to the
        stand-in's float64), with the whole kernel's measured error added before that rounding."""
        from torch._prims_common import get_computation_dtype

        name = func.overloadpacket.__name__
        working = [d for d in in_vd if isinstance(d, torch.dtype) and d.is_floating_point]
        least = max(working, key=lambda d: UNIT_ROUNDOFF.get(d, 0.0)) if working else torch.float32
        computation = get_computation_dtype(least)
        measured = self.options.kernels.get(name, least)
        own_args, own_kwargs = args, kwargs
        widened = computation != least and measured is not None and measured.float32_opmath
        if widened:
            args = tree_map(lambda a: self._retagged(a, computation, least), args)
            kwargs = tree_map(lambda a: self._retagged(a, computation, least), kwargs)
        call = self.calls - 1
        # The centre replay notes the decomposition's ops (`_DecompositionTrace`), which the
        # later replays replay: the decomposition's own code would read stacked samples'
        # shapes, and its Python costs more than its ops.
        trace = self._decomposition_trace(func, call)
        recording = self.generator is None and not self.directed and not self.exact
        signature = _signature(func, computation, args, kwargs) if recording else None
        if signature is not None:
            # A call with the arguments of an earlier one but for their values makes that
            # call's ops (a training loop's loss, once per step).
            trace = self.cache.traces.get(signature)
        self.inner_dtype.append(computation)
        # A sequential kernel's inner decompositions (batch norm's var_mean) add as it does.
        self.sequential.append(bool(self.sequential and self.sequential[-1])
                               or name in SEQUENTIAL_KERNELS and SEQUENTIAL_KERNELS[name](func, args))
        if recording:
            self.traced.append([])
        try:
            if trace is not None:
                out = trace.replay(self, args, kwargs)
            else:
                with self:
                    out = _decomposition(func)(*args, **kwargs)
                if out is NotImplemented:  # torch's decompositions cover some arguments only
                    raise NotImplementedError(f"its decomposition does not cover these arguments ({name})")
        finally:
            self.inner_dtype.pop()
            self.sequential.pop()
            steps = self.traced.pop() if recording else None
        if recording:
            if trace is None:
                trace = _DecompositionTrace.of(args, kwargs, steps, out)
                if signature is not None and trace is not None:
                    self.cache.traces[signature] = trace
            self.cache.decompositions[call] = (func, trace)
            if widened and measured.elements < OPMATH_EVIDENCE_ELEMENTS:
                self.cache.overflowing[call] = (func, self._overflowing_at(func, least, own_args, own_kwargs, out))
        over = self.cache.overflowing.get(call, (None, None))
        if isinstance(out, torch.Tensor) and over[0] is func and over[1] is not None:
            out = self._overflow(out, over[1])
        d = out_vd[0] if out_vd else None
        fused = self.options.kernels.fused_u(name, d) if d is not None else None
        if fused and isinstance(out, torch.Tensor) and out.is_floating_point() and d in UNIT_ROUNDOFF:
            # A scan's outputs grow along it (a cumprod from 1.7 to 1e7), a softmax's span many
            # orders: each errs relative to itself, not to the output's overall scale.
            out = (self._relative_noise(out, fused * UNIT_ROUNDOFF[d]) if name.rstrip("_") in RELATIVE_KERNELS
                   else self._scaled_noise(out, fused * UNIT_ROUNDOFF[d]))
        return self._round_all(out, out_vd, library=0.0)

    def _decomposition_trace(self, func: Any, call: int) -> _DecompositionTrace | None:
        """The ops the centre replay's decomposition of this call made, if that call was `func`'s."""
        noted, trace = self.cache.decompositions.get(call, (None, None))
        return trace if noted is func else None

    def _overflowing_at(self, func: Any, least: torch.dtype, args: tuple, kwargs: dict,
                        out: Any) -> torch.Tensor | None:
        """Where the decomposition, computed at the half dtype `least` rather than at the
        float32 opmath a few measured elements showed, overflows (±inf or nan) and the float32
        computation does not: a kernel may do either (the table's soft_margin_loss at float16
        rests on 2 elements; its kernel exponentiates in half), so there ±inf is possible,
        not certain (`_overflow`). Computed once, to nearest, by a mode of its own: its calls
        are not the replay's."""
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return None
        scratch = RoundingMode(self.options, _CallCache(), direction=0, generator=None)
        scratch.inner_dtype.append(least)
        try:
            with scratch:
                half = _decomposition(func)(*args, **kwargs)
        except Exception:  # noqa: BLE001 - no half computation to compare: the measurement stands
            return None
        if not isinstance(half, torch.Tensor) or half.shape != out.shape:
            return None
        over = torch.isfinite(out) & ~torch.isfinite(half)
        return over if bool(over.any()) else None

    def _retagged(self, a: Any, computation: torch.dtype, least: torch.dtype) -> Any:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and self.vdtype(a) == least:
            a = self.copy(a)  # stacked if it was
            a._arm_dtype = computation  # fp16 values are exact in float32: only the tag changes
        return a

    def _scaled_noise(self, t: torch.Tensor, bound: float) -> torch.Tensor:
        """Noise of `bound` times the output's scale, max(|y|, rms y), as the kernel's error
        was measured: a normalized output near zero keeps the error of its neighbours."""
        if self.generator is None and not self.directed:  # the centre replay adds none
            return t
        if self.samples:  # each sample's own scale, as one replay of it computes it
            rms = _finite_rms(t.reshape(t.shape[0], -1)).view((-1,) + (1,) * (t.dim() - 1))
            return torch.where(rms.isnan(), t, self._absolute_noise(t, torch.maximum(t.abs(), rms), bound))
        rms = float(_finite_rms(t.reshape(1, -1))[0])
        if math.isnan(rms):
            return t
        return self._absolute_noise(t, t.abs().clamp(min=rms), bound)

    def _absolute_noise(self, t: torch.Tensor, scale: torch.Tensor, bound: float) -> torch.Tensor:
        """`t` moved by up to `bound`·`scale`: all the way up or down in a directed replay,
        uniformly at random in a sampled one, not at all in the centre replay."""
        directed = t + self._signs(t) * bound * scale if self.directed else None
        if self.generator is None:
            return t if directed is None else directed
        delta = self.generator.signed(t.shape) * bound
        return self._mixed(t + delta * scale, directed)

    def _tf32(self, name: str, out_vd: list) -> bool:
        if not out_vd or out_vd[0] != torch.float32:
            return False
        return self.options.conv_tf32 if name in ("convolution", "_convolution") else self.options.matmul_tf32

    def _input_format(self, name: str, out_vd: list) -> Any:
        """The format a float32 contraction's kernel reads its inputs in, where it is not
        float32: TF32 on a CUDA device that allows it, bfloat16 where the CPU's oneDNN computed
        the recorded op from bfloat16 inputs (`opgraph.OpRecorder._reduced_matmul`)."""
        if name not in CONTRACTIONS:
            return None
        if self._tf32(name, out_vd):
            return "tf32"
        if self.matmul_inputs == "bf16" and out_vd and out_vd[0] == torch.float32:
            return torch.bfloat16
        return None

    # -- dtypes ------------------------------------------------------------------------
    def _output_dtypes(self, func: Any, args: tuple, kwargs: dict, flat: list) -> list[torch.dtype | None]:
        """The dtypes the op's outputs have on the arm: the op run on meta tensors of the
        inputs' arm dtypes (memoized per op and input dtypes)."""
        key = self._dtype_key(func, kwargs, flat)
        inner = key[1]
        cached = self.cache.dtypes.get(key)
        if cached is not None:
            return cached
        flat, spec = tree_flatten((args, kwargs))
        if inner is not None:
            flat = [inner if a is torch.float64 else a for a in flat]
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            dtypes = self._dtypes_of(func, flat, spec, kwargs)
        except Exception:  # noqa: BLE001 - no meta kernel: the widest floating input dtype
            floats = [self.vdtype(a) for a in flat if isinstance(a, torch.Tensor) and a.is_floating_point()]
            widest = min(floats, key=lambda d: UNIT_ROUNDOFF.get(d, 1.0)) if floats else None
            dtypes = [widest] * 16
        finally:
            torch.set_default_dtype(previous)
        self.cache.dtypes[key] = dtypes
        return dtypes

    def _dtype_key(self, func: Any, kwargs: dict, flat: list) -> tuple:
        """What an op's output dtypes depend on: the op, the decomposition's computation dtype,
        its inputs' arm dtypes (and the types of its other arguments)."""
        inner = self.inner_dtype[-1] if self.inner_dtype else None
        return (func, inner, tuple(self.vdtype(a) if isinstance(a, torch.Tensor) else
                                   (a if isinstance(a, (torch.dtype, bool)) or a is None else type(a).__name__)
                                   for a in flat), tuple(kwargs))

    def _dtypes_of(self, func: Any, flat: list, spec: Any, kwargs: dict) -> list:
        """The op's output dtypes on stand-ins of the arm dtypes: CPU tensors that allocate
        nothing, a 1 broadcast to the input's shape (a pointwise op gets one element of the
        input's rank: a dtype depends on the dtypes and on which inputs are 0-dim, never on
        sizes or values).  Meta tensors are the fallback: most meta kernels are Python that
        imports torch._dynamo or sympy, more than a second of this process's life.  Seeded ops
        (they would draw from the generator) and out= calls run on meta, and so does any op
        the stand-ins fail on or that returns something other than tensors. An op that reads
        positions from an integer tensor (a pooling's indices) gets whole stand-ins, its indices
        0: torch 2.13's `adaptive_max_pool3d_backward` reads past a broadcast stand-in and
        crashes the process (a gradient through `adaptive_max_pool3d` killed the simulation)."""
        if torch.Tag.nondeterministic_seeded not in func.tags and "out" not in kwargs:
            pointwise = torch.Tag.pointwise in func.tags
            indexed = not pointwise and any(_is_index(a) for a in flat)
            stand_ins = [self._stand_in(a, pointwise, indexed) if isinstance(a, torch.Tensor)
                         else torch.device("cpu") if isinstance(a, torch.device) else a for a in flat]
            try:
                dtypes = _dtypes(func, stand_ins, spec, torch.device("cpu"))
            except Exception:  # noqa: BLE001 - the meta kernel decides
                dtypes = [None]
            if None not in dtypes:
                return dtypes
        meta = [torch.empty(a.shape, dtype=self.vdtype(a), device="meta") if isinstance(a, torch.Tensor)
                else torch.device("meta") if isinstance(a, torch.device) else a for a in flat]
        return _dtypes(func, meta, spec, torch.device("meta"))

    def _stand_in(self, a: torch.Tensor, pointwise: bool, indexed: bool) -> torch.Tensor:
        """`a` as `_dtypes_of` runs the op on it, of its arm dtype: one element of its rank for a
        pointwise op, a broadcast 1 of its shape otherwise, and for an op that reads positions
        from an index tensor the whole shape, indices 0."""
        dtype = self.vdtype(a)
        if pointwise:
            return torch.ones((1,) * a.dim(), dtype=dtype)
        if not indexed:
            return torch.ones((), dtype=dtype).expand(a.shape)
        return torch.zeros(a.shape, dtype=dtype) if _is_index(a) else torch.ones(a.shape, dtype=dtype)

    def _tag(self, out: Any, out_vd: list) -> Any:
        if isinstance(out, torch.Tensor):  # the common case, without the pytree round trip
            if out_vd and out_vd[0] is not None:
                out._arm_dtype = out_vd[0]
            return out
        flat = tree_flatten(out)[0]
        for t, d in zip(flat, _each_output(out_vd, len(flat)), strict=True):
            if isinstance(t, torch.Tensor) and d is not None:
                t._arm_dtype = d
        return out

    # -- rounding ----------------------------------------------------------------------
    def _round_all(self, out: Any, out_vd: list, library: float) -> Any:
        self.rounded = True
        if isinstance(out, torch.Tensor):  # the common case, without the pytree round trip
            d = out_vd[0] if out_vd else None
            if d is not None and (out.is_floating_point() or out.is_complex()):
                out = self._round(out, d, library)
                if self.flush and d in FORMATS and out.is_floating_point():
                    out = _flushed_to_zero(out, FORMATS[d][2])
            if d is not None:
                out._arm_dtype = d
            return out
        flat, spec = tree_flatten(out)
        rounded = []
        each = _each_output(out_vd, len(flat))
        for i, t in enumerate(flat):
            d = each[i]
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and d is not None:
                t = self._round(t, d, library)
                if self.flush and d in FORMATS and t.is_floating_point():
                    t = _flushed_to_zero(t, FORMATS[d][2])
                t._arm_dtype = d
            elif isinstance(t, torch.Tensor) and d is not None:
                t._arm_dtype = d
            rounded.append(t)
        return tree_unflatten(rounded, spec)

    def _round(self, t: torch.Tensor, dtype: torch.dtype, library: float) -> torch.Tensor:
        """`t` rounded to `dtype` after `library` units of a kernel's error, in `t`'s memory
        layout: the centre replay's rounding (a cast) keeps it, the others compute in NumPy on
        contiguous copies, and a compiled region's graph decides by the layout whether
        `reshape` copies (one more op in one replay than in another shifts every later call's
        index, under which the centre noted each call's figures)."""
        out = _laid_out_as(self._rounded(t, dtype, library), t)
        if self.note_overflows and not self.samples and t.is_floating_point() and out.shape == t.shape:
            self.underflowed = self.underflowed or bool(((out == 0) & (t != 0)).any())
        return out

    def _rounded(self, t: torch.Tensor, dtype: torch.dtype, library: float) -> torch.Tensor:
        if t.is_complex():
            parts = torch.view_as_real(t.resolve_conj()).contiguous()
            real_dtype = COMPLEX_PARTS.get(dtype, torch.float64)
            if library and not self.exact:
                # A complex kernel errs relative to the modulus: a part that cancels (a
                # quotient's real part) keeps the whole value's absolute error.
                modulus = t.abs().unsqueeze(-1).expand(parts.shape)
                parts, library = self._absolute_noise(parts, modulus, library * UNIT_ROUNDOFF[real_dtype]), 0.0
            return torch.view_as_complex(self._rounded(parts.contiguous(), real_dtype, library))
        if self.exact or dtype not in FORMATS and dtype != torch.float64:
            return t
        if library and self.loses_subnormals and dtype in FORMATS and (self.directed or self.generator is not None):
            t = self._below_normal(t, FORMATS[dtype][2])
        u = UNIT_ROUNDOFF[dtype]
        if dtype != torch.float64 and t.dtype == torch.float64 and 1 < t.numel() <= NUMPY_ELEMENTS \
                and (self.directed or self.generator is not None):
            # A small value's kernel error and rounding in one pass of NumPy calls: the
            # arithmetic and draws of `_relative_noise` then `round_to`, a fraction of the
            # cost of a dozen small torch ops.
            signs = self._sign_views(t.dim())[1] if isinstance(self.direction, torch.Tensor) else self.direction
            noisy = _relative_noise_numpy(t.detach().contiguous().numpy(), library * u, signs, self.generator)
            if library and self.bound is not None:  # a real function's (a complex one's parts have no bound)
                noisy = np.clip(noisy, *self.bound)
            rounded = _round_array(noisy, *FORMATS[dtype], signs, self.generator)
            if rounded is not None:
                return torch.from_numpy(rounded)
            # Past the format's normal range: `round_to` by the spacing, after the same noise.
            return round_to(torch.from_numpy(noisy), dtype, self._signs(t), self.generator)
        if library:
            t = self._relative_noise(t, library * u)
            if self.bound is not None:
                t = t.clamp(*self.bound)
        if dtype == torch.float64:
            # Rounding float64 results to float64: a relative perturbation of one unit roundoff.
            return t if library else self._relative_noise(t, u)
        if t.numel() == 1 and t.dim() <= 1 and self.generator is not None:
            # One element (a Python-level loop over scalars): the same rounding in Python
            # floats, an order of magnitude cheaper than a dozen one-element tensor ops.
            return torch.tensor(round_scalar(t.item(), dtype, self.direction, self.draws),
                                dtype=torch.float64).reshape(t.shape)
        return round_to(t, dtype, self._signs(t), self.generator)

    def _below_normal(self, t: torch.Tensor, tiny: float) -> torch.Tensor:
        """A library function's result whose exact value is nonzero and below the dtype's
        smallest normal (`tiny`) moved by up to itself: the table measures kernels on normal
        results only (a subnormal keeps fewer digits than the dtype), and a correct kernel may
        lose them all — float32 `sigmoid(−96.8)` is 1/(1 + exp(96.8)) = 1/inf = 0 where the
        exact 9.1e-43 is a subnormal, which the accuracy note's extremal values cover."""
        if t.is_complex():
            return t
        if t.numel() <= NUMPY_ELEMENTS:
            m = np.abs(t.detach().numpy())
            if not ((m < tiny) & (m > 0)).any():
                return t
        below = (t.abs() < tiny) & (t != 0)
        if not bool(below.any()):
            return t
        moved = self._absolute_noise(t, torch.where(below, t.abs(), 0.0), 1.0)
        return moved.clamp(*self.bound) if self.bound is not None else moved

    def _relative_noise(self, t: torch.Tensor, bound: float) -> torch.Tensor:
        directed = t + self._signs(t) * bound * t.abs() if self.directed else None
        if directed is not None and not bool(torch.isfinite(t).all()):
            directed = torch.where(torch.isinf(t), t, directed)  # ±inf is exact: −inf + b·inf was nan
        if self.generator is None:
            return t if directed is None else directed
        delta = self.generator.signed(t.shape) * bound
        return self._mixed(t * (1 + delta), directed)

    def _mixed(self, sampled: torch.Tensor, directed: torch.Tensor | None) -> torch.Tensor:
        """A random replay's result, or in a stack of directed and random replays (a sign per
        sample, 0 for the random ones) each sample's own."""
        if directed is None:
            return sampled
        return torch.where(self._signs(sampled) == 0, sampled, directed)

    def _accumulate(self, call: int, name: str, func: Any, args: tuple, kwargs: dict, out: torch.Tensor,
                    out_vd: list) -> torch.Tensor:
        """The rounding inside a reduction or contraction: n roundings, modelled as one
        random walk over a sequential order (σ per output element; inside a fused kernel,
        with part of its lanes' round-to-nearest bias, `lane_stagnation`), or for directed
        replays a pairwise worst case, ⌈log2 n⌉·u·Σ|t|."""
        d = out_vd[0] if out_vd else torch.float32
        d = COMPLEX_PARTS.get(d, d)  # a complex value accumulates each part in its parts' dtype
        # fp16/bf16 reductions and GEMMs accumulate in fp32, except where the table measured the
        # kernel not doing so, reduced-precision GEMMs are allowed, or the device's kernel was
        # not measured where half accumulation is known to happen (`half_accumulation`).
        acc = d if (d in (torch.float16, torch.bfloat16)
                    and (self._reduced_accumulation(name, d)
                         or name in CONTRACTIONS and self.options.reduced_precision
                         or self.options.half_accumulation and self.options.kernels.get(name, d) is None)) \
            else (torch.float32 if d in FORMATS else d)
        if name in DOUBLE_SCANS and d is torch.float32 and not self.options.any_order:
            acc = torch.float64
        if name.rstrip("_") in SCATTER_SUMS:
            acc = d
        cached = self.cache.magnitudes.get(call)
        if cached is None or cached[0] is not func:
            try:
                functional, plain = _functional(func, kwargs)
                in_order = bool(self.sequential) and self.sequential[-1]
                lanes = bool(self.inner_dtype) and not (self.options.any_order or in_order)
                cached = (func,) + _magnitudes(name, functional, args, plain, out, fused=bool(self.inner_dtype),
                                               any_order=self.options.any_order or in_order)
                cached += (lane_stagnation(name, args, plain, out)
                           if lanes and acc is torch.float32 and not self.samples else None,)
            except Exception:  # noqa: BLE001 - no model for this call: its output rounding only
                cached = (func, None, None, None)
            self.cache.magnitudes[call] = cached
        _, walk, bound, stagnation = cached
        if walk is None or walk.shape != self._sample_shape(out):
            return out
        u = UNIT_ROUNDOFF.get(acc, 2.0 ** -53)
        directed = None
        if self.directed and name in ("sum", "mean", "nansum") and acc in FORMATS:
            if self.samples and not _is_stacked(args[0]):  # terms no replay changed: each sample adds them its way
                args = (_stack_outputs(args[0], self.samples),) + tuple(args[1:])
            directed = _directed_pairwise_sum(name, args, kwargs, acc, self.direction, bool(self.samples))
            directed = directed if directed is not None and directed.shape == out.shape else None
        # A nonfinite result (a term that overflowed) carries no rounding error: its walk and
        # bound are inf too, and inf - inf would turn it into a nan no arm computes.
        finite = torch.isfinite(out)
        if out.is_complex():  # each part walks on its own, up to the same bound
            bound = bound * complex(1, 1)
        if self.directed and directed is None:
            directed = torch.where(finite, out + self._signs(out) * u * bound, out)
        if self.generator is None:
            result = out if directed is None else directed
        else:
            drawn = torch.from_numpy(self.generator.normal(out.shape))
            if out.is_complex():
                drawn = torch.complex(drawn, torch.from_numpy(self.generator.normal(out.shape)))
            noise = u * walk * drawn
            if stagnation is not None:  # a fused kernel's lanes drop terms: part of the way to their bias
                noise = noise + stagnation * torch.from_numpy(self.generator.uniform(out.shape))
            result = self._mixed(torch.where(finite, out + noise, out), directed)
        return self._overflow(result, self._overflowing(call, func, name, args, kwargs, out, acc))

    def _overflow(self, result: torch.Tensor, over: torch.Tensor | None) -> torch.Tensor:
        """`result` with ±inf, in half the random replays, where its accumulator may overflow
        (`over`). Possible, not certain (a kernel may accumulate wider: the CPU's float32
        cumsum adds in double, a Welford variance never holds the sum), so a finite result and
        ±inf are both rounding of this computation, and the element keeps no digit."""
        if over is None or self.generator is None:
            return result
        coin = torch.from_numpy(np.asarray(self.generator.uniform(result.shape) < 0.5))
        return torch.where(over & coin, torch.copysign(torch.tensor(math.inf, dtype=result.dtype), result), result)

    def _overflowing(self, call: int, func: Any, name: str, args: tuple, kwargs: dict, out: torch.Tensor,
                     acc: torch.dtype) -> torch.Tensor | None:
        """The output elements whose accumulator, at `acc`, passes its range whatever the
        order: the exact total (a mean's or a variance's sum of terms, a cumsum's prefix, a
        contraction's dot product) beyond the largest finite value. A kernel accumulating
        there gives ±inf even where the result would fit (the CPU's float32 mean or variance
        of three 3e38), which the accuracy note's extremal values allow. Found once, by the
        centre replay (the first, not stacked)."""
        if self.exact:
            return None
        noted = self.cache.overflowing.get(call)
        if noted is not None and noted[0] is func:
            return noted[1]
        if acc not in FORMATS or name == "prod" or _is_stacked(out) or _is_stacked(args[0]):
            return None
        if name in MOMENTS:
            dims, keepdim = reduced_dims(name, args, kwargs, args[0])
            total = torch.sum(args[0], dims, keepdim=keepdim)
            if total.numel() != out.numel():
                return None
            total = total.reshape(out.shape)
        else:
            total = out * (args[0].numel() / max(out.numel(), 1)) if name == "mean" else out
        big = total.abs() > torch.finfo(acc).max
        over = big if bool(big.any()) else None
        self.cache.overflowing[call] = (func, over)
        return over

    def _perturb_matrices(self, args: tuple, factor: float = 1.0) -> tuple:
        """Backward stability: the op is exact for an input within c = factor·√n·u of the
        arm's, in norm (LAPACK's guarantee is ‖E‖ ≤ p(n)·u·‖A‖, not per element): each element
        moves by c of itself plus c of the matrix's largest element, so a small entry next to
        a large one (an eigenvector problem's near-degenerate pair) moves as far as LAPACK's
        own error lets it."""
        if self.generator is None:
            return args
        out = []
        for a in args:
            if isinstance(a, torch.Tensor) and a.dim() >= 2 and (a.is_floating_point() or a.is_complex()) and a.numel():
                u = UNIT_ROUNDOFF.get(COMPLEX_PARTS.get(self.vdtype(a), self.vdtype(a)), 2.0 ** -53)
                c = factor * math.sqrt(max(a.shape[-1], a.shape[-2]))
                largest = torch.nan_to_num(a.abs(), posinf=0.0).amax(dim=(-2, -1), keepdim=True)
                relative, normwise = (self._unit_draws(a) * c * u for _ in range(2))
                a = a * (1 + relative) + normwise * largest
            out.append(a)
        return tuple(out)

    def _moved_coordinates(self, name: str, args: tuple) -> tuple:
        """A sampling op's grid (`GRID_SAMPLERS[name]`) as its kernel unnormalizes it, in a
        random replay: each coordinate moved by up to COORDINATE_ROUNDINGS·u·(|x| + 1), u of the
        grid's arm dtype; a stack's directed replays keep it."""
        at = GRID_SAMPLERS[name]
        grid = args[at] if len(args) > at else None
        if not isinstance(grid, torch.Tensor) or not grid.is_floating_point():
            return args
        dtype = self.vdtype(grid)
        reach = COORDINATE_ROUNDINGS * UNIT_ROUNDOFF.get(dtype, 2.0 ** -53) * (grid.abs() + 1)
        shape = ((self.samples,) if self.samples and not _is_stacked(grid) else ()) + tuple(grid.shape)
        draws = self.generator.signed(shape)
        if isinstance(self.direction, torch.Tensor):
            draws = draws * (self._sign_views(draws.dim())[0] == 0)
        moved = grid + draws * reach
        moved._arm_dtype = dtype
        return args[:at] + (_mark_stacked(moved) if self.samples else moved,) + args[at + 1:]

    def _unit_draws(self, a: torch.Tensor) -> torch.Tensor:
        """Uniform draws in [-1, 1] shaped like `a`; for a complex `a`, real and imaginary parts
        each so (a modulus up to √2: a complex flop errs up to √2·u for an addition and √5·u
        for a product, against u for a real one; Higham, Accuracy and Stability, lemma 3.5)."""
        if not a.is_complex():
            return self.generator.signed(a.shape)
        return torch.view_as_complex(self.generator.signed(a.shape + (2,)))


def round_to(t: torch.Tensor, dtype: torch.dtype, direction: int | torch.Tensor,
             generator: Draws | None) -> torch.Tensor:
    """`t` (float64) rounded to `dtype`'s values: stochastically with probability
    proportional to the distance (unbiased), directed up (+1) or down (-1), or to nearest
    (no generator, direction 0). Beyond the range: ±inf, as the arm's rounding gives. A
    tensor of directions (broadcast against `t`) rounds each element its own way: ±1
    directed, 0 stochastically (with a generator; to nearest without one)."""
    per_element = isinstance(direction, torch.Tensor)
    if not per_element and direction == 0 and generator is None and isinstance(dtype, torch.dtype):
        return t.to(dtype).to(torch.float64)
    bits, largest, tiny = FORMATS[dtype]
    if t.dtype == torch.float64:
        rounded = _round_bits(t, bits, largest, tiny, direction, generator)
        if rounded is not None:
            return rounded
    return _round_by_spacing(t, bits, largest, tiny, direction, generator)


def _round_by_spacing(t: torch.Tensor, bits: int, largest: float, tiny: float, direction: int | torch.Tensor,
                      generator: Draws | None) -> torch.Tensor:
    """`round_to` from the spacing of the dtype's values around each element: any value
    (subnormal spacing, overflow, inf and nan), in twice the passes of `_round_bits`."""
    per_element = isinstance(direction, torch.Tensor)
    # Spacing of the dtype's values around t (subnormals share the smallest normal's); inf and
    # nan pass through the arithmetic below unchanged.
    _, exp = torch.frexp(t)
    ulp = torch.ldexp(torch.ones_like(t), exp.clamp_(min=int(math.log2(tiny)) + 1).sub_(bits))
    low = torch.floor(t / ulp).mul_(ulp)
    if per_element:
        up = (t > low) & (direction > 0)
        if generator is not None or bool((direction == 0).any()):
            frac = (t - low).div_(ulp)
            near = frac >= 0.5 if generator is None else torch.from_numpy(generator.uniform(t.shape)) < frac
            up = torch.where(direction == 0, near, up)
    elif direction > 0:
        up = t > low
    elif direction < 0:
        up = torch.zeros_like(t, dtype=torch.bool)
    else:
        frac = (t - low).div_(ulp)
        up = frac >= 0.5 if generator is None else torch.from_numpy(generator.uniform(t.shape)) < frac
    out = torch.where(up, low + ulp, low)
    beyond = t.abs() > largest
    if bool(beyond.any()):
        # Past the largest finite value: rounding toward the value's side of zero (or to
        # nearest past the midpoint) gives inf, rounding back toward zero the largest value.
        nearest = t.abs() >= largest + ulp / 2
        toward_inf = (torch.where(direction == 0, nearest, torch.sign(t) == direction) if per_element
                      else torch.sign(t) == direction if direction else nearest)
        capped = torch.where(toward_inf, torch.full_like(t, math.inf), torch.full_like(t, largest))
        out = torch.where(beyond & torch.isfinite(t), torch.copysign(capped, t), out)
    return out


def _normal_or_zero(t: torch.Tensor, largest: float, tiny: float) -> bool:
    """Every element of `t` is zero or a normal number of the format, within [tiny, largest]
    in magnitude (a nan fails). Two passes where no element is zero, which is most values."""
    low, high = (float(x) for x in torch.aminmax(t.abs()))
    if not high <= largest:
        return False
    if low >= tiny:
        return True
    if low != 0:
        return False
    magnitude = t.abs()
    return not bool(((magnitude < tiny) & (magnitude != 0)).any())


def _round_bits(t: torch.Tensor, bits: int, largest: float, tiny: float, direction: int | torch.Tensor,
                generator: Draws | None) -> torch.Tensor | None:
    """`round_to` on the integer bits of float64 `t`: an integer below 2^(53 - bits) added
    to the magnitude's bit pattern carries into the kept bits (a carry past the significand
    steps the exponent, to the next binade's value), then the dropped bits are cleared.
    Stochastically the integer is uniform, so the carry's probability is exactly the
    dropped fraction; directed it is all ones where the rounding moves away from zero (up
    for a positive value, down for a negative one), nothing where it moves toward it. None
    where some element is neither zero nor a normal number within the format's range
    (subnormal spacing, overflow, inf and nan: `_round_by_spacing`)."""
    if t.numel() <= NUMPY_ELEMENTS:
        return _round_bits_numpy(t, bits, largest, tiny, direction, generator)
    if not _normal_or_zero(t, largest, tiny):
        return None
    dropped = 53 - bits
    if isinstance(direction, torch.Tensor):
        if generator is None and bool((direction == 0).any()):
            return None  # to nearest, ties to even: `_round_by_spacing`
        # Away from zero where the value's sign is the direction (0, a random row: never).
        carry = ((t * direction) > 0).to(torch.int64).mul_((1 << dropped) - 1)
        if generator is not None:  # the random samples of a stack of directed and random replays
            drawn = torch.from_numpy(generator.integers(t.shape, dropped))
            carry = torch.where(direction == 0, drawn, carry)
    elif direction:
        away = t > 0 if direction > 0 else t < 0
        carry = away.to(torch.int64).mul_((1 << dropped) - 1)
    else:
        if generator is None:
            return None  # to nearest: `_round_by_spacing`
        carry = torch.from_numpy(generator.integers(t.shape, dropped))
    return carry.add_(t.contiguous().view(torch.int64)).bitwise_and_(-(1 << dropped)).view(torch.float64)


# Up to this many elements `_round_bits` makes its passes in NumPy, on the tensor's own
# memory: a pass over a few hundred elements is mostly the call's overhead, about 4 µs in
# torch and 1 µs in NumPy (a training loop's 3,000 small ops: thousands of roundings). The
# same IEEE operations on the same bits, and the same draws from the replay's generator: the
# same result.
NUMPY_ELEMENTS = 1 << 12


def _finite_rms(rows: torch.Tensor) -> torch.Tensor:
    """The root mean square of each row's finite elements, nan for a row with none. Rows of up
    to NUMPY_ELEMENTS elements in NumPy, together (a stack's samples: one call, not a dozen
    torch ops each), longer ones one at a time in torch: a sample's figure is the same whether
    it is stacked or not."""
    if rows.shape[1] > NUMPY_ELEMENTS:
        return torch.tensor([float(x[f].square().mean().sqrt()) if bool(f.any()) else math.nan
                             for x, f in zip(rows, torch.isfinite(rows), strict=True)], dtype=torch.float64)
    a = rows.detach().contiguous().numpy()
    finite = np.isfinite(a)
    count = finite.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):  # a row with no finite element: nan
        mean = np.where(finite, a * a, 0.0).sum(axis=1) / count
    return torch.from_numpy(np.where(count > 0, np.sqrt(mean), np.nan))


def _round_bits_numpy(t: torch.Tensor, bits: int, largest: float, tiny: float, direction: int | torch.Tensor,
                      generator: Draws | None) -> torch.Tensor | None:
    """`_round_bits` of a small tensor, in NumPy."""
    a = t.detach().contiguous().numpy()
    if not a.size:
        return t.clone()
    signs = direction.numpy() if isinstance(direction, torch.Tensor) else direction
    rounded = _round_array(a, bits, largest, tiny, signs, generator)
    return None if rounded is None else torch.from_numpy(rounded)


def _relative_noise_numpy(a: np.ndarray, bound: float, signs: int | np.ndarray,
                          generator: Draws | None) -> np.ndarray:
    """`RoundingMode._relative_noise` of a small float64 array, in NumPy: the same IEEE
    operations in the same order and the same draws from `generator`, so the same result bit
    for bit (`a` itself where there is no noise to add)."""
    if not bound:
        return a
    directed = a + (signs * bound) * np.abs(a) if isinstance(signs, np.ndarray) or signs else None
    if directed is not None and not np.isfinite(a).all():
        # ±inf is exact (log1p(−1) in a loss that clamps it next): −inf + b·inf was nan.
        directed = np.where(np.isinf(a), a, directed)
    if generator is None:
        return a if directed is None else directed
    delta = (generator.uniform(a.shape) * 2 - 1) * bound
    sampled = a * (1 + delta)
    return sampled if directed is None else np.where(signs == 0, sampled, directed)


def _round_array(a: np.ndarray, bits: int, largest: float, tiny: float, signs: int | np.ndarray,
                 generator: Draws | None) -> np.ndarray | None:
    """`_round_bits` on a float64 NumPy array (not empty): directions as a sign or an array
    of signs broadcast against it."""
    a = np.asarray(a)  # a level's last sum may be a NumPy scalar
    magnitude = np.abs(a)
    low, high = float(magnitude.min()), float(magnitude.max())
    if not high <= largest:
        return None
    if not low >= tiny and (low != 0 or bool(((magnitude < tiny) & (magnitude != 0)).any())):
        return None
    dropped = 53 - bits
    if isinstance(signs, np.ndarray):
        if generator is None and bool((signs == 0).any()):
            return None
        carry = ((a * signs) > 0).astype(np.int64) * ((1 << dropped) - 1)
        if generator is not None:
            drawn = generator.integers(a.shape, dropped)
            carry = np.where(signs == 0, drawn, carry)
    elif signs:
        carry = ((a > 0) if signs > 0 else (a < 0)).astype(np.int64) * ((1 << dropped) - 1)
    elif generator is None:
        return None  # to nearest (a tf32 rounding in the centre replay): `_round_by_spacing`
    else:
        carry = generator.integers(a.shape, dropped)
    rounded = np.asarray((carry + a.view(np.int64)) & -(1 << dropped))  # 0-dim: NumPy scalars
    return rounded.view(np.float64)


_OP_CLASSES: dict[Any, str] = {}


def op_class(func: Any) -> str:
    """How an aten op rounds (memoized): decomposed | linalg | exact | accumulated |
    correctly-rounded | library."""
    kind = _OP_CLASSES.get(func)
    if kind is not None:
        return kind
    # A foreach op (an optimizer's step over a tensor list) rounds as its per-tensor op does.
    name = func.overloadpacket.__name__.removeprefix("_foreach_")
    names = {name, name.rstrip("_")}
    if name in DECOMPOSED and func in decomposition_table or (
            torch.Tag.pointwise not in func.tags
            and not names & (EXACT | SUMS | CONTRACTIONS | LINALG | CORRECTLY_ROUNDED)
            and (func in decomposition_table or _composite(func))) or custom_implementation(func) is not None \
            or func in OWN_DECOMPOSITIONS:
        kind = "decomposed"
    elif name in LINALG:
        kind = "linalg"
    elif name in EXACT or name.rstrip("_") in EXACT:  # in place too: `relu_`, `scatter_`, `clamp_`
        kind = "exact"
    elif name in CONTRACTIONS or name in SUMS or name in EMBEDDING_BAGS:
        kind = "accumulated"
    elif name.rstrip("_") in CORRECTLY_ROUNDED:
        kind = "correctly-rounded"
    else:
        kind = "library"
    _OP_CLASSES[func] = kind
    return kind


def _composite(func: Any) -> bool:
    """An op defined by other ops (CompositeImplicitAutograd) that reached the mode whole:
    decompositions call such ops directly (attention's math path)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def round_scalar(x: float, dtype: Any, direction: int, draws: random.Random | None) -> float:
    """`round_to` for one Python float: stochastically (draws), up (+1) or down (-1)."""
    if not math.isfinite(x):
        return x
    bits, largest, tiny = FORMATS[dtype]
    _, exp = math.frexp(x)
    ulp = math.ldexp(1.0, max(exp, int(math.log2(tiny)) + 1) - bits)
    low = math.floor(x / ulp) * ulp
    frac = (x - low) / ulp
    if direction > 0:
        out = low + ulp if frac > 0 else low
    elif direction < 0:
        out = low
    else:
        out = low + ulp if draws.random() < frac else low
    if abs(x) > largest:
        toward_inf = (math.copysign(1, x) == direction) if direction else abs(x) >= largest + ulp / 2
        out = math.copysign(math.inf if toward_inf else largest, x)
    return out


def _vector_norm(x: torch.Tensor, ord: float = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """`torch._refs.linalg.vector_norm` without its shape guards: the reference imports
    torch.fx.experimental.symbolic_shapes (and sympy, half a second) on every first call."""
    from torch._prims_common import REDUCTION_OUTPUT_TYPE_KIND, reduction_dtypes

    computation, result = reduction_dtypes(x, REDUCTION_OUTPUT_TYPE_KIND.COMPLEX_TO_FLOAT, dtype)
    if isinstance(dim, int):
        dim = [dim]
    if ord == 0.0:
        return torch.sum(torch.ne(x, 0.0), dim=dim, keepdim=keepdim, dtype=result)
    if ord == math.inf:
        return torch.amax(torch.abs(x), dim=dim, keepdim=keepdim).to(result)
    if ord == -math.inf:
        return torch.amin(torch.abs(x), dim=dim, keepdim=keepdim).to(result)
    if x.dtype != computation:
        x = x.to(computation)
    dims = None if dim is None or len(dim) == 0 else [d % max(1, x.dim()) for d in dim]
    if (x.numel() == 1 if dims is None else x.dim() > 0 and all(x.shape[d] == 1 for d in dims)):
        x = torch.abs(x)  # one term: its magnitude, as the reference returns it
        if keepdim or x.dim() == 0:
            return x.to(result).contiguous()
        if dims is None:
            return x.to(result).flatten()[0]
        return x.to(result).view([s for d, s in enumerate(x.shape) if d not in dims]).contiguous()
    if not (ord % 2 == 0 and x.is_floating_point()):
        x = torch.abs(x)
    return torch.pow(torch.sum(torch.pow(x, ord), dim=dims, keepdim=keepdim), 1.0 / ord).to(result)


# Decompositions the replay uses in place of torch's: the same arithmetic, without the imports
# torch's references make on first use.
def _native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                                  num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                  proj_weight: torch.Tensor, proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                  need_weights: bool = True, average_attn_weights: bool = True,
                                  mask_type: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ATen's CPU `native_multi_head_attention` (nn.MultiheadAttention's fast path, in eval
    mode without grad) op by op, as attention.cpp computes it: the q, k, v projections (one
    GEMM's rows each), the bias added and q scaled by 1/√(D/heads) (a constant of the
    arm's dtype), q·kᵀ, the (masked) softmax, ·v, and the output projection; the weights
    averaged over heads where asked for."""
    batch, length, _ = query.shape
    per_head = embed_dim // num_head
    arm = getattr(query, "_arm_dtype", torch.float32)
    scale = float(torch.tensor(1.0 / float(torch.tensor(float(per_head), dtype=arm).sqrt()), dtype=arm)) \
        if arm in (torch.float32, torch.float16, torch.bfloat16) else 1.0 / math.sqrt(per_head)
    w_q, w_k, w_v = qkv_weight.chunk(3, 0)
    b_q, b_k, b_v = qkv_bias.chunk(3)

    def heads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (torch.matmul(x, w.t()) + b).view(batch, -1, num_head, per_head).transpose(1, 2)

    q, k, v = heads(query, w_q, b_q) * scale, heads(key, w_k, b_k), heads(value, w_v, b_v)
    scores = torch.matmul(q, k.transpose(-2, -1))
    if mask is None:
        weights = torch.softmax(scores, -1)
    else:
        weights = torch.ops.aten._masked_softmax(scores, mask if mask.dtype == torch.bool else mask.bool(), -1, mask_type)
    context = torch.matmul(weights, v).transpose(1, 2).reshape(batch * length, embed_dim)
    out = torch.nn.functional.linear(context, proj_weight, proj_bias).view(batch, length, embed_dim)
    if not need_weights:
        return out, None
    return out, (weights.sum(1) / num_head if average_attn_weights else weights)


def _transformer_encoder_layer(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                               qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                               use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                               norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                               ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                               ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                               mask_type: int | None = None) -> torch.Tensor:
    """ATen's CPU `transformer_encoder_layer_forward` (nn.TransformerEncoderLayer's fast path)
    op by op, as transformer.cpp computes it: the native attention, the residual, layer norms
    before or after, and the feed-forward GEMMs with their fused ReLU or GELU."""
    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = _native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                     mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    rows = x.reshape(-1, embed_dim)
    hidden = torch.ops.aten._addmm_activation(ffn_bias_1, rows, ffn_weight_1.t(), use_gelu=use_gelu)
    x = torch.addmm(ffn_bias_2, hidden, ffn_weight_2.t()).view(residual.shape) + residual
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def _native_batch_norm(input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
                       momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ATen's CPU batch norm (batch_norm_kernel.cpp) op by op: the batch's mean and biased
    variance in training (the running ones in eval, updated in training as the kernel does),
    then per channel alpha = invstd·w and beta = b − mean·alpha, and the output x·alpha + beta.
    torch's decomposition computes (x − mean)·rstd, whose rounding is relative to the output;
    the kernel's is relative to x·alpha, wider where x is near the mean: a correct kernel
    (ATen's scalar build) sat 4σ outside the decomposition's spread."""
    dims = [0] + list(range(2, input.dim()))
    channels = [1, -1] + [1] * (input.dim() - 2)
    if training:
        var, mean = torch.var_mean(input, dim=dims, correction=0)
        invstd = torch.rsqrt(var + eps)
        n = input.numel() / input.shape[1]
        if running_mean is not None:
            running_mean.copy_(momentum * mean + (1 - momentum) * running_mean)
        if running_var is not None:
            running_var.copy_(momentum * (var * (n / (n - 1))) + (1 - momentum) * running_var)
        saved = (mean, invstd)
    else:
        mean, invstd = running_mean, 1 / torch.sqrt(running_var + eps)
        saved = (input.new_zeros((0,)), input.new_zeros((0,)))
    alpha = invstd * weight if weight is not None else invstd
    beta = bias - mean * alpha if bias is not None else -(mean * alpha)
    return (input * alpha.view(channels) + beta.view(channels),) + saved


def _cdist(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None = None) -> torch.Tensor:
    """ATen's CPU `_cdist_forward` op by op (Distance.cpp): for p = 2 with a matmul where it
    chooses one (`_euclidean_dist`: ‖x‖² + ‖y‖² − 2x·y in one product of padded operands,
    clamped at 0 — which cancels for near points), else the distance's own reduction of
    |x − y| over the features, which the kernel adds one term after another in a scalar loop
    (`SEQUENTIAL_KERNELS`). Its error grows with the feature count and cancels where the matmul
    does, which no per-op bound holds."""
    if _euclidean_by_matmul(x1, x2, p, compute_mode):
        x1_norm = x1.pow(2).sum(-1, keepdim=True)
        x2_norm = x2.pow(2).sum(-1, keepdim=True)
        x1_ = torch.cat([x1.mul(-2), x1_norm, torch.ones_like(x1_norm)], -1)
        x2_ = torch.cat([x2, torch.ones_like(x2_norm), x2_norm], -1)
        return x1_.matmul(x2_.mT).clamp_min_(0).sqrt_()
    diff = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()
    if p == 0:
        return (diff != 0).to(x1.dtype).sum(-1)
    if p == 1:
        return diff.sum(-1)
    if p == 2:
        return diff.pow(2).sum(-1).sqrt()
    if math.isinf(p):
        return diff.amax(-1)
    return diff.pow(p).sum(-1).pow(1 / p)


def _euclidean_by_matmul(x1: torch.Tensor, x2: torch.Tensor, p: float, compute_mode: int | None) -> bool:
    """Whether ATen's cdist takes the matmul path: p = 2 with `compute_mode`
    'use_mm_for_euclid_dist' (1), or by default (0) where either side has more than 25 rows."""
    mode = compute_mode or 0
    return p == 2 and (mode == 1 or mode == 0 and (x1.shape[-2] > 25 or x2.shape[-2] > 25))


def _cdist_terms(args: tuple) -> int:
    """Elements of the |x − y| a decomposed `_cdist_forward` makes: batch × r1 × r2 × m."""
    x1, x2 = args[0], args[1]
    return math.prod(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])) * x1.shape[-2] * x2.shape[-2] * x1.shape[-1]


def _rows_added_in_order(func: Any, args: tuple) -> bool:
    """Whether ATen's CPU batch norm adds its statistics row after row: for an input whose
    channels are its innermost dimension (N×C, N×C×1×1, channels-last), each thread sums its
    rows into a float32 buffer, vectorized across channels (batch_norm_kernel.cpp,
    `..._collect_stats_channels_last_impl`), so each channel's sum is a sequential float32
    walk (a correct N×C kernel's mean erred 1.6 ulp where the lanes' model spread 0.55).
    Other layouts add in double, which the walk covers."""
    names = [a.name for a in func._schema.arguments]
    training = args[names.index("training")] if "training" in names and names.index("training") < len(args) else False
    if not training or not isinstance(args[0], torch.Tensor):
        return False
    one = args[0][0] if _is_stacked(args[0]) else args[0]
    if one.dim() < 2:
        return False
    image = math.prod(one.shape[2:])
    return image == 1 or (one.dim() in (4, 5) and not one.is_contiguous() and one.is_contiguous(
        memory_format=torch.channels_last if one.dim() == 4 else torch.channels_last_3d))


# Kernels that add their terms one after another in a scalar loop (the CPU's cdist: one
# accumulator per distance; batch norm's statistics over rows): their decomposition's sums
# walk sequentially, not in lanes, where the predicate holds of the call's arguments.
SEQUENTIAL_KERNELS: dict[str, Callable[[Any, tuple], bool]] = {
    "_cdist_forward": lambda func, args: True, "native_batch_norm": _rows_added_in_order,
    "_native_batch_norm_legit": _rows_added_in_order, "_native_batch_norm_legit_functional": _rows_added_in_order}
# Ops replayed through their decomposition only up to a size its intermediates may reach (per
# sample: stacked replays hold one per sample); past it, as a library function with the table's bound.
DECOMPOSED_UP_TO = {"_cdist_forward": (_cdist_terms, 1 << 21)}

OWN_DECOMPOSITIONS = {torch.ops.aten.linalg_vector_norm.default: _vector_norm,
                      torch.ops.aten._cdist_forward.default: _cdist,
                      torch.ops.aten.native_batch_norm.default: _native_batch_norm,
                      torch.ops.aten._native_batch_norm_legit.default: _native_batch_norm,
                      torch.ops.aten._native_multi_head_attention.default: _native_multi_head_attention,
                      torch.ops.aten._transformer_encoder_layer_fwd.default: _transformer_encoder_layer,
                      **COMPOSITES}


def _decomposition(func: Any) -> Any:
    """The code `func` is replayed through: triage's own, torch's decomposition table's, a
    custom op's Python implementation, or the op's own `decompose` (a composite op)."""
    return (OWN_DECOMPOSITIONS.get(func) or decomposition_table.get(func) or custom_implementation(func)
            or func.decompose)


def _widening(flat: list, in_vd: list, out_vd: list) -> bool:
    """Every tensor input is floating (an integer cast to float rounds past 2^24) and no
    output dtype is less precise than any input's."""
    tensors = [a for a in flat if isinstance(a, torch.Tensor)]
    if not tensors or not all(a.is_floating_point() for a in tensors) or not in_vd:
        return False
    outs = [d for d in out_vd if d is not None]
    return bool(outs) and all(d in UNIT_ROUNDOFF and i in UNIT_ROUNDOFF and not _less_precise(d, i)
                              for d in outs for i in in_vd)


def _less_precise(a: torch.dtype, b: torch.dtype) -> bool:
    """`a` holds fewer digits than `b` (a complex dtype those of its parts: complex64's real
    view is float32, exactly)."""
    return (_roundoff(a) or 0.0) > (_roundoff(b) or 0.0)


# Contractions without a bias term: the sum of their products and nothing else.
PLAIN_CONTRACTIONS = {"mm", "bmm", "mv", "dot", "vdot", "matmul"}


def _magnitudes(name: str, func: Any, args: tuple, kwargs: dict, out: torch.Tensor,
                fused: bool = False, any_order: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(random-walk σ/u, pairwise bound/u) of one reduction or contraction call, per output
    element: contractions σ = √(n/3)·√(S²/3 + Σt²/2) (a sequential order: GEMM kernels
    accumulate along k), reductions the blocked walk, or inside a fused kernel (`fused`: a
    decomposed op's sum) the lane walk, or where any order is possible (`any_order`) the
    sequential walk; bound = ⌈log2 n⌉·Σ|t|. One term is no addition: both are 0 there (a
    mean over a dimension of one, a product with an inner dimension of one, a cumsum's first
    element), and only the result's own rounding remains; not with a bias (addmm's, a
    convolution's), whose addition rounds too."""
    if name in PLAIN_CONTRACTIONS and _contraction_length(name, args) == 1:
        return _no_accumulation(out)
    if name.rstrip("_") in SCATTER_SUMS:
        return _scatter_magnitudes(name, args, kwargs, out)
    if name in EMBEDDING_BAGS:
        return _bag_magnitudes(func, args, kwargs, out)
    if name in CONTRACTIONS:
        # Complex factors: each part of a term's product is two real products, (ac − bd), so a
        # part adds 2n terms, none larger than the moduli's product, |x||y|.
        squares = _same_contraction(name, func, args, kwargs,
                                    (lambda x: x.abs().square()) if out.is_complex() else (lambda x: x * x))
        absolute = _same_contraction(name, func, args, kwargs, torch.abs)
        n = _contraction_length(name, args) * (2 if out.is_complex() else 1)
        s = out.abs() if out.is_complex() else out
    else:
        x = args[0]
        if name == "nansum":  # its nan terms add nothing (`torch.nanmean`: nansum over a count)
            x = torch.where(torch.isnan(x), 0.0, x)
        dims, keepdim = reduced_dims(name, args, kwargs, x)
        n = max(1, math.prod(x.shape[d] for d in dims) if x.dim() else 1)
        if name == "cumsum":  # of complex terms: each part's walk, bounded by the moduli's
            dim = dims[0]
            squares = torch.cumsum(x.abs().square() if x.is_complex() else x * x, dim)
            absolute = torch.cumsum(x.abs(), dim)
            shape = [1] * x.dim()
            shape[dim] = x.shape[dim]
            count = torch.arange(1, x.shape[dim] + 1, dtype=torch.float64).reshape(shape)
            total = torch.cumsum(x, dim)
            walk = (count / 3).sqrt() * ((total.abs() if total.is_complex() else total).square() / 3 + squares / 2).sqrt()
            added = count > 1
            return walk * added, torch.ceil(torch.log2(count.clamp(min=2))) * absolute * added
        if n == 1:
            return _no_accumulation(out)
        if name == "prod":
            walk = out.abs() * math.sqrt(n / 3)
            return walk, out.abs() * n
        # One pass each, with no temporary (a 2M-term mean: 2 of the centre replay's 20 passes).
        squares = torch.linalg.vector_norm(x, 2, dims, keepdim).square_()
        absolute = torch.linalg.vector_norm(x, 1, dims, keepdim)
        s = torch.sum(x, dims, keepdim=keepdim)
        if not bool(torch.isfinite(s).all()):  # the finite terms' sum, without a copy where all are
            s = torch.sum(torch.nan_to_num(x), dims, keepdim=keepdim)
        if s.is_complex():  # each part's walk, bounded by the moduli's
            s = s.abs()
        scale = 1.0 / n if name == "mean" else 1.0
        walk = (sequential_walk(n, s, squares) if any_order else lane_walk(n, s, squares) if fused
                else blocked_walk(n, s, squares)) * scale
        return walk.reshape(out.shape), (math.ceil(math.log2(max(n, 2))) * absolute * scale).reshape(out.shape)
    walk = sequential_walk(n, s, squares)
    return walk.reshape(out.shape), (math.ceil(math.log2(max(n, 2))) * absolute).reshape(out.shape)


def _scatter_source(name: str, args: tuple, kwargs: dict) -> int | str | None:
    """Where a scatter or index op's source terms are (a position or a keyword), if this call
    adds them into its output (`SCATTER_SUMS`); None if it only moves values."""
    base = name.rstrip("_")
    if base not in SCATTER_SUMS:
        return None
    position, keyword, _ = SCATTER_SUMS[base]
    if base in ("index_put", "_index_put_impl", "put"):
        if not kwargs.get("accumulate", args[3] if len(args) > 3 else False):
            return None
    elif base in ("scatter", "scatter_reduce"):
        reduce = kwargs.get("reduce", args[4] if len(args) > 4 else None)
        if reduce not in (("add",) if base == "scatter" else ("sum", "mean")):
            return None
    where = keyword if keyword in kwargs else position
    source = kwargs.get(where) if isinstance(where, str) else args[where] if len(args) > where else None
    if not isinstance(source, torch.Tensor) or not source.is_floating_point() or not isinstance(args[0], torch.Tensor):
        return None
    return where


def _scatter_magnitudes(name: str, args: tuple, kwargs: dict, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_magnitudes` of a scatter or index sum: per output element, its own count n of terms
    (the source's that point at it, and the output's initial value where it is added and not
    zero), their sum S and Σt², added in sequence: σ/u = √(n/3)·√(S²/3 + Σt²/2), and the
    bound of a sequential sum, (n − 1)·Σ|t| (Higham, (4.4)): equal terms added one after
    another round alike, and their error grows as n, not √n (an embedding's gradient of a
    constant upstream gradient: 11σ of the walk, the real kernel, bit for bit the sequential
    float32 sum). A mean's (`scatter_reduce`) divided by its count. Each figure is the op
    itself, called on the terms' squares, magnitudes and ones into zeros."""
    base = name.rstrip("_")
    where = _scatter_source(name, args, kwargs)
    source = kwargs[where] if isinstance(where, str) else args[where]
    if base == "index_add":
        source = source * kwargs.get("alpha", 1)
    position, _, functional = SCATTER_SUMS[base]
    rest = list(args[:position + 1])  # the arguments up to the source; the rest are keywords below
    plain = {k: v for k, v in kwargs.items() if k not in ("alpha", "unsafe")}
    includes_self = base != "scatter_reduce" or bool(kwargs.get("include_self", True))
    if base == "scatter_reduce":
        plain.update(reduce="sum", include_self=False)
    elif base in ("index_put", "_index_put_impl"):
        plain["accumulate"] = True

    def added(terms: torch.Tensor) -> torch.Tensor:
        call_args, call_kwargs = list(rest), dict(plain)
        call_args[0] = torch.zeros_like(args[0])
        if isinstance(where, str):
            call_kwargs[where] = terms
        else:
            call_args[where] = terms
        return functional(*call_args, **call_kwargs)

    own = args[0] if includes_self else torch.zeros_like(args[0])
    count = added(torch.ones_like(source))
    n = count + (own != 0)
    s = own + added(source)
    squares = own * own + added(source * source)
    absolute = own.abs() + added(source.abs())
    walk, bound = _sequential_figures(n, s, squares, absolute)
    reduce = kwargs.get("reduce", args[4] if len(args) > 4 else None)
    if base == "scatter_reduce" and reduce == "mean":
        divided_by = (count + includes_self).clamp(min=1)
        walk, bound = walk / divided_by, bound / divided_by
    return walk.reshape(out.shape), bound.reshape(out.shape)


def _bag_magnitudes(func: Any, args: tuple, kwargs: dict, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_magnitudes` of an embedding bag's sums, as `_scatter_magnitudes`'s: per output
    element, its bag's count n of terms (its indices but the padding index's), their sum S,
    Σt² and Σ|t|, t a weight row's element times its per-sample weight, added in sequence
    (ATen's CPU kernel: bit for bit a sequential float32 sum). Each figure is the op itself in
    sum mode, on the rows' ones, squares and magnitudes; a mean's divided by its count; a max
    adds nothing."""
    bound = dict(zip([a.name for a in func._schema.arguments][:len(args)], args, strict=True))
    bound.update(kwargs)
    mode = int(bound.get("mode", 0))
    if mode == 2:
        return _no_accumulation(out)
    weight, scale = bound["weight"], bound.get("per_sample_weights")

    def added(rows: torch.Tensor, per_sample: torch.Tensor | None) -> torch.Tensor:
        return func(**dict(bound, weight=rows, mode=0, per_sample_weights=per_sample))[0]

    n = added(torch.ones_like(weight), None)
    s = added(weight, scale)
    squares = added(weight * weight, None if scale is None else scale * scale)
    absolute = added(weight.abs(), None if scale is None else scale.abs())
    walk, worst = _sequential_figures(n, s, squares, absolute)
    if mode == 1:
        walk, worst = walk / n.clamp(min=1), worst / n.clamp(min=1)
    return walk.reshape(out.shape), worst.reshape(out.shape)


def _sequential_figures(n: torch.Tensor, s: torch.Tensor, squares: torch.Tensor,
                        absolute: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(σ/u, bound/u) of sums of a count n of terms per element, added in sequence: the walk
    √(n/3)·√(S²/3 + Σt²/2) and the sequential bound (n − 1)·Σ|t|; 0 where one term adds nothing."""
    adds = n > 1
    return (torch.where(adds, (n / 3).sqrt() * (s.square() / 3 + squares / 2).sqrt(), 0.0),
            torch.where(adds, (n - 1) * absolute, 0.0))


def _no_accumulation(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_magnitudes` of a call that adds nothing: a zero walk and a zero bound."""
    zero = torch.zeros(out.shape, dtype=torch.float64)
    return zero, zero


def _directed_pairwise_sum(name: str, args: tuple, kwargs: dict, acc: torch.dtype,
                           direction: int | torch.Tensor, stacked: bool = False) -> torch.Tensor | None:
    """The sum with every partial sum of a pairwise order rounded up (or down) in the
    accumulation dtype: the envelope of a biased accumulation, as the kernel's tree adds.
    `stacked`: `x` holds one sample per first index, `direction` one sign per sample."""
    x = args[0]
    if not x.is_floating_point() or x.numel() == 0:
        return None
    if isinstance(direction, torch.Tensor) and bool((direction == 0).any()):
        # A stack's random samples take their walk, not this sum (`RoundingMode._mixed`): only
        # the directed rows are added (a 2M-term sum: 2 rows instead of 11), their results in
        # their places and zeros elsewhere.
        rows = direction.nonzero().flatten()
        part = _directed_pairwise_sum(name, (x[rows],) + tuple(args[1:]), kwargs, acc, direction[rows], True) \
            if len(rows) else None
        return None if part is None else part.new_zeros((len(direction),) + part.shape[1:]).index_copy_(0, rows, part)
    dims, keepdim = reduced_dims(name, args, kwargs, x[0] if stacked else x)
    # A 0-dim value's dimension 0 is the value itself: one term, nothing reduced.
    dims = [d + stacked for d in dims if d < x.dim() - stacked]
    kept = [d for d in range(x.dim()) if d not in dims]
    terms = torch.nan_to_num(x, nan=0.0) if name == "nansum" else x
    terms = terms.permute(kept + dims).reshape([x.shape[d] for d in kept] + [-1])
    n = terms.shape[-1]
    signs = direction.view((-1,) + (1,) * (terms.dim() - 1)) if isinstance(direction, torch.Tensor) else direction
    # Up to NUMPY_ELEMENTS terms, the levels are NumPy arrays (a mean of 16 terms: five
    # roundings, each a few NumPy calls instead of a dozen torch ops); the same additions, and
    # the same rounding as `round_to`'s, which takes a level that leaves the format's normal
    # range.
    small = terms.numel() <= NUMPY_ELEMENTS
    if small:
        terms = terms.contiguous().numpy()

    def rounded(x: Any, sign: int | torch.Tensor) -> Any:
        if not small:
            return round_to(x, acc, sign, None)
        out = _round_array(x, *FORMATS[acc], sign.numpy() if isinstance(sign, torch.Tensor) else sign, None)
        return out if out is not None else round_to(torch.from_numpy(np.asarray(x)), acc, sign, None).numpy()

    carried = []  # the last term of each odd-length level: added to the tree of the others at the end
    while terms.shape[-1] > 1:
        if terms.shape[-1] % 2:
            carried.append(terms[..., -1:])
            terms = terms[..., :-1]
        terms = rounded(terms[..., 0::2] + terms[..., 1::2], signs)
    for last in carried:
        terms = rounded(terms + last, signs)
    total = terms[..., 0]
    if name == "mean":
        total = rounded(total / n, signs[..., 0] if isinstance(signs, torch.Tensor) else signs)
    if small:
        total = torch.from_numpy(np.asarray(total))
    if keepdim:
        for d in sorted(dims):
            total = total.unsqueeze(d)
    return total


# Reduction kernels (ATen's CPU cascade sum, CUDA's per-thread runs then a tree) add runs of
# at most this many terms in order, then combine the runs pairwise.
SEQUENTIAL_RUN = 256


def sequential_walk(n: int, s: Any, squares: Any) -> Any:
    """σ/u of n terms added one after another (sum S, Σt² `squares`): √(n/3)·√(S²/3 + Σt²/2)."""
    return math.sqrt(n / 3) * (s.square() / 3 + squares / 2).sqrt()


# A fused kernel (softmax's, layer norm's, a norm's) sums in one vector register of this many
# lanes, each lane adding its n/L terms in order: the fewest lanes any CPU capability has
# (AVX2's 8 floats; AVX-512's 16 err less), so the walk errs wide.
LANES = 8


def lane_stagnation(name: str, args: tuple, kwargs: dict, out: torch.Tensor) -> torch.Tensor | None:
    """Where round-to-nearest lands, per output element, when a fused kernel adds a sum's or
    mean's terms in LANES float32 lanes, each in order (`vec::reduce_all`), then the lanes
    together: less the exact sum of the same float32 terms. A lane's partial sum outgrows
    the terms still to come, and each one below half its spacing is dropped: a bias, not the
    zero-mean walk (a softmax's denominator over 50,000 exponentials of logits of standard
    deviation 3 comes out 27 u low in 8 lanes, 11 u in 16, where the walk's σ is 10 u). More
    lanes, or a tree, drop less: a kernel lands between this and the exact sum. None where no
    lane adds twice, a term is not finite, or nothing is dropped."""
    x = args[0]
    if name not in ("sum", "mean") or not x.is_floating_point() or x.is_complex():
        return None
    dims, _ = reduced_dims(name, args, kwargs, x)
    n = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    if n < 2 * LANES:
        return None
    kept = [d for d in range(x.dim()) if d not in dims]
    terms = x.detach().permute(kept + list(dims)).reshape(-1, n).numpy().astype(np.float32)
    if not np.isfinite(terms).all():
        return None
    whole = n // LANES * LANES
    with np.errstate(over="ignore"):
        lanes = np.add.reduce(terms[:, :whole].reshape(len(terms), -1, LANES), axis=1, dtype=np.float32)
        for j in range(n - whole):  # the last, partial vector: into the first lanes
            lanes[:, j] += terms[:, whole + j]
        while lanes.shape[1] > 1:
            lanes = lanes[:, 0::2] + lanes[:, 1::2]
    bias = lanes[:, 0].astype(np.float64) - terms.astype(np.float64).sum(axis=1)
    if name == "mean":
        bias /= n
    if not np.isfinite(bias).all() or not bias.any():
        return None
    return torch.from_numpy(bias).reshape(out.shape)


def lane_walk(n: int, s: torch.Tensor, squares: torch.Tensor) -> torch.Tensor:
    """σ/u of a sum of n terms added in LANES sequential lanes of n/L terms each, then
    combined: L walks of n/L roundings over partial sums growing to S/L,
    √(n/3L)·√(S²/3L + Σt²/2)."""
    if n <= LANES:
        return sequential_walk(n, s, squares)
    return math.sqrt(n / (3 * LANES)) * (s.square() / (3 * LANES) + squares / 2).sqrt()


def blocked_walk(n: int, s: torch.Tensor, squares: torch.Tensor) -> torch.Tensor:
    """σ/u of a sum of n terms t (sum S, Σt² `squares`) added in sequential runs of L terms
    combined pairwise: per rounding u²/3 times the partial sum², summed over the order,
    ≈ (S²·(2 + L²/3n) + Σt²·(L/2 + log2(n/L)))/3; a plain sequential walk up to L terms."""
    if n <= SEQUENTIAL_RUN:
        return sequential_walk(n, s, squares)
    run = SEQUENTIAL_RUN
    return ((s.square() * (2 + run * run / (3 * n)) + squares * (run / 2 + math.log2(n / run))) / 3).sqrt()


def _same_contraction(name: str, func: Any, args: tuple, kwargs: dict, f: Any) -> torch.Tensor:
    """The same contraction over f(terms): f applied to both factors, bias left out."""
    if name in ("mm", "bmm", "mv", "dot", "vdot", "matmul"):
        return func(f(args[0]), f(args[1]))
    if name in ("addmm", "baddbmm", "addbmm", "addmv"):
        alpha = kwargs.get("alpha", 1)
        inner = {"addmm": torch.mm, "baddbmm": torch.bmm, "addmv": torch.mv,
                 "addbmm": lambda a, b: torch.bmm(a, b).sum(0)}[name]
        out = inner(f(args[1]), f(args[2]))
        return out * (f(torch.tensor(float(alpha), dtype=torch.float64)))
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    rest = list(args)
    rest[0], rest[1], rest[2] = f(args[0]), f(args[1]), None
    return func(*rest, **kwargs)


def _contraction_length(name: str, args: tuple) -> int:
    if name in ("mm", "bmm", "mv", "matmul"):
        return int(args[0].shape[-1])
    if name in ("dot", "vdot"):
        return int(args[0].numel())
    if name in ("addmm", "baddbmm", "addmv"):
        return int(args[1].shape[-1])
    if name == "addbmm":
        return int(args[1].shape[-1] * args[1].shape[0])
    weight = args[1]
    transposed = bool(args[6]) if len(args) > 6 else False
    per_group = weight.shape[0] if transposed else weight.shape[1]
    return int(per_group * math.prod(weight.shape[2:]))


_WRITTEN: dict[Any, list[int]] = {}


def _pinv_cutoff_at(dtype: torch.dtype, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`linalg_pinv`'s arguments with its default cutoff made explicit at the arm's precision:
    given neither `atol` nor `rtol`, the kernel drops the singular values below
    eps·max(m, n)·σ₁ of its input's dtype, which the float64 replay would take at float64's eps
    (keeping, and inverting, what the arm drops). An explicit cutoff is the same number in both."""
    schema = ("atol", "rtol", "hermitian")
    given = dict(zip(schema, args[1:], strict=False)) | kwargs
    if given.get("atol") is not None or given.get("rtol") is not None or not isinstance(args[0], torch.Tensor):
        return args, kwargs
    part = COMPLEX_PARTS.get(dtype, dtype)
    eps = torch.finfo(part).eps if isinstance(part, torch.dtype) and part.is_floating_point else 2.0 ** -52
    rtol = torch.tensor(eps * max(args[0].shape[-2], args[0].shape[-1], 1), dtype=torch.float64)
    return (args[0],), {"atol": None, "rtol": rtol, "hermitian": bool(given.get("hermitian", False))}


def _written(op: Any) -> list[int]:
    found = _WRITTEN.get(op)
    if found is None:
        found = _WRITTEN[op] = [i for i, a in enumerate(op._schema.arguments)
                                if a.alias_info is not None and a.alias_info.is_write]
    return found


STACKED = "_samples_stacked"  # the attribute that marks a tensor as stacked samples (`RoundingMode.samples`)


def _out_of_place(func: Any) -> Any:
    """The op itself, or for an in-place op (one that writes an input) its out-of-place
    overload: `addcmul_.default` -> `addcmul.default`."""
    if not _written(func):
        return func
    packet = getattr(torch.ops.aten, func.overloadpacket.__name__.rstrip("_"))
    return getattr(packet, func._overloadname)


_FUNCTIONAL: dict[Any, Any] = {}


def _functional(func: Any, kwargs: dict) -> tuple[Any, dict]:
    """An out= overload's functional twin and its keyword arguments without the outputs
    (`mm.out(a, b, out=c)` -> `mm.default(a, b)`), anything else as it is: `_magnitudes` calls
    the op again on the terms' squares and magnitudes, which have no buffer to write to (an
    inductor backward's `extern_kernels.mm(..., out=buf)`, a weight's gradient)."""
    outs = {a.name for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write}
    if not outs:
        return func, kwargs
    twin = _FUNCTIONAL.get(func)
    if twin is None:
        names = [a.name for a in func._schema.arguments if a.name not in outs]
        packet = func.overloadpacket
        twin = _FUNCTIONAL[func] = next(
            (op for op in (getattr(packet, o) for o in packet.overloads())
             if [a.name for a in op._schema.arguments] == names and not _written(op)), func)
    return twin, {k: v for k, v in kwargs.items() if k not in outs}


def _laid_out_as(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`out` (of `like`'s shape) with `like`'s strides, where `like` is dense and `out` is laid
    out otherwise."""
    if out.stride() == like.stride() or out.shape != like.shape:
        return out
    laid = torch.empty_like(like, dtype=out.dtype)  # `like`'s strides where it is dense, else contiguous
    return out if laid.stride() == out.stride() else laid.copy_(out)


def _flushed_to_zero(t: torch.Tensor, tiny: float) -> torch.Tensor:
    """`t` with its values below the smallest normal value `tiny` made zeros of their sign, as
    a CPU with flush-to-zero on makes a result there."""
    return torch.where(t.abs() < tiny, t * 0.0, t)


def _is_stacked(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, STACKED, False)


# Views that need a layout the arm's value had: a replay's value in another layout is copied.
VIEWS_OF_CONTIGUOUS = {torch.ops.aten.view.default}


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a replay's value, with its arm dtype and stacking kept."""
    out = t.contiguous()
    out._arm_dtype = getattr(t, "_arm_dtype", t.dtype)
    return _mark_stacked(out) if _is_stacked(t) else out


def _mark_stacked(t: torch.Tensor) -> torch.Tensor:
    setattr(t, STACKED, True)
    return t


def _sample_of(a: Any, k: int) -> Any:
    """Sample `k`'s slice of a stacked tensor (of its arm dtype), anything else as it is."""
    if not _is_stacked(a):
        return a
    out = a[k]
    out._arm_dtype = getattr(a, "_arm_dtype", a.dtype)
    return out


def _scatter_from_offset_zero(args: tuple) -> tuple:
    """`as_strided_scatter`'s arguments with its input at storage offset 0: the op places its
    storage offset relative to where its input's storage starts, and the arm's input was its
    base tensor (offset 0). A stacked replay's sample is a slice of the stack, at offset k·n,
    which sent every sample's write but the first's nowhere (`total = terms[0]; total += t` in
    a loop updated `terms[0]` in one replay of eleven: a float64 sum's spread was ±0.39 and
    hid two different values). A copy of the input is at offset 0 again; the stack runs this
    op one sample at a time (it has no batching rule)."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or _is_stacked(x) or x.storage_offset() == 0:
        return args
    copy = x.clone()
    copy._arm_dtype = getattr(x, "_arm_dtype", x.dtype)
    return (copy,) + tuple(args[1:])


def _sample_args(args: tuple, k: int) -> tuple:
    return _map(functools.partial(_sample_of, k=k), args)


def _sample_kwargs(kwargs: dict, k: int) -> dict:
    return {name: _map(functools.partial(_sample_of, k=k), v) if isinstance(v, (list, tuple)) else _sample_of(v, k)
            for name, v in kwargs.items()}


def _broadcast_stacked(func: Any, args: tuple, kwargs: dict, flat: list) -> torch.Tensor:
    """A pointwise op of float64 tensors on stacked samples by broadcasting alone: a stacked
    argument of fewer dimensions than the result gets ones after its sample dimension, so its
    own dimensions line up from the right with the others' (an in-place op's target has the
    result's shape already)."""
    rank = max(a.dim() - _is_stacked(a) for a in flat if isinstance(a, torch.Tensor))

    def aligned(a: Any) -> Any:
        if not _is_stacked(a) or a.dim() == rank + 1:
            return a
        return a.reshape(a.shape[:1] + (1,) * (rank + 1 - a.dim()) + a.shape[1:])

    out = func(*_map(aligned, args), **{k: _map(aligned, v) if isinstance(v, (list, tuple)) else aligned(v)
                                        for k, v in kwargs.items()})
    return _mark_stacked(out)


def _sample_dim(d: int, rank: int) -> int:
    """Dimension `d` of one sample of `rank` dimensions, in the stack (past its first)."""
    if not -rank <= d < rank:
        raise IndexError(f"dimension {d} of a sample of {rank}")
    return d % rank + 1


# View ops whose batching rule is their dimension arguments shifted past the stack's first
# dimension: a stack's selections and transposes (a training loop's batches and weights:
# nine hundred a replay) without a vmap level, which costs ten times the view itself.
_STACKED_VIEWS: dict[Any, Any] = {
    torch.ops.aten.select.int: lambda x, rank, dim, index: torch.ops.aten.select.int(x, _sample_dim(dim, rank), index),
    torch.ops.aten.t.default: lambda x, rank: (torch.ops.aten.transpose.int(x, 1, 2) if rank == 2
                                               else torch.ops.aten.alias.default(x)),
    torch.ops.aten.transpose.int: lambda x, rank, d0, d1: torch.ops.aten.transpose.int(
        x, _sample_dim(d0, rank), _sample_dim(d1, rank)),
    torch.ops.aten.unsqueeze.default: lambda x, rank, dim: torch.ops.aten.unsqueeze.default(
        x, dim + 1 if dim >= 0 else dim),
    torch.ops.aten.permute.default: lambda x, rank, dims: torch.ops.aten.permute.default(
        x, [0] + [_sample_dim(d, rank) for d in dims]),
    torch.ops.aten.view.default: lambda x, rank, size: torch.ops.aten.view.default(x, [x.shape[0], *size]),
    torch.ops.aten._unsafe_view.default: lambda x, rank, size: torch.ops.aten._unsafe_view.default(
        x, [x.shape[0], *size]),
}


# Ops joining a list of tensors along a dimension argument: on stacked tensors, that dimension
# shifted past the stack's first (a data loader's batch: `stack` of its samples, every step).
_STACKED_JOINS = {torch.ops.aten.stack.default: 1, torch.ops.aten.cat.default: 0}


def _stacked_view(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A view op (`_STACKED_VIEWS`) of a stacked tensor, or a join (`_STACKED_JOINS`) of
    stacked tensors of one rank, on every sample at once; None for any other call (functorch's
    vmap then), and where the op does not apply as it is (a dimension a sample does not have,
    a view the stack's strides do not allow)."""
    added = _STACKED_JOINS.get(func)
    if added is not None:
        tensors = args[0] if args and isinstance(args[0], (list, tuple)) else None
        if kwargs or not tensors or len(args) > 2 or not all(_is_stacked(t) for t in tensors) \
                or len({t.dim() for t in tensors}) != 1:
            return None
        dim = args[1] if len(args) > 1 else 0
        try:
            return _mark_stacked(func(tensors, _sample_dim(dim, tensors[0].dim() - 1 + added)))
        except (RuntimeError, IndexError, TypeError):
            return None
    view = _STACKED_VIEWS.get(func)
    if view is None or kwargs or not args or not _is_stacked(args[0]) or any(_is_stacked(a) for a in args[1:]):
        return None
    try:
        return _mark_stacked(view(args[0], args[0].dim() - 1, *args[1:]))
    except (RuntimeError, IndexError, TypeError):
        return None


def _vmapped(func: Any, args: tuple, kwargs: dict, samples: int) -> tuple[bool, Any]:
    """(True, `func` on the stacked samples through one vmap level, its results stacked), or
    (False, None) where functorch has no batching rule for the call (out=, .item())."""
    level = _vmap_increment_nesting(samples, "error")
    try:
        def wrap(a: Any) -> Any:
            return _add_batch_dim(a, 0, level) if _is_stacked(a) else a

        out = func(*_map(wrap, args), **{k: _map(wrap, v) if isinstance(v, (list, tuple)) else wrap(v)
                                         for k, v in kwargs.items()})
        out = tree_map(lambda t: _mark_stacked(_remove_batch_dim(t, level, samples, 0))
                       if isinstance(t, torch.Tensor) else t, out)
    except Exception:  # noqa: BLE001 - no batching rule: the caller runs one sample at a time
        return False, None
    finally:
        _vmap_decrement_nesting()
    return True, out


def _stack_outputs(out: Any, samples: int) -> Any:
    """Results computed once (no argument stacked), as the same value for every sample."""
    def stacked(t: torch.Tensor) -> torch.Tensor:
        return _mark_stacked(t.unsqueeze(0).expand(samples, *t.shape))

    return tree_map(lambda t: stacked(t) if isinstance(t, torch.Tensor) else t, out)


class NotStackable(RuntimeError):
    """The samples of a stacked replay took different paths (a value read into Python)."""


def _stack_samples(outs: list[Any]) -> Any:
    """Per-sample results as one stacked result (their arm dtypes kept)."""
    flats = [tree_flatten(o) for o in outs]
    spec = flats[0][1]
    stacked = []
    for leaves in zip(*(f[0] for f in flats), strict=True):
        first = leaves[0]
        if isinstance(first, torch.Tensor):
            t = _mark_stacked(torch.stack(leaves))
            t._arm_dtype = getattr(first, "_arm_dtype", first.dtype)
            stacked.append(t)
        elif all(x == first for x in leaves[1:]):
            stacked.append(first)
        else:
            raise NotStackable(f"the samples differ in a Python value ({type(first).__name__})")
    return tree_unflatten(stacked, spec)


def _flat(args: tuple) -> list:
    """Arguments with one level of lists opened (aten ops take tensor lists, never deeper)."""
    out = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


@functools.cache
def _is_pointwise(func: Any) -> bool:
    return torch.Tag.pointwise in func.tags


def _has_float(args: tuple, kwargs: dict) -> bool:
    """Whether a Python float is among the arguments (in a list or tuple too)."""
    return any(type(a) is float or type(a) in (list, tuple) and any(type(x) is float for x in a)
               for a in itertools.chain(args, kwargs.values()))


def _reads_scalars_at_float32(in_vd: list) -> bool:
    """Whether a pointwise op on tensors of these arm dtypes reads its Python float operands
    at float32: TensorIterator casts a number to the tensors' float32, and the float16 and
    bfloat16 kernels read it at their opmath float32 (`original_scalar_value<opmath_t>`)."""
    real = [d for d in in_vd if isinstance(d, torch.dtype) and d.is_floating_point]
    return bool(real) and len(real) == len(in_vd) and all(UNIT_ROUNDOFF.get(d, 0.0) >= UNIT_ROUNDOFF[torch.float32]
                                                          for d in real)


def _scalars_at_float32(value: Any) -> Any:
    """Python floats (in a list or tuple too) as float32 reads them: `x * 1e-3` multiplies by
    0.0010000000475, and a float32 kernel's product is a neighbour of that, not of x·10⁻³
    (a new user's `randn(...) * 1e-3` was "outside" where no rounding moved it)."""
    if type(value) is float:
        return float(np.float32(value)) if math.isfinite(value) and abs(value) <= FLOAT32_MAX else value
    if isinstance(value, (list, tuple)) and any(type(v) is float for v in value):
        return type(value)(_scalars_at_float32(v) for v in value)
    return value


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _widened(args: list | tuple) -> list | tuple:
    """Arguments (and the lists among them) with floating tensors in float64 (or complex128)
    on the CPU and dtypes widened alike: the replay's stand-ins for the arm's."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a if a.dtype is torch.float64 and a.device.type == "cpu" else widen(a))
        elif isinstance(a, (list, tuple)):
            out.append(_widened(a))
        else:
            out.append(widen_dtype(a) if isinstance(a, torch.dtype) else a)
    return type(args)(out)


def _map(fn: Any, args: Any) -> Any:
    return type(args)(_map(fn, a) if isinstance(a, (list, tuple)) else fn(a) for a in args)


def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.overloadpacket.__name__}"
    return getattr(target, "__name__", str(target))


# Ops whose CUDA kernels add or write in an order the hardware picks (atomics, scattered
# writes with repeated indices): the ops `torch.use_deterministic_algorithms` makes
# deterministic or refuses. A value computed through one may differ from run to run on a GPU
# by more than rounding, and the rounding simulation does not model that.
CUDA_ORDER_DEPENDENT = {
    "index_add", "index_put", "_index_put_impl", "_unsafe_index_put", "put", "scatter", "scatter_add",
    "scatter_reduce", "index_reduce", "index_copy", "embedding_bag", "_embedding_bag", "_embedding_bag_backward",
    "embedding_dense_backward", "cumsum", "histc", "bincount", "kthvalue", "median", "nll_loss2d_forward",
    "avg_pool3d_backward", "adaptive_avg_pool2d_backward", "adaptive_avg_pool3d_backward",
    "max_pool3d_with_indices_backward", "max_unpool2d", "max_unpool3d", "grid_sampler_2d_backward",
    "grid_sampler_3d_backward", "fractional_max_pool2d_backward", "fractional_max_pool3d_backward",
    "reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
    "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward",
    "upsample_linear1d_backward", "upsample_bilinear2d_backward", "upsample_bicubic2d_backward",
    "upsample_trilinear3d_backward", "_ctc_loss_backward",
}


def _order_dependent(node: fx.Node, by_name: dict[str, fx.Node]) -> list[str]:
    """The ops of `node`'s computation whose CUDA kernels are order-dependent."""
    ops = {_op_name(by_name[name].target).removeprefix("aten.").rstrip("_") for name in _cone_names(node)
           if by_name[name].op == "call_function"}
    return sorted(f"aten.{op}" for op in ops & CUDA_ORDER_DEPENDENT)[:16]


def spread_bytes(ref: torch.Tensor, dtype: torch.dtype = torch.float64) -> int:
    """The bytes a value's spread takes in values.npz (`_spread_arrays`), per element (complex
    values as their real pairs): the mean in float64, sigma and sd in float32, the directed
    replays in float32 where the value is at most float32 (they are its values, exactly) and
    in float64 otherwise, and one byte of nonfinite bits."""
    elements = ref.numel() * (2 if ref.is_complex() else 1)
    directed = 4 if _held_in_float32(dtype) else 8
    return elements * (8 + 2 * 4 + 2 * directed + 1)


def _held_in_float32(dtype: torch.dtype) -> bool:
    """A value of `dtype` (its real parts, for a complex one) is exactly a float32 value."""
    part = COMPLEX_PARTS.get(dtype, dtype)
    return part in (torch.float32, torch.float16, torch.bfloat16)


def _spread_arrays(spread: NodeSpread, dtype: torch.dtype) -> dict[str, np.ndarray]:
    """A judged value's spread as values.npz holds it: sigma and sd need no more than float32's
    digits (a spread's width to a few digits), and the directed replays, rounded to the value's
    dtype as the arm stores it, are exact in float32 where that dtype is; the mean keeps float64,
    to a fraction of an ulp of the value (a million-element float32 value: 25 MiB, not 41)."""
    narrow = _held_in_float32(dtype)
    centre = spread.centre
    arrays = {"sig": spread.sigma.float(), "up": spread.up.float() if narrow else spread.up,
              "dn": spread.down.float() if narrow else spread.down, "mu": spread.mean, "sd": spread.sd.float(),
              "nf": spread.nonfinite, "ct": None if centre is None else centre.float() if narrow else centre}
    return {key: arrays[key].numpy() for key in SPREAD_ARRAYS if arrays[key] is not None}


# Elements above which a value observed only at exit is not simulated beside others the
# script reads (`simulate_observables`).
EXIT_ONLY_ELEMENTS = 1 << 16


def simulate_observables(graph: fx.Graph, records: list[dict[str, Any]], references: dict[str, Any],
                         values: dict[str, Any], job: dict[str, Any], device: str,
                         flags: dict[str, Any], thaw: bool = True) -> dict[str, Any]:
    """Simulate the rounding of every observed value with a float64 reference, write each
    one's spread into `values` (``sig``/``up``/``dn``/``mu``/``sd``/``nf`` + index) and its
    summary into the record's ``rounding`` (``spread_of``: the index whose arrays a record of
    the same value shares); returns the run's summary. `thaw`: as `simulate_rounding`'s."""
    settings = job.get("rounding") or {}
    # `model`: the values are judged as another device would round them (a reporter's GPU,
    # triage/reported/), with the script's own numerics settings as it left them.
    model = settings.get("model")
    cuda = (model or device).startswith("cuda")
    kernels = kernel_table(model or ("cuda" if cuda else "cpu"))
    options = SimulationOptions(
        samples=int(settings.get("samples", 29)), seed=int(job.get("seed", 0)),
        budget_s=float(settings.get("budget_s", 60.0)),
        matmul_tf32=cuda and bool(flags.get("cuda_matmul_allow_tf32")),
        conv_tf32=cuda and bool(flags.get("cudnn_allow_tf32")),
        reduced_precision=cuda and bool(flags.get("allow_fp16_reduced_precision_reduction")),
        memory_bytes=int(settings.get("memory_bytes", 512 << 20)),
        min_samples=min(9, int(settings.get("samples", 29))),
        kernels=kernels, any_order=cuda, half_accumulation=cuda,
        threads=int(settings["threads"]) if settings.get("threads") else None)
    wanted: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    budget = int(settings.get("value_bytes", 64 << 20))
    # The spread arrays of each record come out of `budget`, in record order (below): a value
    # whose arrays would not fit is not simulated at all, since its K samples and their
    # statistics (a 4M-element tensor observed at exit: seconds) would be thrown away.
    # A value observed several times (a call's output, then a claim's operand, then at exit) is
    # one node: simulated once, its spread counted and kept once, for all its records.
    too_large: dict[int, str] = {}  # record index -> why its value is not simulated
    # A large value seen only at exit, where the script reads others (a 2M-element input left
    # in a global beside the two means it prints), is not simulated: its K samples, kept and
    # scored, cost more than the rest (4 of 7 seconds), and being observed it kept its chain's
    # reductions from being drawn whole. Where nothing else is observed, it is.
    read = {r["node"] for r in records if r["kind"] != "final" and r["node"]}
    for r in records:
        ref = references.get(r["node"]) if r["node"] else None
        fp = r.get("fingerprint") or {}
        if isinstance(ref, torch.Tensor) and f"{OBSERVED}{r['index']}" in values and list(ref.shape) == fp.get("shape"):
            if r["node"] in wanted:
                continue
            if read and r["node"] not in read and ref.numel() > EXIT_ONLY_ELEMENTS:
                too_large[r["index"]] = "a value seen only at exit, too large to simulate beside those the script reads"
                continue
            size = spread_bytes(ref, getattr(torch, fp.get("dtype", "float64"), torch.float64))
            if size > budget:
                too_large[r["index"]] = "the spread is too large to keep"
                continue
            budget -= size
            wanted[r["node"]] = ref
            dtypes[r["node"]] = getattr(torch, fp["dtype"], torch.float32)
    # Sampling stops early once the arm's own values are certainly inside; under another
    # device's model the values judged are a reporter's, unknown here: no early stop.
    arm_values = {} if model else {r["node"]: torch.from_numpy(values[f"{OBSERVED}{r['index']}"]) for r in records
                                   if r["node"] in wanted and f"{OBSERVED}{r['index']}" in values}
    sim = simulate_rounding(graph, wanted, options, dtypes, arm_values, thaw=thaw)
    by_name = {n.name: n for n in graph.nodes}
    budget = int(settings.get("value_bytes", 64 << 20))
    kept: dict[str, int] = {}  # node → the record whose index its spread arrays are kept under
    for r in records:
        if r["index"] in too_large:
            r["rounding"] = {"status": "not-judged", "reason": too_large[r["index"]], "samples": 0,
                             "sample_stats": [], "flips": [], "cancellations": [], "precision": None,
                             "unmeasured": [], "order_dependent": []}
            continue
        spread = sim.spreads.get(r["node"]) if r["node"] else None
        if spread is None:
            r["rounding"] = None
            continue
        r["rounding"] = {"status": spread.status, "reason": spread.reason, "samples": spread.samples,
                         "sample_stats": spread.sample_stats, "sample_unmoved": spread.sample_unmoved,
                         "flips": spread.flips,
                         "cancellations": spread.cancellations, "overflow": spread.overflow,
                         "precision": spread.precision,
                         "unmeasured": spread.unmeasured,
                         "order_dependent": _order_dependent(by_name[r["node"]], by_name) if cuda and r["node"] in by_name
                         else []}
        if spread.status != "judged":
            continue
        if r["node"] in kept:
            r["rounding"]["spread_of"] = kept[r["node"]]
            continue
        arrays = _spread_arrays(spread, dtypes.get(r["node"], torch.float64))
        size = sum(a.nbytes for a in arrays.values())
        if size > budget:
            r["rounding"].update(status="not-judged", reason="the spread is too large to keep")
            continue
        budget -= size
        kept[r["node"]] = r["index"]
        for key, a in arrays.items():
            values[f"{key}{r['index']}"] = a
    return {"seconds": round(sim.seconds, 3), "samples": sim.samples, "note": sim.note,
            "kernels": options.kernels.source, "reductions_drawn_whole": len(sim.drawn_whole)}
