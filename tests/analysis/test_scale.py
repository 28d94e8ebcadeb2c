"""Issue 2, "must show" 2: a simulated 8 x 8 job (TP=8) through ingest and analysis.

Two injected stragglers on different nodes (one extra compute, one late launch),
node clocks off by up to +-20 ms and drifting up to +-50 ppm: exactly the two are
flagged, relative clock offsets are recovered to a median within 5 us, their lateness
within 10 us of the simulator's truth; the same job without stragglers flags none.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rankscope.analysis import simulate as sim
from rankscope.analysis import sources
from rankscope.analysis.pipeline import analyze
from rankscope.analysis.report import Report


STRAGGLERS = (sim.Straggler(13, "compute", 2 * sim.MS), sim.Straggler(42, "launch", 1 * sim.MS))


def _run(tmp: Path, stragglers: tuple) -> tuple[Report, dict]:
    spec = sim.JobSpec(nodes=8, gpus_per_node=8, tp=8, steps=12, stragglers=stragglers,
                       max_offset_ns=20 * sim.MS, max_drift_ppm=50.0, seed=5)
    sim.simulate(spec, tmp)
    return analyze(sources.load_digests([tmp])), sim.truth(spec)


@pytest.fixture(scope="module")
def with_stragglers(tmp_path_factory) -> tuple[Report, dict]:
    return _run(tmp_path_factory.mktemp("stragglers"), STRAGGLERS)


def test_exactly_the_two_stragglers_are_flagged(with_stragglers) -> None:
    report, truth = with_stragglers
    assert truth["stragglers"] == [13, 42]
    assert report.stragglers == [13, 42]
    causes = {r.rank: r.late_cause for r in report.ranks if r.rank in report.stragglers}
    assert causes == {13: "compute", 42: "launch/host"}
    # their TP groups arrive late at the DP collectives too, yet are not root causes
    assert {8, 9, 10, 11, 12, 14, 15} <= set(report.late_ranks)


def test_relative_clock_offsets_recovered(with_stragglers) -> None:
    report, truth = with_stragglers
    hosts = {h.host: h for h in report.alignment.hosts}
    t0 = truth["t0_utc_ns"]
    at = t0 + 20 * sim.MS  # a common instant inside the captured steps
    true = np.array([n["offset_ns"] + n["drift_ppm"] * 1e-6 * (at - t0) for n in truth["nodes"]])
    est = np.array([
        hosts[n["host"]].offset_ns + hosts[n["host"]].drift_ppm * 1e-6 * (at - report.alignment.t0_ns)
        for n in truth["nodes"]
    ])
    assert np.ptp(true) > 10 * sim.MS  # the test has something to recover
    error = np.abs((est - est.mean()) - (true - true.mean()))
    assert np.median(error) < 5_000
    assert report.alignment.happens_before_violations == 0


def test_straggler_lateness_matches_truth(with_stragglers) -> None:
    report, truth = with_stragglers
    by_rank = {r.rank: r for r in report.ranks}
    for entry in truth["ranks"]:
        if entry["rank"] in truth["stragglers"]:
            assert by_rank[entry["rank"]].late_mean_ns == pytest.approx(entry["late_mean_ns"], abs=10_000)
            assert entry["late_mean_ns"] > 100_000


def test_balanced_job_flags_none(tmp_path) -> None:
    report, _ = _run(tmp_path, ())
    assert report.stragglers == []
    assert report.alignment.happens_before_violations == 0
