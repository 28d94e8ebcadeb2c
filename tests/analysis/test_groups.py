"""groups.py's numpy grouping against pandas and numpy on random keys: the analysis
stages rely on it returning exactly what a sorted groupby would."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rankscope.analysis.groups import Groups, distinct, distinct_inverse, factorize, in_sorted, run_starts
from rankscope.analysis.robust import median


@pytest.fixture(params=[0, 1, 2])
def frame(request) -> pd.DataFrame:
    rng = np.random.default_rng(request.param)
    n = 500
    return pd.DataFrame({
        "a": rng.integers(-3, 4, n),  # negative keys too
        "b": rng.integers(0, 5, n),
        "t": rng.permutation(n),  # distinct: a total order within groups
        "x": rng.normal(size=n),
    })


def test_factorize_numbers_in_order_of_first_appearance():
    values = ["b", "a", "b", None, "c", "a"]
    labels, distinct = factorize(values)
    expected, _ = pd.factorize(pd.Series(values, dtype=object), use_na_sentinel=False)
    assert labels.tolist() == expected.tolist()
    assert distinct == ["b", "a", None, "c"]  # values as they are (pandas turns None into NaN)


def test_groups_match_a_sorted_groupby(frame):
    groups = Groups(frame["a"], frame["b"], within=frame["t"])
    by = frame.groupby(["a", "b"], sort=True)
    assert [k.tolist() for k in groups.keys] == [by.size().index.get_level_values(i).tolist() for i in (0, 1)]
    assert groups.size.tolist() == by.size().tolist()
    assert np.allclose(groups.median(frame["x"]), by["x"].median())
    p50, p99 = groups.quantiles(frame["x"], (0.5, 0.99))
    assert np.allclose(p50, by["x"].quantile(0.5)) and np.allclose(p99, by["x"].quantile(0.99))
    ordered = frame.sort_values("t")
    expected = ordered.groupby(["a", "b"]).cumcount().reindex(frame.index)
    assert groups.cumcount().tolist() == expected.tolist()


def test_groups_of_rows_already_in_key_order_need_no_sort(frame):
    ordered = frame.sort_values(["a", "b"], kind="stable")
    fast, sorted_ = Groups(ordered["a"], ordered["b"], ordered=True), Groups(ordered["a"], ordered["b"])
    assert [k.tolist() for k in fast.keys] == [k.tolist() for k in sorted_.keys]
    assert fast.size.tolist() == sorted_.size.tolist()
    assert np.array_equal(fast.median(ordered["x"]), sorted_.median(ordered["x"]))


def test_run_starts_and_in_sorted():
    values = np.array([1, 1, 2, 2, 2, 1, 3])
    assert run_starts(values).tolist() == [True, False, True, False, False, True, True]
    keys = np.array([-2, 0, 5, 9])
    queries = np.array([-3, -2, 1, 5, 9, 10])
    assert in_sorted(queries, keys).tolist() == np.isin(queries, keys).tolist()
    assert in_sorted(queries, keys[:0]).tolist() == [False] * len(queries)


@pytest.mark.parametrize("values", [
    np.array([], np.int64), np.array([7]), np.array([3, -1, 3, 2**62, -(2**62), 0, 3]),
    np.random.default_rng(3).integers(-5, 6, 400), np.array([2**64 - 1, 0, 5, 2**64 - 1], np.uint64),
    np.array([True, False, True]),
])
def test_distinct_is_np_unique(values):
    uniques, inverse = np.unique(values, return_inverse=True)
    assert distinct(values).tolist() == uniques.tolist() and distinct(values).dtype == uniques.dtype
    got, got_inverse = distinct_inverse(values)
    assert got.tolist() == uniques.tolist() and got_inverse.tolist() == inverse.tolist()


@pytest.mark.parametrize("values", [
    [5.0], [2.0, 1.0], [3, 1, 2], np.random.default_rng(4).normal(size=101), np.random.default_rng(5).normal(size=100) * 1e9,
    np.random.default_rng(6).integers(0, 10**12, 40),
])
def test_median_is_np_median_to_the_bit(values):
    assert median(np.asarray(values)).tobytes() == np.float64(np.median(values)).tobytes()
