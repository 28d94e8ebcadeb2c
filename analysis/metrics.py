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
from collections import Counter
from collections.abc import Mapping

import numpy as np

from rankscope.analysis.groups import ArrayLike, Groups, Table, codes, in_sorted, locate, member_of, take, take_or
from rankscope.analysis.matching import UNMATCHED
from rankscope.analysis.ops import (
    ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST, P2P_OPS, REDUCESCATTER, WORLD_PG_DESC, bus_factor,
)

SIGMAS = 3.0
TOP_KERNELS = 5
_TP_NAME = re.compile(r"(^|[^a-z])(tp|tensor)([^a-z]|$)", re.I)
_DP_NAME = re.compile(r"(^|[^a-z])(dp|data|fsdp)([^a-z]|$)", re.I)
# What data parallelism runs: gradient AllReduce, FSDP/ZeRO's AllGather and ReduceScatter,
# the initial Broadcast of parameters.
_DP_OPS = frozenset({ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST})


def instance_frame(aligned: Table) -> dict[str, ArrayLike]:
    """Matched rows (their instance, rank, bytes and duration: what the per-rank and
    per-op figures read) with per-instance stats and per-row lateness, wait, blame,
    transfer; rows by instance, then arrival.

    ``aligned`` has columns instance, rank, host, start, end (aligned ns), duration (ns),
    bytes and sigma (host clock uncertainty ns). ``row`` is each row's position in ``aligned``.
    """
    instance = np.asarray(aligned["instance"], np.int64)
    matched = np.flatnonzero(instance != UNMATCHED)
    start_all = np.asarray(aligned["start"], np.int64)
    per = Groups(instance[matched], within=start_all[matched])  # rows by instance, then arrival
    order = matched[per.order]
    rows = {name: take(aligned[name], order) for name in ("instance", "rank", "bytes", "duration")}
    start = start_all[order]
    first, sizes = per.starts, per.size
    last = first + sizes - 1
    min_start, max_start, second = start[first], start[last], start[np.maximum(last - 1, first)]
    host = codes(aligned["host"])[0][order]  # coded before the take: digest.columns' codes need no renumbering
    sigma = np.asarray(aligned["sigma"], dtype=np.float64)[order]
    # Epoch ns do not fit float64 exactly: medians are taken on offsets from one base.
    base = int(start_all[matched].min()) if len(matched) else 0
    median_end = per.median(np.asarray(aligned["end"], np.int64)[matched] - base)

    pair_sigma = np.where(host == np.repeat(host[first], sizes), 0.0, np.hypot(sigma, np.repeat(sigma[first], sizes)))
    lateness = start - np.repeat(min_start, sizes)
    duration = np.asarray(rows["duration"], dtype=np.int64)
    is_last = np.zeros(len(order), dtype=bool)
    is_last[last] = True
    skew = max_start - min_start
    skew_sigma = np.where(host[last] == host[first], 0.0, np.hypot(sigma[last], sigma[first]))
    real_last = np.zeros(len(order), dtype=bool)
    real_last[last] = skew > SIGMAS * skew_sigma
    is_last &= real_last
    return rows | {
        "row": order,
        "lateness": np.where(lateness > SIGMAS * pair_sigma, lateness, 0),
        "wait": np.clip(np.repeat(max_start, sizes) - start, 0, duration),
        "is_last": is_last,
        "blame": np.where(is_last, np.repeat(max_start - second, sizes), 0),
        "skew": np.repeat(skew, sizes),
        "transfer_c": np.repeat(np.maximum(median_end - (max_start - base), 0.0), sizes),
    }


