"""`rankscope demo` end to end through the control plane: a coordinator, two torch agents,
a real gloo job with one slowed rank; the report names that rank, and every process the
demo started is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(400)]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def test_demo_names_the_slowed_rank_through_the_coordinator(tmp_path):
    workdir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "rankscope", "demo", "--workdir", str(workdir), "--ranks-per-node", "2",
         "--slow-rank", "2", "--duration", "3"],
        capture_output=True, text=True, timeout=360,
    )
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert "rankscope named rank 2 as the straggler (the demo slowed rank 2)" in done.stdout
    report_line = next(line for line in done.stdout.splitlines() if line.startswith("full report: "))
    report = json.loads(Path(report_line.removeprefix("full report: ")).read_text())
    assert report["schema"] == "rankscope.report/1"
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3]
    assert "coordinator on 127.0.0.1:" in done.stderr
    assert _processes_mentioning(str(workdir)) == []


def test_a_terminated_demo_stops_every_process_it_started(tmp_path):
    """SIGTERM (a CI timeout, `kill`) mid-capture ends the demo as Ctrl-C does: exit 128+15,
    no traceback, and its coordinator, agents and ranks are gone."""
    import signal
    import time

    workdir = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "demo", "--workdir", str(workdir), "--ranks-per-node", "2", "--duration", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 240
    lines = []
    for line in demo.stderr:  # the demo's progress: wait until the capture is under way
        lines.append(line)
        if "sweep " in line and "window on" in line or time.monotonic() > deadline:
            break
    assert len(_processes_mentioning(str(workdir))) >= 7, "".join(lines)  # coordinator, 2 agents, 4 ranks
    demo.send_signal(signal.SIGTERM)
    rest = demo.stderr.read()
    assert demo.wait(timeout=60) == 128 + signal.SIGTERM, "".join(lines) + rest
    assert "Traceback" not in rest
    assert _processes_mentioning(str(workdir)) == []
