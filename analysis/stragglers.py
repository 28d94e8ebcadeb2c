"""Stragglers: the ranks that *cause* late arrivals, not every rank that arrives late.

Lateness propagates: a slow rank delays its TP group's collective, so its node-mates
reach the next DP collective late too. Each rank's *own* delay is clock-free: the gap
between its last collective event (the end of its previous collective, or the arrival at
one still in flight) and its arrival at this one, minus the median gap of its peers. A
slow rank has a large excess gap; its node-mates, delayed by waiting inside the previous
collective, do not. Peers are the instance's other
participants and, where every collective lies in a traced step, those of its
communicator's replicas' instances at the same place in the step (`peers`): a whole slow
TP group (a slow node) then stands out from the other TP groups.

A rank is a straggler when its mean own delay stands out robustly from all ranks'
(median/MAD z-score above ``Z_MIN``) *and* by a minimum absolute effect: ``MIN_EFFECT_NS``
and ``Z_MIN`` times the noise of the ranks' means (not the collectives' durations, which
measure transfer and the waiting stragglers cause, not the spread of gaps; but where each
rank has only a few gaps, whose noise is itself rough, 10% of their typical duration), so a
balanced job flags none and no fixed number of ranks is ever named; or where up to half the ranks
stand apart above a clear jump (`_above_a_jump`) or far past the quiet half (`_past_the_quiet_half`);
and those that stand out once the ranks so named are left out of the median and MAD (`_unmasked`).

Where none is named, `not_judged` says whether that means "none" or "could not tell": a
rank's first collective in the capture has no gap before it, so a rank late there (as
a compute straggler is in a one-step capture) is late for a reason nothing measured.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from rankscope.analysis import intervals
from rankscope.analysis.groups import Groups, Table, codes, member_of, take
from rankscope.analysis.lines import NOISE_FLOOR_NS
from rankscope.analysis.matching import UNMATCHED
from rankscope.analysis.ops import N_TO_N_OPS
from rankscope.analysis.robust import MAD_TO_SIGMA, median, nanmedian

Z_MIN = 6.0
MIN_EFFECT_NS = 5_000.0
MIN_EFFECT_OF_DURATION = 0.1
# Gaps per rank (median) from which their noise alone sets the bar for own delay (`find`).
MIN_GAPS_FOR_NOISE_BAR = 8
# A gap above most ranks' values that sets the ranks above it apart: this many times the
# spread (range) of the values below it, and Z_MIN robust sigmas of them.
JUMP_OVER_SPREAD = 2.0
# A jump this many times the bar sets the ranks above it apart however far apart they lie:
# each is far past the noise (a bar underestimated a few times over still holds).
CLEAR_JUMP = 3.0
# Ranks a jump must leave below it (and half of all): 2, so that one slow rank of each TP pair
# of a 4-rank TP 2 x DP 2 job is named; the jump's bars (over their MAD and range) hold them.
MIN_BELOW_JUMP = 2
# The fewest ranks, besides those named, whose median and MAD `_unmasked` tests the rest
# against: the MAD of 3 or 4 is the spread of the closest 2 or 3, small by chance (4 ranks, one
# named: 31 µs over two at 6 and 8 stood out of a balanced three).
MIN_UNMASKED_REFERENCE = 5
# The least spread of own delays a score is taken against: the timestamp resolution, below
# which delays are alike, not known to be equal. Where most ranks' own delay is exactly 0 the
# MAD is 0, and a straggler's score came out inf (null in JSON, read as "unknown"); floored, it
# stays finite and comparable. Below MIN_EFFECT_NS / Z_MIN, so it names no rank more or fewer.
SCORE_SCALE_FLOOR_NS = NOISE_FLOOR_NS


@dataclass(frozen=True)
class Stragglers:
    ranks: list[int]
    own_delay_ns: np.ndarray  # mean excess gap per rank analysed (in the order given to find)
    score: np.ndarray  # robust z-score per rank analysed (its scale at least SCORE_SCALE_FLOOR_NS)
    min_effect_ns: float
    causes: dict[int, str]  # straggler -> "compute" or "launch/host"


def own_delay(events: Table) -> dict[str, np.ndarray]:
    """Matched rows (rank, instance, gap) with ``excess``: the gap since the rank's last
    collective event (`_last_event`) minus the median gap of its *other* peers (`peers`),
    floored at 0 (local clocks only).

    Leaving the rank itself out keeps a two-rank group from splitting the delay between
    its members; the floor keeps early ranks from looking like the cause of anything.
    """
    rank = np.asarray(events["rank"], np.int64)
    start = np.asarray(events["start_ns"], np.int64)
    ordered = _by_rank_then_start(rank, start)
    previous = np.concatenate(([False], rank[ordered][1:] == rank[ordered][:-1]))
    gap_sorted = np.full(len(ordered), np.nan)
    since = _last_event(rank, start, np.asarray(events["end_ns"], np.int64), ordered)
    gap_sorted[previous] = (start[ordered] - since)[previous]  # int64 first: epoch ns do not fit float64 exactly
    instance_sorted = np.asarray(events["instance"], np.int64)[ordered]
    kept = np.flatnonzero((instance_sorted != UNMATCHED) & previous)
    per = Groups(peers(events)[ordered][kept], within=gap_sorted[kept])
    kept = kept[per.order][np.repeat(per.size, per.size) > 1]  # rows now by peer group: each row's group size
    gap = gap_sorted[kept]
    instance = instance_sorted[kept]
    sizes = per.size[per.size > 1]  # the peer groups kept, in order
    first = np.cumsum(sizes) - sizes
    base = np.repeat(first, sizes)
    position = np.arange(len(kept)) - base
    others = np.repeat(sizes, sizes) - 1
    lo, hi = (others - 1) // 2, others // 2
    # index j among the others is index j + (j >= position) in the sorted instance
    median_others = 0.5 * (gap[base + lo + (lo >= position)] + gap[base + hi + (hi >= position)])
    return {"rank": rank[ordered[kept]], "instance": instance, "gap": gap, "excess": np.maximum(gap - median_others, 0.0)}


def _last_event(rank: np.ndarray, start: np.ndarray, end: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Per row (in ``ordered``: by rank, then start), the rank's last collective event before
    its arrival: the latest end at or before it, or the previous arrival where that is later.
    A call made while an earlier one is still in flight (async_op, gloo's worker threads, a DP
    all-reduce on its own stream across the TP calls) counts from that call's arrival, not its
    end: the end lies ahead by however long the call waits, and would take the compute before
    this call (a straggler's own delay) out of every gap in the window. (The first row of each
    rank has no previous event: what is given there is not used.)"""
    by_end = np.lexsort((end, rank))
    at = intervals.last_at_or_before(rank[by_end], end[by_end], rank[ordered], start[ordered])
    released = end[by_end][np.maximum(at, 0)]
    previous_start = np.concatenate((start[ordered][:1], start[ordered][:-1]))
    return np.where(at >= 0, np.maximum(released, previous_start), previous_start)


