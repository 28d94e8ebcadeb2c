"""Nsight Systems SQLite export -> per-rank digest rows.

Reads schema 3.13.x to 3.28.x (reference/nsys-export.md), selecting columns by name
and tolerating absent (lazy) tables. SQL does the filtering and joins; pandas/numpy do
the rest, with no per-event Python loops.

What comes from where (reference/nccl-in-traces.md):
- time base: every timestamp + (``utcEpochNs`` - the export's time shift), so raw
  (session-relative) and ``--ts-normalize``d exports both land in UTC epoch ns;
- NCCL kernels: classified by name (`ops.is_comm_kernel`), nothing more;
- their operation and communicator: the NCCL NVTX range (domain named ``NCCL``) on the
  thread whose runtime launch call (``correlationId`` + process) created the kernel.
  Grouped calls launch inside ``ncclGroupEnd``: the kernel serves every call since the
  group's start. Payload fields (communicator id, size, peer, rank) are decoded by entry
  name when the export carries ``binaryData`` blobs;
- ranks: one per (process, CUDA device) that ran kernels, so a torchrun tree profiled
  as one report splits into its ranks.
"""

from __future__ import annotations

import re
import sqlite3
import logging
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from rankscope.analysis import digest, intervals, ops
from rankscope.errors import ExportError, InputError

_log = logging.getLogger(__name__)

SOURCE_FORMAT = "nsys-sqlite"
SUPPORTED_SCHEMAS = ((3, 13), (3, 28))  # inclusive (major, minor) range

RANK_ENV = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_ENV = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS", "PMI_SIZE")
JOB_ENV = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID")

# NVTX event types (same ids in 3.13.2 and 3.25.0, nsys-export.md §3).
_PUSH_POP_RANGE, _START_END_RANGE, _DOMAIN_CREATE = 59, 60, 75
_SQLITE_MAGIC = b"SQLite format 3\x00"
_MAX_SESSION_NS = 7 * 24 * 3600 * 10**9
# Payload blob: [domainId u64][schemaId u64][payloadSize u64][payloadOffset u64] payload.
_BLOB_HEADER = 32
# NVTX payload entry type -> (bytes, signed) for the integer types NCCL uses
# (nvToolsExtPayload.h); ids >= 2**24 are enums (C int).
_ENTRY_TYPES = {
    1: (1, True), 2: (1, False), 3: (2, True), 4: (2, False), 5: (4, True), 6: (4, False),
    7: (8, True), 8: (8, False), 9: (8, True), 10: (8, False), 11: (1, True), 12: (1, False),
    13: (2, True), 14: (2, False), 15: (4, True), 16: (4, False), 17: (8, True), 18: (8, False),
    22: (8, False),
}
_ENUM_TYPE = (4, True)
# NCCL payload entry names (stable; schema ids and offsets are not) -> our column.
_PAYLOAD_FIELDS = {
    "NCCL communicator ID": "comm",
    "Message size [bytes]": "bytes",
    "Peer rank": "peer",
    "No. of ranks": "nranks",
    "Rank": "comm_rank",
    "CUDA device": "cuda_device",
}
_STEP = re.compile(r"^(?:ProfilerStep#|step[ _#:]?)(\d+)$", re.I)


@dataclass
class _Export:
    """An open export: tables present, metadata, time offset, warnings collected."""

    path: Path
    db: sqlite3.Connection
    tables: set[str]
    meta: dict[str, str]
    env: dict[str, str]
    offset: int = 0  # add to exported timestamps to get UTC epoch ns
    kernel_name_column: str = "shortName"
    warnings: list[str] = field(default_factory=list)

    def columns(self, table: str) -> set[str]:
        if table not in self.tables:
            return set()
        return {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}

    def frame(self, sql: str, params: tuple = ()) -> pd.DataFrame:
        cursor = self.db.execute(sql, params)
        names = [d[0] for d in cursor.description]
        return pd.DataFrame.from_records(cursor.fetchall(), columns=names)

    def warn(self, message: str) -> None:
        # Kept in the digest (the report shows them); logged only with --verbose so a
        # failing run still ends in one error line.
        self.warnings.append(message)
        _log.info("%s: %s", self.path, message)


def read_nsys(path: str | Path, *, rank_from: str | None = None) -> pa.Table:
    """Digest rows (one per rank found) from an nsys SQLite export.

    ``rank_from`` overrides where the rank comes from: ``env:VAR`` (a variable of the
    captured environment) or ``filename:REGEX`` (first group, else the whole match, of
    REGEX searched in the file name). Without it the rank comes from RANK, SLURM_PROCID,
    OMPI_COMM_WORLD_RANK or PMI_RANK in the captured environment, then from the NCCL
    CommInitRank payload, then (with a warning) from the order of processes.
    """
    path = Path(path)
    with _open(path) as db:
        try:
            return _read(path, db, rank_from)
        except sqlite3.DatabaseError as exc:
            raise ExportError(f"cannot read the SQLite export ({exc})", path=path) from None


@contextmanager
def _open(path: Path) -> Iterator[sqlite3.Connection]:
    try:
        with path.open("rb") as handle:
            magic = handle.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise ExportError(f"cannot open ({exc.strerror})", path=path) from None
    if magic != _SQLITE_MAGIC:
        raise ExportError("not an SQLite export (file is not a database)", path=path)
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise ExportError(f"cannot open the SQLite export ({exc})", path=path) from None
    with closing(db):
        yield db


