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


def test_overlap_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    b_start = rng.integers(0, 900, 60)
    b_end = b_start + rng.integers(0, 80, 60)
    q_start = rng.integers(0, 950, 40)
    q_end = q_start + rng.integers(0, 120, 40)
    got = intervals.overlap(intervals.merge(b_start, b_end), q_start, q_end)
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


def test_grouped_operations_match_each_group_alone() -> None:
    rng = np.random.default_rng(11)
    base = 1_779_782_390_288_293_742
    groups = rng.integers(0, 5, 300)
    starts = base + rng.integers(0, 5_000, 300)
    ends = starts + rng.integers(-20, 200, 300)  # some empty or reversed: ignored
    union = intervals.merge(starts, ends, groups)
    q_group = rng.integers(0, 6, 80)  # group 5 has no intervals
    q_start = base + rng.integers(-100, 5_100, 80)
    q_end = q_start + rng.integers(0, 400, 80)
    got = intervals.overlap(union, q_start, q_end, q_group)
    for g in range(6):
        alone = intervals.merge(starts[groups == g], ends[groups == g])
        mine = q_group == g
        assert got[mine].tolist() == intervals.overlap(alone, q_start[mine], q_end[mine]).tolist()
    totals = intervals.length_by_group(union, 6)
    assert totals.tolist() == [intervals.union_length(starts[groups == g], ends[groups == g]) for g in range(6)]


def test_grouped_gaps_and_running_max_restart_per_group() -> None:
    groups = np.array([0, 0, 0, 1, 1])
    gap_start, gap_end = intervals.gaps_before([10, 30, 35, 5, 50], [20, 40, 50, 60, 70], first=np.array([0, 0, 0, 3, 3]), groups=groups)
    assert gap_start.tolist() == [0, 20, 35, 3, 50]
    assert gap_end.tolist() == [10, 30, 35, 5, 50]
    assert intervals.running_max([5, 1, 7, 2, 1], [0, 0, 0, 1, 1]).tolist() == [5, 5, 7, 2, 2]
    assert intervals.last_at_or_before([0, 0, 1], [10, 20, 5], [0, 0, 1, 1, 2], [9, 25, 5, 4, 100]).tolist() == [-1, 1, 2, -1, -1]


def test_grouped_operations_when_groups_cannot_be_shifted_apart_in_int64() -> None:
    # Spans this wide leave int64 no room to lay groups side by side: ranks are used.
    far = 2**62
    groups = np.array([0, 0, 1, 1, 2])
    starts = np.array([-far, far, -far + 10, 0, 7])
    ends = starts + np.array([100, 100, 100, 100, 100])
    union = intervals.merge(starts, ends, groups)
    assert intervals.length_by_group(union, 3).tolist() == [200, 200, 100]
    assert intervals.overlap(union, [far + 50, -far + 60, 0], [far + 500, -far + 70, 1000], [0, 1, 2]).tolist() == [50, 10, 100]
    assert intervals.running_max([far, -far, 3, -far], [0, 0, 1, 1]).tolist() == [far, far, 3, 3]


def test_sparse_group_ids_work_like_dense_ones() -> None:
    sparse = np.array([5 << 40, 5 << 40, 9 << 40])  # packed (file, pid) keys
    assert intervals.last_at_or_before(sparse, [10, 20, 5], [5 << 40, 9 << 40, 7], [15, 6, 1]).tolist() == [0, 2, -1]
    assert intervals.running_max([3, 1, 2], sparse).tolist() == [3, 3, 2]


def test_groups_far_apart_in_time_are_keyed_by_their_own_spans() -> None:
    # No common span fits int64 for both groups, each group's own span does.
    far = 2**61
    groups = np.array([0, 0, 1, 1])
    starts = np.array([0, 5, far, far + 5])
    union = intervals.merge(starts, starts + 10, groups)
    assert intervals.length_by_group(union, 2).tolist() == [15, 15]
    assert intervals.running_max([7, 3, far + 1, far], groups).tolist() == [7, 7, far + 1, far + 1]


def test_merge_of_presorted_subsets_matches_merge() -> None:
    rng = np.random.default_rng(3)
    base = 1_779_782_390_288_293_742
    groups = rng.integers(0, 4, 200)
    starts = base + rng.integers(0, 2_000, 200)
    ends = starts + rng.integers(-10, 100, 200)
    subset = rng.random(200) < 0.5
    order = intervals.sort_order(starts, groups)
    for mask in (subset, ~subset, np.ones(200, bool)):
        keep = mask[order]
        got = intervals.merge(starts[order][keep], ends[order][keep], groups[order][keep], ordered=True)
        expected = intervals.merge(starts[mask], ends[mask], groups[mask])
        assert all(np.array_equal(a, b) for a, b in zip(got, expected))
