"""From digests to a report: match, align, measure, find stragglers.

Every stage is a function of long tables whose rows partition by one key, so the
work splits along the architecture's map/reduce lines (ARCHITECTURE.md) when one
process is not enough:
- per rank (map): exploding the digest row, kernel and busy figures, the own-delay
  gaps (stragglers.own_delay orders each rank's rows on its own clock);
- per communicator (reduce): matching.match: instances never span communicators (those of
  calls no trace names are first told apart per op group, across its ranks: lines.infer);
- per host (reduce): the clock fit's per-host lines (one vectorised step over hosts
  per round; the consensus between rounds is the only all-host exchange);
- per instance / per communicator: metrics on the aligned rows.
Today all stages run in this process on whole-job tables of numpy columns
(digest.columns; strings as integer codes), grouped in numpy (groups.py), with no
DataFrame built per call: on a shared 2-core machine about 3 ms for 8 simulated ranks
(fixed cost: one analyze() per job, often in a fresh process), 14 ms for 64 and 63 ms
for 512. Stages skip what their input makes moot (one host: no clock fit; no p2p call:
no pair keys; ranks already aligned: no re-alignment search).
"""

from __future__ import annotations

import warnings as pywarnings
from collections.abc import Callable, Mapping
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.analysis import clock, digest, links, matching, metrics, stragglers
from rankscope.analysis.digest import columns
from rankscope.analysis.groups import ArrayLike, Coded, Groups, Table, codes, distinct, in_sorted, member_of
from rankscope.analysis.report import (
    Alignment,
    CommunicatorRow,
    HostClockRow,
    OpSpread,
    RankRow,
    Report,
    TpOverhead,
    field_names,
    ranks_text,
    some_of,
)
from rankscope.errors import InputError, RankscopeWarning, shown
from rankscope.node_name import natural

# Far past any job run (the largest train on ~100k GPUs): a larger world size is a corrupt field.
MAX_WORLD_SIZE = 1 << 22
# Below this, a happens-before violation on one host's clock may be timestamp noise (CPU/GPU
# timebase mapping), not a mispairing.
MISPAIRED_FLOOR_NS = 10_000
_META = ["rank", "host", "job_id", "window_start_ns", "window_end_ns", "gpu_busy_ns", "compute_only_ns", "comm_only_ns",
         "overlap_ns"]
# the report rows' fields, looked up once (dataclasses.fields costs ~9 us a call)
_RANK_FIELDS = [n for n in field_names(RankRow) if n != "top_kernels"]
_OP_FIELDS = field_names(OpSpread)
_TP_FIELDS = [n for n in field_names(TpOverhead) if n != "comm_id"]


