"""Before/after: speedup with its spread over windows, and whether training stayed the same.
Pure functions over measured runs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainadvisor.analyze.run.shapes import MIN_TIMED_STEPS, cut_short, usable
from trainadvisor.analyze.run.summary import main_loader, percentile
from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP, LOSS_TOLERANCE_REL, MEAN_LOSS_TOLERANCE_REL
from trainadvisor.records import Comparison, LossCheck, RawRun, Run, timed_steps

# A trial whose window repeats batches this much more often than the baseline's hands workers
# the same samples (an IterableDataset that does not shard by worker).
REPEATED_BATCHES_MARGIN = 0.10


def _same(a: float, b: float) -> bool:
    """Non-finite losses match only their own kind (NaN with NaN, +inf with +inf)."""
    if math.isfinite(a) and math.isfinite(b):
        return True
    return (math.isnan(a) and math.isnan(b)) or a == b


def _same_batches(baseline: RawRun, after: RawRun, shared: int) -> bool | None:
    pairs = [
        (b, a)
        for b, a in zip(baseline.batch_fingerprints[:shared], after.batch_fingerprints[:shared])
        if b is not None and a is not None
    ]
    return all(b == a for b, a in pairs) if pairs else None


def loss_check(baseline: RawRun, after: RawRun, tolerance_rel: float = LOSS_TOLERANCE_REL) -> LossCheck:
    """Compare the loss of every step both runs recorded (same index, same seed). A fix that
    changes arithmetic (tf32, autocast) passes a looser `tolerance_rel`; with different batches
    the tolerance is at least MEAN_LOSS_TOLERANCE_REL. Under torchrun every rank is compared with
    itself (each trains on its own batches): training is the same only where it is on every
    rank, and the figures are the worst rank's."""
    before_ranks = {r.rank: r for r in baseline.ranks if r.rank is not None}
    pairs = [(r.rank, before_ranks[r.rank], r) for r in after.ranks if r.rank in before_ranks]
    if len(pairs) < 2:
        return _rank_loss_check(baseline, after, tolerance_rel)
    checks = [(rank, _rank_loss_check(b, a, tolerance_rel)) for rank, b, a in pairs]
    compared = [(rank, c) for rank, c in checks if c.equivalent is not None]
    if not compared:
        return checks[0][1]
    rank, worst = max(compared, key=lambda rc: (rc[1].equivalent is False, _diff(rc[1])))
    first = checks[0][1]  # the losses shown: the first rank's, as before
    return LossCheck(
        steps_compared=min(c.steps_compared for _, c in compared),
        max_abs_diff=worst.max_abs_diff,
        max_rel_diff=worst.max_rel_diff,
        tolerance_rel=worst.tolerance_rel,
        equivalent=all(c.equivalent for _, c in compared),
        same_batches=worst.same_batches,
        mean_rel_diff=worst.mean_rel_diff,
        baseline=first.baseline,
        after=first.after,
        ranks_compared=len(compared),
        changed_rank=rank if worst.equivalent is False else None,
    )


def _diff(check: LossCheck) -> float:
    measured = check.mean_rel_diff if check.same_batches is False else check.max_rel_diff
    return measured if measured is not None else -1.0


def _rank_loss_check(baseline: RawRun, after: RawRun, tolerance_rel: float) -> LossCheck:
    """`loss_check` of one process's steps."""
    shared = min(len(baseline.losses), len(after.losses))
    before_losses, after_losses = baseline.losses[:shared], after.losses[:shared]
    pairs = [(b, a) for b, a in zip(before_losses, after_losses) if b is not None and a is not None]
    same_batches = _same_batches(baseline, after, shared)
    check = LossCheck(
        steps_compared=len(pairs),
        max_abs_diff=None,
        max_rel_diff=None,
        tolerance_rel=max(MEAN_LOSS_TOLERANCE_REL, tolerance_rel) if same_batches is False else tolerance_rel,
        equivalent=None,
        same_batches=same_batches,
        baseline=before_losses,
        after=after_losses,
    )
    if not pairs:
        return check
    if not all(_same(b, a) for b, a in pairs):
        check.max_abs_diff = check.max_rel_diff = math.inf
        check.equivalent = False
        return check
    finite = [(b, a) for b, a in pairs if math.isfinite(b)]
    if not finite:  # every compared step diverged alike
        check.max_abs_diff = check.max_rel_diff = 0.0
        check.equivalent = True
        return check
    check.max_abs_diff = max(abs(a - b) for b, a in finite)
    check.max_rel_diff = max(abs(a - b) / max(abs(b), 1e-12) for b, a in finite)
    mean_b = sum(b for b, _ in finite) / len(finite)
    mean_a = sum(a for _, a in finite) / len(finite)
    check.mean_rel_diff = abs(mean_a - mean_b) / max(abs(mean_b), 1e-12)
    measured = check.mean_rel_diff if same_batches is False else check.max_rel_diff
    check.equivalent = measured <= check.tolerance_rel
    return check


def loss_change(check: LossCheck) -> str:
    """Why a loss check failed, in words."""
    if check.max_rel_diff == math.inf:
        return "the loss diverged (NaN or infinite) in one run but not in the other"
    if check.same_batches is False:
        return (
            f"the mean loss of the same steps changed by {100 * (check.mean_rel_diff or 0):.3g}% "
            f"(tolerance {100 * check.tolerance_rel:.3g}%, the batches differ between runs)"
        )
    return (
        f"the loss of the same steps changed by up to {100 * (check.max_rel_diff or 0):.3g}% "
        f"(tolerance {100 * check.tolerance_rel:.3g}%)"
    )


def _pct(values: list[float], pct: float) -> float:
    return percentile(values, pct) or 0.0


