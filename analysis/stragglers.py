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
    """Matched rows with ``excess``: the gap since the rank's previous collective minus the
    median gap of the *other* participants, floored at 0 (local clocks only).

    Leaving the rank itself out keeps a two-rank group from splitting the delay between
    its members; the floor keeps early ranks from looking like the cause of anything.
    """
    ordered = events.sort_values(["rank", "start_ns"], kind="stable")
    previous_end = ordered.groupby("rank", sort=False)["end_ns"].shift(1)
    ordered = ordered.assign(gap=(ordered["start_ns"] - previous_end).astype("float64"))
    rows = ordered.loc[(ordered["instance"] != UNMATCHED) & ordered["gap"].notna()]
    rows = rows.sort_values(["instance", "gap"], kind="stable").reset_index(drop=True)
    rows = rows.loc[rows.groupby("instance")["gap"].transform("size").to_numpy() > 1].reset_index(drop=True)
    gap = rows["gap"].to_numpy()
    instance = rows["instance"].to_numpy()
    first = np.r_[0, np.flatnonzero(np.diff(instance)) + 1] if len(rows) else np.array([], dtype=np.int64)
    sizes = np.diff(np.r_[first, len(rows)])
    base = np.repeat(first, sizes)
    position = np.arange(len(rows)) - base
    others = np.repeat(sizes, sizes) - 1
    lo, hi = (others - 1) // 2, others // 2
    # index j among the others is index j + (j >= position) in the sorted instance
    median_others = 0.5 * (gap[base + lo + (lo >= position)] + gap[base + hi + (hi >= position)])
    return rows.assign(excess=np.maximum(gap - median_others, 0.0))


def find(events: pd.DataFrame, ranks: pd.Index) -> Stragglers:
    """Flag ranks whose own delay stands out; ``ranks`` lists every rank analysed."""
    rows = own_delay(events)
    delay = rows.groupby("rank")["excess"].mean().reindex(ranks)
    durations = events["end_ns"] - events["start_ns"]
    min_effect = max(MIN_EFFECT_NS, MIN_EFFECT_OF_DURATION * float(durations.median())) if len(events) else MIN_EFFECT_NS
    flagged, score = stands_out(delay, min_effect)
    return Stragglers(flagged, delay, score, min_effect, _causes(events, flagged))


def _causes(events: pd.DataFrame, flagged: list[int]) -> dict[int, str]:
    """Busy with compute until the late arrival, or idle (launch, host, data loading)?
    Whichever of the two stands further above the median rank (reference §7, late cause)."""
    columns = ["compute_before_ns", "idle_before_ns"]
    if not flagged or events[columns].isna().all().any():
        return {}
    per_rank = events.groupby("rank")[columns].mean()
    excess = per_rank - per_rank.median()
    return {
        r: "compute" if excess.at[r, "compute_before_ns"] >= excess.at[r, "idle_before_ns"] else "launch/host"
        for r in flagged
    }


def stands_out(values: pd.Series, min_effect: float) -> tuple[list[int], pd.Series]:
    """Index labels whose value exceeds the median by ``Z_MIN`` robust sigmas and by ``min_effect``."""
    known = values.dropna()
    if len(known) < 3:
        return [], pd.Series(np.nan, index=values.index)
    centre = float(known.median())
    scale = MAD_TO_SIGMA * float((known - centre).abs().median())
    effect = values - centre
    # A zero spread (identical peers) makes any real difference infinitely significant.
    score = effect / scale if scale > 0 else np.sign(effect) * np.where(effect != 0, np.inf, 0.0)
    flagged = values.index[((score > Z_MIN) & (effect > min_effect)).to_numpy()]
    return sorted(int(r) for r in flagged), score