def analyze(digests: pa.Table, *, clock_hints: Mapping[str, int] | None = None) -> Report:
    """Analyse one job's digests (one row per rank) into a report."""
    if digests.num_rows == 0:
        raise InputError("no ranks to analyse")
    meta = {name: digests.column(name).to_numpy() for name in _META}
    collectives = columns(digests, "collectives")
    if not len(collectives["rank"]):
        _no_collectives(digests)
    collectives["duration"] = collectives["end_ns"] - collectives["start_ns"]
    communicators = columns(digests, "communicators", keep=("rank",))
    kernels = columns(digests, "kernels", keep=("rank",))
    steps = columns(digests, "steps", keep=("rank",))
    ranks, host_of_rank = meta["rank"].tolist(), meta["host"].tolist()
    notes = _rank_notes(ranks, digests.column("warnings").to_pylist())
    world = _world_size(digests.column("world_size"), notes)
    missing = _missing_ranks(ranks, world)
    notes += _coverage_notes(ranks, world, missing, collectives["rank"])

    present = set(ranks)
    hosts = natural(set(host_of_rank))  # the report's host rows and warnings in that order
    matched, model, hb, mispaired = _aligned(
        matching.match(collectives, communicators, present), hosts, clock_hints, notes,
        lambda fitted: matching.match(collectives, communicators, present, fitted))
    events = matched.events
    sizes = _known_sizes(matched, missing, notes)

    inst = metrics.instance_frame(events)
    wait = np.zeros(len(events["rank"]), dtype=np.int64)
    wait[inst["row"]] = inst["wait"]
    events["wait"] = wait
    per_rank = metrics.rank_frame(meta, events, inst)
    found = stragglers.find(events, per_rank["rank"])
    all_warnings = matched.warnings + model.warnings + notes
    for message in matched.warnings + model.warnings:
        pywarnings.warn(message, RankscopeWarning, stacklevel=2)

    hosts_of = dict(zip(ranks, host_of_rank))
    kinds = metrics.communicator_kinds(matched.members, matched.names, hosts_of, metrics.communicator_ops(events))
    tp_comms = _tp_communicators(matched, kinds, set(ranks), all_warnings)
    tp_table = metrics.tp_overhead(events, steps, meta, tp_comms)
    if outside := sorted(set(tp_comms) - set(tp_table["comm_id"].tolist())):
        # only collectives inside a traced step count where a rank traced steps
        all_warnings.append(f"{len(outside)} TP communicator(s) ran no collective inside the traced steps "
                            f"({some_of(outside)}): no TP overhead for them")
        pywarnings.warn(all_warnings[-1], RankscopeWarning, stacklevel=2)
    top = metrics.job_top_kernels(kernels) if len(kernels["rank"]) else None
    late_ranks = _late_ranks(per_rank, found.min_effect_ns, found.ranks)
    comm_rows = _communicator_rows(matched, kinds, hosts_of, metrics.op_spread(events, inst, sizes))
    return Report(
        job_id=next((j for j in meta["job_id"] if isinstance(j, str) and j), None),
        ranks=_rank_rows(per_rank, model, found, kernels),
        stragglers=found.ranks,
        stragglers_not_judged=stragglers.not_judged(found, events, inst, late_ranks),
        late_ranks=late_ranks,
        communicators=comm_rows,
        slow_communicators=links.slow_communicators(comm_rows),
        tp_overhead=_tp_rows(tp_table, matched),
        alignment=_alignment(model, matched, hosts, len(events["rank"]), hb, mispaired),
        top_kernels=_records(top, list(top)) if top is not None else [],
        warnings=all_warnings,
        world_size=world,
        missing_ranks=missing,
    )


def _no_collectives(digests: pa.Table) -> NoReturn:
    """Refuse a job with no collective to align, the traces' notes said first: why calls
    were left out of the digests (unpaired gloo ops, say) is among them."""
    for note in _rank_notes(digests.column("rank").to_pylist(), digests.column("warnings").to_pylist()):
        pywarnings.warn(note, RankscopeWarning, stacklevel=3)
    files = sorted(set(digests.column("source_file").to_pylist()))
    if len(files) == 1:
        raise InputError("no collectives in this rank's trace: nothing to align", path=files[0])
    raise InputError(f"no collectives in any rank of {len(files)} files ({_file_list(files)}): nothing to align")


def _coverage_notes(ranks: list[int], world: int | None, missing: list[int], collective_ranks: np.ndarray) -> list[str]:
    """What the input lacks of the job: ranks of its world not in it, and ranks in it that
    recorded no collective (said on stderr too: a whole node, or a hung rank, may be why)."""
    notes = []
    if missing:
        notes.append(f"{len(missing)} of the job's {world} ranks not in the input ({ranks_text(missing)}): lateness, "
                     f"blame and stragglers are relative to the {len(ranks)} present alone")
    silent = _silent_ranks(ranks, collective_ranks)
    if silent:
        notes.append(f"{len(silent)} of the {len(ranks)} ranks in the input recorded no collectives "
                     f"({ranks_text(silent)}): no lateness or blame is measured for them (hung, exited, or "
                     "idle through the window?)")
    for note in notes:
        pywarnings.warn(note, RankscopeWarning, stacklevel=3)
    return notes


