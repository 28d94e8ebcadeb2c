"""The digest: the compact, typed per-rank summary of one export.

It is the only thing agent and analysis share on disk (ARCHITECTURE.md). One row
per rank; the per-event parts are Arrow list columns, so several ranks' digests
concatenate into one table and flatten into long tables without Python loops.

All times are int64 nanoseconds on the rank's *local* clock expressed as UTC
epoch ns (nsys: event + ``utcEpochNs``; Kineto: ``baseTimeNanoseconds`` + ts).
Epoch ns exceed 2**53, so they never pass through float64.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankscope import output
from rankscope.analysis.groups import Coded
from rankscope.errors import ConsistencyError, ExportError, quoted, shown

if TYPE_CHECKING:  # DataFrames are for a person's look (tests, notebooks); the analysis needs no pandas
    import pandas as pd

DIGEST_VERSION = "rankscope.digest/1"
# One capture's times lie within this of each other (a capture lasts minutes to hours):
# farther off, a time is a damaged one.
MAX_CAPTURE_NS = 7 * 24 * 3600 * 10**9
# A step number (ProfilerStep#N, NVTX "step N") has at most this many digits: the analysis
# takes steps as float64 (NaN where none), exact below 2**53 (~9.0e15); a name with more is
# no step (as int64, past 19 digits, it was an OverflowError traceback).
STEP_DIGITS = 15
MAX_STEP = 10**STEP_DIGITS - 1
# The comm_id prefix of a communicator a reader could not name (its trace names no process
# group for the calls, and lists several): calls of several groups may share it.
UNRESOLVED_PG = "unresolved-pg:"
# The comm_id prefix of calls an nsys export names no communicator for (no NCCL payloads): the
# ingest groups them by op, and `lines.infer` tells apart the groups their lines can.
INFERRED_COMM = "inferred:"

# One collective instance as seen by one rank.
COLLECTIVE = pa.struct(
    [
        pa.field("comm_id", pa.string(), nullable=False),  # same on every member rank
        pa.field("seq", pa.int64(), nullable=False),  # instance number within comm_id
        pa.field("seq_source", pa.string(), nullable=False),  # "trace" or "ordinal"
        pa.field("op", pa.string(), nullable=False),  # canonical, see ops.py
        pa.field("bytes", pa.int64()),  # per rank, as NCCL's API counts (AllGather sendcount, ReduceScatter recvcount); null where not carried
        pa.field("peer", pa.int32()),  # p2p peer's rank within the communicator (NCCL's peer argument) where known
        pa.field("start_ns", pa.int64(), nullable=False),  # arrival: device-side start
        pa.field("end_ns", pa.int64(), nullable=False),
        pa.field("cpu_call_ns", pa.int64()),  # host API call, when known
        pa.field("compute_before_ns", pa.int64()),  # compute busy since previous collective ended
        pa.field("idle_before_ns", pa.int64()),  # device idle in the same gap
        pa.field("compute_overlap_ns", pa.int64()),  # compute overlapping [start, end]
        pa.field("step", pa.int64()),  # enclosing step range, where traced
        # The device stream of a call whose communicator the trace does not name (nsys
        # without NCCL payloads), else null: the analysis tells such calls' communicators
        # apart by it (lines.py). Last, so that pyarrow (>= 19) casts an earlier digest,
        # without it, to this schema with nulls.
        pa.field("stream", pa.int64()),
    ]
)

# Communicators this rank is a member of, with their members where the trace says.
COMMUNICATOR = pa.struct(
    [
        pa.field("comm_id", pa.string(), nullable=False),
        pa.field("ranks", pa.list_(pa.int32())),  # global ranks, null if unknown
        pa.field("name", pa.string()),  # PG name / description / commName / record_comm tag
        pa.field("size", pa.int32()),  # member count (NCCL nranks) where the trace says, null if unknown
    ]
)

KERNEL = pa.struct(
    [
        # Full (demangled) name, template arguments and all: one row per instantiation.
        pa.field("name", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("total_ns", pa.int64(), nullable=False),
        pa.field("is_comm", pa.bool_(), nullable=False),
    ]
)

STEP = pa.struct(
    [
        pa.field("step", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64(), nullable=False),
    ]
)

DIGEST_SCHEMA = pa.schema(
    [
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("rank_source", pa.string(), nullable=False),  # e.g. "env:SLURM_PROCID"
        pa.field("local_rank", pa.int32()),
        pa.field("world_size", pa.int32()),
        pa.field("host", pa.string(), nullable=False),  # clock domain
        pa.field("gpu", pa.string()),  # UUID where known
        pa.field("pid", pa.int64()),
        pa.field("job_id", pa.string()),  # used to refuse mixing jobs
        pa.field("source_format", pa.string(), nullable=False),  # nsys-sqlite, kineto-json, ...
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("producer", pa.string()),  # profiler and schema version
        pa.field("window_start_ns", pa.int64(), nullable=False),
        pa.field("window_end_ns", pa.int64(), nullable=False),
        pa.field("gpu_busy_ns", pa.int64(), nullable=False),  # union of kernels + copies
        pa.field("compute_only_ns", pa.int64(), nullable=False),
        pa.field("comm_only_ns", pa.int64(), nullable=False),
        pa.field("overlap_ns", pa.int64(), nullable=False),
        pa.field("communicators", pa.list_(COMMUNICATOR), nullable=False),
        pa.field("collectives", pa.list_(COLLECTIVE), nullable=False),
        pa.field("kernels", pa.list_(KERNEL), nullable=False),
        pa.field("steps", pa.list_(STEP), nullable=False),
        pa.field("warnings", pa.list_(pa.string()), nullable=False),
    ],
    metadata={b"rankscope.schema": DIGEST_VERSION.encode()},
)

_LIST_PARTS = {"communicators": COMMUNICATOR, "collectives": COLLECTIVE, "kernels": KERNEL, "steps": STEP}
# The digest's per-rank columns, everything but the list parts, as one struct.
_SCALARS = pa.struct([f for f in DIGEST_SCHEMA if f.name not in _LIST_PARTS])
# Names and types looked up once: each Field or DataType read from a schema is a new object (~1 us).
_SCALAR_NAMES = [f.name for f in _SCALARS]
_COLUMN_NAMES = DIGEST_SCHEMA.names
_FIELDS = {part: list(struct_type) for part, struct_type in _LIST_PARTS.items()}
_FIELD_TYPES = {part: [(f.name, f.type) for f in fields] for part, fields in _FIELDS.items()}
# A list part's rows: a table, or its columns by field name (numpy, Arrow or Python values).
Part = Union[pa.Table, "pd.DataFrame", Mapping[str, np.ndarray | pa.Array | list]]


def digest_row(meta: dict, **parts: Part | None) -> pa.Table:
    """Build a one-row digest table from scalar metadata and long per-part tables.

    ``meta`` holds the scalar columns; each of ``communicators``, ``collectives``,
    ``kernels``, ``steps`` is a long table with that struct's fields, or its columns by
    name (missing parts are empty, missing fields null). Columns are cast to the schema,
    so a wrong type fails here, at the edge, not later in the analysis.
    """
    # every scalar column in one conversion: a one-row struct array, then its fields
    row = pa.array([{**meta, "warnings": list(meta.get("warnings", []))}], _SCALARS).flatten()
    scalars = dict(zip(_SCALAR_NAMES, row))
    columns = [_as_list_cell(name, parts.get(name)) if name in _LIST_PARTS else scalars[name] for name in _COLUMN_NAMES]
    return pa.Table.from_arrays(columns, schema=DIGEST_SCHEMA)


def _as_list_cell(part: str, data: Part | None) -> pa.Array:
    struct_type = _LIST_PARTS[part]
    if data is None:
        return pa.array([[]], pa.list_(struct_type))
    pandas = sys.modules.get("pandas")  # a DataFrame can only come from a caller that loaded it
    if pandas is not None and isinstance(data, pandas.DataFrame):
        data = pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, pa.Table):
        rows, columns = data.num_rows, {name: data.column(name).combine_chunks() for name in data.column_names}
    else:
        rows, columns = len(next(iter(data.values()), ())), data
    # Columns handed over in their schema type (what the readers build) are neither
    # converted twice nor cast: a table and a cast cost ~10 us a column on small parts.
    arrays = []
    for name, type_ in _FIELD_TYPES[part]:
        values = columns.get(name)
        if values is None:
            arrays.append(pa.nulls(rows, type_))
            continue
        array = values if isinstance(values, pa.Array) else pa.array(values)
        arrays.append(array if array.type == type_ else array.cast(type_))
    structs = pa.StructArray.from_arrays(arrays, fields=_FIELDS[part])
    return pa.ListArray.from_arrays(pa.array([0, len(structs)], pa.int32()), structs)


def concat(digests: Iterable[pa.Table]) -> pa.Table:
    """Digests as one table in the digest schema, one chunk per column. Tables already in
    the schema are not cast again, nor one already in one chunk recombined: a cast costs
    ~10 us a column, and most callers hand over tables built in the schema."""
    tables = [t if t.schema.equals(DIGEST_SCHEMA, check_metadata=True) else t.cast(DIGEST_SCHEMA) for t in digests]
    if not tables:
        return DIGEST_SCHEMA.empty_table()
    table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return table if all(column.num_chunks == 1 for column in table.columns) else table.combine_chunks()


def write(digests: pa.Table, path: str | Path) -> None:
    """Write atomically: a reader never sees half a digest."""
    import pyarrow.parquet as pq  # here, not at the top: it loads pyarrow's file systems (S3, GCS, ...), ~4 MiB

    with output.replacing(Path(path)) as tmp:
        pq.write_table(digests.cast(DIGEST_SCHEMA), tmp, compression="zstd")


def read(path: str | Path) -> pa.Table:
    import pyarrow.parquet as pq  # see write

    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        # pyarrow's text quotes the path, which the error names already: where it is a
        # coordinator's store object, its user would be told a path of no use to them.
        why = str(exc).replace(f" '{path}'", "")
        raise ExportError(f"not a readable Parquet digest ({why})", path=path) from None
    # Any bytes, as Parquet metadata is: a marker that is not UTF-8 is named, not decoded in a traceback.
    version = (table.schema.metadata or {}).get(b"rankscope.schema", b"").decode(errors="backslashreplace")
    if version != DIGEST_VERSION:
        family = DIGEST_VERSION.rpartition("/")[0] + "/"
        if version.startswith(family):  # ours, of another version: say so, not "not a digest"
            raise ExportError(f"a digest of another rankscope version ({quoted(version)}; this one reads {DIGEST_VERSION!r}): "
                              "build it again with this one's `rankscope digest`", path=path)
        raise ExportError(f"not a rankscope digest (schema {quoted(version) if version else 'missing'}, expected "
                          f"{DIGEST_VERSION!r})", path=path)
    table = _in_schema(table, path)
    if not table.num_rows:  # `digest` writes none such: else "no ranks to analyse" named no file
        raise ExportError("digest holds no ranks (0 rows)", path=path)
    _check_collectives(table, path)
    _check_values(table, path)
    return table


# Fields a digest of this version may lack, read as null: added after such digests were stored.
_ADDED_LATER = {("collectives", "stream")}


def _in_schema(table: pa.Table, path: str | Path) -> pa.Table:
    """The digest's columns cast to the schema, or an error saying where they do not match.
    A list part's field that the file lacks is refused before the cast, which (pyarrow >= 19)
    fills a nullable one with nulls, unsaid, and names a non-nullable one by its struct's whole type."""
    lacking = [f"{part}.{name}" for part, struct_type in _LIST_PARTS.items() if part in table.schema.names
               for name in _lacking(table.schema.field(part).type, struct_type) if (part, name) not in _ADDED_LATER]
    if lacking:
        raise ExportError(f"digest does not match {DIGEST_VERSION}: it lacks the field{'s' * (len(lacking) > 1)} "
                          f"{', '.join(lacking)}", path=path)
    try:
        return table.select(DIGEST_SCHEMA.names).cast(DIGEST_SCHEMA)
    except (KeyError, ValueError, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        # ValueError: ArrowInvalid, and a null where the schema has none ("Casting field
        # 'rank' with null values to non-nullable"); the other two: a type that does not cast.
        raise ExportError(f"digest does not match {DIGEST_VERSION}: {exc}", path=path) from None


def _lacking(type_: pa.DataType, struct_type: pa.StructType) -> list[str]:
    """The fields of ``struct_type`` a list of structs of ``type_`` lacks (none where it is
    no list of structs: the cast names that)."""
    if not (pa.types.is_list(type_) and pa.types.is_struct(type_.value_type)):
        return []
    present = {field.name for field in type_.value_type}
    return [field.name for field in struct_type if field.name not in present]


def _check_collectives(table: pa.Table, path: str | Path) -> None:
    """Refuse a collective that ends before it starts: the readers never write one (an
    inverted kernel or event counts as zero-length), so the digest was damaged or edited,
    and its negative length would be read as transfer time and bandwidth, unsaid."""
    column = _one_array(table.column("collectives"))
    flat = pc.list_flatten(column)
    start = flat.field("start_ns").to_numpy(zero_copy_only=False)
    end = flat.field("end_ns").to_numpy(zero_copy_only=False)
    inverted = np.flatnonzero(end < start)
    if inverted.size:
        first = int(inverted[0])
        rank = table.column("rank")[pc.list_parent_indices(column)[first].as_py()].as_py()
        comm, seq = flat.field("comm_id")[first].as_py(), flat.field("seq")[first].as_py()
        raise ExportError(f"{inverted.size:,} of its {len(flat):,} collectives end before they start (a damaged digest): "
                          f"the first, rank {rank}'s seq {seq} on communicator {comm}, ends "
                          f"{int(start[first] - end[first]):,} ns before its start", path=path)


# A window's start, at the latest: room for its capture's times after it in int64.
LATEST_START_NS = 2**63 - 1 - 4 * MAX_CAPTURE_NS


def _check_values(table: pa.Table, path: str | Path) -> None:
    """Refuse values no reader writes (a damaged or edited digest), which went into the
    report unsaid: a collective at INT64_MIN gave negative NCCL times, a busy time of -1 ns
    a GPU -1.8e-6 % busy, a kernel count of -1 the top kernels, a kernel total of 2**62 ns
    146 years of it. Times lie within `MAX_CAPTURE_NS` of their rank's window; lengths,
    counts, sizes and steps are not negative; a span of time (busy, compute before or
    overlapping a collective, a kernel's mean) fits its window or collective."""
    start, end = table.column("window_start_ns").to_numpy(), table.column("window_end_ns").to_numpy()
    ranks = table.column("rank").to_numpy()
    rows = np.arange(table.num_rows)
    window = end - start  # where both are checked first: no wrap round
    checks = [("window_start_ns", start, rows, (start >= 0) & (start <= LATEST_START_NS), "UTC epoch ns from 1970"),
              ("window_end_ns", end, rows, (end >= start) & (window <= MAX_CAPTURE_NS), "at most 7 days after its start")]
    for name in ("gpu_busy_ns", "compute_only_ns", "comm_only_ns", "overlap_ns"):
        values = table.column(name).to_numpy()
        checks.append((name, values, rows, (values >= 0) & (values <= window), "0 to its window's length"))
    for part, times, counts in (
        ("collectives", ("start_ns", "end_ns", "cpu_call_ns"),
         ("bytes", "compute_before_ns", "idle_before_ns", "compute_overlap_ns", "step")),
        ("kernels", (), ("count", "total_ns")),
        ("steps", ("start_ns", "end_ns"), ("step",)),
    ):
        column = _one_array(table.column(part))
        flat, parent = pc.list_flatten(column), pc.list_parent_indices(column).to_numpy()
        low, high = start[parent] - MAX_CAPTURE_NS, end[parent] + MAX_CAPTURE_NS
        for name in times:
            values = pc.fill_null(flat.field(name), 0).to_numpy()
            present = flat.field(name).is_valid().to_numpy(zero_copy_only=False)
            checks.append((f"{part[:-1]} {name}", values, parent, ~present | ((values >= low) & (values <= high)),
                           "within 7 days of its window"))
        for name in counts:
            values = pc.fill_null(flat.field(name), 0).to_numpy()
            if name == "step":
                ok, expected = values <= MAX_STEP, f"0 to {MAX_STEP:,}"
            elif name in ("compute_before_ns", "idle_before_ns"):
                ok, expected = values <= window[parent], "0 to its window's length"
            elif name == "compute_overlap_ns":
                length = flat.field("end_ns").to_numpy() - flat.field("start_ns").to_numpy()
                ok, expected = values <= length, "0 to its collective's length"
            elif name == "total_ns":  # each call lies in the window: count * window at most (floored, not to overflow)
                count = flat.field("count").to_numpy()
                ok, expected = values // np.maximum(count, 1) <= window[parent], "0 to its count times its window's length"
            else:
                ok, expected = True, "0 or more"
            checks.append((f"{part[:-1]} {name}", values, parent, (values >= 0) & ok, expected))
    for what, values, rank_of, ok, expected in checks:
        bad = np.flatnonzero(~ok)
        if bad.size:
            first = int(bad[0])
            raise ExportError(f"a damaged digest: rank {int(ranks[rank_of[first]])}'s {what} is {int(values[first]):,} "
                              f"({expected}; {bad.size:,} such)", path=path)


def is_digest(path: str | Path) -> bool:
    """True for a Parquet file carrying the digest schema marker (cheap: footer only)."""
    import pyarrow.parquet as pq  # see write

    try:
        metadata = pq.read_schema(path).metadata or {}
    except (pa.ArrowInvalid, OSError):
        return False
    return metadata.get(b"rankscope.schema", b"").startswith(b"rankscope.digest/")


def columns(digests: pa.Table, part: str, keep: Sequence[str] = ("rank", "host")) -> dict[str, np.ndarray | Coded]:
    """Flatten one list column to the analysis' long table (groups.Table): numpy columns,
    ``keep`` columns repeated per row, no DataFrame to build.

    Strings become `Coded` (sorted dictionary codes, encoded in Arrow: few distinct values,
    compared and grouped many times over). Integer fields the schema lets be null become
    float64 with NaN: the analysis reads them as sizes, peers, steps and durations, never
    as epoch ns (cpu_call_ns, the one epoch field among them, it does not read).
    """
    column = _one_array(digests.column(part))
    parents = pc.list_parent_indices(column).to_numpy()
    flat = pc.list_flatten(column)
    # the per-rank values converted once, then repeated by position
    out = {name: _to_numpy(digests.column(name), digests.schema.field(name).nullable)[parents] for name in keep}
    for i, field in enumerate(_LIST_PARTS[part]):
        out[field.name] = _to_numpy(flat.field(i), field.nullable)
    return out


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its lone chunk as it is (combine_chunks copies even that,
    ~10 us a column, ~9 columns per analysis)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _to_numpy(array: pa.Array | pa.ChunkedArray, nullable: bool) -> np.ndarray | Coded:
    if isinstance(array, pa.ChunkedArray):
        array = _one_array(array)
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return _coded(array)
    if pa.types.is_integer(array.type) and nullable:
        return array.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)  # nulls as NaN
    return array.to_numpy(zero_copy_only=False)