def rank_lateness(inst: Table) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per rank (the ranks returned, ascending): lateness mean/p50/p99/max, last-arrival
    share, blame, wait and transfer sums."""
    per = Groups(np.asarray(inst["rank"], np.int64))  # integer keys: grouped as they are, no codes
    ranks = per.keys[0]
    late = np.asarray(inst["lateness"])
    wait = np.asarray(inst["wait"])
    p50, p99 = per.quantiles(late, (0.5, 0.99))
    return ranks, {
        "late_mean_ns": per.mean(late),
        "late_p50_ns": p50,
        "late_p99_ns": p99,
        "late_max_ns": per.max(late),
        "last_arrival_share": per.mean(inst["is_last"]),
        "blame_ns": per.sum(inst["blame"]),
        "nccl_wait_ns": per.sum(wait),
        "matched": per.size,
        "nccl_transfer_ns": per.sum(np.asarray(inst["duration"]) - wait),
    }


def rank_frame(meta: Table, events: Table, inst: Table) -> dict[str, np.ndarray]:
    """One row per rank, ascending: the report's per-rank columns except clock and straggler ones."""
    meta_rank = np.asarray(meta["rank"])
    order = np.argsort(meta_rank, kind="stable")
    ranks = meta_rank[order].astype(np.int64)
    window = np.asarray(meta["window_end_ns"], np.int64) - np.asarray(meta["window_start_ns"], np.int64)
    window = window[order].astype(np.float64)
    def share(column: str) -> np.ndarray:  # % of its window (NaN where the rank has none)
        ns = np.asarray(meta[column], np.float64)[order]
        return np.where(window > 0, 100.0 * ns / np.where(window > 0, window, 1), np.nan)

    busy = share("gpu_busy_ns")

    # each call's rank as its position among the ranks: per-rank counts and int sums without a grouping
    event_rank = np.asarray(events["rank"], np.int64)
    at, known = ranks.searchsorted(event_rank), in_sorted(event_rank, ranks)
    duration = np.asarray(events["duration"], np.int64)
    kernel_ns, unmatched_ns = np.zeros(len(ranks), dtype=np.int64), np.zeros(len(ranks), dtype=np.int64)
    np.add.at(kernel_ns, at[known], duration[known])
    alone = known & (np.asarray(events["instance"], np.int64) == UNMATCHED)  # no wait or transfer to split
    np.add.at(unmatched_ns, at[alone], duration[alone])
    columns = {
        "rank": meta_rank[order],
        "host": np.asarray(meta["host"], dtype=object)[order],
        "gpu_busy_pct": busy,
        "gpu_compute_only_pct": share("compute_only_ns"),
        "gpu_comm_only_pct": share("comm_only_ns"),
        "gpu_overlap_pct": share("overlap_ns"),
        "gpu_idle_pct": 100.0 - busy,
        "collectives": np.bincount(at[known], minlength=len(ranks)),
        "nccl_kernel_ns": kernel_ns,
        "nccl_unmatched_ns": unmatched_ns,
    }
    late_ranks, late = rank_lateness(inst)
    if np.array_equal(late_ranks, ranks):  # every rank in some matched call (the usual case): rows align
        return columns | late
    late_at = locate(late_ranks.astype(np.int64), ranks)
    counts = {"matched", "nccl_wait_ns", "nccl_transfer_ns", "blame_ns"}
    unmatched = (late_at < 0).any()
    for name, values in late.items():
        if name in counts:
            columns[name] = take_or(values, late_at, 0)
        else:  # as a join: NaN (so float) for ranks without matched collectives
            columns[name] = take_or(values, late_at, np.nan) if unmatched else values[late_at]
    return columns


def top_kernels(kernels: Table, limit: int = TOP_KERNELS) -> dict[str, ArrayLike]:
    """Kernels by total time: per rank (``rank`` column kept) when given per-rank rows."""
    rank = np.asarray(kernels["rank"], np.int64)
    per = Groups(rank, within=-np.asarray(kernels["total_ns"], np.int64))
    kept = per.cumcount() < limit
    rows = per.order[kept[per.order]]
    return {name: take(column, rows) for name, column in kernels.items()}


