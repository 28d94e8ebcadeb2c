"""Interval helpers against a brute-force per-nanosecond count."""

from __future__ import annotations

import numpy as np

from rankscope.analysis import intervals


def _brute(starts, ends, lo, hi) -> int:
    covered = np.zeros(hi - lo, bool)
    for s, e in zip(starts, ends):
        covered[max(s, lo) - lo : max(min(e, hi), lo) - lo] = True
    return int(covered.sum())


def test_union_length_merges_overlaps_and_clips_to_window() -> None:
    starts, ends = [0, 5, 20, 21, 40], [10, 12, 25, 22, 40]
    assert intervals.union_length(starts, ends) == 12 + 5
    assert intervals.union_length(starts, ends, window=(6, 23)) == 6 + 3
    assert intervals.union_length([], []) == 0


def test_overlap_with_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    b_start = rng.integers(0, 900, 60)
    b_end = b_start + rng.integers(0, 80, 60)
    q_start = rng.integers(0, 950, 40)
    q_end = q_start + rng.integers(0, 120, 40)
    got = intervals.overlap_with(q_start, q_end, b_start, b_end)
    expected = [_brute(b_start, b_end, s, e) for s, e in zip(q_start, q_end)]
    assert got.tolist() == expected


def test_epoch_ns_stay_exact_int64() -> None:
    base = 1_779_782_390_288_293_742  # > 2**53: float64 would round
    union = intervals.merge([base, base + 10], [base + 5, base + 17])
    assert intervals.overlap(union, [base + 1], [base + 11]).tolist() == [4 + 1]
    assert union.starts.dtype == np.int64


def test_gaps_before_start_at_previous_end_and_never_go_negative() -> None:
    gap_start, gap_end = intervals.gaps_before([10, 30, 35], [20, 40, 50], first=0)
    assert gap_start.tolist() == [0, 20, 35]  # third overlaps the second: empty gap
    assert gap_end.tolist() == [10, 30, 35]
