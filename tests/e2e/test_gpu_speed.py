"""The measurement loop at GPU speed (issue 24), reproduced on the CPU: steps well under a
millisecond, runs of a few hundred steps, steps that start slow and settle, and the GPU-only
lines behind them through the fakes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import SCRIPTS, load_report, run_cli
from support.gpu_speed import _chosen, _run

from trainadvisor import fixes
from trainadvisor.profile import attribution
from trainadvisor.records import (
    Overrides,
    Run,
)


def _profile(tmp_path: Path, *args: str | Path) -> dict[str, Any]:
    out = tmp_path / "r"
    result = run_cli("profile", "--out", out, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return load_report(out)


def test_a_loop_that_starts_slow_is_timed_on_its_settled_steps(tmp_path: Path) -> None:
    """20 ms steps for 1.5 s, then 1 ms steps. Five warm-up steps (the old fixed count) would
    have timed the slow start: the window times the settled 1 ms steps."""
    report = _profile(tmp_path, "--no-fix", "--warmup", "3", "--steps", "10", SCRIPTS / "settling.py")
    baseline = report["baseline"]
    shape = baseline["raw"]["shape"]
    assert shape["warmup_end"] == "settled" and shape["warmup_s"] >= 1.5
    # no 20 ms step among the timed ones (beside a busy core and the suite, their p90 read 7.8 ms)
    assert baseline["step_time_ms"]["p90"] < 10.0
    assert shape["timed_s"] >= 1.0 and baseline["steps"] >= 100  # the time floor, not 10 steps
    assert any(n.startswith("Warm-up: the baseline's step time") for n in report["details"])


def test_a_loop_that_never_settles_is_measured_at_the_cap_and_the_report_says_so(tmp_path: Path) -> None:
    report = _profile(
        tmp_path, "--no-fix", "--warmup", "3", "--steps", "10", "--max-warmup", "2s",
        SCRIPTS / "settling.py", "--swing-s", "0.5",
    )  # fmt: skip
    shape = report["baseline"]["raw"]["shape"]
    # past the cap, not before it; by how much is the machine's: the cap is checked once the
    # first --warmup steps are done (3.9 s in all when a loaded machine made those slow)
    assert shape["warmup_end"] == "time cap" and shape["warmup_s"] >= 2.0 and shape["slid_steps"] == 0
    [note] = [n for n in report["notes"] if n.startswith("Step time had not settled")]
    assert (
        f"the baseline window after {shape['warmup_s']:.1f} s (the longest warm-up allowed, "
        "--max-warmup, had passed)" in note
    )
    assert "--max-warmup 2s" in " ".join(report["command"])


def test_a_fix_the_others_make_redundant_is_not_kept_and_each_keeps_its_own_gain() -> None:
    """The first H100 runs: amp alone 1.71x, tf32 alone 1.47x; under bf16 autocast the matmuls
    TF32 would speed up no longer run in fp32, so together they are as fast as amp alone.
    Leaving tf32 out costs nothing: it is redundant; leaving amp out costs 1.16x: kept."""
    base = 100.0
    pace = {
        "amp + tf32 together": 171.0 * base / 100,
        "tf32 (without amp)": 147.0 * base / 100,
        "amp (without tf32)": 170.0 * base / 100,
    }
    measured: list[str] = []

    def measure(label: str, setting: fixes.Setting) -> Run | None:
        measured.append(f"{label}: {setting.label}")
        return _run(pace[setting.label])

    amp = _chosen("amp", 1.71, Overrides(runtime={"amp": "bf16"}))
    tf32 = _chosen("tf32", 1.47, Overrides(runtime={"tf32": True}))
    decided, notes = attribution.attribute([amp, tf32], measure)
    assert measured == [
        "combined-1: amp + tf32 together",
        "without-amp-1: tf32 (without amp)",
        "without-tf32-1: amp (without tf32)",
    ]
    kept, dropped = decided
    assert (kept.status, dropped.status, notes) == ("unconfirmed", "redundant", [])
    assert kept.gain == 1.71 and kept.settings.runtime == {"amp": "bf16"}
    assert dropped.settings == Overrides() and round(dropped.added_gain or 0, 4) == 1.0059
    assert dropped.reason == (
        "1.47x steps/s alone, but amp measured 170.0 steps/s without it and 171.0 with it (1.01x): "
        "it adds nothing the other fix does not"
    )
