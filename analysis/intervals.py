"""Vectorised interval arithmetic on int64 ns (numpy): unions, covered length, overlaps.

Busy time, compute-before-collective and compute-overlap all reduce to "how much of
[a, b) does a union of intervals cover". Merging the union once and keeping a prefix
sum of its lengths answers each query with two binary searches, so a rank with
millions of kernels and thousands of collectives costs O((n + q) log n), no loops.

Every operation also works per *group* (e.g. one union per rank of a batch of exports,
all at once): pass ``groups`` and each interval or query only meets its own group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from rankscope.analysis.groups import run_starts


class Union(NamedTuple):
    """Disjoint, sorted intervals and the cumulative covered length before each."""

    starts: np.ndarray
    ends: np.ndarray
    before: np.ndarray  # covered length of the merged intervals before index i (in its group)
    groups: np.ndarray | None = None  # group of each merged interval (ascending) when grouped


_I64_MIN, _I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def _i64(values: ArrayLike) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def _group_keys(groups: list[np.ndarray], values: list[np.ndarray]) -> tuple[list[np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """One int64 key per (group, value) pair, ordered by group then value, and the map
    from a key back to its value. Usually (a batch of ranks of one capture) every group
    fits one common value span: key = group * span + value, a handful of whole-array
    operations. Otherwise each group's values are shifted above all earlier groups'
    (linear time); where int64 cannot hold that (epoch ns leave ~2**62 of room), the
    values' dense ranks are spread apart instead (a sort)."""
    present = [i for i, g in enumerate(groups) if g.size]
    if not present:
        return [_i64(v) for v in values], lambda key: key
    g_low, g_high = _bounds([groups[i] for i in present])
    v_low, v_high = _bounds([values[i] for i in present])
    v_span = v_high - v_low + 1
    if (g_high - g_low + 1) * v_span < 2**62:
        keys = [(g - g_low) * v_span + (v - v_low) for g, v in zip(groups, values)]
        return keys, lambda key: key % v_span + v_low
    size = max((int(g.max()) + 1 for g in groups if g.size), default=0)
    count = sum(g.size for g in groups)
    if size > 2 * count + 1024 or min((int(g.min()) for g in groups if g.size), default=0) < 0:
        # Sparse group ids (e.g. packed keys): number them densely, in the same order.
        distinct, dense = np.unique(np.concatenate(groups), return_inverse=True)
        bounds = np.cumsum([0] + [g.size for g in groups])
        groups = [dense[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]
        size = distinct.size
    low = np.full(size, _I64_MAX)
    high = np.full(size, _I64_MIN)
    for group, value in zip(groups, values):
        np.minimum.at(low, group, value)
        np.maximum.at(high, group, value)
    present = high >= low
    span = np.where(present, high.astype(object) - low.astype(object) + 1, 0) if size else np.zeros(0, object)
    if sum(span.tolist()) < 2**62:
        span = span.astype(np.int64)
        shift = np.where(present, np.cumsum(span) - span - low, 0)
        keys = [value + shift[group] for group, value in zip(groups, values)]
        return keys, lambda key: key - shift[np.searchsorted(np.cumsum(span), key, side="right")]
    distinct, rank = np.unique(np.concatenate(values), return_inverse=True)
    bounds = np.cumsum([0] + [v.size for v in values])
    keys = [group * distinct.size + rank[lo:hi] for group, lo, hi in zip(groups, bounds[:-1], bounds[1:])]
    return keys, lambda key: distinct[key % distinct.size]


def _bounds(arrays: list[np.ndarray]) -> tuple[int, int]:
    """The least and greatest value of the (non-empty) arrays: each array once (`merge` gives
    its groups twice), one reduction each way over them joined (a reduction costs ~10k
    instructions whatever its length, two a few hundred values cost)."""
    distinct = list({id(array): array for array in arrays}.values())
    joined = distinct[0] if len(distinct) == 1 else np.concatenate(distinct)
    return int(np.minimum.reduce(joined)), int(np.maximum.reduce(joined))


def running_max(values: ArrayLike, groups: ArrayLike | None = None) -> np.ndarray:
    """Cumulative maximum of ``values``, restarting at each group (``groups`` ascending)."""
    values = _i64(values)
    if values.size == 0:
        return values
    if groups is None:
        return np.maximum.accumulate(values)
    (keys,), value_of = _group_keys([_i64(groups)], [values])
    return value_of(np.maximum.accumulate(keys))


def last_at_or_before(groups: ArrayLike, values: ArrayLike, q_groups: ArrayLike, q_values: ArrayLike) -> np.ndarray:
    """Per query: index of the last entry of its group whose value is <= the query's
    (entries sorted by group, then value); -1 where there is none."""
    groups, values = _i64(groups), _i64(values)
    q_groups, q_values = _i64(q_groups), _i64(q_values)
    (keys, q_keys), _ = _group_keys([groups, q_groups], [values, q_values])
    at = np.searchsorted(keys, q_keys, side="right") - 1
    ok = at >= 0
    ok[ok] = groups[at[ok]] == q_groups[ok]
    return np.where(ok, at, -1)


def sort_order(starts: ArrayLike, groups: ArrayLike) -> np.ndarray:
    """Stable order of intervals by group, then start. Unions of several subsets of the
    same intervals need one sort: take them in this order and `merge` with ``ordered``."""
    (keys,), _ = _group_keys([_i64(groups)], [_i64(starts)])
    return np.argsort(keys, kind="stable")


def merge(starts: ArrayLike, ends: ArrayLike, groups: ArrayLike | None = None, *, ordered: bool = False) -> Union:
    """Union of intervals [start, end) (empty or reversed ones ignored) as a :class:`Union`,
    one per group when ``groups`` is given; ``ordered``: they are sorted by group, then
    start already (`sort_order`)."""
    starts, ends = _i64(starts), _i64(ends)
    group = None if groups is None else _i64(groups)
    keep = ends > starts
    if not keep.all():  # most unions have no empty interval: no copies then
        starts, ends = starts[keep], ends[keep]
        group = None if group is None else group[keep]
    if starts.size == 0:
        empty = np.zeros(0, np.int64)
        return Union(empty, empty, empty, None if group is None else empty)
    if group is None:
        start_key, end_key, value_of = starts, ends, None
    else:
        (start_key, end_key), value_of = _group_keys([group, group], [starts, ends])
    if not ordered:
        order = np.argsort(start_key, kind="stable")
        starts, ends, start_key, end_key = starts[order], ends[order], start_key[order], end_key[order]
        group = None if group is None else group[order]
    reach_key = np.maximum.accumulate(end_key)  # keys keep groups apart
    reach = reach_key if value_of is None else value_of(reach_key)
    new = np.empty(starts.size, dtype=bool)
    new[0] = True
    # A new merged interval begins where a start lies beyond everything seen so far
    # (in its group: an earlier group's keys all lie below).
    new[1:] = start_key[1:] > reach_key[:-1]
    if group is not None:
        new[1:] |= group[1:] != group[:-1]
    first = np.flatnonzero(new)
    merged_starts = starts[first]
    merged_ends = reach[np.append(first[1:] - 1, starts.size - 1)]
    lengths = merged_ends - merged_starts
    before = np.cumsum(lengths) - lengths
    merged_groups = None
    if group is not None:
        merged_groups = group[first]
        opens = np.flatnonzero(run_starts(merged_groups))
        before = before - np.repeat(before[opens], np.diff(np.append(opens, merged_groups.size)))
    return Union(merged_starts, merged_ends, before, merged_groups)


def covered_until(union: Union, t: ArrayLike, groups: ArrayLike | None = None) -> np.ndarray:
    """Covered length of ``union`` in (-inf, t), per element of ``t`` (in its group)."""
    t = _i64(t)
    if union.starts.size == 0:
        return np.zeros(t.shape, np.int64)
    if union.groups is None:
        j = np.searchsorted(union.starts, t, side="right") - 1
    else:
        j = last_at_or_before(union.groups, union.starts, groups, t)
    jj = np.clip(j, 0, None)
    inside = np.clip(t - union.starts[jj], 0, union.ends[jj] - union.starts[jj])
    return np.where(j >= 0, union.before[jj] + inside, 0)


def overlap(union: Union, q_start: ArrayLike, q_end: ArrayLike, groups: ArrayLike | None = None) -> np.ndarray:
    """Per query [q_start, q_end): length covered by ``union`` (0 for empty queries);
    ``groups`` names each query's group when the union is grouped."""
    q_start, q_end = _i64(q_start), _i64(q_end)
    q_end = np.maximum(q_end, q_start)
    tiled = None if groups is None else np.tile(_i64(groups), 2)
    covered = covered_until(union, np.concatenate([q_start, q_end]), tiled)  # both ends in one lookup
    return covered[q_start.size :] - covered[: q_start.size]


def union_length(starts: ArrayLike, ends: ArrayLike, window: tuple[int, int] | None = None) -> int:
    """Length of the union of intervals, clipped to ``window`` = (start, end) if given."""
    union = merge(starts, ends)
    if window is None:
        return int((union.ends - union.starts).sum())
    return int(overlap(union, [window[0]], [window[1]])[0])


def length_by_group(union: Union, n_groups: int) -> np.ndarray:
    """Covered length of a grouped union, per group 0 .. n_groups - 1."""
    total = np.zeros(n_groups, np.int64)
    np.add.at(total, union.groups, union.ends - union.starts)
    return total


def gaps_before(q_start: ArrayLike, q_end: ArrayLike, first: ArrayLike,
                groups: ArrayLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For queries sorted by start (by group, then start when grouped): the gap from the
    previous query's end (``first``, a value or one per query, for a group's first query)
    to each start, as (gap_start, gap_end) with gap_end >= gap_start."""
    q_start, q_end = _i64(q_start), _i64(q_end)
    if q_start.size == 0:
        return q_start, q_start
    if groups is not None:
        groups = _i64(groups)
        opens = run_starts(groups)
    else:
        opens = np.zeros(q_start.size, bool)
        opens[0] = True
    reach = running_max(q_end, groups)
    previous_end = np.where(opens, np.broadcast_to(_i64(first), q_start.shape), np.concatenate(([0], reach[:-1])))
    gap_start = np.minimum(previous_end, q_start)
    return gap_start, q_start
