"""One Nsight Systems SQLite export read into a `File` of its rows and metadata, for
``nsys`` to build digests of.

Reads schema 3.13.x to 3.28.x (reference/nsys-export.md), selecting columns by name
and tolerating absent (lazy) tables. `queries` (one statement per table, SQLite doing
the joins and filters it does cheaply) are fetched into numpy columns: by ADBC's SQLite
driver straight from Arrow for an export of `ARROW_FROM_BYTES` or more (or any, where
asked: `nsys` reads with it on threads), else (and for one that driver cannot read as
promised) by the sqlite3 module, the big tables `FETCH_ROWS` rows at a time. Then the
export is checked and its metadata, host and time offset are read.

Time base (reference/nccl-in-traces.md): every timestamp + (``utcEpochNs`` - the
export's time shift), so raw (session-relative) and ``--ts-normalize``d exports both
land in UTC epoch ns; `File.offset` is what to add.
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import adbc_driver_manager
import adbc_driver_sqlite
import numpy as np
import pyarrow as pa

from rankscope.analysis import ops
from rankscope.analysis.digest import MAX_CAPTURE_NS
from rankscope.errors import ExportError, quoted

_log = logging.getLogger(__name__)

SUPPORTED_SCHEMAS = ((3, 13), (3, 28))  # inclusive (major, minor) range

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
COPY_TABLES = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
# A kernel's name columns, in the order its name is taken from them (`_kernel_names_sql`):
# the demangled name first, as `nsys stats` sums kernels by default, since the short (base)
# name is one for every instantiation of a template (elementwise_kernel<..., AddFunctor>
# and <..., MulFunctor>, GEMMs of other tiles) and summed them as one kernel.
_KERNEL_NAMES = ("demangledName", "shortName", "mangledName")
# The kernel columns the statements read besides a name (streamId is read where it is there).
_KERNEL_COLUMNS = ("start", "end", "globalPid", "deviceId", "correlationId")
_TABLES = (
    "META_DATA_EXPORT", "META_DATA_CAPTURE", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV",
    "TARGET_INFO_CUDA_DEVICE", "TARGET_INFO_GPU", KERNEL_TABLE, RUNTIME_TABLE, *COPY_TABLES,
    "NVTX_EVENTS", "NVTX_PAYLOAD_SCHEMA_ENTRIES", "StringIds", "MPI_RANKS",
)
_WANTED = f"m.type = 'table' AND m.name IN ({', '.join(repr(t) for t in _TABLES)})"
# The wanted tables' CREATE statements, and (slower) their columns: what `queries` is built from.
SCHEMA_QUERY = f"SELECT m.name, m.sql FROM sqlite_master AS m WHERE {_WANTED} ORDER BY m.name"
COLUMNS_QUERY = f"SELECT m.name, p.name FROM sqlite_master AS m JOIN pragma_table_info(m.name) AS p WHERE {_WANTED}"
# Exports of one nsys version share their schema: columns and statements made once per schema seen.
_BY_SCHEMA: dict[tuple, tuple[dict[str, frozenset[str]], dict[str, str]]] = {}
_SCHEMAS_KEPT = 64
# NVTX event types (same ids in 3.13.2 and 3.25.0, nsys-export.md §3).
_PUSH_POP_RANGE, _START_END_RANGE, _DOMAIN_CREATE = 59, 60, 75
# What the NVTX query tags each row as.
NCCL_DOMAIN, NCCL_RANGE, NCCL_NAMED, OTHER_RANGE = 0, 1, 2, 3
_SQLITE_MAGIC = b"SQLite format 3\x00"
_SQLITE_HEADER = 100  # bytes
MAX_DEVICE = 2**16  # CUDA ordinals; packed below the pid in a unit key
# Rows of the big tables fetched at a time and turned into int64 arrays at once: a fetch
# makes a Python tuple per row (~220 bytes for a kernel's six ints, 4.5x its array row),
# so a large export's peak stays near its arrays rather than its tuples.
FETCH_ROWS = 1 << 16
# Each statement's result columns, integer, text or blob: what an Arrow result must hold
# (`_read_arrow`); the integer tables' become (rows, columns) int64 arrays.
_KINDS = {
    "export": "tt", "capture": "tt", "session": "i", "hostname": "t", "cuda_devices": "iit", "gpus": "tt",
    "kernels": "iiiiiii", "kernel_names": "it", "launches": "iiii", "copies": "iiii", "nvtx": "iiiiiitb",
    "payload_entries": "tiii", "mpi_ranks": "ii",
}
_INT_TABLES = ("kernels", "copies", "launches")
# Exports this size or more are read by ADBC's driver (`_read_arrow`): it makes no Python
# object per value, but costs more per statement and connection (~0.3 ms an export), which
# fewer rows do not repay (even at ~190 KiB of simulated exports; 0.6x the time at 550 KiB).
ARROW_FROM_BYTES = 1 << 18
_ARROW = {"i": pa.int64(), "t": pa.string(), "b": pa.binary()}
_ARROW_TYPES = {name: [_ARROW[kind] for kind in kinds] for name, kinds in _KINDS.items()}
_NO_ROWS = {width: np.empty((0, width), np.int64) for width in (4, 6, 7)}
# NCCL payload entry names (stable; schema ids and offsets are not) -> our column.
PAYLOAD_FIELDS = {
    "NCCL communicator ID": "comm",
    "Message size [bytes]": "bytes",
    "Peer rank": "peer",
    "No. of ranks": "nranks",
    "Rank": "comm_rank",
    "CUDA device": "cuda_device",
}
# A time shift as text: int64's 19 digits at most (int() refuses past 4,300, in a ValueError).
_SHIFT = re.compile(r"-?\d{1,19}")
# A string column read as text: SQLite keeps a BLOB in a TEXT column as it is, which came
# back as bytes (a TypeError in str methods, an ArrowInvalid building the digest); cast,
# its bytes are decoded as UTF-8 or refused by the sqlite3 module ("Could not decode").
_TEXT = "CAST(%s AS TEXT)"
I64_MIN, I64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


# ---------------------------------------------------------------- one file: SQL


def export_schema(fetch: Callable[[str], list[tuple]]) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """The tables the ingest uses that this export has, with their columns, and the
    statements that read them (`queries`): both built once per schema seen. ``fetch``
    runs a statement on the export and gives its rows."""
    schema = tuple(fetch(SCHEMA_QUERY))
    known = _BY_SCHEMA.get(schema)
    if known is None:
        found: dict[str, set[str]] = {}
        for table, column in fetch(COLUMNS_QUERY):
            found.setdefault(table, set()).add(column)
        if len(_BY_SCHEMA) >= _SCHEMAS_KEPT:
            _BY_SCHEMA.clear()
        columns = {table: frozenset(names) for table, names in found.items()}
        known = _BY_SCHEMA[schema] = (columns, queries(columns))
    return known


def queries(columns: Mapping[str, frozenset[str]]) -> dict[str, str]:
    """Every statement the ingest runs on an export with these tables and columns: one
    per table, SQLite doing the joins and filters (names only for the distinct ids used,
    launches only of NCCL kernels, NVTX only NCCL-domain and step ranges). The benchmark's
    floor runs the same statements."""
    sql: dict[str, str] = {}
    if "META_DATA_EXPORT" in columns:
        sql["export"] = (f"SELECT {_as_text('name', 'META_DATA_EXPORT.name')}, "
                         f"{_as_text('value', 'META_DATA_EXPORT.value')} FROM META_DATA_EXPORT WHERE value IS NOT NULL")
    if "META_DATA_CAPTURE" in columns:
        sql["capture"] = (
            f"SELECT {_as_text('name', 'META_DATA_CAPTURE.name')}, {_as_text('value', 'META_DATA_CAPTURE.value')} "
            "FROM META_DATA_CAPTURE "
            "WHERE name IN ('PROCESS_0:ENVIRONMENT_VARIABLE', 'DEVICE_DISPLAY_NAME') ORDER BY rowid"
        )
    if "utcEpochNs" in columns.get("TARGET_INFO_SESSION_START_TIME", ()):
        # DISTINCT: nsys writes one row, and a row repeated is still one session (`_session_start`).
        sql["session"] = "SELECT DISTINCT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"
    if {"name", "value"} <= columns.get("TARGET_INFO_SYSTEM_ENV", frozenset()):
        sql["hostname"] = (f"SELECT {_as_text('value', 'TARGET_INFO_SYSTEM_ENV.value')} FROM TARGET_INFO_SYSTEM_ENV "
                           "WHERE name = 'Hostname'")
    gpu = columns.get("TARGET_INFO_GPU", frozenset())
    if {"cudaId", "pid", "uuid"} <= columns.get("TARGET_INFO_CUDA_DEVICE", frozenset()):
        sql["cuda_devices"] = (f"SELECT pid, cudaId, {_as_text('uuid', 'TARGET_INFO_CUDA_DEVICE.uuid')} "
                               "FROM TARGET_INFO_CUDA_DEVICE WHERE uuid IS NOT NULL ORDER BY rowid")
    elif "uuid" in gpu:
        ordinal = "cuDevice" if "cuDevice" in gpu else "id"
        sql["gpus"] = (f"SELECT DISTINCT {_as_text(ordinal, f'TARGET_INFO_GPU.{ordinal}')}, "
                       f"{_as_text('uuid', 'TARGET_INFO_GPU.uuid')} FROM TARGET_INFO_GPU")
    names = _kernel_name_columns(columns.get(KERNEL_TABLE, frozenset()))
    if names and "globalPid" in columns[KERNEL_TABLE]:
        key, named = _kernel_names_sql(names)
        # Integers only per row (names resolved once per distinct id): the bulk of an export.
        stream = _integer("streamId", null="-1") if "streamId" in columns[KERNEL_TABLE] else "-1"
        sql["kernels"] = (f"SELECT {_TIMES_PID_DEVICE}, {_integer('correlationId', null='-1')}, "
                          f"{_integer(key)}, {stream} FROM {KERNEL_TABLE}")
        sql["kernel_names"] = named
        if {"start", "globalTid", "correlationId"} <= columns.get(RUNTIME_TABLE, frozenset()):
            # Launches of the kernels whose key's own string is no other kernel's than NCCL's
            # (`ops.COMM_KERNEL_GLOBS`), and of the few whose key dangles (`nsys._collectives` links
            # NCCL kernels alone).
            nccl = " OR ".join(f"lower(value) GLOB '{pattern}'" for pattern in ops.COMM_KERNEL_GLOBS)
            others = f"SELECT id FROM StringIds WHERE id IN (SELECT DISTINCT {key} FROM {KERNEL_TABLE}) AND NOT ({nccl})"
            sql["launches"] = (
                f"SELECT correlationId, {_integer('globalTid', _pid('globalTid'))}, {_integer('globalTid')}, "
                f"{_integer('start')} FROM {RUNTIME_TABLE} "
                f"WHERE correlationId IN (SELECT correlationId FROM {KERNEL_TABLE} WHERE {key} NOT IN ({others}))"
            )
    copies = [
        f"SELECT {_TIMES_PID_DEVICE} FROM {table}"
        for table in COPY_TABLES
        if {"start", "end", "deviceId", "globalPid"} <= columns.get(table, frozenset())
    ]
    if copies:
        sql["copies"] = " UNION ALL ".join(copies)
    nvtx = columns.get("NVTX_EVENTS", frozenset())
    if {"start", "end", "eventType", "globalTid"} <= nvtx:
        sql["nvtx"] = _nvtx_sql(nvtx)
    if {"globalTid", "rank"} <= columns.get("MPI_RANKS", frozenset()):
        # `nsys profile -t mpi`: each process's MPI rank (nsys-export.md §3), per thread.
        sql["mpi_ranks"] = (f"SELECT DISTINCT {_pid('globalTid')}, rank FROM MPI_RANKS "
                            "WHERE typeof(globalTid) = 'integer' AND typeof(rank) = 'integer' ORDER BY 1, 2")
    entries = columns.get("NVTX_PAYLOAD_SCHEMA_ENTRIES", frozenset())
    if {"schemaId", "name", "type"} <= entries:
        # Schema tables have no process column: dedupe (pitfall 2); NULL offset means 0 (pitfall 1).
        # An entry whose numbers are not integers (NULL, text, a REAL past int64) describes no field.
        offset = 'COALESCE("offset", 0)' if "offset" in entries else "0"
        wanted = ", ".join(repr(name) for name in PAYLOAD_FIELDS)
        integers = " AND ".join(f"typeof({column}) = 'integer'" for column in ("schemaId", offset, "type"))
        sql["payload_entries"] = (
            f"SELECT DISTINCT name, schemaId, {offset}, type FROM NVTX_PAYLOAD_SCHEMA_ENTRIES "
            f"WHERE name IN ({wanted}) AND {integers} ORDER BY name, schemaId"
        )
    return sql


def _kernel_name_columns(columns: frozenset[str]) -> tuple[str, ...]:
    """The kernel's name columns this export has, the preferred first."""
    return tuple(c for c in _KERNEL_NAMES if c in columns)


