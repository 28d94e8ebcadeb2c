"""Test helpers for the nsys stand-in (``bin/nsys``): its state folder, calls and faults."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = HERE / "bin"


def env(state: Path, spec: Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose PATH finds the stand-in nsys (and dcgmi) first.

    ``spec``: a simulator truth.json naming the job whose exports the stand-in produces."""
    state.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ if base is None else base)
    out = {**base, "RANKSCOPE_STANDIN_NSYS_DIR": str(state),
           "PATH": f"{BIN}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"}
    if spec is not None:
        out["RANKSCOPE_STANDIN_SPEC"] = str(spec)
    return out


def calls(state: Path) -> list[list[str]]:
    """Every nsys invocation's argv (without the program name), in order."""
    log = state / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line)["argv"] for line in log.read_text().splitlines() if line.strip()]


def callers(state: Path) -> list[tuple[list[str], int]]:
    """Every nsys invocation's argv with the pid of the process that ran it."""
    log = state / "calls.jsonl"
    if not log.exists():
        return []
    return [(call["argv"], call["ppid"]) for call in map(json.loads, log.read_text().splitlines())]


def fail(state: Path, command: str, message: str) -> None:
    """Make every later `nsys COMMAND` fail with ``message`` (``COMMAND --OPTION``: only those given OPTION)."""
    path = state / "faults.json"
    faults = json.loads(path.read_text()) if path.exists() else {}
    faults[command] = message
    path.write_text(json.dumps(faults))


def configure(state: Path, **config) -> None:
    (state / "config.json").write_text(json.dumps(config))


def sessions(state: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (state / "sessions").glob("*.json")}


def launched(argv: list[str]) -> tuple[list[str], str, list[str]]:
    """A `launch` call as the rank wrapper makes it: launch and its options, then the folder
    the application runs in and the application (`rank.in_folder`: `env --chdir=FOLDER --`)."""
    at = next(i for i, arg in enumerate(argv) if i and not arg.startswith("--"))
    env, chdir, end, *app = argv[at:]
    assert env == "env" and chdir.startswith("--chdir=") and end == "--", f"not launched through rank.in_folder: {argv}"
    return argv[:at], chdir.removeprefix("--chdir="), app
