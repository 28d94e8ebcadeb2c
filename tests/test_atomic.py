"""Replacing a file whole: the old file or the new one; a state file's writer gets the
OSError as it is, a user's output one clear error."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from rankscope import atomic, output
from rankscope.errors import InputError


@pytest.mark.parametrize("replacing, error, message", [
    (atomic.replacing, OSError, "No space left"),  # a state file: the OSError as it is
    (output.replacing, InputError, "report.json: cannot write the output \\(No space left on device\\)"),  # a user's output
])
def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_behind(tmp_path: Path, replacing, error, message) -> None:
    path = tmp_path / "report.json"
    path.write_text("old")
    with pytest.raises(error, match=message):
        with replacing(path) as tmp:
            tmp.write_text("half")
            raise OSError(28, "No space left on device")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_the_temporary_name_escapes_readers_globbing_the_suffix(tmp_path: Path) -> None:
    seen = []
    with atomic.replacing(tmp_path / "123.json") as tmp:
        tmp.write_text("{}")
        seen = sorted(p.name for p in tmp_path.glob("*.json"))
    assert seen == [] and tmp.suffix == ".tmp"
    with atomic.replacing(tmp_path / "plot.png", keep_suffix=True) as tmp:
        assert tmp.suffix == ".png"
        tmp.write_bytes(b"png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["123.json", "plot.png"]


def test_writers_in_two_threads_never_share_a_temporary_file(tmp_path: Path) -> None:
    names: list[Path] = []
    inside = threading.Barrier(2)

    def write() -> None:
        with atomic.replacing(tmp_path / "j.json") as tmp:
            names.append(tmp)
            inside.wait(timeout=10)
            tmp.write_text(str(threading.get_ident()))

    threads = [threading.Thread(target=write) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(names)) == 2 and (tmp_path / "j.json").read_text().isdigit()


def test_durable_writes_sync_the_file_and_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real = os.fsync

    def fsync(handle: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{handle}"))
        real(handle)

    monkeypatch.setattr(os, "fsync", fsync)
    atomic.write_text(tmp_path / "journal.json", '{"paused": true}', durable=True)
    assert (tmp_path / "journal.json").read_text() == '{"paused": true}'
    assert len(synced) == 2 and synced[0].endswith(".tmp") and synced[1] == str(tmp_path)
    atomic.write_text(tmp_path / "spool.json", "{}")
    assert len(synced) == 2


def test_temporary_files_of_writers_killed_mid_write_are_removed_and_nothing_else(tmp_path: Path) -> None:
    names = []
    for path, keep_suffix in ((tmp_path / "state.json", False), (tmp_path / "report.png", True)):
        with atomic.replacing(path, keep_suffix=keep_suffix) as tmp:
            tmp.write_text("x")
            names.append(tmp.name)  # as a writer killed before the rename leaves it
    others = ["state.json", "report.png", ".hidden", "state.json.tmp", ".x.12.tmp", "a.1.2.tmp"]
    for name in names + others:
        (tmp_path / name).write_text("x")
    removed = atomic.remove_left_behind(tmp_path)
    assert sorted(p.name for p in removed) == sorted(names)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)
