"""The host's shared record of DCGM pauses: one file per pausing process, one lock to decide.

DCGM keeps one global pause flag per host engine, and any client's Resume clears it
(dcgm.md §9). So every rankscope agent on a host (a fleet agent beside Slurm per-job agents,
say) must see the others' leases before it resumes. Each process owns a holder file in the
ledger folder and holds an exclusive flock on it while it lives; the kernel drops the lock
however the process ends (kill -9 included), so a holder file nobody locks is a process that
is gone, and whatever it paused was left behind. Decisions are taken under the folder's
``.mutex`` flock. No process rewrites another's file, so agents of different users can share
the folder: it is created sticky and writable by all, like /tmp.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rankscope import output
from rankscope.errors import ConfigError, InputError
from rankscope.lock import held

DEFAULT_FOLDER = Path("/tmp/rankscope-dcgm")
MUTEX_NAME = ".mutex"
HOLDER_PREFIX = "holder-"


@dataclass(frozen=True)
class Holder:
    """Another process's record: whether it paused, its leases (capture id -> wall expiry)."""

    path: Path
    who: str
    alive: bool
    paused: bool = False
    leases: Mapping[str, float] = field(default_factory=dict)

    def holds(self, now: float) -> bool:
        """A live process with a lease not yet expired: DCGM must stay paused for it."""
        return self.alive and any(until > now for until in self.leases.values())

    @property
    def left_behind(self) -> bool:
        """A process that ended while it had paused DCGM or held a lease."""
        return not self.alive and (self.paused or bool(self.leases))


class PauseLedger:
    """This process's holder file in ``folder``, and the view of the others'."""

    def __init__(self, folder: Path, who: str) -> None:
        self.folder = Path(folder)
        self.who = who
        self.path: Path | None = None
        self._fd: int | None = None
        self._mutex: int | None = None
        self._forgotten: set[Path] = set()  # gone holders' files we may not delete (sticky folder)
        self._guard = threading.Lock()

    def check(self) -> None:
        """The ConfigError `open` raises where the folder is unusable (a link, a file in its
        place, a folder that cannot be written in), raised before anything is made."""
        self._refuse_link()
        try:
            output.check_folder(self.folder)
        except InputError as exc:
            raise self._unusable(exc.args[0]) from None

    def _refuse_link(self) -> None:
        if self.folder.is_symlink():
            raise ConfigError("the DCGM pause ledger must not be a symbolic link", path=self.folder)

    def _unusable(self, why: object) -> ConfigError:
        return ConfigError(f"cannot use the DCGM pause ledger ({why}); pass --dcgm-state DIR", path=self.folder)

    def open(self) -> None:
        """Create the folder and this process's holder file, locked. ConfigError if unusable."""
        try:
            self._refuse_link()
            output.make_folder(self.folder, shared=True)  # other users' agents join; none deletes another's file
            self._mutex = os.open(self.folder / MUTEX_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            output.open_to_others(self._mutex, 0o444)
            with self._locked():  # a holder file is locked before anyone can see it
                name = f"{HOLDER_PREFIX}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.json"
                self.path = self.folder / name
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                output.open_to_others(self._fd, 0o644)
                self.write(False, {})
        except (OSError, InputError) as exc:
            self.close()
            raise self._unusable(exc.args[0] if isinstance(exc, InputError) else exc.strerror or exc) from None

    @contextmanager
    def deciding(self) -> Iterator[list[Holder]]:
        """Hold the folder's mutex (pause and resume decisions, host-wide); yields the other holders."""
        with self._locked():
            yield self._others()

    def write(self, paused: bool, leases: Mapping[str, float]) -> None:
        """Record this process's state; call inside ``deciding``. Durable: it must be true after a crash."""
        body = json.dumps({"who": self.who, "paused": paused, "leases": dict(leases)}).encode()
        os.pwrite(self._fd, body, 0)
        os.ftruncate(self._fd, len(body))  # a crash before this leaves unparsable JSON: read as a pause left
        os.fsync(self._fd)

    def forget(self, holder: Holder) -> None:
        """Drop a gone holder's file once what it left is dealt with."""
        try:
            holder.path.unlink()
        except FileNotFoundError:
            pass
        except OSError:  # another user's, in the sticky folder: it stays, and is skipped from now on
            self._forgotten.add(holder.path)

    def close(self, *, keep: bool = False) -> None:
        """Let go of the folder and of this process's holder file, removing it unless
        ``keep`` (a pause still owed); once only, whoever calls."""
        with self._guard:
            fd, self._fd = self._fd, None
            mutex, self._mutex = self._mutex, None
        if fd is not None and self.path is not None:
            if not keep:
                self.path.unlink(missing_ok=True)
            os.close(fd)
        if mutex is not None:
            os.close(mutex)

    # -- internals --------------------------------------------------------------------------

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._mutex, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._mutex, fcntl.LOCK_UN)

    def _others(self) -> list[Holder]:
        holders = []
        for path in sorted(self.folder.glob(f"{HOLDER_PREFIX}*.json")):
            if path != self.path and path not in self._forgotten:
                holder = _read_holder(path)
                if holder is None:
                    continue
                if holder.alive or holder.left_behind:
                    holders.append(holder)
                else:
                    self.forget(holder)  # ended holding nothing: nothing to deal with
        return holders


class NoLedger(PauseLedger):
    """For a node without DCGM: nothing is ever paused, so nothing is shared (and a folder
    this agent cannot use does not stop it)."""

    def __init__(self) -> None:
        super().__init__(DEFAULT_FOLDER, "")

    def check(self) -> None:
        pass

    def open(self) -> None:
        pass

    @contextmanager
    def deciding(self) -> Iterator[list[Holder]]:
        yield []

    def write(self, paused: bool, leases: Mapping[str, float]) -> None:
        pass


def _read_holder(path: Path) -> Holder | None:
    """One holder file, with whether its process still holds its lock (None: it just went)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # it just went, or is not one of ours (a link, a file we may not read)
        return None
    try:
        alive = held(fd)
        raw = os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)
    try:
        data = json.loads(raw)
        leases = {str(k): float(v) for k, v in dict(data["leases"]).items()}
        return Holder(path, str(data.get("who", path.name)), alive, bool(data["paused"]), leases)
    except (ValueError, TypeError, KeyError, AttributeError):
        # Torn by a crash mid-write: it may have paused. A live one counts as holding for ever.
        return Holder(path, path.name, alive, paused=True, leases={} if not alive else {"?": float("inf")})
