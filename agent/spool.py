"""The spool folder: how a rank wrapper and the node's agent find each other.

`rankscope rank -- CMD` writes one announcement per rank process under
``<spool>/ranks/`` (renamed into place, so the agent never reads half a file) and removes
it when the rank exits. The agent lists them to know its local ranks, and hands
each capture's files to them through ``<spool>/captures/<sweep>/``.

The spool may be shared by containers of one host (a Kubernetes hostPath), each with its
own PID namespace: a pid means nothing to the agent's container, and two pods' ranks can
have the same one. So an announcement is named by a key unique to its wrapper, and the
wrapper holds an flock on it while it lives: the kernel drops it however the process ends,
and the agent tests it, in any container, to tell a live rank from a gone one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rankscope.errors import shown
from rankscope.lock import held
from rankscope.records import known_fields

log = logging.getLogger(__name__)
_HELD: dict[Path, int] = {}  # this process's announcements -> the descriptor holding each one's lock
_UNREADABLE: set[Path] = set()  # announcements already warned about

DEFAULT_SPOOL = Path(os.environ.get("RANKSCOPE_SPOOL", "/tmp/rankscope-spool"))


@dataclass(frozen=True)
class RankInfo:
    """One rank process as announced by its wrapper."""

    rank: int
    local_rank: int
    world_size: int
    pid: int
    host: str
    job_id: str = ""
    gpu: str = ""  # UUID or CUDA ordinal as the launcher set it
    backend: str = "nsys"  # capture backend the rank runs under
    session: str = ""  # nsys session name, or the torch hook's control address
    extra: dict[str, str] = field(default_factory=dict)
    token: str = ""  # unique to the wrapper: names its files in the spool ("" from older wrappers)
    locked: bool = False  # the wrapper holds its announcement's flock (else judged by pid)
    spool: str = ""  # where the reader found the announcement (its own mount of the spool)
    protocol: int = 0  # how its wrapper records (window.PROTOCOL); 0: older than asking through the spool

    @property
    def key(self) -> str:
        """The rank's name in the spool: pids repeat across the containers that share one."""
        return self.token or str(self.pid)


def new_token(pid: int) -> str:
    return f"{pid}-{secrets.token_hex(4)}"


def ranks_dir(spool: Path) -> Path:
    return spool / "ranks"


def announce(spool: Path, info: RankInfo) -> Path:
    """Write the rank's announcement and hold its lock until ``withdraw`` (or the process ends).
    The lock is taken before the file gets its name, so no reader sees it unlocked."""
    folder = ranks_dir(spool)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{info.key}.json"
    tmp = folder / f".{info.key}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            info = RankInfo(**{**asdict(info), "locked": True})
        except OSError as exc:  # a filesystem without locks: the agent falls back on the pid
            log.warning("%s: cannot lock the announcement (%s): the agent judges this rank by its pid",
                        shown(path), exc.strerror or exc)
        os.write(fd, json.dumps(asdict(info)).encode())
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    _HELD[path] = fd
    return path


def withdraw(spool: Path, info: RankInfo) -> None:
    path = ranks_dir(spool) / f"{info.key}.json"
    path.unlink(missing_ok=True)
    fd = _HELD.pop(path, None)
    if fd is not None:
        os.close(fd)


def local_ranks(spool: Path) -> list[RankInfo]:
    """Announced ranks whose process is still alive, ordered by local rank."""
    found = []
    folder = ranks_dir(spool)
    if not folder.is_dir():
        return []
    for path in folder.glob("*.json"):
        try:
            info = RankInfo(**known_fields(RankInfo, json.loads(path.read_text())))
        except (OSError, ValueError, TypeError) as exc:
            # Not the agent's to end on, nor to delete: the rank may live (another rankscope's wrapper).
            if path not in _UNREADABLE:
                _UNREADABLE.add(path)
                log.warning("%s: unreadable rank announcement (%s): left out of captures", shown(path), exc)
            continue
        info = replace(info, spool=str(spool))
        if lives(info):
            found.append(info)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda r: (r.local_rank, r.rank))


def lives(info: RankInfo) -> bool:
    """Whether the rank's wrapper still runs, seen from any container sharing the spool."""
    if not (info.locked and info.spool):
        return alive(info.pid)
    try:
        fd = os.open(ranks_dir(Path(info.spool)) / f"{info.key}.json", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # withdrawn
    try:
        return held(fd)
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