def _read(path: Path, db: sqlite3.Connection, rank_from: str | None) -> pa.Table:
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "TARGET_INFO_SESSION_START_TIME" not in tables:
        raise ExportError("not an nsys export (no TARGET_INFO_SESSION_START_TIME table)", path=path)
    meta = dict(db.execute("SELECT name, value FROM META_DATA_EXPORT")) if "META_DATA_EXPORT" in tables else {}
    export = _Export(path, db, tables, meta, _captured_env(db, tables))
    _check_schema(export)
    kernels = _kernels(export)
    export.offset = _time_offset(export, kernels)
    for column in ("start", "end"):
        kernels[column] += export.offset
    copies = _copies(export)
    nccl = _nccl_ranges(export)
    launches = _launches(export, kernels)
    collectives = _link(export, kernels[kernels["is_comm"]], launches, nccl)
    steps = _steps(export)
    units = kernels[["pid", "device"]].drop_duplicates().sort_values(["pid", "device"]).reset_index(drop=True)
    identities = _identities(export, units, nccl, rank_from)
    rows = []
    for unit in identities.itertuples(index=False):
        on_unit = (kernels["pid"] == unit.pid) & (kernels["device"] == unit.device)
        unit_copies = copies[(copies["pid"] == unit.pid) & (copies["device"] == unit.device)]
        mine = collectives[(collectives["pid"] == unit.pid) & (collectives["device"] == unit.device)]
        rows.append(_digest_row(export, unit, kernels[on_unit], unit_copies, mine, steps[steps["pid"] == unit.pid]))
    return digest.concat(rows)


# ---------------------------------------------------------------- metadata


def _captured_env(db: sqlite3.Connection, tables: set[str]) -> dict[str, str]:
    """Environment of the launched process (`KEY="value"` rows, quotes stripped)."""
    if "META_DATA_CAPTURE" not in tables:
        return {}
    rows = db.execute(
        "SELECT value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:ENVIRONMENT_VARIABLE' ORDER BY rowid"
    ).fetchall()
    env = {}
    for (value,) in rows:
        key, sep, val = (value or "").partition("=")
        if sep:
            env[key] = val[1:-1] if len(val) >= 2 and val[0] == val[-1] == '"' else val
    return env


def _check_schema(export: _Export) -> None:
    version = export.meta.get("EXPORT_SCHEMA_VERSION", "")
    match = re.match(r"^(\d+)\.(\d+)", version)
    if not match:
        export.warn("export schema version unknown (no EXPORT_SCHEMA_VERSION); reading columns by name")
        return
    major_minor = (int(match.group(1)), int(match.group(2)))
    if major_minor[0] != SUPPORTED_SCHEMAS[0][0]:
        raise ExportError(f"unsupported nsys export schema {version} (supported: 3.13 to 3.28)", path=export.path)
    if not SUPPORTED_SCHEMAS[0] <= major_minor <= SUPPORTED_SCHEMAS[1]:
        export.warn(f"export schema {version} is outside the tested 3.13 to 3.28; reading columns by name")


def _time_offset(export: _Export, kernels: pd.DataFrame) -> int:
    """What to add to exported timestamps to get UTC epoch ns (nsys-export.md §5).

    A raw export is session-relative (+ any ``--ts-shift``); a normalized one already adds
    ``utcEpochNs``. ``EXPORT_CONFIG_TIME_SHIFT`` records the shift applied, so
    ``utc = t - shift + utcEpochNs`` covers both.
    """
    columns = export.columns("TARGET_INFO_SESSION_START_TIME")
    if "utcEpochNs" not in columns:
        raise ExportError("TARGET_INFO_SESSION_START_TIME has no utcEpochNs column", path=export.path)
    row = export.db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    if row is None or row[0] is None:
        raise ExportError("export has no session start time (utcEpochNs)", path=export.path)
    utc_epoch = int(row[0])
    normalized = export.meta.get("EXPORT_PARAM_TIME_NORMALIZE", "").lower()
    if normalized not in ("true", "false"):
        # Not recorded: judge by magnitude (session-relative times are far below epoch ns).
        normalized = "true" if int(kernels["start"].min()) > utc_epoch // 2 else "false"
        looks = "normalized" if normalized == "true" else "session-relative"
        export.warn(f"export does not record EXPORT_PARAM_TIME_NORMALIZE; timestamps look {looks}")
    by_flag = 0 if normalized == "true" else utc_epoch
    shift = export.meta.get("EXPORT_CONFIG_TIME_SHIFT")
    if shift is None or not shift.lstrip("-").isdigit():
        return by_flag
    by_shift = utc_epoch - int(shift)
    # Events lie within the capture (minutes to hours) of the session start.
    if abs(int(kernels["start"].min()) + by_shift - utc_epoch) > _MAX_SESSION_NS:
        export.warn(f"EXPORT_CONFIG_TIME_SHIFT {shift} does not fit the timestamps; used EXPORT_PARAM_TIME_NORMALIZE={normalized}")
        return by_flag
    return by_shift


# ---------------------------------------------------------------- GPU activity


