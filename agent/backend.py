"""The capture-backend interface: how the agent records its ranks.

Backends (``sim``, ``nsys``, ``torch``) sit behind this one interface so the
agent's capture state machine does not know which profiler runs.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from rankscope import capture_options
from rankscope.agent import window
from rankscope.agent.spool import RankInfo
from rankscope.errors import ToolError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CaptureRequest:
    sweep_id: str
    duration_s: float
    workdir: Path  # this capture's private folder on the node
    ranks: tuple[RankInfo, ...]  # local ranks to record (may be empty for `sim`)
    options: Mapping[str, str] = field(default_factory=dict)
    # When the sweep's windows begin on every node (epoch seconds, the coordinator's clock); 0: when ready.
    start_at: float = 0.0
    # --upload-raw: the profiler's own files (nsys reports) go too, so export keeps them.
    keep_outputs: bool = False
    # Set when the capture is cancelled: long steps (exports) stop early instead of finishing
    # work nobody will read.
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)


class CaptureBackend(ABC):
    """Start and stop one capture window on every local rank (an instance per capture)."""

    name: ClassVar[str]
    # The capture options (`rankscope capture --option K=V`) it reads, ``prefix.*`` for a
    # family; a sweep asking for another is refused, so a misspelt option fails the node
    # rather than do nothing.
    options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        """What the capture goes on without (a rank that did not record, GPU metrics): logged
        here, and sent with the node's status so the sweep's report says it."""
        log.warning(message)
        self.notes.append(message)

    def unknown_options(self, names: Iterable[str]) -> list[str]:
        return capture_options.unread(names, self.options)

    def own_ranks(self, request: CaptureRequest) -> list[RankInfo]:
        """The request's ranks that run under this backend (``rankscope rank --backend NAME``);
        a ToolError where there is none, as then there is nothing to record, or where a rank's
        wrapper is too old to answer (window.py)."""
        ranks = [r for r in request.ranks if r.backend == self.name and r.session]
        if not ranks:
            raise ToolError(f"no rank on this node runs under `rankscope rank --backend {self.name}`")
        older = [r.rank for r in ranks if r.protocol < window.PROTOCOL]
        if older:
            ranks_run = f"ranks {', '.join(map(str, older))} run" if len(older) > 1 else f"rank {older[0]} runs"
            raise ToolError(f"{ranks_run} under a `rankscope rank` older than this agent, which records no window "
                            "it is asked for: start the job's ranks under this rankscope version")
        return ranks

    def check(self, request: CaptureRequest) -> None:
        """Raise where the capture plainly cannot start (tool missing, no rank to record),
        before DCGM is paused for it; default: nothing to check."""

    def needs_gpu_counters(self, request: CaptureRequest) -> bool:
        """True where this capture reads GPU performance counters, which DCGM profiling must
        release first (dcgm.md); the agent pauses DCGM only then. Default: never."""
        return False

    def counters_held(self, request: CaptureRequest) -> bool:
        """Once ``start`` returned: whether a rank reads the GPU counters as it records. Where
        none does (the sampler fell back to no GPU metrics), DCGM need not stay paused for
        the window. Default: as `needs_gpu_counters` said."""
        return self.needs_gpu_counters(request)

    @abstractmethod
    def start(self, request: CaptureRequest) -> float | None:
        """Begin recording on every rank of the request (at ``request.start_at`` where they
        are ready by then); when they began (epoch seconds), where they began together."""

    @abstractmethod
    def stop(self, request: CaptureRequest) -> list[Path]:
        """End recording and return what it wrote; ``export`` turns that into what is digested.
        Keep it short: DCGM stays paused until it returns."""

    def export(self, request: CaptureRequest, outputs: Sequence[Path]) -> list[Path]:
        """Turn what ``stop`` returned into the exports to digest (nsys SQLite, Kineto JSON),
        after DCGM is resumed, while the node reports EXPORTING. Called again with the same
        outputs by an agent restarted mid-export. Default: they are the exports already."""
        return list(outputs)

    def export_timeout_s(self, outputs: Sequence[Path]) -> float:
        """The longest ``export`` may run before it fails by itself; the sweep's timeout does
        not count that time (0: too quick to matter, counted like the rest)."""
        return 0.0

    def release_counters(self, request: CaptureRequest) -> None:
        """Called once GPU counters are no longer needed (before export); default: nothing."""
