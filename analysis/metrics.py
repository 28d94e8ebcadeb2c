"""Per-rank, per-communicator and per-TP-group numbers on aligned collective rows.

Definitions are reference/alignment-and-metrics.md §7 with the issue's lateness: in
instance c with participants P, lateness ``L = start - min start``, wait
``W = max start - start`` (clamped to the kernel's duration), blame = last minus
second-latest start for the last arriver, transfer ``T = median end - max start``.
Lateness below the clock uncertainty of the two hosts compared (3 sigma; zero on one
host) is shown as 0: it cannot be told from alignment error.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from rankscope.analysis.matching import UNMATCHED

SIGMAS = 3.0
TOP_KERNELS = 5
_TP_NAME = re.compile(r"(^|[^a-z])(tp|tensor)([^a-z]|$)", re.I)
_DP_NAME = re.compile(r"(^|[^a-z])(dp|data|fsdp)([^a-z]|$)", re.I)


def instance_frame(aligned: pd.DataFrame) -> pd.DataFrame:
    """Matched rows with per-instance stats and per-row lateness, wait, blame, transfer.

    ``aligned`` has columns instance, rank, host, start, end (aligned ns), duration (ns)
    and sigma (host clock uncertainty ns).
    """
    rows = aligned.loc[aligned["instance"] != UNMATCHED].sort_values(["instance", "start"], kind="stable")
    rows = rows.reset_index(drop=True)
    instance = rows["instance"].to_numpy()
    start = rows["start"].to_numpy(dtype=np.int64)
    first = np.r_[0, np.flatnonzero(np.diff(instance)) + 1] if len(rows) else np.array([], dtype=np.int64)
    last = np.r_[first[1:] - 1, len(rows) - 1] if len(rows) else first
    sizes = last - first + 1
    min_start, max_start, second = start[first], start[last], start[np.maximum(last - 1, first)]
    host = pd.factorize(rows["host"])[0]
    sigma = rows["sigma"].to_numpy(dtype=np.float64)
    median_end = rows.groupby("instance", sort=True)["end"].median().to_numpy()

    pair_sigma = np.where(host == np.repeat(host[first], sizes), 0.0, np.hypot(sigma, np.repeat(sigma[first], sizes)))
    lateness = start - np.repeat(min_start, sizes)
    rows["lateness"] = np.where(lateness > SIGMAS * pair_sigma, lateness, 0)
    duration = rows["duration"].to_numpy(dtype=np.int64)
    rows["wait"] = np.clip(np.repeat(max_start, sizes) - start, 0, duration)
    is_last = np.zeros(len(rows), dtype=bool)
    is_last[last] = True
    skew = max_start - min_start
    skew_sigma = np.where(host[last] == host[first], 0.0, np.hypot(sigma[last], sigma[first]))
    real_last = np.zeros(len(rows), dtype=bool)
    real_last[last] = skew > SIGMAS * skew_sigma
    rows["is_last"] = is_last & real_last
    rows["blame"] = np.where(rows["is_last"], np.repeat(max_start - second, sizes), 0)
    rows["skew"] = np.repeat(skew, sizes)
    rows["transfer_c"] = np.repeat(np.maximum(median_end - max_start, 0.0), sizes)
    return rows


def rank_lateness(inst: pd.DataFrame) -> pd.DataFrame:
    """Per rank: lateness mean/p50/p99/max, last-arrival share, blame, wait and transfer sums."""
    grouped = inst.groupby("rank")
    late = grouped["lateness"]
    frame = pd.DataFrame(
        {
            "late_mean_ns": late.mean(),
            "late_p50_ns": late.quantile(0.5),
            "late_p99_ns": late.quantile(0.99),
            "late_max_ns": late.max(),
            "last_arrival_share": grouped["is_last"].mean(),
            "blame_ns": grouped["blame"].sum(),
            "nccl_wait_ns": grouped["wait"].sum(),
            "matched": grouped.size(),
        }
    )
    frame["nccl_transfer_ns"] = (inst["duration"] - inst["wait"]).groupby(inst["rank"]).sum()
    return frame


def rank_frame(meta: pd.DataFrame, events: pd.DataFrame, inst: pd.DataFrame) -> pd.DataFrame:
    """One row per rank (index rank): the report's per-rank columns except clock and straggler ones."""
    frame = meta.set_index("rank")[["host"]].copy()
    window = (meta["window_end_ns"] - meta["window_start_ns"]).to_numpy(dtype=np.float64)
    busy = np.where(window > 0, 100.0 * meta["gpu_busy_ns"].to_numpy(dtype=np.float64) / np.where(window > 0, window, 1), np.nan)
    frame["gpu_busy_pct"] = pd.Series(busy, index=meta["rank"].to_numpy())
    frame["collectives"] = events.groupby("rank").size()
    frame["nccl_kernel_ns"] = events.groupby("rank")["duration"].sum()
    frame = frame.join(rank_lateness(inst))
    counts = ["collectives", "matched", "nccl_kernel_ns", "nccl_wait_ns", "nccl_transfer_ns", "blame_ns"]
    frame[counts] = frame[counts].fillna(0)
    return frame.sort_index()


