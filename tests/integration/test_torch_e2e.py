"""Real PyTorch processes (gloo on CPU) under `rankscope rank --backend torch`, captured
through the torch backend, ingested and analysed: the slowed rank, and only it, is
flagged; the same job balanced flags none."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch")

from rankscope.agent.backend import CaptureRequest  # noqa: E402
from rankscope.agent.spool import local_ranks  # noqa: E402
from rankscope.agent.torch_backend import TorchBackend  # noqa: E402
from rankscope.analysis import digest  # noqa: E402
from rankscope.analysis.kineto import read_kineto  # noqa: E402
from rankscope.analysis.pipeline import analyze  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(400)]

WORLD = 4
WINDOW_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _demo_job(slow_rank: int) -> list[str]:
    return ["-m", "rankscope.demo", "--slow-rank", str(slow_rank), "--compute-ms", "10", "--extra-ms", "40",
            "--max-seconds", "240"]


def _capture(tmp: Path, job: list[str]) -> tuple[list[Path], list[int]]:
    """Run ``job`` (python arguments, given --stop-file and --ready-dir) on WORLD ranks, record
    one window, end the job; trace paths and exit codes."""
    spool, stop, ready = tmp / "spool", tmp / "stop", tmp / "ready"
    port = str(_free_port())
    procs = []
    try:
        for rank in range(WORLD):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANKSCOPE_JOB_ID="e2e",
                       PYTHONFAULTHANDLER="1")  # a rank that crashes shows every thread's stack
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "rankscope", "rank", "--backend", "torch", "--spool", str(spool), "--",
                 sys.executable, *job, "--stop-file", str(stop), "--ready-dir", str(ready)],
                env=env))
        deadline = time.monotonic() + 180
        while len(list(ready.glob("*"))) < WORLD:
            assert time.monotonic() < deadline, "the job did not start"
            assert all(p.poll() is None for p in procs), "a rank died"
            time.sleep(0.2)
        ranks = tuple(local_ranks(spool))
        assert sorted(r.rank for r in ranks) == list(range(WORLD))
        assert {r.backend for r in ranks} == {"torch"}
        request = CaptureRequest(sweep_id="sweep-1", duration_s=WINDOW_S, workdir=tmp / "work", ranks=ranks)
        backend = TorchBackend()
        backend.start(request)
        time.sleep(WINDOW_S)
        paths = backend.stop(request)
    finally:
        stop.touch()
        codes = [p.wait(timeout=120) for p in procs]
    assert not (spool / "captures" / "sweep-1").exists()  # control files cleaned up
    return paths, codes


def _report(paths):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = digest.concat([read_kineto(p) for p in paths])
        return table, analyze(table)


def test_slowed_rank_and_only_it_is_flagged(tmp_path):
    paths, codes = _capture(tmp_path, _demo_job(slow_rank=2))
    assert codes == [0] * WORLD
    table, report = _report(paths)
    assert sorted(table.column("rank").to_pylist()) == list(range(WORLD))
    assert set(table.column("job_id").to_pylist()) == {"e2e"}
    coll = digest.explode(table, "collectives")
    # Identity from the Flight Recorder through the hook: the runtime's own sequence numbers.
    assert set(coll["seq_source"]) == {"trace"} and set(coll["comm_id"]) == {"0"}
    assert report.stragglers == [2]


def test_balanced_job_flags_none(tmp_path):
    paths, codes = _capture(tmp_path, _demo_job(slow_rank=-1))
    assert codes == [0] * WORLD
    _, report = _report(paths)
    assert report.stragglers == []


def test_tp_by_dp_job_groups_are_told_apart_and_the_slow_tp_rank_is_named(tmp_path):
    """Investigating TP imbalance on real processes: TP pairs, DP pairs and the world are
    each a communicator of their own kind (by the Flight Recorder's process groups), every
    TP pair gets its exposed-communication share, and the rank slowing its pair is named."""
    paths, codes = _capture(tmp_path, [str(Path(__file__).with_name("tp_dp_job.py")), "--slow-rank", "1"])
    assert codes == [0] * WORLD
    _, report = _report(paths)
    kinds = {tuple(c.ranks): c.kind for c in report.communicators}
    assert kinds == {(0, 1): "tp", (2, 3): "tp", (0, 2): "dp", (1, 3): "dp", (0, 1, 2, 3): "other"}
    assert sorted(tuple(t.ranks) for t in report.tp_overhead) == [(0, 1), (2, 3)]
    assert all(0 < t.exposed_frac < 1 for t in report.tp_overhead)
    assert report.stragglers == [1]
