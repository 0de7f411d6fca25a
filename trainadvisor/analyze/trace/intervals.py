"""Arithmetic on unions of [start, end) intervals (microseconds), held as numpy arrays."""

from __future__ import annotations

import numpy as np

Intervals = list[tuple[float, float]]


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
    """Sorted, disjoint union of spans given as arrays (touching spans join)."""
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
