"""Static check of every Python file we write: undefined names, unused imports, redefinitions.

A renamed function whose old name lingers in a path no test runs is a NameError waiting for
a user; pyflakes finds it without running anything. Generated stubs are not ours to lint.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("core", "agent", "analysis", "coordinator", "proto", "bench", "scripts", "tests")

pytest.importorskip("pyflakes", reason="the lint needs pyflakes (the [dev] extra)")


def test_pyflakes_finds_nothing() -> None:
    files = [str(p) for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py")) if "_pb2" not in p.name]
    assert files
    done = subprocess.run([sys.executable, "-m", "pyflakes", *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