def _aligned(matched: matching.Matching, hosts: list[str], clock_hints: Mapping[str, int] | None, notes: list[str],
             rematch: Callable[[matching.FittedEnds], matching.Matching],
             ) -> tuple[matching.Matching, clock.ClockModel, clock.HappensBefore, int]:
    """Fit the hosts' clocks and put the matched events on the aligned time base (start, end,
    sigma); the matching (`rematch` gives it again, re-aligned on fitted clocks, where
    happens-before puts a shift in doubt: `_realigned_on_fitted_clocks`, or on the
    coordinator's, where the fit disagrees with them: `_realigned_on_hint_clocks`), the
    model, its happens-before check (a note where it finds violations), and how many
    instances were dropped as mispaired (`_mispaired`: the clocks are fitted again without them)."""
    model = _on_clock(matched.events, hosts, clock_hints)
    hb = clock.happens_before(matched.events)
    if hb.violations and (realigned := _realigned_on_fitted_clocks(matched, hb, hosts, clock_hints, rematch)):
        matched, model, hb = realigned
    if model.off_hints and (realigned := _realigned_on_hint_clocks(matched, hb, hosts, clock_hints, rematch)):
        matched, model, hb = realigned
    events = matched.events
    mispaired = _mispaired(hb, events, matched.unconfirmed)
    if len(mispaired):
        instance = np.array(events["instance"], dtype=np.int64)
        comms = sorted(_communicators_of(events, mispaired))
        instance[in_sorted(instance, mispaired)] = matching.UNMATCHED
        events["instance"] = instance
        notes.append(f"{len(mispaired)} N-to-N instance(s) on communicators whose members were inferred "
                     f"({some_of(comms)}) broke happens-before by far more than the clocks' uncertainty: calls of "
                     f"different collectives paired by op and call order ({_mispaired_cause(comms)}); "
                     "dropped, and the clocks fitted without them"
                     + ("; the calls of those communicators were re-aligned on their end times first, a shift these "
                        "pairs put in doubt too" if matched.realigned & set(comms) else ""))
        pywarnings.warn(notes[-1], RankscopeWarning, stacklevel=3)
        model = _on_clock(events, hosts, clock_hints)
        hb = clock.happens_before(events)
    if hb.violations:
        notes.append(_happens_before_note(hb, events, matched.unconfirmed))
    return matched, model, hb, len(mispaired)


def _mispaired_cause(comms: list[str]) -> str:
    """Why calls of different collectives met: a capture lost calls of one rank, or, on a
    communicator no trace named (a process group's, or an NCCL communicator's), the calls of
    several groups were pooled."""
    lost = "a capture that lost calls of one rank"
    if any(c.startswith((digest.UNRESOLVED_PG, digest.INFERRED_COMM)) for c in comms):
        return f"calls of several process groups their traces do not name, pooled as one, or {lost}"
    return lost


def _realigned_on_fitted_clocks(
    matched: matching.Matching, hb: clock.HappensBefore, hosts: list[str], clock_hints: Mapping[str, int] | None,
    rematch: Callable[[matching.FittedEnds], matching.Matching],
) -> tuple[matching.Matching, clock.ClockModel, clock.HappensBefore] | None:
    """The matching, clocks and happens-before check again, where happens-before is broken on
    ordinal-matched communicators whose members captured different numbers of calls; None
    where the suspects among these (those no re-alignment shifted) are none, alone link some
    hosts, shift on no member, or shifted leave as many violations.

    A capture window that starts a whole step later on one node shifts such a communicator
    by one call, and where every gap between its calls is alike (one all-reduce per step, all
    of one size) the gaps cannot tell (`matching._shift_ordinals_across_hosts`); fitted with
    the rightly paired calls, the clocks go wild (drifts of thousands of ppm) and hide every
    cross-host figure (alignment-and-metrics.md §5: one off-by-one corrupts a fit), or follow
    the wrongly paired ones where those are most, and the right ones break happens-before. So
    every suspect is left out, violating or not, and the clocks fitted from the rest (calls
    every member captured alike, or re-aligned on their gaps) put each suspect's ends on one
    time base, where they must coincide call by call as on one host."""
    events = matched.events
    comm, comm_ids = codes(events["comm_id"])
    instance = np.asarray(events["instance"], np.int64)
    suspects = matched.uneven - matched.realigned
    if not _communicators_of(events, hb.violating) & matched.uneven or not suspects:
        return None
    rest = dict(events, instance=np.where(member_of(comm_ids, suspects)[comm], matching.UNMATCHED, instance))
    if clock.linked_hosts(rest) != clock.linked_hosts(events):
        return None
    fitted = clock.fit(rest, hosts, clock_hints)
    again = rematch(matching.FittedEnds(suspects, fitted.align(events["host"], events["end_ns"])))
    if again.realigned == matched.realigned:
        return None
    model, checked = _checked(again, hosts, clock_hints)
    if checked.violations >= hb.violations:  # no better: the shift the clocks told is in doubt too
        return None
    return again, model, checked


