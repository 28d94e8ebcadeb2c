"""Replacing a file whole: readers see the old file or the new one, never half of one.

The new content goes to a hidden temporary file beside the destination (same folder, so
the rename is atomic), which is moved over it when the writer is done and removed if the
writer fails. OSError reaches the caller as it is: state files (spool, journals, uploads)
are the program's own, and their callers decide what a failure means; a user's output
file goes through `rankscope.output`, which turns it into one clear error.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path, *, keep_suffix: bool = False, durable: bool = False) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to, moved over ``path`` when the
    block ends without an error.

    Its name ends in ``.tmp``, so readers globbing ``*.json`` pass it by; ``keep_suffix``
    ends it in ``path``'s own suffix instead, for writers that choose a format by it
    (matplotlib, Parquet). ``durable``: file and rename are on disk before this returns
    (fsync of the file, then of its folder), for state that must survive a power cut.
    """
    path = Path(path)
    unique = f"{os.getpid()}.{threading.get_ident()}"  # writers in other processes or threads never share one
    tmp = path.with_name(f".{path.stem}.{unique}.tmp{path.suffix}" if keep_suffix else f".{path.name}.{unique}.tmp")
    try:
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
        if durable:
            _fsync(path.parent)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


# `replacing`'s temporary names: .NAME.PID.THREAD.tmp, or .STEM.PID.THREAD.tmp.SUFFIX.
_TEMPORARY = re.compile(r"\..+\.\d+\.\d+\.tmp(\.[^.]+)?")


def remove_left_behind(folder: Path) -> list[Path]:
    """Remove the temporary files of writers killed mid-write (`replacing` removes its own
    otherwise) from ``folder``, which only this process writes now; the ones removed."""
    left = [path for path in Path(folder).iterdir() if _TEMPORARY.fullmatch(path.name) and path.is_file()]
    for path in left:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return left


def write_text(path: Path, text: str, *, durable: bool = False) -> None:
    with replacing(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _fsync(path: Path) -> None:
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
