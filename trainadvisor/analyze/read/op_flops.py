"""The FLOPs of one recorded op from its shapes (a trace recorded with record_shapes=True), by
the formulas of `torch.utils.flop_counter` (the ones `compute.flops` counts a profiled step
with): matmuls, convolutions forward and backward, and fused attention forward and backward,
the CPU's flash attention too (which torch's registry leaves out, up to 2.13 at least).
Pure; no torch. An op whose recorded arguments do not give its FLOPs (a convolution of a trace
without "Concrete Inputs", which torch writes since 2.3) has none: never a guess.

Counted where torch's FlopCounterMode counts, at the op it sees below autograd: aten::linear and
aten::matmul are counted at the aten::mm/addmm/bmm they call, aten::conv2d at aten::convolution
(its strides and padding are in the same places for every backend, unlike the cuDNN, MIOpen and
oneDNN ops it calls)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

Dims = list[Any]  # "Input Dims": one shape (a list of ints) per argument, [] for a non-tensor

# torch's dtype names by the profiler's spelling of them ("Input type"); 2021 traces spell some
# without the namespace.
DTYPES = {
    "float": "torch.float32", "Float": "torch.float32", "double": "torch.float64",
    "c10::Half": "torch.float16", "Half": "torch.float16",
    "c10::BFloat16": "torch.bfloat16", "BFloat16": "torch.bfloat16",
    "c10::Float8_e4m3fn": "torch.float8_e4m3fn", "c10::Float8_e5m2": "torch.float8_e5m2",
    "c10::Float8_e4m3fnuz": "torch.float8_e4m3fnuz", "c10::Float8_e5m2fnuz": "torch.float8_e5m2fnuz",
}  # fmt: skip
# The codes a trace's columns keep an op's dtype as (0: not known).
DTYPE_CODES = ("", *sorted(set(DTYPES.values())))


def _matmul(a: Any, b: Any) -> float:
    (m, k), (k2, n) = a, b
    if k != k2:
        raise ValueError("inner dimensions differ")
    return 2.0 * m * k * n


def _batched(a: Any, b: Any) -> float:
    (batch, m, k), (batch2, k2, n) = a, b
    if k != k2 or batch != batch2:
        raise ValueError("batch or inner dimensions differ")
    return 2.0 * batch * m * k * n


def _conv(x: Any, w: Any, out: Any, transposed: bool) -> float:
    """torch's conv_flop_count: 2 x batch x the spatial size it runs over x every weight."""
    spatial = (x if transposed else out)[2:]
    return 2.0 * x[0] * math.prod(spatial) * math.prod(w)