def _realigned_on_hint_clocks(
    matched: matching.Matching, hb: clock.HappensBefore, hosts: list[str], clock_hints: Mapping[str, int],
    rematch: Callable[[matching.FittedEnds], matching.Matching],
) -> tuple[matching.Matching, clock.ClockModel, clock.HappensBefore] | None:
    """The matching, clocks and happens-before check again, with the ordinal-matched
    communicators whose members captured different numbers of calls re-aligned on the
    coordinator's clock offsets (``clock_hints``); None where some host has none, no pairing
    changes, or the clocks fitted after it still disagree with the hints or break
    happens-before more.

    Where a node's capture starts whole steps late and every communicator spanning hosts is
    shifted alike, happens-before holds and the fit is one step period off the truth:
    nothing in the end times tells it from a clock offset, but the ping-based hints do
    (`clock._hint_disagreements`). Those re-aligned on their gaps are re-aligned too, as a
    gap shift can be wrong the same way. The hints carry no drift and are about
    `clock.HINT_UNCERTAINTY_NS` off, so only members whose calls are more than 4x that
    apart are shifted (`matching.FittedEnds.error_ns`): a one-step cut needs steps over 4 ms
    and a drift times capture length well under a quarter step."""
    events = matched.events
    host, names = codes(events["host"])
    if not matched.uneven or not set(names.tolist()) <= clock_hints.keys():
        return None
    hinted = np.asarray(events["end_ns"], np.int64) - np.array([clock_hints[h] for h in names], np.int64)[host]
    again = rematch(matching.FittedEnds(matched.uneven, hinted, "the coordinator's clock offsets",
                                        clock.HINT_UNCERTAINTY_NS))
    if np.array_equal(again.events["instance"], events["instance"]):
        return None
    model, checked = _checked(again, hosts, clock_hints)
    if model.off_hints or checked.violations > hb.violations:
        return None
    return again, model, checked


def _checked(again: matching.Matching, hosts: list[str], clock_hints: Mapping[str, int] | None,
             ) -> tuple[clock.ClockModel, clock.HappensBefore]:
    """A re-alignment's clocks and happens-before check, on its own events (the matching it
    was tried against keeps its own): what the re-alignment is kept or dropped on."""
    model = _on_clock(again.events, hosts, clock_hints)
    return model, clock.happens_before(again.events)


def _known_sizes(matched: matching.Matching, missing: list[int], notes: list[str]) -> dict[str, int]:
    """The communicators' sizes, less those counted only from the ranks using them
    (``matched.unconfirmed``, no size in the traces) where the input lacks ranks of the job
    (``missing``): such a group may have more members than the input shows, and nccl-tests'
    bus factor ((n - 1) for an AllGather) would be taken for too few."""
    unknown = sorted(c for c in matched.unconfirmed & matched.sizes.keys() if matched.sizes[c] == len(matched.members[c]))
    if not missing or not unknown:
        return matched.sizes
    notes.append(f"no bus bandwidth for {len(unknown)} communicator(s) whose size is unknown ({some_of(unknown)}): "
                 "their members are inferred from the ranks in the input, which lacks ranks of the job")
    pywarnings.warn(notes[-1], RankscopeWarning, stacklevel=3)
    return {c: n for c, n in matched.sizes.items() if c not in unknown}


def _on_clock(events: dict, hosts: list[str], clock_hints: Mapping[str, int] | None) -> clock.ClockModel:
    model = clock.fit(events, hosts, clock_hints)
    events["start"] = model.align(events["host"], events["start_ns"])
    events["end"] = model.align(events["host"], events["end_ns"])
    events["sigma"] = model.uncertainty(events["host"])
    return model


