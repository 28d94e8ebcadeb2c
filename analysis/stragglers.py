"""Stragglers: the ranks that *cause* late arrivals, not every rank that arrives late.

Lateness propagates: a slow rank delays its TP group's collective, so its node-mates
reach the next DP collective late too. Each rank's *own* delay is clock-free: the gap
between the end of its previous collective and its arrival at this one, minus the
median gap of the instance's participants. A slow rank has a large excess gap; its
node-mates, delayed by waiting inside the previous collective, do not.

A rank is a straggler when its mean own delay stands out robustly from all ranks'
(median/MAD z-score above ``Z_MIN``) *and* by a minimum absolute effect tied to the
typical collective duration, so a balanced job flags none and no fixed number of
ranks is ever named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from rankscope.analysis.groups import Groups
from rankscope.analysis.matching import UNMATCHED

Z_MIN = 6.0
MIN_EFFECT_NS = 5_000.0
MIN_EFFECT_OF_DURATION = 0.1
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Stragglers:
    ranks: list[int]
    own_delay_ns: pd.Series  # mean excess gap per rank (index rank)
    score: pd.Series  # robust z-score per rank
    min_effect_ns: float
    causes: dict[int, str]  # straggler -> "compute" or "launch/host"


def own_delay(events: pd.DataFrame) -> pd.DataFrame:
    """Matched rows (rank, instance, gap) with ``excess``: the gap since the rank's previous
    collective minus the median gap of the *other* participants, floored at 0 (local clocks only).

    Leaving the rank itself out keeps a two-rank group from splitting the delay between
    its members; the floor keeps early ranks from looking like the cause of anything.
    """
    rank = events["rank"].to_numpy(np.int64)
    start = events["start_ns"].to_numpy(np.int64)
    ordered = Groups(rank, within=start).order
    previous = np.r_[False, rank[ordered][1:] == rank[ordered][:-1]]
    gap_sorted = np.full(len(ordered), np.nan)
    gap_sorted[previous] = (
        start[ordered][1:] - events["end_ns"].to_numpy(np.int64)[ordered][:-1]
    )[previous[1:]]  # int64 difference first: epoch ns do not fit float64 exactly
    instance_sorted = events["instance"].to_numpy(np.int64)[ordered]
    kept = np.flatnonzero((instance_sorted != UNMATCHED) & previous)
    kept = kept[Groups(instance_sorted[kept], within=gap_sorted[kept]).order]
    per = Groups(instance_sorted[kept])
    kept = kept[per.broadcast(per.size) > 1]
    gap = gap_sorted[kept]
    instance = instance_sorted[kept]
    first = np.r_[0, np.flatnonzero(np.diff(instance)) + 1] if len(kept) else np.array([], dtype=np.int64)
    sizes = np.diff(np.r_[first, len(kept)])
    base = np.repeat(first, sizes)
    position = np.arange(len(kept)) - base
    others = np.repeat(sizes, sizes) - 1
    lo, hi = (others - 1) // 2, others // 2
    # index j among the others is index j + (j >= position) in the sorted instance
    median_others = 0.5 * (gap[base + lo + (lo >= position)] + gap[base + hi + (hi >= position)])
    return pd.DataFrame(
        {"rank": rank[ordered[kept]], "instance": instance, "gap": gap, "excess": np.maximum(gap - median_others, 0.0)}
    )


def find(events: pd.DataFrame, ranks: pd.Index) -> Stragglers:
    """Flag ranks whose own delay stands out; ``ranks`` lists every rank analysed."""
    rows = own_delay(events)
    per = Groups(rows["rank"].to_numpy(np.int64))
    delay = pd.Series(per.mean(rows["excess"].to_numpy()), index=per.keys[0]).reindex(ranks)
    durations = events["end_ns"].to_numpy(np.int64) - events["start_ns"].to_numpy(np.int64)
    min_effect = max(MIN_EFFECT_NS, MIN_EFFECT_OF_DURATION * float(np.median(durations))) if len(events) else MIN_EFFECT_NS
    flagged, score = stands_out(delay, min_effect)
    return Stragglers(flagged, delay, score, min_effect, _causes(events, flagged))


def _causes(events: pd.DataFrame, flagged: list[int]) -> dict[int, str]:
    """Busy with compute until the late arrival, or idle (launch, host, data loading)?
    Whichever of the two stands further above the median rank (reference §7, late cause)."""
    if not flagged:
        return {}
    compute, idle = (events[c].to_numpy(dtype=np.float64, na_value=np.nan) for c in ("compute_before_ns", "idle_before_ns"))
    if np.isnan(compute).all() or np.isnan(idle).all():
        return {}
    per = Groups(events["rank"].to_numpy(np.int64))
    compute, idle = per.mean(compute), per.mean(idle)
    compute_excess, idle_excess = compute - np.nanmedian(compute), idle - np.nanmedian(idle)
    at = dict(zip(per.keys[0].tolist(), range(per.count)))
    return {r: "compute" if compute_excess[at[r]] >= idle_excess[at[r]] else "launch/host" for r in flagged}


def stands_out(values: pd.Series, min_effect: float) -> tuple[list[int], pd.Series]:
    """Index labels whose value exceeds the median by ``Z_MIN`` robust sigmas and by ``min_effect``."""
    value = values.to_numpy(dtype=np.float64, na_value=np.nan)
    known = value[~np.isnan(value)]
    if len(known) < 3:
        return [], pd.Series(np.nan, index=values.index)
    centre = float(np.median(known))
    scale = MAD_TO_SIGMA * float(np.median(np.abs(known - centre)))
    effect = value - centre
    # A zero spread (identical peers) makes any real difference infinitely significant.
    score = effect / scale if scale > 0 else np.sign(effect) * np.where(effect != 0, np.inf, 0.0)
    flagged = values.index[(score > Z_MIN) & (effect > min_effect)]
    return sorted(int(r) for r in flagged), pd.Series(score, index=values.index)