def peers(events: Table) -> np.ndarray:
    """Per row, its peer group: its instance; or, where every matched row lies in a traced
    step, the instances of its communicator's replicas (`_replicas`) at the same place in
    that step: the same op, bytes, member count and rank stride, and the same count of calls
    on the communicator before it in the step. (Without steps a capture window may cut
    replicas at different calls.) UNMATCHED rows keep UNMATCHED."""
    instance = np.asarray(events["instance"], np.int64)
    matched = np.flatnonzero(instance != UNMATCHED)
    step = np.asarray(events["step"], np.float64)[matched]
    if not matched.size or np.isnan(step).any():
        return instance
    inst, rank = instance[matched], np.asarray(events["rank"], np.int64)[matched]
    by_rank = Groups(inst, within=rank)
    low = rank[by_rank.order[by_rank.starts]]
    second = rank[by_rank.order[np.minimum(by_rank.starts + 1, matched.size - 1)]]
    stride = np.where(by_rank.size > 1, second - low, 0)
    (op, op_names), (comm, _) = codes(take(events["op"], matched)), codes(take(events["comm_id"], matched))
    size = np.asarray(events["bytes"], np.float64)[matched]
    size[np.isnan(size)] = -1.0  # unknown: a size of its own (np.nan_to_num's setup cost 4x this)
    size = size.astype(np.int64)
    step = step.astype(np.int64)
    place = Groups(rank, comm, step, within=np.asarray(events["start_ns"], np.int64)[matched]).cumcount()
    replica = _replicas(comm, rank, member_of(op_names, N_TO_N_OPS)[op])
    out = instance.copy()
    out[matched] = Groups(replica[comm], op, size, by_rank.size[by_rank.id], stride[by_rank.id], step, place).id
    return out


