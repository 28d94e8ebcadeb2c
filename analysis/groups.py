"""Rows grouped by integer keys: one stable sort, then per-group reductions in numpy.

The analysis groups a few ten thousand rows many times over (per instance, per rank,
per communicator); pandas' groupby costs milliseconds of fixed overhead per call,
which dominated the analysis. Keys are integer codes (``codes`` factorizes strings
once); groups are numbered 0 .. n-1 in ascending key order, like a sorted groupby.

The analysis' tables are mappings of column name to equal-length columns: numpy arrays,
`Coded` strings, or anything numpy takes as an array (tests' hand-made tables: lists,
pandas Series).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # arrays compare elementwise: identity, not value equality
class Coded:
    """A string column as int64 codes into its sorted distinct values (-1: missing).

    The analysis groups and compares strings (communicator, op, host) many times over;
    as codes that is numpy work, and the strings are decoded only for the report."""

    codes: np.ndarray  # int64
    values: np.ndarray  # object array of str, ascending
    every_value_used: bool = False  # as digest.columns makes them: `codes` need not renumber

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index: np.ndarray | slice) -> Coded:
        return Coded(self.codes[index], self.values)

    def tolist(self) -> list[str | None]:
        return np.append(self.values, None)[self.codes].tolist()  # -1 picks the appended None


ArrayLike = np.ndarray | Coded
Table = Mapping[str, ArrayLike]


def take(column: ArrayLike, index: np.ndarray) -> np.ndarray | Coded:
    """Rows of one column by position."""
    return column[index] if isinstance(column, Coded) else np.asarray(column)[index]


def codes(values: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Dense int64 codes in sorted order of the distinct values, and those values.

    Coded strings (what `digest.columns` makes) keep their codes; numbers are coded by
    numpy. Other values (strings of hand-made tables) are coded in Python, a missing one
    (None, NaN) as -1."""
    if isinstance(values, Coded):
        return (values.codes, values.values) if values.every_value_used else _compact(values.codes, values.values)
    array = np.asarray(values)
    if array.dtype.kind in "biu":
        uniques, labels = distinct_inverse(array)
        return labels, uniques
    items = array.tolist()
    distinct = sorted({value for value in items if value is not None and value == value})  # NaN != NaN
    position = {value: i for i, value in enumerate(distinct)}
    labels = np.array([position.get(value, -1) if value == value else -1 for value in items], np.int64)
    return labels, np.array(distinct, dtype=array.dtype if array.dtype.kind == "f" else object)