_FEW_STRINGS = 256  # about where the two cost the same (320 strings: ~50 us each way)


def _coded(array: pa.Array) -> Coded:
    """Strings as codes into their sorted distinct values (-1: null). Arrow's dictionary_encode
    costs 10-20 us a call whatever the length: a few dozen values (per-rank hosts, the
    communicators) are coded faster in Python."""
    if len(array) <= _FEW_STRINGS:
        strings = array.to_pylist()
        values = sorted(set(strings) - {None})
        position = {value: i for i, value in enumerate(values)} | {None: -1}
        return Coded(np.array([position[s] for s in strings], dtype=np.int64), np.array(values, dtype=object), True)
    encoded = array.dictionary_encode()
    values = encoded.dictionary.to_pylist()  # the distinct values, few: sorted in Python
    ranked = sorted(values)
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    if encoded.indices.null_count:  # float with NaN for nulls: -1 (cheaper than pc.fill_null)
        indices = np.where(np.isnan(indices), -1, indices).astype(np.int64)
    if ranked != values:  # in order of appearance: renumber (not needed for one value, the usual case)
        position = {value: i for i, value in enumerate(ranked)}
        indices = np.array([position[v] for v in values] + [-1])[indices]  # -1 (null) picks the appended -1
    return Coded(indices.astype(np.int64), np.array(ranked, dtype=object), True)