def _kernels(export: _Export) -> pd.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    columns = export.columns(table)
    if not columns:
        raise ExportError("export has no CUDA kernels (no CUPTI_ACTIVITY_KIND_KERNEL table; capture with -t cuda)", path=export.path)
    name_column = next((c for c in ("shortName", "demangledName", "mangledName") if c in columns), None)
    if name_column is None or "globalPid" not in columns:
        raise ExportError(f"{table} lacks kernel names or globalPid", path=export.path)
    # Integers only per row (names resolved once per distinct id): the bulk of an export.
    rows = export.db.execute(
        f"""SELECT start, "end", (globalPid >> 24) & 16777215, deviceId, COALESCE(correlationId, -1),
                   COALESCE({name_column}, -1) FROM {table}"""
    ).fetchall()
    if not rows:
        raise ExportError("export has no CUDA kernels", path=export.path)
    data = np.array(rows, dtype=np.int64)
    strings = dict(export.db.execute(f"SELECT id, value FROM StringIds WHERE id IN (SELECT DISTINCT {name_column} FROM {table})"))
    distinct, codes = np.unique(data[:, 5], return_inverse=True)
    labels = np.array([strings.get(i) or "<unnamed>" for i in distinct.tolist()], dtype=object)
    frame = pd.DataFrame({
        "start": data[:, 0], "end": data[:, 1], "pid": data[:, 2], "device": data[:, 3],
        "correlation": data[:, 4], "name_id": data[:, 5], "name": labels[codes],
    })
    frame["is_comm"] = ops.is_comm_kernel(pd.Series(labels))[codes]  # each distinct name once
    export.kernel_name_column = name_column
    return frame


def _per_name(names: pd.Series, fn) -> pd.Series:
    """``fn`` applied once per distinct name (few), spread back over all rows (many)."""
    codes, distinct = pd.factorize(names)
    mapped = np.array([fn(name) for name in distinct] + [None], dtype=object)
    return pd.Series(mapped[codes], index=names.index, dtype=object)  # code -1 (missing) -> None


def _copies(export: _Export) -> pd.DataFrame:
    """Memcpy/memset activity: counted as GPU busy, neither compute nor communication."""
    parts = []
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if {"start", "end", "deviceId", "globalPid"} <= export.columns(table):
            parts.append(
                export.frame(
                    f"""SELECT start + ? AS start, "end" + ? AS "end", (globalPid >> 24) & 16777215 AS pid,
                               deviceId AS device FROM {table}""",
                    (export.offset, export.offset),
                )
            )
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["start", "end", "pid", "device"])
    return frame.astype(np.int64)


def _launches(export: _Export, kernels: pd.DataFrame) -> pd.DataFrame:
    """Runtime launch call (thread, time) of each NCCL kernel: correlationId within its process."""
    comm = kernels[kernels["is_comm"]]
    empty = pd.DataFrame(columns=["correlation", "pid", "tid", "launch_ns"])
    if comm.empty or not {"start", "globalTid", "correlationId"} <= export.columns("CUPTI_ACTIVITY_KIND_RUNTIME"):
        return empty
    # Only the calls that launched NCCL kernels (few distinct names): SQLite does the join.
    name_ids = ",".join(str(int(i)) for i in comm["name_id"].dropna().unique())
    frame = export.frame(
        f"""SELECT correlationId AS correlation, (globalTid >> 24) & 16777215 AS pid, globalTid AS tid,
                   start + ? AS launch_ns
            FROM CUPTI_ACTIVITY_KIND_RUNTIME
            WHERE correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL
                                    WHERE {export.kernel_name_column} IN ({name_ids}))""",
        (export.offset,),
    )
    return frame.drop_duplicates(["correlation", "pid"])


# ---------------------------------------------------------------- NCCL NVTX ranges


def _nccl_ranges(export: _Export) -> pd.DataFrame:
    """NCCL API ranges with their decoded payload fields, one row per range."""
    columns = export.columns("NVTX_EVENTS")
    result_columns = ["pid", "tid", "start", "end", "name", "op", *_PAYLOAD_FIELDS.values()]
    if not {"start", "end", "eventType", "globalTid", "domainId"} <= columns:
        return pd.DataFrame(columns=result_columns)
    text, join = _nvtx_name_sql(columns)
    blob = "CAST(n.binaryData AS BLOB)" if "binaryData" in columns else "NULL"
    domains = export.frame(
        f"""SELECT DISTINCT (n.globalTid >> 24) & 16777215 AS pid, n.domainId AS domain
            FROM NVTX_EVENTS AS n {join} WHERE n.eventType = {_DOMAIN_CREATE} AND {text} = 'NCCL'"""
    )
    ranges = export.frame(
        f"""SELECT (n.globalTid >> 24) & 16777215 AS pid, n.globalTid AS tid, n.domainId AS domain,
                   n.start + ? AS start, n."end" + ? AS "end", {text} AS name, {blob} AS blob,
                   COALESCE(length({blob}), 0) AS blob_len
            FROM NVTX_EVENTS AS n {join}
            WHERE n.eventType IN ({_PUSH_POP_RANGE}, {_START_END_RANGE}) AND n.domainId != 0 AND n."end" IS NOT NULL
            ORDER BY n.start""",
        (export.offset, export.offset),
    )
    ranges = ranges.merge(domains.assign(is_nccl=True), on=["pid", "domain"], how="left")
    ranges["is_nccl"] = ranges["is_nccl"].fillna(False).astype(bool)
    missing = ~ranges["pid"].isin(domains["pid"])
    if missing.any():
        # Capture started after NCCL created its domain (pitfall 5): fall back on names.
        guessed = missing & ranges["name"].fillna("").str.lower().str.startswith("nccl")
        if guessed.any():
            pids = ", ".join(str(p) for p in sorted(ranges.loc[guessed, "pid"].unique()))
            export.warn(f"no NVTX domain named NCCL for process {pids}; took ranges named nccl* in non-default domains as NCCL's")
        ranges["is_nccl"] |= guessed
    ranges = ranges[ranges["is_nccl"]].reset_index(drop=True)
    ranges["op"] = _per_name(ranges["name"], ops.from_nccl_api)
    payload = _decode_payloads(export, ranges["blob"], ranges["blob_len"].to_numpy(np.int64))
    return pd.concat([ranges.drop(columns=["blob", "blob_len", "is_nccl", "domain"]), payload], axis=1)[result_columns]


