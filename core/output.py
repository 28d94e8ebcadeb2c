"""Writing a user's output file: whole or not at all, and a clear error where it cannot be.

A report, plot, digest or simulated export replaces its destination whole
(`rankscope.atomic`), the file a link leads to where it is one (a dangling link is
refused, as cp refuses it); a stream (/dev/null, a terminal) is written into, and so, once
the writer is done, is a file named through one of the process's open descriptors
(/dev/stdout, /dev/fd/3: a pipe the shell made). A FIFO, a socket or a block device is
refused before any work. Where the folder cannot take it (no permission, read-only,
full, not a real folder), the OSError becomes one :class:`InputError` naming the
destination, and nothing is left behind."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from rankscope import atomic
from rankscope.errors import InputError, RankscopeError, shown


# Names we make from users' names (node names run to 253 characters) fit a file name
# (NAME_MAX 255) with room for a suffix.
MAX_NAME = 200
_HASH_CHARS = 32


def bounded(name: str, limit: int = MAX_NAME) -> str:
    """``name`` where it fits ``limit``, else its head (still readable) and a hash of the
    whole, which keeps it apart from every other name."""
    if len(name) <= limit:
        return name
    whole = hashlib.sha256(name.encode()).hexdigest()[:_HASH_CHARS]
    return f"{name[:limit - _HASH_CHARS - 1].rstrip('.')}.{whole}"


def check_writable(path: Path) -> None:
    """Fail before any work where ``path`` plainly cannot be written."""
    check_reachable(path)
    if path.is_dir():
        raise InputError("output is a folder", path=path)
    target = _target(path)
    if target is None:
        if not os.access(path, os.W_OK):
            raise InputError("cannot write to it (permission denied)", path=path)
        return
    if not target.parent.is_dir():
        raise InputError(_no_folder(target.parent), path=path)
    if reason := _unwritable(target.parent):
        raise InputError(f"cannot write in its folder ({reason})", path=path)


def _target(path: Path) -> Path | None:
    """The file that takes ``path``'s new content whole: ``path``, or the file a link there
    leads to (the link stays a link; one that leads to no file is refused). None where
    ``path`` is no file but a stream (/dev/null, a terminal) or a file named through a
    descriptor (`_descriptor`): written into, as a shell's ``>`` does; a rename over it
    would put a file in its place, as root even in /dev. A FIFO, a socket or a block
    device is refused (`_NOT_WRITTEN_INTO`)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        check_reachable(path)  # a link in a loop, a folder that refuses a look: named as check_writable names them
        if os.path.islink(path):
            # A rename put a file in the link's place; written through, a file would appear
            # where the user never named one (a link planted in a shared folder leads anywhere).
            raise InputError(f"a dangling link (to {shown(os.path.realpath(path))}): not written through, as cp does not "
                             "(remove the link, or name its file)", path=path) from None
        return path  # none there yet
    if _descriptor(path) is not None:
        return None
    if (why := _NOT_WRITTEN_INTO.get(stat.S_IFMT(mode))) is not None:
        raise InputError(why, path=path)
    if not stat.S_ISREG(mode):
        return None
    return path.resolve() if path.is_symlink() else path


# Files that are neither replaced nor written into, refused before any work. A FIFO's open
# waits for a reader, for ever where none comes; whether one waits cannot be asked without
# opening it, and a probe's close would end that reader's input. One named through a
# descriptor (/dev/stdout, a shell's >(...)) is written through it, which does not wait.
_NOT_WRITTEN_INTO = {
    stat.S_IFIFO: "a FIFO (named pipe), not a regular file: writing would wait for a reader "
                  "(to pipe the output, name /dev/stdout)",
    stat.S_IFSOCK: "a socket, not a regular file: it cannot be opened to write",
    stat.S_IFBLK: "a block device, not a regular file: writing would overwrite the disk's data",
}


_MAX_LINKS = 40  # the kernel's own limit on links followed in one lookup (ELOOP)


def _descriptor(path: Path) -> int | None:
    """The open descriptor of this process that ``path`` names, itself or through links
    (/dev/stdout leads to /proc/self/fd/1); None where it names none. The file behind one
    (`>> log`) is written through it: a rename over the file would leave the stream writing
    to the file taken away, and drop what it held."""
    own = Path(f"/proc/{os.getpid()}/fd")
    for _ in range(_MAX_LINKS):
        try:
            if path.name.isdigit() and path.parent.resolve() == own:
                return int(path.name)
            if not path.is_symlink():
                return None
            path = path.parent / os.readlink(path)
        except OSError:
            return None
    return None


def check_not_input(path: Path, inputs: Iterable[Path]) -> None:
    """Fail where ``path`` is one of ``inputs`` (by file identity, so through links too):
    the output would replace a capture that may not be taken again."""
    try:
        target = path.stat()
    except OSError:
        return  # not there yet: it is no input
    for source in inputs:
        try:
            same = os.path.samestat(source.stat(), target)
        except OSError:
            continue
        if same:
            raise InputError("the output is one of the inputs: writing it would destroy that input", path=path)


def open_to_others(fd: int, mode: int) -> None:
    """Give the file open as ``fd`` ``mode`` whatever the umask, so that other users' processes
    can open (and lock) it; where the file is another user's, or its filesystem keeps no modes,
    as it is (its maker opened it so)."""
    with contextlib.suppress(OSError):
        os.fchmod(fd, mode)


