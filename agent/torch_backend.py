"""The `torch` capture backend: PyTorch-profiler windows on the ranks run under the torch hook.

The agent asks each rank's hook for a window through the spool (window.py): start waits
until each hook is ready, then has the ready ones start their profilers together; stop
waits (bounded) for every started rank's Kineto trace, and moves the traces into the
capture's work folder for the digest step.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from rankscope.agent import torch_hook, window
from rankscope.agent.backend import CaptureBackend, CaptureRequest
from rankscope.agent.spool import RankInfo
from rankscope.errors import ToolError

log = logging.getLogger(__name__)

# A rank's first window takes seconds to start: torch.profiler's start imports
# torch._inductor (to read its CUDA-graph setting) where the job has not (torch 2.13 on
# this CPU: 2.5 s and +71 MiB in the rank's process), on a busy rank longer.
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 120.0  # stopping writes the trace; large windows take a while
NO_ANSWER = "no answer (is the rank a Python process?)"


class TorchBackend(CaptureBackend):
    """Kineto traces from every local rank launched with ``rankscope rank --backend torch``."""

    name = "torch"
    # CPU activity and CUPTI activity tracing do not use the GPU performance counters
    # DCGM profiling holds, so DCGM keeps running.

    def start(self, request: CaptureRequest) -> float:
        ranks = self.own_ranks(request)
        replies = window.open_windows(request.sweep_id, ranks, request.duration_s + window.GRACE_S, START_TIMEOUT_S,
                                      start_at=request.start_at, cancelled=request.cancelled)
        failed = replies.failures()
        if not replies.done:
            raise ToolError(f"no torch rank started its profiler{window.within(failed, START_TIMEOUT_S)}: "
                            f"{_why(failed)}")
        for reason in window.reasons(failed, NO_ANSWER):
            self.note(f"did not start recording on {reason}")
        return replies.began

    def stop(self, request: CaptureRequest) -> list[Path]:
        ranks = self.own_ranks(request)
        try:
            return self._collect(request, window.end_windows(request.sweep_id, window.recording(request.sweep_id, ranks),
                                                             STOP_TIMEOUT_S))
        finally:
            window.forget(request.sweep_id, ranks)  # a rank still ready or recording ends its window

    def _collect(self, request: CaptureRequest, replies: window.Replies) -> list[Path]:
        """The written traces, moved into the capture's work folder for the digest step."""
        failed = replies.failures()
        for reason in window.reasons(failed, NO_ANSWER):
            self.note(f"no trace from {reason}")
        if not replies.done:
            raise ToolError(f"no torch rank wrote its trace{window.within(failed, STOP_TIMEOUT_S)}: {_why(failed)}")
        out = request.workdir / "exports"
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for rank, _ in replies.done:
            source = window.folder_of(request.sweep_id, rank) / torch_hook.trace_name(rank.rank, rank.key)
            target = out / source.name
            shutil.move(source, target)
            paths.append(target)
        return paths


def _why(failed: list[tuple[str | None, RankInfo]]) -> str:
    return "; ".join(window.reasons(failed, NO_ANSWER)) or "no ranks"
