"""The peak table MFU is computed against, the matmul dtype that picks its column, and the CPU's
measured peak."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainadvisor.compute import peaks
from trainadvisor.compute.peaks import PeakTableError, matmul_dtype, measure_cpu_peak, peak_for


@pytest.mark.parametrize(
    ("reported", "dtype", "flops_per_s", "device"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "fp8", 1978.9e12, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", "fp32", 66.9e12, "H100 SXM"),
        ("NVIDIA H100 PCIe", "bf16", 756e12, "H100 PCIe"),
        ("NVIDIA H100 NVL", "bf16", 835.5e12, "H100 NVL"),
        ("NVIDIA H200", "bf16", 989.5e12, "H200 SXM"),
        ("NVIDIA B200", "bf16", 2250e12, "B200 (HGX)"),
        ("NVIDIA A100-SXM4-40GB", "tf32", 156e12, "A100 SXM"),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12, "A100 SXM"),
        ("NVIDIA A100 80GB PCIe", "bf16", 312e12, "A100 PCIe"),
        ("Tesla V100-SXM2-32GB", "fp16", 125e12, "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "fp16", 112e12, "V100 PCIe"),
        ("NVIDIA L4", "fp8", 242.5e12, "L4"),
        ("NVIDIA L40S", "bf16", 362.05e12, "L40S"),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2e12, "GeForce RTX 4090"),
        ("NVIDIA GeForce RTX 4090", "tf32", 82.6e12, "GeForce RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "fp16", 71e12, "GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 2080 Ti", "fp16", 56.9e12, "GeForce RTX 2080 Ti"),
        ("AMD Instinct MI300X", "bf16", 1307.4e12, "Instinct MI300X"),
        ("AMD Instinct MI300X", "fp8", 2614.9e12, "Instinct MI300X"),
        ("AMD Instinct MI250X", "bf16", 191.5e12, "Instinct MI250X (one GCD)"),
    ],
)
def test_a_reported_name_finds_its_dense_datasheet_peak(
    reported: str, dtype: str, flops_per_s: float, device: str
) -> None:
    peak = peak_for(reported, dtype)
    assert peak is not None
    assert (peak.flops_per_s, peak.dtype, peak.device, peak.how) == (flops_per_s, dtype, device, "datasheet")
    assert "https://" in peak.source


# every name a driver is known to report, and the one entry it must reach
REPORTED = {
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 80GB HBM2e": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA B200": "B200 (HGX)",
    "NVIDIA A100-SXM4-40GB": "A100 SXM",
    "NVIDIA A100-SXM4-80GB": "A100 SXM",
    "NVIDIA A100-SXM-80GB": "A100 SXM",
    "NVIDIA A100-PCIE-40GB": "A100 PCIe",
    "NVIDIA A100 80GB PCIe": "A100 PCIe",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA GeForce RTX 4090": "GeForce RTX 4090",
    "NVIDIA GeForce RTX 3090": "GeForce RTX 3090",
    "GeForce RTX 3090": "GeForce RTX 3090",
    "NVIDIA GeForce RTX 2080 Ti": "GeForce RTX 2080 Ti",
    "Tesla V100-SXM2-16GB": "V100 SXM2",
    "Tesla V100-SXM2-32GB": "V100 SXM2",
    "Tesla V100-PCIE-32GB": "V100 PCIe",
    "Tesla V100S-PCIE-32GB": "V100S PCIe",
    "AMD Instinct MI300X": "Instinct MI300X",
    "AMD Instinct MI300X VF": "Instinct MI300X",
    "AMD Instinct MI250X": "Instinct MI250X (one GCD)",
}


def test_each_reported_name_matches_exactly_one_entry() -> None:
    for reported, device in REPORTED.items():
        assert [entry.name for entry in peaks.devices() if entry.matches(reported)] == [device], reported


def test_pcie_cards_do_not_reach_the_sxm_entries() -> None:
    assert peak_for("NVIDIA H100 PCIe", "bf16") == peak_for("NVIDIA H100 80GB HBM2e", "bf16")
    assert peak_for("NVIDIA H100 PCIe", "bf16") != peak_for("NVIDIA H100 80GB HBM3", "bf16")
    pcie = peak_for("NVIDIA A100 80GB PCIe", "bf16")
    assert pcie is not None and pcie.device == "A100 PCIe"


def test_case_and_surrounding_spaces_do_not_matter() -> None:
    peak = peak_for("  nvidia h100 80gb hbm3\n", "bf16")
    assert peak is not None and peak.flops_per_s == 989.4e12


@pytest.mark.parametrize(
    "reported",
    [
        "NVIDIA GeForce GTX 1080",
        "Tesla T4",
        "NVIDIA GeForce RTX 3090 Ti",  # not the 3090
        "NVIDIA GeForce RTX 4090 D",  # fewer SMs than the 4090
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA L40",  # not the L40S
        "NVIDIA GB200",  # a GB200's GPU, not the HGX B200
        "NVIDIA GH200 480GB",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb",  # a slice of the card, not the card
        "AMD Instinct MI250X/MI250",  # fits the slower MI250 as well
        "",
    ],
)
def test_a_name_the_table_does_not_know_has_no_peak(reported: str) -> None:
    assert peak_for(reported, "bf16") is None
    assert peak_for(reported, "fp32") is None


@pytest.mark.parametrize(
    ("reported", "dtype"),
    [
        ("Tesla V100-SXM2-32GB", "fp8"),
        ("Tesla V100-SXM2-32GB", "bf16"),
        ("Tesla V100-SXM2-32GB", "tf32"),
        ("NVIDIA A100-SXM4-80GB", "fp8"),
        ("NVIDIA GeForce RTX 2080 Ti", "bf16"),
        ("AMD Instinct MI250X", "tf32"),
        ("NVIDIA H100 80GB HBM3", "fp64"),  # no dtype the table quotes
    ],
)
def test_a_dtype_the_card_lacks_has_no_peak(reported: str, dtype: str) -> None:
    assert peak_for(reported, dtype) is None


def test_every_entry_has_a_source_a_pattern_and_positive_dense_figures() -> None:
    entries = peaks.devices()
    assert len(entries) == 18
    assert len({entry.name for entry in entries}) == len(entries)
    for entry in entries:
        assert "https://" in entry.source and entry.checked.strip() and entry.note.strip(), entry.name
        assert entry.patterns, entry.name
        assert set(entry.flops_per_s) <= set(peaks.DTYPES), entry.name
        assert {"fp32", "fp16"} <= set(entry.flops_per_s), entry.name
        assert all(value > 0 for value in entry.flops_per_s.values()), entry.name
        # a tensor figure is never below plain FP32: a sparse or per-pair figure would show as
        # a misplaced factor of two elsewhere, so the exact figures are pinned above
        assert entry.flops_per_s["fp16"] >= entry.flops_per_s["fp32"], entry.name


def test_the_unverified_entries_are_the_geforce_cards() -> None:
    unverified = [entry.name for entry in peaks.devices() if not entry.verified]
    assert unverified == ["GeForce RTX 4090", "GeForce RTX 3090", "GeForce RTX 2080 Ti"]


def test_the_table_ships_inside_the_package() -> None:
    assert peaks.TABLE_PATH.parent.name == "compute"
    assert peaks.TABLE_PATH.parent.parent.name == "trainadvisor"


# ---- matmul_dtype ----


@pytest.mark.parametrize(
    ("dtype_flops", "tf32_enabled", "expected"),
    [
        ({"torch.bfloat16": 9e12, "torch.float32": 1e12}, False, "bf16"),
        ({"torch.float16": 5e12, "torch.float32": 1e12}, True, "fp16"),
        ({"torch.float32": 4e12}, False, "fp32"),
        ({"torch.float32": 4e12}, True, "tf32"),
        ({"torch.float32": 4e12, "torch.bfloat16": 1e12}, True, "tf32"),
        # the FP8 formats share one peak, so their FLOPs add up
        ({"torch.float8_e4m3fn": 3e12, "torch.float8_e5m2": 3e12, "torch.bfloat16": 5e12}, False, "fp8"),
        ({"torch.float8_e4m3fnuz": 2e12}, False, "fp8"),
        ({"torch.float64": 7e12, "torch.float32": 1e12}, False, "fp64"),
        ({"torch.bfloat16": 0.0, "torch.float32": 1e9}, False, "fp32"),  # zero FLOPs are no vote
        ({"torch.bfloat16": 2e12, "torch.float16": 2e12}, False, "bf16"),  # a tie: DTYPES's order
        ({}, False, "fp32"),  # nothing counted: float32, torch's default
        ({}, True, "tf32"),
    ],
)
def test_matmul_dtype_picks_the_dtype_with_most_flops(
    dtype_flops: dict[str, float], tf32_enabled: bool, expected: str
) -> None:
    assert matmul_dtype(dtype_flops, tf32_enabled) == expected


# ---- the table's own checks ----

ENTRY = """
[[device]]
name = "{name}"
names = ['{pattern}']
source = "https://example.com/datasheet.pdf: table 1"
verified = true
checked = "the datasheet"
[device.tflops]
{figures}
"""


def table(*entries: tuple[str, str, str]) -> str:
    return "".join(ENTRY.format(name=n, pattern=p, figures=f) for n, p, f in entries)


def test_a_parsed_figure_is_exact_in_flop_per_s() -> None:
    (entry,) = peaks.parse_table(table(("X", "NVIDIA X", "fp32 = 66.9\nbf16 = 989.4")), "t.toml")
    assert entry.flops_per_s == {"fp32": 66.9e12, "bf16": 989.4e12}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (table(("X", "NVIDIA X", "int8 = 10.0")), "tflops ['int8'] are not among"),
        (table(("X", "NVIDIA X", "bf16 = -1.0")), "tflops.bf16 must be a positive number"),
        (table(("X", "NVIDIA X", "bf16 = true")), "tflops.bf16 must be a positive number"),
        (table(("X", "NVIDIA (X", "bf16 = 1.0")), "not a regular expression"),
        (table(("X", "NVIDIA X", "bf16 = 1.0"), ("Y", "nvidia x", "bf16 = 2.0")), "is in both 'X' and 'Y'"),
        (
            table(("X", "NVIDIA X", "bf16 = 1.0")).replace("https://example.com/", ""),
            "must give the document's URL",
        ),
        (
            table(("X", "NVIDIA X", "bf16 = 1.0")).replace("https://example.com/datasheet.pdf: table 1", ""),
            "'source' must be a non-empty string",
        ),
        (table(("X", "NVIDIA X", "bf16 = 1.0")).replace("verified = true", ""), "'verified' must be"),
        ("title = 'no devices'", "no [[device]] entries"),
        ("[[device]\n", "not valid TOML"),
    ],
)
def test_a_malformed_table_names_the_problem(text: str, message: str) -> None:
    with pytest.raises(PeakTableError, match=message.replace("[", r"\[").replace("(", r"\(")):
        peaks.parse_table(text, "t.toml")


@pytest.fixture
def overlapping(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    entries = peaks.parse_table(
        table(("X", "NVIDIA X.*", "bf16 = 1.0"), ("X1", "NVIDIA X1", "bf16 = 2.0")), "t"
    )
    monkeypatch.setattr(peaks, "devices", lambda: entries)
    yield


@pytest.mark.usefixtures("overlapping")
def test_a_name_two_entries_match_is_the_tables_error_not_a_pick() -> None:
    with pytest.raises(PeakTableError, match=r"'NVIDIA X1' matches several entries \(X, X1\)"):
        peak_for("NVIDIA X1", "bf16")
    peak = peak_for("NVIDIA X2", "bf16")
    assert peak is not None and peak.flops_per_s == 1e12


# ---- measure_cpu_peak ----


def test_the_cpu_peak_is_a_measured_matmul_rate() -> None:
    peak = measure_cpu_peak(torch.float32, seconds=0.01, size=32)
    assert peak.flops_per_s > 0
    assert (peak.how, peak.dtype) == ("measured", "fp32")
    assert peak.device.startswith("CPU")
    assert peak.source.startswith("measured on this machine: best of ")
    assert f"32x32 float32 matmuls over 0.01 s, {torch.get_num_threads()} torch threads" in peak.source


def test_the_cpu_peak_of_bfloat16_is_quoted_as_bf16() -> None:
    peak = measure_cpu_peak(torch.bfloat16, seconds=0.01, size=16)
    assert (peak.how, peak.dtype) == ("measured", "bf16")


class FakeClock:
    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def __call__(self) -> float:
        return self.readings.pop(0)


def test_the_cpu_peak_is_the_best_matmul_until_the_time_is_up() -> None:
    # deadline 0 + 2 s; the first mm takes 0.5 s, the second 0.25 s and ends past the deadline
    peak = measure_cpu_peak(seconds=2.0, size=8, clock=FakeClock(0.0, 1.0, 1.5, 2.0, 2.25))
    assert peak.flops_per_s == 2 * 8**3 / 0.25
    assert "best of 2 8x8 float32 matmuls over 2.0 s" in peak.source


def test_a_clock_that_never_sees_a_matmul_gives_no_rate() -> None:
    with pytest.raises(ValueError, match="did not advance over 2 matmuls"):
        measure_cpu_peak(seconds=2.0, size=8, clock=FakeClock(0.0, 1.0, 1.0, 2.0, 2.0))


def test_the_cpu_peak_needs_time_and_a_size() -> None:
    with pytest.raises(ValueError, match="seconds > 0 and size > 0"):
        measure_cpu_peak(seconds=0.0)
    with pytest.raises(ValueError, match="seconds > 0 and size > 0"):
        measure_cpu_peak(size=0)


def test_the_cpu_peak_is_the_best_this_machine_measured_and_a_busy_one_says_so(tmp_path: Path) -> None:
    """A CPU's measured peak moved 9x between runs under load (0.042-0.39 TFLOP/s): MFU is taken
    against the best this machine measured (same model, threads and dtype), kept in a file."""
    from trainadvisor.compute.peaks import Peak, best_cpu_peak

    kept = tmp_path / "peaks.json"

    def measured(gflops: float) -> Peak:
        return Peak(gflops * 1e9, "fp32", "CPU (x86_64)", "measured on this machine", "measured")

    assert best_cpu_peak(measured(390.0), kept) == measured(390.0)  # the first: kept as it is
    busy = best_cpu_peak(measured(42.0), kept)
    assert (busy.flops_per_s, busy.how) == (390e9, "measured")
    assert busy.source.endswith(
        f"the best this machine has measured (390.0 GFLOP/s, kept in {kept}), not this run's 42.0 GFLOP/s "
        "(the CPU was busy: under half of it)"
    )
    assert "busy" not in best_cpu_peak(measured(300.0), kept).source
    assert best_cpu_peak(measured(420.0), kept).flops_per_s == 420e9  # a better one replaces it
    assert best_cpu_peak(measured(42.0), kept).flops_per_s == 420e9
