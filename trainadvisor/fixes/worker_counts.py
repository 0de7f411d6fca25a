"""The worker counts of the `dataloader-workers` search: where it starts, how far a count may
go (four per core, at least 8, at most 32; HARD_CAP, or --max-workers, for loading bound by
latency), the leap to the next count from what the last window showed (`leap`), and where the doubling
stops (`next_count`)."""

from __future__ import annotations

from typing import Any

from trainadvisor.fixes.loader_waits import baseline_loader_busy, hideable_share, worker_load
from trainadvisor.records import Trial

HARD_CAP = 64  # workers, whatever the samples say
WAITING_BUSY = 0.5  # share of a core below which a worker counts as waiting, not computing
MAX_LEAP = 4  # the most the count grows from one trial to the next
MEMORY_SHARE = 0.5  # of the memory available that twice the workers may take


def max_workers(cpu_count: int) -> int:
    return min(32, max(8, 4 * cpu_count))


def fewer(current: int) -> list[int]:
    """The counts tried below the script's own, first: half of it (while that is some), then none."""
    return list(dict.fromkeys(count for count in (current // 2, 0) if count < current))


def first_more(current: int) -> int:
    """The first count tried above the script's own: twice it, 2 from none."""
    return max(2, 2 * current)


def hidden_by(workers: int, wait: float, start: int, most: int) -> int:
    """The count, doubling from `start` up to `most`, that would hide a loop's wait share `wait`
    on `workers` loaders (`workers / (1 - wait)`)."""
    count, needed = start, workers / max(1.0 - wait, 1e-3)
    while count < needed and count < most:
        count *= 2
    return count


def first_count(values: dict[str, Any], current: int) -> int:
    """The first count tried above the script's own: twice it (2 from none), or, where the
    baseline's loading mostly waited (bound by latency) and the loop waited on it for a share
    `w` of each step, the power of two that would hide that wait (`n / (1 - w)` for `n` loaders,
    the training process itself where it has no workers), at most MAX_LEAP times twice it, and
    never past four workers per core or --max-workers (nothing yet says how much memory more
    workers take)."""
    count = first_more(current)
    busy, wait_pct = baseline_loader_busy(values, current), values.get("data_wait_pct")
    if busy is None or wait_pct is None or busy >= WAITING_BUSY:
        return count
    ceiling = min(worker_cap(values)[0], max_workers(int(values.get("cpu_count") or 1)))
    hidden = hidden_by(max(current, 1), wait_pct / 100.0, count, MAX_LEAP * count)
    return max(count, min(hidden, ceiling))


def leap(last: Trial, workers: int, ceiling: int) -> int:
    """The next count after `workers`: twice it, or, where its workers mostly waited (loading
    bound by latency) and the loop still waited on them, the power of two that would hide the
    wait (`workers / (1 - wait)`), at most MAX_LEAP times `workers`; never past `ceiling`
    (which is at least twice `workers`)."""
    count = 2 * workers
    load, wait = worker_load(last), hideable_share(last)
    if load is not None and wait is not None and load[0] < WAITING_BUSY:
        count = hidden_by(workers, wait, count, MAX_LEAP * workers)
    return min(count, max(ceiling, 2 * workers))


def worker_cap(values: dict[str, Any]) -> tuple[int, str]:
    """The most workers the search may try, and what sets it: --max-workers, else HARD_CAP."""
    given = values.get("worker_cap")
    if given:
        return int(given), f"--max-workers {int(given)}"
    return HARD_CAP, f"the hard cap of {HARD_CAP} workers"


def next_count(values: dict[str, Any], last: Trial, workers: int) -> tuple[int | None, str]:
    """After a trial that gained: the next worker count to try, or None and why the search
    stops there."""
    cap, capped_by = worker_cap(values)
    if workers * 2 > cap:
        return None, f"stopped at {workers} workers: {workers * 2} is past {capped_by}"
    per_core = max_workers(values.get("cpu_count", 1))
    if workers * 2 <= per_core:
        return _fitting(values, last, workers, leap(last, workers, min(cap, per_core))), ""
    load = worker_load(last)
    if load is None:
        return None, f"stopped at {workers} workers, four per core (the workers' CPU was not sampled)"
    busy, each_bytes = load
    if busy >= WAITING_BUSY:
        return None, (
            f"stopped at {workers} workers, four per core: each was busy {100 * busy:.0f}% of a "
            "core (loading bound by CPU)"
        )
    available = float(values.get("memory_available_bytes") or 0.0)
    if available and each_bytes * workers * 2 > MEMORY_SHARE * available:
        return None, (
            f"stopped at {workers} workers: {workers * 2} would take about "
            f"{each_bytes * workers * 2 / 1e9:.1f} GB ({each_bytes / 1e6:.0f} MB each) of the "
            f"{available / 1e9:.1f} GB available"
        )
    return _fitting(values, last, workers, leap(last, workers, cap)), ""


def _fitting(values: dict[str, Any], last: Trial, workers: int, count: int) -> int:
    """`count`, lowered towards twice `workers` (never below) while the workers' sampled memory
    (`worker_load`: each one's own) for it would take more than MEMORY_SHARE of the memory
    available."""
    load, available = worker_load(last), float(values.get("memory_available_bytes") or 0.0)
    each_bytes = load[1] if load is not None else 0.0
    while count > 2 * workers and available and each_bytes * count > MEMORY_SHARE * available:
        count = max(count // 2, 2 * workers)
    return count
