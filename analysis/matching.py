"""Collective instances across ranks: which row of which rank is the same call.

Identity comes from the trace: (communicator, sequence number) where the export
carries a sequence number, otherwise the k-th call on the communicator (ordinal),
checked on every instance: same op, same size where known, exactly the
communicator's members in the input that recorded any of its calls. Instances
that fail a check are dropped and counted, with a warning naming the
communicator; nothing is ever matched by position alone
(reference/alignment-and-metrics.md §1, §5; style.md §4).

Point-to-point calls are matched per pair: the k-th call between two ranks on one
communicator, send pairing with recv.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from rankscope.analysis import lines
from rankscope.analysis.groups import ArrayLike, Groups, Table, codes, distinct, isin, member_of, run_starts
from rankscope.analysis.ops import ALLTOALL, N_TO_N_OPS, P2P_OPS, RECV, SEND
from rankscope.analysis.report import ranks_text, some_of
from rankscope.analysis.robust import nanmedian

UNMATCHED = -1
_RANK_SPAN = 1 << 32  # (communicator, rank) pairs as one int64 key
_NEAR_SHIFTS = 8  # shifts of a member's calls tried either way, where the counts do not say more
MIN_MOVED_GAPS = 6  # gaps a shift past those must compare at least (and a third of a member's)
MAX_MOVED_SHIFT = 512  # calls, the most a moved window's gaps are searched either way (cost: shifts x gaps)
_CELLS = 1 << 20  # (shift, call) pairs compared at once
GAP_FLOOR_RATIO = 4  # a member's gaps this much further from its reference's than the closest member's: a look
ALIGNED_GAP_SHARE = 200  # aligned, a member's gaps miss its reference's by under 1/this of a gap
MOVED_CHANCE = 1e-4  # a moved window's shift is taken where end jitter alone fits one as well less often


class _Fit(Enum):
    """How well the shift `_best_gap_shift` found fits a member's gaps."""

    CLEAR = "clear"  # taken
    TURNS = "turns"  # clearly closer than unshifted, not than another shift (roots taking turns?): warned
    WEAK = "weak"  # only 2x closer than unshifted: left alone
    FEW = "few"  # a moved window's, jitter alone may fit as well: taken where its host's members make that unlikely


@dataclass(frozen=True)
class _GapFit:
    """The shift `_best_gap_shift` found for a member and how well it fits; for FEW, the
    ``chance`` that end jitter alone fits that shift as closely (`_by_chance`) and how many
    shifts were ``tried``, any of which it might have fitted so."""

    shift: int
    fit: _Fit
    chance: float = 1.0
    tried: int = 1


@dataclass
class Matching:
    """All collective rows with an ``instance`` column (``UNMATCHED`` where dropped)."""

    events: dict[str, ArrayLike]  # the input's columns, plus instance
    members: dict[str, tuple[int, ...]]  # comm_id -> member ranks present in the input
    sizes: dict[str, int]  # comm_id -> member count, those absent from the input too where the traces say
    names: dict[str, str | None]  # comm_id -> name from the trace (PG name, commName)
    unconfirmed: frozenset[str]  # comm_ids whose members no trace lists nor a size confirms: maybe pooled groups
    realigned: frozenset[str]  # comm_ids a member's ordinals were shifted on (a capture cut a few calls off)
    uneven: frozenset[str]  # ordinal-matched comm_ids whose members captured different numbers of calls
    method: str  # "trace seq", "ordinal", or "trace seq + ordinal"
    instances: int
    dropped_incomplete: int
    dropped_inconsistent: int
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FittedEnds:
    """Each collective row's end on clocks fitted without the calls of ``comm_ids``, or told
    by the coordinator: where the gaps between ends could not tell a shift, those ends can
    (`match`), for members whose calls are more than 4 ``error_ns`` apart (`_best_shift`
    takes a shift whose ends miss by under a quarter of the spacing)."""

    comm_ids: frozenset[str]
    end: np.ndarray  # aligned ns, one per row of the collectives `match` is given
    source: str = "the clocks fitted from the other communicators"  # what put the ends on one clock, for warnings
    error_ns: float = 0.0  # how far those clocks may be off one another


def communicator_members(
    communicators: Table, collectives: Table, present: set[int], explained: frozenset[str] = frozenset()
) -> tuple[dict[str, tuple[int, ...]], dict[str, int], dict[str, str | None], frozenset[str], list[str]]:
    """Members of each communicator among the ranks present, from the traces' member lists,
    and each communicator's size (members absent from the input count too, where the
    traces list them or give the size); also the communicators whose inferred members no
    size confirms (`unconfirmed`), and those told apart by their lines (``explained``,
    `lines.infer`: a size does not confirm how their members were paired).

    Where no rank lists the members, they are inferred as the ranks that report the
    communicator or call collectives on it, checked against the communicator's size
    where the traces give it (NCCL nranks); a warning says so where the size is unknown
    or disagrees (not of ``explained``, whose own warning says how), and where listed members
    are not in the input.
    """
    warnings: list[str] = []
    declared, names, sizes = _listed(communicators)
    members: dict[str, tuple[int, ...]] = {}
    counts: dict[str, int] = {}
    inferred: list[str] = []  # unlisted, and of unknown size
    checked: dict[str, tuple[int, list[int]]] = {}
    absent: list[str] = []
    for comm_id, seen in _reporting_ranks(communicators, collectives).items():
        lists = declared.get(comm_id)
        if not lists:
            members[comm_id] = tuple(sorted(seen))
            told = sizes.get(comm_id, set())
            counts[comm_id] = next(iter(told)) if len(told) == 1 and len(seen) <= min(told) else len(seen)
            if comm_id in sizes:
                checked[comm_id] = (len(seen), sorted(sizes[comm_id]))
            elif comm_id not in explained:
                inferred.append(comm_id)
            continue
        members[comm_id], counts[comm_id], full = _listed_members(comm_id, seen, lists, present, warnings)
        if full - present:
            absent.append(f"{comm_id}: {_ranks_named(sorted(full - present))} missing, "
                          f"{len(full & present)} of {len(full)} present")
    warnings += _membership_warnings(present, inferred, checked, absent)
    return members, counts, {c: names.get(c) for c in members}, _unconfirmed(inferred, checked) | explained, warnings


def _reporting_ranks(communicators: Table, collectives: Table) -> dict[str, frozenset[int]]:
    """The ranks that report each communicator or call collectives on it."""
    (listed, listed_ids), (used, used_ids) = codes(communicators["comm_id"]), codes(collectives["comm_id"])
    # usually every communicator is both listed and used: no union to build
    comm_ids = used_ids if np.array_equal(listed_ids, used_ids) else np.union1d(listed_ids, used_ids)
    comm = np.concatenate([np.searchsorted(comm_ids, listed_ids)[listed], np.searchsorted(comm_ids, used_ids)[used]])
    rank = np.concatenate([np.asarray(communicators["rank"], np.int64), np.asarray(collectives["rank"], np.int64)])
    low = int(rank.min()) if len(rank) else 0  # int32 ranks from their lowest: one int64 key per pair
    comm_of, rank_of = np.divmod(distinct(comm * _RANK_SPAN + (rank - low)), _RANK_SPAN)  # distinct, ascending
    rank_of += low
    bounds = np.append(run_starts(comm_of).nonzero()[0], len(comm_of))
    return {comm_ids[comm_of[a]]: frozenset(rank_of[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:])}


