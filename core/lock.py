"""One process at a time on a folder of state: the coordinator's data dir, an agent's work dir.

Two coordinators on one data dir would each resume the other's sweeps and time them out;
two agents on one work dir would each carry on the other's captures. The lock is an
exclusive ``flock`` on ``FOLDER/.rankscope.lock``, held while the process runs. The kernel
drops it when the process ends, however it ends (kill -9 included), so no stale lock is
ever left to clean up; the file only names the last holder, for the message.

The same property tells others whether a process lives (``held``): the DCGM pause ledger's
holder files and the spool's rank announcements are flock-held by their writers.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import threading
from pathlib import Path

from rankscope import output
from rankscope.errors import ConfigError

LOCK_NAME = ".rankscope.lock"
# Filesystems that cannot lock (some NFS set-ups): run unlocked, and say so.
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

log = logging.getLogger(__name__)


class FolderInUse(ConfigError):
    """Another live process holds the folder."""


class FolderLock:
    """The exclusive hold of ``folder`` by this process, as ``owner`` (e.g. "coordinator").
    ``shared``: contended by processes of several users (the ranks of different jobs), so the
    folder is made as the spool's are (sticky, writable by all) and the lock file writable by
    all: another user's 0644 file could not be opened to lock, and the lock would guard nothing."""

    def __init__(self, folder: Path, owner: str, *, shared: bool = False) -> None:
        self.folder = folder
        self.owner = owner
        self.shared = shared
        self._fd: int | None = None
        self._guard = threading.Lock()

    def acquire(self) -> FolderLock:
        if self._fd is not None:  # held already, by this process through this object
            return self
        try:
            if self.shared:
                output.make_folder(self.folder, shared=True)
            else:
                self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666 if self.shared else 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot create the lock file {LOCK_NAME} ({exc.strerror or exc})", path=self.folder) from None
        if self.shared:
            output.open_to_others(fd, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FolderInUse(f"in use by {holder}; one {self.owner} per folder", path=self.folder) from None
        except OSError as exc:
            if exc.errno not in NO_LOCKS:
                os.close(fd)
                raise ConfigError(f"cannot lock the folder ({exc.strerror or exc})", path=self.folder) from None
            log.warning("%s: this filesystem cannot lock files: nothing stops a second %s on this folder",
                        self.folder, self.owner)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.owner} pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the folder go (closing the file drops the lock); the file stays, harmless.
        Once only, whoever calls: a second close could hit a file that reused the number."""
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def held(fd: int) -> bool:
    """Whether another open file holds an flock on the file open as ``fd``: its holder lives,
    for the kernel drops the lock however a process ends. Works across the containers of a
    host, whatever their PID namespaces. Where the lock is free it is taken and let go."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False
