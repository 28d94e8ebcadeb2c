"""Vectorised interval arithmetic on int64 ns (numpy): unions, covered length, overlaps.

Busy time, compute-before-collective and compute-overlap all reduce to "how much of
[a, b) does a union of intervals cover". Merging the union once and keeping a prefix
sum of its lengths answers each query with two binary searches, so a rank with
millions of kernels and thousands of collectives costs O((n + q) log n), no loops.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Union(NamedTuple):
    """Disjoint, sorted intervals and the cumulative covered length before each."""

    starts: np.ndarray
    ends: np.ndarray
    before: np.ndarray  # covered length of all merged intervals before index i


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def merge(starts, ends) -> Union:
    """Union of intervals [start, end) (empty or reversed ones ignored) as a :class:`Union`."""
    starts, ends = _i64(starts), _i64(ends)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        empty = np.zeros(0, np.int64)
        return Union(empty, empty, empty)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # A new merged interval begins where a start lies beyond everything seen so far.
    new = np.empty(starts.size, dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    merged_starts = starts[new]
    merged_ends = np.zeros(merged_starts.size, np.int64)
    np.maximum.at(merged_ends, group, reach)
    lengths = merged_ends - merged_starts
    before = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return Union(merged_starts, merged_ends, before)


def covered_until(union: Union, t) -> np.ndarray:
    """Covered length of ``union`` in (-inf, t), per element of ``t``."""
    t = _i64(t)
    if union.starts.size == 0:
        return np.zeros(t.shape, np.int64)
    j = np.searchsorted(union.starts, t, side="right") - 1
    jj = np.clip(j, 0, None)
    inside = np.clip(t - union.starts[jj], 0, union.ends[jj] - union.starts[jj])
    return np.where(j >= 0, union.before[jj] + inside, 0)


def overlap(union: Union, q_start, q_end) -> np.ndarray:
    """Per query [q_start, q_end): length covered by ``union`` (0 for empty queries)."""
    q_start, q_end = _i64(q_start), _i64(q_end)
    q_end = np.maximum(q_end, q_start)
    return covered_until(union, q_end) - covered_until(union, q_start)


def overlap_with(a_start, a_end, b_start, b_end) -> np.ndarray:
    """Per interval of a: length overlapped by the union of the b intervals."""
    return overlap(merge(b_start, b_end), a_start, a_end)


def union_length(starts, ends, window: tuple[int, int] | None = None) -> int:
    """Length of the union of intervals, clipped to ``window`` = (start, end) if given."""
    union = merge(starts, ends)
    if window is None:
        return int((union.ends - union.starts).sum())
    return int(overlap(union, [window[0]], [window[1]])[0])


def gaps_before(q_start, q_end, first: int) -> tuple[np.ndarray, np.ndarray]:
    """For queries sorted by start: the gap from the previous query's end (``first`` for
    the first query) to each start, as (gap_start, gap_end) with gap_end >= gap_start."""
    q_start, q_end = _i64(q_start), _i64(q_end)
    if q_start.size == 0:
        return q_start, q_start
    previous_end = np.concatenate(([first], np.maximum.accumulate(q_end)[:-1]))
    gap_start = np.minimum(previous_end, q_start)
    return gap_start, q_start