def _kernel_names_sql(names: tuple[str, ...]) -> tuple[str, str]:
    """(each kernel's name key, the statement giving (key, name) per key) for these name
    columns. The key is a row's first non-NULL name id, read with no lookup per row; its
    name is that id's string where StringIds holds it, else (an id that dangles: cut
    windows, nsys-export.md §12) the first of the next columns' strings that it holds on a
    row of that key, so the kernel keeps a name (and NCCL its kernels). Only dangling
    keys look further: with none, this costs what reading one name column did."""
    key = _coalesce(*names, "-1")
    value = "s.value"
    if len(names) > 1:
        joins = " ".join(f"LEFT JOIN StringIds AS s{i} ON s{i}.id = k.{name}" for i, name in enumerate(names[1:]))
        later = _coalesce(*(f"s{i}.value" for i in range(len(names) - 1)))
        value = (f"COALESCE(s.value, (SELECT {later} FROM {KERNEL_TABLE} AS k {joins} "
                 f"WHERE {key} = u.id AND {later} IS NOT NULL LIMIT 1))")
    named = (f"SELECT u.id AS id, {_as_text(value, 'StringIds.value')} "
             f"FROM (SELECT DISTINCT {key} AS id FROM {KERNEL_TABLE}) AS u LEFT JOIN StringIds AS s ON s.id = u.id")
    return key, named


