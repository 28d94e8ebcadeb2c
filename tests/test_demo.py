"""The demo's process keeping, without torch: what an interrupted demo does to its job."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from rankscope.cli import build_parser
from rankscope.demo import _Processes


def test_an_interrupted_demo_terminates_ranks_still_starting(tmp_path) -> None:
    """A rank that has not yet reached its loop never reads the stop file: on Ctrl-C it is
    terminated with the rest, not waited for (it was: up to a minute, then killed)."""
    with pytest.raises(KeyboardInterrupt), _Processes(tmp_path) as procs:
        rank = procs.spawn("rank0", [sys.executable, "-c", "import time; time.sleep(120)"])
        procs.ranks.append(rank)
        raise KeyboardInterrupt
    assert rank.returncode == -signal.SIGTERM


@pytest.mark.parametrize("value", ["100000", "0", "1", "x"])
def test_ranks_per_node_past_the_machine_is_a_usage_error(value: str, capsys, monkeypatch) -> None:
    # found by review: --ranks-per-node had no upper bound, and each rank is a PyTorch process
    # (under its `rankscope rank` wrapper): a typo forked hundreds of thousands of them.
    # And 1 ran a 2-rank job, too few to name a straggler: the demo could only end in failure
    # ("flagged no rank", exit 1) after starting everything.
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with pytest.raises(SystemExit) as exc:
        build_parser("demo").parse_args(["demo", "--ranks-per-node", value])
    assert exc.value.code == 2
    assert f"argument --ranks-per-node: {value!r} is not a whole number from 2 to 8 (" in capsys.readouterr().err


def test_ranks_per_node_up_to_the_machine_or_the_default_is_taken(monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert build_parser("demo").parse_args(["demo", "--ranks-per-node", "8"]).ranks_per_node == 8
    assert build_parser("demo").parse_args(["demo", "--ranks-per-node", "2"]).ranks_per_node == 2  # 4 ranks
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the default's 4 a node runs on a 2-core machine
    assert build_parser("demo").parse_args(["demo", "--ranks-per-node", "4"]).ranks_per_node == 4