@dataclass(frozen=True)
class Ratio:
    """After / before throughput in `unit`, with its range over throughput windows."""

    speedup: float | None
    low: float | None
    high: float | None
    windows: int
    unit: str


def ratio(before: Run, after: Run, per_sample: bool = False) -> Ratio:
    """Throughput after / before (steps per second, or samples per second when the batch size
    changed); its range sets the slow (10th percentile) windows of one run against the fast
    (90th percentile) windows of the other."""
    before_w, after_w = before.window_steps_per_s, after.window_steps_per_s
    speedup = low = high = None
    unit = "steps/s"
    if (
        per_sample
        and before.samples_per_s
        and after.samples_per_s
        and before.steps_per_s
        and after.steps_per_s
    ):
        # Windows in samples per second: each run's steps/s windows times its samples per step.
        before_w = [w * before.samples_per_s / before.steps_per_s for w in before_w]
        after_w = [w * after.samples_per_s / after.steps_per_s for w in after_w]
        speedup, unit = after.samples_per_s / before.samples_per_s, "samples/s"
    elif before.steps_per_s and after.steps_per_s:
        speedup = after.steps_per_s / before.steps_per_s
    if before_w and after_w and speedup is not None:
        # never outside its own range: the figure is the whole timed steps', the range their
        # windows' (a short tail is left out of the windows, and the 10th percentile of a few
        # windows can lie above a run slowed by one of them); `spread` says when it was widened
        low = min(_pct(after_w, 10) / _pct(before_w, 90), speedup)
        high = max(_pct(after_w, 90) / _pct(before_w, 10), speedup)
    return Ratio(speedup, low, high, min(len(before_w), len(after_w)), unit)


def spread(speedup: float, low: float | None, high: float | None, unit: str) -> str:
    """A speedup with its range over windows, in words; where the range was widened to reach
    the figure (`ratio`), it says so."""
    if low is None or high is None:
        return f"{speedup:.2f}x {unit}"
    widened = high - low > 1e-9 * high and speedup in (low, high)  # not a float's rounding
    why = ", widened to include the figure of all timed steps" if widened else ""
    return f"{speedup:.2f}x {unit} (range {low:.2f}-{high:.2f}x{why})"


def compare(
    baseline: Run,
    after: Run,
    tolerance_rel: float = LOSS_TOLERANCE_REL,
    per_sample: bool = False,
    references: list[Run] | None = None,
) -> Comparison:
    """Throughput after / baseline with its range (`ratio`), against the fastest of
    `references` where given (the baseline's setting measured again after trial windows), and
    the loss check of the same seeded steps (the baseline's)."""
    ratios = [ratio(reference, after, per_sample) for reference in references or [baseline]]
    found = min(ratios, key=lambda r: r.speedup if r.speedup is not None else math.inf)
    return Comparison(
        speedup=found.speedup,
        speedup_low=found.low,
        speedup_high=found.high,
        windows=found.windows,
        loss_check=loss_check(baseline.raw, after.raw, tolerance_rel),
        unit=found.unit,
        timed_steps=after.steps,
        cut=cut_short(after.raw),
    )


def verdict(comparison: Comparison) -> tuple[str, str]:
    """(status, reason) of fixes measured together by `comparison`:
    kept | no_gain | changed_training."""
    if comparison.loss_check.equivalent is False:
        return "changed_training", loss_change(comparison.loss_check)
    if comparison.speedup is None or comparison.speedup_low is None:
        return "no_gain", "the rerun measured no complete window to compare"
    figure = spread(comparison.speedup, comparison.speedup_low, comparison.speedup_high, comparison.unit)
    if comparison.speedup < KEEP_MIN_SPEEDUP or comparison.speedup_low <= 1.0:
        return "no_gain", f"measured {figure}: not a reliable gain"
    return "kept", f"measured {figure}"


def repeated_batches(raw: RawRun) -> tuple[int, int]:
    """(steps in the window whose batches repeat an earlier step's in the window, steps with
    fingerprinted batches)."""
    seen: set[str] = set()
    repeats = counted = 0
    for step in raw.steps:
        fingerprint = raw.batch_fingerprints[step.index] if step.index < len(raw.batch_fingerprints) else None
        if fingerprint is None:
            continue
        counted += 1
        repeats += fingerprint in seen
        seen.add(fingerprint)
    return repeats, counted


def judge_trial(
    baseline: RawRun, trial: RawRun, tolerance_rel: float = LOSS_TOLERANCE_REL
) -> tuple[str, str | None]:
    """Whether a candidate's run counts: (measured | refused | failed | changed_training, why)."""
    refused = [loader.override_refused for loader in trial.loaders if loader.override_refused]
    if refused:
        return "refused", refused[0]
    if not usable(trial):
        return "failed", trial.error or _too_short(trial)
    loader = main_loader(trial)
    if loader is not None and loader.iterable_dataset:
        (before, before_n), (now, now_n) = repeated_batches(baseline), repeated_batches(trial)
        if now_n and now / now_n > (before / before_n if before_n else 0.0) + REPEATED_BATCHES_MARGIN:
            return "changed_training", (
                f"{now} of {now_n} batches in the window repeated an earlier batch: an "
                "IterableDataset that does not split its data by worker "
                "(torch.utils.data.get_worker_info()) hands every worker the same samples"
            )
    check = loss_check(baseline, trial, tolerance_rel)
    if check.equivalent is False:
        return "changed_training", loss_change(check)
    return "measured", None


def _too_short(raw: RawRun) -> str:
    timed = len(timed_steps(raw))
    if raw.status == "script_ended" and raw.steps_seen:
        return (
            f"the script ended after {raw.steps_seen} steps, with {timed} of them timed (at least "
            f"{MIN_TIMED_STEPS} are needed)"
        )
    return f"the run ended before the window ({raw.status})"
