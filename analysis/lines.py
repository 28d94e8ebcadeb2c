"""Communicators of NCCL calls no trace names, told apart by their lines and end times.

nsys exports name each call's communicator (NCCL's commHash) only with NCCL >= 2.25.1 and
``--include-blobs=true``. Without it the ingest groups a rank's calls by op (comm_id
``inferred:<op>``) and keeps the stream each ran on (digest.COLLECTIVE ``stream``); matched by
call order across every rank, a TP and a DP all-reduce, or two TP groups' all-reduces, are
paired as one collective. What tells them apart (nccl-in-traces.md §6.5: stream and ordinal):
- a *line*, one rank's calls on one stream, is one communicator's calls in call order: PyTorch
  gives each process group its own NCCL stream per device, so a communicator has one line per
  member, and a rank's lines are different communicators';
- lines of one communicator make the same calls (as many, give or take a window's edges: where
  nodes' windows start or stop apart, one edge may cut many calls, and one line's k-th call is
  another's k+d-th), and those calls end together (alignment-and-metrics.md §2): on one host
  (one clock) at the same time; across hosts their end difference is the clocks' offset,
  which changes by ppm from one call to the next, while that of different communicators'
  lines moves with the jitter of the work each does between its calls. Where nodes' windows
  moved (started and stopped late alike), one line's k-th call is another's k+d-th, d
  neither none nor their calls' difference, and across hosts no clock tells d: the lines'
  gaps (one end to the next, free of the clock) do, where one d clearly fits best.

Lines of one *class* (the same op groups) are compared pairwise by how far apart their calls
end (`_mismatch`), and split into communicators only where that is unambiguous (`_partition`):
the lines that end together, within a threshold up to `TOGETHER_NS`, form cliques of one line
per rank and of the size the traces give, every line in one; any two cliques' lines end `GAP`
times further apart (median) than a clique's own; and once the cliques that span hosts give
those hosts' clock offsets (through time, where communicators run apart as the clocks drift:
`_drift_lines`; none found: the offset at which the most of two hosts' lines end
together with one of the other's, where a clique of several lines a host may be host groups
in lock step: `_unless_in_lock_step`), the lines' ends on those clocks agree (`_split`); and no
clique, of any class, shares some ranks but not all with another (`_crossing`). A clique that
no other line was compared with may be several groups in lock step: it stays as the ingest
left it, grouped by op, as does a class that is not split, with a warning where that may
pool several communicators. Lines holding other ops (p2p, broadcast, reduce: their members
need not end together), and lines too short to judge, are left as they are too.

Not every pair is compared (their cost grows with the square of the lines: 2,048 ranks make
4 million pairs): each of a few *leaders* with every line, and the lines within a leader's
reach (TOGETHER_NS) with each other (`_compare`): a communicator's lines in full, two
communicators' as a leader of one with the other's lines, whose median stands for the
median of all their lines' pairs (`_apart`). Across hosts a pair is compared by the change
of its end difference alone, from the lines' gaps (`_changes`): the end difference itself,
the costlier part, weighs only where the hosts' clock offset is known, for lines that may
end together and the pairs of cliques that may end the least apart (`_apart`), and is
taken there only (`_levels`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from rankscope.analysis.digest import INFERRED_COMM
from rankscope.analysis.groups import (
    ArrayLike, Coded, Groups, Table, codes, distinct, distinct_inverse, in_sorted, locate, member_of, pack,
    run_starts,
)
from rankscope.analysis.ops import N_TO_N_OPS
from rankscope.analysis.report import fmt_ns, ranks_text, some_of

# Ends of one communicator's calls coincide within this (the mismatch of two of its lines):
# nsys GPU timestamps agree to ~1 us (alignment-and-metrics.md §2).
TOGETHER_NS = 10_000.0
# Two communicators' lines mismatch (median) at least this many times as much as one's
# (median), each counted above NOISE_FLOOR_NS (timestamp resolution: below it, alike).
GAP = 3.0
NOISE_FLOOR_NS = 500.0
# The most two hosts' clocks drift apart, as the offsets that lines of several communicators
# give at their times may tell it: crystals lie within ~100 ppm of each other (clock.py).
MAX_DRIFT_PPM = 200.0
# Communicators' calls this far apart in time tell their hosts' drift (`_drift_lines`); nearer,
# MAX_DRIFT_PPM moves the offset under 2 µs, an end's jitter, and a slope fitted is noise.
MIN_DRIFT_SPAN_NS = 10_000_000.0
# Thresholds tried for the cliques: where the sorted mismatches step up by this much, the
# first MAX_THRESHOLDS of them.
STEP = 1.1
MAX_THRESHOLDS = 64
SAMPLES = 32  # calls compared per pair of lines, spread over the shorter
MAX_EDGE_CALLS = 2  # calls a capture window's edges may cut off one member and not another
# Nodes' windows start (or stop) apart: one edge may cut off up to this share of a member's
# calls and not another's (a millisecond is many calls where TP makes hundreds a step).
MAX_CUT_SHARE = 1 / 3
MIN_CALLS = 6  # fewer, and the quartiles of a mismatch say little
# Pairs of lines compared in one class: time and memory grow with them (~4 us and ~150 B a
# pair): 2,048 ranks' TP and DP lines (264 communicators) compare 0.77 million of their 4.2
# million pairs (`_compare`), in 4-5 s; 4,096 ranks' 3 million, in ~20 s and ~600 MB.
MAX_PAIRS = 5_000_000
# A line that ends within this of a leader needs no leader of its own (`_compare`): a
# communicator none of whose lines leads may lack pairs, and then makes no clique. Lines of
# two communicators seldom end so near (the simulator's 4,096 ranks' TP lines: 5.7 us at
# the least), a leader's own communicator's mostly do.
SETTLED_NS = TOGETHER_NS / 2
_CHUNK = 2048  # pairs compared at once (SAMPLES x shifts values each)
RUN_GAPS = 6  # gaps (end to next end) of a line around its middle call that fix a shift across hosts
CANDIDATES = 8  # shifts whose middle gap fits best, whose runs of gaps are compared
_BITS = 63  # op groups a class can name (the bits of an int64)
_EDGE = np.arange(-MAX_EDGE_CALLS, MAX_EDGE_CALLS + 1)  # shifts tried about each centre
_WINDOW = len(_EDGE)


@dataclass(frozen=True)
class Inferred:
    """The tables with the inferred communicators' calls renamed (comm_id, and seq: call
    order on the line) and listed; the names of those communicators; the warnings; and the
    op groups left pooling several communicators' calls (a rank's on several streams)."""

    collectives: dict[str, ArrayLike]
    communicators: dict[str, ArrayLike]
    comm_ids: frozenset[str]
    warnings: list[str]
    pooled: frozenset[str] = frozenset()


@dataclass(frozen=True)
class _Lines:
    """Untraced calls by line: ``rows`` (collective rows, by line then start); per line its
    first position in ``rows``, calls, rank, host code, stream, class (its calls' op groups
    as a bit mask) and whether it can be judged; ``ends`` per position (ns from the earliest)."""

    rows: np.ndarray
    starts: np.ndarray
    size: np.ndarray
    rank: np.ndarray
    host: np.ndarray
    stream: np.ndarray
    kind: np.ndarray
    judged: np.ndarray
    ends: np.ndarray

    @property
    def line_of(self) -> np.ndarray:
        """Per position in ``rows``, its line."""
        return np.arange(len(self.size)).repeat(self.size)

    def keyed(self, values: np.ndarray) -> np.ndarray:
        """Per-position ``values`` offset by line, so that values ascending within each line
        ascend throughout: one search finds a value on any line."""
        return values + (values.max() + 1.0) * self.line_of

    @cached_property
    def keyed_ends(self) -> np.ndarray:
        """``ends`` keyed (a stream runs its calls in turn: they ascend on a line), for every
        `_mismatch` of the lines: a leader's comparisons come a few at a time (`_compare`)."""
        return self.keyed(self.ends)

    @cached_property
    def gaps(self) -> _Gaps:
        """The lines' gaps (`_gaps`), for every `_mismatch` of the lines, as ``keyed_ends``."""
        return _gaps(self)


@dataclass(frozen=True)
class _Split:
    """A class's lines as communicators (``label``: per line, the position of the first line
    of its clique; -1: left as it is), or why not (``reason``); with the largest mismatch
    within a clique and the least median mismatch between two (for a decline: the largest
    mismatch seen, or a lower bound of it past TOGETHER_NS: `_partition`)."""

    label: np.ndarray | None
    reason: str = ""
    together_ns: float = np.nan
    apart_ns: float = np.nan