def _mispaired(hb: clock.HappensBefore, events: dict, unconfirmed: frozenset[str]) -> np.ndarray:
    """The violating instances (``hb``) that no clock error explains, on communicators matched
    by op and call order alone (``unconfirmed``): the last arrival began after the first
    member had finished by more than 3 sigma of the two hosts' clocks (0 on one host) and
    MISPAIRED_FLOOR_NS. An N-to-N collective cannot end anywhere before all have arrived, so
    such an instance pairs calls of different collectives; AllToAll sizes, which differ per
    rank, cannot catch it. Kept, the HTA trace_filter pair's two (553 and 579 ms past a
    0.3 ms uncertainty) made rank 0 late by 205 ms on average where every pair whose ends
    coincide has rank 1 last."""
    if not hb.violations or not unconfirmed:
        return np.zeros(0, dtype=np.int64)
    instance = np.asarray(events["instance"], np.int64)
    comm, comm_ids = codes(events["comm_id"])
    rows = np.flatnonzero(in_sorted(instance, hb.violating) & member_of(comm_ids, unconfirmed)[comm])
    start, end = np.asarray(events["start"])[rows], np.asarray(events["end"])[rows]
    by_start, by_end = Groups(instance[rows], within=start), Groups(instance[rows], within=end)
    last = rows[by_start.order[by_start.starts + by_start.size - 1]]  # each instance's last arrival
    first = rows[by_end.order[by_end.starts]]  # and first to finish (both groupings: instances ascending)
    host, _ = codes(events["host"])
    sigma = np.asarray(events["sigma"], np.float64)
    pair = np.where(host[last] == host[first], 0.0, np.hypot(sigma[last], sigma[first]))
    late = np.asarray(events["start"])[last] - np.asarray(events["end"])[first]
    return by_start.keys[0][late > np.maximum(metrics.SIGMAS * pair, MISPAIRED_FLOOR_NS)]


def _communicators_of(events: dict, instances: np.ndarray) -> set[str]:
    """The comm_ids of the rows of ``instances`` (ascending)."""
    comm, comm_ids = codes(events["comm_id"])
    return set(comm_ids[distinct(comm[in_sorted(np.asarray(events["instance"]), instances)])].tolist())


def _happens_before_note(hb: clock.HappensBefore, events: dict, unconfirmed: frozenset[str]) -> str:
    """What the violations say: on communicators whose members were inferred and no size
    confirms (`matching.Matching.unconfirmed`), that calls of different groups were likely
    paired (traces without communicator ids are matched by op and call order alone: a TP and
    a DP all-reduce look alike), which no clock error explains; otherwise that lateness near
    the clock uncertainty is unreliable."""
    said = (f"{hb.violations} of {hb.checked} N-to-N instances violate happens-before after alignment "
            f"({100 * hb.rate:.1f}%)")
    inferred = sorted(_communicators_of(events, hb.violating) & unconfirmed)
    if not inferred:
        return f"{said}: lateness near the clock uncertainty is unreliable"
    return (f"{said}, on communicators whose members were inferred ({some_of(inferred)}): calls of different "
            "groups may be paired as one collective, which makes lateness, blame and stragglers unreliable "
            "(traces naming each call's group tell them apart: nsys export --include-blobs=true with NCCL >= 2.25.1; "
            "PyTorch traces recorded by rankscope's torch hook)")


def _tp_communicators(matched: matching.Matching, kinds: Mapping[str, str], ranks: set[int],
                      warnings: list[str]) -> list[str]:
    """The TP communicators of more than one rank; a warning where one, unnamed, spans every
    rank: a TP group as wide as the job looks just like a data-parallel job's world group."""
    tp_comms = [c for c, k in kinds.items() if k == "tp" and len(matched.members[c]) > 1]
    if guessed := [c for c in tp_comms if not matched.names.get(c) and set(matched.members[c]) == ranks]:
        warnings.append(f"{len(guessed)} unnamed communicator(s) spanning every rank, on one host, taken as TP "
                        f"by their layout ({some_of(guessed)}): a data-parallel job's world group looks the same")
    return tp_comms