def job_top_kernels(kernels: Table, limit: int = 10) -> dict[str, np.ndarray]:
    name, names = codes(kernels["name"])
    per = Groups(name)
    total_ns = per.sum(kernels["total_ns"])
    # Longest first, ties as pandas' sort_values(ascending=False) leaves them.
    top = np.arange(per.count)[::-1][np.argsort(total_ns[::-1], kind="quicksort")][::-1][:limit]
    return {
        "name": names[top],
        "count": per.sum(kernels["count"])[top],
        "total_ns": total_ns[top],
        "is_comm": per.first(kernels["is_comm"])[top],
        "ranks": np.bincount(Groups(per.id, np.asarray(kernels["rank"], np.int64)).keys[0], minlength=per.count)[top],
    }


def communicator_kind(name: str | None, ranks: tuple[int, ...], hosts_of: dict[int, str],
                      op_names: frozenset[str] = frozenset()) -> str:
    """tp: named TP by the trace, or consecutive ranks all on one host (intra-node TP, as
    Megatron and a torch DeviceMesh with TP innermost lay it out); dp: one member per host
    across hosts, or a strided group inside one host whose operations (``op_names``, those
    it carried) are all data-parallel reductions (or named DP); other: anything else
    (world, mixed, single). torch's default group is the job's world, so never TP by its
    layout: on one node it is what DDP reduces gradients on. A group that only exchanges
    point to point (pipeline stages, ring attention) or only runs AllToAll (expert
    parallel) is neither TP nor DP, wherever its ranks are."""
    if name and _TP_NAME.search(name):
        return "tp"
    if name and _DP_NAME.search(name):
        return "dp"
    if name == WORLD_PG_DESC or len(ranks) < 2 or (op_names and (op_names <= P2P_OPS or op_names == {ALLTOALL})):
        return "other"
    hosts = [hosts_of.get(r) for r in ranks]
    if len(set(hosts)) == 1:
        if max(ranks) - min(ranks) + 1 == len(set(ranks)):
            return "tp"
        return "dp" if op_names and op_names <= _DP_OPS else "other"
    if len(set(hosts)) == len(hosts):
        return "dp"
    # Several members per host, as many on each, none next to another (DP over TP > 1): DP
    # where it reduces or shards only, like a strided group inside one host.
    per_host = Counter(hosts)
    strided = len(set(per_host.values())) == 1 and all(b - a > 1 for a, b in zip(sorted(ranks), sorted(ranks)[1:]))
    return "dp" if strided and op_names and op_names <= _DP_OPS else "other"


