"""Jobs whose nodes' capture windows start a whole step apart: communicators of one call per
step, all alike, matched by call order one call off, and what the analysis makes of them."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.analysis import matching, pipeline, simulate
from rankscope.analysis.pipeline import analyze
from rankscope.analysis.report import Report
from rankscope.analysis.sources import load_digests
from rankscope.errors import RankscopeWarning

FITTED = "on the clocks fitted from the other communicators"
# The warnings a cut or moved capture window gives, and none other: calls at the window's
# edges dropped, members' counts unequal, members inferred, captures re-aligned, and hints
# that disagree with the fitted clocks.
DROPPED = r"communicator \w+: \d+ instance\(s\) missing a participant \(capture window edges\?\); dropped$"
EXPECTED = (
    DROPPED,
    r"communicator \w+: members captured \d+ to \d+ calls; ordinal matching checks op and size",
    r"\d+ communicator\(s\) without member lists \([^)]*\): members inferred from the ranks that use them$",
    r"communicator \w+: (rank \d+'s capture|the capture of rank\(s\) [\d,…-]+) is \d+ call\(s\) (behind|ahead of) "
    r"(rank \d+'s|its host's other members); re-aligned on (the gaps between end times|shared-clock end times"
    r"|the clocks fitted from the other communicators|the coordinator's clock offsets)$",
    r"host [\w-]+: collective-fitted clock offset differs from the coordinator's by [\d.]+ ms; ",
)


@contextlib.contextmanager
def _warned() -> Iterator[None]:
    """The block's RankscopeWarnings: calls dropped at the window's edges among them, and each
    one of `EXPECTED` (a bare pytest.warns would take any warning as expected)."""
    with pytest.warns(RankscopeWarning) as seen:
        yield
    messages = [str(w.message) for w in seen if issubclass(w.category, RankscopeWarning)]
    assert any(re.match(DROPPED, m) for m in messages), messages
    assert [m for m in messages if not any(re.match(p, m) for p in EXPECTED)] == []


@pytest.fixture
def gaps_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gap stage across hosts as it was before moved windows: a member looked at only
    beyond 1/200 of a gap, and shifted within the 8 calls tried. The later re-alignments (on
    fitted clocks, on the coordinator's) are for cuts the gaps cannot tell: where the gaps of
    one step's calls are alike to within the ends' skew. The simulator's µs of jitter now let
    the gaps tell these scenarios (`test_start_cuts_the_gaps_tell_apart_are_realigned_on_them`),
    so the tests of the later stages run with the new rules off, on the same scenarios."""
    monkeypatch.setattr(matching, "GAP_FLOOR_RATIO", float("inf"))
    monkeypatch.setattr(matching, "MIN_MOVED_GAPS", 1 << 30)


def _cut(folder: Path, ranks: dict[int, int]) -> None:
    """Delete from each rank's export (rank -> steps) everything before its step's NVTX range:
    a capture window that started that many steps late."""
    for rank, steps in ranks.items():
        with sqlite3.connect(folder / f"sim_rank{rank:05d}.sqlite") as db:
            (start,) = db.execute(
                "SELECT e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                "WHERE coalesce(e.text, s.value) = ?", (f"step {steps}",)).fetchone()
            for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
                db.execute(f"DELETE FROM {table} WHERE start < ?", (start,))


def _cut_job(tmp_path: Path, spec: simulate.JobSpec, ranks: dict[int, int]) -> tuple[Report, dict]:
    """The report of the simulated job with ``ranks`` cut (`_cut`), and its truth."""
    simulate.simulate(spec, tmp_path)
    _cut(tmp_path, ranks)
    with _warned():
        report = analyze(load_digests([tmp_path]))
    return report, simulate.truth(spec)


def _clock_errors(report: Report, truth: dict) -> tuple[float, float]:
    """The largest gauge-free error of the hosts' fitted offsets (ns) and drifts (ppm)."""
    nodes = {n["host"]: n for n in truth["nodes"]}
    fitted = [(h.offset_ns, h.drift_ppm, nodes[h.host]["offset_ns"], nodes[h.host]["drift_ppm"])
              for h in report.alignment.hosts]
    mean = [sum(column) / len(fitted) for column in zip(*fitted)]
    return (max(abs(f[0] - mean[0] - (f[2] - mean[2])) for f in fitted),
            max(abs(f[1] - mean[1] - (f[3] - mean[3])) for f in fitted))


@pytest.mark.parametrize(("seed", "cut", "realigned"), [
    (0, {r: 1 for r in range(4)}, 2),  # two of the four DP groups re-aligned on their gaps: the fit goes wild
    (0, {r: 2 for r in range(4, 8)}, 3),  # node 1 two steps late
    (2, {r: 1 for r in range(4)}, 3),  # one re-aligned on its gaps: the fit follows the three shifted
])
def test_dp_groups_a_late_capture_shifted_are_realigned_on_the_clocks_fitted_from_the_others(
        tmp_path: Path, gaps_alike: None, seed: int, cut: dict[int, int], realigned: int) -> None:
    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=10, seed=seed,
                            stragglers=(simulate.Straggler(5, "compute", 2 * simulate.MS),))
    report, truth = _cut_job(tmp_path, spec, cut)
    assert len([w for w in report.warnings if FITTED in w and "re-aligned" in w]) == realigned
    assert report.alignment.happens_before_violations == 0
    offset, drift = _clock_errors(report, truth)
    assert offset < 10_000 and drift < 10  # was ms and thousands of ppm
    assert report.stragglers == [5] and set(report.late_ranks) == {4, 5, 6, 7}  # node 1 waits for rank 5