def _nvtx_name_sql(columns: set[str]) -> tuple[str, str]:
    """(expression, join) for an NVTX event's name: inline `text` or registered `textId`."""
    text = "COALESCE(n.text, s.value)" if "text" in columns else "s.value"
    if "textId" in columns:
        return text, "LEFT JOIN StringIds AS s ON s.id = n.textId"
    return text, "LEFT JOIN (SELECT NULL AS id, NULL AS value) AS s ON 0"


def _payload_layouts(export: _Export) -> dict[str, tuple[np.ndarray, ...]]:
    """Per wanted entry name: (schema ids sorted, byte offset, size, signed) arrays."""
    if not {"schemaId", "name", "type"} <= export.columns("NVTX_PAYLOAD_SCHEMA_ENTRIES"):
        return {}
    # Schema tables have no process column: dedupe (pitfall 2); NULL offset means 0 (pitfall 1).
    rows = export.db.execute(
        """SELECT DISTINCT name, schemaId, COALESCE("offset", 0), type FROM NVTX_PAYLOAD_SCHEMA_ENTRIES
           WHERE name IS NOT NULL ORDER BY name, schemaId"""
    ).fetchall()
    layouts: dict[str, list[tuple[int, int, int, bool]]] = {}
    for name, schema, offset, kind in rows:  # a few dozen schema entries, not events
        if name in _PAYLOAD_FIELDS and kind is not None:
            size, signed = _ENTRY_TYPES.get(kind) or (_ENUM_TYPE if kind >= 2**24 else (0, False))
            entries = layouts.setdefault(name, [])
            if not entries or entries[-1][0] != schema:
                entries.append((schema, _BLOB_HEADER + offset, size, signed))
    return {name: tuple(np.array(column) for column in zip(*entries)) for name, entries in layouts.items()}


def _decode_payloads(export: _Export, blobs: pd.Series, lengths: np.ndarray) -> pd.DataFrame:
    """Payload fields by entry name, vectorised over all blobs; NA where absent."""
    n = len(blobs)
    columns = {column: (np.zeros(n, np.int64), np.ones(n, bool)) for column in _PAYLOAD_FIELDS.values()}
    index = np.flatnonzero(lengths >= _BLOB_HEADER)
    layouts = _payload_layouts(export) if index.size else {}
    if index.size and not layouts:
        export.warn("NVTX payload blobs present but no NCCL payload schemas to decode them")
    if layouts:
        lengths = lengths[index]
        base = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        data = np.frombuffer(b"".join(blobs.iloc[index].tolist()), np.uint8)
        schema = _read_ints(data, base + 8, np.full(index.size, 8), np.zeros(index.size, bool))
        for entry_name, (schemas, offsets, sizes, signed) in layouts.items():
            at = np.clip(np.searchsorted(schemas, schema), 0, schemas.size - 1)
            size = np.where(schemas[at] == schema, sizes[at], 0)
            ok = (size > 0) & (offsets[at] + size <= lengths)
            values = _read_ints(data, base + offsets[at], np.where(ok, size, 1), signed[at])
            column = _PAYLOAD_FIELDS[entry_name]
            columns[column][0][index] = np.where(ok, values, 0)
            columns[column][1][index] = ~ok
    return pd.DataFrame({column: pd.arrays.IntegerArray(values, mask) for column, (values, mask) in columns.items()})


def _read_ints(data: np.ndarray, positions: np.ndarray, sizes: np.ndarray, signed: np.ndarray) -> np.ndarray:
    """Little-endian integers of per-row width (1, 2, 4, 8 bytes) at byte positions."""
    sizes = np.asarray(sizes, np.int64)
    span = np.arange(8)
    take = np.clip(positions[:, None] + span, 0, max(len(data) - 1, 0))
    raw = np.where(span < sizes[:, None], data[take], 0).astype(np.uint64)
    unsigned = (raw << (span.astype(np.uint64) * np.uint64(8))).sum(axis=1, dtype=np.uint64)
    bits = (sizes * 8).astype(np.uint64)
    sign_bit = np.uint64(1) << (bits - np.uint64(1))
    negative = signed & (sizes < 8) & ((unsigned & sign_bit) != 0)
    as_int = unsigned.view(np.int64)
    return np.where(negative, as_int - (np.int64(1) << (bits.astype(np.int64) % 64)), as_int)


# ---------------------------------------------------------------- kernel -> API call


