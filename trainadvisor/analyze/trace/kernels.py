"""What a GPU kernel does, from its name alone: matrix multiplication, convolution, attention or
other work, and whether it runs on Tensor Cores (NVIDIA) / matrix cores (AMD) or on the ordinary
FP32 units. Pure; `tests/integration/test_kernels.py` checks it against real kernel names from public traces.

Names carry the answer in library conventions:
- Tensor Core instructions or tiles: `tensorop`, `wmma`, `hmma`, `gmma`/`wgmma` (Hopper),
  `884`/`1688`/`16816`/`161616` (MMA shapes), `tensor16x8x8`, cuBLASLt's `nvjet` (Hopper and
  Blackwell; an all-fp32 `nvjet_sss` only with `tf32`), CUTLASS 3 (`cutlass3x`), AMD Tensile
  `MI32x32x8` tiles (hipBLASLt `Cijk_*`: the MI tile is the MFMA instruction, whatever the data
  type), `mfma` and Composable Kernel's `xdl`;
- TF32 or reduced-precision operands (`tf32`, `bf16`, `fp16`, `f16`, `half`, `fp8`), which cuBLAS
  and cuDNN run on Tensor Cores on every GPU that has them;
- FP32 on the ordinary units: `ffma` (cuBLAS 12 spells plain FP32 GEMMs on Ampere and Hopper as
  `sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_...`), `simt`, `sgemm`, cuDNN's `scudnn`, an all-f32
  type list (`f32f32_f32f32_f32`), `<float` as a cuDNN engine's first template argument, or a
  Tensile `Cijk_*` kernel of single/double type (`_SB_`, `_S_B_`) with no MI tile (`_MAC_`/`_FMA_`
  vector kernels).
A GEMV (`gemv`, cuBLAS `gemvx`) is memory-bound work on the ordinary units: its bf16 operands are
no Tensor Core evidence, so its precision stays unknown unless a tile says otherwise.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["gemm", "conv", "attention", "other"]
Precision = Literal["tensor_core", "fp32", "unknown"]

# Fused attention: FlashAttention, PyTorch's memory-efficient (cutlass fmha) and cuDNN SDPA
# kernels, TensorRT-LLM/FlashInfer fmha, vLLM and AMD Triton attention, aiter SageAttention.
_ATTENTION = re.compile(
    r"fmha|flash_?(?:fwd|bwd|attn|fprop|bprop)|flashattn|sdpa|attn_(?:fwd|bwd)|mha_(?:fwd|bwd)"
    r"|attention|paged_?attention|xformers|(?:Prefill|Decode)With\w*KVCache|\bsage_fwd",
    re.I,
)
_CONV = re.compile(
    r"conv(?!ert)|scudnn|hcudnn|wgrad|dgrad|fprop|winograd|igemm_(?:fwd|bwd|wrw)|implicit_?gemm"
    r"|ImplicitGemmConvolution|gtcx|naive_conv|MIOpenConv",
    re.I,
)
# `kernel_cutlass_kernel_<module><function>` is how the CuTe DSL names any kernel (FlashInfer's
# RMSNorm among them): there `cutlass` says nothing about matmul. `bmm_` is TensorRT-LLM's
# batched GEMM (`bmm_Bfloat16_..._sm100f` on Blackwell).
_GEMM = re.compile(
    r"gemm|gemv|cutlass(?!_kernel_)|nvjet|xmma|hmma|mfma|matmul|^Cijk_|triton_tem_|_bmm|\bbmm", re.I
)
# Not matrix work although the name says cudnn/cutlass/gemm: embedding tables (fbgemm), batch and
# layer norms, softmax, layout changes, Triton's fused pointwise kernels (`triton_poi_fused_addmm_*`
# is the epilogue, not the matmul), cuDNN's offset and split-K helpers, the split-KV reduction that
# follows paged attention (vLLM `paged_attention_v2_reduce`, ROCm `paged_attention_ll4mi_reduce`)
# and triton_kernels' MoE `_finalize_matmul` (a scatter-sum). `bn_` only as a word: a
# TensorRT-LLM GEMM's `_BN_` flag is no batch norm.
_NOT_MATRIX = re.compile(
    r"fbgemm|\bbn_|batch_?norm|layer_?norm|rms_?norm|softmax|nchwToNhwc|nhwcToNchw|elementwise"
    r"|triton_(?:poi|per|red)_|Offsets|ReduceSplitK|splitKreduce|im2col|scalePackedTensor"
    r"|paged_?attention\w*reduce|finalize_matmul",
    re.I,
)
# `tensorop` as CUTLASS spells it (`cutlass_80_tensorop_`), not MIOpen's `SubTensorOp` copies; MMA
# shapes only as whole numbers (not digits inside `o204820481`); `nvjet` except fp32/fp64 `sss`/
# `ddd` ones, which `tf32` alone marks as Tensor Core work.
_TENSOR_CORE = re.compile(
    r"(?<![a-z])tensorop|wmma|hmma|gmma|(?<!\d)(?:884|1688|16816|161616)(?!\d)|tensor\d+x\d+x\d+"
    r"|nvjet_(?!(?:sm\d+\w?_)?(?:sss|ddd)_)|cutlass3x|_MI\d+x\d+|mfma|_xdl_|tf32",
    re.I,
)
_REDUCED = re.compile(
    r"bf16|bfloat16|fp16|f16|half|__nv_bfloat16|DF16b|\bh884|hgemm|fp8|e4m3|e5m2|mxfp4|int8|i8i8", re.I
)
_FFMA = re.compile(r"ffma|simt", re.I)  # the strongest evidence: named first
# Tensile (rocBLAS/hipBLASLt) names carry the data type after the index letters: `_SB_`/`_S_B_`
# is single precision (`DB` double). Read only after the MI-tile test: with none, a vector kernel.
_TENSILE_FP32 = r"^C[a-z]+_A[A-Za-z]+_B[A-Za-z]+_[SD]_?B?H?_"
_FP32 = re.compile(
    r"sgemm|scudnn|f32f32_f32f32_f32|dgemm|cgemm|zgemm|_f32_|\bfp32|^(?:void )?[\w:]+<float\b|"
    + _TENSILE_FP32,
    re.I,
)
# Matrix-vector kernels: memory-bound, on the ordinary units whatever the operand type.
_GEMV = re.compile(r"gemv", re.I)
# What a kernel's name is preceded by: `void ` or cuBLAS's `std::enable_if<..., void>::type `.
_RETURN = re.compile(r"^(?:void |std::enable_if<[^<>]*>::type )")
# Wrappers whose first template argument is the real kernel: cutlass::Kernel<cutlass_80_...>.
_WRAPPER = re.compile(r"(?:^|::)(?:Kernel2?|device_kernel)$")


@dataclass(frozen=True)
class KernelClass:
    kind: Kind
    precision: Precision

    @property
    def matrix(self) -> bool:
        """Work Tensor Cores can take: matmuls, convolutions and fused attention."""
        return self.kind != "other"

    @property
    def tensor_core(self) -> bool:
        """Matrix work on Tensor Cores (an elementwise bf16 kernel is reduced precision, but no
        Tensor Core work)."""
        return self.matrix and self.precision == "tensor_core"

    @property
    def fp32_matrix(self) -> bool:
        """Matrix work the name shows on the FP32 units: what mixed precision or TF32 would speed
        up. A kernel whose name shows neither (a Triton template, a Composable Kernel GEMM with
        `unsigned short` operands) counts as neither: the rules act on evidence, not guesses."""
        return self.matrix and self.precision == "fp32"


def _identity(name: str) -> str:
    """The kernel's own name: without `void `, template arguments and parameters, except that a
    generic wrapper (`cutlass::Kernel<X>`) is named by its first template argument."""
    base = _RETURN.sub("", name).strip()
    cut = [i for i in (base.find("<"), base.find("(")) if i >= 0]
    head = base[: min(cut)] if cut else base
    if _WRAPPER.search(head) and "<" in base:
        inner = base[base.find("<") + 1 :]
        end = [i for i in (inner.find(">"), inner.find("("), inner.find(",")) if i >= 0]
        return f"{head} {inner[: min(end)] if end else inner}"
    return head


@functools.lru_cache(maxsize=8192)
def classify(name: str) -> KernelClass:
    """The class of one kernel by name (names repeat millions of times: cached)."""
    ident = _identity(name)
    if _NOT_MATRIX.search(ident):
        kind: Kind = "other"
    elif _ATTENTION.search(ident):
        kind = "attention"
    elif _CONV.search(ident):
        kind = "conv"
    elif _GEMM.search(ident):
        kind = "gemm"
    else:
        kind = "other"
    return KernelClass(kind, precision(name))


def precision(name: str) -> Precision:
    """Tensor Cores when the name shows MMA tiles or reduced-precision operands (not for a GEMV);
    FP32 units when it shows FFMA/SIMT/single-precision kernels; else unknown. The full name is
    read: a wrapper's template arguments and a cuDNN engine's `<float` carry it."""
    if _FFMA.search(name):
        return "fp32"
    if _TENSOR_CORE.search(name):
        return "tensor_core"
    if _REDUCED.search(name) and not _GEMV.search(_identity(name)):
        return "tensor_core"
    if _FP32.search(name):
        return "fp32"
    return "unknown"