def test_suspects_that_alone_link_the_hosts_are_left_as_matched(tmp_path: Path, gaps_alike: None) -> None:
    """Ranks 0 and 1 cut one and two steps: neither DP group re-aligned on its gaps, so no
    calls are left to fit the clocks from; the violations stay, reported."""
    spec = simulate.JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=10, seed=0,
                            stragglers=(simulate.Straggler(3, "compute", 2 * simulate.MS),))
    report, _ = _cut_job(tmp_path, spec, {0: 1, 1: 2})
    assert not [w for w in report.warnings if FITTED in w]
    assert report.alignment.happens_before_violations > 0


def test_a_cut_past_the_shifts_tried_is_not_made_to_agree_on_clocks_whole_steps_off(
        tmp_path: Path, gaps_alike: None) -> None:
    """Node 0 cut 9 of 20 steps, one more than the shifts tried: one DP group is re-aligned on
    its gaps 1 call (8 off), and the others, shifted 1 on clocks fitted from it, agreed with it
    on clocks 52 ms (8 steps) off with no happens-before violation left. A shift that leaves
    calls unpaired at both edges is not taken: the violations stay, reported."""
    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=20, seed=0,
                            stragglers=(simulate.Straggler(5, "compute", 2 * simulate.MS),))
    report, truth = _cut_job(tmp_path, spec, {r: 9 for r in range(4)})
    offset, _ = _clock_errors(report, truth)
    assert report.alignment.happens_before_violations > 0 or offset < 10_000
    assert not [w for w in report.warnings if FITTED in w and "re-aligned" in w]


HINTED = "re-aligned on the coordinator's clock offsets"


def _hinted_job(tmp_path: Path, spec: simulate.JobSpec, ranks: dict[int, int], noise_ns: tuple[int, ...],
                ) -> tuple[Report, dict]:
    """The report of the simulated job with ``ranks`` cut (`_cut`), analysed with clock hints
    off each node's true offset by ``noise_ns``, and its truth."""
    simulate.simulate(spec, tmp_path)
    _cut(tmp_path, ranks)
    truth = simulate.truth(spec)
    hints = {n["host"]: n["offset_ns"] + noise for n, noise in zip(truth["nodes"], noise_ns)}
    with _warned():
        report = analyze(load_digests([tmp_path]), clock_hints=hints)
    return report, truth


@pytest.mark.parametrize(("tp", "gpus", "seed", "cut", "steps", "realigned"), [
    (4, 4, 1, {r: 1 for r in range(4)}, 10, 4),  # every DP group one call off: no violation, the fit 6.6 ms off
    (2, 2, 0, {0: 1, 1: 1}, 10, 2),  # TP=2: only the DP groups link the hosts
    (4, 4, 0, {r: 3 for r in range(4)}, 20, 4),  # three steps: the fit 19.7 ms off
    (4, 4, 0, {r: 9 for r in range(4)}, 20, 4),  # nine steps, one taken on the gaps 8 off: the fit 59 ms off
])
def test_communicators_all_shifted_alike_are_realigned_on_the_coordinators_clock_offsets(
        tmp_path: Path, gaps_alike: None, tp: int, gpus: int, seed: int, cut: dict[int, int], steps: int,
        realigned: int) -> None:
    spec = simulate.JobSpec(nodes=2, gpus_per_node=gpus, tp=tp, steps=steps, seed=seed,
                            stragglers=(simulate.Straggler(gpus + 1, "compute", 2 * simulate.MS),))
    report, truth = _hinted_job(tmp_path, spec, cut, (500_000, -500_000))
    assert len([w for w in report.warnings if HINTED in w]) == realigned
    assert not [w for w in report.warnings if "differs from the coordinator's" in w]
    assert report.alignment.happens_before_violations == 0
    offset, _ = _clock_errors(report, truth)
    assert offset < 10_000  # was one step period or more
    assert report.stragglers == [gpus + 1]


