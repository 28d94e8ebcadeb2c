"""The spool folder: how a rank wrapper and the node's agent find each other.

`rankscope rank -- CMD` writes one announcement per rank process under
``<spool>/ranks/`` (atomically, so the agent never reads half a file) and removes
it when the rank exits. The agent lists them to know its local ranks, and hands
each capture's files to them through ``<spool>/captures/<sweep>/``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rankscope import atomic
from rankscope.errors import InputError

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


def ranks_dir(spool: Path) -> Path:
    return spool / "ranks"


def announce(spool: Path, info: RankInfo) -> Path:
    folder = ranks_dir(spool)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{info.pid}.json"
    atomic.write_text(path, json.dumps(asdict(info)))
    return path


def withdraw(spool: Path, pid: int) -> None:
    (ranks_dir(spool) / f"{pid}.json").unlink(missing_ok=True)


def local_ranks(spool: Path) -> list[RankInfo]:
    """Announced ranks whose process is still alive, ordered by local rank."""
    found = []
    folder = ranks_dir(spool)
    if not folder.is_dir():
        return []
    for path in folder.glob("*.json"):
        try:
            info = RankInfo(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"unreadable rank announcement ({exc})", path=path) from None
        if alive(info.pid):
            found.append(info)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda r: (r.local_rank, r.rank))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
