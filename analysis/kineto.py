"""Kineto (PyTorch profiler) JSON traces to digests.

One trace is one rank. What is read, and why (reference/nccl-in-traces.md §4, §6):

- Timestamps: ``ts``/``dur`` are µs with up to three decimals, either absolute Unix-epoch µs
  or relative to ``baseTimeNanoseconds``. Absolute µs exceed float64's ns precision, so the
  digits are parsed as text into int64 ns, never through float.
- NCCL collectives: the ``c10d::<op>`` CPU op (with its ``record_param_comms`` args:
  ``Collective name``, sizes, ``Process Group Name``/``ID``, ``Seq``) is the identity; its GPU
  kernels (joined by CUDA correlation to the launch on the same thread, else by ``External
  id``) give arrival (first kernel start) and end. Kernel names only classify.
- gloo collectives: ``c10d::<op>`` on the calling thread enqueues; ``gloo:<op>`` on a gloo
  worker thread is the real work (arrival = worker start). Worker events carry no PG or seq,
  so each is paired with its enqueue by op and order.
- communicator = process-group name (the same on every member); instance = ``Seq`` when
  traced, else the rank's torch hook's per-PG sequence base plus order, else the order
  within the PG in the window ("ordinal").

Parsing: msgspec splits ``traceEvents`` into one undecoded text per event, then decodes them
a chunk at a time into structs holding only the fields read (``ts``/``dur`` kept as their
decimal text, converted to ns all at once, exactly; of ``args`` only the linking ids and the
identity fields). Each chunk becomes columns (strings as codes) before the next is decoded,
and only the few events whose args carry a collective's identity keep them: the per-event
Python objects never exist for the whole trace at once.
"""

from __future__ import annotations

import functools
import gzip
import mmap
import re
import warnings
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.analysis import digest, intervals, ops
from rankscope.errors import ExportError, RankscopeWarning

SOURCE_FORMAT = "kineto-json"
HOOK_KEY = "rankscope"  # top-level metadata written by rankscope's torch hook

_TOP_KEYS = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds", "host_name", "trace_id", HOOK_KEY)
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_GLOO = "gloo:"
_C10D = "c10d::"
_NCCL = "nccl:"
_RPC = "record_param_comms"
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_EMPTY = msgspec.Raw(b"")

# Bytes per element for record_param_comms `dtype` and `Input type` spellings.
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "uint32": 4,
    "double": 8, "float64": 8, "long": 8, "int64": 8, "uint64": 8,
    "half": 2, "float16": 2, "bfloat16": 2, "short": 2, "int16": 2,
    "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1,
    "unsigned char": 1, "signed char": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


@dataclass
class _Trace:
    top: dict
    events: pd.DataFrame  # cat, name, pid, tid, ts_ns, dur_ns (absolute epoch ns), corr, ext
    args: callable  # rows (positions in events, -1 for none) -> list[_Args]


def read_kineto(path: str | Path, *, rank_from: str | None = None) -> pa.Table:
    """One digest row for one Kineto trace (plain or gzipped JSON).

    ``rank_from``: None takes the rank from ``distributedInfo`` (or the rankscope hook's
    metadata), falling back to the file name with a warning; ``filename[:REGEX]`` takes it
    from the file name.
    """
    path = Path(path)
    trace = _load(path)
    notes: list[str] = []
    meta = _meta(path, trace, rank_from, notes)
    events = trace.events
    steps = _steps(events)
    gpu = events[events["cat"].isin(_GPU_CATS)]
    if len(gpu):
        busy = _device_busy(gpu)
        collectives = _nccl_collectives(trace, meta, notes)
    else:
        notes.append(
            "CPU-only trace: no device activity; busy time is the union of top-level CPU ops "
            "(compute) and gloo worker ops (communication)"
        )
        busy = _cpu_busy(events)
        collectives = _gloo_collectives(trace, meta, notes)
    collectives = _with_context(collectives, busy, steps, meta["window_start_ns"])
    communicators = _communicators(trace.top, collectives)
    meta.update(busy.totals)
    meta["warnings"] = notes
    for note in notes:
        warnings.warn(f"{path}: {note}", RankscopeWarning, stacklevel=2)
    return digest.digest_row(
        meta, collectives=collectives, kernels=busy.kernels, steps=steps, communicators=communicators
    )