def _pid(global_id: str) -> str:
    """The process id in a globalPid or globalTid (nsys-export.md §4)."""
    return f"({global_id} >> 24) & 16777215"


def _integer(column: str, value: str | None = None, null: str | None = None) -> str:
    """``value`` (the column's own by default) where the column holds an integer, ``null``
    where it holds NULL, else NULL: a REAL in an integer column (a damaged or edited
    export: nsys writes integers) was truncated unsaid, by the readers' int64 arrays and by
    SQLite's bit operators alike; as NULL, both readers refuse it (`_fetch_checked`). Only an
    integer is its own ``>> 0`` (a REAL's is truncated, a text's 0): two opcodes, where
    typeof() is a function call (the kernels' statement took 1.28x its time so, 1.2x thus)."""
    where_null = f" WHEN {column} IS NULL THEN {null}" if null is not None else ""
    return f"CASE WHEN {column} >> 0 = {column} THEN {value or column}{where_null} END"


# A kernel's or copy's start, end, process id and device.
_TIMES_PID_DEVICE = ", ".join((_integer("start"), _integer('"end"'), _integer("globalPid", _pid("globalPid")),
                               _integer("deviceId")))


def _coalesce(*expressions: str) -> str:
    return expressions[0] if len(expressions) == 1 else f"COALESCE({', '.join(expressions)})"