def _alignment(model: clock.ClockModel, matched: matching.Matching, hosts: list[str], collectives: int,
               hb: clock.HappensBefore, mispaired: int) -> Alignment:
    return Alignment(
        method=model.method,
        matching=matched.method,
        t0_ns=model.t0_ns,
        hosts=[_host_row(model.hosts[h]) for h in hosts],
        collectives=int(collectives),
        matched_collectives=matched.instances - mispaired,
        dropped_incomplete=matched.dropped_incomplete,
        dropped_inconsistent=matched.dropped_inconsistent + mispaired,
        anchors=model.anchors,
        happens_before_checked=hb.checked,
        happens_before_violations=hb.violations,
        happens_before_violation_rate=hb.rate,
    )


def _world_size(world_sizes: pa.ChunkedArray, notes: list[str]) -> int | None:
    """The job's world size where the traces say it (a note where what they say cannot be)."""
    world = pc.max(world_sizes).as_py()
    if world is not None and world > MAX_WORLD_SIZE:  # a corrupt WORLD_SIZE or nranks
        notes.append(f"world size {world:,} in the traces is past {MAX_WORLD_SIZE:,} ranks: taken as unknown")
        pywarnings.warn(notes[-1], RankscopeWarning, stacklevel=3)
        return None
    return world


def _missing_ranks(ranks: list[int], world: int | None) -> list[int]:
    """The job's ranks the input lacks."""
    if world is None:
        return []
    # a mask of the world rather than np.setdiff1d (two np.unique and an np.isin: ~180k
    # instructions at any size)
    present = np.array(ranks, np.int64)
    absent = np.ones(max(world, 0), bool)
    absent[present[(present >= 0) & (present < world)]] = False
    return absent.nonzero()[0].tolist()


def _silent_ranks(ranks: list[int], collective_ranks: np.ndarray) -> list[int]:
    """Ranks in the input with no collective rows."""
    return sorted(set(ranks) - set(distinct(collective_ranks).tolist()))


def _host_row(clock_: clock.HostClock) -> HostClockRow:
    return HostClockRow(
        host=clock_.host, offset_ns=clock_.offset_ns, drift_ppm=clock_.drift_ppm, uncertainty_ns=clock_.uncertainty_ns,
        anchors=clock_.anchors, method=clock_.method,
        nonlinear_ns=float(np.abs(clock_.window_residuals).max()) if clock_.window_residuals else 0.0,
    )


def _rank_notes(ranks: list[int], notes: list[list[str]]) -> list[str]:
    """Digest warnings, each said once with the ranks it concerns."""
    by_text: dict[str, list[int]] = {}
    for rank, texts in zip(ranks, notes):
        for text in texts:
            by_text.setdefault(text, []).append(rank)
    return [f"rank{'s' if len(r) > 1 else ''} {_rank_list(r)}: {text}" for text, r in by_text.items()]


def _file_list(files: list[str]) -> str:
    return ", ".join(map(shown, files)) if len(files) <= 3 else f"{shown(files[0])}, ..., {shown(files[-1])}"