def explode(digests: pa.Table, part: str, keep: Sequence[str] = ("rank", "host")) -> pd.DataFrame:
    """Flatten one list column to a long DataFrame with ``keep`` columns repeated per row
    (for a person's look at a digest; the analysis reads `columns`).

    Integer columns holding nulls become pandas' nullable ``Int64``: through float64
    epoch-ns values would lose their last digits.
    """
    import pandas as pd  # here only: the analysis runs without it

    column = digests.column(part).combine_chunks()
    parents = pc.list_parent_indices(column)
    flat = pc.list_flatten(column)
    columns = {name: _to_pandas(pc.take(digests.column(name), parents), pd) for name in keep}
    for i, field in enumerate(_LIST_PARTS[part]):
        columns[field.name] = _to_pandas(flat.field(i), pd)
    return pd.DataFrame(columns)


def _to_pandas(array: pa.Array | pa.ChunkedArray, pd: ModuleType) -> np.ndarray | pd.api.extensions.ExtensionArray:
    if pa.types.is_integer(array.type) and array.null_count:
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        # Values and mask straight from Arrow: half the cost of to_pandas with a types mapper.
        values = pc.fill_null(array, 0).to_numpy().astype(np.int64)
        return pd.arrays.IntegerArray(values, array.is_null().to_numpy(zero_copy_only=False))
    return array.to_numpy(zero_copy_only=False)