def _as_text(expression: str, column: str) -> str:
    """A result column of text, named after the column it reads: the sqlite3 module's "Could
    not decode to UTF-8 column" names a result by its name, which for a bare cast is its SQL."""
    return f'{_TEXT % expression} AS "{column}"'


def _nvtx_name_sql(columns: frozenset[str]) -> tuple[str, str, str]:
    """(expression, join, the columns it reads) for an NVTX event's name: inline `text` or
    registered `textId`."""
    inline = "text" in columns
    text = _TEXT % ("COALESCE(n.text, s.value)" if inline else "s.value")
    if "textId" in columns:
        read = "NVTX_EVENTS.text or StringIds.value" if inline else "StringIds.value"
        return text, "LEFT JOIN StringIds AS s ON s.id = n.textId", read
    return text, "LEFT JOIN (SELECT NULL AS id, NULL AS value) AS s ON 0", "NVTX_EVENTS.text"


def _nvtx_sql(columns: frozenset[str]) -> str:
    """NCCL domain creations, ranges in NCCL's domain (or, for a process without one,
    non-default ranges named nccl*, pitfall 5) with their payload blobs, and step ranges
    in any domain: (pid, tid, start, end, blob length, kind, name, blob) rows, ``kind``
    saying which."""
    text, join, read = _nvtx_name_sql(columns)
    name = f'name AS "{read}"'  # what a "Could not decode to UTF-8" names (`_as_text`)
    pid = _pid("n.globalTid")
    ids, end = f"{_integer('n.globalTid', pid)} AS pid, {_integer('n.globalTid')} AS tid", 'n."end"'
    # A group bracket left without an end still counts toward its thread's group depth (else
    # every later call on the thread looked grouped); its own kernels are unlinked (end 0).
    ended = f"""(n."end" IS NOT NULL OR {text} IN ('ncclGroupStart', 'ncclGroupEnd'))"""
    ranges = f"n.eventType IN ({_PUSH_POP_RANGE}, {_START_END_RANGE}) AND {ended}"
    step = "name LIKE 'step%' OR name LIKE 'ProfilerStep#%'"
    if "domainId" not in columns:
        return (
            f'SELECT pid, tid, start, "end", 0, {OTHER_RANGE}, {name}, NULL FROM ('
            f'SELECT {ids}, {_integer("n.start")} AS start, {_integer(end)} AS "end", {text} AS name '
            f"FROM NVTX_EVENTS AS n {join} WHERE {ranges}) WHERE {step}"
        )
    blob = "CAST(n.binaryData AS BLOB)" if "binaryData" in columns else "NULL"
    nccl = f"n.eventType = {_DOMAIN_CREATE} AND {text} = 'NCCL'"
    # Blobs are never NULL (empty instead): the Arrow reader types a column by its first rows.
    # An end is NULL where a range was left open (read 0: unlinked); a start never is (NOT NULL
    # in nsys's schema): a NULL one, read as 0, began a step at the session start or in 1970.
    return f"""
        WITH nccl AS (SELECT DISTINCT {pid} AS pid, n.domainId AS domain FROM NVTX_EVENTS AS n {join} WHERE {nccl})
        SELECT pid, tid, start, "end",
               CASE WHEN kind IN ({NCCL_RANGE}, {NCCL_NAMED}) THEN COALESCE(length(blob), 0) ELSE 0 END, kind, {name},
               CASE WHEN kind IN ({NCCL_RANGE}, {NCCL_NAMED}) THEN COALESCE(blob, X'') ELSE X'' END
        FROM (SELECT {ids}, {_integer('n.start')} AS start, {_integer(end, null='0')} AS "end",
                     {text} AS name, {blob} AS blob,
                     CASE WHEN n.eventType = {_DOMAIN_CREATE} THEN {NCCL_DOMAIN}
                          WHEN n.domainId = 0 THEN {OTHER_RANGE}
                          WHEN ({pid}, n.domainId) IN (SELECT pid, domain FROM nccl) THEN {NCCL_RANGE}
                          WHEN {text} LIKE 'nccl%' THEN {NCCL_NAMED}
                          ELSE {OTHER_RANGE} END AS kind
              FROM NVTX_EVENTS AS n {join}
              WHERE ({nccl}) OR ({ranges}))
        WHERE kind != {OTHER_RANGE} OR {step}"""


def _check_magic(path: Path) -> None:
    """Raise the precise error for a file that is missing, unreadable, not SQLite or
    shorter than its header says. Before SQLite reads it: an empty file is an empty
    database to SQLite, and one cut inside its last page reads as whole, its rows lost
    unseen."""
    try:
        with path.open("rb") as handle:
            header = handle.read(_SQLITE_HEADER)
            length = os.fstat(handle.fileno()).st_size
    except OSError as exc:
        raise ExportError(f"cannot open ({exc.strerror})", path=path) from None
    if not header.startswith(_SQLITE_MAGIC):
        raise ExportError("not an SQLite export (file is not a database)", path=path)
    expected = _declared_length(header)
    if expected and length < expected:
        raise ExportError(f"export ends early: {length:,} of its {expected:,} bytes (was its export or its copy "
                          "cut short?)", path=path)


