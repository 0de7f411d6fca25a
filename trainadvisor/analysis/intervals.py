"""Arithmetic on sorted lists of disjoint [start, end) intervals (microseconds)."""

from __future__ import annotations

import bisect

import numpy as np

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
    append = out.append
    i = j = 0
    na, nb = len(a), len(b)
    while i < na and j < nb:
        a0, a1 = a[i]
        b0, b1 = b[j]
        start = a0 if a0 > b0 else b0
        if a1 < b1:
            end = a1
            i += 1
        else:
            end = b1
            j += 1
        if start < end:
            append((start, end))
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    out: Intervals = []
    append = out.append
    j, nb = 0, len(b)
    for start, end in a:
        while j < nb and b[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < nb:
            b0, b1 = b[k]
            if b0 >= end:
                break
            if b0 > cursor:
                append((cursor, b0))
            if b1 > cursor:
                cursor = b1
            k += 1
        if cursor < end:
            append((cursor, end))
    return out


def total(a: Intervals) -> float:
    """Length covered by `a`."""
    return sum(end - start for start, end in a)


def clip_total(a: Intervals, starts: list[float], start: float, end: float) -> float:
    """Length of `a` inside [start, end); `starts` is [s for s, _ in a], for bisection."""
    i = max(bisect.bisect_right(starts, start) - 1, 0)
    length = 0.0
    while i < len(a) and a[i][0] < end:
        length += max(0.0, min(a[i][1], end) - max(a[i][0], start))
        i += 1
    return length


# ---- the same on numpy arrays (a trace's millions of spans) ----


class Union:
    """Disjoint sorted intervals as arrays, with the covered length before any time."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.starts, self.ends = merge_arrays(starts, ends)
        lengths = self.ends - self.starts
        self._before = np.concatenate(([0.0], np.cumsum(lengths)))  # length of intervals < i

    def __len__(self) -> int:
        return len(self.starts)

    def plus(self, starts: np.ndarray, ends: np.ndarray) -> Union:
        return Union(np.concatenate((self.starts, starts)), np.concatenate((self.ends, ends)))

    def covered_until(self, times: np.ndarray) -> np.ndarray:
        """Length of the union in (-inf, t] for each t."""
        i = np.searchsorted(self.starts, times, side="right")
        j = np.maximum(i - 1, 0)
        inside = np.clip(times - self.starts[j], 0.0, self.ends[j] - self.starts[j]) if len(self) else 0.0
        return np.where(i > 0, self._before[j] + inside, 0.0)

    def within(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Length of the union inside each [start, end)."""
        return self.covered_until(ends) - self.covered_until(starts)

    def pairs(self) -> Intervals:
        return list(zip(self.starts.tolist(), self.ends.tolist()))


def merge_arrays(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint union of spans given as arrays (touching spans join, as in `merge`)."""
    if not len(starts):
        return np.empty(0), np.empty(0)
    if np.all(starts[1:] >= starts[:-1]):  # in order already (spans of one thread, say)
        s, e = starts, ends
    else:
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        del order
    reach = np.maximum.accumulate(e)
    first = np.empty(len(s), bool)
    first[0] = True
    first[1:] = s[1:] > reach[:-1]
    heads = np.flatnonzero(first)
    return s[heads], np.maximum.reduceat(e, heads)
