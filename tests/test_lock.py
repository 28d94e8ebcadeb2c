"""One process at a time on a folder of state, and no stale lock after any exit."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope.errors import ConfigError
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


def test_a_shared_lock_is_contended_by_other_users_not_refused_to_them(other_user) -> None:
    """Ranks of different jobs (different users) claim one node-wide role through a shared
    lock: another user's 0644 lock file could not be opened, and each took the role."""
    folder, as_nobody = other_user
    hold = FolderLock(folder / "role", "GPU-metrics sampler", shared=True).acquire()
    assert stat.S_IMODE((folder / "role").stat().st_mode) == 0o777 | stat.S_ISVTX

    def take() -> int:  # in use (3), or refused the file (4)
        try:
            FolderLock(folder / "role", "GPU-metrics sampler", shared=True).acquire()
            return 2
        except FolderInUse:
            return 3
        except ConfigError:
            return 4

    assert as_nobody(take) == 3
    hold.release()
