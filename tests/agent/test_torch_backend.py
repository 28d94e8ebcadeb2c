"""The torch backend and hook with one real Python process (no process group)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from rankscope.agent.backend import CaptureRequest
from rankscope.agent.spool import RankInfo, local_ranks
from rankscope.agent import torch_hook, window
from rankscope.agent.torch_backend import TorchBackend
from rankscope.analysis.kineto import read_kineto
from rankscope.errors import ToolError

pytest.importorskip("torch")

SCRIPT = """
import sys, time, torch
from pathlib import Path
x = torch.randn(64, 64)
Path(sys.argv[1]).touch()
while not Path(sys.argv[2]).exists():
    x = (x @ x).tanh_()
    time.sleep(0.001)
"""


def test_no_torch_rank_is_a_tool_error(tmp_path):
    nsys_rank = RankInfo(rank=0, local_rank=0, world_size=1, pid=os.getpid(), host="h", backend="nsys", session="s")
    request = CaptureRequest(sweep_id="s", duration_s=1, workdir=tmp_path, ranks=(nsys_rank,))
    with pytest.raises(ToolError, match="--backend torch"):
        TorchBackend().start(request)


def test_a_rank_that_exited_fails_at_once(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    rank = RankInfo(rank=1, local_rank=1, world_size=2, pid=gone.pid, host="h", backend="torch",
                    session=str(tmp_path / "spool"), spool=str(tmp_path / "spool"), protocol=1)
    request = CaptureRequest(sweep_id="s", duration_s=1, workdir=tmp_path, ranks=(rank,))
    started = time.monotonic()
    with pytest.raises(ToolError, match="rank 1: the rank exited"):
        TorchBackend().start(request)
    assert time.monotonic() - started < 10  # not the full start timeout


def test_a_rank_that_never_answers_fails_the_start_and_says_why(tmp_path, monkeypatch):
    from rankscope.agent import torch_backend

    monkeypatch.setattr(torch_backend, "START_TIMEOUT_S", 0.3)
    silent = RankInfo(rank=3, local_rank=0, world_size=4, pid=os.getpid(), host="h", backend="torch",
                      session=str(tmp_path / "spool"), spool=str(tmp_path / "spool"), protocol=1)
    request = CaptureRequest(sweep_id="s", duration_s=1, workdir=tmp_path, ranks=(silent,))
    with pytest.raises(ToolError, match="rank 3: no answer"):
        TorchBackend().start(request)


# A job with a torch.profiler of its own: "now" records from the start until it is told to
# stop, "later" records a short window once the file ``own`` appears; either writes job.json.
OWN_PROFILER = """
import sys, time, torch
from pathlib import Path
ready, stop, when = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
own, out = ready.parent / "own", ready.parent / "job.json"
x = torch.randn(64, 64)
profiler = torch.profiler.profile()
if when == "now":
    profiler.start()
ready.touch()
while not stop.exists():
    if when == "later" and own.exists() and not out.exists():
        with profiler:
            for _ in range(50):
                x = (x @ x).tanh_()
        profiler.export_chrome_trace(str(out))
    x = (x @ x).tanh_()
    time.sleep(0.001)
if when == "now":
    profiler.stop()
    profiler.export_chrome_trace(str(out))