def _link(export: _Export, comm: pd.DataFrame, launches: pd.DataFrame, nccl: pd.DataFrame) -> pd.DataFrame:
    """One collective row per NCCL kernel, with the API calls it serves where traced."""
    kernels = comm.merge(launches, on=["correlation", "pid"], how="left").reset_index(drop=True)
    kernels["kernel"] = np.arange(len(kernels))
    calls, launchers = _group_calls(nccl)
    linked = kernels.loc[kernels["launch_ns"].notna(), ["kernel", "tid", "launch_ns"]].astype(np.int64)
    right = launchers[["tid", "start", "end", "call_group"]].astype(np.int64)
    matched = pd.merge_asof(
        linked.sort_values("launch_ns"), right.sort_values("start"),
        left_on="launch_ns", right_on="start", by="tid", direction="backward",
    )
    matched = matched[matched["call_group"].notna() & (matched["end"] >= matched["launch_ns"])]
    served = matched[["kernel", "call_group"]].astype(np.int64).merge(calls, on="call_group")
    per_kernel = _summarise_calls(served)
    out = kernels
    at = per_kernel["kernel"].to_numpy(np.int64)  # kernel = row position in `kernels`
    for column in per_kernel.columns.drop("kernel"):
        values = pd.Series(pd.NA, index=kernels.index, dtype=object)
        values.iloc[at] = per_kernel[column].to_numpy(dtype=object)
        out[column] = values
    unlinked = out["op"].isna()
    if unlinked.any():
        export.warn(
            f"{int(unlinked.sum())} of {len(out)} NCCL kernels have no NCCL API range around their launch "
            "(NVTX not traced or cut by the capture window); their op is guessed from the kernel name"
        )
        out.loc[unlinked, "op"] = _per_name(out.loc[unlinked, "name"], ops.from_kernel_name).fillna(ops.UNKNOWN)
    out["cpu_call_ns"] = out["cpu_call_ns"].fillna(out["launch_ns"])
    return _assign_communicators(export, out, nccl)