def _declared_length(header: bytes) -> int | None:
    """The database's length as its header gives it (sqlite.org/fileformat.html §1.3:
    page size at offset 16, 1 meaning 65536; page count at 28, valid where the change
    counter at 24 equals the version-valid-for number at 92), or None."""
    if len(header) < _SQLITE_HEADER:
        return None
    page_size, = struct.unpack_from(">H", header, 16)
    pages, = struct.unpack_from(">I", header, 28)
    if header[24:28] != header[92:96] or not pages:
        return None
    return (65536 if page_size == 1 else page_size) * pages


# ---------------------------------------------------------------- one file: rows


@dataclass
class File:
    """One export's rows as fetched (integer columns as int64 arrays, timestamps as
    exported) and its metadata; `nsys._build` does everything else for a batch at once."""

    path: Path
    meta: dict[str, str]
    env: dict[str, str]
    cuda_devices: dict[tuple[int, int], str] | None  # (pid, CUDA ordinal) -> GPU uuid, where exported
    gpus: list[tuple[str, str]] | None  # (host ordinal, uuid) where only TARGET_INFO_GPU says
    kernels: np.ndarray  # start, end, pid, device, correlation, name id, stream
    kernel_names: list[tuple[int, str]]  # (id, name) of the name ids used
    copies: np.ndarray  # start, end, pid, device
    launches: np.ndarray  # correlation, pid, tid, start
    nvtx: np.ndarray  # pid, tid, start, end, blob length, kind
    nvtx_names: list[str | None]
    nvtx_blobs: list[bytes | None]
    payload_entries: list[tuple]  # (entry name, schema id, offset, type)
    mpi_ranks: dict[int, set[int]] = field(default_factory=dict)  # pid -> MPI ranks (MPI_RANKS, -t mpi)
    host: str = ""
    offset: int = 0  # add to exported timestamps to get UTC epoch ns
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.kernels) + len(self.copies) + len(self.launches) + len(self.nvtx)

    def warn(self, message: str) -> None:
        # Kept in the digest (the report shows them); logged only with --verbose so a
        # failing run still ends in one error line.
        self.warnings.append(message)
        _log.info("%s: %s", self.path, message)


def connect(path: Path) -> sqlite3.Connection:
    """A read-only connection to an export, inside one read transaction. Not
    ``immutable=1``: that ignores the locks (and any -wal) of an export still being
    written, whose half-written rows then read as a finished export. One transaction
    takes the shared lock once for every statement (what immutable saved) and gives
    them one snapshot; ``timeout=0``: a writer's lock fails at once (`read_file`)."""
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=0, isolation_level=None)
    db.execute("BEGIN")
    return db


def read_file(path: Path, *, arrow: bool | None = None) -> File:
    """One export's rows and metadata. An export of `ARROW_FROM_BYTES` or more (or any,
    with ``arrow``) is read by ADBC's SQLite driver; a smaller one, or one that driver
    cannot read as the statements promise, with the sqlite3 module, which names what is
    wrong with it (or reads what is only unusual)."""
    _check_magic(path)
    rows = None
    if by_arrow(path) if arrow is None else arrow:
        try:
            rows = _read_arrow(path)
        except _Unread as exc:
            _log.debug("%s: read again with sqlite3 (%s)", path, exc)
    return _parse(path, _read_rows(path) if rows is None else rows)


def by_arrow(path: Path) -> bool:
    """Whether `read_file` reads this export with ADBC's driver (which runs without the GIL)."""
    try:
        return path.stat().st_size >= ARROW_FROM_BYTES
    except OSError:
        return False  # for the sqlite3 reader to name


def _read_rows(path: Path) -> dict[str, Any]:
    try:
        db = connect(path)
    except sqlite3.Error as exc:
        raise ExportError(f"cannot open the SQLite export ({exc})", path=path) from None
    try:
        columns, statements = export_schema(lambda sql: db.execute(sql).fetchall())
        _check_tables(path, columns)
        return {name: _fetch_checked(path, db.execute(sql), name) for name, sql in statements.items()}
    except sqlite3.DatabaseError as exc:
        # Errors of the sqlite3 module itself (a column not UTF-8) carry no SQLite code.
        if getattr(exc, "sqlite_errorname", None) == "SQLITE_BUSY":
            raise ExportError("export is locked by a process writing it (nsys export still running?); read it once "
                              "that is done", path=path) from None
        raise ExportError(f"cannot read the SQLite export ({exc})", path=path) from None
    except UnicodeDecodeError:
        # SQLite's own message quoted a damaged schema's bytes (a table name), which the
        # sqlite3 module could not decode to raise its error.
        raise ExportError("cannot read the SQLite export (malformed database schema: SQLite's message about it is "
                          "not UTF-8)", path=path) from None
    finally:
        db.close()


class _Unread(Exception):
    """What ADBC's driver met reading an export, for the sqlite3 module to read it again."""


