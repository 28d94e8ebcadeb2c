"""Pairing gloo's worker-thread ops with the host calls that made them, for ``kineto``.

In a CPU-only (gloo) trace ``c10d::<op>`` on the calling thread enqueues a collective and
``gloo:<op>`` on a gloo worker thread does it, but worker events name no process group, Seq
or id that links them to their call. So each worker op is paired with its call from the event
columns alone: per line (an op; where several process groups run one op, also the group each
worker thread serves), the k-th call with the k-th worker op, as gloo's queue hands them out,
by size where sizes tell a line's calls apart; a call gloo runs as several worker ops takes
that many in a row. Pairs the queue could have swapped, and worker ops that could be more
than one group's, are left unpaired, with a warning.

A module of its own: an inference over columns (rows, times, threads, op codes, sizes,
groups) that reads no trace args; ``kineto`` reads the calls, their sizes and groups from the
trace, and makes the digest's rows of the pairs.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from rankscope.analysis import groups, intervals, ops
from rankscope.analysis.kineto_events import Events, equal_any, present

_NEVER = np.iinfo(np.int64).max


# Calls gloo's worker runs as another op (torch 2.13: a reduce_scatter_tensor's worker op is
# gloo:all_reduce), unless the trace shows that op's own worker.
_GLOO_RUNS_AS = {ops.REDUCESCATTER: ops.ALLREDUCE}
# Those of them gloo runs as one such op per member of the call's group, not one (torch 2.13:
# a list-form reduce_scatter is an all_reduce per input tensor, each with its own Flight
# Recorder entry: 4 worker ops in a group of 4, 2 in a group of 2).
_GLOO_PER_MEMBER = ("c10d::reduce_scatter_",)


def gloo_runs_as(shown: set[str]) -> dict[str, str]:
    """`_GLOO_RUNS_AS` where the trace shows the worker's op run (``shown``) and not the call's own."""
    return {call: worker for call, worker in _GLOO_RUNS_AS.items() if worker in shown and call not in shown}


def pair_in_order(events: Events, work: np.ndarray, work_size: np.ndarray, calls: dict[str, np.ndarray],
                   call_size: np.ndarray, call_pg: np.ndarray, notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Pair each gloo worker op (rows; ``work_size``, ``call_size``: `kineto._pairing_sizes`) with its
    enqueue: per line, the k-th call with the k-th worker op that started after the line's
    first call (FIFO, as gloo's queue). A line is an op (a call gloo runs as another op,
    `_GLOO_RUNS_AS`, in that op's line) and, where calls of several process groups
    (``call_pg``) share the op, the group each worker op's thread serves (`_thread_groups`);
    a call takes as many worker ops in a row as it runs as (``calls["worker_ops"]``);
    where sizes tell its calls apart, also a size (`_by_size`): the queue's order holds
    among the calls of one size too, and ops of two sizes cannot have swapped. Pairs FIFO
    may have swapped (`_taken_in_doubt`) are left out. Ops never enqueued in the trace (no
    c10d events recorded) stay, unpaired, last. Returns the kept worker ops' positions in
    ``work`` and each one's in ``calls`` (-1: unpaired)."""
    work_line, call_line = _op_lines(events, work, calls)
    split = _thread_groups(events, work, work_line, calls, call_line, call_pg, notes)
    key = groups.pack(np.concatenate([work_line, call_line]), np.concatenate([split.work_group, split.call_group]) + 1)
    sizes = _by_size(work_line, work_size, call_line, call_size, calls["ts"])
    sized_key = groups.pack(key, np.concatenate([sizes.work, sizes.call]) + 1)
    sure_work, sure_call = np.flatnonzero(~split.doubtful_work), np.flatnonzero(~split.doubtful_call)
    call_ts, until, count = calls["ts"][sure_call], sizes.until[sure_call], calls["worker_ops"][sure_call]
    # Each call's pair comes from one pairing: by size before its line's first call of unknown size, else by op.
    from_size = call_ts < until
    by_op = _pairs(events, work, sure_work, key[: len(work)], call_ts, key[len(work) :][sure_call], count, _NEVER)
    by_size = (_pairs(events, work, sure_work, sized_key[: len(work)], call_ts, sized_key[len(work) :][sure_call],
                      count, until) if from_size.any() else (np.zeros(0, np.intp),) * 2 + (np.zeros(0, bool),))
    candidates, call, doubt = (np.concatenate([a[~from_size[by_op[1]]], b[from_size[by_size[1]]]])
                               for a, b in zip(by_op, by_size))
    # A worker op the two pairings each give a call, surely, to two calls: neither is sure.
    doubt |= np.bincount(candidates[~doubt], minlength=len(sure_work))[candidates] > 1
    lone = np.flatnonzero(~groups.in_sorted(work_line, np.unique(call_line)))
    # Paired by the pairing not taken for its call only: a call of unknown size had it, said already.
    dropped = len(sure_work) - len(np.union1d(by_op[0], by_size[0])) - len(lone) - split.unnamed
    if dropped:
        notes.append(f"{dropped} gloo op(s) enqueued before the window or never enqueued in it: not matched")
    in_doubt = len(np.setdiff1d(candidates[doubt], candidates[~doubt]))
    if in_doubt:
        notes.append(f"{in_doubt} gloo worker op(s) could have been taken off their group's queue in "
                     "another order than they started (worker threads free together; their events name no "
                     "call): not matched")
    candidates, call = candidates[~doubt], call[~doubt]
    return np.concatenate([sure_work[candidates], lone]), np.concatenate([sure_call[call], np.full(len(lone), -1)])


