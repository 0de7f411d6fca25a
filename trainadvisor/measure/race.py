"""When a trial window has lost its race: its setting cannot beat the best one measured so far,
so the rest of its warm-up and timed steps would only cost time.

Tuners stop a candidate once it is confidently worse than the best so far (racing, as in irace;
successive halving, as in Hyperband) instead of measuring every candidate to the end. Here the
parent hands each trial window `race_below`: the steps per second of the slow windows (10th
percentile) of the best setting measured so far. A window loses when even its throughput raised
by RACE_MARGIN stays below that: more than two settled blocks of one loop differ by (the
settling tolerance, 10%), and more than a busy core drifts the machine by between the best's
window and this one (the best may be the baseline's, measured minutes before):
- in its warm-up, when its last `blocks` blocks all lose, and the last of them is not more than
  the tolerance faster than the first (a loop still speeding up is given its time);
- in its timed steps, once a block's worth of them (steps and seconds) loses as a whole.
The window then times one block's worth of steps, so that what it measured stands in the report,
and ends: no slide, no memory step. The report names the windows cut and why."""

from __future__ import annotations

from trainadvisor.measure.settle import Blocks, Settling

RACE_MARGIN = 0.25


def raised(steps_per_s: float, settling: Settling) -> float:
    """The most a loop measured at `steps_per_s` could run at: RACE_MARGIN above it."""
    return steps_per_s * (1.0 + RACE_MARGIN)


def lost_in_warmup(blocks: Blocks, below: float) -> bool:
    """Whether the warm-up's last blocks show the window cannot reach `below` steps/s."""
    settling = blocks.settling
    if len(blocks.block_ms) < settling.blocks:
        return False
    last = [1e3 / ms for ms in blocks.block_ms[-settling.blocks :] if ms > 0]
    if len(last) < settling.blocks:
        return False
    speeding_up = last[-1] > (1.0 + settling.tolerance) * last[0]
    return not speeding_up and all(raised(rate, settling) < below for rate in last)


def lost_in_timed(recorded: int, timed_s: float, below: float, settling: Settling) -> bool:
    """Whether `recorded` timed steps over `timed_s` show the window cannot reach `below`."""
    if timed_s <= 0:
        return False
    return raised(recorded / timed_s, settling) < below