# ---------------------------------------------------------------- parsing


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The args read: the two ids that link events (CUDA correlation, the profiler's
    External id) and those that carry a collective's identity and size (record_param_comms,
    c10d calls, NCCL kernels, gloo worker ops). Every other arg is skipped unread; input
    shapes stay text until a collective's size needs them."""

    correlation: int = -1
    external: int = msgspec.field(default=-1, name="External id")
    collective: Any = msgspec.field(default=None, name="Collective name")
    nelems: Any = msgspec.field(default=None, name="In msg nelems")
    dtype: Any = None
    dims: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input type")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    seq: Any = msgspec.field(default=None, name="Seq")
    stream: Any = None


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """One trace event, only the fields read. ``ts``/``dur`` stay as their exact decimal text."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = ""
    tid: int | str = ""
    ts: msgspec.Raw = _EMPTY
    dur: msgspec.Raw = _EMPTY
    args: _Args = _NO_ARGS


class _Document(msgspec.Struct, gc=False):
    """The top-level keys read; each event stays its undecoded text until its chunk is read."""

    traceEvents: list[msgspec.Raw] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None
    trace_id: Any = None
    hook: Any = msgspec.field(default=None, name=HOOK_KEY)


_DOCUMENT = msgspec.json.Decoder(_Document)
_EVENTS = msgspec.json.Decoder(list[_Event])
# Events decoded at a time. A decoded event costs ~400 bytes of Python objects, 10x its
# columns: chunks bound that to ~2 MB whatever the trace's size, and decode no slower than
# one pass over the whole list.
_CHUNK = 4096
# Events whose ids are read: kernels and their launches, and the host collective calls.
# Kernel launches: runtime API (cudaLaunchKernel) or driver API (cuLaunchKernelEx, NCCL >= 2.19).
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_LINKED_CATS = ("kernel", *_LAUNCH_CATS)


def _load(path: Path) -> _Trace:
    try:
        text = _Text(path)
        document = _DOCUMENT.decode(text.data)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ExportError(f"cannot read Kineto trace ({exc})", path=path) from None
    except msgspec.DecodeError as exc:
        raise ExportError(f"not a Kineto JSON trace ({exc})", path=path) from None
    if document.traceEvents is None:
        raise ExportError("not a Kineto trace (no traceEvents list)", path=path)
    top = {key: value for key, value in zip(_TOP_KEYS, (
        document.schemaVersion, document.distributedInfo, document.baseTimeNanoseconds,
        document.host_name, document.trace_id, document.hook)) if value is not None}
    base = _base(path, top)
    texts = document.traceEvents
    del document
    columns = _Columns()
    try:
        for first in range(0, len(texts), _CHUNK):
            text.release()
            columns.add(_complete(texts[first : first + _CHUNK]))
    except msgspec.DecodeError as exc:
        raise ExportError(f"not a Kineto JSON trace ({exc})", path=path) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ExportError(f"unreadable event time ({exc})", path=path) from None
    del texts, text  # the trace's bytes go with the last view of them
    frame = columns.frame(base)
    kept = columns.kept

    def args(rows) -> list[_Args]:
        """Identity args of the given rows (-1: none)."""
        return [kept[row] if row >= 0 else _NO_ARGS for row in rows]

    return _Trace(top, frame, args)


class _Text:
    """A trace's bytes. A plain file is mapped, not read, and its pages are dropped from the
    process after the split into events and after each chunk (they stay in the page cache;
    the next chunk maps just its own again): the text costs the process the file's size
    only while it is split, then about a chunk. A gzipped file is decompressed whole."""

    def __init__(self, path: Path) -> None:
        self.mapped: mmap.mmap | None = None
        with path.open("rb") as handle:
            if handle.read(2) == b"\x1f\x8b":
                handle.seek(0)
                self.data: bytes | mmap.mmap = gzip.decompress(handle.read())
                return
            try:
                self.mapped = self.data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                self.data = b""

    def release(self) -> None:
        if self.mapped is not None and _DROP is not None:
            self.mapped.madvise(_DROP)


_DROP = getattr(mmap, "MADV_DONTNEED", None)  # absent where the OS has no madvise: pages stay


def _complete(texts: list[msgspec.Raw]) -> list[_Event]:
    """The complete (ph X) events among some events' texts, decoded in one call."""
    return [e for e in _EVENTS.decode(b"[" + b",".join(texts) + b"]") if e.ph == "X" and e.ts]