# What makes two rows one capture of one rank, to the nanosecond: a digest and the export it
# was built from, or a copy of a file. The window is last: (start, end).
CAPTURE_KEY = ("rank", "host", "pid", "gpu", "gpu_busy_ns", "window_start_ns", "window_end_ns")
Capture = NamedTuple("Capture", [(name, Any) for name in CAPTURE_KEY])


def captures(digests: pa.Table) -> list[Capture]:
    """Each row's `CAPTURE_KEY` values."""
    return [Capture(*row) for row in zip(*(digests.column(name).to_pylist() for name in CAPTURE_KEY))]


# What a user can do where a report holds several ranks and nothing names them.
SEVERAL_RANKS_HINT = ("give each rank its own report (rankscope rank), or export with --include-blobs=true "
                      "so NCCL's CommInitRank names the ranks (where one communicator holds every rank)")
_BY_PID = f" (each report numbered its (process, GPU) pairs 0, 1, ... by pid: {SEVERAL_RANKS_HINT})"


# How a digest's rows name their file when read: the digest, and the export it was built from.
DIGEST_OF = re.compile(r"(?P<digest>.*) \(digest of (?P<export>.*)\)")


def digest_of(digest: str, export: str) -> str:
    """What messages call a row of ``digest`` (a file given, a node's upload) built from ``export``."""
    return f"{digest} (digest of {export})"  # read back by DIGEST_OF