def _replicas(comm: np.ndarray, rank: np.ndarray, reduces: np.ndarray) -> np.ndarray:
    """Per communicator code, its replica class. Communicators are replicas (one shard of the
    model on other ranks, doing the same work) where an N-to-N communicator holds exactly
    one member of each, as a DP group holds one rank of each TP group. TP groups of other
    pipeline stages share no such group, nor do they through a world group, which holds
    all their members. Worked out in Python over distinct (communicator, rank) pairs."""
    pairs = Groups(comm, rank)
    members: dict[int, list[int]] = {}
    comms_of: dict[int, list[int]] = {}
    for c, r in zip(pairs.keys[0].tolist(), pairs.keys[1].tolist()):
        members.setdefault(c, []).append(r)
        comms_of.setdefault(r, []).append(c)
    parent = list(range(int(comm.max()) + 1 if comm.size else 0))

    def root(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    for linking in set(comm[reduces].tolist()):
        shared = Counter(other for r in members[linking] for other in comms_of[r] if other != linking)
        first = None
        for other in (other for other, count in shared.items() if count == 1):
            top = root(other)
            if first is None:
                first = top
            elif top != first:
                parent[top] = first
    return np.array([root(c) for c in range(len(parent))], np.int64)


def _by_rank_then_start(rank: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Row order by rank, then start (stable). Usually the rows come so already (each digest
    lists its rank's calls in time order): two comparisons confirm it, where sorting costs more."""
    following = (rank[1:] > rank[:-1]) | ((rank[1:] == rank[:-1]) & (start[1:] >= start[:-1]))
    return np.arange(len(rank)) if following.all() else Groups(rank, within=start).order


def find(events: Table, ranks: np.ndarray) -> Stragglers:
    """Flag ranks whose own delay stands out; ``ranks`` lists every rank analysed, ascending."""
    rows = own_delay(events)
    # each row's rank as its position among the ranks: the per-rank mean without a grouping
    at = np.asarray(ranks, np.int64).searchsorted(rows["rank"])
    count = np.bincount(at, minlength=len(ranks))
    with np.errstate(invalid="ignore", divide="ignore"):
        delay = np.where(count > 0, np.bincount(at, weights=rows["excess"], minlength=len(ranks)) / count, np.nan)
        square = np.bincount(at, weights=rows["excess"] ** 2, minlength=len(ranks)) / count
        # each rank's mean's standard error: how far apart noise alone sets the ranks' means
        error = np.sqrt(np.maximum(square - delay**2, 0.0) / np.maximum(count - 1, 1))
    durations = np.asarray(events["end_ns"], np.int64) - np.asarray(events["start_ns"], np.int64)
    typical = float(nanmedian(durations)) if len(durations) else 0.0
    # the bar for lateness (clock-aligned arrivals, pipeline._late_ranks), not for own delay
    min_effect = max(MIN_EFFECT_NS, MIN_EFFECT_OF_DURATION * typical)
    # Own delay is a gap on the rank's own clock: the collectives' durations (their transfer,
    # and the waiting the stragglers themselves cause) say nothing of how far apart noise sets
    # the ranks' gaps. Its bar is the noise of the means: with a few ranks the MAD can be
    # small by chance, and a rank's noise stood out.
    # Of the ranks at or below the median delay: a straggler late every few steps has a mean as
    # rough as its delays are rare, and where half the ranks straggle their errors were the median.
    quiet = (count > 1) & (delay <= float(nanmedian(delay)))
    noise = float(nanmedian(error[quiet])) if quiet.any() else 0.0
    # With few gaps per rank their standard errors are themselves rough, and their median can
    # come out low by chance (a balanced 5-step job named a rank): there the bar stays the
    # practical one, tied to the collectives' durations.
    floor = MIN_EFFECT_NS if float(median(count)) >= MIN_GAPS_FOR_NOISE_BAR else min_effect
    significant = max(floor, Z_MIN * noise)
    flagged, score = outliers(ranks, delay, significant, min_scale=SCORE_SCALE_FLOOR_NS)
    flagged = set(flagged) | set(_past_the_quiet_half(ranks, delay, significant))
    # Unmasking judges by the MAD of the ranks not named: where the quiet ranks' own delays are
    # all 0 (no noise measured), that is a MAD of zeros, which a rank 12.5 µs past them outscored.
    flagged = _unmasked(ranks, delay, error, flagged, significant) if noise else sorted(flagged)
    return Stragglers(flagged, delay, score, min_effect, _causes(events, flagged))


def not_judged(found: Stragglers, events: Table, inst: Table, late_ranks: list[int]) -> str | None:
    """Why no straggler could be named, where the test could not be made; None where it was
    (a straggler named, or own delays measured and none standing out). ``inst`` is
    `metrics.instance_frame` of ``events``; ``late_ranks`` the ranks arriving late."""
    if found.ranks:
        return None
    if np.count_nonzero(~np.isnan(found.own_delay_ns)) < 3:
        return "needs 3+ ranks with consecutive collectives"
    blind = _late_at_first(events, inst, late_ranks, found.min_effect_ns)
    if not blind:
        return None
    who = (f"rank {blind[0]} arrives late at its" if len(blind) == 1 else
           f"ranks {', '.join(map(str, blind))} arrive late at their")
    return f"{who} first collective in the capture, where no earlier one measures own delay: capture more steps"


def _late_at_first(events: Table, inst: Table, late_ranks: list[int], min_effect: float) -> list[int]:
    """The late ranks late by more than ``min_effect`` at their first collective (on their
    own clock), which `own_delay` has no gap for."""
    rank = np.asarray(events["rank"], np.int64)
    ordered = _by_rank_then_start(rank, np.asarray(events["start_ns"], np.int64))
    first = ordered[np.concatenate(([True], rank[ordered][1:] != rank[ordered][:-1]))]
    lateness = np.zeros(len(rank))
    lateness[np.asarray(inst["row"], np.int64)] = inst["lateness"]
    late_there = set(rank[first[lateness[first] > min_effect]].tolist())
    return sorted(r for r in late_ranks if r in late_there)


def _causes(events: Table, flagged: list[int]) -> dict[int, str]:
    """Busy with compute until the late arrival, or idle (launch, host, data loading)?
    Whichever of the two stands further above the median rank (reference §7, late cause)."""
    if not flagged:
        return {}
    compute, idle = (np.asarray(events[c], dtype=np.float64) for c in ("compute_before_ns", "idle_before_ns"))
    if np.isnan(compute).all() or np.isnan(idle).all():
        return {}
    per = Groups(np.asarray(events["rank"], np.int64))
    compute, idle = per.mean(compute), per.mean(idle)
    compute_excess, idle_excess = compute - float(nanmedian(compute)), idle - float(nanmedian(idle))
    at = dict(zip(per.keys[0].tolist(), range(per.count)))
    return {r: "compute" if compute_excess[at[r]] >= idle_excess[at[r]] else "launch/host" for r in flagged}


def stands_out(
    ranks: np.ndarray, values: np.ndarray, min_effect: float, min_scale: float = 0.0
) -> tuple[list[int], np.ndarray]:
    """Ranks whose value (NaN: unknown) exceeds the median by ``Z_MIN`` robust sigmas (at
    least ``min_scale``) and by ``min_effect``, and every rank's robust z-score."""
    value = np.asarray(values, dtype=np.float64)
    known = value[~np.isnan(value)]
    if len(known) < 3:
        return [], np.full(len(value), np.nan)
    score, effect = _robust_score(value, known, min_scale)
    return sorted(int(r) for r in np.asarray(ranks)[(score > Z_MIN) & (effect > min_effect)]), score


def outliers(
    ranks: np.ndarray, values: np.ndarray, min_effect: float, min_scale: float = 0.0
) -> tuple[list[int], np.ndarray]:
    """Ranks whose value stands out (`stands_out`) or lies above a jump (`_above_a_jump`:
    up to half the ranks high), and every rank's robust z-score."""
    flagged, score = stands_out(ranks, values, min_effect, min_scale)
    return sorted(set(flagged) | set(_above_a_jump(ranks, values, min_effect))), score


def _above_a_jump(ranks: np.ndarray, delay: np.ndarray, min_effect: float) -> list[int]:
    """Ranks above a jump in own delay, where up to half the ranks are slow (one of each TP
    pair) and the median and MAD take them in, so that nothing stands out. The jump must
    leave at least half the ranks (and ``MIN_BELOW_JUMP``) below it, be wider than ``min_effect`` and
    ``Z_MIN`` robust sigmas of the ranks below, ``JUMP_OVER_SPREAD`` times their range, and
    a ``JUMP_OVER_SPREAD``-th of the range of the ranks above it: those are one slow lot, not
    a rank a few µs past its peers below a straggler ms past them (12.5 µs under 1 ms, 1.6
    times the bar: both were named); or ``CLEAR_JUMP`` times ``min_effect``, each above it far
    past the noise (0.35 ms under 2 ms, against a 5 µs bar: only the second was named)."""
    order, values, low = _ascending(delay)
    gaps = values[low:] - values[low - 1 : -1]
    for at in (low + np.flatnonzero(gaps > min_effect)).tolist():  # the lowest such jump first
        gap, below = values[at] - values[at - 1], values[:at]
        if (gap > Z_MIN * _scale(below) and gap > JUMP_OVER_SPREAD * (below[-1] - below[0])
                and (JUMP_OVER_SPREAD * gap > values[-1] - values[at] or gap > CLEAR_JUMP * min_effect)):
            return sorted(int(r) for r in np.asarray(ranks)[order[at:]])
    return []


def _past_the_quiet_half(ranks: np.ndarray, delay: np.ndarray, min_effect: float) -> list[int]:
    """Ranks past the quiet half (the lower half, which a jump must leave below it: clean
    where up to half the ranks straggle) by ``CLEAR_JUMP`` times ``min_effect``, ``Z_MIN`` robust
    sigmas of its values and ``JUMP_OVER_SPREAD`` times their range, whatever lies between:
    where a third of the ranks straggle by unlike amounts, one a bar past the quiet half splits
    the way to one 3 bars past it into two jumps, neither clear (`_above_a_jump`).

    Own delay only (``min_effect`` a bar from its noise): arrivals' lateness has the job's
    layout in it (links, waits passed on) and a bar from durations, and so tested it named late
    ranks in 7 of 285 simulated balanced jobs."""
    order, values, low = _ascending(delay)
    if len(values) <= low:
        return []
    quiet = values[:low]
    bar = max(CLEAR_JUMP * min_effect, Z_MIN * _scale(quiet), JUMP_OVER_SPREAD * (quiet[-1] - quiet[0]))
    past = values[low:] - quiet[-1] > bar
    return sorted(int(r) for r in np.asarray(ranks)[order[low:][past]])


def _unmasked(ranks: np.ndarray, delay: np.ndarray, error: np.ndarray, flagged: set[int],
              min_effect: float) -> list[int]:
    """``flagged`` and the ranks that stand out (`stands_out`) once the flagged are left out
    of the median and MAD, again until none does: a straggler ms past its peers takes the MAD
    in, and masks a lesser one (3 of 7 ranks straggling by 2.9 ms, 233 µs and 154 µs, over
    peers 8 to 27 µs: the last one's z was 4.5, and 12.7 without the first two). Those found
    are taken only where the ranks still unnamed stay most of the ranks: where they would not,
    the rest split in two (two ranks 350 µs past three at 0, a bar of 300 µs, in a balanced
    6-rank job whose one straggler was left out), and the lower part's spread is no noise to
    judge the upper by. The rest tested are ``MIN_UNMASKED_REFERENCE`` ranks or more, and a
    rank must pass them by ``min_effect`` and ``Z_MIN`` times the median standard error of
    their means (``error``): the quiet half's, which set ``min_effect``, is low where an excess
    floored at 0 spreads less the lower its mean, and at ~490 µs jitter a balanced rank 509 µs
    over the rest's median (z 6.8 by their MAD) passed a 445 µs bar, where their errors set 595."""
    ranks = np.asarray(ranks)
    known = ~np.isnan(delay)
    while flagged:
        rest = known & ~np.isin(ranks, list(flagged))
        left = np.count_nonzero(rest)
        if left < MIN_UNMASKED_REFERENCE:
            break
        bar = max(min_effect, Z_MIN * float(nanmedian(error[rest])))
        found, _ = stands_out(ranks[rest], delay[rest], bar, SCORE_SCALE_FLOOR_NS)
        if not found or 2 * (left - len(found)) <= np.count_nonzero(known):
            break
        flagged = flagged | set(found)
    return sorted(flagged)


def _ascending(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(order, values) of the known values, ascending, and how many a jump must leave below
    it: half of them, and ``MIN_BELOW_JUMP``."""
    known = ~np.isnan(values)
    order = np.flatnonzero(known)[np.argsort(values[known], kind="stable")]
    return order, values[order], max(MIN_BELOW_JUMP, (len(order) + 1) // 2)


def _robust_score(value: np.ndarray, reference: np.ndarray, min_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """(z-score, excess over the median) of each value against ``reference``'s median and MAD
    (at least ``min_scale``)."""
    effect, scale = value - float(median(reference)), max(_scale(reference), min_scale)
    # A zero spread (identical peers) makes any real difference infinitely significant.
    return (effect / scale if scale > 0 else np.sign(effect) * np.where(effect != 0, np.inf, 0.0)), effect


def _scale(values: np.ndarray) -> float:
    """Robust sigma: the MAD, scaled."""
    return MAD_TO_SIGMA * float(median(np.abs(values - median(values))))