class _Columns:
    """The complete events' columns, built a chunk of decoded events at a time: strings as
    codes into their distinct values (the same names recur every step), times as int64 ns,
    ids as int64, and the args of only the events whose args carry a collective's identity."""

    def __init__(self) -> None:
        self.distinct: dict[str, dict] = {"cat": {}, "name": {}, "pid": {}, "tid": {}}
        self.codes: dict[str, list[np.ndarray]] = {key: [] for key in self.distinct}
        self.numbers: dict[str, list[np.ndarray]] = {key: [] for key in ("ts_ns", "dur_ns", "corr", "ext")}
        self.identity_name = np.zeros(0, bool)  # per distinct name: its events carry identity args
        self.comm_name = np.zeros(0, bool)  # per distinct name: an NCCL kernel's name
        self.kept: dict[int, _Args] = {}
        self.rows = 0

    def add(self, events: list[_Event]) -> None:
        n = len(events)
        for key, distinct in self.distinct.items():
            self.codes[key].append(np.fromiter(
                [distinct.setdefault(v, len(distinct)) for v in map(attrgetter(key), events)], np.int32, n))
        self.numbers["ts_ns"].append(_ns(list(map(attrgetter("ts"), events))))
        self.numbers["dur_ns"].append(_ns(list(map(attrgetter("dur"), events))))
        self.numbers["corr"].append(np.fromiter(map(attrgetter("args.correlation"), events), np.int64, n))
        self.numbers["ext"].append(np.fromiter(map(attrgetter("args.external"), events), np.int64, n))
        self._classify_new_names()
        name, cat = self.codes["name"][-1], self.codes["cat"][-1]
        kernel = cat == self.distinct["cat"].get("kernel", -1)
        rows = np.flatnonzero(self.identity_name[name] | (kernel & self.comm_name[name])).tolist()
        self.kept.update(zip([self.rows + r for r in rows], [_detached(events[r].args) for r in rows]))
        self.rows += n

    def _classify_new_names(self) -> None:
        """Identity tests once per distinct name, as names first appear."""
        names = list(self.distinct["name"])[len(self.identity_name):]
        if not names:
            return
        new = pd.Series(names, dtype=object)
        by_name = (new.str.startswith((_C10D, _NCCL, _GLOO)) | (new == _RPC)).to_numpy(bool)
        self.identity_name = np.concatenate([self.identity_name, by_name])
        self.comm_name = np.concatenate([self.comm_name, ops.is_comm_kernel(new)])

    def frame(self, base: int) -> pd.DataFrame:
        codes = {key: np.concatenate(parts) if parts else np.zeros(0, np.int32) for key, parts in self.codes.items()}
        numbers = {key: np.concatenate(parts) if parts else np.zeros(0, np.int64) for key, parts in self.numbers.items()}
        values = {key: pd.Index(list(distinct), dtype=object) for key, distinct in self.distinct.items()}
        frame = pd.DataFrame(
            {
                "cat": pd.Categorical.from_codes(codes["cat"], values["cat"]),
                "name": pd.Categorical.from_codes(codes["name"], values["name"]),
                "pid": pd.Series(values["pid"].to_numpy()[codes["pid"]], dtype=object),
                "tid": pd.Series(values["tid"].to_numpy()[codes["tid"]], dtype=object),
                "ts_ns": numbers["ts_ns"] + base,
                "dur_ns": numbers["dur_ns"],
            }
        )
        # Ids of the events that are linked; any others an event carries are not read.
        names = frame["name"]
        linked = (frame["cat"].isin(_LINKED_CATS) | names.str.startswith(_C10D) | (names == _RPC)).to_numpy()
        for key in ("corr", "ext"):
            ids = np.where(linked, numbers[key], -1)
            frame[key] = pd.arrays.IntegerArray(ids, ids < 0)
        # One integer per (pid, tid): threads are compared many times, strings once.
        frame["thread"] = codes["pid"].astype(np.int64) * (len(values["tid"]) + 1) + codes["tid"]
        return frame


def _detached(args: _Args) -> _Args:
    """Args kept past their chunk: input shapes copied, so they do not pin the chunk's text."""
    if args.dims or args.types:
        return msgspec.structs.replace(args, dims=args.dims.copy(), types=args.types.copy())
    return args


def _is_comm(names: pd.Series) -> np.ndarray:
    """ops.is_comm_kernel, tested once per distinct name."""
    return ops.is_comm_kernel(pd.Series(names.cat.categories, dtype=object))[names.cat.codes.to_numpy()]


# µs with up to 18 decimals and 20 integer digits; rounding to 3 decimals gives whole ns.
_MICROS = pa.decimal128(38, 18)
_NANOS_AS_MICROS = pa.decimal128(38, 3)


def _ns(numbers: list) -> np.ndarray:
    """JSON numbers of µs (their exact decimal text) -> int64 ns, rounded half away from
    zero, all at once in Arrow: the texts become one string array without copies per
    number, are cast to decimal, and the decimal's unscaled integer at 3 decimals is the
    ns. Never through float64."""
    texts = [n or b"0" for n in numbers]
    offsets = np.zeros(len(texts) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=offsets[1:])
    strings = pa.Array.from_buffers(pa.large_string(), len(texts),
                                    [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(texts))])
    try:
        micros = strings.cast(_NANOS_AS_MICROS)  # Kineto writes at most 3 decimals: exact
    except pa.ArrowInvalid:  # more decimals: round them to whole ns
        micros = pc.round(strings.cast(_MICROS), 3, round_mode="half_towards_infinity").cast(_NANOS_AS_MICROS)
    nanos = pa.Array.from_buffers(pa.decimal128(38, 0), len(micros), micros.buffers())
    return nanos.cast(pa.int64()).to_numpy()


def _base(path: Path, top: dict) -> int:
    base = top.get("baseTimeNanoseconds")
    try:
        return int(base) if base is not None else 0
    except (TypeError, ValueError):
        raise ExportError(f"baseTimeNanoseconds {base!r} is not an integer", path=path) from None


# ---------------------------------------------------------------- identity


def _meta(path: Path, trace: _Trace, rank_from: str | None, notes: list[str]) -> dict:
    top = trace.top
    info = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else None
    hook = top.get(HOOK_KEY) if isinstance(top.get(HOOK_KEY), dict) else {}
    rank, source = _rank(path, info, hook, rank_from, notes)
    world = (info or {}).get("world_size", hook.get("world_size"))
    host = top.get("host_name") or hook.get("host")
    if not host:
        host = f"unknown-host:{path.name}"
        notes.append(f"no host_name in trace: it is its own clock domain ({host})")
    events = trace.events
    if len(events) == 0:
        raise ExportError("Kineto trace has no complete (ph X) events", path=path)
    cpu = events[events["cat"] == "cpu_op"]
    pid = cpu["pid"].mode().iloc[0] if len(cpu) else None
    return {
        "rank": rank,
        "rank_source": source,
        "local_rank": hook.get("local_rank"),
        "world_size": world,
        "host": str(host),
        "gpu": hook.get("gpu") or None,
        "pid": int(pid) if pid is not None and str(pid).lstrip("-").isdigit() else None,
        "job_id": hook.get("job_id") or None,
        "source_format": SOURCE_FORMAT,
        "source_file": str(path),
        "producer": f"kineto schemaVersion {top.get('schemaVersion', '?')}"
        + (f", torch {hook['torch']}" if hook.get("torch") else ""),
        "window_start_ns": int(events["ts_ns"].min()),
        "window_end_ns": int((events["ts_ns"] + events["dur_ns"]).max()),
        "backend": (info or {}).get("backend"),
    }


