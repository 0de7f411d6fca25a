"""torch's TF32 and cuDNN autotuning flags, read and switched in whichever API the script uses
(the `tf32` and `cudnn-benchmark` fixes' switches, and the torch facts a window records)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

# ---- TF32: torch >= 2.9 has `fp32_precision`; reading the legacy API after a script set the new
# one raises ("mix of the legacy and new APIs"), so the API in use is found first. ----


def _has_new_tf32_api() -> bool:
    return hasattr(torch.backends.cuda.matmul, "fp32_precision")


def tf32_api() -> str:
    """`new` when the script set `fp32_precision` (reading the legacy flags then raises), else
    `legacy` (also when nothing was set: the legacy flags are what older torch reads)."""
    if not _has_new_tf32_api():
        return "legacy"
    try:
        torch.backends.cuda.matmul.allow_tf32  # noqa: B018 - the read is the test
    except RuntimeError:
        return "new"
    return "legacy"


def tf32_enabled() -> bool:
    if _has_new_tf32_api():  # reading the new API is always allowed
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


def cudnn_tf32_enabled() -> bool:
    """Whether cuDNN runs float32 convolutions in TF32 (torch's default: on)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if _has_new_tf32_api() and conv is not None and hasattr(conv, "fp32_precision"):
        return str(conv.fp32_precision) == "tf32"
    return bool(torch.backends.cudnn.allow_tf32)


def float32_matmul_precision() -> str:
    """`highest`/`high` as torch.get_float32_matmul_precision() says, without calling it (it
    raises once the new API is in use)."""
    if tf32_api() == "new":
        return "high" if tf32_enabled() else "highest"
    return torch.get_float32_matmul_precision()


def switch_flags(tf32: bool = False, cudnn_benchmark: bool = False) -> Callable[[], None]:
    """Turn TF32 (matmuls and cuDNN convolutions) and cuDNN autotuning on where they are off, in
    the API the script uses; returns what puts every flag it changed back exactly as it was."""
    undo: list[Callable[[], None]] = []
    if tf32:
        undo += _tf32_on() if _has_new_tf32_api() else _legacy_tf32_on()
    benchmark = torch.backends.cudnn.benchmark
    if cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
        undo.append(lambda: setattr(torch.backends.cudnn, "benchmark", benchmark))

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore


def _legacy_tf32_on() -> list[Callable[[], None]]:
    """torch < 2.9: two booleans, each switched only where off (matmul's True would also turn a
    script's float32_matmul_precision "medium" into "high")."""
    undo: list[Callable[[], None]] = []
    owners: tuple[Any, ...] = (torch.backends.cuda.matmul, torch.backends.cudnn)
    for owner in owners:
        if not owner.allow_tf32:
            owner.allow_tf32 = True
            undo.append(functools.partial(setattr, owner, "allow_tf32", False))
    return undo


# torch >= 2.9 keeps fp32_precision at three levels: an op's (cuBLAS matmul, cuDNN conv and
# rnn) "none" inherits its backend's (`torch.backends.cudnn.fp32_precision`, CUDA's), whose
# "none" inherits the global `torch.backends.fp32_precision`; every read answers the inherited
# value, never "none" below a level that has one. The legacy flags write these too:
# `matmul.allow_tf32 = False` writes "ieee" and `cudnn.allow_tf32` writes conv and rnn, and
# reading a legacy flag raises once it disagrees with them. So an op is switched through the
# legacy flag where that flag still reads (the script uses it: both stay in agreement), else
# through fp32_precision, and is written back through both.


def _tf32_on() -> list[Callable[[], None]]:
    undo: list[Callable[[], None]] = []
    matmul: Any = torch.backends.cuda.matmul
    cudnn: Any = torch.backends.cudnn
    if matmul.fp32_precision != "tf32":
        undo.append(_switched(matmul if _legacy_reads(matmul) else None, (matmul,)))
    if cudnn.conv.fp32_precision != "tf32":
        if _legacy_reads(cudnn):  # its flag writes rnn as well as conv
            undo.append(_switched(cudnn, (cudnn.conv, cudnn.rnn)))
        else:
            undo.append(_switched(None, (cudnn.conv,)))
    return undo


def _legacy_reads(owner: Any) -> bool:
    try:
        owner.allow_tf32  # noqa: B018 - the read is the test
    except RuntimeError:  # the script set fp32_precision: legacy and new flags disagree
        return False
    return True


def _switched(legacy: Any, ops: tuple[Any, ...]) -> Callable[[], None]:
    """Put `ops` on TF32, through `legacy`'s allow_tf32 where given; returns what writes back
    the legacy flag and each op's fp32_precision as read now. An op that reads as its backend
    does is written back "none" (torch does not tell "none" from the same value set again, and
    "none" keeps following the backend as before)."""
    backend = torch.backends.cudnn.fp32_precision
    saved = [(op, op.fp32_precision) for op in ops]
    if legacy is not None:
        legacy.allow_tf32 = True
    else:
        for op in ops:
            op.fp32_precision = "tf32"

    def restore() -> None:
        if legacy is not None:  # the flag's own state (matmul's: float32_matmul_precision "highest")
            legacy.allow_tf32 = False
        for op, value in saved:
            op.fp32_precision = "none" if value == backend else value

    return restore
