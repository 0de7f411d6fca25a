"""When a loop's step time has settled, so that a window's timed steps measure the loop as it
runs, not its start.

A fixed count of warm-up steps is a few milliseconds at GPU speed: on the first H100 runs five
warm-up steps took 23 ms and the loop then sped up by 15-54% while the trials ran (the caching
allocator filling, cuBLAS picking its kernels, the GPU's clocks ramping up, DataLoader workers
filling their queues). Benchmark harnesses calibrate instead: Google Benchmark and timeit run a
measurement until it lasts a minimum time, pyperf and JMH warm up until consecutive samples
agree. Here the warm-up steps are cut into consecutive blocks, each at least `block_s` long
and `block_steps` steps (two rounds of the DataLoader's workers, which deliver batches in
bursts; `fed_steps` where the loop never waited on them, `Blocks`); the loop has settled when
the last `blocks` blocks agree in time per step to within `tolerance`, or within what chance
gives blocks of such uneven steps (NOISE_SIGMAS). A loop that never settles is measured anyway
once the warm-up has lasted `max_s`, and the report says so."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

# Each block lasts at least this long: long enough that a few slow steps (a garbage collection,
# a burst of batches) move its time per step by well under the tolerance.
BLOCK_S = 0.2
BLOCK_STEPS = 5
BLOCKS = 3
# Consecutive blocks whose time per step differs by at most this share count as settled: above
# the few percent a quiet machine's loop varies by (tests/scripts/settling.py measures it), below
# the 15-54% drift the first H100 runs showed.
TOLERANCE = 0.10
MAX_WARMUP_S = 60.0
# A block's time per step varies by chance where single steps vary a lot: DataLoader workers
# deliver batches in bursts (steps of 3-50 ms around 10 ms on 2 cores, a stall each round), and
# blocks of 0.2 s of such a loop differ by 10-20% with its level unchanged; the warm-up then ran
# for 3-4 s, doubling its blocks, where its steps had been alike after 1 s. Blocks whose spread
# is what that chance gives (NOISE_SIGMAS standard errors of a block's mean, from the steps in
# it) are as settled as blocks can show: the tolerance widens to that, never beyond
# NOISE_TOLERANCE_MAX, so that a change of the loop's level larger than that is always waited
# out. A loop of regular steps (a GPU's, a sleep's) keeps the tolerance as it is.
NOISE_SIGMAS = 3.0
NOISE_TOLERANCE_MAX = 0.30
# Every timed window lasts at least this long: at GPU speed 20 steps are 30 ms, and the spread
# over windows of a few milliseconds is the timer's and the scheduler's, not the loop's.
MIN_TIME_S = 1.0


@dataclass(frozen=True)
class Settling:
    """The steadiness test a window's warm-up ends on (see the module's docstring)."""

    block_s: float = BLOCK_S
    block_steps: int = BLOCK_STEPS
    blocks: int = BLOCKS
    tolerance: float = TOLERANCE
    max_s: float = MAX_WARMUP_S
    # a trial's: the blocks, once the counted warm-up steps are over (a compile, a first epoch's
    # start), may last at most this long (`profile.pace`); None: only `max_s` caps them
    blocks_max_s: float | None = None
    # the steps of a block whose every batch was loaded ahead, from a buffer that did not shrink
    # over it (`Blocks.add`); None: `block_steps`
    fed_steps: int | None = None

    def for_workers(self, workers: int) -> Settling:
        """Blocks of at least two rounds of `workers` DataLoader workers' batches, or of the
        settling's own size where the workers kept ahead of the loop throughout a block."""
        steps = max(self.block_steps, 2 * workers)
        fed = self.block_steps if self.fed_steps is None else self.fed_steps
        return replace(self, block_steps=steps, fed_steps=fed)