def _rank(path: Path, info: dict | None, hook: dict, rank_from: str | None, notes: list[str]) -> tuple[int, str]:
    """``rank_from`` as for every export (sources.py): ``filename:REGEX`` (first group, else
    the whole match, searched in the file name) or ``filename`` (``rank<N>``/``rank-<N>``).
    Without it: distributedInfo, the rankscope hook's metadata, then the file name with a
    warning; else an error naming the file."""
    what = "no distributedInfo" if info is None else "distributedInfo has no rank"
    if rank_from is None:
        if info is not None and isinstance(info.get("rank"), int):
            return info["rank"], "distributedInfo.rank"
        if isinstance(hook.get("rank"), int):
            return hook["rank"], "rankscope hook"
    kind, _, pattern = (rank_from or "filename").partition(":")
    if kind != "filename":
        raise ExportError(f"rank_from {rank_from!r}: a Kineto trace can only take its rank from "
                          "filename[:REGEX] (it records no environment)", path=path)
    pattern = pattern or r"rank[-_]?(\d+)"
    try:
        found = re.search(pattern, path.name)
    except re.error as exc:
        raise ExportError(f"bad rank_from pattern {pattern!r} ({exc})", path=path) from None
    text = (found.group(1) if found.groups() else found.group(0)) if found else ""
    if text.isdigit():
        if rank_from is None:
            notes.append(f"{what}: rank {text} taken from the file name")
        return int(text), "filename"
    raise ExportError(
        f"{what if rank_from is None else 'rank_from ' + repr(rank_from)}: the file name gives no rank "
        f"(pattern '{pattern}'); pass --rank-from filename:REGEX or name the file rank<N>", path=path
    )


# ---------------------------------------------------------------- busy time


@dataclass
class _Busy:
    compute: intervals.Union
    everything: intervals.Union
    kernels: pd.DataFrame
    totals: dict


def _device_busy(gpu: pd.DataFrame) -> _Busy:
    start = gpu["ts_ns"].to_numpy(np.int64)
    end = start + gpu["dur_ns"].to_numpy(np.int64)
    comm = _is_comm(gpu["name"]) & (gpu["cat"] == "kernel").to_numpy()
    kernels = gpu[gpu["cat"] == "kernel"]
    return _busy(start, end, comm, _kernel_table(kernels, _is_comm(kernels["name"])))


def _cpu_busy(events: pd.DataFrame) -> _Busy:
    """CPU-only proxy: top-level CPU ops on compute threads, gloo worker ops as comm."""
    gloo = events["name"].str.startswith(_GLOO) & (events["cat"] == "user_annotation")
    c10d = events["name"].str.startswith((_C10D, _RPC))
    callers = set(_thread(events[c10d]))
    threads = _thread(events)
    workers = set(threads[gloo.to_numpy()]) - callers  # gloo:send runs on the caller
    cpu = (events["cat"] == "cpu_op").to_numpy() & ~c10d.to_numpy() & ~np.isin(threads, list(workers))
    chosen = events[cpu | gloo.to_numpy()]
    top = chosen[_top_level(chosen)]
    start = top["ts_ns"].to_numpy(np.int64)
    end = start + top["dur_ns"].to_numpy(np.int64)
    comm = top["name"].str.startswith(_GLOO).to_numpy()
    return _busy(start, end, comm, _kernel_table(top, comm))


def _busy(start: np.ndarray, end: np.ndarray, comm: np.ndarray, kernels: pd.DataFrame) -> _Busy:
    compute = intervals.merge(start[~comm], end[~comm])
    everything = intervals.merge(start, end)
    total = int((everything.ends - everything.starts).sum())
    compute_ns = int((compute.ends - compute.starts).sum())
    comm_ns = intervals.union_length(start[comm], end[comm])
    overlap = compute_ns + comm_ns - total
    totals = {
        "gpu_busy_ns": total,
        "compute_only_ns": compute_ns - overlap,
        "comm_only_ns": comm_ns - overlap,
        "overlap_ns": overlap,
    }
    return _Busy(compute, everything, kernels, totals)