def create_shared(path: Path) -> None:
    """Create the folder ``path`` (in an existing parent) sticky and writable by all (1777,
    like /tmp), so other users' processes write in it too and none removes another's files;
    one that exists keeps its maker's mode. OSError as mkdir raises it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir()
        path.chmod(0o777 | stat.S_ISVTX)  # mkdir's mode would lose the bits the umask clears


def make_folder(path: Path, *, shared: bool = False) -> Path:
    """``path`` as a folder to write in, created with its parents where missing; ``shared``:
    created as `create_shared` does."""
    check_folder(path)
    try:
        if shared:
            path.parent.mkdir(parents=True, exist_ok=True)
            create_shared(path)
        else:
            path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a folder on the way should be
        raise InputError(f"cannot create the folder ({_no_folder(path)})", path=path) from None
    except OSError as exc:
        raise InputError(f"cannot create the folder ({exc.strerror or exc})", path=path) from None
    _check_writable_in(path, path)
    return path


def check_folder(path: Path) -> None:
    """The InputError `make_folder` raises, raised before anything is made: where something
    not a folder is in the place of ``path`` or of a folder above it, or where the nearest of
    them that exists cannot be written in. A layout of several folders is checked whole
    before any is made."""
    check_reachable(path)
    if (nearest := _nearest(path)) is None:
        return
    if not nearest.is_dir():
        raise InputError("not a folder" if nearest == path else f"cannot create the folder ({shown(nearest)} is not a folder)",
                         path=path)
    _check_writable_in(nearest, path)


def _check_writable_in(folder: Path, path: Path) -> None:
    """An InputError naming ``path`` where ``folder`` (``path`` itself, or the folder it
    would be made in) cannot be written in."""
    if reason := _unwritable(folder):
        raise InputError(f"cannot write in the folder ({reason})" if folder == path else f"cannot create the folder ({reason})",
                         path=path)


def check_reachable(path: Path) -> None:
    """An InputError where a folder on the way to ``path`` may not be looked into (no x
    permission), or where ``path`` or a folder on its way is a link that leads round in a
    loop: pathlib's exists() and is_dir() raise there rather than answer. The folder named
    is the deepest one that can still be seen; the loop, the name under it."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        if (loop := symlink_loop(path, exc)) is not None:
            raise InputError(loop, path=path) from None
        raise InputError(f"cannot look into folder {shown(_deepest_seen(path))} ({exc.strerror or exc})", path=path) from None


def symlink_loop(path: Path, exc: OSError) -> str | None:
    """What to say of ``exc``, an OSError of looking at ``path``, where it is a link in a
    loop (``path`` itself, or one on its way: the name under the deepest folder that can be
    seen); None for any other OSError."""
    if exc.errno != errno.ELOOP:
        return None
    blocked = _deepest_seen(path)  # the folder could be seen: the link in it is at fault
    looping = next(below for below in (path, *path.parents) if below.parent == blocked)
    what = "a symlink loop" if looping == path else f"{shown(looping)} is a symlink loop"
    return f"{what} ({exc.strerror})"


def _deepest_seen(path: Path) -> Path:
    return next((above for above in path.parents if _seen(above)), path.parent)


def _seen(path: Path) -> bool:
    try:
        path.stat()
    except OSError:
        return False
    return True


def _no_folder(folder: Path) -> str:
    """Why ``folder`` is not there to write in: something not a folder in its place or in
    that of one above it (which the user has to move), else that it does not exist."""
    blocker = _in_the_way(folder)
    return f"{shown(blocker)} is not a folder" if blocker is not None else f"folder {shown(folder)} does not exist"


def _in_the_way(folder: Path) -> Path | None:
    """What is not a folder in the place of ``folder`` or of the nearest folder above it that
    exists; None where that is a folder."""
    above = _nearest(folder)
    return above if above is not None and not above.is_dir() else None


def _nearest(folder: Path) -> Path | None:
    """``folder``, or the nearest folder above it, that exists."""
    return next((above for above in (folder, *folder.parents) if above.exists()), None)


def _unwritable(folder: Path) -> str | None:
    """Why a file cannot be made in ``folder``, found by making and removing one (a
    permission check says too little: root on a read-only mount, /proc); None if it can."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".rankscope-probe-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """The block's OSError as one InputError naming ``path``; a RankscopeError of the
    writer's own (a TransportError is an OSError too) passes as it is, and so does a
    BrokenPipeError: a pipe's reader gone (`-o /dev/stdout | head`) is no user mistake,
    and the CLI ends quietly on it as for what it prints."""
    try:
        yield
    except (RankscopeError, BrokenPipeError):
        raise
    except OSError as exc:
        raise InputError(f"cannot write the output ({exc.strerror or exc})", path=path) from None


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """`atomic.replacing` with ``path``'s own suffix (writers that go by it still can),
    its OSError one InputError naming ``path`` (`writing`); a stream (`_target`) is
    written into, a descriptor (`_descriptor`) once the writer is done (`_into`)."""
    path = Path(path)
    with writing(path):
        if (fd := _descriptor(path)) is not None:
            with _into(fd, path.suffix) as tmp:
                yield tmp
        elif (target := _target(path)) is None:
            yield path
        else:
            with atomic.replacing(target, keep_suffix=True) as tmp:
                yield tmp


@contextlib.contextmanager
def _into(fd: int, suffix: str) -> Iterator[Path]:
    """A temporary file for the writer, whose content then goes into descriptor ``fd`` at
    its offset (a file opened to append is appended to), after what the process has
    printed so far; nothing where the writer fails."""
    with tempfile.TemporaryDirectory(prefix="rankscope-output-") as folder:
        tmp = Path(folder) / f"output{suffix}"
        yield tmp
        sys.stdout.flush()
        sys.stderr.flush()
        with tmp.open("rb") as source, open(os.dup(fd), "wb") as sink:  # no truncation, unlike opening its path
            shutil.copyfileobj(source, sink)


def write_text(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(path: Path, data: bytes) -> None:
    with replacing(path) as tmp:
        tmp.write_bytes(data)
