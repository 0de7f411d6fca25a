"""Fix `dataloader-workers`: load batches in worker processes, with the worker count measured in
both directions.

Fewer first, where the script has workers: half its count (while that is some), then none
(`num_workers=0` loads in the training process: no worker start, no copy between processes; on a
machine with fewer free cores than busy workers it is often the fastest). Then more: the search
doubles `num_workers` from twice the script's count (2 from none) while each step up gains at
least `STEP_GAIN` over the best before it, up to `max_workers` (four per core, at least 8, at
most 32) and never past `--max-workers` where it is given. It does not go up where fewer workers
already gained `STEP_GAIN` over the script's own count: the workers were short of cores, and
more would share them further. Loading bound by CPU stops near the core count; loading bound by
storage or network latency keeps scaling far past it: when the last trial's workers were mostly
waiting (each busy less than `WAITING_BUSY` of a core, from the sampled CPU of the worker
processes), the doubling goes on up to `HARD_CAP`, as long as the workers' sampled memory (each
one's own, USS: not the pages it shares with the training process, which its RSS counts too)
for twice as many fits in half of the memory available. The next count comes from what the last
window showed, not only from doubling: where its workers were waiting and the loop still waited
on them for a share `w` of each step, about `n / (1 - w)` workers would hide that wait, so the
search leaps there (a power of two, at most four times the last count). Only the waits more
workers can hide count (`loader_waits`): not the hand-over of batches the workers had loaded
ahead, which every step pays; where what is left is under `HIDDEN_LEFT`, no count can gain the
`STEP_GAIN` more workers must bring, and the search stops, unless other processes used half a
core or more in that window (`loader_waits.shared`): beside them the loop's steps slow while
their batches wait, the wait no longer tells what more workers gain, and the next count is
measured instead; and a count that lost to the best before it, in a window they shared, is judged
against that count measured again right after it (`worker_pairs`: a drift in their load shows in
both adjacent windows). The report says what was tried and why the search stopped (or went on). Every
candidate with workers keeps them alive across epochs (`persistent_workers=True`). The count
kept is the fewest that ran within `STEP_GAIN` of the fastest: more workers stay only where they
brought what a doubling must to go on (each is a process, with its own copy of the dataset's
state: 32 workers on 2 cores summed 8 GB resident, where 16 ran 5% slower); the report says so
where the fastest was not kept. That count (when it has workers) is then tried with
`prefetch_factor=4`, unless its loop waited less than `LITTLE_WAIT` in waits a deeper queue
could hide (there were none left) or its window kept the machine's cores busy (`BUSY_CORES` of
them, the training process, its workers and every other process sampled together: a deeper queue
lets idle workers load ahead, and no core was idle to do it). On a CUDA run every candidate also
pins memory and makes the host-to-device copies of pinned batches non-blocking."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainadvisor.fixes import worker_pairs
from trainadvisor.fixes.common import KEEP_MIN_SPEEDUP, LoaderSetting, Setting, overrides
from trainadvisor.fixes.loader_waits import (
    baseline_shared,
    batch_load_s,
    cores_busy,
    hideable_share,
    little_left,
    shared,
    wait_share,
)
from trainadvisor.fixes.worker_counts import (
    MAX_LEAP,
    fewer,
    first_count,
    first_more,
    max_workers,
    next_count,
    worker_cap,
)
from trainadvisor.fixes.worker_pairs import figures, paired_stop, repeats, to_measure_again, workers_of
from trainadvisor.records import FixOutcome, Overrides, Trial

STEP_GAIN = 1.10  # a doubling of workers must bring 10% more throughput to go on
PREFETCH_GAIN = 1.05  # a deeper prefetch is kept only for 5% more throughput
PREFETCH = 4
# A loop that waits on its input for less than this share of its steps has little left for a
# deeper prefetch to hide (at most 1 / (1 - share) faster: under PREFETCH_GAIN).
LITTLE_WAIT = 0.05
# More workers hide at most the waits they can (`loader_waits.hideable_share`): where that share
# is under this one, the next count could gain at most 1 / (1 - share), under STEP_GAIN, and
# would not be kept (the count kept is the fewest within STEP_GAIN of the fastest).
HIDDEN_LEFT = 1.0 - 1.0 / STEP_GAIN
# A count this many times the one that would hide a latency-bound wait (`n / (1 - w)`) usually
# keeps up with the loop: the estimate counts no doubling past it (`likely_trials`).
LATENCY_MARGIN = 1.5
# The share of the cores a window kept busy (training process, workers, every other process) at
# or above which no core was left idle for workers to load ahead: no deeper prefetch is tried.
BUSY_CORES = 0.9
# A worker count in a rule's snippet that is an example, and says so ("num_workers=8,  # an
# example: ..."; "--dataloader_num_workers 8 ... (8: an example)"): the count and the comment
# are what `practice` replaces with the count a run measured fastest.
_EXAMPLE = re.compile(r"(num_workers[= ])(\d+)(.*?)(# an example\b.*|\(\d+: an example\))$", re.MULTILINE)


def _no_deeper(best: Trial, values: dict[str, Any]) -> str | None:
    """Why the count kept (`DataLoaderWorkers._base_count`) gets no deeper prefetch, None where
    it does: the loop hardly waited there ("": the doubling's stop says so), or its window kept
    BUSY_CORES of the cores busy (workers load ahead only on idle ones)."""
    wait = hideable_share(best)
    if wait is not None and wait < LITTLE_WAIT:  # a deeper queue hides waits, and none were left
        return ""
    busy = cores_busy(best, values)
    if busy is None or busy < BUSY_CORES:
        return None
    return (
        f"no deeper prefetch tried: {best.label}'s window kept {100 * busy:.0f}% of the "
        f"{int(values['cpu_count'])} cores busy, none idle for workers to load ahead"
    )


class DataLoaderWorkers(LoaderSetting):
    id = "dataloader-workers"
    bound_by = "data_wait_pct"

    def not_applicable(self, values: dict[str, Any]) -> str | None:
        if "dataloader_call_site" not in values:
            return "no torch DataLoader fed the profiled steps, so there is nothing to tune"
        return None

    def expected_trials(self, values: dict[str, Any]) -> int:
        """The fewer counts, the doublings up to four workers per core (up to four times the
        first count where the baseline's loading waited: the search goes past the cores there),
        and the deeper prefetch."""
        current = int(values.get("num_workers") or 0)
        workers = first_count(values, current)
        ceiling = self._ceiling(values, current, workers)
        count = len(fewer(current)) + 1
        while workers * 2 <= ceiling:
            workers, count = workers * 2, count + 1
        return count + 1

    def likely_trials(self, values: dict[str, Any]) -> int:
        return len(self.likely_windows(values))

    def likely_windows(self, values: dict[str, Any]) -> list[tuple[int, float | None]]:
        """The counts the search usually measures (`_likely_counts`), each with the steps/s its
        workers can load at most: `count / t`, `t` a loader's time per batch in the baseline
        (`loader_waits.batch_load_s`; not known where loading was bound by CPU)."""
        current = int(values.get("num_workers") or 0)
        load_s = batch_load_s(values, current) if self._latency_bound(values) else None
        counts, _ = self._likely_counts(values)
        return [(n, n / load_s if load_s else None) for n in counts[: self.expected_trials(values)]]

    def likely_ends_on_choice(self, values: dict[str, Any]) -> bool:
        """Loading bound by latency: the search usually stops where the loop kept up with its
        workers (`HIDDEN_LEFT`), at the count it keeps, unless its ceiling stopped it first (a
        deeper prefetch follows); bound by CPU, a doubling finds no gain after the count it keeps,
        but beside other processes the count kept is measured again after that (`worker_pairs`)."""
        counts, short = self._likely_counts(values)
        again = not short and counts[-1] in counts[:-1]  # the count kept, measured again
        ends = self._latency_bound(values) and not short
        return ends or again or super().likely_ends_on_choice(values)

    def _likely_counts(self, values: dict[str, Any]) -> tuple[list[int], bool]:
        """The counts the search usually measures, and whether it stops at its ceiling while the
        loop still waits. The fewer counts and the first count above the script's; bound by CPU,
        doublings up to the core count and one more, which finds no gain there. Bound by latency,
        the leaps (`leap`) towards the count that loads batches as fast as the loop computes them
        (a batch's loading over the step's compute: `w / (1 - w)` where the training process
        loads, `n / (1 - w)` for `n` workers), until a count LATENCY_MARGIN times that: short of
        it the loop still waits (workers deliver in bursts, and every batch's hand-over adds to
        the step; the slow-input example waited 87% at 1 ms a sample: 8 workers for 6.7 still
        waited, 16 kept up; 82% at 0.5 ms: 8 for 4.4 kept up; a loader that waited 98% went 8,
        32, then 32 with a deeper prefetch, its ceiling reached). Where other processes used half a
        core or more in the baseline's window, one count more: the search measures past where
        the loop kept up (`loader_waits.shared`), and that count losing, the count kept is
        measured again right after it (`worker_pairs`), the search's last window."""
        current = int(values.get("num_workers") or 0)
        workers = first_count(values, current)
        ceiling = self._ceiling(values, current, workers)
        counts = [*fewer(current), workers]
        if not self._latency_bound(values):
            while workers < int(values.get("cpu_count") or 1) and workers * 2 <= ceiling:
                workers *= 2
                counts.append(workers)
            return counts + self._past(values, workers, ceiling), False
        wait = float(values.get("data_wait_pct") or 0.0) / 100.0
        needed = (current or wait) / max(1.0 - wait, 1e-3)
        while workers < LATENCY_MARGIN * needed and workers * 2 <= ceiling:
            step = 2 * workers
            while step < needed and step < MAX_LEAP * workers and step * 2 <= ceiling:
                step *= 2
            workers = step
            counts.append(workers)
        short = workers < LATENCY_MARGIN * needed  # then a deeper prefetch of the count reached
        if short:
            return counts + [workers], short
        return counts + (self._past(values, workers, ceiling) if baseline_shared(values) else []), short

    @staticmethod
    def _past(values: dict[str, Any], workers: int, ceiling: int) -> list[int]:
        """The counts after `workers`, the one the search usually keeps, where it is not the
        ceiling: the count past it, which gains too little, then (beside other processes) the
        count kept measured again right after it (`worker_pairs`)."""
        if workers * 2 > ceiling:
            return []
        return [workers * 2, workers] if baseline_shared(values) else [workers * 2]

    @staticmethod
    def _latency_bound(values: dict[str, Any]) -> bool:
        """Whether the baseline's loading mostly waited (`first_count` leaps past a doubling)."""
        current = int(values.get("num_workers") or 0)
        return first_count(values, current) > first_more(current)

    @staticmethod
    def _ceiling(values: dict[str, Any], current: int, first: int) -> int:
        """The most workers the search goes to from the script's `current` count, its first
        count above it being `first`."""
        ceiling = min(max_workers(int(values.get("cpu_count") or 1)), worker_cap(values)[0])
        if first > first_more(current):  # loading bound by latency
            ceiling = min(max(ceiling, MAX_LEAP * first), worker_cap(values)[0])
        return ceiling

    def _setting(self, values: dict[str, Any], workers: int, prefetch: int | None) -> Setting:
        cuda = bool(values.get("cuda_used"))
        # none: the loader's worker-only arguments go (`training.loaders.apply`; the code change
        # sets them off where the script sets them)
        loader: dict[str, Any] = {"num_workers": workers}
        if workers:
            loader["persistent_workers"] = True
        label = f"num_workers={workers}"
        if prefetch is not None:
            loader["prefetch_factor"] = prefetch
            label += f", prefetch_factor={prefetch}"
        if cuda:
            loader["pin_memory"] = True
        # Keyed by the DataLoader(...) call site: a loader rebuilt every epoch gets it every time.
        return Setting(label, overrides({values["dataloader_call_site"]: loader}, non_blocking_h2d=cuda))

    @staticmethod
    def _workers(trial: Trial) -> int:
        return workers_of(trial)

    @staticmethod
    def _prefetch(trial: Trial) -> bool:
        return "prefetch_factor" in trial.overrides.loader()

    def next_candidate(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        current = int(values.get("num_workers") or 0)
        below = fewer(current)
        if len(trials) < len(below):  # each fewer count is tried, whatever the one before gave
            return self._setting(values, below[len(trials)], None)
        if len(trials) == len(below):  # the first count above the script's
            if self._fewer_won(values, trials) or first_more(current) > worker_cap(values)[0]:
                return self._deeper(values, trials)
            return self._setting(values, first_count(values, current), None)
        last = trials[-1]
        if last.status != "measured" or self._prefetch(last):
            return None  # refused, failed or changed training: more workers will not do better
        plain = [t for t in trials if not self._prefetch(t)]
        doubling = plain[len(below) :]
        again = to_measure_again(doubling, float(values.get("steps_per_s") or 0.0), STEP_GAIN)
        if again is not None:  # beside other processes: the best count before it, right after it
            setting = self._setting(values, self._workers(again), None)
            note = f"measured again right after {last.label}, beside other processes"
            # raced in its timed steps only: cut in a warm-up still starting its workers, its
            # steps/s would be understated, and the count it pairs with overstated
            return replace(setting, note=note, race_warmup=False)
        count, _ = self._doubling(values, trials)
        if count is not None:
            return self._setting(values, count, None)
        return self._deeper(values, trials)

    def _deeper(self, values: dict[str, Any], trials: list[Trial]) -> Setting | None:
        """The count kept so far (`_base_count`) with a deeper prefetch (None where it has no
        workers)."""
        best = self._base_count(trials, values)
        if best is None:
            return None
        workers = self._workers(best)
        if not workers or _no_deeper(best, values) is not None:
            return None  # no workers to queue ahead, or nothing a deeper queue could gain
        return self._setting(values, workers, PREFETCH)

    @staticmethod
    def _figured(trials: list[Trial]) -> list[Trial]:
        """The settings measured, each at its latest window, its steps/s at the machine's first
        pace where a count was measured again beside other processes (`worker_pairs.figures`)."""
        measured = [t for t in trials if t.status == "measured" and t.steps_per_s]
        return [t if f == t.steps_per_s else replace(t, steps_per_s=f) for t, f in figures(measured)]

    def pace_now(self, trials: list[Trial]) -> float:
        return worker_pairs.pace_now(trials)

    def _plain(self, trials: list[Trial]) -> list[Trial]:
        """The counts measured, without a deeper prefetch (`_figured`)."""
        return [t for t in self._figured(trials) if not self._prefetch(t)]

    def _base_count(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        """The count `choose` starts from: the count kept among those that gained what a fix
        must over the script, else among all (a deeper prefetch may still bring it there)."""
        floor = KEEP_MIN_SPEEDUP * float(values.get(self.metric) or 0.0)
        return self._kept_count(trials, floor) or self._kept_count(trials)

    def _kept_count(self, trials: list[Trial], floor_steps_per_s: float = 0.0) -> Trial | None:
        """Of the counts measured (no deeper prefetch), the one kept: the fewest workers that ran
        within STEP_GAIN of the fastest, and at `floor_steps_per_s` at least (None where none
        did). More workers are kept only where they brought what the search asks of a doubling to
        go on: each is a process, with its own copy of the dataset's state."""
        plain = self._plain(trials)
        if not plain:
            return None
        fastest = max(plain, key=lambda t: t.steps_per_s or 0.0)
        floor = max((fastest.steps_per_s or 0.0) / STEP_GAIN, floor_steps_per_s)
        close = [t for t in plain if (t.steps_per_s or 0.0) >= floor]
        return min(close, key=lambda t: (self._workers(t), -(t.steps_per_s or 0.0)), default=None)

    def _fewer_won(self, values: dict[str, Any], trials: list[Trial]) -> bool:
        """Whether a count below the script's gained STEP_GAIN over its own."""
        below = trials[: len(fewer(int(values.get("num_workers") or 0)))]
        own = float(values.get("steps_per_s") or 0.0)
        return own > 0 and any(
            t.status == "measured" and (t.steps_per_s or 0.0) >= STEP_GAIN * own for t in below
        )

    def _doubling(self, values: dict[str, Any], trials: list[Trial]) -> tuple[int | None, str]:
        """After the last plain trial: the next count, or None and why the doubling stops."""
        plain = [t for t in trials if not self._prefetch(t)]
        last = plain[-1]
        if last.status != "measured":
            return None, f"stopped: {last.label} {last.status.replace('_', ' ')}"
        below = len(fewer(int(values.get("num_workers") or 0)))
        if len(plain) > below + 1 and repeats(plain[below:]):  # a count again, right after the last
            stop = paired_stop(plain[below:], STEP_GAIN)
            return (None, stop) if stop else next_count(values, plain[-2], self._workers(plain[-2]))
        *earlier, (_, figure) = figures(plain)  # at the machine's first pace (`worker_pairs`)
        best_before = max([f for _, f in earlier] + [values.get("steps_per_s") or 0.0])
        workers = self._workers(last)
        if self._little_left(last, best_before) and shared(last) is None:
            return None, little_left(last, workers, STEP_GAIN)
        if figure < STEP_GAIN * best_before:
            return None, (
                f"stopped at {workers} workers: they gained less than {100 * (STEP_GAIN - 1):.0f}% "
                "over the best before them"
            )
        return next_count(values, last, workers)

    @staticmethod
    def _little_left(last: Trial, best_before: float) -> bool:
        """Whether `last` gained, and left its loop too little wait for more workers to hide."""
        hidden = hideable_share(last)
        return hidden is not None and hidden < HIDDEN_LEFT and (last.steps_per_s or 0.0) >= best_before

    def _went_on(self, values: dict[str, Any], trials: list[Trial]) -> str:
        """Where the doubling went past a count whose loop waited too little for more workers to
        gain, because other processes shared the machine in its window (`loader_waits.shared`):
        which count, and their cores ("" elsewhere)."""
        plain = [t for t in trials if not self._prefetch(t)]
        below = len(fewer(int(values.get("num_workers") or 0)))
        rates = [t.steps_per_s or 0.0 for t in plain[:below] if t.status == "measured"]
        best = max([*rates, float(values.get("steps_per_s") or 0.0)])
        for i, done in enumerate(plain[below:-1], below):  # the doubling's counts that another followed
            if repeats(plain[: i + 1]):
                continue  # a count measured again: the one first measured said it
            cores = shared(done) if done.status == "measured" else None
            if cores is not None and self._little_left(done, best):
                return (
                    f"went on past {self._workers(done)} workers, where the loop waited on its input for "
                    f"{100 * (wait_share(done) or 0.0):.0f}% of its steps: other processes used {cores:.1f} "
                    "cores in its window, beside which that wait does not tell what more workers gain"
                )
            best = max(best, done.steps_per_s or 0.0)
        return ""

    def search_note(self, trials: list[Trial], values: dict[str, Any]) -> str | None:
        current = int(values.get("num_workers") or 0)
        below = fewer(current)
        plain = [t for t in trials if not self._prefetch(t)]
        if not plain:
            return None
        parts = []
        if below:
            tried = ", ".join(str(self._workers(t)) for t in plain[: len(below)])
            parts.append(f"fewer than the script's {current} workers tried ({tried})")
        if len(plain) > len(below):
            parts.append(self._went_on(values, trials))
            most = max(self._workers(t) for t in plain)
            parts.append(self._doubling(values, trials)[1] or f"more tried up to {most}")
        elif len(plain) == len(below) and self._fewer_won(values, trials):
            parts.append("more were not tried: fewer gained over the script's own count")
        elif len(plain) == len(below) and first_more(current) > worker_cap(values)[0]:
            parts.append(f"more were not tried: {first_more(current)} is past {worker_cap(values)[1]}")
        kept = self._base_count(plain, values)
        if kept is not None and len(plain) == len(trials) and self._workers(kept):  # no deeper prefetch
            parts.append(_no_deeper(kept, values) or "")
        parts.append(self._fewer_kept(trials, values))
        return "; ".join(part for part in parts if part) or None

    def _fewer_kept(self, trials: list[Trial], values: dict[str, Any]) -> str:
        """Where the count chosen has fewer workers than the fastest count, why ("" elsewhere)."""
        chosen = self.choose(trials, values)
        plain = self._plain(trials)
        fastest = max(plain, key=lambda t: t.steps_per_s or 0.0, default=None)
        if chosen is None or fastest is None or self._workers(chosen) >= self._workers(fastest):
            return ""
        faster_pct = 100.0 * ((fastest.steps_per_s or 0.0) / (chosen.steps_per_s or 1.0) - 1.0)
        if faster_pct <= 0:
            return ""
        return (  # rounded down: a share just under the bar never reads as the bar
            f"{chosen.label} kept: {fastest.label} ran {math.floor(10 * faster_pct) / 10:.1f}% faster, "
            f"under the {100 * (STEP_GAIN - 1):.0f}% more workers must bring"
        )

    def choose(self, trials: list[Trial], values: dict[str, Any]) -> Trial | None:
        """The count kept (`_kept_count`), or a deeper prefetch of a count where it brought
        PREFETCH_GAIN over that count's plain trial (and STEP_GAIN over the kept count, where
        it runs more workers); None where that gains under KEEP_MIN_SPEEDUP over the script."""
        baseline_steps_per_s = float(values.get(self.metric) or 0.0)
        kept = self._kept_count(trials, KEEP_MIN_SPEEDUP * baseline_steps_per_s)
        plain = self._plain(trials)
        for deeper in (t for t in self._figured(trials) if self._prefetch(t)):
            same = next((t for t in plain if self._workers(t) == self._workers(deeper)), None)
            if same is None:
                continue
            bar = PREFETCH_GAIN * (same.steps_per_s or 0.0)
            if kept is not None:  # more workers than the count kept must bring STEP_GAIN over it
                over = STEP_GAIN if self._workers(deeper) > self._workers(kept) else 1.0
                bar = max(bar, over * (kept.steps_per_s or 0.0))
            if (deeper.steps_per_s or 0.0) >= bar:
                kept = deeper
        if kept is None or (kept.steps_per_s or 0.0) < KEEP_MIN_SPEEDUP * baseline_steps_per_s:
            return None
        return kept

    def code_change(self, source: str, script: Path, overrides: Overrides) -> str | None:
        from trainadvisor.fixes import codechange  # libcst: not in the measured run

        return codechange.loader_change(source, script, overrides)

    def describe(self, trial: Trial, values: dict[str, Any]) -> str:
        parts = [f"{key}={value}" for key, value in trial.overrides.loader().items()]
        if trial.overrides.non_blocking_h2d:
            parts.append("non_blocking=True host-to-device copies")
        return ", ".join(parts)

    def practice(self, snippet: str, outcome: FixOutcome) -> str:
        """The snippet's example count, where this run measured a count fastest (kept, or the
        fastest of its trials), replaced by that count, and its comment saying so."""
        workers = outcome.settings.loader().get("num_workers")
        if outcome.status not in ("kept", "unconfirmed") or workers is None:
            return snippet
        tried = sorted({self._workers(t) for t in outcome.trials if t.status == "measured"})
        of = f" of {', '.join(map(str, tried))} and the script's own" if tried else ""

        def measured(match: re.Match[str]) -> str:
            comment = match[4]
            said = f"measured fastest in this run{of}"
            return f"{match[1]}{workers}{match[3]}{f'# {said}' if comment.startswith('#') else f'({said})'}"

        return _EXAMPLE.sub(measured, snippet)
