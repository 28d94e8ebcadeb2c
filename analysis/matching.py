"""Collective instances across ranks: which row of which rank is the same call.

Identity comes from the trace: (communicator, sequence number) where the export
carries a sequence number, otherwise the k-th call on the communicator (ordinal),
checked on every instance: same op, same size where known, exactly the
communicator's members. Instances that fail a check are dropped and counted, with
a warning naming the communicator; nothing is ever matched by position alone
(reference/alignment-and-metrics.md §1, §5; style.md §4).

Point-to-point calls are matched per pair: the k-th call between two ranks on one
communicator, send pairing with recv.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rankscope.analysis.ops import ALLTOALL, P2P_OPS, RECV, SEND

UNMATCHED = -1


@dataclass
class Matching:
    """All collective rows with an ``instance`` column (``UNMATCHED`` where dropped)."""

    events: pd.DataFrame
    members: dict[str, tuple[int, ...]]  # comm_id -> member ranks present in the input
    names: dict[str, str | None]  # comm_id -> name from the trace (PG name, commName)
    method: str  # "trace seq", "ordinal", or "trace seq + ordinal"
    instances: int
    dropped_incomplete: int
    dropped_inconsistent: int
    warnings: list[str] = field(default_factory=list)


def communicator_members(
    communicators: pd.DataFrame, collectives: pd.DataFrame, present: set[int]
) -> tuple[dict[str, tuple[int, ...]], dict[str, str | None], list[str]]:
    """Members of each communicator among the ranks present, from the traces' member lists.

    Where no rank lists the members, they are inferred as the ranks that report the
    communicator or call collectives on it (said in a warning).
    """
    warnings: list[str] = []
    reporters = pd.concat(
        [communicators[["comm_id", "rank"]], collectives[["comm_id", "rank"]]], ignore_index=True
    ).drop_duplicates()
    reported = reporters.groupby("comm_id")["rank"].agg(lambda s: frozenset(s.tolist()))
    declared: dict[str, set[frozenset[int]]] = {}
    for comm_id, ranks in zip(communicators["comm_id"], communicators["ranks"]):
        if ranks is not None and len(ranks):
            declared.setdefault(comm_id, set()).add(frozenset(int(r) for r in ranks))
    names = (
        communicators.dropna(subset=["name"]).drop_duplicates("comm_id").set_index("comm_id")["name"].to_dict()
    )
    members: dict[str, tuple[int, ...]] = {}
    inferred: list[str] = []
    for comm_id, seen in reported.items():
        lists = declared.get(comm_id)
        if not lists:
            inferred.append(comm_id)
            members[comm_id] = tuple(sorted(seen))
            continue
        full = frozenset().union(*lists)
        if len(lists) > 1:
            warnings.append(f"communicator {comm_id}: ranks disagree on its members; using their union {sorted(full)}")
        strangers = seen - full
        if strangers:
            warnings.append(f"communicator {comm_id}: ranks {sorted(strangers)} use it but are not listed as members")
        members[comm_id] = tuple(sorted((full & present) | strangers))
    if inferred and len(present) > 1:
        shown = ", ".join(inferred[:3]) + (" ..." if len(inferred) > 3 else "")
        warnings.append(
            f"{len(inferred)} communicator(s) without member lists ({shown}): members inferred from the ranks that use them"
        )
    return members, {c: names.get(c) for c in members}, warnings


def match(collectives: pd.DataFrame, communicators: pd.DataFrame, present: set[int]) -> Matching:
    """Assign an instance id to every collective row that belongs to a complete, consistent instance."""
    members, names, warnings = communicator_members(communicators, collectives, present)
    events = collectives.reset_index(drop=True).copy()
    size = events["comm_id"].map({c: len(m) for c, m in members.items()}).to_numpy()
    is_p2p = events["op"].isin(P2P_OPS).to_numpy()

    # A communicator is matched by trace seq only if every one of its rows carries one.
    ordinal_comms = set(events.loc[events["seq_source"].ne("trace"), "comm_id"])
    use_ordinal = events["comm_id"].isin(ordinal_comms).to_numpy() & ~is_p2p
    events["_key_seq"] = events["seq"].to_numpy()
    order = events.sort_values(["rank", "comm_id", "start_ns"], kind="stable")
    ordinals = order.loc[~order["op"].isin(P2P_OPS)].groupby(["rank", "comm_id"], sort=False).cumcount()
    events.loc[use_ordinal, "_key_seq"] = ordinals.reindex(events.index[use_ordinal]).to_numpy()
    warnings += _ordinal_count_warnings(events.loc[use_ordinal], members)
    _shift_ordinals_on_shared_clocks(events, use_ordinal, warnings)

    peer = _p2p_peers(events, members, is_p2p, warnings)
    events["_lo"] = np.where(is_p2p, np.minimum(events["rank"], peer), -1)
    events["_hi"] = np.where(is_p2p, np.maximum(events["rank"], peer), -1)
    p2p_rows = is_p2p & (peer >= 0)
    p2p_order = events.loc[p2p_rows].sort_values(["rank", "comm_id", "_hi", "_lo", "start_ns"], kind="stable")
    events.loc[p2p_rows, "_key_seq"] = p2p_order.groupby(["rank", "comm_id", "_lo", "_hi"], sort=False).cumcount()

    keyed = ~is_p2p | p2p_rows
    keys = events.loc[keyed, ["comm_id", "_lo", "_hi", "_key_seq"]]
    group = np.full(len(events), UNMATCHED, dtype=np.int64)
    group[keyed] = keys.groupby(["comm_id", "_lo", "_hi", "_key_seq"], sort=False).ngroup().to_numpy()
    events["instance"] = group

    expected = np.where(is_p2p, 2, size)
    ok, incomplete, bad = _check_instances(events, expected, keyed, members, warnings)
    events["instance"] = np.where(np.isin(events["instance"].to_numpy(), ok), events["instance"], UNMATCHED)
    # Renumber densely so instance ids index arrays directly.
    matched = events["instance"].to_numpy() != UNMATCHED
    events.loc[matched, "instance"] = pd.factorize(events.loc[matched, "instance"], sort=True)[0]
    events = events.drop(columns=["_key_seq", "_lo", "_hi"])
    sources = set(events.loc[~events["op"].isin(P2P_OPS), "comm_id"]) - ordinal_comms
    method = " + ".join(
        m for m, used in (("trace seq", bool(sources)), ("ordinal", bool(ordinal_comms))) if used
    ) or "ordinal"
    if is_p2p.any():
        method += " (p2p: per-pair ordinal)"
    return Matching(
        events=events,
        members=members,
        names=names,
        method=method,
        instances=int(len(ok)),
        dropped_incomplete=incomplete,
        dropped_inconsistent=bad,
        warnings=warnings,
    )


def _p2p_peers(
    events: pd.DataFrame, members: dict[str, tuple[int, ...]], is_p2p: np.ndarray, warnings: list[str]
) -> np.ndarray:
    """The peer of each p2p row: traced, or the other member of a two-rank communicator."""
    peer = events["peer"].to_numpy(dtype=float, na_value=np.nan).copy()
    other = {c: m for c, m in members.items() if len(m) == 2}
    missing = is_p2p & np.isnan(peer)
    if missing.any():
        comm = events["comm_id"].to_numpy()
        ranks = events["rank"].to_numpy()
        pair_sum = pd.Series(comm[missing]).map({c: sum(m) for c, m in other.items()}).to_numpy(dtype=float)
        peer[missing] = pair_sum - ranks[missing]
        unknown = missing & np.isnan(peer)
        if unknown.any():
            warnings.append(f"{int(unknown.sum())} point-to-point call(s) without a known peer were not matched")
    return np.where(np.isnan(peer), -1, peer).astype(np.int64)


def _ordinal_count_warnings(rows: pd.DataFrame, members: dict[str, tuple[int, ...]]) -> list[str]:
    """Ordinal matching is only sound when every member captured the same calls."""
    counts = rows.groupby(["comm_id", "rank"]).size().groupby(level="comm_id").agg(["min", "max"])
    uneven = counts[counts["min"] != counts["max"]]
    return [
        f"communicator {comm}: members captured {lo} to {hi} calls; ordinal matching checks op and size "
        "on every instance but a capture window that starts mid-sequence can shift it"
        for comm, (lo, hi) in uneven.iterrows()
    ]


def _shift_ordinals_on_shared_clocks(events: pd.DataFrame, use_ordinal: np.ndarray, warnings: list[str]) -> None:
    """Re-align ordinals of ranks whose capture started or stopped a few calls off.

    Members on one host share a clock, so the k-th call's end must coincide with the
    host's reference member (the one with most calls); where it does not, try shifts
    of a few calls and keep one that makes ends coincide. Cross-host members cannot be
    checked this way (their clocks differ by more than a call period).
    """
    rows = events.loc[use_ordinal, ["comm_id", "host", "rank", "_key_seq", "end_ns"]]
    counts = rows.groupby(["comm_id", "host", "rank"]).size().rename("n").reset_index()
    counts = counts.sort_values(["comm_id", "host", "n", "rank"], ascending=[True, True, False, True])
    refs = counts.drop_duplicates(["comm_id", "host"]).rename(columns={"rank": "ref"})[["comm_id", "host", "ref"]]
    ref_rows = rows.merge(refs, left_on=["comm_id", "host", "rank"], right_on=["comm_id", "host", "ref"])
    ref_ends = ref_rows[["comm_id", "host", "_key_seq", "end_ns"]].rename(columns={"end_ns": "ref_end"})
    paired = rows.merge(ref_ends, on=["comm_id", "host", "_key_seq"])
    paired["miss"] = (paired["end_ns"] - paired["ref_end"]).abs()
    spacing = ref_rows.sort_values("_key_seq").groupby(["comm_id", "host"])["end_ns"].agg(
        lambda e: float(np.median(np.diff(e.to_numpy()))) if len(e) > 1 else np.inf
    )
    miss = paired.groupby(["comm_id", "host", "rank"])["miss"].median().reset_index()
    miss["spacing"] = miss.set_index(["comm_id", "host"]).index.map(spacing)
    suspect = miss[miss["miss"] > miss["spacing"] / 4]
    for comm_id, host, rank in suspect[["comm_id", "host", "rank"]].itertuples(index=False):
        mine = rows.loc[(rows["comm_id"] == comm_id) & (rows["rank"] == rank)].sort_values("_key_seq")["end_ns"].to_numpy()
        ref = ref_ends.loc[(ref_ends["comm_id"] == comm_id) & (ref_ends["host"] == host)].sort_values("_key_seq")["ref_end"].to_numpy()
        shift = _best_shift(mine, ref, spacing[(comm_id, host)])
        if shift is None:
            warnings.append(f"communicator {comm_id}: rank {rank}'s calls do not line up with its host's other members")
            continue
        events.loc[use_ordinal & (events["comm_id"] == comm_id).to_numpy() & (events["rank"] == rank).to_numpy(), "_key_seq"] += shift
        warnings.append(
            f"communicator {comm_id}: rank {rank}'s capture is {abs(shift)} call(s) "
            f"{'behind' if shift > 0 else 'ahead of'} its host's other members; re-aligned on shared-clock end times"
        )


def _best_shift(mine: np.ndarray, ref: np.ndarray, spacing: float, widest: int = 8) -> int | None:
    """The shift s (mine[k] ~ ref[k + s]) whose ends coincide, if one clearly does."""
    best, best_miss = None, np.inf
    for shift in range(-widest, widest + 1):
        k = np.arange(max(0, -shift), min(len(mine), len(ref) - shift))
        if len(k) < max(1, min(len(mine), len(ref)) // 2):
            continue
        miss = float(np.median(np.abs(mine[k] - ref[k + shift])))
        if miss < best_miss:
            best, best_miss = shift, miss
    return best if best_miss < spacing / 4 else None


def _check_instances(
    events: pd.DataFrame,
    expected: np.ndarray,
    keyed: np.ndarray,
    members: dict[str, tuple[int, ...]],
    warnings: list[str],
) -> tuple[np.ndarray, int, int]:
    """Instances that hold each expected participant once and agree on op and size."""
    rows = events.loc[keyed, ["instance", "comm_id", "rank", "op", "bytes", "_key_seq"]].copy()
    rows["expected"] = expected[keyed]
    member_pairs = pd.DataFrame(
        [(c, r) for c, ranks in members.items() for r in ranks], columns=["comm_id", "rank"]
    ).assign(is_member=True)
    rows = rows.merge(member_pairs, on=["comm_id", "rank"], how="left")
    rows["stranger"] = rows["is_member"].isna().astype(np.int64)
    # send and recv are one operation seen from its two ends.
    rows["send_recv"] = rows["op"].isin([SEND, RECV])
    rows["kind"] = rows["op"].where(~rows["send_recv"], "send/recv")
    # AllToAll(v) legitimately moves different amounts per rank; every other op agrees on size.
    rows.loc[rows["op"] == ALLTOALL, "bytes"] = np.nan
    per = rows.groupby("instance").agg(
        comm_id=("comm_id", "first"),
        seq=("_key_seq", "first"),
        n=("rank", "size"),
        distinct=("rank", "nunique"),
        strangers=("stranger", "sum"),
        kinds=("kind", "nunique"),
        ops=("op", "nunique"),
        sizes=("bytes", "nunique"),
        expected=("expected", "first"),
        send_recv=("send_recv", "first"),
    )
    inconsistent = (
        (per["distinct"] < per["n"])
        | (per["strangers"] > 0)
        | (per["kinds"] > 1)
        | (per["sizes"] > 1)
        | (per["send_recv"] & (per["n"] == 2) & (per["ops"] != 2))  # two sends, or two recvs
    )
    incomplete = ~inconsistent & (per["n"] < per["expected"])
    single = per["expected"] < 2  # a communicator with one member present: nothing to compare
    ok = per.index[~inconsistent & ~incomplete & ~single].to_numpy()
    for comm_id, bad in per[inconsistent].groupby("comm_id"):
        first = bad["seq"].min()
        warnings.append(
            f"communicator {comm_id}: {len(bad)} of {int((per['comm_id'] == comm_id).sum())} instances disagree "
            f"on op, size or participants (first at #{first}); dropped"
        )
    for comm_id, short in per[incomplete].groupby("comm_id"):
        warnings.append(
            f"communicator {comm_id}: {len(short)} instance(s) missing a participant (capture window edges?); dropped"
        )
    return ok, int(incomplete.sum()), int(inconsistent.sum())
