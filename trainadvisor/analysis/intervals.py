"""Arithmetic on sorted lists of disjoint [start, end) intervals (microseconds)."""

from __future__ import annotations

import bisect

Intervals = list[tuple[float, float]]


def merge(spans: list[tuple[float, float]]) -> Intervals:
    """Sorted, disjoint union of possibly overlapping spans."""
    merged: Intervals = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def intersect(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    j = 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def total(a: Intervals) -> float:
    return sum(end - start for start, end in a)


def clip_total(a: Intervals, starts: list[float], start: float, end: float) -> float:
    """Length of `a` inside [start, end); `starts` is [s for s, _ in a], for bisection."""
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    length = 0.0
    while i < len(a) and a[i][0] < end:
        length += max(0.0, min(a[i][1], end) - max(a[i][0], start))
        i += 1
    return length
