"""Before/after: speedup with its spread over windows, and whether training stayed the same.
Pure functions over measured runs."""

from __future__ import annotations

from trainadvisor.analysis.summary import percentile
from trainadvisor.model import Comparison, LossCheck, RawRun, Run

# Loss of the same step, seeded alike, must agree to this relative difference for a fix to
# count as leaving training unchanged. Fixes that only change how batches are loaded give the
# same batches in the same order, so the losses agree to the last bit on the same machine; the
# tolerance leaves room for non-deterministic reductions in some kernels, nothing more.
LOSS_TOLERANCE_REL = 1e-4

# A fix is kept when the slow windows after it beat the fast windows before it
# (speedup_low > 1) and the median throughput gains at least this much.
KEEP_MIN_SPEEDUP = 1.05


def loss_check(baseline: RawRun, after: RawRun, tolerance_rel: float = LOSS_TOLERANCE_REL) -> LossCheck:
    """Compare the loss of every step both runs recorded (same index, same seed)."""
    shared = min(len(baseline.losses), len(after.losses))
    before_losses, after_losses = baseline.losses[:shared], after.losses[:shared]
    pairs = [(b, a) for b, a in zip(before_losses, after_losses) if b is not None and a is not None]
    check = LossCheck(
        steps_compared=len(pairs),
        max_abs_diff=None,
        max_rel_diff=None,
        tolerance_rel=tolerance_rel,
        equivalent=None,
        baseline=before_losses,
        after=after_losses,
    )
    if pairs:
        check.max_abs_diff = max(abs(a - b) for b, a in pairs)
        check.max_rel_diff = max(abs(a - b) / max(abs(b), 1e-12) for b, a in pairs)
        check.equivalent = check.max_rel_diff <= tolerance_rel
    return check


def _pct(values: list[float], pct: float) -> float:
    return percentile(values, pct) or 0.0


def compare(baseline: Run, after: Run) -> Comparison:
    """Speedup of the median window throughput; its range sets the slow (10th percentile)
    windows of one run against the fast (90th percentile) windows of the other."""
    before_w, after_w = baseline.window_steps_per_s, after.window_steps_per_s
    speedup = low = high = None
    if before_w and after_w:
        before_median, after_median = percentile(before_w, 50), percentile(after_w, 50)
        if before_median and after_median:
            speedup = after_median / before_median
        low = _pct(after_w, 10) / _pct(before_w, 90)
        high = _pct(after_w, 90) / _pct(before_w, 10)
    return Comparison(
        speedup=speedup,
        speedup_low=low,
        speedup_high=high,
        windows=min(len(before_w), len(after_w)),
        loss_check=loss_check(baseline.raw, after.raw),
    )


def verdict(comparison: Comparison) -> tuple[str, str]:
    """(status, reason) of fixes measured together by `comparison`:
    kept | no_gain | changed_training."""
    check = comparison.loss_check
    if check.equivalent is False:
        return "changed_training", (
            f"the loss of the same steps changed by up to {100 * (check.max_rel_diff or 0):.3g}% "
            f"(tolerance {100 * check.tolerance_rel:.3g}%)"
        )
    if comparison.speedup is None or comparison.speedup_low is None:
        return "no_gain", "the rerun measured no complete window to compare"
    spread = f"{comparison.speedup:.2f}x (range {comparison.speedup_low:.2f}-{comparison.speedup_high:.2f}x)"
    if comparison.speedup < KEEP_MIN_SPEEDUP or comparison.speedup_low <= 1.0:
        return "no_gain", f"measured {spread}: not a reliable gain"
    return "kept", f"measured {spread} over {comparison.windows} windows"


def judge_trial(baseline: RawRun, trial: RawRun) -> tuple[str, str | None]:
    """Whether a candidate's run counts: (measured | refused | failed | changed_training, why)."""
    refused = [loader.override_refused for loader in trial.loaders if loader.override_refused]
    if refused:
        return "refused", refused[0]
    if trial.status != "window_complete":
        return "failed", trial.error or f"the run ended before the window ({trial.status})"
    if trial.duplicate_batches > baseline.duplicate_batches:
        return "changed_training", (
            f"{trial.duplicate_batches} of {len(trial.steps)} batches in the window repeated an "
            "earlier batch: an IterableDataset that does not split its data by worker "
            "(torch.utils.data.get_worker_info()) hands every worker the same samples"
        )
    check = loss_check(baseline, trial)
    if check.equivalent is False:
        return "changed_training", (
            f"the loss of the same steps changed by up to {100 * (check.max_rel_diff or 0):.3g}%"
        )
    return "measured", None