def _ints(value: Any, count: int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    if len(values) == 1:
        values *= count
    if len(values) != count or not all(isinstance(v, int) for v in values):
        raise ValueError(f"{value!r} is not {count} integers")
    return values


def _convolution(dims: Dims, concrete: list[Any]) -> float:
    """aten::convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups): the output's size from the scalar arguments."""
    x, w = dims[0], dims[1]
    if len(x) != len(w) or len(x) < 3:
        raise ValueError("input and weight shapes do not match")
    n = len(x) - 2
    stride, padding, dilation = (_ints(concrete[i], n) for i in (3, 4, 5))
    transposed = concrete[6]
    if not isinstance(transposed, bool):
        raise ValueError("transposed is not recorded")
    if transposed:
        return _conv(x, w, None, True)
    out = [
        (size + 2 * pad - dil * (kernel - 1) - 1) // step + 1
        for size, kernel, step, pad, dil in zip(x[2:], w[2:], stride, padding, dilation)
    ]
    return _conv(x, w, [x[0], w[0], *out], False)


def _convolution_backward(dims: Dims, concrete: list[Any]) -> float:
    """aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
    dilation, transposed, output_padding, groups, output_mask): the input's and the weight's
    gradient, each where output_mask asks for it (torch's conv_backward_flop)."""
    grad_out, x, w = dims[0], dims[1], dims[2]
    transposed, mask = concrete[7], concrete[10]
    if not isinstance(transposed, bool) or not isinstance(mask, list) or len(mask) < 2:
        raise ValueError("transposed or output_mask is not recorded")

    def swapped(shape: Any) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    flops = 0.0
    if mask[0]:
        flops += _conv(grad_out, w, x, not transposed)
    if mask[1]:
        first, second = (grad_out, x) if transposed else (x, grad_out)
        flops += _conv(swapped(first), swapped(second), swapped(w), False)
    return flops


def _attention(q: Any, k: Any, v: Any) -> float:
    """Q K^T and P V (torch's sdpa_flop_count; a causal mask is not subtracted, as there)."""
    batch, heads, queries, qk_dim = q
    keys, v_dim = k[2], v[3]
    return 2.0 * batch * heads * queries * keys * (qk_dim + v_dim)


def _attention_backward(q: Any, k: Any, v: Any) -> float:
    """The scores recomputed (Q K^T), then the gradients of P, V, Q and K: torch's
    sdpa_backward_flop_count as of 2.13 (earlier versions left the recomputation out)."""
    batch, heads, queries, qk_dim = q
    keys, v_dim = k[2], v[3]
    return 2.0 * batch * heads * queries * keys * (3 * qk_dim + 2 * v_dim)


# Fused attention's forward and backward ops, (query, key, value) at the start of their inputs
# (forward) or after the output's gradient (backward).
_ATTENTION = (
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
)  # fmt: skip

FORMULAS: dict[str, Callable[[Dims, list[Any]], float]] = {
    "aten::mm": lambda d, c: _matmul(d[0], d[1]),
    "aten::addmm": lambda d, c: _matmul(d[1], d[2]),
    "aten::bmm": lambda d, c: _batched(d[0], d[1]),
    "aten::baddbmm": lambda d, c: _batched(d[1], d[2]),
    "aten::_scaled_mm": lambda d, c: _matmul(d[0], d[1]),  # fp8, scaled per tensor or row
    "aten::convolution": _convolution,
    "aten::convolution_backward": _convolution_backward,
    **{name: lambda d, c: _attention(d[0], d[1], d[2]) for name in _ATTENTION},
    **{f"{name}_backward": lambda d, c: _attention_backward(d[1], d[2], d[3]) for name in _ATTENTION},
}
# The operand whose dtype is the op's (the bias of addmm comes first).
_DTYPE_ARGUMENT = {"aten::addmm": 1, "aten::baddbmm": 1}


def _concrete(values: Any) -> list[Any]:
    """ "Concrete Inputs" ("[2, 2]", "False", "1", "" for a tensor) as Python values."""
    if not isinstance(values, list):
        return []
    parsed: list[Any] = []
    for value in values:
        text = str(value).replace("True", "true").replace("False", "false")
        try:
            parsed.append(json.loads(text) if text else None)
        except ValueError:
            parsed.append(None)
    return parsed


def op_flops(name: str, dims: Any, concrete: Any) -> float | None:
    """The FLOPs of an op of `FORMULAS` from its recorded "Input Dims" and "Concrete Inputs";
    None where they do not give them."""
    formula = FORMULAS.get(name)
    if formula is None or not isinstance(dims, list):
        return None
    try:
        flops = formula(dims, _concrete(concrete))
    except (TypeError, ValueError, IndexError):
        return None
    return flops if flops >= 0 else None


def op_dtype(name: str, types: Any) -> int:
    """The code (in DTYPE_CODES) of the dtype an op's matrix operands had, 0 where not known."""
    index = _DTYPE_ARGUMENT.get(name, 0)
    if not isinstance(types, list) or len(types) <= index:
        return 0
    dtype = DTYPES.get(str(types[index]))
    return DTYPE_CODES.index(dtype) if dtype else 0