def _listed(communicators: Table) -> tuple[dict[str, set[frozenset[int]]], dict[str, str], dict[str, set[int]]]:
    """Per communicator, the member lists, the first name and the sizes the traces give."""
    declared: dict[str, set[frozenset[int]]] = {}
    names: dict[str, str] = {}
    sizes: dict[str, set[int]] = {}
    listed_sizes = communicators["size"].tolist() if "size" in communicators else [None] * len(communicators["comm_id"])
    for comm_id, ranks, name, size in zip(*(communicators[c].tolist() for c in ("comm_id", "ranks", "name")), listed_sizes):
        if ranks is not None and len(ranks):
            declared.setdefault(comm_id, set()).add(frozenset(np.asarray(ranks, dtype=np.int64).tolist()))
        if isinstance(name, str) and comm_id not in names:
            names[comm_id] = name
        if size is not None and size == size:  # NaN: not known
            sizes.setdefault(comm_id, set()).add(int(size))
    return declared, names, sizes


def _listed_members(comm_id: str, seen: frozenset[int], lists: set[frozenset[int]], present: set[int],
                    warnings: list[str]) -> tuple[tuple[int, ...], int, frozenset[int]]:
    """A listed communicator's members among the ranks ``present``, its member count and every
    member listed (``seen``: the ranks using it; ``lists``: the member lists the traces give)."""
    full = frozenset().union(*lists)
    if len(lists) > 1:
        warnings.append(f"communicator {comm_id}: ranks disagree on its members; using their union {sorted(full)}")
    strangers = seen - full
    if strangers:
        warnings.append(f"communicator {comm_id}: ranks {sorted(strangers)} use it but are not listed as members")
    return tuple(sorted((full & present) | strangers)), len(full | strangers), full


def _membership_warnings(present: set[int], inferred: list[str], checked: dict[str, tuple[int, list[int]]],
                         absent: list[str]) -> list[str]:
    """The warnings on members inferred (``inferred``, ``checked``: as `_unconfirmed` takes them)
    where several ranks are ``present``, and on listed members not in the input (``absent``)."""
    warnings: list[str] = []
    if len(present) > 1:
        if inferred:
            warnings.append(f"{len(inferred)} communicator(s) without member lists ({some_of(inferred)}): "
                            "members inferred from the ranks that use them")
        warnings += _size_warnings(checked)
    if absent:
        warnings.append(f"{len(absent)} communicator(s) with listed members not in the input ({some_of(absent)}): "
                        "matched among the members present")
    return warnings