def communicator_kinds(members: Mapping[str, tuple[int, ...]], names: Mapping[str, str], hosts_of: dict[int, str],
                       comm_ops: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """`communicator_kind` of each communicator; a group TP by its layout alone that holds a
    smaller TP group is "other" (one node's world barrier around its TP groups)."""
    kinds = {c: communicator_kind(names.get(c), m, hosts_of, comm_ops.get(c, frozenset())) for c, m in members.items()}
    tp = {c: frozenset(members[c]) for c, kind in kinds.items() if kind == "tp"}
    for c, ranks in tp.items():
        named = names.get(c) and _TP_NAME.search(names[c])
        if not named and any(other < ranks for other in tp.values()):
            kinds[c] = "other"
    return kinds


def communicator_ops(events: Table) -> dict[str, frozenset[str]]:
    """The operations each communicator carried (its rows' distinct ops)."""
    comm, comm_ids = codes(events["comm_id"])
    op, op_ids = codes(events["op"])
    pairs = Groups(comm, op)
    comm_ids, op_ids = list(comm_ids), list(op_ids)
    found: dict[str, set[str]] = {}
    for c, o in zip(pairs.keys[0].tolist(), pairs.keys[1].tolist()):  # one per distinct pair: few
        if c >= 0 and o >= 0:  # -1: no value
            found.setdefault(comm_ids[c], set()).add(op_ids[o])
    return {c: frozenset(names) for c, names in found.items()}


def op_spread(events: Table, inst: Table, sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Per (comm_id, op): instances, size, duration, imbalance CV across ranks, transfer CV
    over time, and the bus bandwidth of the transfer (median over instances: message size
    over the time from the last arrival to the median end, so waiting does not count; the
    nccl-tests factor for the communicator's ``sizes``, members absent from the input too)."""
    comm, comm_ids = codes(events["comm_id"])
    op, ops = codes(events["op"])
    per_rank = Groups(comm, op, np.asarray(events["rank"], np.int64))
    rank_total = per_rank.sum(events["duration"])  # int64: exact
    per_op = Groups(per_rank.keys[0], per_rank.keys[1], ordered=True)  # over per_rank's groups
    calls = per_op.sum(per_rank.size)
    # imbalance: CV (population std / mean) across ranks of each rank's total time
    mean = per_op.mean(rank_total)
    std = np.sqrt(per_op.sum((rank_total - per_op.broadcast(mean)) ** 2) / per_op.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        imbalance = np.where((per_op.size > 1) & (mean > 0), std / mean, np.nan)
    instance = np.asarray(inst["instance"], np.int64)
    at_row = np.asarray(inst["row"])
    # An instance counts under every op its rows ran (a send/recv pair under both), not
    # only under its first arriver's: per (instance, op), its first row.
    instances = Groups(instance, op[at_row])
    first = instances.order[instances.starts]
    i_comm, i_op = comm[at_row[first]], instances.keys[1]
    participants = np.bincount(instance)[instances.keys[0]]
    size = instances.first_valid(np.asarray(inst["bytes"], dtype=np.float64))
    transfer = np.asarray(inst["transfer_c"], np.float64)[first]
    skew = np.asarray(inst["skew"], np.float64)[first]
    # Network variance: transfer over time within a size class, so mixed sizes do not count.
    size_class = np.floor(np.log2(np.clip(size, 1, None)))
    size_class = np.where(np.isnan(size_class), -1, size_class).astype(np.int64)
    per_instance = Groups(i_comm, i_op)
    # a (comm, op) usually moves one size class: then its instances are already grouped so
    mixed = per_instance.varies(size_class).any()
    typical = Groups(i_comm, i_op, size_class) if mixed else per_instance
    # CV: std over the class mean (a class median overstated a skewed spread, e.g. twice over)
    mean_transfer = typical.broadcast(typical.mean(transfer))
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = transfer / np.where(mean_transfer > 0, mean_transfer, np.nan)
    members = np.array([sizes.get(c, 0) for c in comm_ids.tolist()], dtype=np.int64)[i_comm]
    factor = np.full(len(i_op), np.nan)
    for code, name in enumerate(ops.tolist()):
        of_op = i_op == code
        # a point-to-point instance is its pair, whatever the communicator's size
        factor[of_op] = bus_factor(name, participants[of_op] if name in P2P_OPS else members[of_op])
    with np.errstate(invalid="ignore", divide="ignore"):
        busbw = np.where(transfer > 0, size / transfer * factor, np.nan)  # bytes per ns: GB/s
    # every (comm, op) with instances also has calls: place its figures on that row
    at = np.searchsorted(per_op.keys[0] * len(ops) + per_op.keys[1], per_instance.keys[0] * len(ops) + per_instance.keys[1])

    def on_rows(values: np.ndarray) -> np.ndarray:
        placed = np.full(per_op.count, np.nan)
        placed[at] = values
        return placed

    return {
        "comm_id": comm_ids[per_op.keys[0]],
        "op": ops[per_op.keys[1]],
        "calls": calls,
        "duration_mean_ns": per_op.sum(rank_total) / calls,  # float sums of int ns are exact: as a mean over calls
        "imbalance_cv": imbalance,
        "instances": np.bincount(at, weights=per_instance.size, minlength=per_op.count).astype(np.int64),
        "bytes_median": on_rows(_median_known(per_instance, size)),
        "transfer_mean_ns": on_rows(per_instance.mean(transfer)),
        "network_cv": on_rows(per_instance.std(relative)),
        "skew_mean_ns": on_rows(per_instance.mean(skew)),
        "skew_p99_ns": on_rows(per_instance.quantile(skew, 0.99)),
        "busbw_gbps": on_rows(_median_known(per_instance, busbw)),
    }


def _median_known(groups: Groups, values: np.ndarray) -> np.ndarray:
    """Median per group of the non-NaN values (NaN where a group has none)."""
    known = ~np.isnan(values)
    if known.all():  # the usual case: no grouping of the known ones
        return groups.median(values)
    out = np.full(groups.count, np.nan)
    if known.any():
        with_value = Groups(groups.id[known])
        out[with_value.keys[0]] = with_value.median(values[known])
    return out


def tp_overhead(events: Table, steps: Table, meta: Table, tp_comms: list[str]) -> dict[str, np.ndarray]:
    """Per TP communicator: exposed NCCL time (not overlapped by compute) as a fraction of step time.

    ``events`` carries every collective row with a ``wait`` column (0 where unmatched).
    Steps are used where the rank traced them (collectives inside steps, time = sum of
    step lengths); otherwise the capture window.
    """
    rank_all = np.asarray(events["rank"], np.int64)
    per_step_rank = Groups(np.asarray(steps["rank"], np.int64))
    stepped = per_step_rank.keys[0]  # ranks that traced steps, ascending
    comm_all, comm_ids = codes(events["comm_id"])
    in_scope = member_of(comm_ids, tp_comms)[comm_all] & (
        ~in_sorted(rank_all, stepped) | ~np.isnan(np.asarray(events["step"], np.float64))
    )
    rows = np.flatnonzero(in_scope)
    comm, rank = comm_all[rows], rank_all[rows]
    overlap = np.asarray(events["compute_overlap_ns"], dtype=np.float64)[rows]
    overlap[np.isnan(overlap)] = 0.0  # unknown: none (finite ns: what nan_to_num did, without its overhead)
    exposed = np.clip(np.asarray(events["duration"], dtype=np.float64)[rows] - overlap, 0, None)
    exposed_wait = np.minimum(np.asarray(events["wait"], dtype=np.float64)[rows], exposed)
    per_rank = Groups(comm, rank)
    ranks_of = per_rank.keys[1]
    step_time = per_step_rank.sum(np.asarray(steps["end_ns"], np.int64) - np.asarray(steps["start_ns"], np.int64))
    time = take_or(step_time, locate(stepped, ranks_of), np.nan)
    windowed = np.isnan(time)
    if windowed.any():  # ranks without steps: their capture window
        window = np.asarray(meta["window_end_ns"], np.int64) - np.asarray(meta["window_start_ns"], np.int64)
        time[windowed] = take_or(window, locate(np.asarray(meta["rank"], np.int64), ranks_of[windowed]), np.nan)
    per_comm = Groups(per_rank.keys[0], ordered=True)
    exposed_ns = per_comm.mean(per_rank.sum(exposed))
    wait_ns = per_comm.mean(per_rank.sum(exposed_wait))
    step_time_ns = per_comm.mean(time)
    base = np.where(step_time_ns > 0, step_time_ns, np.nan)
    return {
        "comm_id": comm_ids[per_comm.keys[0]],
        "exposed_ns": exposed_ns,
        "exposed_wait_ns": wait_ns,
        "step_time_ns": step_time_ns,
        "stepped": per_comm.all(in_sorted(ranks_of, stepped)),
        "exposed_transfer_ns": exposed_ns - wait_ns,
        "exposed_frac": exposed_ns / base,
        "exposed_wait_frac": wait_ns / base,
        "exposed_transfer_frac": (exposed_ns - wait_ns) / base,
    }
