"""constraints.txt pins every package the development environment installs, so that a new
release reaches `make test` (and CI) only through `make lock`."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What `pip freeze` leaves out, as `make lock` writes it; rankscope itself is the editable install.
UNPINNED = {"pip", "setuptools", "wheel", "distribute", "rankscope"}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()  # PEP 503


def test_every_installed_package_is_pinned() -> None:
    if sys.prefix == sys.base_prefix:
        pytest.skip("not in a virtual environment: its packages are not the project's alone")
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not NAME==VERSION"
            pinned[_name(name)] = version
    # The environment's own folders only: Ray, imported by earlier tests, puts the psutil and
    # colorama it ships (ray/thirdparty_files) on sys.path, which pip never installed.
    folders = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    installed = {_name(d.metadata["Name"]) for d in importlib.metadata.distributions(path=folders)} - UNPINNED
    unpinned = sorted(installed - set(pinned))
    assert not unpinned, f"installed but not in constraints.txt: {', '.join(unpinned)} (run `make lock`)"