def _read_arrow(path: Path) -> dict[str, Any]:
    """The statements' rows as `_fetch` gives them, read by ADBC's SQLite driver straight
    into Arrow: no Python object per value, where the sqlite3 module makes one (about half
    the time on exports of some MB), and without the GIL. Read-only, in one read
    transaction, as `connect` reads. Raises `_Unread` for an export it cannot open or read, or whose results are
    not of the kinds the statements promise (`_KINDS`): SQLite keeps any value in any
    column, and the driver takes each column's type from its first rows.

    The driver carries its own SQLite, which shares this process's POSIX locks with the
    sqlite3 module's and drops them all on close: it has the export to itself, closed
    before the sqlite3 reader opens it."""
    try:
        with adbc_driver_sqlite.connect(f"{path.absolute().as_uri()}?mode=ro") as database, \
                adbc_driver_manager.AdbcConnection(database) as connection:
            connection.set_autocommit(False)
            columns, statements = export_schema(lambda sql: _tuples(_arrow(connection, sql)))
            _check_tables(path, columns)
            return {name: _converted(name, _arrow(connection, sql)) for name, sql in statements.items()}
    except (adbc_driver_manager.Error, OSError, pa.ArrowException, UnicodeDecodeError, ExportError) as exc:
        raise _Unread(str(exc)) from None


def _arrow(connection: adbc_driver_manager.AdbcConnection, sql: str) -> pa.Table:
    with adbc_driver_manager.AdbcStatement(connection) as statement:
        statement.set_sql_query(sql)
        stream, _ = statement.execute_query()
        return pa.RecordBatchReader.from_stream(stream).read_all()


def _tuples(table: pa.Table) -> list[tuple]:
    return list(zip(*(column.to_pylist() for column in table.columns)))


def _converted(name: str, table: pa.Table) -> Any:
    """A statement's Arrow result as `_fetch` gives its rows, once its columns are of
    their kinds."""
    if table.schema.types != _ARROW_TYPES[name]:
        _check_kinds(name, table)
    if name in _INT_TABLES:
        return _int_rows(name, table)
    if name == "nvtx":
        return _int_rows(name, table.select(range(6))), table.column(6).to_pylist(), table.column(7).to_pylist()
    return _tuples(table)


def _check_kinds(name: str, table: pa.Table) -> None:
    """Columns of their kinds, where a column all NULL comes as int64 whatever its kind."""
    for kind, column in zip(_KINDS[name], table.columns):
        if column.type != _ARROW[kind] and not (column.type == pa.int64() and column.null_count == len(column)):
            raise _Unread(f"{name} gave {column.type} for {'an integer' if kind == 'i' else 'a text or blob'}")


def _int_rows(name: str, table: pa.Table) -> np.ndarray:
    """(rows, columns) int64 array, as `_ints` makes; a NULL among them is the sqlite3
    reader's to name."""
    if any(column.null_count for column in table.columns):
        raise _Unread(f"{name} holds a NULL where integers are read")
    if not table.num_rows:
        return _NO_ROWS[table.num_columns]
    return np.column_stack([column.to_numpy() for column in table.columns])


def _check_tables(path: Path, columns: Mapping[str, frozenset[str]]) -> None:
    if "TARGET_INFO_SESSION_START_TIME" not in columns:
        raise ExportError("not an nsys export (no TARGET_INFO_SESSION_START_TIME table)", path=path)
    if "utcEpochNs" not in columns["TARGET_INFO_SESSION_START_TIME"]:
        raise ExportError("TARGET_INFO_SESSION_START_TIME has no utcEpochNs column", path=path)
    if KERNEL_TABLE not in columns:
        raise ExportError(f"export has no CUDA kernels (no {KERNEL_TABLE} table; capture with -t cuda)", path=path)
    # Named before a statement reads them: SQLite takes a missing "end" for the text 'end',
    # read as a kernel row holding no integer, and names other columns as its own error.
    lacking = [name for name in _KERNEL_COLUMNS if name not in columns[KERNEL_TABLE]]
    if not _kernel_name_columns(columns[KERNEL_TABLE]):
        lacking.append(f"a name ({', '.join(_KERNEL_NAMES)})")
    if lacking:
        raise ExportError(f"{KERNEL_TABLE} lacks {', '.join(lacking)}", path=path)
    if "StringIds" not in columns:
        raise ExportError("export has no StringIds table (kernel and NVTX names are ids into it)", path=path)


def _fetch_checked(path: Path, cursor: sqlite3.Cursor, table: str) -> Any:
    """`_fetch`, with a NULL where the statement reads integers (the schema lets globalPid
    and globalTid be NULL; a REAL or text reads as NULL, `_integer`) refused as an error
    naming the export."""
    try:
        return _fetch(cursor, table)
    except (TypeError, ValueError, OverflowError):
        raise ExportError(f"its {table} rows hold a NULL or a non-integer where integers are read "
                          "(times, process and thread ids)", path=path) from None


def _fetch(cursor: sqlite3.Cursor, table: str) -> Any:
    """A statement's rows: the big tables' as they are fetched, `FETCH_ROWS` at a time,
    into int64 arrays (NVTX: and its names and blobs), other tables' as tuples."""
    if table in _INT_TABLES:
        width = len(_KINDS[table])
        parts = [_ints(rows, width) for rows in _chunks(cursor)]
        return np.concatenate(parts) if parts else _NO_ROWS[width]
    if table == "nvtx":
        parts, names, blobs = [], [], []
        for rows in _chunks(cursor):
            columns = list(zip(*rows))
            parts.append(_ints(columns[:6], len(rows)).T)
            names.extend(columns[6])
            blobs.extend(columns[7])
        return np.concatenate(parts) if parts else _NO_ROWS[6], names, blobs
    return cursor.fetchall()


