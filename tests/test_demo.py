"""The demo's process keeping, without torch: what an interrupted demo does to its job."""

from __future__ import annotations

import signal
import sys

import pytest

from rankscope.demo import _Processes


def test_an_interrupted_demo_terminates_ranks_still_starting(tmp_path) -> None:
    """A rank that has not yet reached its loop never reads the stop file: on Ctrl-C it is
    terminated with the rest, not waited for (it was: up to a minute, then killed)."""
    with pytest.raises(KeyboardInterrupt), _Processes(tmp_path) as procs:
        rank = procs.spawn("rank0", [sys.executable, "-c", "import time; time.sleep(120)"])
        procs.ranks.append(rank)
        raise KeyboardInterrupt
    assert rank.returncode == -signal.SIGTERM
