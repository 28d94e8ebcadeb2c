"""The coordinator's durable state in SQLite: agents, sweeps with their node records, uploads, reports.

WAL mode, one connection guarded by a lock (the server's threads share it); every
write is its own transaction, so a killed coordinator restarts from the last
completed change.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path

from rankscope.coordinator.artifacts import UploadHeader, storage_full
from rankscope.coordinator.registry import AgentRecord, UnknownAgent
from rankscope.coordinator.sweeps import Sweep, SweepState, UnknownSweep
from rankscope.errors import InputError, RankscopeError
from rankscope.records import known_fields

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY,
    node TEXT NOT NULL UNIQUE,
    token TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    created_ns INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    sweep_id TEXT NOT NULL REFERENCES sweeps(sweep_id),
    node TEXT NOT NULL,
    state TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (sweep_id, node)
);
CREATE TABLE IF NOT EXISTS uploads (
    upload_id TEXT PRIMARY KEY,
    sweep_id TEXT NOT NULL,
    node TEXT NOT NULL,
    name TEXT NOT NULL,
    kind TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    ranks TEXT NOT NULL,
    completed_ns INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reports (
    sweep_id TEXT PRIMARY KEY REFERENCES sweeps(sweep_id),
    path TEXT NOT NULL,
    created_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sweeps_by_time ON sweeps(created_ns);
-- A node's uploads for a sweep are looked up at each of its statuses (`uploads_of`):
-- by (sweep, node), which serves a sweep's alone too, so the index on sweep alone goes.
DROP INDEX IF EXISTS uploads_by_sweep;
CREATE INDEX IF NOT EXISTS uploads_by_node ON uploads(sweep_id, node);
"""


_UPLOAD_COLUMNS = "upload_id, sweep_id, node, name, size, sha256, kind, ranks"


def _upload(row: tuple) -> UploadHeader:
    """An upload as stored (`_UPLOAD_COLUMNS`); its sha256 the one verified."""
    upload_id, sweep_id, node, name, size, sha256, kind, ranks = row
    return UploadHeader(upload_id, sweep_id, node, name, size, sha256, kind, tuple(json.loads(ranks)))


def _agent(data: str) -> AgentRecord:
    # As sweeps load (`Sweep.from_dict`): a record a newer rankscope stored loads without its new fields.
    return AgentRecord(**known_fields(AgentRecord, json.loads(data)))


class UnreadableSweep(RankscopeError):
    """A stored sweep whose record does not parse (changed by hand, or cut short)."""


