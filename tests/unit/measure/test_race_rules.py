"""When a trial window has lost its race (`measure.race`), decided at the boundary on numbers exact
in binary floating point: its throughput raised by RACE_MARGIN against the best so far, in its
warm-up's last blocks (a loop still speeding up is given its time) and in its timed steps."""

from __future__ import annotations

from trainadvisor.measure.race import RACE_MARGIN, lost_in_timed, lost_in_warmup, raised
from trainadvisor.measure.settle import Blocks, Settling

# three blocks compared, alike within 25%: 1.25 and its multiples are exact, unlike 1.1
SETTLE = Settling(block_s=0.010, block_steps=5, blocks=3, tolerance=0.25, max_s=1.0)


def _blocks(*block_ms: float) -> Blocks:
    return Blocks(SETTLE, list(block_ms))


def test_a_loop_could_run_a_quarter_faster_than_measured_whatever_its_settling() -> None:
    assert RACE_MARGIN == 0.25
    assert raised(200.0, SETTLE) == 250.0
    assert raised(200.0, Settling(tolerance=0.5)) == 250.0


def test_warmup_blocks_that_even_raised_cannot_reach_the_best_lose() -> None:
    """5, 5 and 5 ms a step: 200 steps/s, 250 raised by a quarter."""
    assert lost_in_warmup(_blocks(5.0, 5.0, 5.0), below=250.5)
    assert not lost_in_warmup(_blocks(5.0, 5.0, 5.0), below=250.0)  # 250 reaches 250: not below it


def test_one_warmup_block_that_can_reach_the_best_keeps_the_window_going() -> None:
    # 4 ms a step is 250 steps/s, 312.5 raised: the best's 300 is within reach
    assert not lost_in_warmup(_blocks(5.0, 4.0, 5.0), below=300.0)
    assert lost_in_warmup(_blocks(5.0, 4.0, 5.0), below=312.75)


def test_only_the_last_blocks_are_compared() -> None:
    # the first block's 1 ms a step (1,250 raised) is not among the last three
    assert lost_in_warmup(_blocks(1.0, 5.0, 5.0, 5.0), below=300.0)


def test_a_loop_a_full_tolerance_faster_in_its_last_block_is_not_yet_speeding_up() -> None:
    """5 then 4 ms a step: 200 then 250 steps/s, exactly 25% faster: not more than the tolerance."""
    assert lost_in_warmup(_blocks(5.0, 4.5, 4.0), below=1000.0)


def test_a_loop_more_than_a_tolerance_faster_in_its_last_block_is_given_its_time() -> None:
    """5 then 3.2 ms a step: 200 then 312.5 steps/s, far beyond 25% faster, every block losing."""
    assert not lost_in_warmup(_blocks(5.0, 4.0, 3.2), below=1000.0)
    assert not lost_in_warmup(_blocks(5.0, 4.5, 3.99), below=1000.0)  # just over 25%: 250.6 steps/s


def test_a_loop_slowing_down_loses_however_much_it_changes() -> None:
    assert lost_in_warmup(_blocks(2.0, 4.0, 8.0), below=1000.0)


def test_a_warmup_with_fewer_blocks_than_compared_has_not_lost() -> None:
    assert not lost_in_warmup(_blocks(), below=1000.0)
    assert not lost_in_warmup(_blocks(5.0, 5.0), below=1000.0)


def test_a_block_of_no_time_is_not_judged() -> None:
    assert not lost_in_warmup(_blocks(5.0, 0.0, 5.0), below=1000.0)


def test_blocks_cut_as_steps_come_are_judged_once_three_have_finished() -> None:
    """Steps of 2 ms: each block is 5 steps and 10 ms; 500 steps/s, 625 raised."""
    blocks = Blocks(SETTLE)
    for _ in range(14):
        blocks.add(0.002)
    assert len(blocks.block_ms) == 2 and not lost_in_warmup(blocks, below=700.0)
    blocks.add(0.002)
    assert [round(ms, 9) for ms in blocks.block_ms] == [2.0, 2.0, 2.0]
    assert lost_in_warmup(blocks, below=700.0)
    assert not lost_in_warmup(blocks, below=600.0)


def test_timed_steps_that_even_raised_cannot_reach_the_best_lose() -> None:
    """20 steps in 0.125 s: 160 steps/s, 200 raised."""
    assert lost_in_timed(20, 0.125, below=200.5, settling=SETTLE)
    assert not lost_in_timed(20, 0.125, below=200.0, settling=SETTLE)


def test_timed_steps_over_no_time_are_not_judged() -> None:
    assert not lost_in_timed(20, 0.0, below=1e9, settling=SETTLE)
    assert not lost_in_timed(0, -1.0, below=1e9, settling=SETTLE)
