"""The node capture lifecycle, driven by events with no network and no processes."""

from __future__ import annotations

import pytest

from rankscope.agent.capture import (
    AbortCapture,
    Begin,
    Capture,
    CaptureStarted,
    CaptureStopped,
    DcgmPaused,
    DcgmResumed,
    Export,
    Exported,
    Failed,
    PauseDcgm,
    Report,
    Restarted,
    ResumeDcgm,
    StartCapture,
    StopCapture,
    TransitionError,
    Upload,
    Uploaded,
)
from rankscope.states import NodeState


def reports(instructions) -> list[NodeState]:
    return [i.state for i in instructions if isinstance(i, Report)]


def actions(instructions) -> list:
    return [i for i in instructions if not isinstance(i, Report)]


def test_full_lifecycle_with_a_dcgm_pause_resumes_before_export() -> None:
    c = Capture("s1")
    out = c.handle(Begin(needs_gpu_counters=True))
    assert reports(out) == [NodeState.PAUSING_DCGM] and actions(out) == [PauseDcgm()]
    out = c.handle(DcgmPaused("paused"))
    assert reports(out) == [NodeState.CAPTURING] and actions(out) == [StartCapture()]
    assert c.owes_resume
    assert actions(c.handle(CaptureStarted())) == [StopCapture()]
    out = c.handle(CaptureStopped(("a.sqlite", "b.sqlite")))
    # Counters released and DCGM resumed before anything is exported.
    assert out == [ResumeDcgm(pause=True)] and c.state is NodeState.CAPTURING
    out = c.handle(DcgmResumed())
    assert not c.owes_resume
    assert reports(out) == [NodeState.EXPORTING] and actions(out) == [Export(("a.sqlite", "b.sqlite"))]
    out = c.handle(Exported(("digest.parquet",)))
    assert reports(out) == [NodeState.UPLOADING] and actions(out) == [Upload(("digest.parquet",))]
    out = c.handle(Uploaded())
    assert reports(out) == [NodeState.UPLOADED, NodeState.DCGM_RESUMED] and c.done


def test_backend_without_counters_skips_the_pause_and_only_releases() -> None:
    c = Capture("s1")
    out = c.handle(Begin(needs_gpu_counters=False))
    assert PauseDcgm() not in out
    assert reports(out) == [NodeState.PAUSING_DCGM, NodeState.CAPTURING] and c.dcgm_mode == "not_needed"
    c.handle(CaptureStarted())
    out = c.handle(CaptureStopped(("x",)))
    assert out[0] == ResumeDcgm(pause=False)
    assert reports(out) == [NodeState.EXPORTING] and not c.owes_resume


@pytest.mark.parametrize("mode", ["not_supported", "not_present"])
def test_nothing_paused_means_nothing_to_resume(mode: str) -> None:
    c = Capture("s1")
    c.handle(Begin(needs_gpu_counters=True))
    c.handle(DcgmPaused(mode))
    c.handle(CaptureStarted())
    out = c.handle(CaptureStopped(("x",)))
    assert ResumeDcgm(pause=True) not in out and reports(out) == [NodeState.EXPORTING]


def _paused_capture() -> Capture:
    c = Capture("s1")
    c.handle(Begin(needs_gpu_counters=True))
    c.handle(DcgmPaused("paused"))
    return c


def test_failure_while_paused_resumes_dcgm_first() -> None:
    c = _paused_capture()
    c.handle(CaptureStarted())
    c.handle(CaptureStopped(("x",)))  # the window is closed; the resume is still owed
    out = c.handle(Failed("nsys: session not found"))
    assert out[0] == ResumeDcgm(pause=True)
    assert reports(out) == [NodeState.FAILED] and c.reason == "nsys: session not found"
    assert c.handle(DcgmResumed()) == [] and not c.owes_resume
    assert c.handle(Failed("again")) == []  # a terminal capture stays as it ended


def test_failure_with_the_window_open_stops_recording_before_resuming() -> None:
    c = _paused_capture()  # asked to start: even before CaptureStarted the ranks may be recording
    out = c.handle(Failed("cancelled"))
    assert out == [AbortCapture(), ResumeDcgm(pause=True), Report(NodeState.FAILED, "cancelled")]
    assert not c.window_open


def test_failure_after_resume_does_not_resume_twice() -> None:
    c = _paused_capture()
    c.handle(CaptureStarted())
    c.handle(CaptureStopped(("x",)))
    c.handle(DcgmResumed())
    out = c.handle(Failed("export failed: disk full"))
    assert out == [Report(NodeState.FAILED, "export failed: disk full")]


def test_empty_export_fails_with_reason() -> None:
    c = Capture("s1")
    c.handle(Begin(needs_gpu_counters=False))
    c.handle(CaptureStarted())
    c.handle(CaptureStopped(()))
    out = c.handle(Exported(()))
    assert reports(out) == [NodeState.FAILED] and "nothing to upload" in c.reason


def test_events_out_of_order_are_refused() -> None:
    c = Capture("s1")
    with pytest.raises(TransitionError, match="Uploaded while pending"):
        c.handle(Uploaded())
    c.handle(Begin(needs_gpu_counters=False))
    with pytest.raises(TransitionError):
        c.handle(Begin(needs_gpu_counters=False))


def test_persisted_upload_resumes_after_restart() -> None:
    c = Capture("s1")
    c.handle(Begin(needs_gpu_counters=False))
    c.handle(CaptureStarted())
    c.handle(CaptureStopped(("a",)))
    c.handle(Exported(("d.parquet", "a")))
    back = Capture.from_dict(c.to_dict())
    assert back == c
    out = back.handle(Restarted())
    assert actions(out) == [Upload(("d.parquet", "a"))] and back.state is NodeState.UPLOADING
    back.handle(Uploaded())
    assert back.state is NodeState.DCGM_RESUMED


def test_restart_mid_capture_fails_and_gives_back_the_pause() -> None:
    c = _paused_capture()
    back = Capture.from_dict(c.to_dict())
    out = back.handle(Restarted())
    assert out[:2] == [AbortCapture(), ResumeDcgm(pause=True)]
    assert back.state is NodeState.FAILED and "restarted while capturing" in back.reason


def test_restart_mid_export_exports_again() -> None:
    c = Capture("s1")
    c.handle(Begin(needs_gpu_counters=False))
    c.handle(CaptureStarted())
    c.handle(CaptureStopped(("a", "b")))
    out = Capture.from_dict(c.to_dict()).handle(Restarted())
    assert actions(out) == [Export(("a", "b"))]