def _columns(db: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table of ``db`` with its columns."""
    tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {name: {column for (column,) in db.execute("SELECT name FROM pragma_table_info(?)", (name,))}
            for name in tables}


def _not_ours(db: sqlite3.Connection) -> str | None:
    """Why ``db`` is no coordinator state (another program's SQLite file); None where it is
    one, or empty. Asked before anything is written: the WAL switch and the schema's tables
    would otherwise change a file that is not ours before the first query failed on it."""
    have = _columns(db)
    if not have:
        return None
    with sqlite3.connect(":memory:") as model:
        model.executescript(SCHEMA)
        ours = _columns(model)
    if not have.keys() & ours.keys():
        return f"its tables ({', '.join(sorted(have))}) are none of a rankscope coordinator's"
    for table, columns in ours.items():
        if table in have and (missing := columns - have[table]):
            return f"its table {table} has no column {', '.join(sorted(missing))}"
    return None


class Store:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            if problem := _not_ours(self._db):
                self._db.close()
                raise InputError(f"not a rankscope coordinator state: {problem}; point --data-dir at another folder",
                                 path=self.path)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(SCHEMA)
        except sqlite3.DatabaseError as exc:  # a damaged file, or no SQLite file at all
            raise InputError(f"cannot open the coordinator state ({exc})", path=self.path) from None
        self._lock = threading.Lock()
        self._unreadable: set[str] = set()  # sweeps already logged as left out

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, *statements: tuple[str, tuple]) -> None:
        try:
            with self._lock:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for sql, params in statements:
                        self._db.execute(sql, params)
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:  # a COMMIT that failed (disk full) leaves it open
                        self._db.execute("ROLLBACK")
                    raise
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_FULL:
                raise
            raise storage_full(str(exc), self.path.parent) from None

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # agents -------------------------------------------------------------------------

    def save_agent(self, agent: AgentRecord) -> None:
        self._write(
            ("DELETE FROM agents WHERE node = ? AND agent_id != ?", (agent.node, agent.agent_id)),
            (
                "INSERT INTO agents(agent_id, node, token, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(agent_id) DO UPDATE SET node=excluded.node, token=excluded.token, data=excluded.data",
                (agent.agent_id, agent.node, agent.token, json.dumps(asdict(agent))),
            ),
        )

    def agents(self) -> list[AgentRecord]:
        return [_agent(data) for (data,) in self._read("SELECT data FROM agents ORDER BY node")]

    def agent_by_node(self, node: str) -> AgentRecord | None:
        rows = self._read("SELECT data FROM agents WHERE node = ?", (node,))
        return _agent(rows[0][0]) if rows else None

    def agent_by_token(self, token: str) -> AgentRecord:
        rows = self._read("SELECT data FROM agents WHERE token = ?", (token,)) if token else []
        if not rows:
            raise UnknownAgent("unknown session token: register first")
        return _agent(rows[0][0])

    # sweeps -------------------------------------------------------------------------

    def save_sweep(self, sweep: Sweep, nodes: list[str] | None = None) -> None:
        """Write the sweep, and the given node records (all of them by default)."""
        names = list(sweep.nodes) if nodes is None else nodes
        data = sweep.only(names).to_dict()
        node_data = data.pop("nodes")
        self._write(
            (
                "INSERT INTO sweeps(sweep_id, state, created_ns, data) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(sweep_id) DO UPDATE SET state=excluded.state, data=excluded.data",
                (sweep.sweep_id, sweep.state.value, sweep.created_ns, json.dumps(data)),
            ),
            *(
                (
                    "INSERT INTO nodes(sweep_id, node, state, data) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT(sweep_id, node) DO UPDATE SET state=excluded.state, data=excluded.data",
                    (sweep.sweep_id, name, sweep.nodes[name].state.value, json.dumps(node_data[name])),
                )
                for name in names
            ),
        )

    def sweep(self, sweep_id: str) -> Sweep:
        rows = self._read("SELECT data FROM sweeps WHERE sweep_id = ?", (sweep_id,))
        if not rows:
            raise UnknownSweep(f"no sweep {sweep_id!r}")
        return self._assemble(sweep_id, rows[0][0])

    def sweeps(self, limit: int = 0, states: tuple[SweepState, ...] = ()) -> list[Sweep]:
        """Newest first."""
        sql = "SELECT sweep_id, data FROM sweeps"
        params: tuple = ()
        if states:
            sql += f" WHERE state IN ({','.join('?' * len(states))})"
            params = tuple(s.value for s in states)
        sql += " ORDER BY created_ns DESC, sweep_id DESC"
        if limit > 0:
            sql += f" LIMIT {int(limit)}"
        found = []
        for sweep_id, data in self._read(sql, params):
            try:
                found.append(self._assemble(sweep_id, data))
            except UnreadableSweep as exc:  # one bad record must not hide every other sweep
                if sweep_id not in self._unreadable:
                    self._unreadable.add(sweep_id)
                    log.warning("%s; left out of listings", exc)
        return found

    def _assemble(self, sweep_id: str, data: str) -> Sweep:
        rows = self._read("SELECT node, data FROM nodes WHERE sweep_id = ?", (sweep_id,))
        try:
            return Sweep.from_dict({**json.loads(data), "nodes": {node: json.loads(rec) for node, rec in rows}})
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise UnreadableSweep(f"stored sweep {sweep_id} cannot be read ({type(exc).__name__}: {exc})",
                                  path=self.path) from None

    # uploads ------------------------------------------------------------------------

    def record_upload(self, header: UploadHeader, at_ns: int) -> None:
        """A completed upload: its bytes were found to have the header's sha256 (the writer refuses others)."""
        self._write(
            (
                "INSERT OR REPLACE INTO uploads(upload_id, sweep_id, node, name, kind, size, sha256, ranks, completed_ns) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (header.upload_id, header.sweep_id, header.node, header.name, header.kind, header.size,
                 header.sha256, json.dumps(list(header.ranks)), at_ns),
            )
        )

    def completed_upload(self, upload_id: str) -> UploadHeader | None:
        """A completed upload (its sha256 the one verified), or None."""
        rows = self._read(f"SELECT {_UPLOAD_COLUMNS} FROM uploads WHERE upload_id = ?", (upload_id,))
        return _upload(rows[0]) if rows else None

    def uploads(self, sweep_id: str | None = None) -> list[UploadHeader]:
        """Completed uploads (the sha256 verified), of one sweep or all, in the order they completed."""
        sql = f"SELECT {_UPLOAD_COLUMNS} FROM uploads"
        params: tuple = ()
        if sweep_id is not None:
            sql, params = sql + " WHERE sweep_id = ?", (sweep_id,)
        return [_upload(row) for row in self._read(sql + " ORDER BY completed_ns, upload_id", params)]

    def uploads_of(self, sweep_id: str, node: str) -> list[UploadHeader]:
        """``node``'s completed uploads for the sweep."""
        return [_upload(row) for row in self._read(f"SELECT {_UPLOAD_COLUMNS} FROM uploads WHERE sweep_id = ? AND node = ?",
                                                   (sweep_id, node))]

    def latest_upload(self, sweep_id: str, node: str, name: str) -> UploadHeader | None:
        """The last completed upload of ``node``'s file ``name`` in the sweep, or None."""
        rows = self._read(f"SELECT {_UPLOAD_COLUMNS} FROM uploads WHERE sweep_id = ? AND node = ? AND name = ? "
                          "ORDER BY completed_ns DESC, upload_id DESC LIMIT 1", (sweep_id, node, name))
        return _upload(rows[0]) if rows else None

    # reports ------------------------------------------------------------------------

    def save_report(self, sweep_id: str, path: Path, at_ns: int) -> None:
        self._write(
            ("INSERT OR REPLACE INTO reports(sweep_id, path, created_ns) VALUES (?, ?, ?)", (sweep_id, str(path), at_ns))
        )

    def report_path(self, sweep_id: str) -> Path | None:
        rows = self._read("SELECT path FROM reports WHERE sweep_id = ?", (sweep_id,))
        return Path(rows[0][0]) if rows else None
