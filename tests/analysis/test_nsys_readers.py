"""An export's rows read by ADBC's SQLite driver (into Arrow) are the rows the sqlite3
module reads; an export the driver cannot read as the statements promise is read again
by sqlite3, whose reading names what is wrong."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from rankscope.analysis import nsys, nsys_export, simulate
from rankscope.errors import ExportError


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, seed=3)
    return simulate.simulate(spec, tmp_path_factory.mktemp("sim"))[0]


def _copy(export: Path, copy: Path, *statements: str) -> Path:
    copy.write_bytes(export.read_bytes())
    with sqlite3.connect(copy) as db:
        for statement in statements:
            db.execute(statement)
    return copy


def _big(export: Path, copy: Path, *statements: str) -> Path:
    """A copy with every kernel 100 times over, then ``statements``: an export the size the
    Arrow reader reads, with more rows than the driver's first batch (1,024), the rows it
    types each column by."""
    copies = ("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT k.* FROM CUPTI_ACTIVITY_KIND_KERNEL AS k, "
              "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100) SELECT i FROM n)")
    big = _copy(export, copy, copies, *statements)
    assert big.stat().st_size >= nsys_export.ARROW_FROM_BYTES
    return big


def _assert_same_rows(arrow: dict, rows: dict) -> None:
    assert arrow.keys() == rows.keys()
    for name, value in arrow.items():
        if name == "nvtx":
            (ints, names, blobs), (sql_ints, sql_names, sql_blobs) = value, rows[name]
            _assert_same_array(ints, sql_ints)
            assert names == sql_names and blobs == sql_blobs
        elif isinstance(value, np.ndarray):
            _assert_same_array(value, rows[name])
        else:
            assert value == rows[name], name


def _assert_same_array(array: np.ndarray, expected: np.ndarray) -> None:
    assert array.dtype == expected.dtype == np.int64 and array.shape == expected.shape
    assert np.array_equal(array, expected)


def _read_by_arrow(path: Path) -> dict:
    """The Arrow reader's rows, failing where it would hand the export to sqlite3."""
    try:
        return nsys_export._read_arrow(path)
    except nsys_export._Unread as exc:
        pytest.fail(f"{path.name} was not read by the Arrow reader: {exc}")


def test_a_simulated_export_reads_to_the_same_rows_through_either_reader(export: Path, tmp_path: Path) -> None:
    big = _big(export, tmp_path / "big.sqlite")
    for path in (export, big):
        rows = nsys_export._read_rows(path)
        _assert_same_rows(_read_by_arrow(path), rows)
    assert len(rows["kernels"]) > 1024