def top_kernels(kernels: pd.DataFrame, limit: int = TOP_KERNELS) -> pd.DataFrame:
    """Kernels by total time: per rank (``rank`` column kept) when given per-rank rows."""
    ordered = kernels.sort_values(["rank", "total_ns"], ascending=[True, False], kind="stable")
    return ordered.groupby("rank", sort=False).head(limit)


def job_top_kernels(kernels: pd.DataFrame, limit: int = 10) -> pd.DataFrame:
    total = kernels.groupby("name").agg(
        count=("count", "sum"), total_ns=("total_ns", "sum"), is_comm=("is_comm", "first"), ranks=("rank", "nunique")
    )
    return total.sort_values("total_ns", ascending=False).head(limit).reset_index()


def communicator_kind(name: str | None, ranks: tuple[int, ...], hosts_of: dict[int, str]) -> str:
    """tp: named TP by the trace, or all members on one host (intra-node TP); dp: one member
    per host across hosts (or named DP); other: anything else (world, mixed, single)."""
    if name and _TP_NAME.search(name):
        return "tp"
    if name and _DP_NAME.search(name):
        return "dp"
    if len(ranks) < 2:
        return "other"
    hosts = [hosts_of.get(r) for r in ranks]
    if len(set(hosts)) == 1:
        return "tp"
    if len(set(hosts)) == len(hosts):
        return "dp"
    return "other"


def op_spread(events: pd.DataFrame, inst: pd.DataFrame) -> pd.DataFrame:
    """Per (comm_id, op): instances, size, duration, imbalance CV across ranks, transfer CV over time."""
    per_rank = events.groupby(["comm_id", "op", "rank"])["duration"].sum()
    imbalance = per_rank.groupby(level=["comm_id", "op"]).agg(lambda s: _cv(s.to_numpy()))
    per_instance = inst.groupby("instance").agg(
        comm_id=("comm_id", "first"), op=("op", "first"), bytes=("bytes", "first"),
        transfer=("transfer_c", "first"), skew=("skew", "first"),
    )
    # Network variance: transfer over time within a size class, so mixed sizes do not count.
    per_instance["size_class"] = np.floor(np.log2(per_instance["bytes"].astype(float).clip(lower=1))).fillna(-1)
    typical = per_instance.groupby(["comm_id", "op", "size_class"])["transfer"].transform("median")
    per_instance["relative"] = per_instance["transfer"] / typical.where(typical > 0)
    spread = per_instance.groupby(["comm_id", "op"]).agg(
        instances=("transfer", "size"),
        bytes_median=("bytes", "median"),
        transfer_mean_ns=("transfer", "mean"),
        network_cv=("relative", "std"),
        skew_mean_ns=("skew", "mean"),
        skew_p99_ns=("skew", lambda s: float(np.quantile(s, 0.99))),
    )
    out = events.groupby(["comm_id", "op"]).agg(calls=("duration", "size"), duration_mean_ns=("duration", "mean"))
    out["imbalance_cv"] = imbalance
    out = out.join(spread)
    out["instances"] = out["instances"].fillna(0)
    return out.reset_index()


def tp_overhead(events: pd.DataFrame, steps: pd.DataFrame, meta: pd.DataFrame, tp_comms: list[str]) -> pd.DataFrame:
    """Per TP communicator: exposed NCCL time (not overlapped by compute) as a fraction of step time.

    ``events`` carries every collective row with a ``wait`` column (0 where unmatched).
    Steps are used where the rank traced them (collectives inside steps, time = sum of
    step lengths); otherwise the capture window.
    """
    rows = events.loc[events["comm_id"].isin(tp_comms)].copy()
    stepped = set(steps["rank"].unique())
    in_scope = ~rows["rank"].isin(stepped) | rows["step"].notna()
    rows = rows.loc[in_scope]
    overlap = rows["compute_overlap_ns"].fillna(0).to_numpy(dtype=np.float64)
    exposed = np.clip(rows["duration"].to_numpy(dtype=np.float64) - overlap, 0, None)
    rows["exposed"] = exposed
    rows["exposed_wait"] = np.minimum(rows["wait"].to_numpy(dtype=np.float64), exposed)
    per_rank = rows.groupby(["comm_id", "rank"])[["exposed", "exposed_wait"]].sum().reset_index()
    step_time = (steps["end_ns"] - steps["start_ns"]).groupby(steps["rank"]).sum()
    window = (meta["window_end_ns"] - meta["window_start_ns"]).set_axis(meta["rank"])
    per_rank["time"] = per_rank["rank"].map(step_time).fillna(per_rank["rank"].map(window))
    per_rank["stepped"] = per_rank["rank"].isin(stepped)
    out = per_rank.groupby("comm_id").agg(
        exposed_ns=("exposed", "mean"), exposed_wait_ns=("exposed_wait", "mean"),
        step_time_ns=("time", "mean"), stepped=("stepped", "all"),
    )
    out["exposed_transfer_ns"] = out["exposed_ns"] - out["exposed_wait_ns"]
    for part in ("exposed", "exposed_wait", "exposed_transfer"):
        out[f"{part}_frac"] = out[f"{part}_ns"] / out["step_time_ns"].where(out["step_time_ns"] > 0)
    return out.reset_index()


def _cv(values: np.ndarray) -> float:
    mean = values.mean() if len(values) else 0.0
    return float(values.std() / mean) if len(values) > 1 and mean > 0 else float("nan")
