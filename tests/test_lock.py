"""One process at a time on a folder of state, and no stale lock after any exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.lock import FolderInUse, FolderLock

HOLD = """
import sys, time
from pathlib import Path
from rankscope.lock import FolderLock
FolderLock(Path(sys.argv[1]), "coordinator").acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_hold_is_refused_naming_the_holder_until_the_first_lets_go(tmp_path: Path) -> None:
    first = FolderLock(tmp_path / "data", "coordinator").acquire()
    with pytest.raises(FolderInUse) as caught:
        FolderLock(tmp_path / "data", "coordinator").acquire()
    assert str(caught.value).startswith(f"{tmp_path / 'data'}: in use by coordinator pid {os.getpid()} on ")
    assert str(caught.value).endswith("; one coordinator per folder")
    first.release()
    first.release()  # once only, however often called
    FolderLock(tmp_path / "data", "coordinator").acquire().release()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(FolderInUse, match=f"in use by coordinator pid {holder.pid} "):
            FolderLock(tmp_path, "coordinator").acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    FolderLock(tmp_path, "coordinator").acquire().release()
