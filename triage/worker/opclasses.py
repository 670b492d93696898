"""Op classes both the rounding simulation (`rounding.py`) and the kernel measurement
(`kernel_errors.py`) read: what a dtype's one rounding is, and which ops never round. Their own
module, so that the measurement, which the simulation imports, does not import it back.
"""
from __future__ import annotations

import torch

from triage.worker.reference import EXACT_OPS

UNIT_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
                 torch.bfloat16: 2.0 ** -8}

# Results that are exact whatever the inputs: no rounding at all (views, selection, order).
EXACT = EXACT_OPS | {
    "view", "_unsafe_view", "reshape", "permute", "expand", "t", "transpose", "select", "slice", "unsqueeze",
    "squeeze", "flatten", "unflatten", "alias", "detach", "lift_fresh", "lift_fresh_copy", "contiguous",
    "cat", "stack", "index", "index_select", "gather", "take", "masked_select", "where", "masked_fill",
    "relu", "clamp", "clamp_min", "clamp_max", "hardtanh", "threshold", "max", "min", "amax", "amin",
    "maximum", "minimum", "fmax", "fmin", "floor", "ceil", "round", "trunc", "sign", "sgn", "signbit",
    "copysign", "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "logical_and", "logical_or",
    "logical_not", "logical_xor", "argmax", "argmin", "sort", "topk", "argsort", "kthvalue", "median",
    "nonzero", "split", "split_with_sizes", "chunk", "unbind", "narrow", "repeat", "flip", "roll", "tile",
    "constant_pad_nd", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "scalar_tensor",
    "arange", "empty", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty", "embedding",
    "max_pool2d_with_indices", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool1d_with_indices",
    "max_pool3d_with_indices", "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d", "one_hot", "diagonal", "diag_embed",
    "tril", "triu", "as_strided", "squeeze_copy", "view_copy", "_reshape_alias", "scatter", "index_put",
    "index_put_", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter", "new_empty_strided", "empty_strided", "bitwise_not",
    "expand_copy", "permute_copy", "t_copy", "transpose_copy", "unsqueeze_copy", "clone_", "isclose",
    "any", "all", "count_nonzero", "searchsorted", "bucketize", "unique", "_unique2", "zero_", "zero",
    "frac", "nan_to_num", "positive", "resolve_conj", "resolve_neg", "_conj", "conj", "real", "imag",
    "view_as_real", "view_as_complex", "logical_and_", "masked_fill_", "mode", "cummax", "cummin",
    "complex",  # two real tensors as one complex one
    # Gradients that pass a value through or zero it (relu's, hardtanh's), and autograd's zeros.
    "threshold_backward", "hardtanh_backward", "_new_zeros_with_same_feature_meta",
    # torch's prims that move or make values without arithmetic, which the references' code
    # calls (var_mean's mean is `broadcast_in_dim` of a sum, divided).
    "broadcast_in_dim", "collapse_view", "collapse", "expand_dims", "slice_in_dim", "split_dim", "view_of",
    "rev", "iota", "empty_permuted",
}