def _compact(labels: np.ndarray, categories: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Category codes renumbered over the categories in use (-1, missing, kept)."""
    labels = labels.astype(np.int64)
    used = np.bincount(labels[labels >= 0], minlength=len(categories)) > 0
    if used.all():
        return labels, categories
    dense = np.cumsum(used) - 1
    return np.where(labels >= 0, dense[labels], -1), categories[used]


def isin(values: ArrayLike, allowed: Iterable) -> np.ndarray:
    """Boolean mask of ``values`` found in ``allowed``, tested once per distinct value."""
    if isinstance(values, Coded):  # its dictionary as it is: missing (-1) picks the appended False
        return np.append(member_of(values.values, allowed), False)[values.codes]
    labels, uniques = codes(values)
    return member_of(uniques, allowed)[labels] if len(labels) else np.zeros(0, dtype=bool)


def factorize(values: Iterable) -> tuple[np.ndarray, list]:
    """(code of each value, distinct values), numbered in order of first appearance, as
    pandas' factorize without its setup cost on a few hundred hashable values."""
    index: dict = {}
    labels = np.array([index.setdefault(value, len(index)) for value in values], np.int64)
    return labels, list(index)


def member_of(values: np.ndarray, allowed: Iterable) -> np.ndarray:
    """Boolean mask of a few (distinct) ``values`` found in ``allowed``: set lookups, where
    np.isin's setup would cost more than the whole test."""
    allowed = set(allowed)
    return np.fromiter((v in allowed for v in values.tolist()), dtype=bool, count=len(values))


def in_sorted(values: ArrayLike, keys: np.ndarray) -> np.ndarray:
    """Boolean mask of integer ``values`` found in ``keys`` (ascending, unique), as np.isin:
    one binary search, where np.isin's setup costs 5-10x more at a few hundred rows."""
    values = np.asarray(values)
    if not len(keys):
        return np.zeros(len(values), dtype=bool)
    return keys[np.minimum(keys.searchsorted(values), len(keys) - 1)] == values


def run_starts(values: np.ndarray) -> np.ndarray:
    """True where a run of equal values begins (the first row, and each change)."""
    out = np.empty(values.size, bool)
    out[:1] = True
    np.not_equal(values[1:], values[:-1], out=out[1:])
    return out


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of integers, by one sort (np.unique's setup costs ~100k
    instructions, several times the work at a few hundred values)."""
    ranked = np.sort(values)
    return ranked[run_starts(ranked)]


def distinct_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` of integers, as `distinct`: their sorted
    distinct values and each one's index into them."""
    order = values.argsort(kind="stable")
    ranked = values[order]
    first = run_starts(ranked)
    inverse = np.empty(values.size, np.int64)
    inverse[order] = first.cumsum() - 1
    return ranked[first], inverse


def locate(keys: ArrayLike, queries: ArrayLike) -> np.ndarray:
    """For each query, the index of the equal key (keys unique); -1 where absent."""
    keys, queries = np.asarray(keys), np.asarray(queries)
    if not len(keys):
        return np.full(len(queries), -1, dtype=np.int64)
    order = np.argsort(keys)  # unique keys: any sort will do
    at = np.minimum(np.searchsorted(keys[order], queries), len(keys) - 1)
    return np.where(keys[order][at] == queries, order[at], -1)


def take_or(values: ArrayLike, index: np.ndarray, missing: float) -> np.ndarray:
    """``values[index]`` where the index is found (>= 0), else ``missing``."""
    values = np.asarray(values)
    out = np.full(len(index), missing, dtype=np.result_type(values.dtype, type(missing)))
    found = index >= 0
    out[found] = values[index[found]]
    return out


def pack(*keys: ArrayLike) -> np.ndarray:
    """One int64 per row, equal exactly where every key is equal."""
    keys = tuple(np.asarray(k, dtype=np.int64) for k in keys)
    combined = _combined(keys)
    return combined[0] if combined is not None else Groups(*keys).id


class Groups:
    """Rows grouped by one or more integer key arrays (equal length, no missing keys).

    ``within`` orders the rows inside each group (stable: ties keep input order), for
    ``cumcount``; otherwise rows keep their input order inside a group. ``ordered``: the
    rows are sorted by the keys already (e.g. another grouping's ``keys``), so no sort.
    """

    def __init__(self, *keys: ArrayLike, within: ArrayLike | None = None, ordered: bool = False) -> None:
        # Groups of a few hundred rows are built ~35 times per analysis: array methods
        # (argsort, nonzero, repeat) rather than their np.* wrappers, which cost more than
        # the work at that size.
        keys = tuple(np.asarray(k, dtype=np.int64) for k in keys)
        self.rows = rows = len(keys[0]) if keys else 0
        combined = None if ordered else _combined(keys)
        if ordered:
            order, change = np.arange(rows), run_starts(keys[0])
            for k in keys[1:]:
                change[1:] |= k[1:] != k[:-1]
        elif combined is None:  # key ranges too wide to pack into one int64
            sort_keys = keys if within is None else (*keys, np.asarray(within))
            # np.lexsort sorts by its last key first, and is stable.
            order = np.lexsort(sort_keys[::-1])
            change = np.zeros(rows, dtype=bool)
            for k in keys:
                change[1:] |= k[order][1:] != k[order][:-1]
        else:
            key, bound = combined
            if within is None:
                order = _argsort_codes(key, bound)
            else:
                by_within = np.asarray(within).argsort(kind="stable")
                order = by_within[_argsort_codes(key[by_within], bound)]
            ranked = key[order]
            change = np.empty(rows, dtype=bool)
            np.not_equal(ranked[1:], ranked[:-1], out=change[1:])
        if rows:
            change[0] = True
        self.order = order
        self.starts = starts = change.nonzero()[0]
        self.count = count = len(starts)
        self.size = size = np.empty(count, dtype=np.int64)
        np.subtract(starts[1:], starts[:-1], out=size[:-1])
        size[-1:] = rows - starts[-1:]
        self.id = np.empty(rows, dtype=np.int64)  # group of each row, in input order
        self.id[order] = np.arange(count).repeat(size)  # faster than a cumsum over bools
        at = order[starts]
        self.keys = [k[at] for k in keys]  # each group's key values

    def first_seen(self) -> np.ndarray:
        """Group ids renumbered by first appearance in the input (pandas' ``sort=False``)."""
        first_row = np.minimum.reduceat(self.order, self.starts) if self.rows else self.starts
        rank = np.empty(self.count, dtype=np.int64)
        rank[np.argsort(first_row, kind="stable")] = np.arange(self.count)
        return rank[self.id]

    def _sorted(self, values: ArrayLike) -> np.ndarray:
        return np.asarray(values)[self.order]

    def sum(self, values: ArrayLike) -> np.ndarray:
        """Sum per group: exact int64 for integers, float64 otherwise."""
        values = np.asarray(values)
        if values.dtype.kind in "biu":
            if not self.rows:
                return np.zeros(0, dtype=np.int64)
            return np.add.reduceat(values[self.order].astype(np.int64, copy=False), self.starts)
        return np.bincount(self.id, weights=values, minlength=self.count)

    def mean(self, values: ArrayLike) -> np.ndarray:
        """Mean per group, NaN skipped (NaN where a group has no value, as pandas)."""
        values = np.asarray(values, dtype=np.float64)
        seen = ~np.isnan(values)
        if seen.all():
            return self.sum(values) / self.size
        total = np.bincount(self.id, weights=np.where(seen, values, 0.0), minlength=self.count)
        count = np.bincount(self.id, weights=seen, minlength=self.count)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 0, total / count, np.nan)

    def std(self, values: ArrayLike) -> np.ndarray:
        """Sample standard deviation per group (ddof 1), NaN skipped; NaN below two values."""
        values = np.asarray(values, dtype=np.float64)
        seen = ~np.isnan(values)
        count = np.bincount(self.id, weights=seen, minlength=self.count)
        centred = np.where(seen, values - self.broadcast(self.mean(values)), 0.0)
        squares = np.bincount(self.id, weights=centred**2, minlength=self.count)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(count > 1, np.sqrt(squares / (count - 1)), np.nan)

    def max(self, values: ArrayLike) -> np.ndarray:
        return np.maximum.reduceat(self._sorted(values), self.starts) if self.rows else np.zeros(0)

    def min(self, values: ArrayLike) -> np.ndarray:
        return np.minimum.reduceat(self._sorted(values), self.starts) if self.rows else np.zeros(0)

    def first(self, values: ArrayLike) -> np.ndarray:
        return self._sorted(values)[self.starts]

    def first_valid(self, values: ArrayLike) -> np.ndarray:
        """First non-NaN value per group (NaN if none), as pandas' ``first``."""
        ranked = np.asarray(values, dtype=np.float64)[self.order]
        if not self.rows:
            return ranked
        position = np.where(np.isnan(ranked), self.rows, np.arange(self.rows))
        found = np.minimum.reduceat(position, self.starts)
        return np.where(found < self.rows, ranked[np.minimum(found, self.rows - 1)], np.nan)

    def any(self, mask: ArrayLike) -> np.ndarray:
        return np.bincount(self.id, weights=np.asarray(mask, dtype=np.float64), minlength=self.count) > 0

    def all(self, mask: ArrayLike) -> np.ndarray:
        return ~self.any(~np.asarray(mask, dtype=bool))

    def varies(self, values: ArrayLike) -> np.ndarray:
        """Whether each group holds more than one distinct value, NaN not counted."""
        ranked = self._sorted(np.asarray(values, dtype=np.float64))
        if not self.rows:
            return np.zeros(0, dtype=bool)
        return np.fmax.reduceat(ranked, self.starts) > np.fmin.reduceat(ranked, self.starts)

    def broadcast(self, per_group: np.ndarray) -> np.ndarray:
        """Each row's group value, in input order."""
        return np.asarray(per_group)[self.id]

    def cumcount(self) -> np.ndarray:
        """Position of each row within its group, in ``within`` order (else input order)."""
        position = np.arange(self.rows) - np.repeat(self.starts, self.size)
        out = np.empty(self.rows, dtype=np.int64)
        out[self.order] = position
        return out

    def _ranked(self, values: ArrayLike) -> np.ndarray:
        """Values sorted by group, then by value (ties are equal values: order is moot)."""
        values = np.asarray(values, dtype=np.float64)
        by_value = np.argsort(values)
        return values[by_value[_argsort_codes(self.id[by_value], self.count)]]

    def quantile(self, values: ArrayLike, q: float) -> np.ndarray:
        """Linear-interpolated quantile per group (NaN-free values), as pandas' groupby quantile."""
        return self.quantiles(values, (q,))[0]

    def quantiles(self, values: ArrayLike, qs: Iterable[float]) -> list[np.ndarray]:
        """`quantile` for each of ``qs``, the values sorted once."""
        ranked = self._ranked(values)
        out = []
        for q in qs:
            position = q * (self.size - 1)
            lo = np.floor(position).astype(np.int64)
            hi = np.minimum(lo + 1, self.size - 1)
            frac = position - lo
            low, high = ranked[self.starts + lo], ranked[self.starts + hi]
            out.append(low + (high - low) * frac)
        return out

    def median(self, values: ArrayLike) -> np.ndarray:
        """Median per group (NaN-free values): the mean of the two middle values."""
        ranked = self._ranked(values)
        low = ranked[self.starts + (self.size - 1) // 2]
        high = ranked[self.starts + self.size // 2]
        return (low + high) / 2


def _combined(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, int] | None:
    """The keys packed into one int64 with the same order, from 0 and below the bound
    returned with it, if their ranges fit."""
    if not keys or not len(keys[0]):
        return (np.zeros(0, dtype=np.int64), 1) if keys else None
    packed, capacity = None, 1
    for k in keys:
        # the ufuncs' reduce directly: ndarray.min/max go through a Python wrapper (~40 calls per analysis)
        low = int(np.minimum.reduce(k))
        span = int(np.maximum.reduce(k)) - low + 1
        if span == 1:  # a constant key (one communicator, one op) adds nothing: skip its arithmetic
            continue
        capacity *= span
        if capacity >= 1 << 62:
            return None
        packed = k - low if packed is None else packed * span + (k - low)
    return (np.zeros(len(keys[0]), dtype=np.int64) if packed is None else packed), capacity


def _argsort_codes(codes: np.ndarray, bound: int) -> np.ndarray:
    """Stable argsort of int64 codes in [0, bound): LSD radix passes over 16-bit digits
    (numpy radix-sorts 16-bit integers; wider ones fall back to a comparison sort)."""
    order = (codes if bound <= 1 << 16 else codes & 0xFFFF).astype(np.uint16).argsort(kind="stable")
    top = max(bound - 1, 0)
    shift = 16
    while top >> shift:
        digit = ((codes[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[digit.argsort(kind="stable")]
        shift += 16
    return order
