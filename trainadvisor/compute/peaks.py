"""The peak FLOP/s that MFU is computed against: the dense datasheet peak of a known GPU in the
dtype its matmuls ran in (`peaks.toml`, each figure with its source), or this CPU's own measured
matmul rate. A device or dtype the table does not know has no peak: never a guess."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainadvisor.errors import TrainAdvisorError

if TYPE_CHECKING:
    import torch

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

TABLE_PATH = Path(__file__).with_name("peaks.toml")
# the dtypes a peak is quoted in; on a tie in matmul_dtype, the one listed first wins
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
_SHORT_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


class PeakTableError(TrainAdvisorError):
    """peaks.toml is malformed or ambiguous; the message names the entry and the field."""


@dataclass(frozen=True)
class Peak:
    """A device's peak in one dtype, and where the figure comes from."""

    flops_per_s: float
    dtype: str  # fp32, tf32, bf16, fp16, fp8 (or fp64 for a measured CPU peak)
    device: str  # the table's device name, or the CPU measured
    source: str  # the datasheet's URL and table, or how the CPU was measured
    how: str  # "datasheet" or "measured"
    note: str = ""


@dataclass(frozen=True)
class DevicePeaks:
    """One entry of peaks.toml."""

    name: str
    patterns: tuple[re.Pattern[str], ...]
    source: str
    verified: bool
    checked: str
    note: str
    flops_per_s: Mapping[str, float]  # by dtype, dense

    def matches(self, device_name: str) -> bool:
        return any(p.fullmatch(device_name.strip()) for p in self.patterns)


def peak_for(device_name: str, dtype: str) -> Peak | None:
    """The table's dense peak for a device as torch/NVML name it, in one of `DTYPES`; None for a
    device the table does not know, or a dtype the card lacks (FP8 on a V100)."""
    matched = [entry for entry in devices() if entry.matches(device_name)]
    if len(matched) > 1:
        names = ", ".join(entry.name for entry in matched)
        problem = f"'{device_name}' matches several entries ({names})"
        raise PeakTableError(f"{TABLE_PATH}: {problem}: make their name patterns specific")
    if not matched or dtype not in matched[0].flops_per_s:
        return None
    entry = matched[0]
    return Peak(
        flops_per_s=entry.flops_per_s[dtype],
        dtype=dtype,
        device=entry.name,
        source=entry.source,
        how="datasheet",
        note=entry.note,
    )


def matmul_dtype(dtype_flops: dict[str, float], tf32_enabled: bool, conv_tf32: bool = False) -> str:
    """The peak's dtype for a step whose matmul FLOPs were counted by input dtype
    ("torch.bfloat16": n, ...; a convolution's as "conv:torch.float32"): the dtype with most
    FLOPs, float32 being "tf32" when TF32 matmuls were allowed (torch.backends.cuda.matmul.
    allow_tf32, or a float32 matmul precision other than "highest"), and a float32
    convolution's when cuDNN's TF32 was (`conv_tf32`: torch.backends.cudnn.allow_tf32, on by
    default). A dtype no peak is quoted in comes back by its own name ("fp64", "int8"), which
    `peak_for` knows no peak for. No FLOPs at all: float32's, torch's default dtype."""
    by_peak_dtype: dict[str, float] = {}
    for key, flops in dtype_flops.items():
        if flops > 0:
            conv, torch_name = key.startswith("conv:"), key.removeprefix("conv:")
            name = _peak_dtype(torch_name, conv_tf32 if conv else tf32_enabled)
            by_peak_dtype[name] = by_peak_dtype.get(name, 0.0) + flops
    if not by_peak_dtype:
        return _peak_dtype("torch.float32", tf32_enabled)
    order = {name: i for i, name in enumerate(DTYPES)}
    return max(by_peak_dtype, key=lambda name: (by_peak_dtype[name], -order.get(name, len(order))))


def _peak_dtype(torch_name: str, tf32_enabled: bool) -> str:
    name = torch_name.removeprefix("torch.")
    if name == "float32" and tf32_enabled:
        return "tf32"
    if name.startswith("float8"):  # e4m3fn, e5m2, and the fnuz variants of AMD's MI300
        return "fp8"
    return _SHORT_NAMES.get(name, name)


