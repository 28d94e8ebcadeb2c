"""Nsight Systems SQLite export -> per-rank digest rows.

The work is split so that ingest costs little more than SQLite reading the rows:
- per file, ``nsys_export`` fetches its rows into numpy columns (one statement per table,
  SQLite doing the joins and filters it does cheaply) with the offset that moves its
  times to UTC epoch ns (its docstring: the time base);
- per batch of files, one vectorised build over all their rows (grouped by file,
  process and device with numpy sorts and binary searches) makes every rank's digest
  row at once. No per-file DataFrames, no per-event Python loops.

What comes from where (reference/nccl-in-traces.md):
- kernels: named by their demangled name (template arguments and all, as Kineto names
  them), else their short, else their mangled name; NCCL kernels classified by that
  name (`ops.is_comm_kernel`: NCCL's entry kernels are not templates, so their demangled
  name starts with their base name, their mangled one with ``_Z<length>`` and it), nothing more;
- their operation and communicator: the NCCL NVTX range (domain named ``NCCL``) on the
  thread whose runtime launch call (``correlationId`` + process) created the kernel.
  Grouped calls launch inside ``ncclGroupEnd``: the kernel serves every call since the
  group's start, but NCCL launches a kernel per GPU and communicator (and more for a
  group past a kernel's budget), so a kernel keeps only the calls of its GPU's
  communicators (where init payloads say) and has bytes only where no other kernel
  serves its calls. Payload fields (communicator id, size, peer, rank) are decoded by
  entry name when the export carries ``binaryData`` blobs; without a communicator id, the
  kernel's stream is kept, by which the analysis tells communicators apart (lines.py);
- ranks: one per (process, CUDA device) that ran kernels, so a torchrun tree profiled
  as one report splits into its ranks; where some ran NCCL kernels, only those and
  processes that called NCCL (`_stray_units`).
"""

from __future__ import annotations

import gc
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path

import numpy as np
import pyarrow as pa

from rankscope.analysis import digest, intervals, ops
from rankscope.analysis.groups import Groups, distinct, distinct_inverse, factorize, in_sorted, run_starts
from rankscope.analysis.inorder import InOrder
from rankscope.analysis.nsys_export import (
    I64_MAX, I64_MIN, MAX_DEVICE, NCCL_DOMAIN, NCCL_NAMED, NCCL_RANGE, OTHER_RANGE, PAYLOAD_FIELDS, File,
    read_file,
)
from rankscope.errors import ExportError, InputError, quoted, shown
from rankscope import launchers
from rankscope.launchers import LOCAL_RANK_ENV, RANK_ENV, WORLD_SIZE_ENV

SOURCE_FORMAT = "nsys-sqlite"

# Rows (kernels, copies, launches, NVTX) held before a batch is built: bounds memory, as
# a build holds ~250 bytes a row while it runs (eight exports of 450k rows: 4M rows a
# batch peaked at 1064 MB, 1M at 554 MB, and took 13% longer), while each batch costs
# a few ms whatever its size.
BATCH_ROWS = 1_000_000
# Payload blob: [domainId u64][schemaId u64][payloadSize u64][payloadOffset u64] payload.
_BLOB_HEADER = 32
_MAX_PAYLOAD_OFFSET = 2**31 - 1  # bytes into a payload: NCCL's are a few dozen
# NVTX payload entry type -> (bytes, signed) for the integer types NCCL uses
# (nvToolsExtPayload.h); ids >= 2**24 are enums (C int).
_ENTRY_TYPES = {
    1: (1, True), 2: (1, False), 3: (2, True), 4: (2, False), 5: (4, True), 6: (4, False),
    7: (8, True), 8: (8, False), 9: (8, True), 10: (8, False), 11: (1, True), 12: (1, False),
    13: (2, True), 14: (2, False), 15: (4, True), 16: (4, False), 17: (8, True), 18: (8, False),
    22: (8, False),
}
_ENUM_TYPE = (4, True)
_FIELD_INDEX = {name: i for i, name in enumerate(PAYLOAD_FIELDS)}
_INTEGER = re.compile(r"-?\d+")
_STEP = re.compile(rf"^(?:ProfilerStep#|step[ _#:]?)(\d{{1,{digest.STEP_DIGITS}}})$", re.I)
# Ops are coded while the batch is built (an index into this table; -1: none).
_OPS = (*sorted(ops.CANONICAL_OPS), ops.UNKNOWN)
_OP_CODE = {op: code for code, op in enumerate(_OPS)}
_P2P = np.array([op in ops.P2P_OPS for op in _OPS])
_OP_NAMES = pa.array(_OPS, pa.string())
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# (low, high) per payload field, in PAYLOAD_FIELDS' order: ranks and counts as NCCL
# gives them, within the digest's int32 columns.
_PAYLOAD_BOUNDS = np.array([
    {"peer": (0, _INT32_MAX), "nranks": (1, _INT32_MAX), "comm_rank": (0, _INT32_MAX),
     "cuda_device": (0, _INT32_MAX)}.get(column, (I64_MIN, I64_MAX)) for column in PAYLOAD_FIELDS.values()
], np.int64)
# Each list part's struct fields and list type, keyed by part name, and the digest's
# fields as (name, type) (iterating or hashing a struct type or schema costs microseconds).
_PARTS = {part: (list(struct), pa.list_(struct)) for part, struct in (
    ("collectives", digest.COLLECTIVE), ("kernels", digest.KERNEL), ("steps", digest.STEP), ("communicators", digest.COMMUNICATOR))}
_DIGEST_FIELDS = [(f.name, f.type) for f in digest.DIGEST_SCHEMA]

Columns = dict[str, np.ndarray]


def read_nsys(path: str | Path, *, rank_from: str | None = None) -> pa.Table:
    """Digest rows (one per rank found) from an nsys SQLite export.

    ``rank_from`` overrides where the rank comes from: ``env:VAR`` (a variable of the
    captured environment) or ``filename:REGEX`` (first group, else the whole match, of
    REGEX searched in the file name). Without it the rank comes from the captured
    environment (`launchers.RANK_ENV`: RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID,
    the nearest launcher's first), then from the MPI_RANKS table (``-t mpi``), then from the
    NCCL CommInitRank payload, then (with a warning) from the order of processes.
    """
    return read_many([path], rank_from=rank_from)


def read_many(paths: Iterable[str | Path], *, rank_from: str | None = None, workers: int = 1) -> pa.Table:
    """Digest rows of many exports, in file order: each file is read on its own (on
    ``workers`` threads, `_read_files`), then batches of files (up to `BATCH_ROWS` rows
    held) are built into digests at once."""
    tables: list[pa.Table] = []
    batch: list[File] = []
    held = 0
    with _collector_paused():
        for export in _read_files([Path(path) for path in paths], workers):
            batch.append(export)
            held += export.rows
            if held >= BATCH_ROWS:
                tables.append(_build(batch, rank_from))
                batch, held = [], 0
        if batch:
            tables.append(_build(batch, rank_from))
    return digest.concat(tables)


def _read_files(paths: Sequence[Path], workers: int) -> Iterator[File]:
    """Each path's `read_file`, in order. With ``workers`` above 1, that many read at once,
    each taking the next export: ``workers`` - 1 threads, reading with ADBC's driver (it
    runs without the GIL), and this thread, reading as `read_file` chooses (small exports
    with the sqlite3 module, which holds the GIL but for SQLite's own steps: the threads
    read meanwhile). None takes an export more than ``workers`` + 2 ahead of the one
    yielded, so the batches' bound on rows held stands. (Only ``workers`` ahead, a thread
    waited on this one's turn: 64 small exports on 2 CPUs read as slowly as on one, 1.34x
    the floor's time; ``workers`` + 2 ahead, 1.12x.)"""
    if workers <= 1 or len(paths) <= 1:
        yield from map(read_file, paths)
        return
    exports: InOrder[Path, File] = InOrder(paths, ahead=workers + 2)
    threads = [threading.Thread(target=exports.serve, args=(_read_by_driver,), name=f"rankscope-read-{i}", daemon=True)
               for i in range(min(workers, len(paths)) - 1)]
    for thread in threads:
        thread.start()
    try:
        yield from exports.results(read_file)
    finally:
        exports.close()
        for thread in threads:
            thread.join()


def _read_by_driver(path: Path) -> File:
    return read_file(path, arrow=True)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while rows are read. A fetch makes a tuple per
    row (ints and strings: no cycles to find), and each collection walks every tuple still
    held: ~13% of loading 8 exports of 4,000 kernels each (gc.callbacks), all of it wasted."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# ---------------------------------------------------------------- a batch: grouping tools


def _codes(*keys: np.ndarray) -> np.ndarray:
    """Dense number of each row's key tuple, numbered in lexicographic key order (keys
    packed into one int64 and radix-sorted where their ranges allow: a few times faster
    than a lexsort)."""
    return Groups(*keys).id


