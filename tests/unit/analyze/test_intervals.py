"""Unions of [start, end) intervals (`analyze.trace.intervals`): overlapping, nested and touching
spans merge into sorted disjoint ones whatever order they come in, and a union tells exactly how
much of it lies before a time and inside a window."""

from __future__ import annotations

import numpy as np

from trainadvisor.analyze.trace.intervals import Union, merge_arrays


def _merged(*spans: tuple[float, float]) -> list[tuple[float, float]]:
    starts, ends = merge_arrays(*(np.array(side, float) for side in zip(*spans)))
    return list(zip(starts.tolist(), ends.tolist()))


def test_overlapping_spans_merge_into_one() -> None:
    assert _merged((0, 10), (5, 15), (12, 20)) == [(0.0, 20.0)]


def test_a_span_nested_in_another_is_absorbed_even_when_later_ones_start_inside_the_first() -> None:
    # [1, 2) and [50, 60) lie inside [0, 100): the first's end reaches past them both
    assert _merged((0, 100), (1, 2), (50, 60), (101, 102)) == [(0.0, 100.0), (101.0, 102.0)]


def test_touching_spans_join_and_a_gap_keeps_them_apart() -> None:
    assert _merged((0, 1), (1, 2), (2.5, 3)) == [(0.0, 2.0), (2.5, 3.0)]


def test_spans_out_of_order_are_sorted_first() -> None:
    assert _merged((20, 25), (5, 10), (0, 3), (8, 12)) == [(0.0, 3.0), (5.0, 12.0), (20.0, 25.0)]


def test_no_spans_merge_to_no_spans() -> None:
    starts, ends = merge_arrays(np.empty(0), np.empty(0))
    assert starts.tolist() == [] and ends.tolist() == []


def test_a_union_holds_its_spans_merged_and_counts_them() -> None:
    union = Union(np.array([5.0, 0.0, 20.0, 8.0]), np.array([10.0, 3.0, 25.0, 12.0]))
    assert union.pairs() == [(0.0, 3.0), (5.0, 12.0), (20.0, 25.0)]
    assert len(union) == 3


def test_a_union_covers_by_each_time_the_length_of_its_spans_before_it() -> None:
    union = Union(np.array([5.0, 0.0, 20.0, 8.0]), np.array([10.0, 3.0, 25.0, 12.0]))  # 3 + 7 + 5 long
    times = np.array([-1.0, 0.0, 2.0, 4.0, 5.0, 6.0, 15.0, 22.0, 30.0])
    assert union.covered_until(times).tolist() == [0.0, 0.0, 2.0, 3.0, 3.0, 4.0, 10.0, 12.0, 15.0]


def test_a_union_within_windows_is_its_length_inside_each() -> None:
    union = Union(np.array([0.0, 5.0, 20.0]), np.array([3.0, 12.0, 25.0]))
    within = union.within(np.array([0.0, 4.0, 13.0, 2.0]), np.array([6.0, 22.0, 19.0, 30.0]))
    # [0, 6): 3 + 1; [4, 22): 7 + 2; [13, 19): in the gap; [2, 30): 1 + 7 + 5
    assert within.tolist() == [4.0, 9.0, 0.0, 13.0]


def test_an_empty_union_covers_nothing() -> None:
    union = Union(np.empty(0), np.empty(0))
    assert len(union) == 0 and union.pairs() == []
    assert union.covered_until(np.array([-5.0, 0.0, 7.0])).tolist() == [0.0, 0.0, 0.0]
    assert union.within(np.array([0.0]), np.array([10.0])).tolist() == [0.0]


def test_a_union_plus_more_spans_merges_them_in() -> None:
    union = Union(np.array([0.0, 5.0, 20.0]), np.array([3.0, 12.0, 25.0]))
    more = union.plus(np.array([3.0, 30.0]), np.array([5.0, 31.0]))  # [3, 5) touches both its neighbours
    assert more.pairs() == [(0.0, 12.0), (20.0, 25.0), (30.0, 31.0)]
    assert more.covered_until(np.array([40.0])).tolist() == [18.0]
    assert union.pairs() == [(0.0, 3.0), (5.0, 12.0), (20.0, 25.0)]  # the first union is unchanged