def named(table: pa.Table, sources: list[str]) -> pa.Table:
    """``table`` with its rows' source_file (what messages name) replaced."""
    at = table.schema.get_field_index("source_file")
    return table.set_column(at, table.schema.field(at), pa.array(sources, pa.string()))


def _twice_hint(capture: Capture, other: Capture, by_pid: bool, files: tuple[str, str]) -> str:
    """What two captures of one rank most likely are: one file twice, a digest of an
    earlier export of the other's name, two windows of one process, two runs, two reports
    that each numbered their processes from 0 (``by_pid``), or two processes of one run that
    took one rank number."""
    if capture == other:
        return " (the same capture: one file given twice?)"
    if _digest_of_name(*files) or _digest_of_name(*reversed(files)):
        return " (the digest is of an earlier export of that name: rebuild it with `rankscope digest`, or remove it)"
    if by_pid and capture.host != other.host:
        # Certain, where a window apart is a guess: two hosts' windows are on two clocks.
        return _BY_PID
    if capture.window_start_ns > other.window_end_ns or other.window_start_ns > capture.window_end_ns:
        if (capture.host, capture.pid) == (other.host, other.pid) and capture.pid is not None:
            # One process, windows apart: a profiler schedule's cycles (repeat > 1), a file each.
            return (" (another capture window of the same process, as a profiler schedule writes one a cycle: "
                    "analyse one window's files at a time)")
        return " (another capture window: analyse one run at a time)"
    if by_pid:
        return _BY_PID
    return " (at the same time: two processes of one job took one rank; check RANK or use --rank-from)"


