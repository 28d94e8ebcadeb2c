"""Kineto (PyTorch profiler) JSON traces to digests.

One trace is one rank; ``kineto_events`` reads its events into columns (times as int64 epoch
ns). What is made of them, and why (reference/nccl-in-traces.md §4, §6):

- NCCL collectives: the ``c10d::<op>`` CPU op (with its ``record_param_comms`` args:
  ``Collective name``, sizes, ``Process Group Name``/``ID``, ``Seq``) is the identity; its GPU
  kernels (joined by CUDA correlation to the launch on the same thread, else by ``External
  id``) give arrival (first kernel start) and end. Kernel names only classify.
- gloo collectives: ``c10d::<op>`` on the calling thread enqueues; ``gloo:<op>`` on a gloo
  worker thread is the real work (arrival = worker start). Worker events carry no PG or seq,
  so each is paired with its enqueue by op and order, and by group where several groups run
  one op: each group has worker threads of its own (``gloo_pairing``). A call gloo runs as
  one worker op per group member (a list-form reduce_scatter) takes that many, in order.
- communicator = process-group name (the same on every member); instance = ``Seq`` when
  traced, else the rank's torch hook's per-PG sequence base plus order, else the order
  within the PG in the window ("ordinal").

Reading: the events are numpy columns and every subset an array of row positions; the
tests of names (prefixes, op, NCCL kernel, step number) run once per distinct name.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa

from rankscope.analysis import digest, groups, intervals, ops
from rankscope.analysis.gloo_pairing import countable, gloo_runs_as, pair_in_order, whole_calls, worker_ops
from rankscope.analysis.kineto_events import (
    C10D, DEVICE_CATS, GLOO, HOOK_KEY, I64_MAX, I64_MIN, LAUNCH_CATS, NCCL, RPC, Args, Events, Trace, canonical,
    equal_any, instants, as_int64, load, present, without_repeats,
)
from rankscope.errors import ExportError, quoted

_log = logging.getLogger(__name__)

SOURCE_FORMAT = "kineto-json"

_STEP = re.compile(rf"^ProfilerStep#(\d{{1,{digest.STEP_DIGITS}}})$")
_RANKS = pa.list_(pa.int32())
# Ops whose input and output differ in size. A digest's bytes are the per-rank size NCCL's
# API takes, as nsys's payload gives it: the smaller buffer (AllGather's and Gather's
# sendcount, ReduceScatter's and Scatter's recvcount; nccl-in-traces.md), whichever a source
# shows. (A Scatter's root's input is every member's chunk; the others have no input.)
_SPLIT_OPS = (ops.ALLGATHER, ops.REDUCESCATTER, ops.GATHER, ops.SCATTER)

# Bytes per element for record_param_comms `dtype` (torch ScalarType names) and `Input type`
# (C++ type names, as torch 2.13 spells them: 'c10::BFloat16', 'long int', 'short unsigned
# int', ...) spellings, lowercased.
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "long": 8, "long int": 8, "int64": 8, "uint64": 8, "long unsigned int": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "c10::half": 2, "c10::bfloat16": 2,
    "short": 2, "short int": 2, "int16": 2, "uint16": 2, "short unsigned int": 2,
    "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1, "unsigned char": 1, "signed char": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::float8_e4m3fnuz": 1, "c10::float8_e5m2fnuz": 1,
    "complexhalf": 4, "complexfloat": 8, "complexdouble": 16,
    "c10::complex<c10::half>": 4, "c10::complex<float>": 8, "c10::complex<double>": 16,
}


def read_kineto(path: str | Path, *, rank_from: str | None = None) -> pa.Table:
    """One digest row for one Kineto trace (plain or gzipped JSON).

    ``rank_from``: None takes the rank from ``distributedInfo`` (or the rankscope hook's
    metadata), falling back to the file name with a warning; ``filename[:REGEX]`` takes it
    from the file name.
    """
    path = Path(path)
    notes: list[str] = []
    trace = without_repeats(load(path), notes)
    if trace.untimed:  # a damaged trace: its steps, kernels or calls go missing
        notes.append(f"{trace.untimed} complete (ph X) event(s) without a ts: left out")
    if trace.undated:
        notes.append(f"{trace.undated} complete (ph X) event(s) without a dur: taken as instants (dur 0)")
    instants(trace.events, notes)
    _check_times(path, trace.events, based="baseTimeNanoseconds" in trace.top)
    meta = _meta(path, trace, rank_from, notes)
    events = trace.events
    steps = _steps(events)
    if events.of_cat(*DEVICE_CATS).any():
        busy = _device_busy(events)
        collectives = _nccl_collectives(trace, notes)
    else:
        notes.append(
            "CPU-only trace: no device activity; busy time is the union of top-level CPU ops "
            "(compute) and gloo worker ops (communication)"
        )
        busy = _cpu_busy(events)
        collectives = _gloo_collectives(trace, notes)
    collectives = _with_context(collectives, busy, steps, meta["window_start_ns"])
    meta.update(busy.totals)
    meta["warnings"] = notes
    for note in notes:  # as nsys exports' notes: the report lists them, by rank
        _log.info("%s: %s", path, note)
    try:
        row = digest.digest_row(
            meta, collectives=_collective_columns(collectives), kernels=busy.kernels, steps=steps,
            communicators=_communicators(trace.top, collectives),
        )
    # A metadata value of the wrong type (rank: true; a pg_desc that is a list), or beyond its int32/int64 column.
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
        raise ExportError(f"malformed trace metadata ({exc})", path=path) from None
    # Arrow's allocator (mimalloc) keeps the pages freed by the conversions above; a job
    # reads one trace after another, so each read hands them back (~1 µs).
    pa.default_memory_pool().release_unused()
    return row


# Absolute ts are of captures since Kineto (2020); relative ones count from the profiler's
# start or the host's boot (~5.1e12 µs, 59 days, after the torch 2.13 samples' base): a
# time without a base before 2000 is relative.
_EARLIEST_ABSOLUTE_NS = 946_684_800 * 10**9


def _check_times(path: Path, events: Events, *, based: bool) -> None:
    """Refuse an event lasting longer than a capture can, or events lying farther apart
    (`digest.MAX_CAPTURE_NS`): a damaged dur or ts. One such kernel made its rank's top
    kernel 104 days long, or stretched its window so that its GPU read 5e-9 % busy. And
    refuse ts relative to a start the trace does not give (``based``: it has a
    ``baseTimeNanoseconds``)."""
    if not len(events.ts):
        return
    days = 86400e9
    if (longest := int(events.dur.max())) > digest.MAX_CAPTURE_NS:
        raise ExportError(f"an event lasts {longest / days:,.0f} days (its dur), where a capture lasts minutes to "
                          "hours: a damaged dur", path=path)
    if (spread := int(events.ts.max()) - int(events.ts.min())) > digest.MAX_CAPTURE_NS:
        raise ExportError(f"its events lie {spread / days:,.0f} days apart (their ts), where a capture lasts minutes "
                          "to hours: a damaged ts", path=path)
    first = int(events.ts.min())
    # Without a base, ts are absolute epoch µs (every such sample: 2022-2024); relative ones
    # (a base stripped) read as 1970, and beside a rank of the same host as "another run".
    if not based and first < _EARLIEST_ABSOLUTE_NS:
        raise ExportError(f"its events start at ts {first / 1e3:,.3f} µs, with no baseTimeNanoseconds: times "
                          "relative to a start the trace does not give, not Unix-epoch µs (its base stripped?)",
                          path=path)
    # As the nsys reader refuses a session start before 1970: a digest of such times was
    # written, then refused by `analyze` as damaged, and the trace itself analysed unsaid.
    if not 0 <= first <= digest.LATEST_START_NS:
        raise ExportError(f"its events start at {first:,} ns from 1970 (baseTimeNanoseconds + ts), outside the UTC "
                          "epoch ns a capture can have (1970 to 2262): a damaged baseTimeNanoseconds or ts", path=path)


# ---------------------------------------------------------------- identity


def _meta(path: Path, trace: Trace, rank_from: str | None, notes: list[str]) -> dict:
    top = trace.top
    info = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else None
    hook = top.get(HOOK_KEY) if isinstance(top.get(HOOK_KEY), dict) else {}
    rank, source = _rank(path, info, hook, rank_from, notes)
    world = (info or {}).get("world_size", hook.get("world_size"))
    given = top.get("host_name")
    host = next((h for h in (given, hook.get("host")) if isinstance(h, str) and h), None)
    if host is None:
        # A host_name that is no text (a list, a number: a damaged trace) is none: as text
        # ("['node0']") it was a host of its own, its rank moved out of its node's clock.
        host = f"unknown-host:{path.name}"
        said = "no host_name in trace" if given is None or isinstance(given, str) else "host_name is not text"
        notes.append(f"{said}: it is its own clock domain ({host})")
    events = trace.events
    if len(events.ts) == 0:
        raise ExportError("Kineto trace has no complete (ph X) events", path=path)
    pid = _most_common_pid(events)
    # GPU busy is a share of the device's active span, first to last kernel or copy, as the
    # nsys reader and HTA take it: CPU-only stretches of the trace (before the first launch,
    # a last step's host work) are no device time. A CPU-only trace's window is all of it.
    device = events.of_cat(*DEVICE_CATS)
    spanned = device if device.any() else slice(None)
    ts, end = events.ts[spanned], events.ts[spanned] + events.dur[spanned]
    return {
        "rank": rank,
        "rank_source": source,
        "local_rank": hook.get("local_rank"),
        "world_size": world,
        "host": str(host),
        "gpu": hook.get("gpu") or None,
        "pid": as_int64(pid) if pid is not None and str(pid).lstrip("-").isdigit() else None,
        "job_id": hook.get("job_id") or None,
        "source_format": SOURCE_FORMAT,
        "source_file": str(path),
        "producer": f"kineto schemaVersion {top.get('schemaVersion', '?')}"
        + (f", torch {hook['torch']}" if hook.get("torch") else ""),
        "window_start_ns": int(ts.min()),
        "window_end_ns": int(end.max()),
        "backend": (info or {}).get("backend"),
    }


def _most_common_pid(events: Events):
    """The pid of most CPU ops (ties: the least, as pandas' mode; None without CPU ops)."""
    count = np.bincount(events.pid[events.of_cat("cpu_op")], minlength=len(events.pids))
    if not count.any():
        return None
    # ints before texts: a trace mixing both still gets one answer
    return min((events.pids[i] for i in np.flatnonzero(count == count.max())), key=lambda p: (isinstance(p, str), p))


def _rank(path: Path, info: dict | None, hook: dict, rank_from: str | None, notes: list[str]) -> tuple[int, str]:
    """``rank_from`` as for every export (sources.py): ``filename:REGEX`` (first group, else
    the whole match, searched in the file name) or ``filename`` (``rank<N>``/``rank-<N>``).
    Without it: distributedInfo, the rankscope hook's metadata, then the file name with a
    warning; else an error naming the file."""
    if info is None:
        what = "no distributedInfo"
    elif info.get("rank") is None:
        what = "distributedInfo has no rank"
    else:  # 1.0, "3": what JSON allows, not a rank to guess from
        what = f"distributedInfo's rank {quoted(str(info['rank']))} is not a whole number"
    if rank_from is None:
        if info is not None and isinstance(info.get("rank"), int):
            return info["rank"], "distributedInfo.rank"
        if isinstance(hook.get("rank"), int):
            return hook["rank"], "rankscope hook"
    kind, _, pattern = (rank_from or "filename").partition(":")
    if kind != "filename":
        raise ExportError(f"--rank-from {rank_from}: a Kineto trace can only take its rank from "
                          "filename[:REGEX] (it records no environment)", path=path)
    pattern = pattern or r"rank[-_]?(\d+)"
    try:
        found = re.search(pattern, path.name)
    except re.error as exc:
        raise ExportError(f"bad rank_from pattern {pattern!r} ({exc})", path=path) from None
    text = (found.group(1) if found.groups() else found.group(0)) if found else ""
    if text.isdecimal():  # not isdigit: '²' is a digit, which int() refuses (a ValueError traceback)
        if int(text) > np.iinfo(np.int32).max:  # the digest's rank column: else "malformed trace metadata"
            said = f"--rank-from {rank_from}: {text}" if rank_from else f"{what}: the file name's rank {text}"
            raise ExportError(f"{said} is beyond any rank (int32)", path=path)
        if rank_from is None:
            notes.append(f"{what}: rank {text} taken from the file name")
        return int(text), "filename"
    if rank_from is None:
        raise ExportError(f"{what}: the file name gives no rank (pattern '{pattern}'); pass --rank-from "
                          "filename:REGEX or name the file rank<N>", path=path)
    raise ExportError(f"--rank-from {rank_from}: no rank number in the file name", path=path)


# ---------------------------------------------------------------- busy time


@dataclass
class _Busy:
    compute: intervals.Union
    everything: intervals.Union
    kernels: dict[str, np.ndarray]
    totals: dict


def _device_busy(events: Events) -> _Busy:
    gpu = np.flatnonzero(events.of_cat(*DEVICE_CATS))
    start = events.ts[gpu]
    end = start + events.dur[gpu]
    kernel = events.of_cat("kernel")[gpu]
    comm = events.named(events.names.comm)[gpu] & kernel
    return _busy(start, end, comm, _kernel_table(events, gpu[kernel], comm[kernel]), copy=~kernel)


def _cpu_busy(events: Events) -> _Busy:
    """CPU-only proxy: top-level CPU ops on compute threads, gloo worker ops as comm."""
    gloo = events.prefixed(GLOO) & events.of_cat("user_annotation")
    c10d = events.prefixed((C10D, RPC))
    # gloo worker threads: those of gloo ops without c10d calls (gloo:send runs on the caller);
    # per thread id (a few hundred at most), not setdiff1d/isin (~80 us on a small trace)
    worker = np.zeros(events.thread.max() + 1, bool)
    worker[events.thread[gloo]] = True
    worker[events.thread[c10d]] = False
    cpu = events.of_cat("cpu_op") & ~c10d & ~worker[events.thread]
    chosen = np.flatnonzero(cpu | gloo)
    top = chosen[_top_level(events, chosen)]
    start = events.ts[top]
    end = start + events.dur[top]
    comm = gloo[top]
    return _busy(start, end, comm, _kernel_table(events, top, comm))


def _busy(start: np.ndarray, end: np.ndarray, comm: np.ndarray, kernels: dict[str, np.ndarray],
          copy: np.ndarray | None = None) -> _Busy:
    """Busy time is the union of every interval; compute is the other kernels alone: a copy
    (``copy``: memcpy/memset rows) is busy but no compute, as the nsys reader takes it, so it
    neither hides a collective's exposed time (TP overhead counts compute kernels) nor makes
    a late arrival compute-bound. The split is of the kernels' union."""
    work = ~comm if copy is None else ~comm & ~copy
    compute = intervals.merge(start[work], end[work])
    everything = intervals.merge(start, end)
    total = int((everything.ends - everything.starts).sum())
    compute_ns = int((compute.ends - compute.starts).sum())
    comm_ns = intervals.union_length(start[comm], end[comm])
    either_ns = total if copy is None or not copy.any() else intervals.union_length(start[~copy], end[~copy])
    overlap = compute_ns + comm_ns - either_ns
    totals = {
        "gpu_busy_ns": total,
        "compute_only_ns": compute_ns - overlap,
        "comm_only_ns": comm_ns - overlap,
        "overlap_ns": overlap,
    }
    return _Busy(compute, everything, kernels, totals)


def _kernel_table(events: Events, rows: np.ndarray, is_comm: np.ndarray) -> dict[str, np.ndarray]:
    """Count and total time per (name, is_comm), largest total first (ties: first seen
    first), on the name codes: no trace-sized column of strings."""
    key = events.name[rows].astype(np.int64) * 2 + is_comm
    keys, first, group = np.unique(key, return_index=True, return_inverse=True)
    total = np.zeros(len(keys), np.int64)
    np.add.at(total, group, events.dur[rows])
    order = np.lexsort((first, -total))
    return {
        "name": events.names.text[keys[order] // 2],
        "is_comm": keys[order] % 2 == 1,
        "count": np.bincount(group, minlength=len(keys))[order],
        "total_ns": total[order],
    }


def _top_level(events: Events, rows: np.ndarray) -> np.ndarray:
    """True for events (of ``rows``) not nested inside an earlier event of the same
    thread: ordered by thread, start, then longest first, an event is top-level where it
    starts at or after the furthest end of the thread's events before it."""
    thread, start, dur = events.thread[rows], events.ts[rows], events.dur[rows]
    order = np.lexsort((-dur, start, thread))
    thread, start = thread[order], start[order]
    reach = intervals.running_max(start + dur[order], thread)
    top = np.ones(len(rows), bool)
    top[1:] = (thread[1:] != thread[:-1]) | (start[1:] >= reach[:-1])
    out = np.empty(len(rows), bool)
    out[order] = top
    return out


# ---------------------------------------------------------------- collectives

# A table is a dict of equal-length numpy columns. Nullable values are object columns
# holding None; a null time is marked in a bool column beside it (``called``).


def _take(table: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {key: column[rows] for key, column in table.items()}


def _recorded_bytes(row: list, op: str, field: dict[str, int]) -> int | None:
    """A Flight Recorder entry's size: its input's, or for the `_SPLIT_OPS` the smaller of
    its input and output that the hook recorded (a Gather's output or a Scatter's input
    only on the root)."""
    sizes = [as_int64(row[field[column]]) for column in ("bytes", "out_bytes") if column in field]
    if op in _SPLIT_OPS and any(sizes):
        return min(s for s in sizes if s)
    return sizes[0] if sizes else None


def _calls(trace: Trace, notes: list[str]) -> dict[str, np.ndarray]:
    """Host-side collective calls, by start: c10d ops, each with the row of the
    record_param_comms (``rpc``) and of the ``nccl:<op>`` annotation (``ann``) inside it,
    -1 where none, and the hook's Flight Recorder identity (``fr_pg``, ``fr_seq``,
    ``fr_bytes``; ``fr_input_bytes``: its input tensors' total) where given. ``row``: the
    call's event."""
    events = trace.events
    cpu = events.of_cat("cpu_op")
    c10d = np.flatnonzero(cpu & events.prefixed(C10D))
    rpc = np.flatnonzero(cpu & events.named(events.names.text == RPC))
    ann = np.flatnonzero(events.of_cat("user_annotation") & events.prefixed(NCCL))
    inner_of = {"rpc": np.full(len(c10d), -1), "ann": np.full(len(c10d), -1)}
    lone = rpc
    for column, inner in (("rpc", rpc), ("ann", ann)):
        if len(inner) and len(c10d):
            inside = _containing(events, inner, c10d)
            found = inside >= 0
            inner_of[column][inside[found]] = inner[found]  # several inside one call: the last
            if column == "rpc":
                lone = rpc[~found]
    # record_param_comms outside any c10d op: a call of its own, with any annotation inside it
    lone_ann = np.full(len(lone), -1)
    if len(ann) and len(lone):
        inside = _containing(events, ann, lone)
        lone_ann[inside[inside >= 0]] = ann[inside >= 0]
    rows = np.concatenate([c10d, lone])
    order = np.argsort(events.ts[rows], kind="stable")
    rows = rows[order]
    calls = {
        "row": rows,
        "op": np.concatenate([events.names.op[events.name[c10d]], np.full(len(lone), None)])[order],
        "rpc": np.concatenate([inner_of["rpc"], lone])[order],
        "ann": np.concatenate([inner_of["ann"], lone_ann])[order],
        "ts": events.ts[rows],
        "end": events.ts[rows] + events.dur[rows],
        "thread": events.thread[rows],
        "fr_pg": np.full(len(rows), None),
        "fr_seq": np.full(len(rows), None),
        "fr_bytes": np.full(len(rows), None),
        "fr_input_bytes": np.full(len(rows), None),
        "dropped": np.zeros(len(rows), bool),
    }
    own = trace.args(calls["rpc"].tolist())
    identified = np.array([_pg(a) is not None and as_int64(a.seq) is not None for a in own], bool)
    return _with_flight_recorder(calls, identified, trace.top, notes)


def _with_flight_recorder(calls: dict[str, np.ndarray], identified: np.ndarray, top: dict,
                          notes: list[str]) -> dict[str, np.ndarray]:
    """Join the hook's Flight Recorder entries to the calls (`_entry_calls`). Calls of
    recorded ops left without one are marked ``dropped``, unless their record_param_comms
    names their group and Seq (``identified``): those need no entry. The hook's
    ``evicted_before_ns`` says the ring lost the window's entries before then: calls before
    it lack theirs for that reason."""
    recorder = (top.get(HOOK_KEY) or {}).get("flight_recorder") if isinstance(top.get(HOOK_KEY), dict) else None
    if not recorder or not recorder.get("rows") or not len(calls["row"]):
        return calls
    field = {name: i for i, name in enumerate(recorder["columns"])}
    entries = [(row, op) for row in recorder["rows"] if (op := canonical(row[field["profiling_name"]])) is not None]
    created = np.array([int(row[field["time_created_ns"]]) for row, _ in entries], np.int64)
    by_time = np.argsort(created, kind="stable")
    entries, created = [entries[i] for i in by_time], created[by_time]
    known = np.flatnonzero(present(calls["op"]))
    entry_ops = np.array([op for _, op in entries], object)
    entry_pg = np.array([str(row[field["pg_name"]]) for row, _ in entries], object)
    recorded = set(entry_ops.tolist())
    call_ops = calls["op"][known].copy()
    for call_op, worker_op in gloo_runs_as(recorded).items():  # the recorder names the worker's op
        call_ops[call_ops == call_op] = worker_op
    _, op_code = np.unique(np.concatenate([call_ops, entry_ops]), return_inverse=True)
    call, doubtful, stand_in = _entry_calls(calls, known, op_code[: len(known)], op_code[len(known) :], created,
                                               np.unique(entry_pg.astype(str), return_inverse=True)[1])
    labels, first = np.unique(call[call >= 0], return_index=True)
    taken = np.flatnonzero(call >= 0)[first]
    calls["fr_pg"][labels] = entry_pg[taken]
    calls["fr_seq"][labels] = [int(entries[i][0][field["seq"]]) for i in taken]
    calls["fr_bytes"][labels] = _ints([_recorded_bytes(*entries[i], field) for i in taken])
    if "bytes" in field:
        calls["fr_input_bytes"][labels] = _ints([entries[i][0][field["bytes"]] for i in taken])
    # A call in doubt keeps a group, not a seq: unnamed, gloo's per-group pairing would give
    # its worker op to the group's next call. Any of its entries' groups will do (`_entry_calls`).
    named = stand_in >= 0
    calls["fr_pg"][doubtful[named]] = entry_pg[stand_in[named]]
    keep = ~present(calls["op"])
    keep[labels] = True
    # Ops the recorder records none of (torch 2.13 gloo: send and recv) are no window's edge: kept, unjoined.
    keep[known[~equal_any(call_ops, sorted(recorded))]] = True
    keep |= identified
    in_doubt = np.zeros(len(keep), bool)
    in_doubt[doubtful] = ~keep[doubtful]
    if in_doubt.any():
        notes.append(f"{int(in_doubt.sum())} collective call(s) ran alongside calls of the same op on other threads "
                     "when their Flight Recorder entries were made, and which entry is whose cannot be told "
                     "(entries name no thread): not matched")
    evicted_before = as_int64(recorder.get("evicted_before_ns"))
    evicted = ~keep & ~in_doubt & (calls["ts"] < (-I64_MAX if evicted_before is None else evicted_before))
    if evicted.any():
        notes.append(f"{int(evicted.sum())} collective call(s) have no Flight Recorder entry: the ring "
                     "(TORCH_FR_BUFFER_SIZE) was too short for the window and dropped their entries: not matched")
    edges = int((~keep & ~evicted & ~in_doubt).sum())
    if edges:
        notes.append(f"{edges} collective call(s) at the window's edges have no Flight Recorder entry: not matched")
    calls["dropped"] = ~keep  # paired still, so that their ops do not shift onto the next calls
    return calls


def _entry_calls(calls: dict[str, np.ndarray], known: np.ndarray, call_op: np.ndarray, entry_op: np.ndarray,
                 created: np.ndarray, entry_pg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each entry's call (position in ``calls``, -1: none told), and the calls in doubt with,
    each, a stand-in entry (position; -1: none). An entry is made inside its call, on its
    thread, on the same clock (checked on torch 2.13 gloo: 10-90 µs after the call starts,
    before it ends), but names no thread: its candidates are the
    call of its op running on each thread then (``known`` calls; their ops' and the
    entries' codes, the entries by creation). One candidate: its call; a call keeps its
    earliest such entry. Where calls of one op overlap on several threads (collectives of
    two groups from two threads, torch 2.13 gloo: 4 of 60 entries), the latest call to
    start took the other thread's entry: there a candidate is ruled out if a sure entry has
    its call, or if its thread's sure entries name only other groups (a thread serving one
    group); an entry left with one candidate, not another's too, gets it. The calls in doubt
    are the untold entries' candidates left without one; where each op has as many as it
    has untold entries, the k-th call stands in for the k-th entry's group. Those calls all
    ran when those entries were made, so their worker ops started after any of them."""
    thread_ids, thread = np.unique(calls["thread"][known], return_inverse=True)
    threads = len(thread_ids)
    line = call_op * threads + thread  # calls of one thread do not overlap: one per line runs at a time
    by_line = np.lexsort((calls["ts"][known], line))
    entry = np.repeat(np.arange(len(created)), threads)
    entry_thread = np.tile(np.arange(threads), len(created))
    at = intervals.last_at_or_before(line[by_line], calls["ts"][known][by_line],
                                     entry_op[entry] * threads + entry_thread, created[entry])
    candidate = np.where(at >= 0, known[by_line[np.maximum(at, 0)]], -1)
    inside = (candidate >= 0) & (created[entry] <= calls["end"][np.maximum(candidate, 0)])
    entry, entry_thread, candidate = entry[inside], entry_thread[inside], candidate[inside]
    sure = np.bincount(entry, minlength=len(created))[entry] == 1
    serves = entry_thread * (int(entry_pg.max(initial=0)) + 1) + entry_pg[entry]  # (thread, group), one int
    served = np.unique(serves[sure])
    unknown = np.bincount(entry_thread[sure], minlength=threads) == 0
    open_ = ~sure & ~groups.in_sorted(candidate, np.unique(candidate[sure]))
    open_ &= groups.in_sorted(serves, served) | unknown[entry_thread]
    told = sure | (open_ & (np.bincount(entry[open_], minlength=len(created))[entry] == 1))
    told[~sure] &= np.bincount(candidate[told & ~sure], minlength=len(calls["row"]))[candidate[~sure]] == 1
    call = np.full(len(created), -1)
    call[entry[told]] = candidate[told]
    untold = ~groups.in_sorted(entry, np.unique(entry[told]))
    doubt = untold & (np.bincount(candidate[told], minlength=len(calls["row"]))[candidate] == 0)
    doubtful, pair = np.unique(candidate[doubt], return_index=True)  # calls by start
    waiting = np.unique(entry[doubt])  # by creation
    doubtful_op, waiting_op = entry_op[entry[doubt][pair]], entry_op[waiting]
    stand_in = np.full(len(doubtful), -1)
    if np.array_equal(np.sort(doubtful_op), np.sort(waiting_op)):  # by op, then start and creation: k-th with k-th
        stand_in[np.lexsort((doubtful, doubtful_op))] = waiting[np.lexsort((waiting, waiting_op))]
    return call, doubtful, stand_in


def _containing(events: Events, inner: np.ndarray, outer: np.ndarray) -> np.ndarray:
    """For each inner event (rows): the position in ``outer`` (rows) of the latest event
    on the same thread that starts at or before it and has not ended (-1 where none)."""
    if not len(outer):
        return np.full(len(inner), -1)
    outer_thread, start = events.thread[outer], events.ts[outer]
    ts = events.ts[inner]
    order = np.lexsort((start, outer_thread))  # by thread, then start; ties keep their order
    at = intervals.last_at_or_before(outer_thread[order], start[order], events.thread[inner], ts)
    pos = order[np.maximum(at, 0)]
    end = start[pos] + events.dur[outer][pos]
    return np.where((at >= 0) & (ts <= end), pos, -1)


def _nccl_collectives(trace: Trace, notes: list[str]) -> dict[str, np.ndarray] | None:
    events = trace.events
    kernels = np.flatnonzero(events.of_cat("kernel") & events.named(events.names.comm))
    if not len(kernels):
        return None
    calls = _calls(trace, notes)
    call = _kernel_calls(events, kernels, calls)
    orphan = call < 0
    if orphan.any():
        # Launched before the trace began: NCCL time in the window all the same, and the
        # first instance of its group on the rank (as nsys keeps a kernel outside any NCCL
        # range), so each is a call of its own, known by the kernel alone.
        count = int(orphan.sum())
        notes.append(f"{count} NCCL kernel(s) with no host-side collective call in the trace (launched before it "
                     "began?): op, group and size from the kernel alone")
        call[orphan] = len(calls["row"]) + np.arange(count)
        start, stop = events.ts[kernels[orphan]], events.ts[kernels[orphan]] + events.dur[kernels[orphan]]
        extra = {"row": -1, "op": None, "rpc": -1, "ann": -1, "ts": start, "end": stop, "thread": -1, "fr_pg": None,
                 "fr_seq": None, "fr_bytes": None, "fr_input_bytes": None, "dropped": False}
        calls = {key: np.concatenate([column, np.broadcast_to(np.asarray(extra[key], column.dtype), count)])
                 for key, column in calls.items()}
    kept = ~calls["dropped"][call]
    # Per call: its first kernel (by start; ties in trace order) gives arrival, the last end its end.
    call, kernels = call[kept], kernels[kept]
    start = events.ts[kernels]
    end = start + events.dur[kernels]
    order = np.lexsort((start, call))
    calls_of, first = np.unique(call[order], return_index=True)
    chosen = _take(calls, calls_of)
    rpc = chosen["rpc"]
    frame = {
        "start_ns": start[order][first],
        "end_ns": np.maximum.reduceat(end[order], first) if len(first) else end[:0],
        "cpu_call_ns": chosen["ts"],
        "called": chosen["row"] >= 0,
    }
    # Identity args: record_param_comms where present, else the first kernel's copy.
    kernel_args = trace.args(kernels[order][first].tolist())
    kernel = _arg_columns(kernel_args)
    rpc_args, host_args, ann_args = (trace.args(chosen[key].tolist()) for key in ("rpc", "row", "ann"))
    own = _arg_columns(rpc_args)
    own = {key: np.where(rpc >= 0, own[key], kernel[key]) for key in own}
    host = _arg_columns(host_args)
    annotation = _arg_columns(ann_args)
    # Older traces' record_param_comms may name no collective: the nccl:<op> annotation inside it does.
    ann = chosen["ann"]
    ann_op = np.full(len(ann), None, object)
    if (ann >= 0).any():  # each distinct annotation name's op once, then taken per call
        used, which = np.unique(events.name[ann[ann >= 0]], return_inverse=True)
        ann_op[ann >= 0] = np.array([canonical(n) for n in events.names.text[used].tolist()], object)[which]
    frame["op"] = _coalesce(own["op"], chosen["op"], kernel["op"], ann_op)
    hinted = ~frame["called"] & ~present(frame["op"])
    if hinted.any():  # no call, no collective args (a window's first few kernels): the name's hint, as nsys takes it
        names = events.names.text[events.name[kernels[order][first][hinted]]]
        frame["op"][hinted] = [ops.from_kernel_name(name) for name in names.tolist()]
    unnamed = int((~present(frame["op"])).sum())
    if unnamed:
        notes.append(f"{unnamed} NCCL call(s) name no operation (no Collective name, no nccl: annotation): not matched")
    frame["bytes"] = _counted(frame["op"], _coalesce(own["bytes"], annotation["bytes"], host["bytes"], chosen["fr_bytes"]),
                              (kernel_args, rpc_args, host_args, ann_args), chosen["fr_bytes"])
    frame["pg"] = _coalesce(own["pg"], kernel["pg"], chosen["fr_pg"])
    frame["seq_trace"] = _coalesce(own["seq"], kernel["seq"], chosen["fr_seq"])
    frame["stream"] = np.array(["?" if k.stream is None else str(k.stream) for k in kernel_args], object)
    return _identify(_take(frame, present(frame["op"])), trace.top, notes, fallback="stream")


def _kernel_calls(events: Events, kernels: np.ndarray, calls: dict[str, np.ndarray]) -> np.ndarray:
    """Position in ``calls`` of each kernel's (rows) host call (-1: none): via the CUDA
    launch that has the kernel's correlation id (its first such launch, enclosed by the
    call on its thread), else by External id (a call's own, else its record_param_comms')."""
    result = np.full(len(kernels), -1)
    launch_rows = np.flatnonzero(events.of_cat(*LAUNCH_CATS) & (events.corr >= 0))
    launch_corr, first = np.unique(events.corr[launch_rows], return_index=True)
    at, has = _lookup(launch_corr, events.corr[kernels])
    if has.any():
        result[has] = _containing(events, launch_rows[first[at[has]]], calls["row"])
    missing = result < 0
    if missing.any():
        rpc = calls["rpc"]
        keys = np.concatenate([events.ext[calls["row"]], np.where(rpc >= 0, events.ext[rpc], -1)])
        positions = np.tile(np.arange(len(rpc)), 2)[keys >= 0]
        known, first = np.unique(keys[keys >= 0], return_index=True)  # first: a call's own id wins
        at, has = _lookup(known, events.ext[kernels])
        found = missing & has
        result[found] = positions[first[at[found]]]
    return result


def _lookup(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each value in sorted unique ``keys``, and whether it is there (ids < 0: absent)."""
    if not len(keys):
        return np.zeros(len(values), np.intp), np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return at, (values >= 0) & (keys[at] == values)


def _gloo_collectives(trace: Trace, notes: list[str]) -> dict[str, np.ndarray] | None:
    events = trace.events
    work = np.flatnonzero(events.of_cat("user_annotation") & events.prefixed(GLOO))
    if not len(work):
        return None
    work = work[present(events.names.op[events.name[work]])]
    calls = _calls(trace, notes)
    calls = _take(calls, present(calls["op"]))
    call_pg = _coalesce(np.array([_pg(a) for a in trace.args(calls["row"].tolist())], object), calls["fr_pg"])
    configs = _pg_config(trace.top)
    calls["worker_ops"] = worker_ops(events, work, calls, call_pg, configs)
    counted_work, counted = countable(events, work, calls, bool(configs), notes)
    work, calls, call_pg = work[counted_work], _take(calls, counted), call_pg[counted]
    work_args = trace.args(work.tolist())
    work_bytes = _total_bytes(work_args)
    work_size, call_size = _pairing_sizes(trace, work_args, work_bytes, calls)
    paired, call = pair_in_order(events, work, work_size, calls, call_size, call_pg, notes)
    kept = (call < 0) | ~groups.take_or(calls["dropped"], call, False)
    paired, call, end = whole_calls(events, work, paired[kept], call[kept], calls["worker_ops"], notes)
    rows = work[paired]
    paired_call = {key: groups.take_or(calls[key], call, None) for key in ("fr_pg", "fr_seq", "fr_bytes")}
    host_args, own_args = trace.args(groups.take_or(calls["row"], call, -1).tolist()), trace.args(rows.tolist())
    host = _arg_columns(host_args)
    op = np.where(call >= 0, groups.take_or(calls["op"], call, None), events.names.op[events.name[rows]])  # the call's
    frame = {
        "start_ns": events.ts[rows],
        "end_ns": end,
        "cpu_call_ns": groups.take_or(calls["ts"], call, 0),
        "called": call >= 0,
        "op": op,
        # gloo's barrier sends no data (a zero-size buffer); the 1-byte tensor its c10d::barrier call
        # shows (Input Dims [[1]], unsigned char) is what torch's ProcessGroup::barrier dispatches on.
        "bytes": np.where(op == ops.BARRIER, 0, _counted(
            op, _coalesce(paired_call["fr_bytes"], work_bytes[paired], host["bytes"]), (own_args, host_args),
            paired_call["fr_bytes"])),
        "pg": _coalesce(host["pg"], paired_call["fr_pg"]),
        "seq_trace": _coalesce(host["seq"], paired_call["fr_seq"]),
        "stream": np.full(len(rows), "", object),
        "peer": _peers(events, groups.take_or(calls["row"], call, -1), host_args),
        "placeholder": np.zeros(len(rows), bool),
    }
    # Where every worker op has its call, calls are numbered as the program made them, and
    # those left without their worker ops keep their places; else by arrival, which they have none of.
    if (call >= 0).all():
        unpaired = _take(calls, np.setdiff1d(np.arange(len(calls["ts"])), call))
        frame = {key: np.concatenate([column, _placeholders(trace, unpaired)[key]]) for key, column in frame.items()}
    frame = _identify(frame, trace.top, notes, fallback="op")
    return _take(frame, ~frame.pop("placeholder")) if frame is not None else None


def _placeholders(trace: Trace, calls: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows for the calls left without their worker ops (in doubt, or cut by the window's
    end): numbered with the others, then left out, so that a call lost on one rank does not
    move every later one of its group up a place there (plain traces of an async job: 11 of
    16 instances met calls of other sizes)."""
    host = _arg_columns(trace.args(calls["row"].tolist()))
    count, none = len(calls["ts"]), np.full(len(calls["ts"]), None, object)
    return {"start_ns": calls["ts"], "end_ns": calls["ts"], "cpu_call_ns": calls["ts"], "called": np.ones(count, bool),
            "op": calls["op"], "bytes": none, "pg": _coalesce(host["pg"], calls["fr_pg"]),
            "seq_trace": _coalesce(host["seq"], calls["fr_seq"]), "stream": np.full(count, "", object), "peer": none,
            "placeholder": np.ones(count, bool)}


# c10d's point-to-point ops and where their schemas put the peer, a rank within the process
# group (torch 2.13: send(Tensor[] tensors, ProcessGroup process_group, int dstRank, int tag),
# recv_(..., int srcRank, int tag)); recv_any_source_ names none.
_PEER_ARG = {"c10d::send": 2, "c10d::recv_": 2}


def _peers(events: Events, rows: np.ndarray, args: list[Args]) -> np.ndarray:
    """Each call's (rows; -1: none) peer from its ``Concrete Inputs`` (record_shapes), where
    it is a point-to-point op that names one; else None."""
    peer = np.full(len(rows), None, object)
    names = events.names.text[events.name[rows]]
    for i in np.flatnonzero((rows >= 0) & np.isin(names, list(_PEER_ARG))).tolist():
        if not args[i].concrete:
            continue
        try:
            values = msgspec.json.decode(args[i].concrete)
        except msgspec.DecodeError:
            continue
        at = _PEER_ARG[names[i]]
        if isinstance(values, list) and len(values) > at and isinstance(values[at], str) and values[at].isdigit():
            peer[i] = as_int64(values[at])
    return peer


def _pairing_sizes(trace: Trace, work_args: list[Args], work_bytes: np.ndarray,
                   calls: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The sizes that tell a line's worker ops and calls apart (`gloo_pairing._by_size`):
    bytes, the calls' from their Flight Recorder entries, where any has one; else element
    counts, where the profiler recorded shapes: a c10d call lists its tensors as a TensorList
    with no dtype (torch 2.13), its worker op each tensor. (Plain traces of three async
    all_reduces of three sizes a step: 8 to 10 worker ops a rank were left in doubt, paired
    by op alone.)"""
    if present(calls["fr_input_bytes"]).any():
        return work_bytes, calls["fr_input_bytes"]
    call_args = trace.args(calls["row"].tolist())
    return _ints([_elements(a, listed=False) for a in work_args]), _ints([_elements(a, listed=True) for a in call_args])


def _elements(args: Args, *, listed: bool) -> int | None:
    """Elements of the tensors in `Input Dims`: of every input (``listed`` False: a gloo worker
    op's), or of the first input's list (a c10d call's TensorList); None where none shows."""
    dims = _input_dims(args)
    shapes = (dims[0] if dims else None) if listed else dims
    if not isinstance(shapes, list):
        return None
    return sum(count for shape in shapes if (count := _elements_of(shape))) or None


def _input_dims(args: Args) -> list | None:
    """`Input Dims`, decoded: a shape (list of ints) per input, a list of them for a TensorList."""
    dims = msgspec.json.decode(args.dims) if args.dims else None
    return dims if isinstance(dims, list) else None


def _elements_of(shape: Any) -> int | None:
    """A shape's element count, where it is a (non-empty) list of ints."""
    if isinstance(shape, list) and shape and all(type(d) is int for d in shape):
        return math.prod(shape)  # exact; np.prod costs ~4 us a call
    return None


def _identify(frame: dict[str, np.ndarray], top: dict, notes: list[str], fallback: str) -> dict[str, np.ndarray] | None:
    """comm_id and seq for each instance (see module docstring); rows in call order."""
    if not len(frame["op"]):
        return None
    frame = _take(frame, np.argsort(_call_or_start(frame), kind="stable"))
    op, pg = frame["op"], frame["pg"].copy()
    configs = _pg_config(top)
    missing = ~present(pg)
    p2p = equal_any(op, list(ops.P2P_OPS))
    if missing.any():
        if len(configs) == 1:
            pg[missing] = next(iter(configs))
        else:
            # Sends and recvs share one key: a send must be able to meet its recv.
            key = np.where(p2p, "p2p", frame[fallback])
            pg[missing] = [f"{digest.UNRESOLVED_PG}{k}" + ("" if fallback == "op" or is_p2p else f":{o}")
                           for k, o, is_p2p in zip(key[missing], op[missing], p2p[missing])]
            if "peer" in frame:  # a rank within a group not known: its global rank is not known either
                frame["peer"] = np.where(missing, None, frame["peer"])
            notes.append(
                f"{int(missing.sum())} collective(s) carry no process group and the trace lists "
                f"{len(configs) or 'no'} group(s): grouped by {'op' if fallback == 'op' else fallback + ' and op'}, "
                "ordered within the group"
                # gloo's calls name no group: where ranks use several, calls of different groups pair up
                + ("; where the ranks call several groups, calls of different groups are paired (the rankscope "
                   "torch hook's Flight Recorder names each call's group)" if fallback == "op" else "")
            )
    frame["comm_id"] = np.where(p2p, pg + "/p2p", pg)
    comm = groups.factorize(frame["comm_id"])[0]  # hashed, not sorted
    # Numbered as the program made the calls where every call of the group is in the trace;
    # else by arrival: the host runs ahead of the device, so a kernel queued before the trace
    # began (no call to time it by) starts after the calls that came next (matching follows
    # these numbers).
    per_comm = groups.Groups(comm)
    traced_calls = per_comm.all(frame["called"])[per_comm.id]
    ordinal = groups.Groups(comm, within=np.where(traced_calls, frame["cpu_call_ns"], frame["start_ns"])).cumcount() + 1
    traced = present(frame["seq_trace"])
    frame["seq"] = np.where(traced, frame["seq_trace"], ordinal).astype(np.int64)
    frame["seq_source"] = np.where(traced, "trace", "ordinal")
    if (~traced).any():
        notes.append("no collective sequence numbers in trace: instances are numbered by order within "
                     "each process group inside the capture window")
    return frame


def _call_or_start(frame: dict[str, np.ndarray]) -> np.ndarray:
    """The host call's time where known, else the arrival."""
    return np.where(frame["called"], frame["cpu_call_ns"], frame["start_ns"])


def _with_context(frame: dict | None, busy: _Busy, steps: dict[str, np.ndarray], first: int) -> dict | None:
    """compute_before / idle_before / compute_overlap and the step of each collective."""
    if frame is None:
        return None
    frame = _take(frame, np.argsort(frame["start_ns"], kind="stable"))
    start, end = frame["start_ns"], frame["end_ns"]
    gap_start, gap_end = intervals.gaps_before(start, end, first)
    frame["compute_before_ns"] = intervals.overlap(busy.compute, gap_start, gap_end)
    frame["idle_before_ns"] = (gap_end - gap_start) - intervals.overlap(busy.everything, gap_start, gap_end)
    frame["compute_overlap_ns"] = intervals.overlap(busy.compute, start, end)
    frame["step"] = _step_of(_call_or_start(frame), steps)
    return frame


def _collective_columns(frame: dict | None) -> dict[str, np.ndarray | pa.Array] | None:
    """The digest's collectives columns, nullable integers as Arrow arrays with their nulls."""
    if frame is None:
        return None
    columns = {key: frame[key] for key in ("comm_id", "seq", "seq_source", "op", "start_ns", "end_ns",
                                            "compute_before_ns", "idle_before_ns", "compute_overlap_ns")}
    columns["bytes"] = pa.array(frame["bytes"], pa.int64())
    if "peer" in frame:
        columns["peer"] = pa.array(frame["peer"], pa.int32())
    columns["cpu_call_ns"] = pa.array(frame["cpu_call_ns"], pa.int64(), mask=~frame["called"])
    columns["step"] = pa.array(frame["step"], pa.int64(), mask=frame["step"] < 0)
    return columns


def _steps(events: Events) -> dict[str, np.ndarray]:
    """ProfilerStep#N ranges by start; a step seen twice keeps its first."""
    number = np.array([int(m.group(1)) if (m := _STEP.match(n)) else -1 for n in events.names.text], np.int64)
    rows = np.flatnonzero(number[events.name] >= 0)
    rows = rows[np.argsort(events.ts[rows], kind="stable")]
    step = number[events.name[rows]]
    rows = rows[np.sort(np.unique(step, return_index=True)[1])]
    start = events.ts[rows]
    return {"step": number[events.name[rows]], "start_ns": start, "end_ns": start + events.dur[rows]}


def _step_of(times: np.ndarray, steps: dict[str, np.ndarray]) -> np.ndarray:
    """Step of each time (-1: in none)."""
    if not len(steps["step"]) or not len(times):
        return np.full(len(times), -1, np.int64)
    j = np.searchsorted(steps["start_ns"], times, side="right") - 1
    jj = np.clip(j, 0, None)
    inside = (j >= 0) & (times < steps["end_ns"][jj])
    return np.where(inside, steps["step"][jj], -1)


def _communicators(top: dict, collectives: dict | None) -> dict[str, list | pa.Array] | None:
    if collectives is None:
        return None  # none: empty columns would be typed null, then cast
    configs = _pg_config(top)
    rows = {"comm_id": [], "ranks": [], "name": [], "size": []}
    for comm in dict.fromkeys(collectives["comm_id"].tolist()):
        name = comm.removesuffix("/p2p")
        config = configs.get(name, {})
        ranks = config.get("ranks")
        # Without the member list, pg_size lets matching check the members it infers.
        size = config.get("pg_size") if ranks is None and type(config.get("pg_size")) is int else None
        for key, value in zip(rows, (comm, ranks, config.get("pg_desc") or name, size)):
            rows[key].append(value)
    # in the digest's types: no cast
    return {**rows, "ranks": pa.array(rows["ranks"], _RANKS), "size": pa.array(rows["size"], pa.int32())}


def _pg_config(top: dict) -> dict[str, dict]:
    info = top.get("distributedInfo") or {}
    return {str(g.get("pg_name")): g for g in info.get("pg_config") or [] if isinstance(g, dict)}


def _pg(args: Args) -> str | None:
    for value in (args.pg_name, args.pg_id):
        if value is not None and value != "":
            return str(value)
    return None


def _arg_columns(args: list[Args]) -> dict[str, np.ndarray]:
    """The identity args of events as object columns (None where absent): op, bytes, pg, seq."""
    return {
        "op": np.array([canonical(a.collective) for a in args], dtype=object),
        "bytes": _sizes(args),
        "pg": np.array([_pg(a) for a in args], dtype=object),
        "seq": _ints([a.seq for a in args]),
    }


def _coalesce(*columns: np.ndarray) -> np.ndarray:
    """Per row, the first non-null value of the columns (object arrays of one length)."""
    out = columns[0]
    for column in columns[1:]:
        out = np.where(present(out), out, column)
    return out


def _ints(values: list) -> np.ndarray:
    """Integer args (ints or their text) as an object array; anything else, or beyond int64, is None."""
    return np.array([v if type(v) is int and I64_MIN <= v <= I64_MAX else as_int64(v) for v in values], dtype=object)


def _element_size(dtype) -> int:
    return _element_size_of(dtype) if isinstance(dtype, str) else 0  # the cache hashes its argument


@functools.lru_cache(maxsize=256)
def _element_size_of(dtype: str) -> int:
    return _DTYPE_BYTES.get(dtype.lower(), 0)


def _sizes(args: list[Args]) -> np.ndarray:
    """Message size: record_param_comms `In msg nelems` x dtype, else the first input's
    `Input Dims` x `Input type` (per rank, as sent)."""
    return _ints([n * size if (n := as_int64(a.nelems)) is not None and (size := _element_size(a.dtype))
                  else next(_tensor_bytes(a), None) for a in args])


def _total_bytes(args: list[Args]) -> np.ndarray:
    """Bytes of all the tensors in `Input Dims` x `Input type`: a gloo worker op lists every
    tensor it moves as an input (a coalesced allreduce's each, an all_to_all's send list)."""
    return _ints([sum(_tensor_bytes(a)) or None for a in args])


def _counted(op: np.ndarray, sizes: np.ndarray, sources: tuple[list[Args], ...], recorded: np.ndarray) -> np.ndarray:
    """``sizes``, but for the `_SPLIT_OPS` the smaller of input and output:
    record_param_comms' In and Out msg nelems where a source has both (totals, so coalesced
    calls count every tensor), else the smallest buffer any source shows: a c10d call's
    tensors (output and input), a ``nccl:`` annotation's (its input: n x recvcount for
    ReduceScatter), the Flight Recorder's (``recorded``, already the smaller). One pass
    over those calls only, not over events."""
    split = np.flatnonzero(equal_any(op, list(_SPLIT_OPS)))
    if not len(split):
        return sizes
    sizes = sizes.copy()
    for i in split.tolist():
        counted = next((b for args in sources if (b := _nelems_bytes(args[i])) is not None), None)
        shown = [b for args in sources for b in _tensor_bytes(args[i]) if b]
        if recorded[i] is not None:
            shown.append(recorded[i])
        if counted is not None or shown:
            sizes[i] = as_int64(counted if counted is not None else min(shown))
    return sizes


def _nelems_bytes(args: Args) -> int | None:
    """The smaller of record_param_comms' In and Out msg nelems, in bytes, where it has both."""
    size, counts = _element_size(args.dtype), (as_int64(args.nelems), as_int64(args.out_nelems))
    return min(counts) * size if size and None not in counts and min(counts) > 0 else None


def _tensor_bytes(args: Args) -> Iterator[int]:
    """Bytes of each tensor in `Input Dims` x `Input type`, in order (a TensorList: its first tensor)."""
    dims = _input_dims(args)
    types = msgspec.json.decode(args.types) if args.types else None
    if dims is None or not isinstance(types, list):
        return
    for shape, kind in zip(dims, types):
        while isinstance(shape, list) and shape and isinstance(shape[0], list):
            shape = shape[0]
        size, count = _element_size(kind), _elements_of(shape)
        if size and count is not None:
            yield count * size