def _chunks(cursor: sqlite3.Cursor) -> Iterator[list[tuple]]:
    return iter(lambda: cursor.fetchmany(FETCH_ROWS), [])


def _ints(rows: Sequence[tuple], width: int) -> np.ndarray:
    """(len(rows), width) int64 array of integer tuples (fromiter: twice np.array's speed)."""
    return np.fromiter(chain.from_iterable(rows), np.int64, count=len(rows) * width).reshape(len(rows), width)


def _parse(path: Path, rows: dict[str, Any]) -> File:
    """Metadata, checks and the time offset; the big tables stay as fetched (`_fetch`)."""
    nvtx, nvtx_names, nvtx_blobs = rows.get("nvtx", (_NO_ROWS[6], [], []))
    capture = rows.get("capture", [])
    export = File(
        path=path, meta=dict(rows.get("export", ())), env=_captured_env(capture),
        cuda_devices=None if "cuda_devices" not in rows else {},
        gpus=None if "gpus" not in rows else [(str(o), str(u)) for o, u in rows["gpus"]],
        kernels=rows.get("kernels", _NO_ROWS[7]), kernel_names=rows.get("kernel_names", []),
        copies=rows.get("copies", _NO_ROWS[4]), launches=rows.get("launches", _NO_ROWS[4]),
        nvtx=nvtx, nvtx_names=nvtx_names, nvtx_blobs=nvtx_blobs,
        payload_entries=rows.get("payload_entries", []),
    )
    for pid, mpi_rank in rows.get("mpi_ranks", []):
        export.mpi_ranks.setdefault(int(pid), set()).add(int(mpi_rank))
    for pid, ordinal, uuid in rows.get("cuda_devices", []):
        export.cuda_devices.setdefault((pid, ordinal), str(uuid))
    _check_schema(export)
    if not len(export.kernels):
        raise ExportError("export has no CUDA kernels", path=path)
    # A unit is keyed by (file, pid) * MAX_DEVICE + device: a device beyond keyed another file's
    # or process's GPU (a copy on deviceId 2**40 + 1 counted as busy time of the next export's cuda:1).
    for part, tables in (("kernels", KERNEL_TABLE), ("copies", "/".join(COPY_TABLES))):
        devices = getattr(export, part)[:, 3]
        if devices.size and (devices.min() < 0 or devices.max() >= MAX_DEVICE):
            raise ExportError(f"{tables}.deviceId outside 0..{MAX_DEVICE - 1}", path=path)
    utc_epoch = _session_start(path, rows.get("session") or [(None,)])
    export.offset = _time_offset(export, utc_epoch, int(export.kernels[:, 0].min()))
    _check_epoch_times(export, utc_epoch)
    export.host = _host(export, capture, rows.get("hostname", []))
    return export


def _session_start(path: Path, starts: list[tuple]) -> int:
    """The session's start, utcEpochNs, from its distinct values. nsys writes one row per
    export (one capture session): two starts are two sessions' rows merged into one
    export, whose times are each relative to one of them, unsaid which."""
    if len(starts) > 1:
        # a text or blob (a damaged export) quoted in part: it may run to megabytes; NULL as SQL says it
        shown = " and ".join(str(value) if isinstance(value, int) else "NULL" if value is None else quoted(str(value))
                             for value, in starts[:2])
        raise ExportError(f"TARGET_INFO_SESSION_START_TIME holds {len(starts)} different session start times "
                          f"(utcEpochNs {shown}{', ...' if len(starts) > 2 else ''}): rows of several sessions merged, "
                          "whose times cannot be placed", path=path)
    (start,), = starts
    if not isinstance(start, int):  # NULL, or text/real in a damaged export: int() would raise
        raise ExportError("export has no session start time (utcEpochNs is missing or not an integer)", path=path)
    return start


# The time columns of each part as fetched (`nsys._columns` moves them to epoch ns).
_TIME_COLUMNS = {"kernels": slice(0, 2), "copies": slice(0, 2), "launches": slice(3, 4), "nvtx": slice(2, 4)}