def test_hints_that_agree_with_the_fit_change_nothing(tmp_path: Path, gaps_alike: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut the gaps and the fitted clocks re-align: the fit agrees with the hints, and the
    matching is not done again on them."""
    monkeypatch.setattr(pipeline, "_realigned_on_hint_clocks", lambda *args: pytest.fail("re-aligned on the hints"))
    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=2, steps=10, seed=0,
                            stragglers=(simulate.Straggler(5, "compute", 2 * simulate.MS),))
    report, truth = _hinted_job(tmp_path, spec, {r: 1 for r in range(4)}, (500_000, -500_000))
    assert not [w for w in report.warnings if "coordinator" in w]
    assert _clock_errors(report, truth)[0] < 10_000


def test_hints_too_coarse_for_the_call_spacing_change_nothing(tmp_path: Path, gaps_alike: None,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Hints 5.2 ms apart from the truth on a 6.6 ms step, far past their ~1 ms: on them no
    shift makes ends miss by under a quarter step, so the re-alignment tried is declined and
    the matching stays as it was, the disagreement warned."""
    tried = []
    realign = pipeline._realigned_on_hint_clocks
    monkeypatch.setattr(pipeline, "_realigned_on_hint_clocks", lambda *args: tried.append(realign(*args)))
    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=10, seed=1,
                            stragglers=(simulate.Straggler(5, "compute", 2 * simulate.MS),))
    report, truth = _hinted_job(tmp_path, spec, {r: 1 for r in range(4)}, (2_600_000, -2_600_000))
    assert not [w for w in report.warnings if HINTED in w]
    assert [w for w in report.warnings if "differs from the coordinator's" in w]
    assert _clock_errors(report, truth)[0] > 5_000_000  # one step off, as without hints
    assert tried == [None]