def _kernel_table(rows: pd.DataFrame, is_comm: np.ndarray) -> pd.DataFrame:
    """Count and total time per (name, is_comm), largest total first (ties: first seen
    first), on the name codes: no trace-sized column of strings."""
    key = rows["name"].cat.codes.to_numpy(np.int64) * 2 + is_comm
    keys, first, group = np.unique(key, return_index=True, return_inverse=True)
    total = np.zeros(len(keys), np.int64)
    np.add.at(total, group, rows["dur_ns"].to_numpy(np.int64))
    order = np.lexsort((first, -total))
    return pd.DataFrame({
        "name": pd.Series(rows["name"].cat.categories.to_numpy()[keys[order] // 2], dtype=object),
        "is_comm": keys[order] % 2 == 1,
        "count": np.bincount(group, minlength=len(keys))[order],
        "total_ns": total[order],
    })


def _top_level(rows: pd.DataFrame) -> np.ndarray:
    """True for events not nested inside an earlier event of the same thread."""
    order = rows.sort_values(["thread", "ts_ns", "dur_ns"], ascending=[True, True, False])
    end = order["ts_ns"] + order["dur_ns"]
    thread = order["thread"]
    reach = end.groupby(thread, sort=False).cummax()
    previous = reach.groupby(thread, sort=False).shift(1)
    top = previous.isna() | (order["ts_ns"] >= previous)
    return top.reindex(rows.index).to_numpy(dtype=bool)


# ---------------------------------------------------------------- collectives


def _calls(events: pd.DataFrame, top: dict, notes: list[str]) -> pd.DataFrame:
    """Host-side collective calls: c10d ops, each with the row of the record_param_comms
    (``rpc``) and of the ``nccl:<op>`` annotation (``ann``) inside it, -1 where none, and
    the hook's Flight Recorder identity (``fr_pg``, ``fr_seq``, ``fr_bytes``) where given."""
    cpu = events["cat"] == "cpu_op"
    c10d = events[cpu & events["name"].str.startswith(_C10D)]
    rpc = events[cpu & (events["name"] == _RPC)]
    ann = events[(events["cat"] == "user_annotation") & events["name"].str.startswith(_NCCL)]
    calls = c10d.assign(op=c10d["name"].map(_canonical).astype(object), rpc=-1, ann=-1)
    lone = rpc
    for column, inner in (("rpc", rpc), ("ann", ann)):
        if len(inner) and len(calls):
            inside = _containing(inner, calls)
            found = inside.dropna().astype(int)
            calls.iloc[found.to_numpy(), calls.columns.get_loc(column)] = found.index.to_numpy()
            if column == "rpc":
                lone = rpc[inside.isna()]
    if len(lone):  # record_param_comms outside any c10d op: a call of its own
        calls = pd.concat([calls, lone.assign(op=None, rpc=lone.index, ann=-1)])
    calls = calls.sort_values("ts_ns", kind="stable")
    return _with_flight_recorder(calls, top, notes)


def _with_flight_recorder(calls: pd.DataFrame, top: dict, notes: list[str]) -> pd.DataFrame:
    """Join the hook's Flight Recorder entries to the calls: an entry is created inside
    its c10d call, on the same clock (checked on torch 2.13 gloo: 10-90 µs after the
    call starts, before it ends)."""
    recorder = (top.get(HOOK_KEY) or {}).get("flight_recorder") if isinstance(top.get(HOOK_KEY), dict) else None
    calls = calls.assign(fr_pg=None, fr_seq=pd.array([pd.NA] * len(calls), dtype="Int64"),
                         fr_bytes=pd.array([pd.NA] * len(calls), dtype="Int64"))
    if not recorder or not recorder.get("rows") or calls.empty:
        return calls
    entries = pd.DataFrame(recorder["rows"], columns=recorder["columns"])
    entries["op"] = entries["profiling_name"].map(_canonical)
    entries = entries.dropna(subset=["op"]).astype({"time_created_ns": np.int64}).sort_values("time_created_ns")
    known = calls[calls["op"].notna()]
    right = pd.DataFrame({"ts_ns": known["ts_ns"].to_numpy(np.int64), "op": known["op"].to_numpy(object),
                          "end": (known["ts_ns"] + known["dur_ns"]).to_numpy(), "label": known.index})
    joined = pd.merge_asof(entries.rename(columns={"time_created_ns": "ts_ns"}), right.sort_values("ts_ns"),
                           on="ts_ns", by="op", direction="backward")
    joined = joined[joined["ts_ns"] <= joined["end"]].drop_duplicates("label")
    labels = joined["label"].to_numpy()
    calls.loc[labels, "fr_pg"] = joined["pg_name"].astype(str).to_numpy()
    calls.loc[labels, "fr_seq"] = joined["seq"].astype(np.int64).to_numpy()
    calls.loc[labels, "fr_bytes"] = pd.array(joined["bytes"], dtype="Int64")
    unmatched = int((known.index.isin(labels) == False).sum())  # noqa: E712 - numpy mask
    if unmatched:
        notes.append(f"{unmatched} collective call(s) at the window's edges have no Flight Recorder entry: not matched")
        calls = calls[calls.index.isin(labels) | calls["op"].isna()]
    return calls


def _containing(inner: pd.DataFrame, outer: pd.DataFrame) -> pd.Series:
    """For each inner event: the position in ``outer`` of the latest event on the same
    thread that starts at or before it and has not ended (NaN where none)."""
    return pd.Series(_containing_at(_thread(inner), inner["ts_ns"].to_numpy(np.int64), outer), index=inner.index)


def _containing_at(thread: np.ndarray, ts: np.ndarray, outer: pd.DataFrame) -> np.ndarray:
    """_containing for events given by their thread codes and start times."""
    if outer.empty:
        return np.full(len(ts), np.nan)
    outer_thread, start = _thread(outer), outer["ts_ns"].to_numpy(np.int64)
    order = np.lexsort((start, outer_thread))  # by thread, then start; ties keep their order
    at = intervals.last_at_or_before(outer_thread[order], start[order], thread, ts)
    pos = order[np.maximum(at, 0)]
    end = start[pos] + outer["dur_ns"].to_numpy(np.int64)[pos]
    return np.where((at >= 0) & (ts <= end), pos, np.nan)


def _thread(rows: pd.DataFrame) -> np.ndarray:
    return rows["thread"].to_numpy()


def _nccl_collectives(trace: _Trace, meta: dict, notes: list[str]) -> pd.DataFrame:
    events = trace.events
    kernels = events[(events["cat"] == "kernel")]
    kernels = kernels[_is_comm(kernels["name"])]
    if kernels.empty:
        return pd.DataFrame()
    calls = _calls(events, trace.top, notes)
    call = _kernel_calls(events, kernels, calls)
    linked = ~np.isnan(call)
    orphans = int((~linked).sum())
    if orphans:
        notes.append(f"{orphans} NCCL kernel(s) with no host-side collective call in the trace: not matched")
    # Per call: its first kernel (by start; ties in trace order) gives arrival, the last end its end.
    call = call[linked].astype(np.int64)
    start = kernels["ts_ns"].to_numpy(np.int64)[linked]
    end = start + kernels["dur_ns"].to_numpy(np.int64)[linked]
    order = np.lexsort((start, call))
    calls_of, first = np.unique(call[order], return_index=True)
    kernel_rows = kernels.index.to_numpy()[linked][order][first]
    chosen = calls.iloc[calls_of]
    rpc = chosen["rpc"].to_numpy(np.int64)
    frame = pd.DataFrame(
        {
            "start_ns": start[order][first],
            "end_ns": np.maximum.reduceat(end[order], first) if len(first) else end[:0],
            "cpu_call_ns": chosen["ts_ns"].to_numpy(np.int64),
        }
    )
    # Identity args: record_param_comms where present, else the first kernel's copy.
    kernel_args = trace.args(kernel_rows.tolist())
    kernel = _arg_columns(kernel_args)
    own = _arg_columns(trace.args(rpc.tolist()))
    own = {key: np.where(rpc >= 0, own[key], kernel[key]) for key in own}
    host = _arg_columns(trace.args(chosen.index.tolist()))
    annotation = _arg_columns(trace.args(chosen["ann"].tolist()))
    frame["op"] = _coalesce(own["op"], chosen["op"].to_numpy(object), kernel["op"])
    frame["bytes"] = _nullable(_coalesce(own["bytes"], annotation["bytes"], host["bytes"],
                                         chosen["fr_bytes"].to_numpy(object)))
    frame["pg"] = _coalesce(own["pg"], kernel["pg"], chosen["fr_pg"].to_numpy(object))
    frame["seq_trace"] = _nullable(_coalesce(own["seq"], kernel["seq"], chosen["fr_seq"].to_numpy(object)))
    frame["stream"] = ["?" if k.stream is None else str(k.stream) for k in kernel_args]
    frame = frame[frame["op"].notna()]
    return _identify(frame, trace.top, meta, notes, fallback="stream")


def _kernel_calls(events: pd.DataFrame, kernels: pd.DataFrame, calls: pd.DataFrame) -> np.ndarray:
    """Position in ``calls`` of each kernel's host call (NaN: none): via the CUDA launch
    that has the kernel's correlation id (its first such launch, enclosed by the call on
    its thread), else by External id (a call's own, else its record_param_comms')."""
    result = np.full(len(kernels), np.nan)
    corr = events["corr"].to_numpy(np.int64, na_value=-1)
    launch_rows = np.flatnonzero(events["cat"].isin(_LAUNCH_CATS).to_numpy() & (corr >= 0))
    launch_corr, first = np.unique(corr[launch_rows], return_index=True)
    at, has = _lookup(launch_corr, kernels["corr"].to_numpy(np.int64, na_value=-1))
    if has.any():
        rows = launch_rows[first[at[has]]]
        thread, ts = events["thread"].to_numpy(), events["ts_ns"].to_numpy(np.int64)
        result[has] = _containing_at(thread[rows], ts[rows], calls)
    missing = np.isnan(result)
    if missing.any():
        ext = events["ext"].to_numpy(np.int64, na_value=-1)
        rpc = calls["rpc"].to_numpy(np.int64)
        keys = np.concatenate([calls["ext"].to_numpy(np.int64, na_value=-1), np.where(rpc >= 0, ext[rpc], -1)])
        positions = np.tile(np.arange(len(calls)), 2)[keys >= 0]
        known, first = np.unique(keys[keys >= 0], return_index=True)  # first: a call's own id wins
        at, has = _lookup(known, kernels["ext"].to_numpy(np.int64, na_value=-1))
        found = missing & has
        result[found] = positions[first[at[found]]]
    return result


def _lookup(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Position of each value in sorted unique ``keys``, and whether it is there (ids < 0: absent)."""
    if not len(keys):
        return np.zeros(len(values), np.intp), np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return at, (values >= 0) & (keys[at] == values)


def _gloo_collectives(trace: _Trace, meta: dict, notes: list[str]) -> pd.DataFrame:
    events = trace.events
    work = events[(events["cat"] == "user_annotation") & events["name"].str.startswith(_GLOO)]
    if work.empty:
        return pd.DataFrame()
    work = work.assign(op=work["name"].map(_canonical).astype(object)).dropna(subset=["op"])
    calls = _calls(events, trace.top, notes)
    calls = calls[calls["op"].notna()]
    paired = _pair_in_order(work, calls)
    dropped = len(work) - len(paired)
    if dropped:
        notes.append(f"{dropped} gloo op(s) enqueued before the window or never enqueued in it: not matched")
    host = _arg_columns(trace.args([int(r) for r in paired["call_row"]]))
    work = _arg_columns(trace.args(list(paired["row"])))
    fr_pg = np.array([f if isinstance(f, str) else None for f in paired["fr_pg"]], dtype=object)
    frame = pd.DataFrame(
        {
            "start_ns": paired["ts_ns"].to_numpy(),
            "end_ns": (paired["ts_ns"] + paired["dur_ns"]).to_numpy(),
            "cpu_call_ns": pd.array(paired["call_ts"], dtype="Int64"),
            "op": paired["op"].to_numpy(),
            "bytes": _nullable(_coalesce(_ints(list(paired["fr_bytes"])), work["bytes"], host["bytes"])),
            "pg": _coalesce(host["pg"], fr_pg),
            "seq_trace": _nullable(_coalesce(host["seq"], _ints(list(paired["fr_seq"])))),
            "stream": "",
        }
    )
    return _identify(frame, trace.top, meta, notes, fallback="op")


def _pair_in_order(work: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Pair each gloo worker op with its enqueue: the k-th call of an op with the k-th worker
    op of that op that started after the first such call (FIFO per op). Ops never enqueued
    in the trace (no c10d events recorded) stay, unpaired."""
    first = calls.groupby("op")["ts_ns"].min()
    known = work["op"].isin(first.index)
    lone = work[~known].assign(row=work.index[~known], call_row=-1, call_ts=pd.NA, fr_pg=None,
                               fr_seq=pd.NA, fr_bytes=pd.NA)
    if not known.any():
        return lone
    work = work[known]
    work = work[work["ts_ns"] >= work["op"].map(first)]
    work = work.sort_values("ts_ns", kind="stable")
    work = work.assign(k=work.groupby("op").cumcount(), row=work.index)
    calls = calls.assign(k=calls.groupby("op").cumcount(), call_row=calls.index, call_ts=calls["ts_ns"])
    paired = work.merge(calls[["op", "k", "call_row", "call_ts", "fr_pg", "fr_seq", "fr_bytes"]],
                        on=["op", "k"], how="inner")
    paired = paired[paired["ts_ns"] >= paired["call_ts"]]
    return pd.concat([paired, lone]) if len(lone) else paired


def _identify(frame: pd.DataFrame, top: dict, meta: dict, notes: list[str], fallback: str) -> pd.DataFrame:
    """comm_id and seq for each instance (see module docstring)."""
    if frame.empty:
        return frame
    frame = frame.assign(order=frame["cpu_call_ns"].fillna(frame["start_ns"]))
    frame = frame.sort_values("order", kind="stable").reset_index(drop=True)
    groups = _pg_config(top)
    missing = frame["pg"].isna()
    if missing.any():
        if len(groups) == 1:
            frame.loc[missing, "pg"] = next(iter(groups))
        else:
            key = frame.loc[missing, fallback].astype(str)
            frame.loc[missing, "pg"] = "unresolved-pg:" + key + (
                "" if fallback == "op" else ":" + frame.loc[missing, "op"])
            notes.append(
                f"{int(missing.sum())} collective(s) carry no process group and the trace lists "
                f"{len(groups) or 'no'} group(s): grouped by {fallback} and op, ordered within the group"
            )
    p2p = frame["op"].isin(ops.P2P_OPS)
    frame["comm_id"] = np.where(p2p, frame["pg"] + "/p2p", frame["pg"])
    ordinal = frame.groupby("comm_id", sort=False).cumcount() + 1
    traced = frame["seq_trace"].notna().to_numpy()
    frame["seq"] = np.where(traced, frame["seq_trace"].fillna(0).astype(np.int64), ordinal)
    frame["seq_source"] = np.where(traced, "trace", "ordinal")
    if (~traced).any():
        notes.append("no collective sequence numbers in trace: instances are numbered by order within "
                     "each process group inside the capture window")
    frame["peer"] = pd.NA
    return frame


def _with_context(frame: pd.DataFrame, busy: _Busy, steps: pd.DataFrame, first: int) -> pd.DataFrame:
    """compute_before / idle_before / compute_overlap and the step of each collective."""
    if frame.empty:
        return digest.empty_part("collectives").to_pandas()
    frame = frame.sort_values("start_ns", kind="stable").reset_index(drop=True)
    start = frame["start_ns"].to_numpy(np.int64)
    end = frame["end_ns"].to_numpy(np.int64)
    gap_start, gap_end = intervals.gaps_before(start, end, first)
    frame["compute_before_ns"] = intervals.overlap(busy.compute, gap_start, gap_end)
    frame["idle_before_ns"] = (gap_end - gap_start) - intervals.overlap(busy.everything, gap_start, gap_end)
    frame["compute_overlap_ns"] = intervals.overlap(busy.compute, start, end)
    frame["step"] = _step_of(frame["cpu_call_ns"].fillna(frame["start_ns"]).to_numpy(np.int64), steps)
    return frame


def _steps(events: pd.DataFrame) -> pd.DataFrame:
    named = events[events["name"].str.startswith("ProfilerStep#")]  # cheap test before the regex
    found = named["name"].str.extract(_STEP, expand=False)
    rows = named[found.notna()]
    return pd.DataFrame(
        {
            "step": found[found.notna()].astype(np.int64).to_numpy(),
            "start_ns": rows["ts_ns"].to_numpy(np.int64),
            "end_ns": (rows["ts_ns"] + rows["dur_ns"]).to_numpy(np.int64),
        }
    ).sort_values("start_ns", kind="stable").drop_duplicates("step")


def _step_of(times: np.ndarray, steps: pd.DataFrame) -> pd.array:
    out = pd.array([pd.NA] * len(times), dtype="Int64")
    if steps.empty or len(times) == 0:
        return out
    starts = steps["start_ns"].to_numpy()
    j = np.searchsorted(starts, times, side="right") - 1
    jj = np.clip(j, 0, None)
    inside = (j >= 0) & (times < steps["end_ns"].to_numpy()[jj])
    out[inside] = steps["step"].to_numpy()[jj[inside]]
    return out


def _communicators(top: dict, collectives: pd.DataFrame) -> pd.DataFrame:
    groups = _pg_config(top)
    ids = list(dict.fromkeys(collectives["comm_id"])) if len(collectives) else []
    rows = []
    for comm in ids:
        name = comm.removesuffix("/p2p")
        config = groups.get(name, {})
        ranks = config.get("ranks")
        # Without the member list, pg_size lets matching check the members it infers.
        size = config.get("pg_size") if ranks is None and type(config.get("pg_size")) is int else None
        rows.append({"comm_id": comm, "ranks": ranks, "name": config.get("pg_desc") or name, "size": size})
    return pd.DataFrame(rows, columns=["comm_id", "ranks", "name", "size"]).astype({"size": "Int64"})


def _pg_config(top: dict) -> dict[str, dict]:
    info = top.get("distributedInfo") or {}
    return {str(g.get("pg_name")): g for g in info.get("pg_config") or [] if isinstance(g, dict)}


def _pg(args: _Args) -> str | None:
    for value in (args.pg_name, args.pg_id):
        if value is not None and value != "":
            return str(value)
    return None


@functools.lru_cache(maxsize=4096)
def _canonical(name) -> str | None:
    """ops.canonical, once per distinct spelling (the same names recur every step)."""
    return ops.canonical(name) if isinstance(name, str) else None


def _arg_columns(args: list[_Args]) -> dict[str, np.ndarray]:
    """The identity args of events as object columns (None where absent): op, bytes, pg, seq."""
    return {
        "op": np.array([_canonical(a.collective) for a in args], dtype=object),
        "bytes": _sizes(args),
        "pg": np.array([_pg(a) for a in args], dtype=object),
        "seq": _ints([a.seq for a in args]),
    }


def _coalesce(*columns: np.ndarray) -> np.ndarray:
    """Per row, the first non-null value of the columns (object arrays of one length)."""
    out = columns[0]
    for column in columns[1:]:
        out = np.where(pd.isna(out), column, out)
    return out


def _nullable(values: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.array([None if pd.isna(v) else int(v) for v in values], dtype="Int64")


def _ints(values: list) -> np.ndarray:
    """Integer args (ints or their text) as an object array; anything else is None."""
    return np.array([v if type(v) is int else _int(v) for v in values], dtype=object)


def _int(value) -> int | None:
    try:
        return None if value is None or value is pd.NA else int(value)
    except (TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _element_size(dtype) -> int:
    return _DTYPE_BYTES.get(dtype.lower(), 0) if isinstance(dtype, str) else 0


def _sizes(args: list[_Args]) -> np.ndarray:
    """Message size: record_param_comms `In msg nelems` x dtype, else the first input's
    `Input Dims` x `Input type` (per rank, as sent)."""
    return _ints([n * size if (n := _int(a.nelems)) is not None and (size := _element_size(a.dtype))
                  else _input_bytes(a.dims, a.types) for a in args])


def _input_bytes(dims_text: msgspec.Raw, types_text: msgspec.Raw) -> int | None:
    dims = msgspec.json.decode(dims_text) if dims_text else None
    types = msgspec.json.decode(types_text) if types_text else None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    for shape, kind in zip(dims, types):
        while isinstance(shape, list) and shape and isinstance(shape[0], list):
            shape = shape[0]  # a TensorList: its first tensor
        size = _element_size(kind)
        if isinstance(shape, list) and shape and size:
            return int(np.prod(shape, dtype=np.int64)) * size
    return None
