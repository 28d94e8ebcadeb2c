"""Stand-in DCGM host engine state, shared by the fake bindings and the fake `dcgmi`.

One JSON file (``$RANKSCOPE_STANDIN_DCGM_STATE``) holds the engine, so every process on
the "node" sees the same single, global, non-reference-counted profiling pause flag
(reference/dcgm.md §5). Fields: ``up`` (engine running), ``gpm`` (Hopper+ GPUs: pause is
DCGM_ST_NOT_SUPPORTED, §6), ``library`` (libdcgm installed), ``addresses`` (where the
engine listens), ``paused``, and for `dcgmi` ``answer_after_s`` (a busy engine: it applies
the call, then answers this late). Every pause/resume call is appended to ``<state>.log`` as a
JSON line, for the tests to read.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

DEFAULTS = {"up": True, "gpm": False, "library": True, "paused": False,
            "addresses": ["localhost", "127.0.0.1", "localhost:5555", "127.0.0.1:5555"]}

ST_OK = 0
ST_NOT_SUPPORTED = -6
ST_UNINITIALIZED = -10
ST_CONNECTION_NOT_VALID = -21
ST_LIBRARY_NOT_FOUND = -25


def state_path() -> Path:
    return Path(os.environ["RANKSCOPE_STANDIN_DCGM_STATE"])


def configure(path: Path, **fields) -> None:
    """Test helper: create or change the engine (e.g. up=False, gpm=True)."""
    with _locked(path) as state:
        state.update(fields)


def read(path: Path) -> dict:
    with _locked(path) as state:
        return dict(state)


def calls(path: Path) -> list[dict]:
    log = Path(f"{path}.log")
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def reachable(address: str) -> bool:
    with _locked(state_path()) as state:
        return bool(state["up"]) and address in state["addresses"]


def library_present() -> bool:
    with _locked(state_path()) as state:
        return bool(state["library"])


def set_paused(address: str, paused: bool, via: str) -> int:
    """Pause or resume on the engine at ``address``; returns a dcgmReturn_t."""
    path = state_path()
    with _locked(path) as state:
        if not (state["up"] and address in state["addresses"]):
            code = ST_CONNECTION_NOT_VALID
        elif state["gpm"]:
            code = ST_NOT_SUPPORTED
        else:
            state["paused"] = paused  # idempotent, global, never counted
            code = ST_OK
        with open(f"{path}.log", "a") as log:
            log.write(json.dumps({"t": time.time(), "op": "pause" if paused else "resume",
                                  "via": via, "pid": os.getpid(), "address": address,
                                  "code": code}) + "\n")
        return code


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = {**DEFAULTS, **(json.loads(path.read_text()) if path.exists() else {})}
            before = dict(state)
            yield state
            if state != before or not path.exists():
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(state))
                tmp.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