def _first_match(table: tuple[np.ndarray, ...], query: tuple[np.ndarray, ...]) -> np.ndarray:
    """Per query key tuple: the first table row with that key, -1 where there is none.
    Keys packed into one int64 where their ranges allow, then looked up in a table of
    all keys where that is small, else by binary search in the sorted table rows (queries
    are often many more than table rows)."""
    n = len(table[0])
    packed = _pack(table, query) if n and len(query[0]) else None
    if packed is not None:
        keys, wanted, capacity = packed
        if capacity <= 4 * (n + wanted.size):
            first = np.full(capacity, n)
            np.minimum.at(first, keys, np.arange(n))
            found = first[wanted]
            return np.where(found < n, found, -1)
        order = np.argsort(keys, kind="stable")
        ranked = keys[order]
        at = np.minimum(np.searchsorted(ranked, wanted), n - 1)
        return np.where(ranked[at] == wanted, order[at], -1)
    codes = _codes(*(np.concatenate([t, q]) for t, q in zip(table, query)))
    first = np.full(int(codes.max(initial=-1)) + 1, I64_MAX)
    np.minimum.at(first, codes[:n], np.arange(n))
    found = first[codes[n:]]
    return np.where(found < n, found, -1)


def _pack(table: tuple[np.ndarray, ...], query: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Table and query key tuples as int64 keys (0 .. capacity - 1) ordered like the
    tuples, and the capacity; None if their ranges do not fit. (Table and query rows
    packed as one array: half the numpy calls of packing each.)"""
    packed, capacity = None, 1
    for t, q in zip(table, query):
        both = np.concatenate((t, q)).astype(np.int64, copy=False)
        low = int(both.min())
        span = int(both.max()) - low + 1
        capacity *= span
        if capacity >= 2**62:
            return None
        both -= low
        packed = both if packed is None else packed * span + both
    n = len(table[0])
    return packed[:n], packed[n:], capacity


def _run_codes(*keys: np.ndarray) -> np.ndarray:
    """`_codes` for keys in long runs of equal tuples (rows of one file and thread)."""
    packed = _pack(keys, tuple(key[:0] for key in keys)) if keys[0].size else None
    return _codes(*keys) if packed is None else _unique_runs(packed[0])[1]


def _unique_runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for values in long runs of equal ones
    (e.g. a file's kernels of one process and device): only each run's value is sorted."""
    opens = run_starts(values).nonzero()[0]
    lengths = np.empty_like(opens)
    lengths[:-1], lengths[-1:] = opens[1:] - opens[:-1], values.size - opens[-1:]
    uniques, inverse = distinct_inverse(values[opens])
    return uniques, inverse.repeat(lengths)


def _take(values: np.ndarray, index: np.ndarray, fill) -> np.ndarray:
    """values[index], ``fill`` where index is -1."""
    if values.size == 0:
        return np.full(index.shape, fill, dtype=values.dtype)
    return np.where(index >= 0, values[index.clip(0, None)], fill)


def _columns(files: list[File], part: str, names: tuple[str, ...], times: tuple[str, ...] = ()) -> Columns:
    """One table of every file's rows as named columns, with the file's index in a
    ``file`` column and the ``times`` columns moved to UTC epoch ns."""
    arrays = [getattr(export, part) for export in files]
    data = np.concatenate([array.T for array in arrays], axis=1)  # (column, row): each column contiguous
    out = dict(zip(names, data))
    out["file"] = np.repeat(np.arange(len(files), dtype=np.int64), [len(a) for a in arrays])
    if times:
        shift = np.array([export.offset for export in files], np.int64)[out["file"]]
        for name in times:
            out[name] += shift
    return out


def _process(columns: Columns) -> np.ndarray:
    """(file, pid) as one int64 key (pids are 24-bit in globalPid/globalTid)."""
    return (columns["file"] << 24) | columns["pid"]


def _name_facts(names: np.ndarray, nccl: np.ndarray | None = None, steps: np.ndarray | None = None) -> Columns:
    """What each NVTX name says (op code, group bracket step, communicator init or
    creation, step number): worked out once per distinct name (few), then spread over
    the rows (many) by their name codes. Only what its rows need is worked out (NCCL
    facts where ``nccl``, step numbers where ``steps``; default: all), the rest says
    nothing, as does a missing name (a dangling string id)."""
    texts = [name if isinstance(name, str) else None for name in names.tolist()]
    everything = [True] * len(texts)
    wanted = zip(texts, everything if nccl is None else nccl.tolist(), everything if steps is None else steps.tolist())
    facts = [(*(_nccl_facts(name) if is_nccl else _NO_NCCL_FACTS), _step_number(name) if is_step else -1)
             for name, is_nccl, is_step in wanted]
    table = np.array(facts, np.int64).reshape(len(facts), 5)
    return {"op": table[:, 0], "delta": table[:, 1], "init": table[:, 2] == 1, "creates": table[:, 3] == 1, "number": table[:, 4]}


_NO_NCCL_FACTS = (-1, 0, False, False)


def _nccl_facts(name: str | None) -> tuple[int, int, bool, bool]:
    """(op code, group bracket step, communicator init, communicator creation) of an NCCL range's name."""
    return _OP_CODE.get(ops.from_nccl_api(name), -1), _group_step(name), _is_comm_init(name), _creates_comm(name)


# ---------------------------------------------------------------- a batch: rows


def _kernel_names(files: list[File], kernels: Columns) -> tuple[np.ndarray, np.ndarray]:
    """(distinct names, name of each kernel as an index into them); each file's name
    ids resolved through its own StringIds rows."""
    file = np.array([i for i, export in enumerate(files) for _ in export.kernel_names], np.int64)
    ids = np.array([key for export in files for key, _ in export.kernel_names], np.int64)
    values = [value for export in files for _, value in export.kernel_names]
    codes, names = factorize([*(value or "<unnamed>" for value in values), "<unnamed>"])
    at = _first_match((file, ids), (kernels["file"], kernels["name"]))  # -1: the last label
    # An export whose StringIds lacks its kernels' names (emptied, cut) had its NCCL kernels
    # read as no NCCL's: a digest without collectives, unsaid.
    unnamed = np.array([not value for value in values] + [True])[at]
    if unnamed.any():
        _warn_per_file(files, kernels["file"], unnamed, "{} of {} kernels have no name (StringIds lacks their name "
                       "ids, or holds them empty): NCCL's among them are not seen as NCCL's")
    return np.array(names, dtype=object), codes[at]


def _nvtx(files: list[File]) -> tuple[Columns, Columns]:
    """(NCCL ranges with their payload fields, step ranges) of all files; names are
    replaced by what they say (`_name_facts`)."""
    rows = _columns(files, "nvtx", ("pid", "tid", "start", "end", "length", "kind"), ("start", "end"))
    rows["process"] = _process(rows)
    kind = rows["kind"]
    named = kind == NCCL_NAMED
    if named.any():  # only for processes without an NCCL domain
        named[named] = ~np.isin(rows["process"][named], rows["process"][kind == NCCL_DOMAIN])
        for i in np.unique(rows["file"][named]).tolist():
            # Capture started after NCCL created its domain (pitfall 5): fall back on names.
            pids = ", ".join(str(p) for p in np.unique(rows["pid"][named & (rows["file"] == i)]).tolist())
            files[i].warn(f"no NVTX domain named NCCL for process {pids}; took ranges named nccl* in non-default domains as NCCL's")
    is_nccl, is_step = (kind == NCCL_RANGE) | named, kind == OTHER_RANGE
    codes, distinct = factorize(chain.from_iterable(export.nvtx_names for export in files))
    wanted = np.zeros((2, len(distinct)), bool)
    wanted[0, codes[is_nccl]] = wanted[1, codes[is_step]] = True  # names of NCCL ranges, of step ranges
    facts = _name_facts(np.array(distinct, dtype=object), *wanted)
    rows["blob_at"] = np.cumsum(rows["length"]) - rows["length"]  # each row's blob in all blobs joined
    nccl = {key: rows[key][is_nccl] for key in ("file", "tid", "start", "end", "process", "length", "blob_at")}
    nccl.update({key: facts[key][codes[is_nccl]] for key in ("op", "delta", "init", "creates")})
    blobs = filter(None, chain.from_iterable(export.nvtx_blobs for export in files))  # SQL gives NCCL rows' only
    data = np.frombuffer(b"".join([*blobs, bytes(8)]), np.uint8)  # padded: every read takes 8 bytes
    nccl.update(_decode_payloads(files, nccl["file"], data, nccl["blob_at"], nccl["length"]))
    steps = {key: rows[key][is_step] for key in ("process", "start", "end")}
    steps["number"] = facts["number"][codes[is_step]]
    return nccl, steps


def _decode_payloads(files: list[File], file: np.ndarray, data: np.ndarray, blob_at: np.ndarray, lengths: np.ndarray) -> Columns:
    """Payload fields by entry name (each file's schemas), vectorised over all blobs (of
    ``lengths`` bytes at ``blob_at`` in ``data``): per field a value column and a
    ``<field>_na`` mask (True where absent)."""
    values = np.zeros((len(PAYLOAD_FIELDS), len(lengths)), np.int64)  # (field, blob)
    absent = np.ones(values.shape, bool)
    out: Columns = {}
    for i, column in enumerate(PAYLOAD_FIELDS.values()):
        out[column], out[f"{column}_na"] = values[i], absent[i]
    index = np.flatnonzero(lengths >= _BLOB_HEADER)
    # Exports of one NCCL version carry the same schema entries: each distinct list is
    # worked out once, blobs are keyed by (their file's list, schema id).
    lists: dict[tuple, int] = {}
    list_of = np.array([lists.setdefault(tuple(export.payload_entries), len(lists)) for export in files], np.int64)
    if not all(export.payload_entries for export in files):
        described = np.array([bool(export.payload_entries) for export in files])
        for i in np.unique(file[index][~described[file[index]]]).tolist():
            files[i].warn("NVTX payload blobs present but no NCCL payload schemas to decode them")
    entries = [(i, *entry) for known, i in lists.items() for entry in known]
    if not index.size or not entries:
        return out
    # A few dozen schema entries, not events: worked out in Python, then as arrays.
    e_list, e_name, e_schema, e_offset, e_type = zip(*entries)
    layout = [_ENTRY_TYPES.get(kind) or (_ENUM_TYPE if kind >= 2**24 else (0, False)) for kind in e_type]  # (bytes, signed)
    e_size, e_signed = np.array([size for size, _ in layout], np.int64), np.array([sign for _, sign in layout], bool)
    # An offset before the payload, or past any blob, describes no field: read, it indexed
    # before the blobs (an IndexError traceback), and near 2**63 its end wrapped round.
    e_offset = np.array(e_offset, np.int64)
    stray = (e_offset < 0) | (e_offset > _MAX_PAYLOAD_OFFSET)
    e_offset = np.where(stray, 0, e_offset) + _BLOB_HEADER
    field = np.where(stray, -1, np.array([_FIELD_INDEX.get(name, -1) for name in e_name], np.int64))
    if stray.any():  # the usual schema has none: np.isin's setup spared
        for i in np.flatnonzero(np.isin(list_of, np.array(e_list, np.int64)[stray])).tolist():
            files[i].warn("NCCL payload schema offsets out of range (a corrupt schema?): those fields read as absent")
    lengths, file, base = lengths[index], file[index], blob_at[index]
    schema = _read_ints(data, base + 8, np.full(index.size, 8), np.zeros(index.size, bool))
    # (list, schema id) coded once for entries and blobs alike; then a table from
    # (field, code) to that field's first entry, and every field of every blob read at once.
    n_entries = len(entries)
    keys = _codes(np.concatenate([np.array(e_list, np.int64), list_of[file]]), np.concatenate([np.array(e_schema, np.int64), schema]))
    e_key, key = keys[:n_entries], keys[n_entries:]
    wanted = np.flatnonzero(field >= 0)
    width = int(keys.max()) + 1
    first = np.full(len(_FIELD_INDEX) * width, n_entries)
    np.minimum.at(first, field[wanted] * width + e_key[wanted], wanted)
    table = first.reshape(len(_FIELD_INDEX), width)  # (field, code) -> entry
    pick = np.where(table < n_entries, table, 0)
    size = np.where(table < n_entries, e_size[pick], 0)
    end = np.where(size > 0, e_offset[pick] + size, I64_MAX)  # absent: beyond any blob
    ok = end[:, key] <= lengths  # (field, blob)
    at = np.nonzero(ok)  # a blob's schema holds a few of the fields: read only those
    entry = pick[at[0], key[at[1]]]
    found = np.zeros(ok.shape, np.int64)
    found[at] = _read_ints(data, base[at[1]] + e_offset[entry], e_size[entry], e_signed[entry])
    # A corrupt blob or schema reads garbage: a rank or count that neither NCCL nor the
    # digest's int32 columns hold is absent (an ArrowInvalid traceback, once).
    wild = ok & ((found < _PAYLOAD_BOUNDS[:, :1]) | (found > _PAYLOAD_BOUNDS[:, 1:]))
    if wild.any():  # a good payload has none: np.unique's setup spared
        for i in np.unique(file[wild.any(axis=0)]).tolist():
            files[i].warn("NCCL payload ranks or counts out of range (a corrupt payload or schema?): read as absent")
    # Every NCCL range carrying a payload (the usual case): a copy rather than a scatter.
    blobs = slice(None) if index.size == values.shape[1] else index
    values[:, blobs], absent[:, blobs] = found, ~ok | wild
    return out


def _read_ints(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, signed: np.ndarray) -> np.ndarray:
    """Little-endian integers of per-row width (1, 2, 4, 8 bytes) at byte positions
    (each at most len(data) - 8: pad the data)."""
    sizes = np.asarray(sizes, np.int64)
    # Item i: the 8 bytes from position i as one little-endian uint64 (a view with a one-byte
    # stride; taken as whole items, a third of the cost of gathering rows of 8 bytes).
    raw = np.ndarray((data.size - 7,), "<u8", data, strides=(1,))[positions]
    short = sizes < 8
    if not short.any():
        return raw.view(np.int64)
    bits = (np.where(short, sizes, 0) * 8).astype(np.uint64)  # 0 for full width: no mask, no sign fix
    unsigned = np.where(short, raw & ((np.uint64(1) << bits) - np.uint64(1)), raw)
    sign_bit = np.uint64(1) << np.maximum(bits, np.uint64(1)) - np.uint64(1)
    negative = signed & short & ((unsigned & sign_bit) != 0)
    as_int = unsigned.view(np.int64)
    return np.where(negative, as_int - (np.int64(1) << bits.astype(np.int64)), as_int)


# ---------------------------------------------------------------- a batch: digests


def _build(files: list[File], rank_from: str | None) -> pa.Table:
    """Digest rows of a batch of exports: every rank (file, process, device) at once."""
    kernels = _columns(files, "kernels", ("start", "end", "pid", "device", "correlation", "name", "stream"),
                       ("start", "end"))
    _clip_inverted(files, kernels)
    names, kernels["name"] = _kernel_names(files, kernels)
    comm_name = ops.is_comm_kernel(names)  # each distinct name once
    is_comm = comm_name[kernels["name"]]
    unit_keys, unit = _unique_runs(_process(kernels) * MAX_DEVICE + kernels["device"])
    nccl, steps = _nvtx(files)
    has_comm = np.bincount(unit[is_comm], minlength=unit_keys.size) > 0
    stray = _stray_units(files, unit_keys, has_comm, in_sorted(unit_keys // MAX_DEVICE, distinct(nccl["process"])))
    if stray is not None:
        keep = ~stray[unit]
        kernels, is_comm = {key: values[keep] for key, values in kernels.items()}, is_comm[keep]
        unit_keys, unit = _unique_runs(_process(kernels) * MAX_DEVICE + kernels["device"])
    units = {"process": unit_keys // MAX_DEVICE, "device": unit_keys % MAX_DEVICE}
    units["file"], units["pid"] = units["process"] >> 24, units["process"] & 0xFFFFFF
    n = unit_keys.size
    scalars, compute, busy = _activity(files, kernels, is_comm, unit, unit_keys)
    collectives, comm_ids = _collectives(files, kernels, is_comm, unit, names, nccl)
    steps = _steps(steps)
    facts = _collective_facts(collectives, compute, busy, scalars["window_start_ns"], steps)
    summary = _kernel_summary(unit, kernels["name"], kernels["end"] - kernels["start"], comm_name)
    identity = _identities(files, units, nccl, rank_from)
    parts = {
        "collectives": _collective_part(collectives, comm_ids, facts, n),
        "kernels": _kernel_part(summary, names, n),
        "steps": _step_part(steps, units["process"]),
        "communicators": _communicator_part(collectives, comm_ids, n),
    }
    return _table(files, units, identity, scalars, parts)


def _stray_units(files: list[File], unit_keys: np.ndarray, has_comm: np.ndarray, calls_nccl: np.ndarray) -> np.ndarray | None:
    """Per unit (process, device; sorted): True where it ran no NCCL kernel while its process
    did on another GPU (work on cuda:0 before ``torch.cuda.set_device``), or while another
    process of its export did and its own process made no NCCL call (``calls_nccl``: nsys
    traces the rank's children, such as a compile worker autotuning kernels). Such a unit
    is no rank: taken for one, it made a one-rank export one of several numbered by pid,
    losing the rank its environment gives. A process that called NCCL but whose kernels
    never ended in the window stays a rank (hung?). None where there is none."""
    def spread(keys: np.ndarray) -> np.ndarray:  # has_comm of any unit with the same key, per unit
        opens = np.flatnonzero(run_starts(keys))
        return np.repeat(np.maximum.reduceat(has_comm, opens), np.diff(np.append(opens, keys.size)))

    process = unit_keys // MAX_DEVICE
    process_comm = spread(process)
    stray = (process_comm | (spread(process >> 24) & ~calls_nccl)) & ~has_comm
    if not stray.any():
        return None
    for key, own in zip(unit_keys[stray].tolist(), process_comm[stray].tolist()):
        export, pid, device = files[key // MAX_DEVICE >> 24], key // MAX_DEVICE & 0xFFFFFF, key % MAX_DEVICE
        if own:
            export.warn(f"pid {pid} ran kernels on cuda:{device} but its NCCL kernels on another GPU: those left out "
                        "(work before torch.cuda.set_device?)")
        else:
            export.warn(f"pid {pid} ran kernels on cuda:{device} but made no NCCL call, where other processes of the "
                        "export did: left out, as no rank (a helper process?)")
    return stray


def _activity(files: list[File], kernels: Columns, is_comm: np.ndarray, unit: np.ndarray,
              unit_keys: np.ndarray) -> tuple[Columns, intervals.Union, intervals.Union]:
    """Per rank: capture window, GPU busy time (kernels and copies) and its compute /
    communication split; with the compute and busy unions the collectives' facts need."""
    n = unit_keys.size
    order = intervals.sort_order(kernels["start"], unit)  # one sort for the three kernel unions
    start, end, group, comm = kernels["start"][order], kernels["end"][order], unit[order], is_comm[order]
    opens = np.flatnonzero(run_starts(group))  # every rank has kernels: one run each, in rank order
    window_start, window_end = start[opens], np.maximum.reduceat(end, opens)
    compute = intervals.merge(start[~comm], end[~comm], group[~comm], ordered=True)
    either = intervals.merge(start, end, group, ordered=True)
    compute_ns = intervals.length_by_group(compute, n)
    comm_ns = intervals.length_by_group(intervals.merge(start[comm], end[comm], group[comm], ordered=True), n)
    busy, either_ns = either, intervals.length_by_group(either, n)
    busy_ns = either_ns
    if any(len(export.copies) for export in files):  # many exports have none: skip the stage
        copies = _columns(files, "copies", ("start", "end", "pid", "device"), ("start", "end"))
        copy_keys = _process(copies) * MAX_DEVICE + copies["device"]
        copy_unit = np.clip(np.searchsorted(unit_keys, copy_keys), 0, n - 1)
        mine = unit_keys[copy_unit] == copy_keys  # copies of processes/devices without kernels: no rank
        if mine.any():
            np.minimum.at(window_start, copy_unit[mine], copies["start"][mine])
            np.maximum.at(window_end, copy_unit[mine], copies["end"][mine])
            busy = intervals.merge(np.concatenate([kernels["start"], copies["start"][mine]]),
                                   np.concatenate([kernels["end"], copies["end"][mine]]), np.concatenate([unit, copy_unit[mine]]))
            busy_ns = intervals.length_by_group(busy, n)
    scalars = {
        "window_start_ns": window_start, "window_end_ns": window_end, "gpu_busy_ns": busy_ns,
        "compute_only_ns": either_ns - comm_ns, "comm_only_ns": either_ns - compute_ns,
        "overlap_ns": compute_ns + comm_ns - either_ns,
    }
    return scalars, compute, busy


def _collectives(files: list[File], kernels: Columns, is_comm: np.ndarray, unit: np.ndarray,
                 names: np.ndarray, nccl: Columns) -> tuple[Columns, list[str]]:
    """One row per NCCL kernel, with the API calls it serves where traced, sorted by rank
    (unit) then start; ``seq`` numbers each communicator's collectives in call order.
    With the comm_ids, which the ``comm_id`` column indexes (``op`` indexes `_OPS`)."""
    rows = np.flatnonzero(is_comm)
    out = {key: kernels[key][rows] for key in ("file", "pid", "device", "start", "end", "correlation", "name", "stream")}
    out["unit"], out["process"] = unit[rows], _process(out)
    launches = _columns(files, "launches", ("correlation", "pid", "tid", "launch_ns"), ("launch_ns",))
    threads = _run_codes(np.concatenate([launches["file"], nccl["file"]]), np.concatenate([launches["tid"], nccl["tid"]]))
    launches["thread"], nccl["thread"] = threads[: launches["tid"].size], threads[launches["tid"].size :]
    launch = _first_match((launches["file"], launches["pid"], launches["correlation"]),
                          (out["file"], out["pid"], out["correlation"]))
    linked = launch >= 0
    launch_ns = _take(launches["launch_ns"], launch, 0)
    served = _served(nccl, np.flatnonzero(linked), _take(launches["thread"], launch, -1)[linked], launch_ns[linked])
    _warn_kernelless_calls(files, nccl, served["row"])
    set_up = _set_up_on(nccl)
    out.update(_summarise_calls(_on_their_devices(served, nccl, out["device"], set_up), nccl, out["device"], set_up))
    if out["comms_mixed"].any():
        _warn_per_file(files, out["file"], out["comms_mixed"], "{} of {} NCCL kernels were launched by an ncclGroup "
                       "spanning several communicators: each is given the first call's communicator and no bytes "
                       "(NCCL launches a kernel per communicator; the export does not say which calls a kernel serves)")
    if out["shared"].any():
        _warn_per_file(files, out["file"], out["shared"], "{} of {} NCCL kernels share their ncclGroup's calls with "
                       "other kernels of the group (NCCL launches one per GPU and communicator, and splits a large "
                       "group over several): each is given the calls' op and communicator but no bytes, as the export "
                       "does not say which calls each kernel ran")
    unlinked = out["op"] < 0
    if unlinked.any():
        _warn_per_file(files, out["file"], unlinked, "{} of {} NCCL kernels have no NCCL API range around their launch "
                       "(NVTX not traced or cut by the capture window); their op is guessed from the kernel name")
        hint = np.array([_OP_CODE[ops.from_kernel_name(name) or ops.UNKNOWN] for name in names.tolist()], np.int64)
        out["op"] = np.where(unlinked, hint[out["name"]], out["op"])
    out["cpu_call_ns"] = np.where(out["cpu_call_ns_na"], launch_ns, out["cpu_call_ns"])
    out["cpu_call_ns_na"] &= ~linked
    _on_their_streams(files, out)
    comm_ids, out["comm_id"], out["comm_size"], out["comm_size_na"] = _comm_ids(files, out, nccl)
    out["stream_na"] = ~out["comm_na"]  # a named communicator needs no stream to tell it apart
    order = np.lexsort((out["start"], out["unit"]))
    out = {key: out[key][order] for key in _COLLECTIVE_COLUMNS}
    out["seq"] = Groups(out["unit"], out["comm_id"]).cumcount()
    return out, comm_ids


def _on_their_streams(files: list[File], out: Columns) -> None:
    """Kernels that name no communicator, on a stream (of their device) whose other kernels
    all name one: that one's (``out`` in place). A capture window that starts mid-run holds
    kernels whose API range was pushed before it, so carries no payload; and PyTorch gives
    each process group an NCCL stream of its own (lines.py). They were grouped apart by op,
    as `inferred:<op>` calls of a few edge ranks, and each such communicator's calls counted
    one short."""
    untraced = out["comm_na"] & (out["stream"] >= 0)
    traced = ~out["comm_na"] & (out["stream"] >= 0)
    if not untraced.any() or not traced.any():
        return
    # A rank's device's streams: CUDA numbers streams per device context, not per process.
    lines = Groups(out["unit"][traced], out["stream"][traced])
    comm = out["comm"][traced]
    one = lines.min(comm) == lines.max(comm)
    at = _first_match(tuple(lines.keys), (out["unit"][untraced], out["stream"][untraced]))
    taken = np.zeros_like(untraced)
    taken[untraced] = (at >= 0) & _take(one, at, False)
    if taken.any():
        out["comm"][taken] = lines.min(comm)[at[taken[untraced]]]
        out["comm_na"] = out["comm_na"] & ~taken
        _warn_per_file(files, out["file"], taken, "{} of {} NCCL kernels that name no communicator are taken as "
                       "the one every other NCCL kernel on their stream names (a group's calls run on a stream of "
                       "its own; a window that starts mid-run cuts a kernel's API range, and its payload, off)")


def _warn_kernelless_calls(files: list[File], nccl: Columns, served: np.ndarray) -> None:
    """Say where NCCL API calls (op ranges) launched no kernel between calls of their process that
    did: a copy-engine collective (nsys-export.md §3: MEMCPY/MEMSET, no kernel), a call captured
    into a CUDA graph (its kernels replay under cudaGraphLaunch), or a call with nothing to move.
    Such calls are in no collective row. (Calls before the first or after the last served call are
    the window's edges: a group cut open, kernels after the window.)"""
    call = nccl["op"] >= 0
    if not call.any() or not served.size:
        return
    kernelless = call.copy()
    kernelless[served] = False
    if not kernelless.any():  # the usual case: every call launched one
        return
    per = Groups(nccl["process"][served])
    first, last = per.min(nccl["start"][served]), per.max(nccl["start"][served])
    at = _first_match((per.keys[0],), (nccl["process"],))
    kernelless &= (at >= 0) & (_take(first, at, I64_MAX) < nccl["start"]) & (nccl["start"] < _take(last, at, I64_MIN))
    if kernelless.any():
        _warn_per_file(files, nccl["file"][call], kernelless[call], "{} of {} NCCL API calls launched no NCCL kernel "
                       "(copy-engine collectives, calls captured into a CUDA graph, or calls with nothing to move?): "
                       "they are in no collective")


# What the digest and the collectives' facts take from `_collectives`.
_COLLECTIVE_COLUMNS = ("unit", "process", "start", "end", "cpu_call_ns", "cpu_call_ns_na", "comm_id", "op", "bytes", "bytes_na",
                       "peer", "peer_na", "comm_size", "comm_size_na", "stream", "stream_na")


def _clip_inverted(files: list[File], kernels: Columns) -> None:
    """Kernels that end before they start (a damaged export) made zero-length, with a
    warning: as they were, each took its length off the rank's GPU busy time and put a
    negative time in its top kernels, unsaid."""
    inverted = kernels["end"] < kernels["start"]
    if inverted.any():
        kernels["end"] = np.maximum(kernels["end"], kernels["start"])
        _warn_per_file(files, kernels["file"], inverted, "{} of {} kernels end before they start (a damaged "
                       "export): each counts no GPU time")


def _warn_per_file(files: list[File], file: np.ndarray, flagged: np.ndarray, template: str) -> None:
    """Warn each file with flagged rows: template.format(flagged, of all its rows)."""
    counts = np.bincount(file[flagged], minlength=len(files))
    totals = np.bincount(file, minlength=len(files))
    for i in np.flatnonzero(counts).tolist():
        files[i].warn(template.format(int(counts[i]), int(totals[i])))


def _group_calls(nccl: Mapping[str, np.ndarray]) -> tuple[Columns, Columns]:
    """(calls, launchers): API calls keyed by ``call_group``; the ranges kernels launch in,
    sorted by thread then start (columns as numpy arrays; ``call_group`` never decreases
    in that order).

    An ungrouped call launches inside its own range; grouped calls (between the outermost
    ncclGroupStart and its ncclGroupEnd on one thread) launch inside the ncclGroupEnd.
    """
    order = np.lexsort((np.asarray(nccl["start"], np.int64), np.asarray(nccl["tid"], np.int64)))
    frame = {key: np.asarray(values)[order] for key, values in nccl.items()}
    delta = frame["delta"]
    is_call = frame["op"] >= 0
    if not delta.any():  # no group brackets: every call is its own group and launches its kernels
        frame["call_group"] = np.cumsum(is_call)
        calls = {key: values[is_call] for key, values in frame.items()}
        return calls, calls
    # Per-thread running depth, as whole-array numpy: offsets restart each thread's sums.
    tid = frame["tid"].astype(np.int64)
    first = run_starts(tid)
    thread = np.cumsum(first) - 1
    total = np.cumsum(delta)
    running = total - (total - delta)[first][thread]
    # An ncclGroupEnd whose start was before the capture window drives the count below 0;
    # the floor is the per-thread running minimum (threads shifted apart so none leaks).
    spread = np.int64(tid.size + 1) * thread
    floor = np.minimum.accumulate(np.minimum(running, 0) - spread) + spread
    depth = running - floor
    before = np.where(first, 0, np.concatenate(([0], depth[:-1])))
    grouped = is_call & (depth > 0)
    closes = (delta == -1) & (before >= 1) & (depth == 0)
    # Call groups numbered in order: each outermost group start opens one (its calls and
    # its closing ncclGroupEnd share it), each ungrouped call is one of its own.
    frame["call_group"] = np.cumsum(((delta == 1) & (before == 0)) | (is_call & ~grouped))
    launches = (is_call & ~grouped) | closes
    return {key: values[is_call] for key, values in frame.items()}, {key: values[launches] for key, values in frame.items()}


def _group_step(name: str | None) -> int:
    """+1 for ncclGroupStart, -1 for ncclGroupEnd, else 0."""
    lower = (name or "").lower()
    return 1 if lower == "ncclgroupstart" else -1 if lower == "ncclgroupend" else 0


def _served(nccl: Columns, kernel: np.ndarray, thread: np.ndarray, launch_ns: np.ndarray) -> Columns:
    """(kernel, start, op, row) of every API call each launched kernel serves: the calls
    of the range on its launching thread that encloses the launch."""
    calls, launchers = _group_calls({"tid": nccl["thread"], "start": nccl["start"], "end": nccl["end"],
                                     "delta": nccl["delta"], "op": nccl["op"], "row": np.arange(nccl["start"].size)})
    tid, start, end, group = (launchers[c].astype(np.int64, copy=False) for c in ("tid", "start", "end", "call_group"))
    at = intervals.last_at_or_before(tid, start, thread, launch_ns)
    hit = at >= 0
    hit[hit] = end[at[hit]] >= launch_ns[hit]
    wanted = group[at[hit]]
    low = np.searchsorted(calls["call_group"], wanted, side="left")  # calls are in call_group order
    counts = np.searchsorted(calls["call_group"], wanted, side="right") - low
    served = _expand(low, counts)
    return {"kernel": np.repeat(kernel[hit], counts), "start": calls["start"].astype(np.int64, copy=False)[served],
            "op": calls["op"][served], "row": calls["row"][served]}


# (process, communicator, GPU) triples, as three columns
_SetUp = tuple[np.ndarray, np.ndarray, np.ndarray]


def _set_up_on(nccl: Columns) -> _SetUp:
    """The distinct (process, communicator, GPU) of the processes' CommInitRank and CommSplit
    payloads: the GPUs each process set each communicator up on."""
    creates = nccl["creates"] & ~nccl["cuda_device_na"] & ~nccl["comm_na"]
    # Groups' keys are np.unique(axis=1)'s columns, at a tenth of its cost
    process, comm, gpu = Groups(nccl["process"][creates], nccl["comm"][creates], nccl["cuda_device"][creates]).keys
    return process, comm, gpu


def _on_their_devices(served: Columns, nccl: Columns, device: np.ndarray,
                      set_up: _SetUp) -> Columns:
    """``served`` less the calls on a communicator of other GPUs than their kernel's (its
    ``device``, indexed by kernel): one thread may drive several GPUs' communicators in one
    group, and each GPU's kernel serves its own communicators' calls. A communicator's GPUs
    are those its process's CommInitRank or CommSplit payloads name: one process may be
    several members of one communicator (ncclCommInitAll gives every GPU one unique id, so
    one communicator id), and then its calls are each of those GPUs' kernels'. Calls on
    communicators of no traced GPU stay with every kernel of their group. ``set_up``:
    `_set_up_on`."""
    row, kernel_device = served["row"], device[served["kernel"]]
    if not set_up[0].size or _on_their_own_gpus(set_up, nccl["process"][row], kernel_device):
        return served
    comm = (nccl["process"][row], nccl["comm"][row])
    created = _first_match(set_up[:2], comm) >= 0
    here = _first_match(set_up, (*comm, kernel_device)) >= 0
    elsewhere = created & ~nccl["comm_na"][row] & ~here
    return {key: values[~elsewhere] for key, values in served.items()}


def _on_their_own_gpus(set_up: _SetUp, process: np.ndarray, device: np.ndarray) -> bool:
    """Whether each process set its communicators up on one GPU (``set_up``: `_set_up_on`,
    sorted), the one the kernel of each of its calls (``process``, ``device``: per served
    call) ran on: then no call is another GPU's (a process per GPU, the usual case), known
    without `_on_their_devices`' two lookups."""
    processes, gpus = set_up[0], set_up[2]
    if (gpus[1:] != gpus[:-1])[processes[1:] == processes[:-1]].any():
        return False
    at = np.minimum(processes.searchsorted(process), processes.size - 1)
    return bool(((processes[at] != process) | (gpus[at] == device)).all())


def _summarise_calls(served: Columns, nccl: Columns, device: np.ndarray,
                     set_up: _SetUp) -> Columns:
    """Per kernel (``device``: each one's GPU; ``set_up``: `_set_up_on`): op (send+recv ->
    sendrecv), communicator, bytes, peer, first call time; each with a ``_na`` mask. Ops are
    codes (`_OPS`); kernels serving no call get -1.

    Bytes are a kernel's only where the trace ties its calls to it alone: a call that
    several kernels serve (a group split over kernels), or a kernel serving calls on several
    communicators (which NCCL gives a kernel each), leave its bytes unknown (``shared``,
    ``comms_mixed``) rather than counted once per kernel; but for a group of one call per
    GPU (`_one_call_per_gpu`)."""
    n = device.size
    out: Columns = {"op": np.full(n, -1, np.int64), "comms_mixed": np.zeros(n, bool), "shared": np.zeros(n, bool)}
    for column in ("comm", "bytes", "peer", "nranks", "cpu_call_ns"):
        out[column], out[f"{column}_na"] = np.zeros(n, np.int64), np.ones(n, bool)
    if not served["kernel"].size:
        return out
    order = np.lexsort((served["start"], served["kernel"]))
    kernel, row, op = served["kernel"][order], served["row"][order], served["op"][order]
    first = np.flatnonzero(run_starts(kernel))
    at, lead = kernel[first], row[first]
    one_op = np.minimum.reduceat(op, first) == np.maximum.reduceat(op, first)
    all_p2p = np.minimum.reduceat(_P2P[op], first)
    out["op"][at] = np.where(one_op | ~all_p2p, op[first], _OP_CODE[ops.SENDRECV])
    known = ~nccl["bytes_na"][row]
    out["bytes"][at] = np.add.reduceat(np.where(known, nccl["bytes"][row], 0), first)
    out["bytes_na"][at] = ~np.maximum.reduceat(known, first)
    servers = np.bincount(row, minlength=nccl["bytes"].size)  # kernels serving each call
    # A call per kernel and a kernel per call (no groups, the usual case): nothing shared, and
    # each kernel's bytes are its call's already, whatever `_one_call_per_gpu` would find.
    if first.size < kernel.size or servers.max() > 1:
        per_gpu = _one_call_per_gpu(served, nccl, device, servers, set_up)[order][first]
        out["shared"][at] = np.maximum.reduceat(servers[row] > 1, first) & ~per_gpu
        out["bytes"][at] = np.where(per_gpu, nccl["bytes"][lead], out["bytes"][at])
    known = ~nccl["peer_na"][row]
    low, high = _known_range(nccl["peer"][row], known, first)
    single = np.minimum.reduceat(known, first) & (low == high)
    out["peer"][at], out["peer_na"][at] = np.where(single, low, 0), ~single
    for column in ("comm", "nranks"):
        out[column][at], out[f"{column}_na"][at] = nccl[column][lead], nccl[f"{column}_na"][lead]
    # A group over several communicators launches kernels the export ties to no one call of it
    # (reference/nccl-in-traces.md says nothing of which serves which): said, not guessed.
    known = ~nccl["comm_na"][row]
    low, high = _known_range(nccl["comm"][row], known, first)
    out["comms_mixed"][at] = np.maximum.reduceat(known, first) & (low != high)
    out["bytes_na"] |= out["shared"] | out["comms_mixed"]
    out["cpu_call_ns"][at] = served["start"][order][first]  # sorted: the first call
    out["cpu_call_ns_na"][at] = False
    return out


def _one_call_per_gpu(served: Columns, nccl: Columns, device: np.ndarray, servers: np.ndarray,
                      set_up: _SetUp) -> np.ndarray:
    """Per served (kernel, call): whether the kernel's group is one call per GPU, each GPU's
    kernel serving them all: one thread driving several GPUs (nccl-tests -g N, ncclCommInitAll)
    makes one call per GPU on one communicator, each GPU's kernel runs its own, and which is
    whose the export does not say; but where the calls are alike (op, communicator, bytes)
    every kernel's is that size. A group split over kernels of one GPU is not such. One call
    per GPU: as many as the group's kernels, or as the GPUs the process set the communicator
    up on (a window's edge may have cut off one GPU's kernel)."""
    kernel, row = served["kernel"], served["row"]
    served_row, _ = Groups(row, device[kernel]).keys  # the distinct (call, GPU) pairs
    on_gpus = np.bincount(served_row, minlength=servers.size) == servers  # each server on a GPU of its own
    calls = Groups(kernel)
    alike = ~nccl["bytes_na"][row] & ~nccl["comm_na"][row]
    for column in ("op", "comm", "bytes"):
        alike &= ~calls.varies(nccl[column][row])[calls.id]
    count = calls.size[calls.id]
    one_each = (servers[row] == count) | (_gpus_set_up(nccl, row, set_up) == count)
    per_kernel = calls.all(on_gpus[row] & alike & one_each)
    return per_kernel[calls.id]


def _gpus_set_up(nccl: Columns, row: np.ndarray, set_up: _SetUp) -> np.ndarray:
    """Per call (``row``), how many GPUs its process set its communicator up on (`_set_up_on`;
    0 where no payload says)."""
    if not set_up[0].size:
        return np.zeros(row.size, np.int64)
    communicators = Groups(*set_up[:2])  # its sizes: the GPUs of each (process, communicator)
    at = _first_match(tuple(communicators.keys), (nccl["process"][row], nccl["comm"][row]))
    return np.where(at >= 0, communicators.size[np.maximum(at, 0)], 0)


def _known_range(values: np.ndarray, known: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run of rows (each starting at ``first``), the least and greatest known value;
    the int64 extremes, reversed, where none is known."""
    return (np.minimum.reduceat(np.where(known, values, I64_MAX), first),
            np.maximum.reduceat(np.where(known, values, I64_MIN), first))


def _comm_ids(files: list[File], out: Columns, nccl: Columns) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """The comm_ids (from the payload, else inferred) and each kernel's as an index into
    them; with the communicator's size (NCCL nranks) and a mask where it is unknown.
    (seq is the call order within comm_id: the NCCL schemas carry no sequence field,
    and every member calls a communicator's collectives in the same order.)"""
    traced = ~out["comm_na"]
    ids, which = distinct_inverse(np.where(traced, out["comm"], 0).view(np.uint64))
    comm_ids = [f"{c:016x}" for c in ids.tolist()]
    size, size_na = _traced_sizes(out, nccl)
    if traced.all():
        return comm_ids, which, size, size_na
    _warn_per_file(files, out["file"], ~traced, "{} of {} NCCL kernels carry no communicator id "
                   "(needs NCCL >= 2.25.1 and nsys export --include-blobs=true); those collectives are grouped "
                   "by operation as 'inferred:<op>' and keep their stream, by which the analysis tells their "
                   "communicators apart where it can")
    labels, combo, inferred_size, known = _inferred_comm_ids(out, nccl)
    return (comm_ids + labels, np.where(traced, which, ids.size + combo),
            np.where(traced, size, inferred_size), np.where(traced, size_na, ~known))


def _traced_sizes(out: Columns, nccl: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel: its communicator's size from the call's payload, else from the
    process's CommInitRank or CommSplit of that communicator id; and where neither says."""
    creates = nccl["creates"] & ~nccl["nranks_na"] & ~nccl["comm_na"]
    at = _first_match((nccl["process"][creates], nccl["comm"][creates]), (out["process"], out["comm"]))
    by_id = ~out["comm_na"] & (at >= 0)
    size = np.where(out["nranks_na"], _take(nccl["nranks"][creates], at, 0), out["nranks"])
    return size, out["nranks_na"] & ~by_id


def _inferred_comm_ids(out: Columns, nccl: Columns) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """What every member of an untraced communicator agrees on: the op, and the
    communicator size when the process initialised communicators of a single size;
    as labels and each kernel's index into them, with that size and where it is known."""
    inits = nccl["init"] & ~nccl["nranks_na"]
    processes, which = distinct_inverse(nccl["process"][inits])
    low = np.full(processes.size, I64_MAX)
    high = np.full(processes.size, I64_MIN)
    np.minimum.at(low, which, nccl["nranks"][inits])
    np.maximum.at(high, which, nccl["nranks"][inits])
    at = np.clip(np.searchsorted(processes, out["process"]), 0, max(processes.size - 1, 0))
    one_size = (processes.size > 0) & (_take(processes, at, -1) == out["process"]) & (_take(low, at, 0) == _take(high, at, 1))
    size = np.where(out["nranks_na"], _take(low, at, 0), out["nranks"])
    known = ~out["nranks_na"] | one_size
    combo = _codes(out["op"], np.where(known, size, -1))
    example = np.zeros(int(combo.max(initial=-1)) + 1, np.int64)
    example[combo] = np.arange(combo.size)  # one row per distinct (op, size): format each once
    label = [f"{digest.INFERRED_COMM}{_OPS[out['op'][i]]}" + (f":n{size[i]}" if known[i] else "") for i in example.tolist()]
    return label, combo, size, known


def _is_comm_init(name: str | None) -> bool:
    return (name or "").lower().startswith("ncclcomminit")


def _creates_comm(name: str | None) -> bool:
    """CommInitRank (and Config/Scalable) or CommSplit: payloads naming a new communicator's id and size."""
    return (name or "").lower().startswith(("ncclcomminit", "ncclcommsplit"))


def _step_number(name: str | None) -> int:
    match = _STEP.match(name or "")
    return int(match.group(1)) if match else -1


def _steps(rows: Columns) -> Columns:
    """`step N` / `ProfilerStep#N` ranges per process (any domain): each step's first
    start and last end, sorted by process then step."""
    number = rows["number"]
    keep = number >= 0
    process, number = rows["process"][keep], number[keep]
    group = _codes(process, number)
    size = int(group.max(initial=-1)) + 1
    out = {"process": np.zeros(size, np.int64), "step": np.zeros(size, np.int64),
           "start": np.full(size, I64_MAX), "end": np.full(size, I64_MIN)}
    out["process"][group], out["step"][group] = process, number
    np.minimum.at(out["start"], group, rows["start"][keep])
    np.maximum.at(out["end"], group, rows["end"][keep])
    return out


def _step_of(steps: Columns, process: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step of its process whose range contains each time (host-side call time),
    as (values, mask) with the mask True where none does."""
    if steps["step"].size == 0:
        return np.zeros(times.size, np.int64), np.ones(times.size, bool)
    order = np.lexsort((steps["start"], steps["process"]))
    at = intervals.last_at_or_before(steps["process"][order], steps["start"][order], process, times)
    safe = order[np.clip(at, 0, None)]
    inside = (at >= 0) & (times < steps["end"][safe])  # half-open, as the Kineto reader takes a step
    return np.where(inside, steps["step"][safe], 0), ~inside


def _collective_facts(coll: Columns, compute: intervals.Union, busy: intervals.Union,
                      window_start: np.ndarray, steps: Columns) -> Columns:
    """Edge-computed facts per collective: compute and idle time since the rank's previous
    collective ended, compute overlapping it, and its step."""
    unit, start, end = coll["unit"], coll["start"], coll["end"]
    gap_start, _ = intervals.gaps_before(start, end, window_start[unit], unit)  # each gap ends at its start
    step, step_na = _step_of(steps, coll["process"], np.where(coll["cpu_call_ns_na"], start, coll["cpu_call_ns"]))
    # Covered length up to each gap start, start and end: one lookup per union.
    n = start.size
    on_compute = intervals.covered_until(compute, np.concatenate([gap_start, start, np.maximum(end, start)]),
                                         np.concatenate([unit, unit, unit]))
    on_busy = intervals.covered_until(busy, np.concatenate([gap_start, start]), np.concatenate([unit, unit]))
    return {
        "compute_before_ns": on_compute[n : 2 * n] - on_compute[:n],
        "idle_before_ns": (start - gap_start) - (on_busy[n:] - on_busy[:n]),
        "compute_overlap_ns": on_compute[2 * n :] - on_compute[n : 2 * n],
        "step": step, "step_na": step_na,
    }


def _kernel_summary(unit: np.ndarray, name: np.ndarray, duration: np.ndarray, comm_name: np.ndarray) -> Columns:
    """Per rank and kernel name: count and total time (int64 throughout: no float
    rounding), longest first, ties in order of first appearance."""
    groups = Groups(unit, name)
    first = groups.order[groups.starts]  # a stable sort: each group's first row comes first
    out = {"unit": groups.keys[0], "name": groups.keys[1], "count": groups.size, "total_ns": groups.sum(duration)}
    out["is_comm"] = comm_name[out["name"]]
    order = np.lexsort((first, -out["total_ns"], out["unit"]))
    return {key: values[order] for key, values in out.items()}


# ---------------------------------------------------------------- a batch: identity


def _env_int(export: File, names: tuple[str, ...]) -> tuple[str, int] | None:
    for name in names:
        value = export.env.get(name)
        if value is not None and _INTEGER.fullmatch(value.strip()):
            return name, _rank_sized(export, value, f"{name}={quoted(value)} in the captured environment")
    return None


def _rank_sized(export: File, text: str, what: str) -> int:
    """``text``, a rank or world size from the export's text (an integer's digits): it must
    fit the digest's int32. Its length first: int() refuses past 4,300 digits (a ValueError)."""
    value = int(text) if len(text.strip()) <= 12 else None
    if value is None or not _INT32_MIN <= value <= _INT32_MAX:
        raise ExportError(f"{what} is beyond any rank or world size (int32)", path=export.path)
    return value


def _rank_override(export: File, rank_from: str) -> int:
    kind, _, spec = rank_from.partition(":")
    if kind == "env" and spec:
        value = export.env.get(spec)
        if value is None:
            raise ExportError(f"--rank-from {rank_from}: {spec} is not in the captured environment", path=export.path)
        if not re.fullmatch(r"\s*-?\d+\s*", value):
            raise ExportError(f"--rank-from {rank_from}: {spec}={quoted(value)} in the captured environment is not an "
                              "integer", path=export.path)
        return _rank_sized(export, value, f"--rank-from {rank_from}: {spec}={quoted(value)}")
    if kind == "filename" and spec:
        try:
            match = re.search(spec, export.path.name)
        except re.error as exc:
            raise InputError(f"--rank-from {rank_from}: bad regular expression ({exc})") from None
        text = None if match is None else (match.group(1) if match.re.groups else match.group(0))
        if text is None or not re.fullmatch(r"-?\d+", text):
            raise ExportError(f"--rank-from {rank_from}: no rank number in the file name", path=export.path)
        return _rank_sized(export, text, f"--rank-from {rank_from}: {text}")
    raise InputError(f"--rank-from {rank_from!r}: expected env:VAR or filename:REGEX")


def _identities(files: list[File], units: Columns, nccl: Columns, rank_from: str | None) -> Columns:
    """Rank, local rank, world size (value and ``_na`` mask) and rank_source per unit
    (filled as Python lists: a few values per file, numpy's per-item cost would dominate)."""
    n = units["file"].size
    rank, source = [0] * n, [""] * n
    local, local_na, world_size, world_na = [0] * n, [True] * n, [0] * n, [True] * n
    bounds = np.searchsorted(units["file"], np.arange(len(files) + 1)).tolist()
    # A file of several ranks (torchrun under one nsys) holds its launcher's environment, whose
    # world size and rank count tasks or nodes (srun, a PyTorchJob), not these ranks.
    env = [tuple(_env_int(e, names) for names in (WORLD_SIZE_ENV, RANK_ENV, LOCAL_RANK_ENV)) if hi - lo == 1
           else (None, None, None) for e, lo, hi in zip(files, bounds[:-1], bounds[1:])]
    # Payload ranks are only needed where the environment does not settle the rank.
    needs = np.array([not (world and (rank_from is not None or (hi - lo == 1 and rank_env)))
                      for (world, rank_env, _), lo, hi in zip(env, bounds[:-1], bounds[1:])])
    payload = _payload_ranks(units, nccl, env, needs[units["file"]]) if needs.any() else None
    for i, export in enumerate(files):
        lo, hi = bounds[i], bounds[i + 1]
        world, rank_env, local_env = env[i]
        single = hi - lo == 1
        if single and local_env:
            local[lo], local_na[lo] = local_env[1], False
        if world:
            world_size[lo:hi], world_na[lo:hi] = [world[1]] * (hi - lo), [False] * (hi - lo)
        elif payload is not None:
            world_size[lo:hi], world_na[lo:hi] = payload["nranks"][lo:hi].tolist(), payload["nranks_na"][lo:hi].tolist()
        found = payload["comm_rank"][lo:hi] if needs[i] else None
        if rank_from is not None:
            if not single:
                raise InputError(f"--rank-from names one rank per file, and {shown(export.path)} holds {hi - lo} "
                                 f"processes/GPUs: {digest.SEVERAL_RANKS_HINT}")
            rank[lo], source[lo] = _rank_override(export, rank_from), f"override:{rank_from}"
        elif single and rank_env:
            rank[lo], source[lo] = rank_env[1], f"env:{rank_env[0]}"
        elif (mpi := _mpi_ranks(export, units["pid"][lo:hi].tolist())) is not None:
            rank[lo:hi], source[lo:hi] = mpi, ["nsys:MPI_RANKS"] * (hi - lo)
        elif found is not None and not payload["comm_rank_na"][lo:hi].any() and np.unique(found).size == hi - lo:
            rank[lo:hi], source[lo:hi] = found.tolist(), ["nccl:CommInitRank"] * (hi - lo)
        else:
            rank[lo:hi], source[lo:hi] = list(range(hi - lo)), ["default" if single else "order:pid"] * (hi - lo)
            if not single:
                local[lo:hi], local_na[lo:hi] = list(range(hi - lo)), [False] * (hi - lo)
            export.warn(
                "no rank in the captured environment or NCCL payloads; "
                + (f"numbered {hi - lo} (process, GPU) pairs by pid ({digest.SEVERAL_RANKS_HINT})" if not single
                   else "assumed rank 0 (use --rank-from env:VAR or filename:REGEX)")
            )
    return {"rank": np.array(rank, np.int64), "rank_na": np.zeros(n, bool), "rank_source": source,
            "local_rank": np.array(local, np.int64), "local_rank_na": np.array(local_na, bool),
            "world_size": np.array(world_size, np.int64), "world_size_na": np.array(world_na, bool)}


def _mpi_ranks(export: File, pids: list[int]) -> list[int] | None:
    """Each unit's MPI rank from the export's MPI_RANKS table (``nsys profile -t mpi``), where
    every unit's process has one and they are distinct (a process of two GPUs is not one rank)."""
    ranks = [export.mpi_ranks.get(pid, set()) for pid in pids]
    if not all(len(r) == 1 for r in ranks):
        return None
    found = [next(iter(r)) for r in ranks]
    if len(set(found)) != len(found):
        return None
    return [_rank_sized(export, str(r), f"MPI_RANKS rank {r}") for r in found]


def _payload_ranks(units: Columns, nccl: Columns, env: list[tuple], wanted: np.ndarray) -> Columns:
    """Per unit, (comm_rank, nranks) of its world communicator from CommInitRank payloads.

    A communicator's rank is the global rank only in a communicator of the whole job:
    one of ``world_size`` ranks when that is known, else the unit's one strictly widest
    communicator (TP and DP groups of equal size tie, and then nothing is taken) among
    those that could be the whole job's (`_whole_job_candidates`). In a file of several
    units, ties that give every unit the same rank are taken: a one-rank export's TP and
    DP pairs both put rank 3 at position 1, but two groups that each hold all of a file's
    GPUs, at the same positions, are one group's layout (a pure-DP job's DP group and its
    world, one node's TP group and its world).
    Worked out in Python: a few inits per process (one per communicator), not events.
    """
    def value(column: str, i: int) -> int | None:
        return None if nccl[f"{column}_na"][i] else int(nccl[column][i])

    inits: dict[int, dict[tuple, None]] = {}  # process -> its distinct (device, nranks, comm rank, comm), in trace order
    for i in np.flatnonzero(nccl["init"] & ~nccl["comm_rank_na"]).tolist():
        key = (value("cuda_device", i), value("nranks", i), int(nccl["comm_rank"][i]), int(nccl["comm"][i]))
        inits.setdefault(int(nccl["process"][i]), {})[key] = None
    n = units["file"].size
    out: Columns = {"comm_rank": np.zeros(n, np.int64), "nranks": np.zeros(n, np.int64),
                    "comm_rank_na": np.ones(n, bool), "nranks_na": np.ones(n, bool)}
    unit_inits = [[(nranks, rank, comm) for cuda, nranks, rank, comm in inits.get(int(process), ())
                   if nranks is not None and cuda in (None, int(device))]
                  for process, device in zip(units["process"].tolist(), units["device"].tolist())]
    bounds = np.searchsorted(units["file"], np.arange(len(env) + 1)).tolist()
    allowed = [_whole_job_candidates(unit_inits[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for unit in np.flatnonzero(wanted).tolist():
        file = int(units["file"][unit])
        world = env[file][0]
        sized = [(nranks, rank) for nranks, rank, comm in unit_inits[unit] if comm in allowed[file]]
        if world:
            chosen = [pair for pair in sized if pair[0] == world[1]][:1]
        else:
            widest = max((nranks for nranks, _ in sized), default=None)
            chosen = [pair for pair in sized if pair[0] == widest]
            if bounds[file + 1] - bounds[file] > 1:
                # ties holding all of the file's units, agreeing on this one (see above)
                chosen = list(dict.fromkeys(chosen))
        if len(chosen) == 1:
            out["nranks"][unit], out["comm_rank"][unit] = chosen[0]
            out["nranks_na"][unit] = out["comm_rank_na"][unit] = False
    return out


def _whole_job_candidates(units: list[list[tuple[int, int, int]]]) -> set[int]:
    """The communicators, of one file's units' (nranks, rank, communicator) inits, that
    could be the whole job's: those every unit is a member of, and where some unit's
    communicator has members beyond the file (the job reaches past it), with members
    beyond it too. One process driving a node's GPUs (one file per node) has all of a TP
    group's members: the widest of its communicators, yet not the job's."""
    members: dict[int, int] = {}  # communicator -> units of the file in it
    sizes: dict[int, int] = {}
    for inits in units:
        for comm, nranks in {comm: nranks for nranks, _, comm in inits}.items():
            members[comm] = members.get(comm, 0) + 1
            sizes[comm] = nranks
    every = {comm for comm, count in members.items() if count == len(units)}
    beyond = {comm for comm, count in members.items() if sizes[comm] > count}
    return every & beyond if beyond else every


def _gpu_id(export: File, pid: int, device: int) -> str:
    """Physical GPU UUID of a process's CUDA ordinal where the export says; else
    "pid:<pid>/cuda:<ordinal>"."""
    fallback = f"pid:{pid}/cuda:{device}"
    if export.cuda_devices is not None:
        return export.cuda_devices.get((pid, device), fallback)
    gpus = export.gpus
    if gpus is None:
        return fallback
    if len(gpus) == 1:
        return gpus[0][1]
    # deviceId is process-local (pitfall 7): CUDA_VISIBLE_DEVICES maps it to the host's
    # ordinal (or names the GPU by UUID).
    visible = [v.strip() for v in export.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    entry = visible[device] if device < len(visible) else (None if visible else str(device))
    if entry is None:
        return fallback
    if entry.isdigit():
        hits = [uuid for number, uuid in gpus if number == entry]
    else:
        hits = [uuid for _, uuid in gpus if uuid.lower().endswith(entry.lower().removeprefix("gpu-"))]
    return hits[0] if len(hits) == 1 else fallback


# ---------------------------------------------------------------- a batch: the table


def _int_array(columns: Columns, name: str, type_: pa.DataType = pa.int64()) -> pa.Array:
    return _arrow_ints(columns[name], type_, columns.get(f"{name}_na"))


def _arrow_ints(values: np.ndarray, type_: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """int64 values as an Arrow array of ``type_``. int32 is narrowed in numpy when every
    value fits (Arrow's own narrowing costs several times more); otherwise Arrow narrows,
    raising on an unmasked value out of range."""
    if type_ == pa.int32() and (not values.size or _INT32_MIN <= values.min() and values.max() <= _INT32_MAX):
        values = values.astype(np.int32)
    return pa.array(values, type=type_, mask=mask)


def _list_column(part: str, arrays: dict[str, pa.Array], counts: np.ndarray) -> pa.Array:
    """One list cell per rank (the digest's ``part`` column) from long struct columns
    and per-rank row counts."""
    fields, type_ = _PARTS[part]
    values = pa.StructArray.from_arrays([arrays[f.name] for f in fields], fields=fields)
    offsets = np.zeros(counts.size + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=type_)


def _collective_part(coll: Columns, comm_ids: list[str], facts: Columns, n: int) -> pa.Array:
    arrays = {
        "comm_id": pa.array(comm_ids, pa.string()).take(coll["comm_id"]),
        "seq": pa.array(coll["seq"], pa.int64()),
        "seq_source": pa.repeat(pa.scalar("ordinal", pa.string()), coll["start"].size),
        "op": _OP_NAMES.take(coll["op"]),
        "bytes": _int_array(coll, "bytes"),
        "peer": _int_array(coll, "peer", pa.int32()),
        "start_ns": pa.array(coll["start"], pa.int64()),
        "end_ns": pa.array(coll["end"], pa.int64()),
        "cpu_call_ns": _int_array(coll, "cpu_call_ns"),
        **{name: _int_array(facts, name) for name in ("compute_before_ns", "idle_before_ns", "compute_overlap_ns", "step")},
        "stream": _int_array(coll, "stream"),
    }
    return _list_column("collectives", arrays, np.bincount(coll["unit"], minlength=n))


def _kernel_part(summary: Columns, names: np.ndarray, n: int) -> pa.Array:
    arrays = {
        "name": pa.array(names, pa.string()).take(summary["name"]),
        "count": pa.array(summary["count"], pa.int64()),
        "total_ns": pa.array(summary["total_ns"], pa.int64()),
        "is_comm": pa.array(summary["is_comm"], pa.bool_()),
    }
    return _list_column("kernels", arrays, np.bincount(summary["unit"], minlength=n))


def _step_part(steps: Columns, process: np.ndarray) -> pa.Array:
    """Each rank's process's steps (sorted by process then step already)."""
    low = np.searchsorted(steps["process"], process, side="left")
    counts = np.searchsorted(steps["process"], process, side="right") - low
    rows = _expand(low, counts)
    arrays = {name: pa.array(steps[key][rows], pa.int64()) for name, key in (("step", "step"), ("start_ns", "start"), ("end_ns", "end"))}
    return _list_column("steps", arrays, counts)


def _expand(low: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated index ranges low[i] .. low[i] + counts[i] - 1."""
    ends = np.cumsum(counts)
    return np.repeat(low - (ends - counts), counts) + np.arange(int(ends[-1]) if ends.size else 0)


def _communicator_part(coll: Columns, comm_ids: list[str], n: int) -> pa.Array:
    # One rank's export names its communicators and their sizes, not their other members.
    first = coll["seq"] == 0  # each (rank, comm_id) once, in order of first use
    size = int(first.sum())
    arrays = {
        "comm_id": pa.array(comm_ids, pa.string()).take(coll["comm_id"][first]),
        "ranks": pa.nulls(size, digest.COMMUNICATOR.field("ranks").type),
        "name": pa.nulls(size, pa.string()),
        "size": _arrow_ints(coll["comm_size"][first], pa.int32(), coll["comm_size_na"][first]),
    }
    return _list_column("communicators", arrays, np.bincount(coll["unit"][first], minlength=n))


def _table(files: list[File], units: Columns, identity: Columns, scalars: Columns, parts: dict[str, pa.Array]) -> pa.Table:
    exports = [files[i] for i in units["file"].tolist()]
    pids, devices = units["pid"].tolist(), units["device"].tolist()
    text = {
        "rank_source": identity["rank_source"],
        "host": [e.host for e in exports],
        "gpu": [_gpu_id(e, p, d) for e, p, d in zip(exports, pids, devices)],
        "job_id": [launchers.job_id(e.env) for e in exports],
        "source_format": [SOURCE_FORMAT] * len(exports),
        "source_file": [str(e.path) for e in exports],
        "producer": [f"nsys {e.meta.get('EXPORT_PRODUCT_VERSION', '?')} schema {e.meta.get('EXPORT_SCHEMA_VERSION', '?')}"
                     for e in exports],
    }
    columns: list[pa.Array] = []
    for name, type_ in _DIGEST_FIELDS:
        if name in parts:
            columns.append(parts[name])
        elif name in text:
            columns.append(pa.array(text[name], type_))
        elif name in identity:
            columns.append(_int_array(identity, name, type_))
        elif name == "pid":
            columns.append(pa.array(units["pid"], type_))
        elif name == "warnings":
            columns.append(pa.array([list(e.warnings) for e in exports], type_))
        else:
            columns.append(pa.array(scalars[name], type_))
    return pa.Table.from_arrays(columns, schema=digest.DIGEST_SCHEMA)
