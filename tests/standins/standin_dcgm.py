"""Test helpers for the DCGM stand-ins: where they live and how to drive the fake engine."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = HERE / "bin"
BINDINGS = HERE / "dcgm_bindings"

sys.path.insert(0, str(BINDINGS))
import _fake_engine  # noqa: E402

configure = _fake_engine.configure
read = _fake_engine.read
calls = _fake_engine.calls


def env(state: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose PATH finds the stand-in dcgmi and whose engine is ``state``."""
    base = dict(os.environ if base is None else base)
    return {**base, "RANKSCOPE_STANDIN_DCGM_STATE": str(state),
            "PATH": f"{BIN}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"}