def infer(collectives: Table, communicators: Table) -> Inferred:
    """Communicators for the calls whose trace names none (those with a ``stream``), where
    their lines and end times tell them apart unambiguously; the rest as they are."""
    unchanged = Inferred(dict(collectives), dict(communicators), frozenset(), [])
    if "stream" not in collectives:  # a table built by hand
        return unchanged
    untraced = np.flatnonzero(~np.isnan(np.asarray(collectives["stream"], np.float64)))
    if not len(untraced):
        return unchanged
    comm, comm_ids = codes(collectives["comm_id"])
    lines = _lines(collectives, untraced, comm)
    size = _listed_sizes(lines, comm, comm_ids, communicators)
    label, splits = _split_classes(lines, size)
    told, left = _told_apart(lines, label, splits)
    pooled = _pooled(lines, comm)
    warnings = [said for members, split in left if (said := _declined(lines, members, pooled, comm_ids, comm, split))]
    # Op groups whose lines of several communicators stay pooled: `matching` does not re-align them.
    still = frozenset(comm_ids[distinct(comm[lines.rows[(pooled & (label < 0))[lines.line_of]]])].tolist())
    if not told:
        return Inferred(dict(collectives), dict(communicators), frozenset(), warnings, still)
    names = _names(lines, label, collectives)
    inferred = sorted(set(names[label >= 0].tolist()))
    warnings.insert(0, f"{int((label >= 0).sum())} lines (a rank's NCCL calls on one stream) without communicator ids "
                       f"told apart by their end times into {len(inferred)} communicators ({some_of(inferred)}): a "
                       f"communicator's lines end within {fmt_ns(max(s.together_ns for s in told))} of each other, two "
                       f"communicators' {fmt_ns(min(s.apart_ns for s in told))} or more apart (median)")
    renamed = _renamed(collectives, lines, names)
    listed = _listed(communicators, renamed, lines, names, size, comm_ids[distinct(comm[untraced])])
    return Inferred(renamed, listed, frozenset(inferred), warnings, still)


_UNJUDGED = "too few of their calls, or calls of ops whose members need not end together, to judge"


def _split_classes(lines: _Lines, size: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, _Split]]]:
    """Each line's communicator (the first line of its clique; -1: none found), and per class
    of lines (one per set of op groups: a few) its lines and how they split."""
    label = np.full(len(lines.size), -1)
    splits: list[tuple[np.ndarray, _Split]] = []
    for kind in distinct(lines.kind).tolist():
        members = np.flatnonzero(lines.kind == kind)
        judged = members[lines.judged[members]]
        if _cut_short(lines, members):
            split = _Split(None, "some of its lines are too short to judge, within a capture window's edges of lines "
                                 "judged: told apart without them, their communicators would lack those ranks")
        elif distinct(lines.rank[judged]).size > 1:
            split = _split(lines, judged, size[judged])
        else:
            split = _Split(None, _UNJUDGED)
        if split.label is not None:
            label[judged] = np.where(split.label >= 0, judged[split.label.clip(0)], -1)
        splits.append((members, split))
    return label, splits


def _told_apart(lines: _Lines, label: np.ndarray, splits: list[tuple[np.ndarray, _Split]],
                ) -> tuple[list[_Split], list[tuple[np.ndarray, _Split]]]:
    """The splits kept, and the lines left grouped by op with why (``label`` of lines whose
    class is declined reset to -1). A class is declined whole where its groups cross
    another's: TP groups taken for one cross the DP groups of FSDP too."""
    crossing = _crossing(lines, label)
    told: list[_Split] = []
    left: list[tuple[np.ndarray, _Split]] = []
    for members, split in splits:
        if crossing[members].any():
            label[members] = -1
            split = _Split(None, "some groups of its lines that end together share some ranks, not all, with another "
                                 "group found (groups in lock step taken for one?)", apart_ns=split.apart_ns)
        if split.label is not None:
            told.append(split)
            members = members[label[members] < 0]
            split = _Split(None, "some end together with no other lines to be told apart from (several groups in lock "
                                 "step?)") if lines.judged[members].any() else _Split(None, _UNJUDGED)
        left.append((members, split))
    return told, left


def _lines(collectives: Table, untraced: np.ndarray, comm: np.ndarray) -> _Lines:
    """The untraced calls by line, each classed by the set of its calls' comm_ids (op groups)."""
    rank = np.asarray(collectives["rank"], np.int64)[untraced]
    stream = np.asarray(collectives["stream"], np.float64)[untraced].astype(np.int64)
    per = Groups(rank, stream, within=np.asarray(collectives["start_ns"], np.int64)[untraced])
    rows = untraced[per.order]
    # One bit per op group (an op and a size each: a dozen at most); a line holding a group
    # past the 63rd is not judged.
    group = distinct_inverse(comm[rows])[1]
    fits = group < _BITS
    kind = np.bitwise_or.reduceat(np.left_shift(np.int64(1), np.where(fits, group, 0)), per.starts)
    op, op_ids = codes(collectives["op"])
    joint = member_of(op_ids, N_TO_N_OPS)[op[rows]] & fits  # calls whose members end together
    end = np.asarray(collectives["end_ns"], np.int64)[rows]
    host, _ = codes(collectives["host"])
    judged = np.logical_and.reduceat(joint, per.starts) & (per.size >= MIN_CALLS)
    return _Lines(rows=rows, starts=per.starts, size=per.size, rank=per.keys[0], host=host[rows[per.starts]],
                  stream=per.keys[1], kind=kind, judged=judged, ends=(end - end.min()).astype(np.float64))


def _listed_sizes(lines: _Lines, comm: np.ndarray, comm_ids: np.ndarray, communicators: Table) -> np.ndarray:
    """Per line, the communicator size its rank lists for its calls' op groups (NCCL nranks,
    where the process made communicators of one size only); NaN where none is listed."""
    if "size" not in communicators or not len(communicators["rank"]):
        return np.full(len(lines.size), np.nan)
    listed, listed_ids = codes(communicators["comm_id"])
    listed_rank = np.asarray(communicators["rank"], np.int64)
    keys = pack(np.concatenate([listed_rank, lines.rank.repeat(lines.size)]),
                np.concatenate([locate(comm_ids, listed_ids)[listed], comm[lines.rows]]))
    table, query = keys[: len(listed)], keys[len(listed):]
    order = np.argsort(table, kind="stable")
    hit = order[np.minimum(np.searchsorted(table[order], query), len(order) - 1)]
    per_call = np.where(table[hit] == query, np.asarray(communicators["size"], np.float64)[hit], np.nan)
    return np.fmax.reduceat(per_call, lines.starts)


def _cut_short(lines: _Lines, members: np.ndarray) -> bool:
    """Whether a line of the class (``members``) too short to judge has calls enough, give or
    take MAX_EDGE_CALLS, to be a judged line's peer that a capture window's edges cut short."""
    judged = lines.judged[members]
    shortest = lines.size[members[judged]].min(initial=np.iinfo(np.int64).max)
    return bool((lines.size[members[~judged]] >= shortest - MAX_EDGE_CALLS).any())