def _group_calls(nccl: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(calls, launchers): API calls keyed by ``call_group``; the ranges kernels launch in.

    An ungrouped call launches inside its own range; grouped calls (between the outermost
    ncclGroupStart and its ncclGroupEnd on one thread) launch inside the ncclGroupEnd.
    """
    frame = nccl.sort_values(["tid", "start"], kind="stable").reset_index(drop=True)
    lower = frame["name"].fillna("").str.lower()
    delta = np.where(lower == "ncclgroupstart", 1, np.where(lower == "ncclgroupend", -1, 0))
    # Per-thread running depth, as whole-array numpy: offsets restart each thread's sums.
    tid = frame["tid"].to_numpy(np.int64)
    first = np.r_[True, tid[1:] != tid[:-1]] if tid.size else np.zeros(0, bool)
    thread = np.cumsum(first) - 1
    total = np.cumsum(delta)
    running = total - (total - delta)[first][thread]
    # An ncclGroupEnd whose start was before the capture window drives the count below 0;
    # the floor is the per-thread running minimum (threads shifted apart so none leaks).
    spread = np.int64(len(frame) + 1) * thread
    floor = np.minimum.accumulate(np.minimum(running, 0) - spread) + spread
    depth = running - floor
    before = np.where(first, 0, np.r_[0, depth[:-1]])
    group = np.cumsum((delta == 1) & (before == 0))  # outermost group starts, numbered globally
    is_call = frame["op"].notna().to_numpy()
    grouped = is_call & (depth > 0)
    closes = (delta == -1) & (before >= 1) & (depth == 0)
    # Ungrouped calls form their own call group (negative ids cannot clash with groups).
    frame["call_group"] = np.where(grouped | closes, group, -1 - np.arange(len(frame), dtype=np.int64))
    launchers = frame[(is_call & ~grouped) | closes]
    return frame[is_call], launchers


def _summarise_calls(served: pd.DataFrame) -> pd.DataFrame:
    """Per kernel: op (send+recv -> sendrecv), communicator, bytes, peer, first call time."""
    names = ["kernel", "op", "comm", "bytes", "peer", "nranks", "cpu_call_ns"]
    if served.empty:
        return pd.DataFrame(columns=names)
    served = served.sort_values(["kernel", "start"], kind="stable")
    kernel = served["kernel"].to_numpy(np.int64)
    first = np.flatnonzero(np.r_[True, kernel[1:] != kernel[:-1]])
    codes, _ = pd.factorize(served["op"])
    op = served["op"].to_numpy(dtype=object)
    one_op = np.minimum.reduceat(codes, first) == np.maximum.reduceat(codes, first)
    all_p2p = np.minimum.reduceat(served["op"].isin(ops.P2P_OPS).to_numpy(), first)
    size = served["bytes"]
    has_bytes = np.maximum.reduceat(size.notna().to_numpy(), first)
    total = np.add.reduceat(size.fillna(0).to_numpy(np.int64), first)
    peer = served["peer"]
    known_peer = peer.notna().to_numpy()
    peer_low = np.minimum.reduceat(peer.fillna(np.iinfo(np.int64).max).to_numpy(np.int64), first)
    peer_high = np.maximum.reduceat(peer.fillna(np.iinfo(np.int64).min).to_numpy(np.int64), first)
    single_peer = np.minimum.reduceat(known_peer, first) & (peer_low == peer_high)
    return pd.DataFrame({
        "kernel": kernel[first],
        "op": np.where(one_op | ~all_p2p, op[first], ops.SENDRECV),
        "comm": served["comm"].array[first],
        "bytes": pd.arrays.IntegerArray(total, ~has_bytes),
        "peer": pd.arrays.IntegerArray(np.where(single_peer, peer_low, 0), ~single_peer),
        "nranks": served["nranks"].array[first],
        "cpu_call_ns": served["start"].to_numpy(np.int64)[first],  # sorted: the first call
    })


def _assign_communicators(export: _Export, out: pd.DataFrame, nccl: pd.DataFrame) -> pd.DataFrame:
    """comm_id from the payload, else inferred; seq = call order within comm_id (the NCCL
    schemas carry no sequence field, and every member calls a communicator's collectives
    in the same order)."""
    traced = out["comm"].notna().to_numpy()
    comm = out["comm"].astype("Int64").fillna(0).to_numpy(np.int64).view(np.uint64)
    distinct, which = np.unique(comm, return_inverse=True)  # few communicators: format each once
    comm_id = np.array([f"{c:016x}" for c in distinct.tolist()], dtype=object)[which]
    if not traced.all():
        comm_id = np.where(traced, comm_id, _inferred_comm_ids(out, nccl))
        export.warn(
            f"{int((~traced).sum())} of {len(traced)} NCCL kernels carry no communicator id "
            "(needs NCCL >= 2.25.1 and nsys export --include-blobs=true); those collectives are grouped "
            "by operation as 'inferred:<op>' and numbered by call order"
        )
    out["comm_id"] = comm_id
    out = out.sort_values(["pid", "device", "start"], kind="stable").reset_index(drop=True)
    out["seq"] = out.groupby(["pid", "device", "comm_id"], sort=False).cumcount().astype(np.int64)
    out["seq_source"] = "ordinal"
    return out


def _inferred_comm_ids(out: pd.DataFrame, nccl: pd.DataFrame) -> np.ndarray:
    """What every member of an untraced communicator agrees on: the op, and the
    communicator size when the process initialised communicators of a single size."""
    inits = nccl[nccl["name"].fillna("").str.lower().str.startswith("ncclcomminit") & nccl["nranks"].notna()]
    sizes = inits.groupby("pid")["nranks"].agg(["min", "max"])
    one_size = sizes["min"].where(sizes["min"] == sizes["max"])
    size = out["nranks"].astype("Int64").fillna(out["pid"].map(one_size).astype("Int64"))
    suffix = np.where(size.notna().to_numpy(), ":n" + size.astype("string").fillna("").to_numpy(dtype=object), "")
    return "inferred:" + out["op"].astype(str).to_numpy(dtype=object) + suffix


# ---------------------------------------------------------------- steps and identity


def _steps(export: _Export) -> pd.DataFrame:
    """`step N` / `ProfilerStep#N` NVTX ranges per process (any domain)."""
    columns = export.columns("NVTX_EVENTS")
    empty = pd.DataFrame(columns=["pid", "step", "start_ns", "end_ns"])
    if not {"start", "end", "eventType", "globalTid"} <= columns:
        return empty
    text, join = _nvtx_name_sql(columns)
    frame = export.frame(
        f"""SELECT (n.globalTid >> 24) & 16777215 AS pid, n.start + ? AS start_ns, n."end" + ? AS end_ns, {text} AS name
            FROM NVTX_EVENTS AS n {join}
            WHERE n.eventType IN ({_PUSH_POP_RANGE}, {_START_END_RANGE}) AND n."end" IS NOT NULL
              AND ({text} LIKE 'step%' OR {text} LIKE 'ProfilerStep#%')""",
        (export.offset, export.offset),
    )
    if frame.empty:
        return empty
    frame["step"] = pd.to_numeric(frame["name"].str.extract(_STEP, expand=False), errors="coerce")
    frame = frame.dropna(subset=["step"])
    frame["step"] = frame["step"].astype(np.int64)
    return frame.groupby(["pid", "step"], as_index=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))


def _env_int(env: dict[str, str], names: tuple[str, ...]) -> tuple[str, int] | None:
    for name in names:
        value = env.get(name, "").strip()
        if re.fullmatch(r"-?\d+", value):
            return name, int(value)
    return None


def _rank_override(export: _Export, rank_from: str) -> int:
    kind, _, spec = rank_from.partition(":")
    if kind == "env" and spec:
        value = export.env.get(spec)
        if value is None or not re.fullmatch(r"\s*-?\d+\s*", value):
            raise ExportError(f"--rank-from {rank_from}: {spec} is not an integer in the captured environment", path=export.path)
        return int(value)
    if kind == "filename" and spec:
        try:
            match = re.search(spec, export.path.name)
        except re.error as exc:
            raise InputError(f"--rank-from {rank_from}: bad regular expression ({exc})") from None
        text = None if match is None else (match.group(1) if match.re.groups else match.group(0))
        if text is None or not re.fullmatch(r"-?\d+", text):
            raise ExportError(f"--rank-from {rank_from}: no rank number in the file name", path=export.path)
        return int(text)
    raise InputError(f"--rank-from {rank_from!r}: expected env:VAR or filename:REGEX")


def _identities(export: _Export, units: pd.DataFrame, nccl: pd.DataFrame, rank_from: str | None) -> pd.DataFrame:
    """Rank, local rank, world size per (pid, device) unit, and where the rank came from."""
    units = units.copy()
    env_world = _env_int(export.env, WORLD_SIZE_ENV)
    single = len(units) == 1
    env_rank = _env_int(export.env, RANK_ENV)
    env_local = _env_int(export.env, LOCAL_RANK_ENV)
    units["local_rank"] = env_local[1] if (single and env_local) else pd.NA
    if env_world and (rank_from is not None or (single and env_rank)):
        payload_rank = None  # not needed: skip the work
        units["world_size"] = env_world[1]
    else:
        payload = _payload_ranks(units, nccl, env_world[1] if env_world else None)
        payload_rank = payload["comm_rank"]
        units["world_size"] = env_world[1] if env_world else payload["nranks"]
    if rank_from is not None:
        if not single:
            raise InputError(f"--rank-from cannot name the ranks of {export.path}: it holds {len(units)} processes/GPUs")
        units["rank"], units["rank_source"] = _rank_override(export, rank_from), f"override:{rank_from}"
    elif single and env_rank:
        units["rank"], units["rank_source"] = env_rank[1], f"env:{env_rank[0]}"
    elif payload_rank is not None and payload_rank.notna().all() and payload_rank.nunique() == len(units):
        units["rank"], units["rank_source"] = payload_rank.astype(np.int64).to_numpy(), "nccl:CommInitRank"
    else:
        units["rank"] = np.arange(len(units))
        units["rank_source"] = "order:pid" if not single else "default"
        units["local_rank"] = np.arange(len(units)) if not single else units["local_rank"]
        export.warn(
            "no rank in the captured environment or NCCL payloads; "
            + (f"numbered {len(units)} (process, GPU) pairs by pid" if not single else "assumed rank 0")
            + " (use --rank-from env:VAR or filename:REGEX)"
        )
    return units


def _payload_ranks(units: pd.DataFrame, nccl: pd.DataFrame, world_size: int | None) -> pd.DataFrame:
    """Per unit, (comm_rank, nranks) of its world communicator from CommInitRank payloads.

    A communicator's rank is the global rank only in a communicator of the whole job:
    one of ``world_size`` ranks when that is known, else the unit's one strictly widest
    communicator (TP and DP groups of equal size tie, and then nothing is taken).
    """
    inits = nccl[nccl["name"].fillna("").str.lower().str.startswith("ncclcomminit") & nccl["comm_rank"].notna()]
    inits = inits.drop_duplicates(["pid", "cuda_device", "comm", "nranks", "comm_rank"])
    mine = units.merge(inits[["pid", "cuda_device", "nranks", "comm_rank"]], on="pid")
    mine = mine[mine["cuda_device"].isna() | (mine["cuda_device"] == mine["device"])]
    keys = [mine["pid"], mine["device"]]
    widest = mine["nranks"] == mine.groupby(keys)["nranks"].transform("max")
    if world_size is None:
        chosen = mine[widest & (widest.groupby(keys).transform("sum") == 1)]
    else:
        chosen = mine[mine["nranks"] == world_size]
    chosen = chosen.drop_duplicates(["pid", "device"])[["pid", "device", "comm_rank", "nranks"]]
    return units[["pid", "device"]].merge(chosen, on=["pid", "device"], how="left")


def _gpu_id(export: _Export, pid: int, device: int) -> str:
    """Physical GPU UUID of a process's CUDA ordinal where the export says; else
    "pid:<pid>/cuda:<ordinal>"."""
    fallback = f"pid:{pid}/cuda:{device}"
    if {"cudaId", "pid", "uuid"} <= export.columns("TARGET_INFO_CUDA_DEVICE"):
        row = export.db.execute(
            "SELECT uuid FROM TARGET_INFO_CUDA_DEVICE WHERE pid = ? AND cudaId = ? AND uuid IS NOT NULL", (pid, device)
        ).fetchone()
        return str(row[0]) if row else fallback
    gpu_columns = export.columns("TARGET_INFO_GPU")
    if "uuid" not in gpu_columns:
        return fallback
    ordinal = "cuDevice" if "cuDevice" in gpu_columns else "id"
    gpus = export.db.execute(f"SELECT DISTINCT CAST({ordinal} AS TEXT), uuid FROM TARGET_INFO_GPU").fetchall()
    if len(gpus) == 1:
        return str(gpus[0][1])
    # deviceId is process-local (pitfall 7): CUDA_VISIBLE_DEVICES maps it to the host's
    # ordinal (or names the GPU by UUID).
    visible = [v.strip() for v in export.env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    entry = visible[device] if device < len(visible) else (None if visible else str(device))
    if entry is None:
        return fallback
    if entry.isdigit():
        hits = [uuid for number, uuid in gpus if number == entry]
    else:
        hits = [uuid for _, uuid in gpus if str(uuid).lower().endswith(entry.lower().removeprefix("gpu-"))]
    return str(hits[0]) if len(hits) == 1 else fallback


def _job_id(env: dict[str, str]) -> str | None:
    return next((env[name] for name in JOB_ENV if env.get(name)), None)


def _host(export: _Export) -> str:
    if {"name", "value"} <= export.columns("TARGET_INFO_SYSTEM_ENV"):
        row = export.db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()
        if row and row[0]:
            return str(row[0])
    if "META_DATA_CAPTURE" in export.tables:
        row = export.db.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'DEVICE_DISPLAY_NAME'").fetchone()
        if row and row[0]:
            return str(row[0])
    export.warn("export names no host; its file name stands in for the clock domain")
    return f"file:{export.path.name}"


# ---------------------------------------------------------------- one digest row


def _digest_row(export: _Export, unit, kernels: pd.DataFrame, copies: pd.DataFrame,
                collectives: pd.DataFrame, steps: pd.DataFrame) -> pa.Table:
    window_start = int(min(kernels["start"].min(), copies["start"].min() if len(copies) else np.iinfo(np.int64).max))
    window_end = int(max(kernels["end"].max(), copies["end"].max() if len(copies) else np.iinfo(np.int64).min))
    comm_kernels = kernels[kernels["is_comm"]]
    compute_kernels = kernels[~kernels["is_comm"]]
    compute = intervals.merge(compute_kernels["start"], compute_kernels["end"])
    comm = intervals.merge(comm_kernels["start"], comm_kernels["end"])
    busy = intervals.merge(
        np.concatenate([kernels["start"].to_numpy(), copies["start"].to_numpy()]),
        np.concatenate([kernels["end"].to_numpy(), copies["end"].to_numpy()]),
    )
    window = ([window_start], [window_end])
    compute_ns = int(intervals.overlap(compute, *window)[0])
    comm_ns = int(intervals.overlap(comm, *window)[0])
    both = intervals.merge(
        np.concatenate([compute.starts, comm.starts]), np.concatenate([compute.ends, comm.ends])
    )
    either_ns = int(intervals.overlap(both, *window)[0])
    meta = {
        "rank": int(unit.rank),
        "rank_source": unit.rank_source,
        "local_rank": None if pd.isna(unit.local_rank) else int(unit.local_rank),
        "world_size": None if pd.isna(unit.world_size) else int(unit.world_size),
        "host": _host(export),
        "gpu": _gpu_id(export, int(unit.pid), int(unit.device)),
        "pid": int(unit.pid),
        "job_id": _job_id(export.env),
        "source_format": SOURCE_FORMAT,
        "source_file": str(export.path),
        "producer": f"nsys {export.meta.get('EXPORT_PRODUCT_VERSION', '?')} schema {export.meta.get('EXPORT_SCHEMA_VERSION', '?')}",
        "window_start_ns": window_start,
        "window_end_ns": window_end,
        "gpu_busy_ns": int(intervals.overlap(busy, *window)[0]),
        "compute_only_ns": either_ns - comm_ns,
        "comm_only_ns": either_ns - compute_ns,
        "overlap_ns": compute_ns + comm_ns - either_ns,
        "warnings": export.warnings,
    }
    return digest.digest_row(
        meta,
        collectives=_collective_part(collectives, compute, busy, steps, window_start),
        kernels=_kernel_part(kernels),
        steps=steps[["step", "start_ns", "end_ns"]].sort_values("step"),
        communicators=_communicator_part(collectives),
    )


def _collective_part(frame: pd.DataFrame, compute: intervals.Union, busy: intervals.Union,
                     steps: pd.DataFrame, window_start: int) -> pd.DataFrame:
    frame = frame.sort_values("start", kind="stable").reset_index(drop=True)
    start, end = frame["start"].to_numpy(np.int64), frame["end"].to_numpy(np.int64)
    gap_start, gap_end = intervals.gaps_before(start, end, window_start)
    part = pd.DataFrame({
        "comm_id": frame["comm_id"].astype(str),
        "seq": frame["seq"].astype(np.int64),
        "seq_source": frame["seq_source"],
        "op": frame["op"].astype(str),
        "bytes": pd.array(frame["bytes"], dtype="Int64"),
        "peer": pd.array(frame["peer"], dtype="Int64"),
        "start_ns": start,
        "end_ns": end,
        "cpu_call_ns": pd.array(frame["cpu_call_ns"], dtype="Int64"),
        "compute_before_ns": intervals.overlap(compute, gap_start, gap_end),
        "idle_before_ns": (gap_end - gap_start) - intervals.overlap(busy, gap_start, gap_end),
        "compute_overlap_ns": intervals.overlap(compute, start, end),
    })
    part["step"] = _step_of(part["cpu_call_ns"].fillna(part["start_ns"]).to_numpy(np.int64), steps)
    return part


def _step_of(times: np.ndarray, steps: pd.DataFrame) -> pd.arrays.IntegerArray:
    """The step whose range contains each time (host-side call time), else NA."""
    ordered = steps.sort_values("start_ns")
    starts = ordered["start_ns"].to_numpy(np.int64)
    at = np.searchsorted(starts, times, side="right") - 1
    safe = np.clip(at, 0, None)
    inside = (at >= 0) & (times <= ordered["end_ns"].to_numpy(np.int64)[safe]) if starts.size else np.zeros(len(times), bool)
    numbers = ordered["step"].to_numpy(np.int64)[safe] if starts.size else np.zeros(len(times), np.int64)
    return pd.arrays.IntegerArray(np.where(inside, numbers, 0), ~inside)


def _kernel_part(kernels: pd.DataFrame) -> pd.DataFrame:
    codes, names = pd.factorize(kernels["name"])
    duration = (kernels["end"] - kernels["start"]).to_numpy(np.int64)
    total = np.zeros(len(names), np.int64)
    np.add.at(total, codes, duration)  # int64 throughout: no float rounding
    is_comm = np.zeros(len(names), bool)
    is_comm[codes] = kernels["is_comm"].to_numpy(bool)
    summary = pd.DataFrame({"name": np.asarray(names, dtype=object), "count": np.bincount(codes, minlength=len(names)),
                            "total_ns": total, "is_comm": is_comm})
    return summary.sort_values("total_ns", ascending=False, kind="stable")


def _communicator_part(collectives: pd.DataFrame) -> pd.DataFrame:
    # One rank's export names its communicators but not their other members.
    return pd.DataFrame({"comm_id": collectives["comm_id"].drop_duplicates().astype(str).to_numpy(), "ranks": None, "name": None})