def _pairs(events: Events, work: np.ndarray, sure_work: np.ndarray, work_key: np.ndarray, call_ts: np.ndarray,
           call_key: np.ndarray, count: np.ndarray, until: np.ndarray | int
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FIFO pairs per key (`_fifo`; ``count``: the worker ops each call runs as) of the worker
    ops ``sure_work`` (positions in ``work``) and the calls, and whether each is in doubt
    (`_taken_in_doubt`): positions in ``sure_work``, in the calls, and the doubt. A call after
    a pair's call but before ``until`` (per call: a call of unknown size in its line) may be
    the next one in its line."""
    candidates, call = _fifo(events.ts[work[sure_work]], work_key[sure_work], call_ts, call_key, count)
    paired = sure_work[candidates]
    next_call = np.minimum(_neighbour(call_key, call_ts, 1, _NEVER), until)[call]
    return candidates, call, _taken_in_doubt(events, work, paired, work_key[paired], next_call, call)


@dataclass
class _Sizes:
    """Per worker op and call, its size where its line pairs by size (else -1), and per call
    the time before which its line's calls pair so (-_NEVER: none do)."""

    work: np.ndarray
    call: np.ndarray
    until: np.ndarray


def _by_size(work_line: np.ndarray, work_sizes: np.ndarray, call_line: np.ndarray, call_sizes: np.ndarray,
             call_ts: np.ndarray) -> _Sizes:
    """Sizes (`kineto._pairing_sizes`) tell a line's calls apart where each of its worker ops shows
    one (record_shapes) and its worker ops and calls show the same set of sizes: the two
    measures agree (torch 2.13 gloo, every op), and a line where they do not keeps its
    pairing by op. A call of unknown size (no entry: the window's end) could be of any: from
    it on its line pairs by op."""
    work_size, call_size = (np.where(present(b), b, -1).astype(np.int64) for b in (work_sizes, call_sizes))
    lines, line_of = np.unique(call_line, return_inverse=True)
    work_at = groups.locate(lines, work_line)  # -1: a line without calls
    known = call_size >= 0
    key = groups.pack(np.concatenate([work_line, call_line]), np.concatenate([work_size, call_size]))
    work_key, call_key = key[: len(work_line)], key[len(work_line) :]
    odd_work = (work_at >= 0) & ((work_size < 0) | ~groups.in_sorted(work_key, np.unique(call_key[known])))
    odd_call = known & ~groups.in_sorted(call_key, np.unique(work_key[work_size >= 0]))
    by_size = np.ones(len(lines), bool)
    by_size[work_at[odd_work]] = False
    by_size[line_of[odd_call]] = False
    first_unknown = np.full(len(lines), _NEVER)
    np.minimum.at(first_unknown, line_of[~known], call_ts[~known])
    return _Sizes(np.where(groups.take_or(by_size, work_at, False), work_size, -1),
                  np.where(by_size[line_of] & known, call_size, -1),
                  np.where(by_size, first_unknown, -_NEVER)[line_of])


def _taken_in_doubt(events: Events, work: np.ndarray, paired: np.ndarray, line: np.ndarray,
                    next_call_ts: np.ndarray, call: np.ndarray) -> np.ndarray:
    """Which paired worker ops (positions in ``work``, by start; ``line``, the start of the
    call after their own in it, and their ``call``, each) FIFO by start may give another's
    call. gloo's threads take ops off the queue in call order but each starts its op's event
    after letting go of the queue (torch 2.13, one PG: op 2 started 180 µs before op 1 on the
    other thread). Op j, started after op i, may have been taken first where j's thread
    was free (its previous op ended) before i started, and i started after the next call
    was made, so that i could be that call's; not where j is of i's call too (a call run as
    several worker ops, `worker_ops`): swapped, each call still has its own."""
    thread, start = events.thread[work], events.ts[work]
    order = np.lexsort((start, thread))
    reach = intervals.running_max((start + events.dur[work])[order], thread[order])
    free = np.full(len(work), -_NEVER)  # before its first op in the trace: free since who knows when
    same = thread[order][1:] == thread[order][:-1]
    free[order[1:][same]] = reach[:-1][same]
    free, start = free[paired], start[paired]
    late = np.where(start >= next_call_ts, start, -_NEVER)  # could have taken a later call
    by_line = np.lexsort((start, line))
    line, free, late, call = line[by_line], free[by_line], late[by_line], call[by_line]
    # Each op's call's ops in a row (FIFO gives a call consecutive ops of its line): compared
    # only with the ops of its line's other calls, before and after that run.
    change = (line[1:] != line[:-1]) | (call[1:] != call[:-1])
    begins, ends = np.r_[True, change], np.r_[change, True]
    at = np.arange(len(line))
    run_first = np.maximum.accumulate(np.where(begins, at, 0))
    run_last = np.minimum.accumulate(np.where(ends, at, len(line))[::-1])[::-1]
    earlier = run_first - 1  # the last op before the run, where it is of the line
    earlier_in_line = (earlier >= 0) & (line[np.maximum(earlier, 0)] == line)
    latest = intervals.running_max(late, line)  # up to and with each op
    before = np.where(earlier_in_line, latest[np.maximum(earlier, 0)], -_NEVER)  # latest of earlier calls' ops
    later = np.minimum(run_last + 1, len(line) - 1)  # the first op after the run, where it is of the line
    later_in_line = (run_last + 1 < len(line)) & (line[later] == line)
    earliest = -intervals.running_max(-free[::-1], -line[::-1])[::-1]  # from each op on
    after = np.where(later_in_line, earliest[later], _NEVER)  # earliest free of a later call's op
    doubt = np.empty(len(paired), bool)
    doubt[by_line] = (before > free) | (late > after)
    return doubt


def _op_lines(events: Events, work: np.ndarray, calls: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The op code of each worker op (rows) and of each call, a call gloo runs as another op
    (`_GLOO_RUNS_AS`) under that op's code."""
    op_code = events.names.op_code
    work_code, call_code = op_code[events.name[work]], op_code[events.name[calls["row"]]].copy()
    for call_op, worker_op in gloo_runs_as(set(events.names.op[events.name[work]].tolist())).items():
        call_code[calls["op"] == call_op] = op_code[np.flatnonzero(events.names.op == worker_op)[0]]
    return work_code, call_code


def worker_ops(events: Events, work: np.ndarray, calls: dict[str, np.ndarray], call_pg: np.ndarray,
                configs: dict[str, dict]) -> np.ndarray:
    """How many of the worker ops (rows ``work``) each call runs as: one, but a call gloo runs
    as one per member of its group (`_GLOO_PER_MEMBER`) as many as its group has, where the
    trace lists its group (``call_pg``; ``configs``: the groups listed), else the size all the
    groups it lists share; 0 where neither tells (a plain trace names no call's group)."""
    count = np.ones(len(calls["row"]), np.int64)
    runs_as = gloo_runs_as(set(events.names.op[events.name[work]].tolist()))
    spread = equal_any(events.names.text[events.name[calls["row"]]], list(_GLOO_PER_MEMBER))
    spread &= equal_any(calls["op"], list(runs_as))
    if spread.any():
        sizes = {name: size for name, config in configs.items() if (size := _members(config))}
        shared = set(sizes.values())
        either = shared.pop() if len(shared) == 1 else 0
        count[spread] = [sizes.get(pg, either) for pg in call_pg[spread].tolist()]
    return count


def _members(config: dict) -> int | None:
    """How many members a listed group has: its member list's length, else its pg_size."""
    ranks, size = config.get("ranks"), config.get("pg_size")
    return len(ranks) if isinstance(ranks, list) else size if type(size) is int else None


def countable(events: Events, work: np.ndarray, calls: dict[str, np.ndarray], listed: bool,
               notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the worker ops (rows) and calls that can be paired: not those of a line with a
    call whose worker ops are not known in number (`worker_ops`: 0), whose ops FIFO would
    give to the calls after it. A warning names them, and why (the trace ``listed`` groups,
    of sizes that differ, or none)."""
    unknown = calls["worker_ops"] == 0
    if not unknown.any():
        return np.ones(len(work), bool), np.ones(len(unknown), bool)
    work_line, call_line = _op_lines(events, work, calls)
    blind = np.unique(call_line[unknown])
    lost_work, lost_calls = groups.in_sorted(work_line, blind), groups.in_sorted(call_line, blind)
    names = ", ".join(np.unique(events.names.text[events.name[calls["row"][unknown]]]).tolist())
    runs = ", ".join(np.unique(events.names.text[events.name[work[lost_work]]]).tolist())
    notes.append(f"{int(lost_work.sum())} gloo worker op(s) of {int(lost_calls.sum())} call(s) not matched: gloo "
                 f"runs {int(unknown.sum())} {names} call(s) as one {runs} per member of their group, which the "
                 f"trace does not name ({'its groups differ in size' if listed else 'it lists no groups'}; the "
                 f"rankscope torch hook's Flight Recorder would), so the {runs} ops cannot be counted off to their calls")
    return ~lost_work, ~lost_calls


def whole_calls(events: Events, work: np.ndarray, paired: np.ndarray, call: np.ndarray, count: np.ndarray,
                 notes: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per call of the pairs (worker ops' positions in ``work``; their calls', -1:
    none): a call run as several worker ops (``count``) arrives with its first op's start
    and ends with its last op's end; one with only some of them paired (the window's edges,
    ops in doubt) is left out, with a warning. Returns each row's first op, call and end."""
    rows = work[paired]
    own = np.where(call >= 0, call, -1 - np.arange(len(call)))  # an unpaired op is a row of its own
    per = groups.Groups(own, within=events.ts[rows])
    whole = per.size == groups.take_or(count, per.keys[0], 1)
    if not whole.all():
        notes.append(f"{int((~whole).sum())} gloo call(s) run as one worker op per member of their group had only "
                     "some of those paired (the window's edges, or ops in doubt): not matched")
    first = per.first(np.arange(len(call)))[whole]
    return paired[first], call[first], per.max(events.ts[rows] + events.dur[rows])[whole]


def _fifo(work_ts: np.ndarray, work_line: np.ndarray, call_ts: np.ndarray, call_line: np.ndarray,
          count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per line, the k-th call slot with the k-th worker op started at or after the line's
    first call, where it starts at or after that slot's call: the calls by time, each
    ``count`` slots in a row (the worker ops it runs as). Returns the paired worker ops'
    positions, by start, and their calls' positions."""
    slot = np.repeat(np.arange(len(call_ts)), count)
    call_ts, call_line = call_ts[slot], call_line[slot]
    lines, line_of = np.unique(call_line, return_inverse=True)
    first = np.full(len(lines), _NEVER)
    np.minimum.at(first, line_of, call_ts)
    at = groups.locate(lines, work_line)
    candidates = np.flatnonzero((at >= 0) & (work_ts >= groups.take_or(first, at, _NEVER)))
    candidates = candidates[np.argsort(work_ts[candidates], kind="stable")]
    k_work = groups.Groups(work_line[candidates]).cumcount()
    k_call = groups.Groups(call_line).cumcount()
    key = groups.pack(np.concatenate([call_line, work_line[candidates]]), np.concatenate([k_call, k_work]))
    call = groups.locate(key[: len(call_line)], key[len(call_line) :])
    ok = call >= 0
    ok[ok] = work_ts[candidates[ok]] >= call_ts[call[ok]]
    return candidates[ok], slot[call[ok]]


# Thread-to-group assignments tried where paired ops leave some worker threads' groups open.
_ASSIGNMENTS = 256


@dataclass
class _Split:
    """Per worker op and call, its group in a split line (a code; -1: the line is not
    split), and whether the pair it is in is in doubt (left unpaired)."""

    work_group: np.ndarray
    call_group: np.ndarray
    doubtful_work: np.ndarray
    doubtful_call: np.ndarray
    unnamed: int = 0  # worker ops of the calls of split lines naming no group: unpaired, said already


def _thread_groups(events: Events, work: np.ndarray, work_line: np.ndarray, calls: dict[str, np.ndarray],
                   call_line: np.ndarray, call_pg: np.ndarray, notes: list[str]) -> _Split:
    """The process group of each worker op (rows) and call in lines whose calls name several
    groups. Worker events name no group, seq or id that links them to their call (torch
    2.13: their External ids count per thread), but each gloo group runs its ops on worker
    threads of its own: a thread's group is that of its calls paired beyond doubt by op
    alone, and the threads left get the groups that pair the most calls. Where several
    assignments do, the pairs they disagree on are in doubt. Where no assignment can be
    tried, the lines stay unsplit, paired by op alone; either way with a warning."""
    split = _Split(np.full(len(work), -1), np.full(len(call_line), -1),
                   np.zeros(len(work), bool), np.zeros(len(call_line), bool))
    pg = np.full(len(call_pg), -1)
    known = present(call_pg)
    if known.any():
        pg[known] = np.unique(call_pg[known].astype(str), return_inverse=True)[1]
    shared = _split_lines(call_line, pg)
    if not len(shared):
        return split
    in_work, in_calls = groups.in_sorted(work_line, shared), groups.in_sorted(call_line, shared)
    threads, thread_of = np.unique(events.thread[work[in_work]], return_inverse=True)
    lines = _Lines(events.ts[work[in_work]], work_line[in_work], thread_of, len(threads),
                   calls["ts"][in_calls], call_line[in_calls], pg[in_calls], calls["worker_ops"][in_calls])
    callers = groups.in_sorted(threads, np.unique(events.thread[calls["row"]])).any()
    assigned = None if callers else lines.assign()
    if assigned is None:
        notes.append(f"{int(in_work.sum())} gloo worker op(s) of ops several process groups run could not be "
                     "told to their group (worker events name none, nor do their threads here): paired by op "
                     "and order, so a call may carry another group's timing")
        return split
    thread_pg, doubtful_work, doubtful_call = assigned
    split.work_group[in_work] = thread_pg[thread_of]
    split.call_group[in_calls] = pg[in_calls]
    split.unnamed = int(calls["worker_ops"][in_calls][pg[in_calls] < 0].sum())
    split.doubtful_work[np.flatnonzero(in_work)[doubtful_work]] = True
    split.doubtful_call[np.flatnonzero(in_calls)[doubtful_call]] = True
    if doubtful_work.any():
        notes.append(f"{len(doubtful_work)} gloo worker op(s) could belong to more than one process group's call "
                     "(their events name no group, and their threads' groups are not certain): not matched")
    return split


def _split_lines(call_line: np.ndarray, pg: np.ndarray) -> np.ndarray:
    """Lines (sorted) whose calls name two or more groups (pg >= 0). Calls naming none (no
    Flight Recorder entry: the ring's or the window's edges) do not keep a line unsplit: op
    alone would pair its named calls across groups again; they pair with no worker op."""
    named = groups.Groups(call_line)
    spread = named.max(pg) > named.min(np.where(pg >= 0, pg, _NEVER))
    return np.sort(named.keys[0][spread])


@dataclass
class _Lines:
    """Worker ops (start, line, thread) and calls (time, line, group, worker ops it runs as)
    of the split lines."""

    work_ts: np.ndarray
    work_line: np.ndarray
    thread: np.ndarray  # 0..threads-1
    threads: int
    call_ts: np.ndarray
    call_line: np.ndarray
    pg: np.ndarray
    count: np.ndarray

    def _group_pairs(self, pg: int, threads: tuple[int, ...]) -> np.ndarray:
        """The pairs (ids, `_ids`) of group ``pg``'s calls, FIFO per line, with the worker ops
        of the threads assigned to it: each group pairs on its own, so assignments that give
        a group the same threads give it the same pairs."""
        serves = np.zeros(self.threads, bool)
        serves[list(threads)] = True
        work, call = np.flatnonzero(serves[self.thread]), np.flatnonzero(self.pg == pg)
        w, c = _fifo(self.work_ts[work], self.work_line[work], self.call_ts[call], self.call_line[call],
                     self.count[call])
        return self._ids(work[w], call[c])

    def _ids(self, work: np.ndarray, call: np.ndarray) -> np.ndarray:
        """One integer per (worker op, call) pair, the same in every pairing."""
        return work * (len(self.call_ts) + 1) + call

    def seeds(self) -> np.ndarray:
        """Each thread's group where the pairs by op alone that leave no doubt give it one
        (-1: none, or several): a pair leaves none where no other call of the line comes
        between its call and the worker op's start, nor any other worker op start."""
        work, call = _fifo(self.work_ts, self.work_line, self.call_ts, self.call_line, self.count)
        next_call = _neighbour(self.call_line, self.call_ts, 1, _NEVER)[call]
        previous_start = _neighbour(self.work_line[work], self.work_ts[work], -1, -_NEVER)
        sure = (next_call > self.work_ts[work]) & (self.call_ts[call] > previous_start)
        thread, vote = groups.Groups(self.thread[work[sure]], self.pg[call[sure]]).keys
        seeded = np.full(self.threads, -1)
        count = np.bincount(thread, minlength=self.threads)
        single = count[thread] == 1
        seeded[thread[single]] = vote[single]
        return seeded

    def assign(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Each thread's group, and the worker ops and calls (positions) whose pairs are in
        doubt: the seeds, and for the other threads the groups of their lines that pair the
        most calls; a pair is in doubt where the assignments that do pair differently. None
        where too many assignments would have to be tried."""
        assigned = self.seeds()
        open_ = np.flatnonzero(assigned < 0)
        options = [np.unique(self.pg[groups.in_sorted(self.call_line, np.unique(self.work_line[self.thread == t]))
                                     & (self.pg >= 0)]) for t in open_.tolist()]
        if math.prod(len(o) for o in options) > _ASSIGNMENTS:
            return None
        # Pairing per group, cached: of the groups' thread sets across all assignments only a
        # few differ, and a full pairing per assignment made a 20k-op trace take seconds.
        group_pairs = functools.cache(self._group_pairs)
        pgs = np.unique(self.pg[self.pg >= 0]).tolist()
        best, pairings = -1, []
        for choice in itertools.product(*options):
            assigned[open_] = choice
            ids = np.concatenate([group_pairs(pg, tuple(np.flatnonzero(assigned == pg).tolist())) for pg in pgs])
            if len(ids) > best:
                best, pairings, chosen, chosen_ids = len(ids), [], assigned.copy(), ids
            if len(ids) == best:
                pairings.append(ids)
        agreed = np.unique(functools.reduce(np.intersect1d, pairings))  # sorted, for in_sorted, also when one
        doubtful = chosen_ids[~groups.in_sorted(chosen_ids, agreed)]
        work, call = np.divmod(doubtful, len(self.call_ts) + 1)
        return chosen, work, call


def _neighbour(line: np.ndarray, ts: np.ndarray, step: int, missing: int) -> np.ndarray:
    """Per row, the time of the next (step 1) or previous (-1) row of its line, by time."""
    order = np.lexsort((ts, line))
    line, ts = line[order], ts[order]
    same = line[1:] == line[:-1]
    out = np.full(len(order), missing, np.int64)
    if step > 0:
        out[order[:-1][same]] = ts[1:][same]
    else:
        out[order[1:][same]] = ts[:-1][same]
    return out
