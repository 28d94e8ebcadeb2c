"""The hook's sitecustomize: it must not hide the one the user (or the distribution) has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rankscope import atomic
from rankscope.agent.torch_hook import ENV, SITECUSTOMIZE

PROBE = "import sys; print(sys.modules['sitecustomize'].__file__)"


def _run(tmp_path: Path, hook_env: str | None) -> subprocess.CompletedProcess:
    boot, user = tmp_path / "boot", tmp_path / "user"
    boot.mkdir()
    user.mkdir()
    atomic.write_text(boot / "sitecustomize.py", SITECUSTOMIZE)
    (user / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('user')\n")
    env = {k: v for k, v in os.environ.items() if k != ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(boot), str(user)])
    if hook_env is not None:
        env[ENV] = hook_env
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)


def test_the_users_sitecustomize_still_runs(tmp_path: Path) -> None:
    done = _run(tmp_path, None)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text() == "user"
    assert done.stdout.strip() == str(tmp_path / "user" / "sitecustomize.py")


def test_a_hook_that_cannot_install_says_so_and_the_users_still_runs(tmp_path: Path) -> None:
    done = _run(tmp_path, json.dumps({"spool": str(tmp_path / "spool")}))  # no rank fields: install fails
    assert done.returncode == 0, done.stderr
    assert f"rankscope: torch hook not installed in {sys.executable} (" in done.stderr
    assert "): the job runs unprofiled" in done.stderr
    assert (tmp_path / "ran").read_text() == "user"


def test_flight_recorder_sizes_are_totals_of_each_side() -> None:
    """As record_param_comms counts a call: every tensor of a side, each by its own dtype
    (a coalesced AllReduce of 4096 and 8192 floats moves 49152 bytes, not its first tensor's);
    AllGather's sides differ (the shard in, the whole out)."""
    pytest.importorskip("torch", reason="the hook's sizes need torch's dtypes")
    from rankscope.agent.torch_hook import _bytes

    coalesced = {"input_sizes": [[4096], [8192]], "input_dtypes": ["Float", "Float"]}
    assert _bytes(coalesced, "input") == 49152
    gather = {"input_sizes": [[4096]], "input_dtypes": ["BFloat16"], "output_sizes": [[2, 4096]], "output_dtypes": ["BFloat16"]}
    assert (_bytes(gather, "input"), _bytes(gather, "output")) == (8192, 16384)
    assert _bytes({"input_sizes": [[4]], "input_dtypes": ["NoSuchType"]}, "input") is None
    assert _bytes(gather, "neither") is None


def test_flight_recorder_says_where_its_ring_dropped_the_windows_entries() -> None:
    """record_id counts every entry made (torch 2.13, TORCH_FR_BUFFER_SIZE=4 after 10 calls: ids
    6-9 are left). The oldest left, inside the window, marks where the window's entries were lost."""
    from rankscope.agent.torch_hook import _evicted_before

    kept = [{"record_id": i, "time_created_ns": 100 * i} for i in range(6, 10)]
    assert _evicted_before(kept, since_ns=500) == 600
    assert _evicted_before(kept, since_ns=700) is None  # the ring still holds entries from before the window
    assert _evicted_before([{"record_id": 0, "time_created_ns": 900}], since_ns=500) is None  # nothing dropped
    assert _evicted_before([], since_ns=500) is None


WINDOW_FAILING = """
import sys, torch.autograd.profiler as autograd_profiler
from rankscope.agent import torch_hook
from rankscope.agent.spool import RankInfo

def broken(since_ns):
    raise RuntimeError("no flight recorder today")

torch_hook._flight_recorder = broken
window = torch_hook._Window(RankInfo(rank=0, local_rank=0, world_size=1, pid=0, host="h"))
window.start()
try:
    window.close(torch_hook.Path(sys.argv[1]))
except RuntimeError as exc:
    print("raised:", exc)
print("recording:", autograd_profiler._is_profiler_enabled)
"""


def test_a_window_whose_metadata_fails_still_stops_the_profiler(tmp_path: Path) -> None:
    """The hook's promise: whatever goes wrong, no profiler is left running in the job."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", WINDOW_FAILING, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["raised: no flight recorder today", "recording: False"]