"""


def _start_script(tmp_path, script_text: str = SCRIPT, *args: str, stderr=None):
    """The unchanged script as one rank under the hook, once it runs; the process and its ranks."""
    spool, ready, stop = tmp_path / "spool", tmp_path / "ready", tmp_path / "stop"
    script = tmp_path / "train.py"
    script.write_text(script_text)
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", RANKSCOPE_JOB_ID="job-9")
    proc = subprocess.Popen([sys.executable, "-m", "rankscope", "rank", "--backend", "torch", "--spool", str(spool),
                             "--", sys.executable, str(script), str(ready), str(stop), *args], env=env,
                            stderr=stderr)
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the script did not start")
        time.sleep(0.1)
    return proc, tuple(local_ranks(spool))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hook_records_a_window_of_an_unchanged_script(tmp_path):
    spool, stop = tmp_path / "spool", tmp_path / "stop"
    proc, ranks = _start_script(tmp_path)
    try:
        assert [(r.rank, r.backend, r.session) for r in ranks] == [(0, "torch", str(spool))]
        request = CaptureRequest(sweep_id="w1", duration_s=1, workdir=tmp_path / "work", ranks=ranks)
        backend = TorchBackend()
        backend.start(request)
        # The rank answers in the agent's folder as its own user: open to all, like /tmp.
        for folder in (spool / "captures", spool / "captures" / "w1"):
            assert stat.S_IMODE(folder.stat().st_mode) == 0o1777, folder
        time.sleep(1.0)
        paths = backend.stop(request)
    finally:
        stop.touch()
        assert proc.wait(timeout=60) == 0
    assert [p.parent for p in paths] == [tmp_path / "work" / "exports"]
    assert not local_ranks(spool)  # withdrawn when the rank ended
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = read_kineto(paths[0]).to_pylist()[0]
    # No process group: identity comes from the hook's metadata, not distributedInfo.
    assert (row["rank"], row["rank_source"], row["job_id"]) == (0, "rankscope hook", "job-9")
    kernels = {k["name"] for k in row["kernels"]}
    assert "aten::matmul" in kernels or "aten::mm" in kernels
    assert row["window_end_ns"] - row["window_start_ns"] >= 500_000_000


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_that_exits_mid_window_exits_cleanly_and_leaves_its_trace(tmp_path):
    proc, ranks = _start_script(tmp_path)
    request = CaptureRequest(sweep_id="w2", duration_s=60, workdir=tmp_path / "work", ranks=ranks)
    backend = TorchBackend()
    try:
        backend.start(request)
        time.sleep(0.5)
    finally:
        (tmp_path / "stop").touch()  # the job ends before the window does
        code = proc.wait(timeout=120)
    assert code == 0
    paths = backend.stop(request)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = read_kineto(paths[0]).to_pylist()[0]
    assert row["rank"] == 0 and row["kernels"]


def _job_trace(tmp_path) -> list:
    return json.loads((tmp_path / "job.json").read_text())["traceEvents"]


@contextmanager
def _job(tmp_path, script_text: str = SCRIPT, *args: str, stderr=None):
    """The script running as one rank under the hook; told to stop at the end, and it must exit 0."""
    proc, ranks = _start_script(tmp_path, script_text, *args, stderr=stderr)
    try:
        yield proc, ranks
    finally:
        (tmp_path / "stop").touch()
        assert proc.wait(timeout=60) == 0


def _appears(path: Path, within_s: float = 60) -> bool:
    deadline = time.monotonic() + within_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_profiling_itself_gets_no_second_profiler_and_keeps_its_own(tmp_path):
    with _job(tmp_path, OWN_PROFILER, "now") as (_, ranks):
        request = CaptureRequest(sweep_id="w3", duration_s=1, workdir=tmp_path / "work", ranks=ranks)
        with pytest.raises(ToolError, match=r"^no torch rank started its profiler: rank 0: the job's own "
                                            r"torch.profiler is recording: a second one would end it"):
            TorchBackend().start(request)
    assert _job_trace(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_starting_its_own_profiler_mid_window_survives_and_keeps_its_profile(tmp_path):
    """One Kineto session per process: the job's takes ours over, and stopping or exporting
    ours then crashed the job (SIGSEGV); now ours is abandoned and the rank says why."""
    with _job(tmp_path, OWN_PROFILER, "later") as (proc, ranks):
        request = CaptureRequest(sweep_id="w4", duration_s=1, workdir=tmp_path / "work", ranks=ranks)
        backend = TorchBackend()
        backend.start(request)
        (tmp_path / "own").touch()
        assert _appears(tmp_path / "job.json")
        with pytest.raises(ToolError, match=r"^no torch rank wrote its trace: rank 0: the job started its own "
                                            r"torch.profiler during the window"):
            backend.stop(request)
        assert not window.folder_of("w4", ranks[0]).exists()  # a failed stop leaves no capture asked
        assert proc.poll() is None  # still training
    assert _job_trace(tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_window_whose_agent_is_lost_ends_by_itself_soon_after_its_duration(tmp_path, monkeypatch):
    """No stop.json ever comes (the agent died, for good): the rank ends the window at the
    capture's duration plus a grace, not after an hour of profiler buffers in the job."""
    monkeypatch.setattr(window, "GRACE_S", 1.0)
    with _job(tmp_path) as (proc, ranks):
        request = CaptureRequest(sweep_id="w5", duration_s=1, workdir=tmp_path / "work", ranks=ranks)
        TorchBackend().start(request)  # and nothing more from this agent
        trace = tmp_path / "spool" / "captures" / "w5" / torch_hook.trace_name(0, ranks[0].key)
        assert _appears(trace), "the window was still open a minute after its 2 s"
        assert proc.poll() is None


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_window_whose_folder_vanishes_ends_quietly_and_the_next_capture_works(tmp_path, monkeypatch):
    """The agent's folder for a capture removed mid-window (its spool wiped, say): the window
    still ends, nothing is printed into the job, and the hook serves the next capture."""
    import shutil

    monkeypatch.setattr(window, "GRACE_S", 0.5)
    with open(tmp_path / "job.err", "w") as err, _job(tmp_path, stderr=err) as (_, ranks):
        first = CaptureRequest(sweep_id="w6", duration_s=0.5, workdir=tmp_path / "work", ranks=ranks)
        TorchBackend().start(first)
        shutil.rmtree(tmp_path / "spool" / "captures" / "w6")
        time.sleep(3)  # past the window's 1 s
        again = CaptureRequest(sweep_id="w7", duration_s=0.5, workdir=tmp_path / "work7", ranks=ranks)
        backend = TorchBackend()
        backend.start(again)
        time.sleep(0.5)
        assert len(backend.stop(again)) == 1
    assert "Traceback" not in (tmp_path / "job.err").read_text()


def test_the_hooks_sitecustomize_lies_in_a_folder_of_the_wrappers_own(tmp_path):
    """Not in the spool every job's user shares: there the first user's folder shut the others
    out, and whoever could write in it would run code in every torch rank on the node."""
    spool = tmp_path / "spool"
    probe = ("import os, stat, sys; boot = sys.modules['sitecustomize'].__file__.rsplit(os.sep, 1)[0]; "
             "print(boot, oct(stat.S_IMODE(os.stat(boot).st_mode)))")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    done = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--backend", "torch", "--spool", str(spool),
                           "--", sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    boot, mode = done.stdout.split()
    assert not Path(boot).is_relative_to(spool) and mode == "0o700"
    assert not Path(boot).exists()  # gone with the wrapper