def measure_cpu_peak(
    dtype: torch.dtype | None = None,
    seconds: float = 0.5,
    size: int = 1024,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> Peak:
    """This CPU's matmul peak: `size` x `size` torch.mm, warmed up once, then repeated until
    `seconds` have passed; the best rate (2 * size^3 FLOPs per mm) wins, as a datasheet peak is a
    best case too. Runs on torch's threads as they are set (torch.get_num_threads()); float32
    by default. torch is imported here, not with the module: `analyze` reads peaks without it."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    if seconds <= 0 or size <= 0:
        raise ValueError(f"measure_cpu_peak needs seconds > 0 and size > 0, not {seconds} and {size}")
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up: the first call pays for allocation and kernel choice
    best_s, count = float("inf"), 0
    deadline = clock() + seconds
    while True:
        start = clock()
        torch.mm(a, b, out=out)
        end = clock()
        count += 1
        if end > start:  # a clock too coarse to see one mm tells nothing about it
            best_s = min(best_s, end - start)
        if end >= deadline:
            break
    if best_s == float("inf"):
        raise ValueError(f"the clock did not advance over {count} matmuls: no rate to measure")
    dtype_name = str(dtype).removeprefix("torch.")
    return Peak(
        flops_per_s=2 * size**3 / best_s,
        dtype=_peak_dtype(str(dtype), tf32_enabled=False),
        device=f"CPU ({platform.machine() or 'unknown architecture'})",
        source=(
            f"measured on this machine: best of {count} {size}x{size} {dtype_name} matmuls "
            f"over {seconds} s, {torch.get_num_threads()} torch threads"
        ),
        how="measured",
    )


# A CPU's measured peak moves with what else runs (9x between runs of one machine under load):
# the best measured on this machine, for its model, torch's threads and the dtype, is kept here
# and used; a measurement under half of it says the CPU was busy while it was taken.
CPU_PEAKS_ENV = "TRAINADVISOR_CPU_PEAKS"
CONTENDED = 0.5


def cpu_peaks_file() -> Path:
    """Where the best CPU peaks measured on this machine are kept (TRAINADVISOR_CPU_PEAKS, else
    the user's cache folder)."""
    given = os.environ.get(CPU_PEAKS_ENV)
    if given:
        return Path(given)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "trainadvisor" / "cpu-peaks.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _kept(path: Path) -> dict[str, Any]:
    """A JSON file of figures by key; {} where it is missing, unreadable or not an object."""
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return known if isinstance(known, dict) else {}


def _keep(path: Path, known: dict[str, Any]) -> None:
    """`known` written over `path` whole (a temporary file of this process, then a rename); a
    file that cannot be written only loses what it would have kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(known))
        os.replace(temporary, path)
    except OSError:
        pass


def shared_peak(path: Path, dtype: str, threads: int) -> Peak | None:
    """The peak an earlier run of this profile measured for `dtype` on `threads` torch threads
    and kept in `path` (`share_peak`), or None."""
    known = _kept(path).get(f"{dtype} | {threads} threads")
    try:
        return Peak(**known) if isinstance(known, dict) else None
    except TypeError:  # not a peak's fields
        return None


def share_peak(path: Path, dtype: str, threads: int, peak: Peak) -> None:
    """Keep `peak` in `path` for the profile's later runs, beside the other dtypes' peaks."""
    _keep(path, {**_kept(path), f"{dtype} | {threads} threads": dataclasses.asdict(peak)})


def best_cpu_peak(measured: Peak, path: Path | None = None) -> Peak:
    """The best of `measured` and the best this machine measured before (same CPU model, torch
    threads and dtype): the one used for MFU, its source saying which and what was measured now.
    The best is kept for the next run (a file that cannot be read or written only loses that)."""
    import torch

    path = path or cpu_peaks_file()
    key = f"{_cpu_model()} | {torch.get_num_threads()} threads | {measured.dtype}"
    known = _kept(path)
    stored = known.get(key)
    best_before = float(stored) if isinstance(stored, (int, float)) and math.isfinite(stored) else 0.0
    if measured.flops_per_s > best_before:
        _keep(path, {**known, key: measured.flops_per_s})
        return measured
    now = measured.flops_per_s
    busy = " (the CPU was busy: under half of it)" if now < CONTENDED * best_before else ""
    return Peak(
        best_before,
        measured.dtype,
        measured.device,
        f"{measured.source}; the best this machine has measured ({best_before / 1e9:.1f} GFLOP/s, kept in "
        f"{path}), not this run's {now / 1e9:.1f} GFLOP/s{busy}",
        "measured",  # how the figure was had (its source says which measurement)
    )


@functools.cache
def devices() -> tuple[DevicePeaks, ...]:
    """The entries of peaks.toml, read once."""
    try:
        text = TABLE_PATH.read_text(encoding="utf-8")
    except OSError as exc:
        raise PeakTableError(f"{TABLE_PATH}: cannot be read ({exc}): reinstall trainadvisor") from None
    return parse_table(text, str(TABLE_PATH))


def parse_table(text: str, where: str) -> tuple[DevicePeaks, ...]:
    """Entries from the text of a peaks table; `where` names it in errors."""
    try:
        # Decimal keeps 989.4 TFLOPS exactly 989.4e12 FLOP/s, not 989.4 * 1e12's neighbour
        data = tomllib.loads(text, parse_float=Decimal)
    except tomllib.TOMLDecodeError as exc:
        raise PeakTableError(f"{where}: not valid TOML ({exc})") from None
    entries = tuple(
        _entry(raw, f"{where} [[device]] #{i + 1}") for i, raw in enumerate(data.get("device", []))
    )
    if not entries:
        raise PeakTableError(f"{where}: no [[device]] entries")
    seen: dict[str, str] = {}
    for entry in entries:
        for pattern in entry.patterns:
            key = pattern.pattern.lower()
            if key in seen:
                both = f"'{seen[key]}' and '{entry.name}'"
                raise PeakTableError(f"{where}: name pattern '{pattern.pattern}' is in both {both}")
            seen[key] = entry.name
    return entries


def _entry(raw: Any, where: str) -> DevicePeaks:
    if not isinstance(raw, dict):
        raise PeakTableError(f"{where}: must be a table")
    name = _text(raw, "name", where)
    where = f"{where} ({name})"
    names = raw.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise PeakTableError(f"{where}: 'names' must be a non-empty list of name patterns")
    try:
        patterns = tuple(re.compile(n, re.IGNORECASE) for n in names)
    except re.error as exc:
        raise PeakTableError(f"{where}: a name pattern is not a regular expression ({exc})") from None
    source = _text(raw, "source", where)
    if "://" not in source:
        raise PeakTableError(f"{where}: 'source' must give the document's URL, not only '{source}'")
    if not isinstance(raw.get("verified"), bool):
        raise PeakTableError(f"{where}: 'verified' must be true or false")
    return DevicePeaks(
        name=name,
        patterns=patterns,
        source=source,
        verified=raw["verified"],
        checked=_text(raw, "checked", where),
        note=str(raw.get("note", "")),
        flops_per_s=_flops(raw.get("tflops"), where),
    )


def _flops(tflops: Any, where: str) -> dict[str, float]:
    if not isinstance(tflops, dict) or not tflops:
        raise PeakTableError(f"{where}: needs a [device.tflops] table of figures")
    unknown = sorted(set(tflops) - set(DTYPES))
    if unknown:
        raise PeakTableError(f"{where}: tflops {unknown} are not among {', '.join(DTYPES)}")
    flops = {}
    for dtype, value in tflops.items():
        if isinstance(value, bool) or not isinstance(value, (int, Decimal)) or value <= 0:
            raise PeakTableError(f"{where}: tflops.{dtype} must be a positive number, not {value!r}")
        flops[dtype] = float(Decimal(value) * 10**12)
    return flops


def _text(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise PeakTableError(f"{where}: '{key}' must be a non-empty string")
    return value