def _digest_of_name(file: str, other: str) -> bool:
    """Whether ``file`` is a digest built from an export named as ``other``, an export."""
    made = DIGEST_OF.fullmatch(file)
    return bool(made) and not DIGEST_OF.fullmatch(other) and Path(made["export"]).name == Path(other).name


def check_consistent(digests: pa.Table) -> None:
    """Refuse inputs that cannot belong to one job: one rank twice, a negative rank or one
    outside the world its own trace gives, two job ids or two world sizes."""
    ranks = digests.column("rank").to_numpy()
    files = digests.column("source_file").to_pylist()
    worlds = digests.column("world_size").to_pylist()
    # Jobs before ranks: two jobs' traces often both hold a rank 0, and the job is the cause.
    differing = _two_values(digests.column("job_id").to_pylist(), files)
    if differing:
        (job_a, file_a), (job_b, file_b) = differing
        raise ConsistencyError(f"job {job_b!r} differs from job {job_a!r} of {shown(file_a)}", path=file_b)
    differing = _two_values(worlds, files)
    if differing:
        (world_a, file_a), (world_b, file_b) = differing
        raise ConsistencyError(f"its world of {world_b} ranks differs from the {world_a} of {shown(file_a)}: traces of two "
                               "jobs? analyse one job at a time", path=file_b)
    by_pid = [source == "order:pid" for source in digests.column("rank_source").to_pylist()]
    seen: dict[int, tuple[str, tuple, bool]] = {}
    for rank, file, world, capture, numbered in zip(ranks.tolist(), files, worlds, captures(digests), by_pid):
        if rank in seen:
            first, other, other_numbered = seen[rank]
            hint = _twice_hint(capture, other, numbered and other_numbered, (file, first))
            raise ConsistencyError(f"rank {rank} is also claimed by {shown(first)}{hint}", path=file)
        if world is not None and not 0 <= rank < world:
            raise ConsistencyError(f"rank {rank} is outside its world of {world} ranks", path=file)
        if rank < 0:  # where no world size is given too: a negative rank was analysed as one
            raise ConsistencyError(f"rank {rank} is no rank (ranks count from 0)", path=file)
        seen[rank] = file, capture, numbered
    _check_windows_meet(digests, files)


