"""Writing a user's output: whole or not at all, one clear error where it cannot be."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from rankscope import output
from rankscope.errors import InputError, TransportError


def test_a_whole_write_replaces_and_keeps_the_suffix_for_writers_that_go_by_it(tmp_path: Path) -> None:
    path = tmp_path / "plot.png"
    with output.replacing(path) as tmp:
        assert tmp.suffix == ".png" and tmp.parent == tmp_path
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_a_writer_that_fails_with_its_own_error_is_not_told_as_a_write_failure(tmp_path: Path) -> None:
    # A download cut off while its file is written: a TransportError is an OSError too, and
    # came out as "cannot write the output", exit 2
    path = tmp_path / "rank0.sqlite"
    path.write_bytes(b"old")
    with pytest.raises(TransportError, match="^coordinator unreachable$"):
        with output.replacing(path) as tmp:
            tmp.write_bytes(b"half")
            raise TransportError("coordinator unreachable")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["rank0.sqlite"]


def test_where_output_plainly_cannot_go(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="output is a folder"):
        output.check_writable(tmp_path)
    with pytest.raises(InputError, match=f"r.json: folder {tmp_path / 'missing'} does not exist$"):
        output.check_writable(tmp_path / "missing" / "r.json")
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=f"file/sub: cannot create the folder \\({tmp_path / 'file'} is not a folder\\)$"):
        output.make_folder(tmp_path / "file" / "sub")


@pytest.mark.parametrize("under", ["x", "sub/x"])
def test_an_output_under_a_file_names_that_file_not_a_missing_folder(tmp_path: Path, under: str) -> None:
    # found by review: `digest -o FILE/x` said "output folder does not exist", which sent one to mkdir
    (tmp_path / "file").write_text("")
    with pytest.raises(InputError, match=f"^{tmp_path / 'file' / under}: {tmp_path / 'file'} is not a folder$"):
        output.check_writable(tmp_path / "file" / under)


def test_a_folder_that_takes_no_files_is_found_before_any_work() -> None:
    """/proc refuses new files to root as to anyone: a permission check would pass for root."""
    with pytest.raises(InputError, match="^/proc/report.json: cannot write in its folder"):
        output.check_writable(Path("/proc/report.json"))
    with pytest.raises(InputError, match="^/proc: cannot write in the folder"):
        output.make_folder(Path("/proc"))


def test_a_stream_is_written_into_not_replaced_by_a_file() -> None:
    # found by review: `digest -o /dev/null`, run as root, renamed a file over /dev/null;
    # a terminal is a stream too, and a test can read what went into it
    main, terminal = os.openpty()
    try:
        name = Path(os.ttyname(terminal))
        output.check_writable(name)
        output.write_text(name, "report\n")
        assert os.read(main, 100).startswith(b"report") and stat.S_ISCHR(name.stat().st_mode)
    finally:
        os.close(terminal)
        os.close(main)


@pytest.mark.parametrize("kind", ["FIFO", "socket"])
def test_a_fifo_or_socket_is_refused_before_any_work_not_waited_on(tmp_path: Path, kind: str) -> None:
    # `analyze -o FIFO` with no reader waited for ever in the writer's open; a socket's
    # open failed only once the work was done
    path = tmp_path / "out"
    if kind == "FIFO":
        os.mkfifo(path)
    else:
        listening = socket.socket(socket.AF_UNIX)
        listening.bind(str(path))
        listening.close()
    said = f"^{path}: a {kind}( \\(named pipe\\))?, not a regular file: "
    with pytest.raises(InputError, match=said):
        output.check_writable(path)
    with pytest.raises(InputError, match=said):
        output.write_text(path, "report\n")
    assert not stat.S_ISREG(path.lstat().st_mode) and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_link_stays_a_link_to_the_file_replaced_whole(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    real = tmp_path / "runs" / "report.json"
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    output.check_writable(link)
    output.write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["latest.json", "report.json", "runs"]


@pytest.mark.parametrize("target", ["runs/report.json", "{tmp}/missing/report.json"])
def test_a_dangling_link_is_refused_not_replaced_by_a_file_nor_written_through(tmp_path: Path, target: str) -> None:
    # found by fuzzing the outputs: `analyze -o latest.json`, latest.json a link to a report
    # not yet written, replaced the link with a file
    link = tmp_path / "latest.json"
    link.symlink_to(target.format(tmp=tmp_path))
    said = f"^{link}: a dangling link \\(to {tmp_path}/(runs|missing)/report.json\\): not written through, as cp does not"
    with pytest.raises(InputError, match=said):
        output.check_writable(link)
    with pytest.raises(InputError, match=said):
        output.write_text(link, "new")
    assert link.is_symlink() and [p.name for p in tmp_path.iterdir()] == ["latest.json"]


@pytest.mark.parametrize("links", [{"loop": "loop"}, {"loop": "other", "other": "loop"}])
def test_a_link_in_a_loop_is_named_as_one_not_its_folder(tmp_path: Path, links: dict[str, str]) -> None:
    # `analyze -o loop` said "loop: cannot look into folder . (Too many levels of symbolic
    # links)", blaming the folder; `replacing` alone called the loop a dangling link
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
    loop = tmp_path / "loop"
    with pytest.raises(InputError, match=f"^{loop}: a symlink loop \\(Too many levels of symbolic links\\)$"):
        output.check_writable(loop)
    with pytest.raises(InputError, match=f"^{loop}: a symlink loop "):
        output.write_text(loop, "report\n")
    for under in (loop / "report.json", loop / "sub" / "report.json"):
        with pytest.raises(InputError, match=f"^{under}: {loop} is a symlink loop \\(Too many levels of symbolic links\\)$"):
            output.check_writable(under)
    with pytest.raises(InputError, match=f"^{loop / 'sub'}: {loop} is a symlink loop "):
        output.make_folder(loop / "sub")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(links)


@pytest.mark.parametrize("name", ["/dev/fd/{fd}", "/proc/self/fd/{fd}", "{tmp}/link"])
def test_a_file_named_through_an_open_descriptor_is_written_into_at_its_offset(tmp_path: Path, name: str) -> None:
    # found by review: `-o /dev/stdout >> log` renamed a new file over log, whose lines were
    # lost, and what the command printed after went to the file taken away
    log = tmp_path / "log"
    log.write_text("earlier\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        (tmp_path / "link").symlink_to(f"/dev/fd/{fd}")
        path = Path(name.format(fd=fd, tmp=tmp_path))
        inode = log.stat().st_ino
        output.check_writable(path)
        output.write_text(path, "report\n")
        os.write(fd, b"later\n")
    finally:
        os.close(fd)
    assert log.read_text() == "earlier\nreport\nlater\n" and log.stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "log"]


def test_a_writer_that_fails_writes_nothing_into_a_descriptor(tmp_path: Path) -> None:
    log = tmp_path / "log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(TransportError), output.replacing(Path(f"/dev/fd/{fd}")) as tmp:
            tmp.write_text("half")
            raise TransportError("coordinator unreachable")
    finally:
        os.close(fd)
    assert log.read_text() == ""