def _rank_list(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return ",".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"


def _late_ranks(per_rank: Table, min_effect: float, stragglers_found: list[int]) -> list[int]:
    """Ranks arriving late beyond their peers (standing out, or above a jump as where one
    rank of several TP pairs is slow and its mates wait): root causes and the ranks they delayed.

    Too few ranks for robust statistics (a two-rank job): a rank later than its peer by the
    minimum effect, so a single late rank is still named with its lateness. (Lateness counts
    from the earliest arrival, so in a balanced pair each rank is late about half the time:
    it is the difference that tells a late rank.) A straggler that arrives late at all is
    one, whether or not its lateness alone stands out (its own delay named it).
    """
    ranks, late = per_rank["rank"], np.asarray(per_rank["late_mean_ns"], dtype=np.float64)
    flagged, _ = stragglers.outliers(ranks, late, min_effect)
    known = ~np.isnan(late)
    if known.sum() < 3:
        earliest = late[known].min() if known.any() else 0.0
        flagged = [int(r) for r in ranks[known & (late - earliest > min_effect)]]
    late_of = dict(zip(ranks.tolist(), late.tolist()))
    flagged = set(flagged) | {r for r in stragglers_found if late_of.get(r, 0.0) > 0}
    return sorted(flagged, key=lambda r: -late_of[r])


def _rank_rows(per_rank: Table, model: clock.ClockModel, found: stragglers.Stragglers, kernels: Table) -> list[RankRow]:
    ranks = per_rank["rank"].tolist()
    clocks = [model.hosts[h] for h in per_rank["host"].tolist()]
    columns = {
        "clock_offset_ns": _plain_list(np.array([c.offset_ns for c in clocks], dtype=np.float64)),
        "clock_uncertainty_ns": _plain_list(np.array([c.uncertainty_ns for c in clocks], dtype=np.float64)),
        "own_delay_ns": _plain_list(found.own_delay_ns),
        "straggler_score": _plain_list(found.score),
        "late_cause": [found.causes.get(r) for r in ranks],
    }
    names = _RANK_FIELDS
    integers = {"rank", "blame_ns", "nccl_kernel_ns", "nccl_wait_ns", "nccl_transfer_ns", "collectives", "matched",
                "nccl_unmatched_ns"}
    for name in names:
        values = columns[name] if name in columns else _plain_list(per_rank[name])
        columns[name] = [int(v) if v is not None else v for v in values] if name in integers else values
    top_by_rank: dict[int, list[dict]] = {}
    if len(kernels["rank"]):
        top = metrics.top_kernels(kernels)
        for rank, record in zip(top["rank"].tolist(), _records(top, ["name", "count", "total_ns", "is_comm"])):
            top_by_rank.setdefault(rank, []).append(record)
    at = names.index("rank")
    # positional: names are RankRow's fields in order (no dict and keywords per rank)
    return [RankRow(*values, top_kernels=top_by_rank.get(values[at], [])) for values in zip(*(columns[n] for n in names))]


def _records(table: Table, names: list[str]) -> list[dict]:
    """Rows as dicts of plain Python values, NaN as None; one conversion per column
    rather than per cell."""
    columns = [_plain_list(table[n]) for n in names]
    return [dict(zip(names, values)) for values in zip(*columns)]


def _plain_list(column: ArrayLike) -> list:
    """A column as plain Python values, NaN as None: one tolist, then only the missing
    cells replaced (~47 calls per report: nonzero() rather than np.flatnonzero's wrapper)."""
    out = column.tolist()
    if not isinstance(column, Coded) and column.dtype.kind == "f":
        for i in np.isnan(np.asarray(column)).nonzero()[0].tolist():
            out[i] = None
    return out


def _communicator_rows(
    matched: matching.Matching, kinds: dict[str, str], hosts_of: dict[int, str], spread: Table
) -> list[CommunicatorRow]:
    by_comm: dict[str, list[OpSpread]] = {}
    for record in _records(spread, list(spread)):
        op = OpSpread(**{k: record[k] for k in _OP_FIELDS})
        op.calls, op.instances = int(op.calls), int(op.instances)
        by_comm.setdefault(record["comm_id"], []).append(op)
    rows = []
    for comm_id, ranks in sorted(matched.members.items(), key=lambda item: (min(item[1], default=0), item[0])):
        rows.append(
            CommunicatorRow(
                comm_id=comm_id, name=matched.names.get(comm_id), kind=kinds[comm_id], ranks=list(ranks),
                hosts=len({hosts_of.get(r) for r in ranks}), ops=by_comm.get(comm_id, []),
            )
        )
    return rows


def _tp_rows(table: Table, matched: matching.Matching) -> list[TpOverhead]:
    rows = []
    for record in _records(table, list(table)):
        comm_id = record["comm_id"]
        rows.append(
            TpOverhead(
                comm_id=comm_id,
                name=matched.names.get(comm_id),
                ranks=list(matched.members[comm_id]),
                time_base="steps" if record["stepped"] else "window",
                **{k: record[k] for k in _TP_FIELDS if k in record},
            )
        )
    return rows