def test_a_big_export_is_read_by_the_arrow_reader_alone(export: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    big = _big(export, tmp_path / "big.sqlite")
    rows = nsys_export._read_rows(big)
    monkeypatch.setattr(nsys_export, "_read_rows", lambda path: pytest.fail(f"{path.name} read by sqlite3"))
    assert nsys_export.read_file(big).kernels.tolist() == rows["kernels"].tolist()


def test_a_small_export_is_read_by_sqlite3_alone(export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert export.stat().st_size < nsys_export.ARROW_FROM_BYTES
    rows = nsys_export._read_rows(export)
    monkeypatch.setattr(nsys_export, "_read_arrow", lambda path: pytest.fail(f"{path.name} read by ADBC"))
    assert nsys_export.read_file(export).kernels.tolist() == rows["kernels"].tolist()


def test_the_real_exports_read_to_the_same_rows_through_either_reader(samples: Path) -> None:
    paths = sorted((samples / "nsys").glob("*/*.sqlite"))
    assert len(paths) == 4
    for path in paths:
        _assert_same_rows(_read_by_arrow(path), nsys_export._read_rows(path))


_LAST_KERNEL = "(SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"
_NCCL_LAUNCH = ("(SELECT max(r.rowid) FROM CUPTI_ACTIVITY_KIND_RUNTIME AS r JOIN CUPTI_ACTIVITY_KIND_KERNEL AS k "
                "ON k.correlationId = r.correlationId JOIN StringIds AS s ON s.id = k.demangledName "
                "WHERE s.value LIKE 'nccl%')")


# nsys declares NVTX_EVENTS.start NOT NULL; an export made or edited by another tool may not.
_NULL_STEP_START = (
    "PRAGMA writable_schema = ON",
    "UPDATE sqlite_master SET sql = replace(sql, 'start                       INTEGER   NOT NULL', "
    "'start                       INTEGER') WHERE name = 'NVTX_EVENTS'",
    "PRAGMA writable_schema = RESET",
    "UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE text LIKE 'step%')",
)


@pytest.mark.parametrize("edit, statement", [
    # A text or a real in the driver's first batch turned the column to text or double; past it,
    # the driver failed. A real with a fraction was truncated by the sqlite3 reader, and one in a
    # globalPid or globalTid by SQLite's >>: each is refused by both readers, naming the statement.
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 1", "kernels"),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 1e300 WHERE rowid = 1", "kernels"),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 0.5 WHERE rowid = 1", "kernels"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = {_LAST_KERNEL}", "kernels"),
    (f'UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + 0.5 WHERE rowid = {_LAST_KERNEL}', "kernels"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = globalPid + 0.5 WHERE rowid = {_LAST_KERNEL}", "kernels"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = 1234.5 WHERE rowid = {_LAST_KERNEL}", "kernels"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 0.5 WHERE rowid = {_LAST_KERNEL}", "kernels"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = streamId + 0.5 WHERE rowid = {_LAST_KERNEL}", "kernels"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = globalTid + 0.5 WHERE rowid = {_NCCL_LAUNCH}", "launches"),
    (f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = start + 0.5 WHERE rowid = {_NCCL_LAUNCH}", "launches"),
    ("UPDATE NVTX_EVENTS SET start = start + 0.5 WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS)", "nvtx"),
    ("UPDATE NVTX_EVENTS SET globalTid = globalTid + 0.5 WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS)", "nvtx"),
    # A NULL start read as 0: the step's range began at the session start (or in 1970), unsaid.
    (_NULL_STEP_START, "nvtx"),
])
def test_a_non_integer_where_integers_are_read_is_refused_by_either_reader(
        export: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: str | tuple, statement: str) -> None:
    edits = (edit,) if isinstance(edit, str) else edit
    small = _copy(export, tmp_path / "small.sqlite", *edits)
    big = _big(export, tmp_path / "big.sqlite", *edits)
    for path, arrow in ((small, False), (small, True), (big, None)):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=nsys_export.__name__):
            with pytest.raises(ExportError) as err:
                nsys_export.read_file(path, arrow=arrow)
        assert str(err.value) == (f"{path}: its {statement} rows hold a NULL or a non-integer where integers are read "
                                  "(times, process and thread ids)")
        if arrow is not False:  # the driver gave it NULL: read again, and refused, by sqlite3
            (again,) = [r.getMessage() for r in caplog.records if "read again with sqlite3" in r.getMessage()]
            assert f"{statement} holds a NULL" in again


@pytest.mark.parametrize("column", ["start", "globalPid", "deviceId"])
def test_a_real_in_a_copy_is_refused_by_either_reader(samples: Path, tmp_path: Path, column: str) -> None:
    # The simulated exports hold no copies: a real one's, its value given a fraction.
    export = sorted((samples / "nsys" / "dsl_2node_2rank_allreduce").glob("*.sqlite"))[0]
    copy = _copy(export, tmp_path / "edited.sqlite",
                 f"UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET {column} = 1234.5 WHERE rowid = 1")
    for arrow in (False, True):
        with pytest.raises(ExportError, match="its copies rows hold a NULL or a non-integer"):
            nsys_export.read_file(copy, arrow=arrow)


def test_text_the_driver_would_take_as_integers_is_read_as_sqlite3_reads_it(export: Path, tmp_path: Path) -> None:
    # A process id stored as text: the sqlite3 module gives the text, which stays unmatched
    # (no kernel's pid); the driver would give the column as text too, or fail past its
    # first batch. Either way the rows are sqlite3's.
    copy = _big(export, tmp_path / "edited.sqlite", "UPDATE TARGET_INFO_CUDA_DEVICE SET pid = 'x' WHERE rowid = 1")
    with pytest.raises(nsys_export._Unread, match="cuda_devices gave string"):
        nsys_export._read_arrow(copy)
    assert {type(pid) for pid, _ in nsys_export.read_file(copy).cuda_devices} == {str, int}


def test_big_exports_are_read_on_threads_to_the_same_digest_as_on_one(export: Path, tmp_path: Path) -> None:
    paths = [_big(export, tmp_path / f"big{i}.sqlite") for i in range(3)] + [export]
    assert nsys.read_many(paths, workers=3).equals(nsys.read_many(paths, workers=1))


def test_threads_and_this_one_read_in_order_no_more_than_workers_plus_2_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [Path(f"{i}.sqlite") for i in range(12)]
    started: list[tuple[int, str, bool | None]] = []
    lock = threading.Lock()

    def read_file(path: Path, *, arrow: bool | None = None) -> Path:
        with lock:
            started.append((int(path.stem), threading.current_thread().name, arrow))
        time.sleep(0.01 if int(path.stem) % 3 else 0.03)  # some slower: readers run ahead
        return path

    monkeypatch.setattr(nsys, "read_file", read_file)
    taken = []
    for path in nsys._read_files(paths, workers=3):
        with lock:
            assert max(i for i, _, _ in started) <= len(taken) + 5, "read more than 5 ahead of the one taken"
        taken.append(path)
    assert taken == paths
    assert sorted(i for i, _, _ in started) == list(range(12)), "each export read once"
    readers = {(name, arrow) for _, name, arrow in started}
    # Threads read with the driver (no GIL); this thread as read_file chooses by size.
    assert readers == {("MainThread", None), ("rankscope-read-0", True), ("rankscope-read-1", True)}, readers
    assert not [t for t in threading.enumerate() if t.name.startswith("rankscope-read")]


def test_on_threads_the_first_bad_export_in_order_is_the_error(export: Path, tmp_path: Path) -> None:
    big = _big(export, tmp_path / "big.sqlite")
    bad = [tmp_path / f"bad{i}.sqlite" for i in range(2)]
    for path in bad:
        path.write_bytes(b"\0" * nsys_export.ARROW_FROM_BYTES)
    with pytest.raises(ExportError, match="not an SQLite export") as err:
        nsys.read_many([big, bad[0], big, bad[1]], workers=2)
    assert str(bad[0]) in str(err.value)
    assert not [t for t in threading.enumerate() if t.name.startswith("rankscope-read")]
