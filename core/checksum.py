"""The sha256 of a file, as uploads declare it and the coordinator stores it under."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_of(path: Path) -> str:
    """Lower-case hex, read in blocks: an export of GiBs is never whole in memory."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
