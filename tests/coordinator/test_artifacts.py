"""The part file an upload is appended to: direct writes where the file system takes them, buffered otherwise."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rankscope.coordinator import artifacts as art

DATA = os.urandom(3 * art.ALIGN * 100 + 777)


def append(path: Path, start: int, sizes: list[int], *, direct: bool = True) -> art.PartFile:
    """DATA[start:] in pieces of ``sizes`` (cycled), not yet closed."""
    part = art.PartFile(path, start, direct=direct)
    offset, i = start, 0
    while offset < len(DATA):
        piece = DATA[offset : offset + sizes[i % len(sizes)]]
        part.write(memoryview(piece) if i % 2 else piece)
        offset += len(piece)
        i += 1
    return part


@pytest.mark.parametrize("start", [0, 1000, art.ALIGN, 3 * art.ALIGN + 5])
@pytest.mark.parametrize("sizes", [[1 << 20], [65536], [1000, 5000, 4096, 3], [2 * art._DIRECT_BUFFER]])
def test_the_file_holds_every_byte_after_close(tmp_path: Path, start: int, sizes: list[int]) -> None:
    path = tmp_path / "u.part"
    path.write_bytes(DATA[:start])  # what an earlier stream committed
    part = append(path, start, sizes)
    assert len(DATA) - art.ALIGN < path.stat().st_size <= len(DATA)  # less than one block waits for close
    part.close()
    assert path.read_bytes() == DATA


@pytest.mark.parametrize("direct", [False, "unavailable"])
def test_without_direct_io_writes_are_buffered_with_early_writeback(tmp_path: Path, monkeypatch, direct) -> None:
    if direct == "unavailable":
        monkeypatch.setattr(art, "_open_direct", lambda path: None)
    monkeypatch.setattr(art, "WRITEBACK_BYTES", 100_000)
    advised: list[tuple[int, int]] = []
    fadvise = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, at, n, how: advised.append((at, n)) or fadvise(fd, at, n, how))
    path = tmp_path / "u.part"
    path.write_bytes(DATA[:1000])
    append(path, 1000, [65536], direct=bool(direct)).close()
    assert path.read_bytes() == DATA
    assert advised[0][0] == 1000 and all(n >= 100_000 for _, n in advised)
    assert all(a + n == b for (a, n), (b, _) in zip(advised, advised[1:]))


def test_a_file_system_refusing_a_direct_write_gets_buffered_writes(tmp_path: Path, monkeypatch) -> None:
    def refuse(fd, data, offset):
        raise OSError(errno.EINVAL, "Invalid argument")

    path = tmp_path / "u.part"
    part = art.PartFile(path, 0)
    part.write(DATA[:5000])  # one direct write, 904 bytes staged
    monkeypatch.setattr(os, "pwrite", refuse)
    part.write(DATA[5000:])
    part.close()
    assert path.read_bytes() == DATA


def test_other_write_errors_are_raised(tmp_path: Path, monkeypatch) -> None:
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    part = art.PartFile(tmp_path / "u.part", 0)
    with pytest.raises(OSError, match="No space"):
        part.write(DATA)
    part.release()
