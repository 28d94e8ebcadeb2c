"""One node's part of a sweep, as a pure state machine.

PENDING → PAUSING_DCGM → CAPTURING → EXPORTING → UPLOADING → UPLOADED → DCGM_RESUMED,
and FAILED (with a reason) from any state. The machine does no I/O: the agent feeds
it events (what just happened) and executes the instructions it returns (what to do
next). DCGM is resumed as soon as the counters are no longer needed, before the
export, and on every exit path, so a node is never left dark (dcgm.md §9); the final
DCGM_RESUMED state confirms that after the upload.

The whole machine round-trips through a plain dict, so the agent can persist it and
an agent restarted mid-upload picks the work up where it was left.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rankscope.states import AGENT_DONE, NodeState

# DCGM outcomes (dcgm.md §9.9). Only "paused" leaves something to resume.
PAUSED = "paused"
NOT_NEEDED = "not_needed"  # the backend reads no GPU counters (the wire's DCGM_OUTCOME_NOT_NEEDED)


# Events: what happened. ------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    needs_gpu_counters: bool


@dataclass(frozen=True)
class DcgmPaused:
    mode: str  # a DcgmOutcome's value, or NOT_NEEDED
    detail: str = ""


@dataclass(frozen=True)
class CaptureStarted:
    pass


@dataclass(frozen=True)
class CaptureStopped:
    exports: tuple[str, ...]  # what the backend wrote (nsys reports): exported once DCGM is back


@dataclass(frozen=True)
class DcgmResumed:
    detail: str = ""


@dataclass(frozen=True)
class Exported:
    artifacts: tuple[str, ...]  # digest first, then raw exports when requested


@dataclass(frozen=True)
class Uploaded:
    pass


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Restarted:
    """The agent came back and found this capture in its work folder."""


Event = Begin | DcgmPaused | CaptureStarted | CaptureStopped | DcgmResumed | Exported | Uploaded | Failed | Restarted


# Instructions: what the agent must do next. ---------------------------------------


@dataclass(frozen=True)
class Report:
    state: NodeState
    detail: str = ""


@dataclass(frozen=True)
class PauseDcgm:
    pass


@dataclass(frozen=True)
class StartCapture:
    pass


@dataclass(frozen=True)
class StopCapture:
    pass


@dataclass(frozen=True)
class AbortCapture:
    """End an open capture window on a failure: the ranks stop recording, the output is dropped."""


@dataclass(frozen=True)
class ResumeDcgm:
    """Release the backend's counters, then resume DCGM where this capture paused it."""

    pause: bool  # False: only release the backend's counters, nothing was paused


@dataclass(frozen=True)
class Export:
    exports: tuple[str, ...]


@dataclass(frozen=True)
class Upload:
    artifacts: tuple[str, ...]


Instruction = Report | PauseDcgm | StartCapture | StopCapture | AbortCapture | ResumeDcgm | Export | Upload


class TransitionError(Exception):
    """An event that cannot happen in the current state: a bug in the agent, not the user."""