def _check_epoch_times(export: File, utc_epoch: int) -> None:
    """Refuse a session start before 1970, and times that leave int64 once moved to UTC
    epoch ns: numpy's addition wraps them round silently, to a window thousands of years
    before 1970 (a utcEpochNs or a timestamp near 2**63 in a damaged export). So epoch ns
    are 0 (1970) to 2**63 - 1 (2262). And kernels, copies, launches and NVTX ranges more
    than `MAX_CAPTURE_NS` from the session start: a kernel ending near 2**63 in a normalized
    export gave a lateness of 7.5e9 s, an NCCL range starting at 0 a host call time in 1970
    (a digest then refused as damaged). Only each column's least and greatest."""
    if utc_epoch < 0:  # an integer column: it cannot pass 2**63 - 1
        raise ExportError(f"TARGET_INFO_SESSION_START_TIME.utcEpochNs {utc_epoch:,} puts the session start before 1970 "
                          "(UTC epoch ns are 0 to 2**63 - 1)", path=export.path)
    for part, at in _TIME_COLUMNS.items():
        times = getattr(export, part)[:, at]  # a view: a slice of columns, not a copy
        if not times.size:
            continue
        # the ufuncs' reduce directly, over both axes: a few calls a part, on every export read
        low = int(np.minimum.reduce(times, axis=None))
        first, last = low + export.offset, int(np.maximum.reduce(times, axis=None)) + export.offset
        if not I64_MIN <= first <= last <= I64_MAX:
            raise ExportError(f"times in its {part} leave int64 once moved to UTC epoch ns (offset {export.offset:,}): "
                              "a timestamp or utcEpochNs near 2**63", path=export.path)
        # A range without an end reads 0 (`_nvtx_sql`): its end is none to bound (there is
        # none where every time is past 0; where one is, only a greatest time of 0 or less
        # may be such an end).
        if part == "nvtx" and low <= 0:
            starts, ends = times[:, 0], times[:, 1]
            ends = ends[ends != 0]
            first = int(min(starts.min(), ends.min(initial=I64_MAX))) + export.offset
            if last <= export.offset:
                last = int(max(starts.max(), ends.max(initial=I64_MIN))) + export.offset
        far = max(utc_epoch - first, last - utc_epoch)
        if far > MAX_CAPTURE_NS:
            raise ExportError(f"times in its {part} lie {far / 86400e9:,.0f} days from the session start (utcEpochNs), "
                              "where a capture lasts minutes to hours: a damaged timestamp or utcEpochNs", path=export.path)


def _captured_env(capture: list[tuple]) -> dict[str, str]:
    """Environment of the launched process (`KEY="value"` rows, quotes stripped)."""
    env = {}
    for name, value in capture:
        if name != "PROCESS_0:ENVIRONMENT_VARIABLE":
            continue
        key, sep, val = (value or "").partition("=")
        if sep:
            env[key] = val[1:-1] if len(val) >= 2 and val[0] == val[-1] == '"' else val
    return env


# A schema version's major and minor: a few digits each (int() refuses past 4,300, in a ValueError).
_VERSION = re.compile(r"(\d{1,9})\.(\d{1,9})(?!\d)")


def _check_schema(export: File) -> None:
    version = export.meta.get("EXPORT_SCHEMA_VERSION", "")
    match = _VERSION.match(version)
    if not match:
        said = f"EXPORT_SCHEMA_VERSION {quoted(version)} is no version" if version else "no EXPORT_SCHEMA_VERSION"
        export.warn(f"export schema version unknown ({said}); reading columns by name")
        return
    major_minor = (int(match.group(1)), int(match.group(2)))
    if major_minor[0] != SUPPORTED_SCHEMAS[0][0]:
        raise ExportError(f"unsupported nsys export schema {quoted(version)} (supported: 3.13 to 3.28)", path=export.path)
    if not SUPPORTED_SCHEMAS[0] <= major_minor <= SUPPORTED_SCHEMAS[1]:
        export.warn(f"export schema {quoted(version)} is outside the tested 3.13 to 3.28; reading columns by name")


def _time_offset(export: File, utc_epoch: int, first_kernel: int) -> int:
    """What to add to exported timestamps to get UTC epoch ns (nsys-export.md §5).

    A raw export is session-relative (+ any ``--ts-shift``); a normalized one already adds
    ``utcEpochNs``. ``EXPORT_CONFIG_TIME_SHIFT`` records the shift applied, so
    ``utc = t - shift + utcEpochNs`` covers both.
    """
    recorded = export.meta.get("EXPORT_PARAM_TIME_NORMALIZE")
    normalized = (recorded or "").lower()
    if normalized not in ("true", "false"):
        # Not recorded (or not as nsys writes it): judge by magnitude (session-relative times are far below epoch ns).
        normalized = "true" if first_kernel > utc_epoch // 2 else "false"
        looks = "normalized" if normalized == "true" else "session-relative"
        said = ("does not record EXPORT_PARAM_TIME_NORMALIZE" if recorded is None else
                f"records EXPORT_PARAM_TIME_NORMALIZE as {quoted(recorded)}, neither true nor false")
        export.warn(f"export {said}; timestamps look {looks}")
    by_flag = 0 if normalized == "true" else utc_epoch
    shift = export.meta.get("EXPORT_CONFIG_TIME_SHIFT")
    if shift is None:
        return by_flag
    if not _SHIFT.fullmatch(shift):  # not str.isdigit: '--5' and '²' pass it, not int()
        export.warn(f"EXPORT_CONFIG_TIME_SHIFT {quoted(shift)} is not an integer (int64 ns); used EXPORT_PARAM_TIME_NORMALIZE={normalized}")
        return by_flag
    by_shift = utc_epoch - int(shift)
    # Events lie within the capture (minutes to hours) of the session start.
    if abs(first_kernel + by_shift - utc_epoch) > MAX_CAPTURE_NS:
        export.warn(f"EXPORT_CONFIG_TIME_SHIFT {shift} does not fit the timestamps; used EXPORT_PARAM_TIME_NORMALIZE={normalized}")
        return by_flag
    return by_shift


def _host(export: File, capture: list[tuple], hostname: list[tuple]) -> str:
    if hostname and hostname[0][0]:
        return str(hostname[0][0])
    display = next((value for name, value in capture if name == "DEVICE_DISPLAY_NAME"), None)
    if display:
        return str(display)
    export.warn("export names no host; its file name stands in for the clock domain")
    return f"file:{export.path.name}"