def _moved(paths: list[Path], late_ns: int, gpus_per_node: int = 4) -> None:
    """Capture windows of one length, the last node's (its last exports) ``late_ns`` later
    than the others', on each node's clock: each export less its rows outside its window (a
    kernel whose API range began before the window keeps no range, so no payload)."""
    last = len(paths) - gpus_per_node
    for group, (late, early) in ((paths[last:], (late_ns, 0)), (paths[:last], (0, late_ns))):
        spans = []
        for path in group:
            with contextlib.closing(sqlite3.connect(path)) as db:
                spans.append(db.execute("SELECT min(start), max(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone())
        window = (min(s[0] for s in spans) + late, max(s[1] for s in spans) - early)
        for path in group:
            with contextlib.closing(sqlite3.connect(path)) as db, db:
                for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"):
                    db.execute(f"DELETE FROM {table} WHERE start < ? OR start > ?", window)


def test_kernels_whose_api_range_the_window_cut_off_are_their_streams_communicators(tmp_path: Path) -> None:
    """The last node's window 10 ms later: its first NCCL kernels' API ranges began before
    it, so they named no communicator and were grouped by op into communicators of their
    own ({11}, {9,10,11}), and their groups counted a call short: 52 happens-before
    violations and clocks 5 ms off. A stream is one group's (PyTorch's NCCL streams), so
    they are that group's calls."""
    spec = simulate.JobSpec(nodes=3, gpus_per_node=4, tp=2, steps=14, dp_sharded=True, seed=2, jitter_ns=3000)
    _moved(sorted(simulate.simulate(spec, tmp_path)), 10 * simulate.MS)
    with _warned():
        report = analyze(load_digests([tmp_path]))
    truth = simulate.truth(spec)
    assert sorted(c.ranks for c in report.communicators) == sorted(c["ranks"] for c in truth["communicators"])
    assert report.alignment.happens_before_violations == 0
    assert _clock_errors(report, truth)[0] < 10_000
    assert [w for w in report.warnings if "taken as the one every other NCCL kernel on their stream names" in w]


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_a_window_moved_past_the_shifts_tried_is_realigned_on_the_gaps_of_its_calls(tmp_path: Path, seed: int) -> None:
    """The last node's window 45 ms (~7 steps, 14 DP calls) later: the members' counts alike,
    their calls paired 14 off, past the 8 shifts tried, and the DP groups' gaps, one step's
    work each, alike but for the jitter, within 1/200 of a gap: seed 0's clocks 20 ms off
    with no happens-before violation, seeds 1 and 3 9 and 27 ms off with 35 and 39. Gaps
    4x further off than the closest members' are looked at, and a shift further on taken
    where it clearly fits best."""
    spec = simulate.JobSpec(nodes=3, gpus_per_node=4, tp=2, steps=14, dp_sharded=True, seed=seed, jitter_ns=3000)
    _moved(sorted(simulate.simulate(spec, tmp_path)), 45 * simulate.MS)
    with _warned():
        report = analyze(load_digests([tmp_path]))
    assert report.alignment.happens_before_violations == 0
    assert _clock_errors(report, simulate.truth(spec))[0] < 10_000
    assert [w for w in report.warnings if "re-aligned on the gaps between end times" in w]


@pytest.mark.parametrize(("tp", "gpus", "seed", "cut", "steps"), [
    (4, 4, 0, {r: 1 for r in range(4)}, 10),  # two of the four DP groups re-aligned on their gaps before too
    (2, 2, 0, {0: 1, 1: 2}, 10),  # was left as matched, the violations reported
    (4, 4, 0, {r: 9 for r in range(4)}, 20),  # past the 8 shifts tried: was left as matched
    (4, 4, 1, {r: 1 for r in range(4)}, 10),  # every DP group one call off: was 6.6 ms off on no violation
])
def test_start_cuts_the_gaps_tell_apart_are_realigned_on_them(
        tmp_path: Path, tp: int, gpus: int, seed: int, cut: dict[int, int], steps: int) -> None:
    """Start cuts of the tests above, their DP groups' gaps a step apart but for the
    simulator's µs of jitter, 10x their members' µs when aligned: re-aligned on them."""
    spec = simulate.JobSpec(nodes=2, gpus_per_node=gpus, tp=tp, steps=steps, seed=seed,
                            stragglers=(simulate.Straggler(gpus + 1, "compute", 2 * simulate.MS),))
    report, truth = _cut_job(tmp_path, spec, cut)
    assert [w for w in report.warnings if "re-aligned on the gaps between end times" in w]
    assert report.alignment.happens_before_violations == 0
    assert _clock_errors(report, truth)[0] < 10_000
    assert report.stragglers == [gpus + 1]


def test_a_rank_microseconds_past_its_peers_is_not_named_beside_a_straggler_a_millisecond_past(tmp_path: Path) -> None:
    """Found in a sweep of moved windows, once their clocks came out right: 6 ranks, 8
    instances common to all, rank 2 slowed 2 ms. Rank 1 (own delay 12.5 µs, its peers' a few)
    stood above the lowest jump in own delay with rank 2 (1 ms), and both were named."""
    spec = simulate.JobSpec(nodes=3, gpus_per_node=2, tp=1, steps=10, tp_collectives=4, barrier=True,
                            jitter_ns=10_000, seed=672, stragglers=(simulate.Straggler(2, "compute", 2 * simulate.MS),))
    _moved(sorted(simulate.simulate(spec, tmp_path)), 23_707_478, gpus_per_node=2)
    with _warned():
        report = analyze(load_digests([tmp_path]))
    assert _clock_errors(report, simulate.truth(spec))[0] < 10_000
    assert report.stragglers == [2]


def test_a_whole_capture_is_not_shifted_on_one_gap_that_fits_two_steps_off_by_chance(tmp_path: Path) -> None:
    # Nothing cut, four steps alike but for µs of jitter: the barrier's gaps (~9.45 ms) of
    # five of 48 members missed their reference's by 4-6 µs, 4x the closest members', and
    # compared two calls off, the one gap left fitted to 0.1-2 µs: taken, the five were shifted
    # two steps, their lateness read as 19 ms and two pairs broke happens-before.
    spec = simulate.JobSpec(nodes=6, gpus_per_node=8, tp=4, steps=4, barrier=True, tp_collectives=1, seed=382)
    report = analyze(load_digests(simulate.simulate(spec, tmp_path)))
    assert not [w for w in report.warnings if "re-aligned" in w]
    assert report.alignment.happens_before_violations == 0
    truth = {r["rank"]: r["late_max_ns"] for r in simulate.truth(spec)["ranks"]}
    assert all(abs(r.late_max_ns - truth[r.rank]) < 150_000 for r in report.ranks)