def _ranks_named(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {ranks_text(ranks)}"


def _calling_members(members: dict[str, tuple[int, ...]], comm: np.ndarray, comm_ids: np.ndarray, rank: np.ndarray,
                     warnings: list[str]) -> np.ndarray:
    """Per communicator (``comm_ids``; ``comm``, ``rank``: each row's), how many of its members
    in the input recorded any of its calls, the participants an N-to-N instance needs. A member
    that recorded none of them is matched around, as one not in the input (and named in a
    warning), not taken for a capture cut that left every instance incomplete; one that
    recorded some of them keeps those it lacks incomplete (capture window edges)."""
    comm_of, rank_of = Groups(comm, rank).keys  # the distinct (communicator, rank) pairs with calls
    calling = np.bincount(comm_of, minlength=len(comm_ids))
    silent = [
        f"{comm_ids[c]}: {_ranks_named(sorted(set(members[comm_ids[c]]) - set(rank_of[comm_of == c].tolist())))}"
        for c in np.flatnonzero(calling < [len(members[c]) for c in comm_ids]).tolist()
    ]
    if silent:
        warnings.append(f"{len(silent)} communicator(s) with members that recorded none of their calls "
                        f"({some_of(silent)}): matched among the members that did (profiled without "
                        "collective tracing, or a capture that missed those calls?)")
    return calling


def _unconfirmed(inferred: list[str], checked: dict[str, tuple[int, list[int]]]) -> frozenset[str]:
    """The communicators whose members, inferred from the ranks using them, no size the traces
    give confirms (``checked``: comm_id -> (ranks using it, sizes given)). Their ids may pool
    several groups' calls (nsys without NCCL payloads, Kineto calls naming no process group);
    an id that names one communicator (NCCL's commHash) comes with the size it was made with."""
    return frozenset(inferred) | {c for c, (seen, sizes) in checked.items() if sizes != [seen]}


def _size_warnings(checked: dict[str, tuple[int, list[int]]]) -> list[str]:
    """Where the ranks using unlisted communicators do not make up their sizes: one
    warning per kind of disagreement, naming a few communicators (comm_id -> (ranks
    using it, sizes the traces give))."""
    kinds: dict[str, list[str]] = {}
    for comm_id, (seen, sizes) in checked.items():
        if len(sizes) > 1:
            kinds.setdefault("whose ranks disagree on the size", []).append(f"{comm_id}: {'/'.join(map(str, sizes))}")
        elif seen < sizes[0]:
            kinds.setdefault("used by fewer ranks than their size", []).append(f"{comm_id}: {seen} of {sizes[0]}")
        elif seen > sizes[0]:
            kinds.setdefault("used by more ranks than their size (told apart only by op and size?)", []).append(
                f"{comm_id}: {seen} for {sizes[0]}")
    return [
        f"{len(found)} communicator(s) {kind} ({some_of(found)}): "
        "members inferred from the ranks that use them"
        for kind, found in kinds.items()
    ]


def match(collectives: Table, communicators: Table, present: set[int], fitted: FittedEnds | None = None) -> Matching:
    """Assign an instance id to every collective row that belongs to a complete, consistent
    instance; the communicators of calls no trace names first told apart where their lines
    allow (`lines.infer`). Given ``fitted``, the members of its communicators are re-aligned
    on those ends too, after every other re-alignment."""
    inferred = lines.infer(collectives, communicators)
    members, sizes, names, unconfirmed, warnings = communicator_members(
        inferred.communicators, inferred.collectives, present, inferred.comm_ids)
    warnings = inferred.warnings + warnings
    events = inferred.collectives
    comm, comm_ids = codes(events["comm_id"])
    rank = np.asarray(events["rank"], np.int64)
    start = np.asarray(events["start_ns"], np.int64)
    op, ops = codes(events["op"])
    is_p2p = member_of(ops, P2P_OPS)[op]

    # A communicator is matched by trace seq only if every one of its rows carries one.
    untraced = ~isin(events["seq_source"], ["trace"])
    ordinal_comm = np.zeros(len(comm_ids), dtype=bool)
    ordinal_comm[comm[untraced]] = True
    use_ordinal = ordinal_comm[comm] & ~is_p2p
    seq = np.asarray(events["seq"], np.int64)
    ordinal, calls = _ordinals(untraced, comm, rank, seq, start, is_p2p)
    key_seq = np.where(use_ordinal, ordinal, seq)
    counted = ordinal_comm[calls.keys[1]]
    uneven = _uneven_counts(calls.keys[1][counted], calls.size[counted], comm_ids)
    warnings += _ordinal_count_warnings(uneven)
    # Calls of several communicators pooled as one end apart by nature: their ends say
    # nothing of a shift (a slow DP group's ends fall at the others' next call's).
    shiftable = use_ordinal & ~member_of(comm_ids, inferred.pooled)[comm]
    realigned = _realign_ordinals(key_seq, shiftable, events, comm, comm_ids, rank, op, ops, fitted, warnings)
    keyed, pair_keys = _p2p_keys(key_seq, events, comm, comm_ids, rank, start, op, ops, is_p2p, members, sizes,
                                 warnings)
    expected = np.where(is_p2p, 2, _calling_members(members, comm, comm_ids, rank, warnings)[comm])
    events["instance"], instances, incomplete, bad = _instances(
        keyed, pair_keys, comm, comm_ids, rank, op, ops, events["bytes"], key_seq, expected, warnings)
    return Matching(
        events=events,
        members=members,
        sizes=sizes,
        names=names,
        unconfirmed=unconfirmed,
        realigned=frozenset(realigned),
        uneven=frozenset(uneven),
        method=_method(comm, comm_ids, ordinal_comm, is_p2p),
        instances=instances,
        dropped_incomplete=incomplete,
        dropped_inconsistent=bad,
        warnings=warnings,
    )


def _ordinals(untraced: np.ndarray, comm: np.ndarray, rank: np.ndarray, seq: np.ndarray, start: np.ndarray,
              is_p2p: np.ndarray) -> tuple[np.ndarray, Groups]:
    """Each collective row's ordinal on its communicator (0 on p2p rows), and the collective
    rows grouped per (rank, communicator) (``untraced``: rows whose seq the ingest numbered)."""
    collective = ~is_p2p
    ordinal = np.zeros_like(seq)
    # The k-th call: in the order the ingest numbered a rank's calls on the communicator, where
    # it numbered them all ("ordinal": Kineto counts host calls, as the program made them; gloo's
    # worker threads may start two calls made together, async, in either order), else by arrival.
    if untraced[collective].all():  # the ingest numbered every call (the usual case): no grouping to tell
        numbered = np.ones(int(collective.sum()), bool)
    else:
        per_rank = Groups(rank[collective], comm[collective])
        numbered = per_rank.all(untraced[collective])[per_rank.id]
    within = np.where(numbered, seq[collective], start[collective])
    calls = Groups(rank[collective], comm[collective], within=within)  # per (rank, communicator)
    # Numbered calls keep the gaps the ingest left (a call it numbered but could not time,
    # as gloo's calls in doubt: every later one would move up a place on that rank only), less
    # the sends and receives numbered among them: matched apart, and a pipeline's middle
    # stage makes more of them than its neighbours.
    counted_seq = (seq - _p2p_before(rank, comm, seq, is_p2p))[collective]
    first = calls.min(counted_seq)[calls.id]
    ordinal[collective] = np.where(numbered, counted_seq - first, calls.cumcount())
    return ordinal, calls


@dataclass(frozen=True)
class _Ordinals:
    """The collective rows the re-alignments work on: their keys (``key_seq``, shifted in
    place), the rows matched by ordinal that may be shifted (``use_ordinal``), the calls whose
    ends coincide on every member (``together``), and each row's communicator (a code into
    ``comm_ids``), host code, rank and end."""

    key_seq: np.ndarray
    use_ordinal: np.ndarray
    together: np.ndarray
    comm: np.ndarray
    comm_ids: np.ndarray
    host: np.ndarray
    rank: np.ndarray
    end: np.ndarray


def _realign_ordinals(key_seq: np.ndarray, use_ordinal: np.ndarray, events: Table, comm: np.ndarray,
                      comm_ids: np.ndarray, rank: np.ndarray, op: np.ndarray, ops: np.ndarray,
                      fitted: FittedEnds | None, warnings: list[str]) -> set[str]:
    """Re-align ordinals (``key_seq``, in place) of members whose capture started or stopped a
    few calls off: on shared clocks, on the gaps across hosts, then on ``fitted`` ends; the
    comm_ids re-aligned."""
    host, _ = codes(events["host"])
    calls = _Ordinals(key_seq, use_ordinal, member_of(ops, N_TO_N_OPS)[op], comm, comm_ids, host, rank,
                      np.asarray(events["end_ns"], np.int64))
    realigned = _shift_ordinals_on_shared_clocks(calls, warnings) | _shift_ordinals_across_hosts(calls, warnings)
    if fitted is not None:
        suspect = use_ordinal & member_of(comm_ids, fitted.comm_ids)[comm]
        realigned |= _shift_ordinals_on_fitted_clocks(replace(calls, use_ordinal=suspect), fitted, warnings)
    return realigned


def _p2p_keys(key_seq: np.ndarray, events: Table, comm: np.ndarray, comm_ids: np.ndarray, rank: np.ndarray,
              start: np.ndarray, op: np.ndarray, ops: np.ndarray, is_p2p: np.ndarray,
              members: dict[str, tuple[int, ...]], sizes: dict[str, int],
              warnings: list[str]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """The rows keyed into instances and the keys of their pairs (lo, hi) where there are p2p
    calls; each p2p row of a known peer numbered (``key_seq``, in place) as the k-th call
    between the pair (lo, hi) on the communicator."""
    if not is_p2p.any():  # no p2p call (the usual case): every row, keyed without a pair
        return ~is_p2p, ()
    peer = _p2p_peers(events["peer"], comm, comm_ids, rank, members, sizes, is_p2p, warnings)
    # A send and a recv are one transfer from its source to its destination: the k-th send
    # from a to b meets b's k-th recv from a, whatever else the two exchange the other way
    # (isend then irecv on both ranks; a pipeline's activations forward, its gradients back).
    # A fused SendRecv says no direction: the k-th between the two.
    sends, recvs = is_p2p & member_of(ops, [SEND])[op], is_p2p & member_of(ops, [RECV])[op]
    lo = np.where(sends, rank, np.where(recvs, peer, np.where(is_p2p, np.minimum(rank, peer), -1)))
    hi = np.where(sends, peer, np.where(recvs, rank, np.where(is_p2p, np.maximum(rank, peer), -1)))
    p2p_rows = is_p2p & (peer >= 0)
    if p2p_rows.any():
        key_seq[p2p_rows] = Groups(
            rank[p2p_rows], comm[p2p_rows], lo[p2p_rows], hi[p2p_rows], within=start[p2p_rows]
        ).cumcount()
    keyed = ~is_p2p | p2p_rows
    return keyed, (lo[keyed], hi[keyed])


def _instances(keyed: np.ndarray, pair_keys: tuple[np.ndarray, ...], comm: np.ndarray, comm_ids: np.ndarray,
               rank: np.ndarray, op: np.ndarray, ops: np.ndarray, size_bytes: ArrayLike, key_seq: np.ndarray,
               expected: np.ndarray, warnings: list[str]) -> tuple[np.ndarray, int, int, int]:
    """Each row's instance, numbered 0, 1, ... over the instances `_check_instances` keeps
    (``UNMATCHED`` where dropped or not ``keyed``), and how many were kept, dropped incomplete
    and dropped inconsistent."""
    group = np.full(len(rank), UNMATCHED, dtype=np.int64)
    group[keyed] = Groups(comm[keyed], *pair_keys, key_seq[keyed]).first_seen()
    ok, incomplete, bad = _check_instances(
        group, keyed, comm, comm_ids, rank, op, ops, size_bytes, key_seq, expected, warnings
    )
    # Renumber densely (in first-seen order) so instance ids index arrays directly.
    dense = np.full(int(group.max()) + 2 if len(group) else 1, UNMATCHED, dtype=np.int64)
    dense[ok] = np.arange(len(ok))
    return dense[group], int(len(ok)), incomplete, bad


def _method(comm: np.ndarray, comm_ids: np.ndarray, ordinal_comm: np.ndarray, is_p2p: np.ndarray) -> str:
    """How instances were told apart (`Matching.method`): by trace seq, ordinal or both."""
    traced = (np.bincount(comm[~is_p2p], minlength=len(comm_ids)) > 0) & ~ordinal_comm
    method = " + ".join(
        m for m, used in (("trace seq", bool(traced.any())), ("ordinal", bool(ordinal_comm.any()))) if used
    ) or "ordinal"
    if is_p2p.any():
        method += " (p2p: per-pair ordinal)"
    return method


def _p2p_peers(
    traced: ArrayLike,
    comm: np.ndarray,
    comm_ids: np.ndarray,
    rank: np.ndarray,
    members: dict[str, tuple[int, ...]],
    sizes: dict[str, int],
    is_p2p: np.ndarray,
    warnings: list[str],
) -> np.ndarray:
    """The global rank of each p2p row's peer: the other member of a two-rank communicator;
    else the traced peer, which is NCCL's peer argument, a rank within the communicator,
    mapped through the members in global order (as torch numbers a group's ranks: new_group
    sorts them, split_group keys by global rank), where every member is in the input."""
    peer = np.full(len(rank), np.nan)
    pair_sum = np.array([sum(members[c]) if sizes[c] == 2 == len(members[c]) else np.nan for c in comm_ids])
    paired = is_p2p & ~np.isnan(pair_sum[comm])
    peer[paired] = pair_sum[comm[paired]] - rank[paired]
    local = np.asarray(traced, dtype=np.float64)
    mapped = is_p2p & ~paired & ~np.isnan(local)
    for c in np.unique(comm[mapped]).tolist():
        ranks = members[comm_ids[c]]
        if sizes[comm_ids[c]] != len(ranks):  # a member absent: its place in the order is not known
            continue
        rows = mapped & (comm == c)
        inside = rows & (local >= 0) & (local < len(ranks))
        peer[inside] = np.asarray(ranks, dtype=np.float64)[local[inside].astype(np.int64)]
    unknown = is_p2p & np.isnan(peer)
    if unknown.any():
        warnings.append(f"{int(unknown.sum())} point-to-point call(s) without a known peer were not matched")
    return np.where(np.isnan(peer), -1, peer).astype(np.int64)


def _p2p_before(rank: np.ndarray, comm: np.ndarray, seq: np.ndarray, is_p2p: np.ndarray) -> np.ndarray:
    """Per call, how many point-to-point calls its rank numbered before it on its communicator."""
    if not is_p2p.any():  # the usual case: none to count, no grouping
        return np.zeros(len(rank), np.int64)
    calls = Groups(rank, comm, within=seq)
    p2p = is_p2p[calls.order].astype(np.int64)
    before = np.cumsum(p2p) - p2p
    before -= np.repeat(before[calls.starts], calls.size)
    out = np.empty(calls.rows, np.int64)
    out[calls.order] = before
    return out


def _uneven_counts(comm: np.ndarray, calls: np.ndarray, comm_ids: np.ndarray) -> dict[str, tuple[int, int]]:
    """The communicators (``comm``, one per rank) whose members captured different numbers of
    calls (``calls`` per rank), with the fewest and most: comm_id -> (fewest, most)."""
    if not len(calls) or calls.min() == calls.max():  # the usual case: every rank made as many calls
        return {}
    per_comm = Groups(comm)
    lo, hi = per_comm.min(calls), per_comm.max(calls)
    return {
        str(comm_ids[c]): (low, high)
        for c, low, high in zip(per_comm.keys[0].tolist(), lo.tolist(), hi.tolist())
        if low != high
    }


def _ordinal_count_warnings(uneven: dict[str, tuple[int, int]]) -> list[str]:
    """Ordinal matching is only sound when every member captured the same calls (``uneven``:
    comm_id -> fewest and most calls of a member, where they differ)."""
    return [
        f"communicator {comm_id}: members captured {low} to {high} calls; ordinal matching checks op and size "
        "on every instance but a capture window that starts mid-sequence can shift it"
        for comm_id, (low, high) in uneven.items()
    ]


def _shift_ordinals_on_shared_clocks(calls: _Ordinals, warnings: list[str]) -> set[str]:
    """Re-align ordinals (``calls.key_seq``, in place) of ranks whose capture started or stopped a
    few calls off their host's other members (`_shift_ordinals_on_clocks`): members on one
    host share a clock. Cross-host members cannot be checked this way (their clocks differ
    by more than a call period)."""
    shifted = set()
    for c, r, _, shift in _shift_ordinals_on_clocks(calls, calls.host, calls.end):
        comm_id = calls.comm_ids[c]
        if shift is None:
            warnings.append(f"communicator {comm_id}: rank {r}'s calls do not line up with its host's other members")
            continue
        shifted.add(str(comm_id))
        warnings.append(f"communicator {comm_id}: rank {r}'s capture is {_calls_off(shift)} its host's other members; "
                        "re-aligned on shared-clock end times")
    return shifted


def _shift_ordinals_on_fitted_clocks(calls: _Ordinals, fitted: FittedEnds, warnings: list[str]) -> set[str]:
    """Re-align ordinals (``calls.key_seq``, in place) of the ``use_ordinal`` rows' members on their
    ends on clocks fitted from other communicators' calls, or told by the coordinator
    (``fitted``): on those, as on one host's, a call's ends coincide on every member
    (`_shift_ordinals_on_clocks`, all rows on one clock). One warning per communicator.

    A shift is kept only where it pairs the member's last call with its reference's: a
    window cut at its start, as the reference's holds the member's. One that leaves calls of
    the reference unpaired at both edges is undone: the clocks are fitted from communicators
    re-aligned on their gaps, whose shift may itself be a few calls short of one larger than
    `_shift_misses` tries (a node cut 9 steps, paired 8 off: every communicator then agrees on
    clocks 8 steps off, and happens-before no longer says so)."""
    key_seq = calls.key_seq
    before = key_seq.copy()
    found = _shift_ordinals_on_clocks(calls, np.zeros_like(calls.comm), fitted.end, fitted.error_ns)
    ranks: dict[int, dict[tuple[int, int | None, bool], list[int]]] = {}  # comm -> (reference, shift, kept) -> ranks
    for c, r, ref, shift in found:
        kept = shift is not None and _ends_with_reference(calls, c, r, ref)
        if shift is not None and not kept:
            undone = calls.use_ordinal & (calls.comm == c) & (calls.rank == r)
            key_seq[undone] = before[undone]
        ranks.setdefault(c, {}).setdefault((ref, shift, kept), []).append(r)
    shifted = {c for c, by_shift in ranks.items() if any(kept for _, _, kept in by_shift)}
    warnings += [f"communicator {calls.comm_ids[c]}: {', '.join(map(_found_shift, by_shift.items()))}; "
                 f"{'re-aligned' if c in shifted else 'left as matched'} on {fitted.source}"
                 for c, by_shift in ranks.items()]
    return {str(calls.comm_ids[c]) for c in shifted}


def _found_shift(found: tuple[tuple[int, int | None, bool], list[int]]) -> str:
    """What a re-alignment on clocks found for some members: ((reference, shift, kept), ranks)."""
    (reference, shift, kept), ranks = found
    if shift is None:
        return f"the calls of rank(s) {ranks_text(ranks)} do not line up with rank {reference}'s"
    return (f"the capture of rank(s) {ranks_text(ranks)} is {_calls_off(shift)} rank {reference}'s"
            + ("" if kept else ", which leaves its calls unpaired at both edges of the capture"))


def _calls_off(shift: int) -> str:
    """How far a capture is off another, shifted by ``shift`` calls to pair with it."""
    return f"{abs(shift)} call(s) {'behind' if shift > 0 else 'ahead of'}"


def _ends_with_reference(calls: _Ordinals, c: int, member: int, reference: int) -> bool:
    """Whether the ``member``'s last call on communicator code ``c`` is its ``reference``'s
    last (ordinals ``key_seq`` of the ``use_ordinal`` rows)."""
    on = calls.use_ordinal & (calls.comm == c)
    mine, theirs = (int(calls.key_seq[on & (calls.rank == r)].max()) for r in (member, reference))
    return mine == theirs


def _shift_ordinals_on_clocks(calls: _Ordinals, clock: np.ndarray, end: np.ndarray,
                              error: float = 0.0) -> list[tuple[int, int, int, int | None]]:
    """Re-align ordinals (``calls.key_seq``, in place) of ranks whose capture started or stopped a
    few calls off; (communicator code, rank, its reference rank, shift or None where no shift
    makes ends coincide) per rank found off.

    Members whose ends are on one ``clock`` (a host's, or fitted ones) must see the k-th
    call end when the reference member on that clock (the one with most calls) does; where
    they do not, try shifts of a few calls and keep one that makes ends coincide. Only calls
    whose ends coincide (``together``: N-to-N ops) are compared: a broadcast's root ends once
    it has sent, a reduce's root once all came in. The ordinals are 0, 1, ... in each rank's
    calls on a communicator (a rank has one clock). Where the clocks may be ``error`` off one
    another, a rank whose reference's calls are not 4x that apart is left: a shift is taken
    where ends miss by under a quarter of the spacing, which such an error could fake.
    """
    key_seq, together = calls.key_seq, calls.together
    rows = np.flatnonzero(calls.use_ordinal)
    if not len(rows):
        return []
    per_rank, ref_of = _ordinal_calls(calls, rows, clock)  # each rank's calls, and its reference
    rc, rr = per_rank.keys[0], per_rank.keys[-1]
    # Rows by rank, then ordinal: the k-th call of a rank and of its reference (which has
    # at least as many calls) are each group's k-th rows.
    ends, joint = end[rows][per_rank.order], together[rows][per_rank.order]
    misses = _misses_on_clock(per_rank, ref_of, ends, joint)
    if misses is None:
        return []
    miss, spacing = misses
    c, r, k = calls.comm[rows], calls.rank[rows], key_seq[rows]
    found = []
    for i in np.flatnonzero((miss > spacing / 4) & (spacing > 4 * error)).tolist():  # off: rare, one by one
        mine_rows = rows[(c == rc[i]) & (r == rr[i])]
        mine = mine_rows[np.argsort(key_seq[mine_rows], kind="stable")]
        ref = _rows_of(per_rank, ref_of[i])
        shift = _best_shift(end[mine], ends[ref], spacing[i], together[mine], joint[ref])
        # ends are compared call by call, so ``shift`` is from the reference's first key;
        # an earlier re-alignment (on the gaps) may have shifted this member's keys already
        shifted = int(key_seq[mine[0]]) - int(k[per_rank.order[ref.start]])
        if shift == shifted:
            continue
        if shift is not None:
            key_seq[mine_rows] += shift - shifted
        found.append((int(rc[i]), int(rr[i]), int(rr[ref_of[i]]), shift))
    return found


def _misses_on_clock(per_rank: Groups, ref_of: np.ndarray, ends: np.ndarray,
                     joint: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Per member (group of ``per_rank``), the median miss of its ends from its reference's,
    call by call (only calls that end together, ``joint``), and its reference's median spacing
    of consecutive ends; None where every end is well within that spacing (the usual case)."""
    is_ref = ref_of == np.arange(per_rank.count)
    group = np.arange(per_rank.count).repeat(per_rank.size)
    position = np.arange(per_rank.rows) - per_rank.starts[group]
    at_ref = per_rank.starts[ref_of][group] + position
    off = np.abs(ends - ends[at_ref])
    compared = joint & joint[at_ref]  # both ends of an op that ends together
    step = (position[1:] > 0) & is_ref[group[1:]]
    gaps = np.diff(ends)[step]  # between consecutive ends of each reference
    # The usual case: every end within a quarter of the closest spacing of any reference,
    # so no rank's median miss exceeds a quarter of its reference's median spacing.
    if not len(gaps) or not compared.any() or 4 * int(off[compared].max()) <= int(gaps.min()):
        return None
    miss = _group_medians(group[compared], off[compared], per_rank.count, 0.0)
    # Each reference's median spacing of consecutive ends (inf below two calls).
    spacing = _group_medians(group[1:][step], gaps, per_rank.count, np.inf)
    return miss, spacing[ref_of]


def _ordinal_calls(calls: _Ordinals, rows: np.ndarray, *clock: np.ndarray) -> tuple[Groups, np.ndarray]:
    """The ``rows``' calls grouped per member (communicator, ``clock`` where given, rank) in
    ordinal order, and each member's reference group (`_references`)."""
    per_rank = Groups(calls.comm[rows], *(c[rows] for c in clock), calls.rank[rows], within=calls.key_seq[rows])
    return per_rank, _references(per_rank.size, per_rank.keys[-1], *per_rank.keys[:-1])


def _rows_of(groups: Groups, g: int) -> slice:
    """Group ``g``'s rows, in ``groups``' order."""
    return slice(groups.starts[g], groups.starts[g] + groups.size[g])


def _group_medians(group: np.ndarray, values: np.ndarray, count: int, empty: float) -> np.ndarray:
    """Per group 0 .. ``count`` - 1, the median of its ``values`` (``group``: each one's, ascending),
    ``empty`` where it has none."""
    of_group = Groups(group, ordered=True)
    medians = np.full(count, empty)
    medians[of_group.keys[0]] = of_group.median(values.astype(np.float64))
    return medians


def _references(size: np.ndarray, rank: np.ndarray, *scope: np.ndarray) -> np.ndarray:
    """Per group (``size`` calls, of ``rank``), the group that is the reference of its
    ``scope`` (a communicator, and a host): the most calls, then the lowest rank."""
    by_count = np.lexsort((rank, -size, *reversed(scope)))
    first = np.ones(len(size), dtype=bool)
    first[1:] = np.any([key[by_count][1:] != key[by_count][:-1] for key in scope], axis=0)
    ref_of = np.empty(len(size), dtype=np.int64)
    ref_of[by_count] = by_count[first][np.cumsum(first) - 1]
    return ref_of


def _shift_ordinals_across_hosts(calls: _Ordinals, warnings: list[str]) -> set[str]:
    """Re-align ordinals (``calls.key_seq``, in place) of members whose calls are a few off their
    communicator's reference member (the one with most calls), on another host than its: a
    member on the reference's host shares its clock, and its ends were compared whole
    (`_shift_ordinals_on_shared_clocks`), which the gaps, a few of them noisy, must not undo.

    Their clocks differ, so ends cannot be compared, but the gaps between consecutive ends
    can: an instance ends on every member at once, so with the right pairing a member's
    gaps are its reference's, whatever its clock's offset (drift changes them by ppm); a
    window that cut one more or one less call on one host pairs each gap with another
    call's. A shift is taken where it makes the gaps clearly closer (alignment-and-metrics.md
    §5: one off-by-one corrupts the clock fit, and the fit alone cannot tell)."""
    rows = np.flatnonzero(calls.use_ordinal)
    host = calls.host[rows]
    if not len(rows) or host.min() == host.max():  # one host: every member is on its reference's
        return set()
    per_rank, ref_of = _ordinal_calls(calls, rows)
    rc = per_rank.keys[0]
    ends, keys = calls.end[rows][per_rank.order], calls.key_seq[rows][per_rank.order]
    group = np.arange(per_rank.count).repeat(per_rank.size)
    joint, paired = _gapped_calls(calls.together[rows][per_rank.order], group, rc, len(calls.comm_ids))
    at, before = _joint_gaps(joint, group)
    gap = ends[at] - ends[before]
    misses = _misses_of_gaps(per_rank, ref_of, keys, ends, joint, group, at, before, gap)
    if misses is None:
        return set()
    member, miss, spacing = misses
    host_of = calls.host[rows][per_rank.order[per_rank.starts]]  # each member's (a rank has one host)
    suspect, least_gaps = _gap_suspects(member, miss, spacing, ref_of, host_of)
    found = {}  # member -> the shift its gaps fit, and how well
    # A member's gaps are a run of them (``at`` ascends, in group order): its bounds, not a
    # pass over every gap per suspect.
    owner = group[at]
    low, high = np.searchsorted(owner, suspect), np.searchsorted(owner, suspect, side="right")
    for i, lo, hi, least in zip(suspect.tolist(), low.tolist(), high.tolist(), least_gaps.tolist()):  # one by one
        mine = slice(lo, hi)
        theirs = _rows_of(per_rank, ref_of[i])
        found[i] = _best_gap_shift(keys[before[mine]], keys[at[mine]], gap[mine], ends[theirs], joint[theirs],
                                   spacing[ref_of[i]], rooted=not paired[rc[i]], least=least)
    return _take_gap_shifts(found, calls, rows, per_rank, ref_of, host_of, warnings)


def _gapped_calls(joint: np.ndarray, group: np.ndarray, comm: np.ndarray,
                  communicators: int) -> tuple[np.ndarray, np.ndarray]:
    """The calls whose ends the gaps are taken between (``joint``: those that end together,
    ``group``: each call's member, ``comm``: each member's communicator), and per communicator
    whether some member has two calls that end together."""
    # Gaps between a rank's successive calls that end together on every member (`together`),
    # passing over the rest: a broadcast's or a reduce's root ends apart from the others. A
    # communicator of no two such calls on any rank has every gap compared: a root that stays
    # the root ends apart by much the same each time, so its gaps still agree (roots that take
    # turns make them disagree at every shift: `_best_gap_shift` then asks for a clear best).
    paired = np.zeros(communicators, bool)
    paired[comm[np.bincount(group[joint], minlength=len(comm)) >= 2]] = True
    return joint | ~paired[comm[group]], paired


def _misses_of_gaps(per_rank: Groups, ref_of: np.ndarray, keys: np.ndarray, ends: np.ndarray, joint: np.ndarray,
                    group: np.ndarray, at: np.ndarray, before: np.ndarray,
                    gap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The members (groups of ``per_rank``) with gaps (``gap``: from row ``before`` to row ``at``)
    beside their reference's at the same keys, the median miss of each from those, and each
    reference's median gap (inf without one); None where no member has such gaps."""
    ref = ref_of[group[at]]
    ref_at, ref_before = per_rank.starts[ref] + keys[at], per_rank.starts[ref] + keys[before]
    inside = (keys[before] >= 0) & (keys[at] < per_rank.size[ref])
    ref_at, ref_before = np.where(inside, ref_at, 0), np.where(inside, ref_before, 0)
    inside &= joint[ref_at] & joint[ref_before]
    compared = inside & (ref != group[at])
    deviation = np.abs(gap - (ends[ref_at] - ends[ref_before]))[compared]
    if not len(deviation):
        return None
    checked = Groups(group[at][compared], ordered=True)
    own = ref == group[at]
    spacing = _group_medians(group[at][own], gap[own], per_rank.count, np.inf)
    return checked.keys[0], checked.median(deviation.astype(np.float64)), spacing


def _gap_suspects(member: np.ndarray, miss: np.ndarray, spacing: np.ndarray, ref_of: np.ndarray,
                  host_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``member``s whose gaps miss their reference's (``miss``; ``spacing``: a reference's
    median gap) by enough to try shifts, on another host than it, and how many gaps a shift
    of each must compare at the fewest."""
    # Aligned, a member's gaps are its reference's to µs (ends skew a little per instance);
    # shifted, by the calls' own variation: beyond 1/200 of a gap is worth a look, and so is
    # beyond GAP_FLOOR_RATIO times the closest members' of any communicator (a window moved
    # whole steps pairs calls of one kind, alike but for the work's jitter: µs, not a share).
    floor = np.quantile(miss, 0.1, method="lower")  # one member's, the lowest where they are few
    by_share = miss > spacing[ref_of[member]] / ALIGNED_GAP_SHARE
    looked = (by_share | (miss > GAP_FLOOR_RATIO * floor)) & (host_of[member] != host_of[ref_of[member]])
    # Off by µs only (steps alike but for jitter): one gap fits some shift as closely by chance.
    return member[looked], np.where(by_share[looked], 1, 2)


def _take_gap_shifts(found: dict[int, _GapFit], calls: _Ordinals, rows: np.ndarray, per_rank: Groups,
                     ref_of: np.ndarray, host_of: np.ndarray, warnings: list[str]) -> set[str]:
    """Shift the ordinals (``calls.key_seq``, in place) of the members (groups of ``per_rank`` over
    ``rows``) whose gaps fit a shift (``found``) where they are taken, and warn of each and
    of those no shift clearly fits; the comm_ids shifted."""
    rc, rr = per_rank.keys
    comm_ids = calls.comm_ids
    # One that fits a shift but not clearly takes it where a member on its host (its clock, and
    # mostly its capture window) clearly fits the same: its own gaps point there too. A moved
    # window moves its host's members alike, and each one's ends jitter on their own: the chance
    # that jitter alone fits them all to one shift is the product of each one's (`_by_chance`).
    chance: dict[tuple[int, int, int], tuple[float, int]] = {}  # (communicator, host, shift) -> (product, tried)
    for i, f in found.items():
        if f.fit is _Fit.FEW:
            product, tried = chance.get((rc[i], host_of[i], f.shift), (1.0, 0))
            chance[rc[i], host_of[i], f.shift] = (product * f.chance, max(tried, f.tried))
    clear = ({(rc[i], host_of[i], f.shift) for i, f in found.items() if f.fit is _Fit.CLEAR}
             | {key for key, (product, tried) in chance.items() if tried * product < MOVED_CHANCE})
    shifted = set()
    unsure: dict[tuple[int, int], list[int]] = {}  # (communicator, reference) -> ranks no shift clearly fits
    for i, f in found.items():
        shift, fit = f.shift, f.fit
        if not shift:
            continue
        lo, n, j = per_rank.starts[i], per_rank.size[i], ref_of[i]
        if fit is not _Fit.CLEAR and (rc[i], host_of[i], shift) not in clear:
            if fit is not _Fit.TURNS:  # and no member on its host clearly fits it
                continue
            unsure.setdefault((int(rc[i]), int(rr[j])), []).append(int(rr[i]))
            continue
        calls.key_seq[rows[per_rank.order[lo : lo + n]]] += shift
        shifted.add(str(comm_ids[rc[i]]))
        warnings.append(f"communicator {comm_ids[rc[i]]}: rank {rr[i]}'s capture is {_calls_off(shift)} "
                        f"rank {rr[j]}'s; re-aligned on the gaps between end times")
    warnings += [
        f"communicator {comm_ids[c]}: the gaps between end times of rank(s) {ranks_text(off)} fit no one shift of "
        f"their calls against rank {ref}'s clearly better than the others (roots taking turns?); left as matched"
        for (c, ref), off in unsure.items()
    ]
    return shifted


def _joint_gaps(joint: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, the row before it) of each gap between successive ``joint`` rows of one group
    (rows in group order)."""
    rows = np.flatnonzero(joint)
    same = group[rows][1:] == group[rows][:-1]
    return rows[1:][same], rows[:-1][same]


def _best_gap_shift(first: np.ndarray, last: np.ndarray, gaps: np.ndarray, ref_ends: np.ndarray,
                    ref_joint: np.ndarray, spacing: float, rooted: bool = False, least: int = 1) -> _GapFit:
    """The shift s that makes this member's gaps (``gaps[q]``: from its call of key
    ``first[q]`` to that of ``last[q]``) clearly (4x) closer to its reference's between keys
    s further on (both ends of calls that end together) than unshifted; 0 where none is.
    And how well it fits: for gaps between ``rooted`` calls, CLEAR only where it is clearly
    closer than every other shift too, else TURNS. Those (a broadcast's root ends apart from
    its receivers) agree only while each member keeps its role: where roots take turns they
    miss by the roles' lag at the right shift as at the wrong ones, and one comes out closest
    by chance. A shift only 2x closer than unshifted is WEAK, and so is one the call counts do
    not account for (`_moved`) unless it is 2x closer than every other shift and leaves the
    gaps as close as aligned ones (1/ALIGNED_GAP_SHARE of the reference's median gap,
    ``spacing``); a far shift must leave them as close too. Such a shift is FEW at best: taken
    where end jitter alone would fit it as closely less often than MOVED_CHANCE, on this
    member's gaps and those of its host's members that fit it too (`_take_gap_shifts`). TURNS,
    WEAK and FEW are taken where a member on this one's host (its window) clearly fits the
    same (`_shift_ordinals_across_hosts`).
    A near shift compares half the gaps, and ``least`` of them at the fewest."""
    misses = _shift_misses(gaps, last, ref_ends, ref_joint, max(least, len(gaps) // 2), before=first)
    # A window moved (started and stopped late alike) pairs calls any number off, the counts
    # alike: shifts further on too, each comparing fewer gaps, taken only clearly best.
    farther = _shift_misses(gaps, last, ref_ends, ref_joint, max(MIN_MOVED_GAPS, len(gaps) // 3),
                            min(len(ref_ends), MAX_MOVED_SHIFT), before=first, nearest=_NEAR_SHIFTS + 1)
    best = min(misses, key=misses.get, default=0)
    if 0 not in misses:
        return _GapFit(0, _Fit.CLEAR)
    tried = {**misses, **farther}
    aligned = spacing / ALIGNED_GAP_SHARE  # the most aligned members' gaps miss by
    far = min(farther, key=farther.get, default=None)
    if far is not None and farther[far] < misses[best] and 4 * farther[far] < _closest_but(tried, far):
        if not _moved(first, last, far, len(ref_ends)):
            return _GapFit(far, _Fit.CLEAR)
        if farther[far] < aligned:
            return _GapFit(far, _Fit.FEW, _by_chance(first, last, ref_joint, far, tried), len(tried))
    if 4 * misses[best] >= misses[0]:
        return _GapFit(best, _Fit.WEAK) if best and 2 * misses[best] < misses[0] else _GapFit(0, _Fit.CLEAR)
    if rooted and 4 * misses[best] >= _closest_but(misses, best):
        return _GapFit(best, _Fit.TURNS)
    # Ends jittered past the work's own variation make the gaps miss at every shift, one 4x
    # less than unshifted (or than every other, past the near ones) by chance: a moved window's
    # must line them up as aligned ones are, and stand out from the rest (2x: a moved window's
    # right shift came 2.7x closer than its whole-step aliases, steps alike), by more than
    # chance allows on the gaps it compares (2 gaps: a shift 2 calls on of 5 calls).
    if not _moved(first, last, best, len(ref_ends)):
        return _GapFit(best, _Fit.CLEAR)
    if misses[best] >= aligned or 2 * misses[best] >= _closest_but(tried, best):
        return _GapFit(best, _Fit.WEAK)
    return _GapFit(best, _Fit.FEW, _by_chance(first, last, ref_joint, best, tried), len(tried))


def _by_chance(first: np.ndarray, last: np.ndarray, ref_joint: np.ndarray, shift: int,
               tried: dict[int, float]) -> float:
    """How likely end jitter alone makes ``shift`` miss as little as it does (``tried``: the
    misses per shift tried) on the gaps it compares (between keys ``first`` and ``last``,
    shifted: both ends in the reference, ``ref_joint``, where they end together).

    Where jitter swamps the calls' own variation, the gaps miss alike at every shift: draws of
    one spread, whose median the other shifts' misses give. The median of k draws falls to a
    share r of it only where (k + 1) // 2 of them do, each with p = 1 - 2^-r (exponential
    misses: the most likely near 0 of the usual spreads), a binomial tail: gaps that fit to
    1/10 of the others' misses do so by chance 1 in 8 where they are 2, 1 in 370 where 5, 1
    in 7400 where 9. Called on a shift 2x closer than every other (p < 0.3)."""
    at, before = last + shift, first + shift
    inside = (before >= 0) & (at < len(ref_joint))
    k = int(np.count_nonzero(ref_joint[before[inside]] & ref_joint[at[inside]]))
    others = [miss for other, miss in tried.items() if other != shift]
    if not k or not others:
        return 1.0
    p = 1 - 2.0 ** -(tried[shift] / max(float(np.median(others)), 1.0))
    if p <= 0:  # a perfect fit
        return 0.0
    below = np.arange(1, k + 1)
    log_ways = np.concatenate([[0.0], np.cumsum(np.log((k - below + 1) / below))])  # log C(k, j), j = 0 .. k
    j = np.arange((k + 1) // 2, k + 1)
    return float(min(1.0, np.exp(log_ways[j] + j * np.log(p) + (k - j) * np.log1p(-p)).sum()))


def _moved(first: np.ndarray, last: np.ndarray, shift: int, ref_calls: int) -> bool:
    """Whether ``shift`` leaves calls of both this member (gaps between keys ``first`` and
    ``last``) and its reference (``ref_calls`` calls) unpaired, at opposite edges: a window
    moved, which the call counts do not account for (equal counts: any shift but 0), where
    both cut alike is the usual case."""
    return bool(first.min() + shift < 0 or last.max() + shift >= ref_calls)


def _closest_but(misses: dict[int, float], shift: int) -> float:
    """The least of the ``misses`` (per shift) of the shifts other than ``shift``; inf where none."""
    return min((miss for other, miss in misses.items() if other != shift), default=np.inf)


def _best_shift(mine: np.ndarray, ref: np.ndarray, spacing: float, mine_together: np.ndarray,
                ref_together: np.ndarray) -> int | None:
    """The shift s (mine[k] ~ ref[k + s]) whose ends coincide, if one clearly does, comparing
    only ends of calls that end together on every member; up to as many calls as the
    reference has more than this member, where that is more than `_shift_misses` tries (a
    capture cut many steps: on one clock, ends tell any shift)."""
    need = max(1, min(int(mine_together.sum()), int(ref_together.sum())) // 2)  # half of the shorter
    misses = _shift_misses(mine[mine_together], np.flatnonzero(mine_together), ref, ref_together, need,
                           max(8, len(ref) - len(mine)))
    best = min(misses, key=misses.get, default=None)
    return best if best is not None and misses[best] < spacing / 4 else None


def _shift_misses(mine: np.ndarray, at: np.ndarray, ref: np.ndarray, ref_kept: np.ndarray, need: int,
                  widest: int = _NEAR_SHIFTS, before: np.ndarray | None = None, nearest: int = 0) -> dict[int, float]:
    """Per shift s within ``widest`` (and ``nearest`` or more), the median of
    |mine[k] - ref[at[k] + s]| (given ``before``, ``mine`` are gaps: |mine[k] - (ref[at[k] + s]
    - ref[before[k] + s])|) over the k whose reference values exist and are kept, for the
    shifts that compare ``need`` of them or more."""
    misses: dict[int, float] = {}
    nearest = max(nearest, 0)
    if not len(ref) or not len(at) or nearest > widest:
        return misses
    tables = _shifted_tables(at, ref, ref_kept, before, -widest, widest)
    # k's values at successive shifts lie side by side in the tables: a chunk of shifts
    # (a run of them: a search many calls wide is a few passes, not one per shift) is one
    # window per k (and table), copied whole, as (shift, k).
    step = max(1, _CELLS // len(at))
    runs = [(-widest, -nearest), (nearest, widest)] if nearest else [(-widest, widest)]
    for first, last in runs:
        for lo in range(first, last + 1, step):
            shifts = np.arange(lo, min(lo + step, last + 1))
            rows = [base + lo + widest for _, _, base in tables]
            inside = sliding_window_view(tables[0][1], len(shifts))[rows[0]].T
            for (_, kept, _), at_rows in zip(tables[1:], rows[1:]):  # a gap's earlier end too
                inside = inside & sliding_window_view(kept, len(shifts))[at_rows].T
            counted = np.count_nonzero(inside, axis=1) >= need
            if not counted.any():
                continue
            values = sum(sliding_window_view(value, len(shifts))[at_rows].T[counted]
                         for (value, _, _), at_rows in zip(tables, rows))
            off = np.where(inside[counted], np.abs(mine - values), np.nan)
            misses.update(zip(shifts[counted].tolist(), nanmedian(off, axis=1).tolist()))
    return misses


def _shifted_tables(at: np.ndarray, ref: np.ndarray, ref_kept: np.ndarray, before: np.ndarray | None, first: int,
                    last: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For `_shift_misses`: tables of the reference's values and whether they count, padded
    so that every shift ``first`` to ``last`` stays within a row, and per k where its value
    at shift ``first`` is: a k's value is the sum of its tables'. Without ``before``, one
    table: ``ref[x]``, kept where ``ref_kept``. With it, the gap ``ref[x] - ref[x - d]`` (each
    end in the reference and kept) for each distinct d = at - before, a row each, where
    those rows fit `_CELLS`; else (lags many, calls many: the rows grew as their product, a
    GiB at 200k calls) ``ref[x]`` at ``at`` and ``-ref[x]`` at ``before``."""
    span = at if before is None else np.concatenate([at, before])
    low = max(0, -int(span.min()) - first)
    width = max(len(ref) + low, int(span.max()) + low + last + 1)
    padded = np.zeros(width, ref.dtype)
    padded[low : low + len(ref)] = ref
    held = np.zeros(width, bool)
    held[low : low + len(ref)] = ref_kept
    if before is None:
        return [(padded, held, at + low + first)]
    lags, lag = np.unique(at - before, return_inverse=True)
    if len(lags) * width > _CELLS or lags[0] < 0:
        return [(padded, held, at + low + first), (-padded, held, before + low + first)]
    value = np.zeros((len(lags), width), ref.dtype)
    kept = np.zeros((len(lags), width), bool)
    for row, d in enumerate(lags.tolist()):  # a few: the calls between a member's gaps
        value[row, d:] = padded[d:] - padded[: width - d]
        kept[row, d:] = held[d:] & held[: width - d]
    return [(value.ravel(), kept.ravel(), lag.reshape(-1) * width + at + low + first)]


def _check_instances(
    instance: np.ndarray,
    keyed: np.ndarray,
    comm: np.ndarray,
    comm_ids: np.ndarray,
    rank: np.ndarray,
    op: np.ndarray,
    ops: np.ndarray,
    size_bytes: ArrayLike,
    key_seq: np.ndarray,
    expected: np.ndarray,
    warnings: list[str],
) -> tuple[np.ndarray, int, int]:
    """Instances (ascending ids) that hold each expected participant once and agree on op and size."""
    rows = np.flatnonzero(keyed)
    comm, rank, op = comm[rows], rank[rows], op[rows]
    # each instance's rows by rank: a rank seen twice is two adjacent rows (what is read
    # per group below is the same on all its rows, so which row comes first is moot)
    per = Groups(instance[rows], within=rank)
    inconsistent = _inconsistent(per, rank, op, ops, np.asarray(size_bytes, dtype=np.float64)[rows])
    incomplete = ~inconsistent & (per.size < per.first(expected[rows]))
    single = per.first(expected[rows]) < 2  # a communicator with one member present: nothing to compare
    ok = per.keys[0][~inconsistent & ~incomplete & ~single]
    warnings += _dropped_warnings(per, comm, comm_ids, key_seq[rows], inconsistent, incomplete)
    return ok, int(incomplete.sum()), int(inconsistent.sum())


def _inconsistent(per: Groups, rank: np.ndarray, op: np.ndarray, ops: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Per instance (``per``: its rows by rank), whether it holds some rank twice, or disagrees
    on op or size (``sizes``, per row: set NaN, in place, where they may differ)."""
    by_rank, of_group = rank[per.order], per.id[per.order]
    again = (by_rank[1:] == by_rank[:-1]) & (of_group[1:] == of_group[:-1])
    twice = np.zeros(per.count, dtype=bool)  # some rank twice in the instance
    twice[of_group[1:][again]] = True
    # send and recv are one operation seen from its two ends.
    send_recv = member_of(ops, [SEND, RECV])[op]
    kind = np.where(send_recv, -1, op)
    # AllToAll(v) legitimately moves different amounts per rank; every other op agrees on size.
    sizes[(ops == ALLTOALL)[op]] = np.nan
    n = per.size
    pair = per.first(send_recv)
    return (
        twice
        | per.varies(kind)
        | per.varies(sizes)
        | (pair & (n == 2) & ~per.varies(op))  # two sends, or two recvs
    )


def _dropped_warnings(per: Groups, comm: np.ndarray, comm_ids: np.ndarray, keys: np.ndarray,
                      inconsistent: np.ndarray, incomplete: np.ndarray) -> list[str]:
    """One warning per communicator of instances dropped ``inconsistent`` (with the first one's
    key), and one of those dropped ``incomplete`` (``per``: the instances; ``comm``, ``keys``:
    their rows')."""
    warnings: list[str] = []
    comm_of = per.first(comm)
    total = np.bincount(comm_of, minlength=len(comm_ids))
    if inconsistent.any():
        bad = Groups(comm_of[inconsistent])
        first = bad.min(per.first(keys)[inconsistent])
        warnings += [
            f"communicator {comm_ids[c]}: {count} of {total[c]} instances disagree "
            f"on op, size or participants (first at #{lowest}); dropped"
            for c, count, lowest in zip(bad.keys[0].tolist(), bad.size.tolist(), first.tolist())
        ]
    if incomplete.any():
        short = Groups(comm_of[incomplete])
        warnings += [
            f"communicator {comm_ids[c]}: {count} instance(s) missing a participant (capture window edges?); dropped"
            for c, count in zip(short.keys[0].tolist(), short.size.tolist())
        ]
    return warnings