@dataclass
class Capture:
    """The lifecycle of one sweep on this node."""

    sweep_id: str
    state: NodeState = NodeState.PENDING
    dcgm_mode: str = ""
    dcgm_resumed: bool = False
    window_open: bool = False  # the backend may be recording: asked to start, not yet stopped
    exports: list[str] = field(default_factory=list)
    artifacts: list[str] = field(default_factory=list)
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.state in AGENT_DONE

    @property
    def owes_resume(self) -> bool:
        """True while this capture holds a DCGM pause it has not given back."""
        return self.dcgm_mode == PAUSED and not self.dcgm_resumed

    def handle(self, event: Event) -> list[Instruction]:
        if isinstance(event, Failed):  # replaces whatever the agent still had to do
            return self._fail(event.reason)
        if isinstance(event, Restarted):
            return self._restart()
        if isinstance(event, DcgmResumed) and self.state is not NodeState.CAPTURING:
            self.dcgm_resumed = True  # the resume a failure asked for: nothing else follows
            return []
        if self.done:
            raise TransitionError(f"sweep {self.sweep_id}: {type(event).__name__} after {self.state.value}")
        handler = _HANDLERS.get((self.state, type(event)))
        if handler is None:
            raise TransitionError(f"sweep {self.sweep_id}: {type(event).__name__} while {self.state.value}")
        return handler(self, event)

    # transitions --------------------------------------------------------------------

    def _begin(self, event: Begin) -> list[Instruction]:
        out = self._enter(NodeState.PAUSING_DCGM)
        if event.needs_gpu_counters:
            return [*out, PauseDcgm()]
        return [*out, *self._paused(DcgmPaused(NOT_NEEDED, "backend reads no GPU counters"))]

    def _paused(self, event: DcgmPaused) -> list[Instruction]:
        self.dcgm_mode = event.mode
        self.window_open = True  # from the moment we ask: a crash inside start may leave ranks recording
        return [*self._enter(NodeState.CAPTURING, f"dcgm {event.mode}{': ' + event.detail if event.detail else ''}"), StartCapture()]

    def _capture_started(self, event: CaptureStarted) -> list[Instruction]:
        return [StopCapture()]

    def _capture_stopped(self, event: CaptureStopped) -> list[Instruction]:
        self.window_open = False
        self.exports = list(event.exports)
        if self.dcgm_mode == PAUSED:
            return [ResumeDcgm(pause=True)]
        self.dcgm_resumed = True  # nothing of ours to resume
        return [ResumeDcgm(pause=False), *self._export()]

    def _resumed(self, event: DcgmResumed) -> list[Instruction]:
        self.dcgm_resumed = True
        return self._export()

    def _export(self) -> list[Instruction]:
        return [*self._enter(NodeState.EXPORTING), Export(tuple(self.exports))]

    def _exported(self, event: Exported) -> list[Instruction]:
        if not event.artifacts:
            return self._fail("export produced nothing to upload")
        self.artifacts = list(event.artifacts)
        return [*self._enter(NodeState.UPLOADING), Upload(tuple(self.artifacts))]

    def _uploaded(self, event: Uploaded) -> list[Instruction]:
        out = self._enter(NodeState.UPLOADED)
        # DCGM was resumed before the export; this state confirms it to the coordinator.
        return [*out, *self._enter(NodeState.DCGM_RESUMED, f"dcgm {self.dcgm_mode}")]

    def _fail(self, reason: str) -> list[Instruction]:
        if self.done:
            return []
        out: list[Instruction] = []
        if self.window_open:  # stop recording before the counters go back to DCGM
            self.window_open = False
            out.append(AbortCapture())
        if self.owes_resume:
            out.append(ResumeDcgm(pause=True))
        self.reason = reason
        return [*out, *self._enter(NodeState.FAILED, reason)]

    def _restart(self) -> list[Instruction]:
        """Pick up after an agent restart: only work whose inputs are on disk can go on."""
        if self.done:
            return []
        if self.state is NodeState.UPLOADING:
            return [Report(self.state, "resumed after agent restart"), Upload(tuple(self.artifacts))]
        if self.state is NodeState.EXPORTING:
            return [Report(self.state, "resumed after agent restart"), Export(tuple(self.exports))]
        # The capture window itself died with the old process; its DCGM pause is
        # resumed by the pause ledger's recovery, but say so here too.
        return self._fail(f"agent restarted while {self.state.value}")

    def _enter(self, state: NodeState, detail: str = "") -> list[Instruction]:
        self.state = state
        return [Report(state, detail)]

    # persistence --------------------------------------------------------------------

    def to_dict(self) -> dict:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> Capture:
        return cls(**{**data, "state": NodeState(data["state"])})


_HANDLERS = {
    (NodeState.PENDING, Begin): Capture._begin,
    (NodeState.PAUSING_DCGM, DcgmPaused): Capture._paused,
    (NodeState.CAPTURING, CaptureStarted): Capture._capture_started,
    (NodeState.CAPTURING, CaptureStopped): Capture._capture_stopped,
    (NodeState.CAPTURING, DcgmResumed): Capture._resumed,
    (NodeState.EXPORTING, Exported): Capture._exported,
    (NodeState.UPLOADING, Uploaded): Capture._uploaded,
}
