"""The `torch` capture backend: PyTorch-profiler windows on the ranks run under the torch hook.

The agent and each rank's hook talk through files in the rank's spool
(``captures/<sweep>/``, see torch_hook.py): start writes ``start.json`` naming the ranks
(by their spool keys) and waits until each hook says its profiler runs; stop writes ``stop.json``,
waits (bounded) for every started rank's Kineto trace, and moves the traces into the
capture's work folder for the digest step.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from rankscope import atomic, output
from rankscope.agent import torch_hook
from rankscope.agent.backend import CaptureBackend, CaptureRequest
from rankscope.agent.spool import RankInfo, lives
from rankscope.errors import ToolError

log = logging.getLogger(__name__)

# A rank's first window takes seconds to start: torch.profiler's start imports
# torch._inductor (to read its CUDA-graph setting) where the job has not (torch 2.13 on
# this CPU: 2.5 s and +71 MiB in the rank's process), on a busy rank longer.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 120.0  # stopping writes the trace; large windows take a while
# Beyond the capture's duration, when a rank ends its window by itself: the agent was lost.
WINDOW_GRACE_S = 60.0
POLL_S = 0.05


class TorchBackend(CaptureBackend):
    """Kineto traces from every local rank launched with ``rankscope rank --backend torch``."""

    name = "torch"
    # CPU activity and CUPTI activity tracing do not use the GPU performance counters
    # DCGM profiling holds, so DCGM keeps running.

    def start(self, request: CaptureRequest) -> None:
        ranks = self.own_ranks(request)
        for folder, group in _by_folder(request, ranks).items():
            # The ranks write in it (their replies, their traces) as their own users, not the agent's.
            output.make_folder(folder.parent, shared=True)
            output.make_folder(folder, shared=True)
            atomic.write_text(folder / "start.json", json.dumps({"ranks": [r.key for r in group],
                                                                 "max_s": request.duration_s + WINDOW_GRACE_S}))
        started, failed = _wait(request, ranks, lambda f, r: f / f"{r.key}.started", START_TIMEOUT_S)
        if not started:
            raise ToolError(f"no torch rank started its profiler{_within(failed, START_TIMEOUT_S)}: {_why(failed)}")
        for reason in _reasons(failed):
            self.note(f"did not start recording on {reason}")

    def stop(self, request: CaptureRequest) -> list[Path]:
        ranks = self.own_ranks(request)
        folders = _by_folder(request, ranks)
        for folder in folders:
            atomic.write_text(folder / "stop.json", "{}")
        recording = [r for r in ranks if (_folder(request, r) / f"{r.key}.started").exists()]
        done, failed = _wait(request, recording, _trace, STOP_TIMEOUT_S)
        for reason in _reasons(failed):
            self.note(f"no trace from {reason}")
        if not done:
            raise ToolError(f"no torch rank wrote its trace{_within(failed, STOP_TIMEOUT_S)}: {_why(failed)}")
        out = request.workdir / "exports"
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for rank in done:
            source = _trace(_folder(request, rank), rank)
            target = out / source.name
            shutil.move(source, target)
            paths.append(target)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
        return paths


def _folder(request: CaptureRequest, rank: RankInfo) -> Path:
    return torch_hook.captures_dir(Path(rank.session)) / request.sweep_id


def _by_folder(request: CaptureRequest, ranks: list[RankInfo]) -> dict[Path, list[RankInfo]]:
    folders: dict[Path, list[RankInfo]] = {}
    for rank in ranks:
        folders.setdefault(_folder(request, rank), []).append(rank)
    return folders


def _trace(folder: Path, rank: RankInfo) -> Path:
    return folder / torch_hook.trace_name(rank.rank, rank.key)


def _wait(request: CaptureRequest, ranks: list[RankInfo], marker, timeout_s: float):
    """Ranks whose ``marker`` file appeared in time; the others with their error (or None)."""
    deadline = time.monotonic() + timeout_s
    pending = list(ranks)
    done: list[RankInfo] = []
    failed: list[tuple[str | None, RankInfo]] = []
    while pending:
        for rank in list(pending):
            folder = _folder(request, rank)
            error = folder / f"{rank.key}.error"
            if marker(folder, rank).exists():
                done.append(rank)
                pending.remove(rank)
            elif error.exists():
                failed.append((error.read_text(), rank))
                pending.remove(rank)
            elif not lives(rank):
                failed.append(("the rank exited", rank))
                pending.remove(rank)
        if pending and time.monotonic() > deadline:
            failed.extend((None, r) for r in pending)
            break
        if pending:
            time.sleep(POLL_S)
    return done, failed


def _within(failed: list[tuple[str | None, RankInfo]], timeout_s: float) -> str:
    """" within N s" where some rank gave no answer in time; nothing where each said why."""
    return f" within {timeout_s:g} s" if any(error is None for error, _ in failed) else ""


def _why(failed: list[tuple[str | None, RankInfo]]) -> str:
    return "; ".join(_reasons(failed)) or "no ranks"


def _reasons(failed: list[tuple[str | None, RankInfo]]) -> list[str]:
    """Each reason once, with the ranks that gave it (a node's 8 ranks often fail alike)."""
    ranks: dict[str, list[int]] = {}
    for error, rank in failed:
        ranks.setdefault(error or "no answer (is the rank a Python process?)", []).append(rank.rank)
    return [f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}: {error}"
            for error, numbers in ranks.items()]