@dataclass
class Blocks:
    """The warm-up's steps, cut into blocks as they come. A loop with a period longer than a block
    (a DataLoader rebuilt every short epoch, its workers forked anew; a validation every few
    dozen steps) never gives three alike blocks: after twice `blocks` blocks of one size that did
    not settle, the blocks double in length and steps (as timeit's autorange grows its loops),
    and only blocks of the new size are compared.

    Two rounds of the workers' batches make a block because the loop waits on a round and then
    takes the batches that came with it. Where each step of a block found its batch loaded ahead
    (`add`'s `ready`: the batches waiting then), the loop did not wait on the workers; where,
    besides, the batches waiting shrank over the block by at most `tolerance` of a batch a step,
    it was not draining a buffer they filled earlier (a fresh run's first steps take the
    prefetched batches, fast, until the buffer is empty) faster than the workers refill it by
    more than the tolerance, so the loop left when the buffer runs dry is at most that much
    slower. Such a block is the loop's own steps, and ends at `fed_steps`. A window of 32 workers
    on 2 cores, each step's batch waiting among 55-58, had taken blocks of 64 steps (1.4 s)."""

    settling: Settling
    block_ms: list[float] = field(default_factory=list)  # time per step of each finished block
    block_rse: list[float] = field(default_factory=list)  # and the relative standard error of it
    scale: int = 1  # the blocks' length, in multiples of the settling's
    _sized: int = 0  # finished blocks of the current size
    _steps: int = 0
    _s: float = 0.0
    _s2: float = 0.0
    _first_ready: int | None = None  # the batches waiting at the block's first step, while all were

    def add(self, step_s: float, ready: int | None = None) -> None:
        """One warm-up step of `step_s`; `ready`: the batches waiting when it drew its own, where
        every batch it drew was loaded ahead (None: one was not, or it could not be told)."""
        self._steps += 1
        self._s += step_s
        self._s2 += step_s * step_s
        if self._steps == 1:
            self._first_ready = ready
        elif ready is None:
            self._first_ready = None
        enough_s = self.scale * self.settling.block_s - 1e-9
        if self._steps < self.scale * self._block_steps(ready) or self._s < enough_s:
            return
        self.block_ms.append(1e3 * self._s / self._steps)
        self.block_rse.append(_relative_se(self._steps, self._s, self._s2))
        self._steps, self._s, self._s2 = 0, 0.0, 0.0
        self._sized += 1
        if not self.settled and self._sized >= 2 * self.settling.blocks:
            self.scale, self._sized = 2 * self.scale, 0

    def _block_steps(self, ready: int | None) -> int:
        """The steps the current block needs (at scale 1), its step now waiting among `ready`."""
        fed = self.settling.fed_steps
        if fed is None or ready is None or self._first_ready is None:
            return self.settling.block_steps
        if ready < self._first_ready - self.settling.tolerance * self._steps:
            return self.settling.block_steps  # draining
        return min(fed, self.settling.block_steps)

    @property
    def settled(self) -> bool:
        if self._sized < self.settling.blocks:
            return False
        last = self.block_ms[-self.settling.blocks :]
        return max(last) <= (1.0 + self.tolerance()) * min(last)

    def tolerance(self) -> float:
        """The settling tolerance, widened to the chance spread of the last blocks' means."""
        return noise_tolerance(self.settling, max(self.block_rse[-self.settling.blocks :], default=0.0))


def noise_tolerance(settling: Settling, relative_se: float) -> float:
    """`settling.tolerance`, or NOISE_SIGMAS relative standard errors of a mean where that is
    more, at most NOISE_TOLERANCE_MAX (see NOISE_SIGMAS)."""
    return max(settling.tolerance, min(NOISE_TOLERANCE_MAX, NOISE_SIGMAS * relative_se))


def relative_se(step_ms: list[float]) -> float:
    """The relative standard error of the mean of `step_ms` (0 for fewer than 2 steps)."""
    return _relative_se(len(step_ms), sum(step_ms), sum(ms * ms for ms in step_ms))


def _relative_se(n: int, total: float, squares: float) -> float:
    if n < 2 or total <= 0:
        return 0.0
    mean = total / n
    variance = max(0.0, squares / n - mean * mean)
    return math.sqrt(variance / n) / mean