def _two_values(values: list, files: list[str]) -> list[tuple[Any, str]] | None:
    """The first two different values given (None and '' are none), each with the first file
    giving it; None where all agree."""
    first: dict[Any, str] = {}
    for value, file in zip(values, files):
        if value is not None and value != "":
            first.setdefault(value, file)
    return list(first.items())[:2] if len(first) > 1 else None


def _check_windows_meet(digests: pa.Table, files: list[str]) -> None:
    """Ranks of one host (one clock) captured together have windows that overlap: where two
    do not, they are traces of two runs (plain Kineto traces carry no job id to tell)."""
    hosts = digests.column("host").to_pylist()
    starts, ends = digests.column("window_start_ns").to_pylist(), digests.column("window_end_ns").to_pylist()
    latest: dict[str, int] = {}
    earliest: dict[str, int] = {}
    for i, host in enumerate(hosts):
        if host not in latest or starts[i] > starts[latest[host]]:
            latest[host] = i
        if host not in earliest or ends[i] < ends[earliest[host]]:
            earliest[host] = i
    for host, late in latest.items():
        early = earliest[host]
        if starts[late] > ends[early]:
            gap = (starts[late] - ends[early]) / 1e9
            raise ConsistencyError(f"its capture window starts {gap:.3g} s after that of {shown(files[early])} on the same "
                                   f"host ({host}) ends: another run? analyse one run at a time", path=files[late])