def _split(lines: _Lines, members: np.ndarray, size: np.ndarray) -> _Split:
    """The class's lines (``members``, ascending; ``size``: each one's listed communicator
    size) as communicators (`_partition`): first judged by how their ends move from call to
    call (and on one host, where they fall); then, where communicators found (or, declined,
    the cliques found) span two hosts, by where their ends fall on those hosts' clocks too
    (`_host_offsets`; no cliques found, on the offsets most lines agree on: `_agreed_offsets`):
    groups in lock step whose calls end a constant time apart on two hosts (a straggler every
    step, a barrier after a DP all-reduce) end together call by call, not at the offset
    between those hosts' clocks."""
    compared = _compare(lines, members)
    if compared is None:
        return _Split(None, f"its {len(members)} lines make too many pairs to compare")
    a, b, change, level, shift, samples = compared
    seen = ~np.isnan(change)
    a, b, change, level, shift, samples = a[seen], b[seen], change[seen], level[seen], shift[seen], samples[seen]
    if not len(change):
        return _Split(None, "no two of its lines make comparable calls")
    host = lines.host[members]
    mismatch = _unaligned(host[a], host[b], change, level)
    split = _partition(a, b, mismatch, size)
    # Declined, its cliques may still give the hosts' offsets, on which lines that end a
    # constant time apart call by call (a barrier's right after a DP group's) fall apart;
    # with none, the offsets most of the hosts' lines agree on (`_agreed_offsets`).
    label = split.label if split.label is not None else _cliques(a, b, mismatch, len(size))
    middle = lines.ends[lines.starts[members] + lines.size[members] // 2]
    offset = (_agreed_offsets(host, a, b, change, level) if label is None else
              _host_offsets(host, label, a, b, level, middle))
    known = ~np.isnan(offset) if offset is not None else np.zeros(len(a), bool)
    if known.any():
        # Where the end difference was not taken (it changes by more than TOGETHER_NS), the
        # change is a lower bound of the mismatch: `_partition` has it made exact where it weighs.
        def exact(pair: np.ndarray) -> np.ndarray:
            level[pair] = _levels(lines, members[a[pair]], members[b[pair]], samples[pair], shift[pair])
            return np.fmax(change[pair], np.abs(level[pair] - offset[pair]))

        split = _partition(a, b, np.where(known, np.fmax(change, np.abs(level - offset)), mismatch), size,
                           known & np.isnan(level), exact)
    if split.label is not None and (offset is None or _host_offsets(host, split.label, a, b, level, middle) is None):
        return _Split(None, "the clock offsets between hosts that the groups of its lines imply disagree",
                      apart_ns=float(mismatch.max()))
    if split.label is not None and label is None:  # on offsets agreed, not on groups found
        kept = _unless_in_lock_step(lines.rank[members], host, split.label)
        within = (kept[a] == kept[b]) & (kept[a] >= 0)
        if not within.any():
            return _Split(None, "its lines that end together across hosts may be groups of one host each, in lock "
                                "step", apart_ns=split.apart_ns)
        final = np.where(known, np.fmax(change, np.abs(level - offset)), mismatch)
        split = replace(split, label=kept, together_ns=float(final[within].max()))
    return split


def _unless_in_lock_step(rank: np.ndarray, host: np.ndarray, label: np.ndarray) -> np.ndarray:
    """``label`` less the groups (-1) that may be groups of one host each, in lock step across
    hosts: a group spanning hosts with several lines on one (a world group's) is taken as one
    only where those ranks' groups of that host (TP groups) are found among the others. Else
    their calls may be those host groups' (TP all-reduces ending together across nodes call
    after call, with no world group at all), which the ends on the clocks agreed alone
    cannot tell from one group's (`_agreed_offsets`): left as they are."""
    found = np.flatnonzero(label >= 0)
    per = Groups(label[found], host[found])  # a group's lines by host
    hosts = np.bincount(per.keys[0], minlength=len(label))[label[found]]  # per line found, its group's hosts
    several = per.broadcast(per.size) > 1  # its group has other lines on its host
    local, spans = found[several & (hosts == 1)], found[several & (hosts > 1)]
    key = pack(host, rank)
    doubtful = distinct(label[spans][~in_sorted(key[spans], distinct(key[local]))])
    return np.where(in_sorted(label, doubtful), -1, label)


def _partition(a: np.ndarray, b: np.ndarray, mismatch: np.ndarray, size: np.ndarray,
               loose: np.ndarray | None = None, exact: Callable[[np.ndarray], np.ndarray] | None = None) -> _Split:
    """Lines (``size``: each one's listed communicator size) as cliques of lines that end
    together (pairs ``a``-``b`` and their ``mismatch``), where that is unambiguous: two
    communicators' lines end far apart (`_apart`) and the cliques match the sizes. A clique
    with no line outside it to compare with may be several groups in lock step: its lines
    get -1 (left as they are), as do all where none has. ``loose``: mismatches known only
    as a lower bound past TOGETHER_NS (no clique holds them), which ``exact`` gives where
    `_apart` needs them; the largest, quoted as a decline's ``apart_ns``, is then only
    known to be past TOGETHER_NS, all `_declined` asks of it."""
    largest = float(mismatch.max())
    label = _cliques(a, b, mismatch, len(size))
    if label is None:
        return _Split(None, f"its lines that end within {fmt_ns(TOGETHER_NS)} of each other fall into no groups that "
                            "all do, of one line per rank", apart_ns=largest)
    within = label[a] == label[b]
    compared = _compared(label, a[~within], b[~within])
    if not compared.any():
        return _Split(None, "no group of its lines that end together has other lines to be told apart from",
                      apart_ns=largest)
    apart = float(_apart(label, a, b, mismatch, np.flatnonzero(~within), loose, exact))
    typical = float(np.median(mismatch[within]))
    if apart + NOISE_FLOOR_NS < GAP * (typical + NOISE_FLOOR_NS):
        return _Split(None, f"the groups of its lines that end together end only {fmt_ns(apart)} apart (median), "
                            f"against {fmt_ns(typical)} within one", apart_ns=largest)
    cliques = np.bincount(label)[label]
    known = ~np.isnan(size)
    if (cliques[known] != size[known]).any():
        return _Split(None, f"the groups their ends make hold {some_of(sorted(set(cliques.tolist())))} lines where "
                            f"the traces give {some_of(sorted(set(size[known].astype(int).tolist())))} ranks",
                      apart_ns=largest)
    return _Split(np.where(compared[label], label, -1), together_ns=float(mismatch[within].max()), apart_ns=apart)


def _host_offsets(host: np.ndarray, label: np.ndarray, a: np.ndarray, b: np.ndarray, level: np.ndarray,
                  middle: np.ndarray) -> np.ndarray | None:
    """Per pair of lines on two hosts, the offset between the hosts' clocks (the second's end
    less the first's, as ``level``) that the communicators found (``label`` >= 0) show at the
    pair's time (``middle``: per line, its middle call's end): the median of their lines' end
    differences on those hosts, or where those communicators' calls lie apart in time, the line
    the clocks drift along (`_drift_lines`); NaN where none spans the two hosts, None where a
    pair of those communicators' lines strays from it by more than TOGETHER_NS."""
    low, high, sign = _host_pairs(host, a, b)
    oriented = sign * level
    spanning = (label[a] == label[b]) & (label[a] >= 0) & (low != high)
    if not spanning.any():
        return np.full(len(a), np.nan)
    when = np.where(sign > 0, middle[a], middle[b])  # on the lower host's clock
    pairs = Groups(low[spanning], high[spanning])
    centre, drift, mean_time = _drift_lines(pairs, low[spanning], high[spanning], label[a][spanning],
                                            oriented[spanning], when[spanning])
    at = _pair_index(pairs, low, high)
    found = at >= 0
    offset = np.full(len(a), np.nan)
    offset[found] = centre[at[found]] + drift[at[found]] * (when[found] - mean_time[at[found]])
    if (np.abs(oriented[spanning] - offset[spanning]) > TOGETHER_NS).any():
        return None
    return sign * offset


def _drift_lines(pairs: Groups, low: np.ndarray, high: np.ndarray, label: np.ndarray, oriented: np.ndarray,
                 when: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair of hosts (``pairs``), the line of their clocks' offset through time (the
    offset at the mean time, the drift, the mean time): where their communicators' calls lie
    ``MIN_DRIFT_SPAN_NS`` or more apart in time, fitted to each communicator's median end
    difference (``oriented``, per pair of its lines on them) at its median time (``when``);
    elsewhere, and where the fit would pass MAX_DRIFT_PPM (no clocks drift so, and the ends'
    jitter over a short span can make it), flat at the median end difference of all.
    Communicators that do not wait on each other run apart: a DP group slowed by its
    stragglers ran 100 ms behind another by mid-capture, and their end differences told two
    offsets 16 µs apart on clocks 150 ppm apart."""
    each = Groups(low, high, label)  # a communicator's lines on two hosts
    of = _pair_index(pairs, *each.keys[:2])
    levels, times = each.median(oriented), each.median(when)
    per = Groups(of)  # every pair of hosts has a communicator spanning it: per.keys[0] is 0..count-1
    mean_time, mean_offset = per.mean(times), per.mean(levels)
    early = times - per.broadcast(mean_time)
    drift = per.sum(early * (levels - per.broadcast(mean_offset))) / np.maximum(per.sum(early * early), 1.0)
    fitted = (per.max(times) - per.min(times) >= MIN_DRIFT_SPAN_NS) & (np.abs(drift) <= MAX_DRIFT_PPM * 1e-6)
    return np.where(fitted, mean_offset, pairs.median(oriented)), np.where(fitted, drift, 0.0), mean_time


def _agreed_offsets(host: np.ndarray, a: np.ndarray, b: np.ndarray, change: np.ndarray,
                    level: np.ndarray) -> np.ndarray:
    """Per pair of lines on two hosts, the offset between the hosts' clocks (as `_host_offsets`
    gives it) on which the most of their lines end together with a line of the other, where
    no groups of lines found give it: lines in lock step across hosts (a barrier's right
    after a DP group's) end together call by call (``change``), each at its own end
    difference (``level``); one communicator's at the clocks' offset, and every line that
    ends together with another across those hosts has such a partner there. The end
    differences of a pair of hosts fall into runs (none more than TOGETHER_NS from the
    next); the offset is the median of the run that holds the most lines, where one does
    (else NaN, as for hosts with no lines that end together)."""
    low, high, sign = _host_pairs(host, a, b)
    oriented = sign * level
    near = np.flatnonzero((low != high) & (change <= TOGETHER_NS) & ~np.isnan(level))
    if not len(near):
        return np.full(len(a), np.nan)
    near = near[np.lexsort((oriented[near], high[near], low[near]))]
    new = run_starts(low[near])
    new[1:] |= (high[near][1:] != high[near][:-1]) | (np.diff(oriented[near]) > TOGETHER_NS)
    run = np.cumsum(new) - 1
    held = np.bincount(Groups(np.concatenate((run, run)), np.concatenate((a[near], b[near]))).keys[0])  # lines per run
    pairs = Groups(low[near][new], high[near][new])  # the runs by pair of hosts
    best = held == pairs.broadcast(pairs.max(held))
    chosen = best & (np.bincount(pairs.id[best], minlength=pairs.count) == 1)[pairs.id]
    agreed = np.full(pairs.count, np.nan)
    agreed[pairs.id[chosen]] = Groups(run).median(oriented[near])[chosen]
    return _per_pair(pairs, agreed, low, high, sign)


def _host_pairs(host: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair of lines, its hosts (the lower, the higher), and the sign that orients its end
    difference from the lower host to the higher (-1 where the first line is on the higher)."""
    low, high = np.minimum(host[a], host[b]), np.maximum(host[a], host[b])
    return low, high, np.where(host[a] == low, 1.0, -1.0)


def _per_pair(pairs: Groups, offsets: np.ndarray, low: np.ndarray, high: np.ndarray, sign: np.ndarray) -> np.ndarray:
    """Per pair of lines (on hosts ``low`` and ``high``), the ``offsets`` of its pair of hosts
    (``pairs``' keys), oriented by ``sign``; NaN where its hosts have none, or are one."""
    at = _pair_index(pairs, low, high)
    found = at >= 0
    out = np.full(len(low), np.nan)
    out[found] = (sign * offsets[at])[found]
    return out


def _pair_index(pairs: Groups, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per pair of lines (on hosts ``low`` and ``high``), the index of its pair of hosts among
    ``pairs``' keys; -1 where they are not among them, or are one host."""
    keys = pack(np.concatenate([pairs.keys[0], low]), np.concatenate([pairs.keys[1], high]))
    at = locate(keys[: pairs.count], keys[pairs.count:])
    return np.where(low != high, at, -1)


def _cliques(a: np.ndarray, b: np.ndarray, mismatch: np.ndarray, count: int) -> np.ndarray | None:
    """The finest partition of ``count`` lines into cliques (of two or more) that the pairs
    ``a``-``b`` ending within some threshold make, trying thresholds up to TOGETHER_NS where
    the mismatches step up; per line the first line of its clique, None where none does."""
    nearest = np.full(count, np.inf)
    np.minimum.at(nearest, a, mismatch)
    np.minimum.at(nearest, b, mismatch)
    lowest = nearest.max()  # from here every line has a partner
    ranked = np.unique(mismatch[(mismatch >= lowest) & (mismatch <= TOGETHER_NS)])
    if not len(ranked):
        return None
    lifted = ranked + NOISE_FLOOR_NS
    steps = np.append(lifted[1:] >= STEP * lifted[:-1], True)  # the last: the next is past TOGETHER_NS
    for threshold in ranked[steps][:MAX_THRESHOLDS].tolist():
        label = _clique_labels(a, b, mismatch <= threshold, count)
        if label is not None:
            return label
    return None


def _clique_labels(a: np.ndarray, b: np.ndarray, linked: np.ndarray, count: int) -> np.ndarray | None:
    """Per line the first line of its clique, where the ``linked`` pairs make disjoint
    cliques of two or more lines covering all ``count``; else None."""
    a, b = a[linked], b[linked]
    label = np.arange(count)
    np.minimum.at(label, a, b)  # the first of its own and its partners: of its clique, if cliques
    np.minimum.at(label, b, a)
    size = np.bincount(label, minlength=count)
    links = np.bincount(label[a], minlength=count)
    if (label[a] != label[b]).any() or (links != size * (size - 1) // 2).any() or (size[label] < 2).any():
        return None
    return label


def _compared(label: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per line, whether its clique was compared with another (``a``-``b``: pairs of lines in
    different cliques)."""
    seen = np.zeros(len(label), bool)
    seen[label[a]] = seen[label[b]] = True
    return seen[label]


def _apart(label: np.ndarray, a: np.ndarray, b: np.ndarray, mismatch: np.ndarray, between: np.ndarray,
           loose: np.ndarray | None = None, exact: Callable[[np.ndarray], np.ndarray] | None = None) -> np.floating:
    """The least, over pairs of cliques compared, of the median mismatch of their lines
    compared (``a``-``b`` at ``between``: in different cliques; `_compare`: a leader of one
    with the lines of the other, mostly). Mismatches ``loose`` (lower bounds) are made
    ``exact`` (in place) only for the pairs of cliques whose median could be the least: a
    median of lower bounds is one of the median; the least bound first."""
    pairs = Groups(np.minimum(label[a[between]], label[b[between]]), np.maximum(label[a[between]], label[b[between]]))
    if loose is None or not loose[between].any():
        return pairs.median(mismatch[between]).min()
    loose = loose[between]
    while True:
        median = pairs.median(mismatch[between])
        bounded = np.bincount(pairs.id[loose], minlength=pairs.count) > 0
        least = median[~bounded].min(initial=np.inf)
        todo = bounded & (median < least)
        if not todo.any():
            return np.float64(least)
        if least == np.inf:  # none exact yet: the least bound's first, to bound the others by
            todo = np.arange(pairs.count) == np.flatnonzero(todo)[median[todo].argmin()]
        pair = np.flatnonzero(todo[pairs.id] & loose)
        mismatch[between[pair]] = exact(between[pair])
        loose[pair] = False


def _crossing(lines: _Lines, label: np.ndarray) -> np.ndarray:
    """Per line, whether its communicator found (``label`` >= 0) shares two or more ranks with
    another found, and neither holds the other. Process groups do not overlap so (a TP x DP
    grid's share one rank at most; a world group holds every other), but several groups in
    lock step taken for one do: TP groups 1-3 of four as one, beside the DP groups, shares
    three ranks with each."""
    found = np.flatnonzero(label >= 0)
    per = Groups(lines.rank[found])
    clique = label[found][per.order]  # by rank: a rank's lines are in different communicators
    first, second = _following(per.starts.repeat(per.size) + per.size.repeat(per.size))
    low, high = np.minimum(clique[first], clique[second]), np.maximum(clique[first], clique[second])
    shared = Groups(low, high)  # pairs of communicators with a rank in common, and how many
    ranks = np.bincount(clique, minlength=len(label))
    crossed = (shared.size > 1) & (shared.size < np.minimum(ranks[shared.keys[0]], ranks[shared.keys[1]]))
    out = np.zeros(len(label), bool)
    out[found] = in_sorted(label[found], distinct(np.concatenate((shared.keys[0][crossed], shared.keys[1][crossed]))))
    return out


def _following(ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of a position and one after it up to its ``ends`` (exclusive, ascending
    blocks), as (first, second) positions."""
    partners = ends - np.arange(len(ends)) - 1
    first = np.arange(len(ends)).repeat(partners)
    return first, first + 1 + np.arange(int(partners.sum())) - (np.cumsum(partners) - partners).repeat(partners)


def _compare(lines: _Lines, members: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """The pairs of the class's lines (``members``, ascending) that are compared, as positions
    in ``members`` (first, second), each with what `_mismatch` gives of it; None past MAX_PAIRS.

    A pair costs ~4 us, and pairs are as many as the lines' square, so not all are compared:
    - *leaders*, taken in turn: the lines of the first rank that has a line not yet settled
      (within SETTLED_NS of a leader). A rank's lines never pair with each other, so they
      lead in one round, one `_mismatch`. Each is compared with every line it pairs with
      (`_partners`);
    - a leader's *reach*: the lines it ends within TOGETHER_NS of (as `_split` first judges
      them: `_unaligned`). Every pair within a reach is compared (`_within`); reaches overlap
      where a line ends that near two leaders.
    A communicator that holds a leader lies whole in its reach, and `_partition` needs its
    pairs whole (`_cliques`, `typical`, `_host_offsets`). Where every communicator holds one,
    every pair that ends within the threshold at which all pairs make cliques is compared,
    and `_cliques` finds those cliques. A communicator holds none only where each of its
    lines ends within SETTLED_NS of another's leader; it then makes a spurious clique or none,
    for GAP, the sizes and `_crossing` to refuse. Two cliques are compared as a leader of one
    with the other's lines (and lines in both reaches), whose median `_apart` takes for that
    of all their pairs."""
    rank, size = lines.rank[members], lines.size[members]
    settled, leader = np.zeros(len(members), bool), np.zeros(len(members), bool)
    home = np.full(len(members), -1)  # per line, a leader whose reach holds it (`_past_max`)
    reaches: list[np.ndarray] = []
    found: list[tuple[np.ndarray, ...]] = []
    count = 0
    while not settled.all():
        now = np.flatnonzero(~settled & (rank == rank[np.argmin(settled)]))
        first, second = _partners(rank, size, now, leader)
        count += len(first)
        if count > MAX_PAIRS:
            return None
        change, level, *rest = _mismatch(lines, members[first], members[second])
        found.append((first, second, change, level, *rest))
        mismatch = _unaligned(lines.host[members[first]], lines.host[members[second]], change, level)
        led = in_sorted(first, now)  # else the second leads: one of each pair does
        mine, other = np.where(led, first, second), np.where(led, second, first)
        leader[now] = settled[now] = True
        settled[other[mismatch <= SETTLED_NS]] = True
        # A leader's reach: itself and the lines within TOGETHER_NS of it, ascending and
        # distinct, so that `_pairs` orients its ties as it orients the class's.
        near = mismatch <= TOGETHER_NS
        reaches += [distinct(np.concatenate((other[near & (mine == line)], [line]))) for line in now.tolist()]
        home[other[near]] = mine[near]
        if _past_max(count, rank, size, home, leader):
            return None
    first, second = _within(rank, size, reaches, leader)
    if count + len(first) > MAX_PAIRS:
        return None
    found.append((first, second, *_mismatch(lines, members[first], members[second])))
    return tuple(np.concatenate(values) for values in zip(*found))


def _past_max(count: int, rank: np.ndarray, size: np.ndarray, home: np.ndarray, leader: np.ndarray) -> bool:
    """Whether the pairs compared will pass MAX_PAIRS: ``count`` (those of the leaders so far)
    and, at the least, the pairs `_pairs` makes of the lines in each reach (each line in one:
    ``home``; -1 none) that lead none, each compared later, within it or as a later leader's.
    Said so before they are compared or made: 8,192 simulated ranks' lines were declined
    after 633 leaders' pairs (15 s), a reach of 4,096 lines after its 8.4 million pairs were
    made (8.6 s, 850 MB)."""
    homed = np.flatnonzero((home >= 0) & ~leader)
    held = np.bincount(home[homed])
    if count + int(held @ (held - 1)) // 2 <= MAX_PAIRS:  # pairs of two ranks with calls alike are fewer
        return False
    group, calls = home[homed], size[homed]
    return count + _alike(group, calls) - _alike(pack(group, rank[homed]), calls) > MAX_PAIRS


def _alike(group: np.ndarray, size: np.ndarray) -> int:
    """How many pairs of lines (of ``size`` calls) of one ``group`` number their calls alike
    (as `_pairs` takes them, of any ranks), counted without making them."""
    group = distinct_inverse(group)[1]
    most = _most_calls(size)
    span = int(most.max(initial=0)) + 1
    keyed = group * span + size  # sorted, a group's lines in turn, each by its calls
    order = np.argsort(keyed, kind="stable")
    ends = np.searchsorted(keyed[order], (group * span + most)[order], side="right")
    return int((ends - np.arange(len(order)) - 1).sum())


def _within(rank: np.ndarray, size: np.ndarray, reaches: list[np.ndarray], leader: np.ndarray,
            ) -> tuple[np.ndarray, np.ndarray]:
    """The pairs within the leaders' ``reaches`` (positions of a class's lines, of ``rank``
    and ``size`` calls) that `_pairs` makes, less those of a ``leader`` (compared already),
    each once, in call order (`_in_call_order`)."""
    pairs = [_pairs(rank[reach], size[reach]) for reach in reaches]
    first = np.concatenate([reach[p[0]] for reach, p in zip(reaches, pairs)])
    second = np.concatenate([reach[p[1]] for reach, p in zip(reaches, pairs)])
    keep = ~leader[first] & ~leader[second]
    key = distinct(first[keep] * len(rank) + second[keep])
    return _in_call_order(size, key // len(rank), key % len(rank))


def _partners(rank: np.ndarray, size: np.ndarray, leaders: np.ndarray, skip: np.ndarray,
              ) -> tuple[np.ndarray, np.ndarray]:
    """Per line of ``leaders`` (positions of a class's lines, of ``rank`` and ``size`` calls),
    its pairs with every line not to ``skip`` that `_pairs` makes, oriented as it orients
    them, in call order (`_in_call_order`)."""
    lead, other = leaders.repeat(len(rank)), np.tile(np.arange(len(rank)), len(leaders))
    keep = (rank[lead] != rank[other]) & ~skip[other]
    lead, other = lead[keep], other[keep]
    swap = (size[other] < size[lead]) | ((size[other] == size[lead]) & (other < lead))
    first, second = np.where(swap, other, lead), np.where(swap, lead, other)
    alike = size[second] <= _most_calls(size[first])
    return _in_call_order(size, first[alike], second[alike])


def _in_call_order(size: np.ndarray, first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of lines (positions, of ``size`` calls) in the order `_pairs` makes them: by the
    first's calls, then the second's; `_mismatch` takes runs of pairs sampled alike at once
    (`_chunks`)."""
    order = np.lexsort((second, size[second], first, size[first]))
    return first[order], second[order]


def _unaligned(host_a: np.ndarray, host_b: np.ndarray, change: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Per pair of lines (on hosts ``host_a`` and ``host_b``), its mismatch before the hosts'
    clocks are aligned: on one host the greater of the change of the end difference and the
    end difference; across hosts the change alone (their clocks' offset is in the other)."""
    return np.where(host_a == host_b, np.fmax(change, np.abs(level)), change)


def _most_calls(calls: np.ndarray) -> np.ndarray:
    """The most calls a line's peer may have, of a line of ``calls``: MAX_EDGE_CALLS more,
    or as many as make it short of the peer by MAX_CUT_SHARE."""
    return np.maximum(calls + MAX_EDGE_CALLS, np.floor(calls / (1 - MAX_CUT_SHARE)))


def _pairs(rank: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of lines (of ``rank`` and ``size`` calls) of two ranks whose calls number
    alike (within MAX_EDGE_CALLS, or the shorter short of the longer by MAX_CUT_SHARE at
    most), as (first, second) positions, the first no longer (on ties, the earlier)."""
    by_calls = np.argsort(size, kind="stable")
    calls = size[by_calls]
    # Sorted by calls, a line's partners are the next lines up to that many calls more.
    first, second = _following(np.searchsorted(calls, _most_calls(calls), side="right"))
    first, second = by_calls[first], by_calls[second]
    apart = rank[first] != rank[second]
    return first[apart], second[apart]


def _mismatch(lines: _Lines, first: np.ndarray, second: np.ndarray,
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per pair of lines, how far apart their k-th calls end, over SAMPLES calls: the upper
    quartile of the change of the end difference from one call to the next (over sqrt 2: one
    call's share; a quartile, not a median, so that groups apart every other call show it),
    and the end difference itself (`_middle_mean`; the second's end less the first's: on two
    hosts, their clocks' offset too). At the shift of the second line's calls (a window's
    edges cut them differently; `_shifts`, and across hosts `_gap_shift` too) that changes
    the least, on one host that also ends the closest, where it compares at least half the
    samples; NaN where none does. Across hosts the end difference is taken only where the
    change is within TOGETHER_NS (else NaN, for `_levels` to take where needed): it weighs
    there only where their hosts' clocks' offset is known (`_split`), for lines that may end
    together or pairs of groups that may end the least apart, a few. With them, what
    `_levels` takes it by: the shift of the second's calls that fits best, and how many
    calls of the first were sampled."""
    change_out, level_out = np.full(len(first), np.nan), np.full(len(first), np.nan)
    shift_out, samples_out = np.zeros(len(first), np.int32), np.zeros(len(first), np.int8)  # small: one per pair
    # Offset by line, the ends ascend throughout: one search finds a call on any line by its
    # end (to ~100 ns past 1e18: calls are us apart).
    keyed, gaps = lines.keyed_ends, lines.gaps
    # The last chunk's large arrays, let go once this one's are made: freed at once, malloc
    # would hand the heap's top back and page the next chunk's in anew (~1.5x slower).
    held: list[np.ndarray] = []
    count = np.minimum(np.minimum(lines.size[first], lines.size[second]) - 1, SAMPLES)
    for lo, hi in _chunks(count):
        a, b = first[lo:hi], second[lo:hi]
        k = _samples(lines, a, b, int(count[lo]))
        middle = k[:, k.shape[1] // 2]
        centres = _shifts(lines, keyed, a, b, middle)
        shifts = (centres[:, :, None] + _EDGE).reshape(len(a), -1)
        score, change = np.empty(len(a)), np.empty(len(a))
        level, shift = np.full(len(a), np.nan), np.zeros(len(a), np.int64)
        near, apart = np.flatnonzero(lines.host[a] == lines.host[b]), np.flatnonzero(lines.host[a] != lines.host[b])
        made: tuple[np.ndarray, ...] = ()
        if len(near):  # on one host the end difference picks the shift too: taken for every shift
            (score[near], change[near], level[near]), made = _fit(lines, a[near], b[near], k[near], shifts[near])
        if len(apart):
            fits, more = _changes(lines, gaps, a[apart], b[apart], k[apart], centres[apart])
            made += more
            score[apart], change[apart], shift[apart] = _moved(lines, gaps, a[apart], b[apart], k[apart], middle[apart],
                                                               centres[apart], fits)
            taken = apart[np.isfinite(score[apart]) & (change[apart] <= TOGETHER_NS)]
            level[taken] = _levels(lines, a[taken], b[taken], np.full(len(taken), k.shape[1]), shift[taken])
        held[:] = made
        seen = np.isfinite(score)
        change_out[lo:hi] = np.where(seen, change, np.nan)
        level_out[lo:hi] = level
        shift_out[lo:hi] = shift
        samples_out[lo:hi] = k.shape[1]
    return change_out, level_out, shift_out, samples_out


def _chunks(count: np.ndarray) -> list[tuple[int, int]]:
    """Bounds of the chunks of pairs compared at once: runs of pairs sampled at as many calls
    (``count``: SAMPLES, or a short line's calls with a next one), _CHUNK at most. A pair's
    mismatch is then its own, whatever pairs are compared beside it (`_compare` compares
    them a few at a time). Pairs come by their calls: runs are long."""
    edges = np.flatnonzero(np.diff(count)) + 1
    runs = zip([0, *edges.tolist()], [*edges.tolist(), len(count)])
    return [(lo, min(lo + _CHUNK, end)) for start, end in runs for lo in range(start, end, _CHUNK)]


def _samples(lines: _Lines, a: np.ndarray, b: np.ndarray, count: int) -> np.ndarray:
    """Per pair of lines (``a``-``b``), the ``count`` calls of the first compared, spread
    over the calls both have with a next one: (pair, sample)."""
    compared = np.minimum(lines.size[a], lines.size[b]) - 1  # calls with a next one
    return (np.linspace(0.0, 1.0, count) * (compared - 1)[:, None]).round().astype(np.int64)


def _moved(lines: _Lines, gaps: _Gaps, a: np.ndarray, b: np.ndarray, k: np.ndarray, middle: np.ndarray,
           centres: np.ndarray, fits: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Across hosts (``a``-``b``), where the lines' own gaps put the second's calls elsewhere
    (nodes' windows moved: started and stopped late alike), ``fits`` (`_changes`: score,
    change, shift) taken there, in place, where that fits GAP times better (above
    NOISE_FLOOR_NS): more shifts tried, two communicators' lines fit better by chance (steps
    alike), less than one's fit."""
    found = _gap_shift(lines, gaps, a, b, middle)
    extra = np.flatnonzero(found != _NONE)
    extra = extra[(np.abs(found[extra, None] - centres[extra]) > MAX_EDGE_CALLS).all(axis=1)]
    if not len(extra):
        return fits
    more, _ = _changes(lines, gaps, a[extra], b[extra], k[extra], found[extra, None])
    better = GAP * (more[0] + NOISE_FLOOR_NS) <= fits[0][extra] + NOISE_FLOOR_NS
    for out, values in zip(fits, more):
        out[extra[better]] = values[better]
    return fits


def _changes(lines: _Lines, gaps: _Gaps, a: np.ndarray, b: np.ndarray, k: np.ndarray, centres: np.ndarray,
             ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, ...]]:
    """`_fit` for pairs of lines on two hosts (``a``-``b``), less the end difference, at the
    shifts ``centres`` give or take MAX_EDGE_CALLS: per pair its score (the change; inf:
    compared at under half the samples), its change and the shift it is best at. The change
    of the end difference from one call to the next is the difference of the lines' gaps,
    the same number (ends are whole ns, exact in float64), taken without the ends' (the
    bulk of `_fit`'s work, which few pairs need: `_mismatch`); and the large arrays it
    made, for the caller to let go of when it likes."""
    # A sample's gaps of the second line at a centre's shifts lie side by side (`_Gaps.padded`,
    # NaN past its calls): a window of _WINDOW each, where it lies wholly past them, all NaN.
    first = np.clip(centres[:, :, None] + k[:, None, :] - MAX_EDGE_CALLS, -_WINDOW, (lines.size[b] - 1)[:, None, None])
    # (pair, centre, edge, sample): a shift's samples side by side, to sort; gathered so, not
    # transposed after (a copy as long as the gather)
    at = (gaps.base[b][:, None, None] + first)[:, :, None, :] + np.arange(_WINDOW)[:, None]
    differ = np.take(gaps.padded, at)
    differ -= gaps.gap[lines.starts[a][:, None] + k][:, None, None, :]
    differ = np.abs(differ, out=differ).reshape(len(a), -1, k.shape[1])  # (pair, shift, sample)
    change, seen = _upper_quartile(differ)
    change /= np.sqrt(2)
    score = np.where(seen < k.shape[1] // 2, np.inf, change)
    shifts = (centres[:, :, None] + _EDGE).reshape(len(a), -1)
    rows, best = np.arange(len(a)), score.argmin(axis=1)
    return (score[rows, best], change[rows, best], shifts[rows, best]), (at, differ)


def _levels(lines: _Lines, a: np.ndarray, b: np.ndarray, samples: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Per pair of lines (``a``-``b``, compared at ``samples`` calls of the first), the end
    difference (`_middle_mean`) at ``shift`` of the second's calls, as `_fit` takes it."""
    out = np.empty(len(a))
    for count in np.unique(samples).tolist():  # as many as chunks of pairs compared: a few
        pair = np.flatnonzero(samples == count)
        k = _samples(lines, a[pair], b[pair], count)
        calls_b = lines.size[b[pair]][:, None]
        at = k + shift[pair][:, None]
        inside = (at >= 0) & (at + 1 < calls_b)
        theirs = lines.starts[b[pair]][:, None] + np.clip(at, 0, calls_b - 2)
        before = lines.ends[theirs] - lines.ends[lines.starts[a[pair]][:, None] + k]
        out[pair] = _middle_mean(np.where(inside, before, np.nan))
    return out


def _fit(lines: _Lines, a: np.ndarray, b: np.ndarray, k: np.ndarray, shifts: np.ndarray,
         ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, ...]]:
    """Per pair of lines on one host (``a``-``b``; ``k``: the first's calls sampled), at the
    best of the ``shifts`` of the second's calls, where the end difference picks the shift
    too: its score (the greater of the change and the end difference; inf: compared at
    under half the samples), the change of the end difference (`_mismatch`) and the end
    difference; and the large arrays it made, for the caller to let go of when it likes."""
    ends = lines.ends
    calls_b = lines.size[b][:, None, None]
    mine = (lines.starts[a][:, None] + k)[:, None, :]
    # (pair, shift, sample): the second line's call compared, a shift's samples side by side, to sort
    at = shifts[:, :, None] + k[:, None, :]
    inside = (at >= 0) & (at + 1 < calls_b)
    theirs = lines.starts[b][:, None, None] + np.clip(at, 0, calls_b - 2)
    before = ends[theirs] - ends[mine]
    after = ends[theirs + 1] - ends[mine + 1]
    change, seen = _upper_quartile(np.where(inside, np.abs(after - before), np.nan))  # (pair, shift)
    change /= np.sqrt(2)
    level = np.where(inside, before, np.nan)
    score = np.fmax(change, np.abs(_middle_mean(level)))
    score[seen < k.shape[1] // 2] = np.inf
    rows, best = np.arange(len(a)), score.argmin(axis=1)
    return ((score[rows, best], change[rows, best], _middle_mean(level[rows, best])),
            (at, inside, theirs, before, after))


def _shifts(lines: _Lines, keyed: np.ndarray, a: np.ndarray, b: np.ndarray, middle: np.ndarray) -> np.ndarray:
    """Per pair of lines (``a``-``b``, the first no longer), the centres of the shifts of the
    second's calls tried (each give or take MAX_EDGE_CALLS): none (the windows' starts cut
    them alike) and their calls' difference (the ends did); on one host (one clock), the
    shift that puts the second's call ending nearest the first's ``middle`` call beside it,
    whatever cut them."""
    centres = np.stack([np.zeros(len(a), np.int64), lines.size[b] - lines.size[a]], axis=1)
    same = np.flatnonzero(lines.host[a] == lines.host[b])
    if len(same):
        a_, b_ = a[same], b[same]
        nearest = _nearest(lines, keyed, b_, lines.ends[lines.starts[a_] + middle[same]])
        centres[same] = (nearest - lines.starts[b_] - middle[same])[:, None]
    if (centres[:, 0] == centres[:, 1]).all():  # as many calls each: half the work
        centres = centres[:, :1]
    return centres


_NONE = np.iinfo(np.int64).min  # no shift found


def _gap_shift(lines: _Lines, gaps: _Gaps, a: np.ndarray, b: np.ndarray, middle: np.ndarray) -> np.ndarray:
    """Per pair of lines (``a``-``b``, the first no longer), the shift of the second's calls
    that its gaps (from one call's end to the next: on one line, free of the clock) fit the
    first's around its ``middle`` call, RUN_GAPS of them, the worst within TOGETHER_NS; where
    that fit is clearly the best, GAP times closer (above NOISE_FLOOR_NS) than any other shift
    within MAX_CUT_SHARE of the second's calls (and MAX_EDGE_CALLS): else _NONE. Two lines of
    one communicator end together, so their gaps agree; another's gaps move with the jitter of
    the work between its calls, and a job without jitter, whose steps look alike, has none
    clear. Tried: the 2 x CANDIDATES gaps of the second nearest the first's middle one (by
    value: one search), the rest no nearer."""
    half = RUN_GAPS // 2
    out = np.full(len(a), _NONE)
    size_a, size_b, start_b = lines.size[a], lines.size[b], lines.starts[b]
    fits = (middle >= half) & (middle + half < size_a)
    if not fits.any():
        return out
    mine = lines.starts[a] + middle
    value = gaps.gap[mine] + gaps.keyed[start_b] - gaps.gap[gaps.order[start_b]]  # on the second's keys
    at = np.searchsorted(gaps.keyed, value)[:, None] + np.arange(-CANDIDATES - 1, CANDIDATES + 1)
    inside = (at >= start_b[:, None]) & (at < (start_b + size_b)[:, None])
    distance = np.where(inside, np.abs(gaps.keyed[np.clip(at, 0, len(gaps.keyed) - 1)] - value[:, None]), np.inf)
    rest = np.minimum(distance[:, 0], distance[:, -1])  # none past the candidates fits better
    call = gaps.order[np.clip(at[:, 1:-1], 0, len(gaps.keyed) - 1)] - start_b[:, None]  # (pair, candidate)
    shift = call - middle[:, None]
    reach = np.floor(size_b * MAX_CUT_SHARE).astype(np.int64) + MAX_EDGE_CALLS
    valid = (inside[:, 1:-1] & fits[:, None] & (np.abs(shift) <= reach[:, None]) & (call >= half)
             & (call + half < size_b[:, None]))
    # A run fits no better than its middle gap (a bound): the runs of the candidates that may
    # fit within TOGETHER_NS are compared, then those of the rest that may fit within GAP times
    # the best (above NOISE_FLOOR_NS), on which its being clear turns.
    worst = np.where(valid, distance[:, 1:-1], np.inf)  # (pair, candidate)
    # Candidates by their place in ``worst`` flat (a view), and where their runs start.
    flat, theirs, width = worst.reshape(-1), (call + (start_b - half)[:, None]).reshape(-1), worst.shape[1]
    compared = np.zeros(len(flat), bool)
    for bound in (np.full(len(a), TOGETHER_NS), None):
        if bound is None:  # once the best within TOGETHER_NS is known
            least = worst.min(axis=1)
            bound = np.where(least <= TOGETHER_NS, GAP * (least + NOISE_FLOOR_NS) - NOISE_FLOOR_NS, -np.inf)
        near = np.flatnonzero((worst <= bound[:, None]).reshape(-1) & ~compared)
        compared[near] = True
        flat[near] = np.abs(gaps.runs[theirs[near]] - gaps.runs[mine[near // width] - half]).max(axis=1)
    rows, pick = np.arange(len(a)), worst.argmin(axis=1)
    best = worst[rows, pick]
    worst[rows, pick] = np.inf
    runner = np.minimum(worst.min(axis=1), rest)
    clear = (best <= TOGETHER_NS) & (runner + NOISE_FLOOR_NS >= GAP * (best + NOISE_FLOOR_NS))
    out[clear] = shift[rows, pick][clear]
    return out


@dataclass(frozen=True)
class _Gaps:
    """Per position of the lines' calls, the ``gap`` to its line's next call's end (its last:
    the line's largest, to rank last); and the positions by line, then gap (``order``), with
    their gaps offset by line (``keyed``, ascending throughout: one search finds a gap on any
    line). And the gaps of the calls with a next one line by line, each line's between
    _WINDOW NaN either side (``padded``, where ``base`` is each line's first call): a window
    of _WINDOW gaps from any call up to _WINDOW before a line or past its last gap holds that
    line's gaps and NaN alone."""

    gap: np.ndarray
    order: np.ndarray
    keyed: np.ndarray
    padded: np.ndarray
    base: np.ndarray

    @cached_property
    def runs(self) -> np.ndarray:
        """Per position, the RUN_GAPS gaps from it (a view), as `_gap_shift` compares them."""
        return np.lib.stride_tricks.sliding_window_view(self.gap, RUN_GAPS)


def _gaps(lines: _Lines) -> _Gaps:
    """The lines' gaps (`_Gaps`)."""
    gap = np.append(np.diff(lines.ends), 0.0)
    last = lines.starts + lines.size - 1
    gap[last] = 0.0  # past its line: to the next line's first call
    gap[last] = np.maximum.reduceat(gap, lines.starts)
    order = np.lexsort((gap, lines.line_of))
    width = lines.size - 1 + 2 * _WINDOW  # a line's gaps and its NaN
    base = np.cumsum(width) - width + _WINDOW
    padded = np.full(int(width.sum()), np.nan)
    with_next = np.flatnonzero(np.arange(len(gap)) != last.repeat(lines.size))
    padded[(base - lines.starts).repeat(lines.size)[with_next] + with_next] = gap[with_next]
    return _Gaps(gap=gap, order=order, keyed=lines.keyed(gap)[order], padded=padded, base=base)


def _nearest(lines: _Lines, keyed: np.ndarray, line: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per line, the position of its call that ends nearest ``end`` (ns from the earliest);
    ``keyed``: the ends offset by line, ascending throughout."""
    value = end + keyed[lines.starts[line]] - lines.ends[lines.starts[line]]
    after = np.clip(np.searchsorted(keyed, value), lines.starts[line] + 1, lines.starts[line] + lines.size[line] - 1)
    return after - (value - keyed[after - 1] < keyed[after] - value)


def _upper_quartile(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The upper quartile of the observed values along the last axis (NaN: not observed), and
    how many were observed. Along the last, each row sorts in place, not through a copy."""
    ranked = np.sort(values, axis=-1)  # NaN last
    seen = _observed(ranked)
    return np.take_along_axis(ranked, np.maximum(3 * (seen - 1) // 4, 0), -1)[..., 0], seen[..., 0]


def _observed(ranked: np.ndarray) -> np.ndarray:
    """How many values along the last axis are observed, of values sorted along it (NaN last):
    those before the first NaN (a search for it costs a quarter of counting them); kept as an
    axis."""
    missing = np.isnan(ranked)
    return np.where(missing[..., -1:], missing.argmax(axis=-1, keepdims=True), ranked.shape[-1])


def _middle_mean(values: np.ndarray) -> np.ndarray:
    """The mean of the middle half of the observed values along the last axis (NaN: not observed):
    robust to outliers as a median, yet averaging the noise, which a median of an end
    difference that drifts with the clocks (ppm across the window) does not: it is one
    call's, the middle one's."""
    ranked = np.sort(values, axis=-1)  # NaN last
    seen = _observed(ranked)
    sums = np.zeros((*ranked.shape[:-1], ranked.shape[-1] + 1))  # a first sum of none
    np.cumsum(np.where(np.isnan(ranked), 0.0, ranked), axis=-1, out=sums[..., 1:])
    low, high = seen // 4, seen - seen // 4
    with np.errstate(invalid="ignore", divide="ignore"):
        return ((np.take_along_axis(sums, high, -1) - np.take_along_axis(sums, low, -1)) / (high - low))[..., 0]


def _pooled(lines: _Lines, comm: np.ndarray) -> np.ndarray:
    """Per line, whether its rank has another line in one of its op groups: calls of several
    communicators grouped as one, unless told apart."""
    line_of = lines.line_of
    distinct = Groups(lines.rank[line_of], comm[lines.rows], lines.stream[line_of])
    streams = Groups(*distinct.keys[:2], ordered=True)  # per (rank, op group): its streams
    out = np.zeros(len(lines.size), bool)
    out[line_of[streams.broadcast(streams.size > 1)[distinct.id]]] = True
    return out


def _declined(lines: _Lines, members: np.ndarray, pooled: np.ndarray, comm_ids: np.ndarray, comm: np.ndarray,
              split: _Split) -> str | None:
    """The warning for a class's lines left grouped by op (``members``), where that may pool
    several communicators: where a rank ran calls of one op group on several streams
    (``pooled``), or lines end far apart."""
    ranks = distinct(lines.rank[members]).size
    if ranks < 2 or not (pooled[members].any() or split.apart_ns > TOGETHER_NS):
        return None
    line_of = lines.line_of
    groups = comm_ids[distinct(comm[lines.rows[in_sorted(line_of, members)]])].tolist()
    several = distinct(lines.rank[members[pooled[members]]]).tolist()
    where = f"; rank{'s' if len(several) > 1 else ''} {ranks_text(several)} on several" if several else ""
    return (f"NCCL calls without communicator ids ({some_of(groups)}) on {len(members)} streams of {ranks} ranks{where}"
            f", not told apart: {split.reason}; they stay grouped by op and matched by call order as one communicator, "
            "which they may not be (TP and DP groups, say), so lateness and blame across their ranks are unreliable "
            "(export with --include-blobs=true, NCCL >= 2.25.1)")


def _names(lines: _Lines, label: np.ndarray, collectives: Table) -> np.ndarray:
    """Per line, its inferred communicator's name ('' where none): ``inferred:<ops>:<members>``,
    with the stream of its first member where two communicators have the same members and ops."""
    names = np.full(len(label), "", dtype=object)
    inferred = np.flatnonzero(label >= 0)
    op, op_ids = codes(collectives["op"])
    line_of = lines.line_of
    used = Groups(label[line_of], op[lines.rows])  # (communicator, op) pairs: few
    ops: dict[int, list[str]] = {}
    for root, code in zip(used.keys[0].tolist(), used.keys[1].tolist()):
        if root >= 0:
            ops.setdefault(root, []).append(str(op_ids[code]))
    per = Groups(label[inferred], within=lines.rank[inferred])
    ranks = lines.rank[inferred][per.order]
    taken: dict[str, list[int]] = {}
    for root, lo, count in zip(per.keys[0].tolist(), per.starts.tolist(), per.size.tolist()):  # one per communicator
        taken.setdefault(f"{INFERRED_COMM}{'+'.join(sorted(ops[root]))}:{_members(ranks[lo : lo + count].tolist())}",
                         []).append(root)
    for name, roots in taken.items():
        for root in roots:
            names[label == root] = name if len(roots) == 1 else f"{name}:s{lines.stream[root]}"
    return names


def _members(ranks: list[int]) -> str:
    """Member ranks, exactly and short: '0-3', '0-56/8' (every 8th), else listed."""
    step = ranks[1] - ranks[0]
    if len(ranks) > 2 and all(b - a == step for a, b in zip(ranks, ranks[1:])):
        return f"{ranks[0]}-{ranks[-1]}" + (f"/{step}" if step > 1 else "")
    return ",".join(map(str, ranks))


def _renamed(collectives: Table, lines: _Lines, names: np.ndarray) -> dict[str, ArrayLike]:
    """The collectives with the inferred lines' calls under their communicator's name,
    numbered in call order on the line."""
    line_of = lines.line_of
    moved = names[line_of] != ""
    rows = lines.rows[moved]
    out = dict(collectives)
    out["comm_id"] = _recoded(collectives["comm_id"], rows, names[line_of[moved]])
    seq = np.array(collectives["seq"], np.int64)
    seq[rows] = (np.arange(len(lines.rows)) - lines.starts.repeat(lines.size))[moved]
    out["seq"] = seq
    return out


def _recoded(column: ArrayLike, rows: np.ndarray, values: np.ndarray) -> Coded:
    """A string column with ``values`` put in at ``rows`` (appended where ``rows`` runs past it)."""
    code, strings = codes(column)
    merged = np.array(sorted(set(strings.tolist()) | set(values.tolist())), dtype=object)
    out = np.append(np.searchsorted(merged, strings), -1)[code]  # -1 (missing) picks the appended -1
    out = np.concatenate([out, np.full(max(int(rows.max(initial=-1)) + 1 - len(out), 0), -1)])
    out[rows] = np.searchsorted(merged, values)
    return Coded(out, merged)


def _listed(communicators: Table, collectives: Table, lines: _Lines, names: np.ndarray, size: np.ndarray,
            groups: np.ndarray) -> dict[str, ArrayLike]:
    """The communicators table less the op groups (``groups``) a rank no longer calls on, plus
    each inferred line's communicator, listed by its rank with the size the traces give."""
    rank = np.asarray(communicators["rank"], np.int64)
    comm, comm_ids = codes(communicators["comm_id"])
    called, called_ids = codes(collectives["comm_id"])
    known = np.union1d(comm_ids, called_ids)
    listing = pack(np.concatenate([rank, np.asarray(collectives["rank"], np.int64)]),
                   np.concatenate([np.searchsorted(known, comm_ids)[comm], np.searchsorted(known, called_ids)[called]]))
    gone = member_of(comm_ids, groups.tolist())[comm] & ~in_sorted(listing[: len(rank)], distinct(listing[len(rank):]))
    keep = np.flatnonzero(~gone)
    new = np.flatnonzero(names != "")
    end = len(keep) + len(new)
    out: dict[str, ArrayLike] = {}
    for column, values in communicators.items():
        if column == "rank":
            out[column] = np.concatenate([rank[keep], lines.rank[new]])
        elif column == "comm_id":
            out[column] = _recoded(values[keep] if isinstance(values, Coded) else np.asarray(values, object)[keep],
                                   np.arange(len(keep), end), names[new])
        elif column == "size":
            out[column] = np.concatenate([np.asarray(values, np.float64)[keep], size[new]])
        elif isinstance(values, Coded):
            out[column] = Coded(np.concatenate([values.codes[keep], np.full(len(new), -1)]), values.values)
        else:  # member lists: none known
            out[column] = np.concatenate([np.asarray(values, object)[keep], np.full(len(new), None, object)])
    return out
