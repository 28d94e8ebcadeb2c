"""Straggler detection: root causes only, none in a balanced job, never a fixed count."""

from __future__ import annotations

import numpy as np
import pytest

from rankscope.analysis.pipeline import analyze
from rankscope.analysis.robust import nanmedian
from rankscope.analysis.testing import SyntheticJob, synthetic_job


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_job_flags_none(seed: int) -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=4, gpus_per_node=4, steps=30, jitter_ns=20_000, seed=seed))
    report = analyze(digests)
    assert report.stragglers == []


def test_straggler_flagged_and_its_node_mates_are_not() -> None:
    digests, truth = synthetic_job(SyntheticJob(nodes=4, gpus_per_node=4, steps=30, stragglers={6: 150_000}, seed=7))
    report = analyze(digests)
    assert report.stragglers == [6]
    by_rank = {r.rank: r for r in report.ranks}
    # propagation: node-mates 4, 5, 7 arrive late at the DP collectives too, yet are not flagged
    for mate in (4, 5, 7):
        assert by_rank[mate].late_mean_ns > 50_000
        assert mate in report.late_ranks
    assert by_rank[6].late_mean_ns == pytest.approx(truth.late_mean_ns[6], abs=1_000)
    assert by_rank[6].own_delay_ns > 100_000


def test_two_stragglers_on_different_nodes() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=4, gpus_per_node=4, steps=30, stragglers={1: 100_000, 14: 400_000}, seed=8))
    assert analyze(digests).stragglers == [1, 14]


def test_small_delays_below_the_minimum_effect_are_not_named() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=4, gpus_per_node=4, steps=30, jitter_ns=0, stragglers={3: 500}, seed=9))
    assert analyze(digests).stragglers == []


@pytest.mark.parametrize(
    "values",
    [[3.0], [4.0, 1.0], [5.0, np.nan, 1.0, 2.0], [0.1, 0.2, 0.7, np.nan, np.nan], [2**60 + 1, 2**60 + 3, 7]],
)
def test_median_is_numpys(values: list[float]) -> None:
    assert nanmedian(np.array(values)) == np.nanmedian(np.array(values, dtype=np.float64))


def test_median_of_nothing_is_nan() -> None:
    assert np.isnan(nanmedian(np.array([np.nan]))) and np.isnan(nanmedian(np.array([], dtype=np.int64)))
