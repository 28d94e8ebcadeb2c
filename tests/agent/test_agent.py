"""The agent process logic against an in-process coordinator stand-in (no subprocesses).

The stand-in speaks the real wire (rankscope.v1) and records what the agent sends;
the capture backend and DCGM control are recording fakes, so the order of pause,
capture, resume, export and upload is observable. Real processes on loopback, with
the real coordinator, are in tests/integration/test_sweep*.py.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent import futures
from pathlib import Path

import grpc
import pandas as pd
import pytest

from rankscope import atomic
from rankscope.agent import agent as agent_mod
from rankscope.agent import commands, dcgm, pause_ledger, spool
from rankscope.agent.agent import Agent, AgentConfig, load_backend, safe_name
from rankscope.cli import main, parse_labels
from rankscope.agent.backend import CaptureBackend, CaptureRequest
from rankscope.agent.sim_backend import SimBackend
from rankscope.analysis import digest, sources
from rankscope.errors import ConfigError, ToolError
from rankscope.lock import FolderInUse, FolderLock
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

WAIT_S = 20.0


class Coordinator(pb_grpc.AgentServiceServicer):
    """Registers anyone, records events, sends queued commands, stores uploads in memory."""

    def __init__(self) -> None:
        self.events: queue.Queue = queue.Queue()
        self.commands: queue.Queue = queue.Queue()
        self.registered: list[pb.RegisterRequest] = []
        self.uploads: dict[str, bytearray] = {}
        self.complete: dict[str, str] = {}
        self.register_delay_s = 0.0
        self.session_refusal: tuple[grpc.StatusCode, str] | None = None
        self.clock_ahead_ns = 0  # of the agent's
        self.raw_incomplete = False  # raw exports' uploads end uncommitted, retried until the agent stops

    def Register(self, request, context):
        time.sleep(self.register_delay_s)
        self.registered.append(request)
        return pb.RegisterReply(agent_id=f"agent-{request.node}", session_token="tok", heartbeat_interval_ms=200,
                                chunk_bytes=4096, coordinator_time_ns=time.time_ns() + self.clock_ahead_ns)

    def Session(self, request_iterator, context):
        if self.session_refusal is not None:
            context.abort(*self.session_refusal)

        ended = threading.Event()

        def pump():
            try:
                for event in request_iterator:
                    self.events.put(event)
            except grpc.RpcError:
                pass  # the agent went away: what a real coordinator sees too
            ended.set()  # as the real one, the session ends with the agent's events

        threading.Thread(target=pump, daemon=True).start()
        while context.is_active() and not ended.is_set():
            try:
                yield self.commands.get(timeout=0.1)
            except queue.Empty:
                continue

    def QueryUpload(self, request, context):
        assert request.session_token == "tok"
        uid = request.upload_id
        if uid not in self.uploads:
            return pb.UploadStatus(upload_id=uid, known=False)
        return pb.UploadStatus(upload_id=uid, known=True, committed_offset=len(self.uploads[uid]),
                               complete=uid in self.complete, sha256=self.complete.get(uid, ""))

    def Upload(self, request_iterator, context):
        first = next(request_iterator)
        assert first.header.session_token == "tok"
        uid = first.header.upload_id
        if self.raw_incomplete and first.header.kind == pb.ARTIFACT_KIND_RAW:
            return pb.UploadReply(upload_id=uid)
        buf = self.uploads.setdefault(uid, bytearray())
        for chunk in request_iterator:
            assert chunk.offset == len(buf)
            buf.extend(chunk.data)
        done = len(buf) == first.header.size and hashlib.sha256(buf).hexdigest() == first.header.sha256
        if done:
            self.complete[uid] = first.header.sha256
        return pb.UploadReply(upload_id=uid, committed_offset=len(buf), complete=done,
                              sha256=self.complete.get(uid, ""))

    def statuses(self, sweep_id: str, until: int, timeout: float = WAIT_S) -> list[pb.NodeStatus]:
        """Statuses of one sweep until a terminal one (DCGM_RESUMED or FAILED)."""
        seen: list[pb.NodeStatus] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            if event.HasField("status") and event.status.sweep_id == sweep_id:
                seen.append(event.status)
                if event.status.state == until or event.status.state == pb.NODE_STATE_FAILED:
                    return seen
        raise AssertionError(f"no {pb.NodeState.Name(until)} for {sweep_id}; saw {[s.state for s in seen]}")


class Log:
    """What happened, in order, across the fake backend and the fake DCGM."""

    def __init__(self) -> None:
        self.calls: list[str] = []


class RecordingDcgm(dcgm.DcgmControl):
    def __init__(self, log: Log) -> None:
        self.log = log

    def pause(self) -> dcgm.DcgmOutcome:
        self.log.calls.append("dcgm.pause")
        return dcgm.DcgmOutcome.PAUSED

    def resume(self) -> dcgm.DcgmOutcome:
        self.log.calls.append("dcgm.resume")
        return dcgm.DcgmOutcome.RESUMED

    def describe(self) -> str:
        return "recording"


def fake_digest(path: Path, rank: int, host: str) -> Path:
    meta = {"rank": rank, "rank_source": "test", "host": host, "source_format": "test", "source_file": str(path),
            "window_start_ns": 0, "window_end_ns": 10, "gpu_busy_ns": 5, "compute_only_ns": 5,
            "comm_only_ns": 0, "overlap_ns": 0}
    kernels = pd.DataFrame({"name": ["k"], "count": [1], "total_ns": [5], "is_comm": [False]})
    digest.write(digest.digest_row(meta, kernels=kernels), path)
    return path


def make_backend(log: Log, *, fail_on_stop: bool = False, cannot_start: str = "", note_on_stop: str = "",
                 export_gate: threading.Event | None = None, export_until_cancelled: bool = False,
                 cut_short: tuple[int, ...] = (), fail_export: str = "", fail_release: bool = False,
                 on_start: Callable[[CaptureRequest], None] | None = None,
                 counters_once_started: bool = True) -> type[CaptureBackend]:
    class Recording(CaptureBackend):
        name = "fake"
        options = frozenset({"gpu_metrics"})

        def needs_gpu_counters(self, request: CaptureRequest) -> bool:
            return True

        def counters_held(self, request: CaptureRequest) -> bool:
            return counters_once_started

        def check(self, request: CaptureRequest) -> None:
            if cannot_start:
                raise ToolError(cannot_start)

        def start(self, request: CaptureRequest) -> None:
            log.calls.append("backend.start")
            if on_start is not None:
                on_start(request)

        def stop(self, request: CaptureRequest) -> list[Path]:
            log.calls.append("backend.stop")
            if note_on_stop:
                self.note(note_on_stop)
            if fail_on_stop:
                raise RuntimeError("profiler crashed")
            request.workdir.mkdir(parents=True, exist_ok=True)
            return [fake_digest(request.workdir / f"r{r}.parquet", r, "n0") for r in (0, 1)]

        def export(self, request: CaptureRequest, outputs) -> list[Path]:
            log.calls.append("backend.export")
            if export_until_cancelled:  # as nsys exports are: killed once the capture is cancelled
                assert request.cancelled.wait(WAIT_S), "the agent's cancel never reached the export"
                raise ToolError("exports stopped, the capture was cancelled")
            if export_gate is not None:
                assert export_gate.wait(WAIT_S), "the test never let the export finish"
            if fail_export:
                raise ToolError(fail_export)
            for rank in cut_short:  # exported "successfully", as an nsys export killed mid-write may leave it
                path = Path(outputs[rank])
                path.write_bytes(path.read_bytes()[:100])
            return list(outputs)

        def export_timeout_s(self, outputs) -> float:
            return 42.0

        def release_counters(self, request: CaptureRequest) -> None:
            log.calls.append("backend.release")
            if fail_release:
                raise RuntimeError("counters stuck")

    return Recording


@pytest.fixture()
def coordinator():
    servicer = Coordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_AgentServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(0)


def start_agent(address: str, tmp_path: Path, log: Log, monkeypatch, name: str = "n0",
                **backend) -> tuple[Agent, threading.Thread]:
    monkeypatch.setattr(agent_mod, "load_backend", lambda name: make_backend(log, **backend))
    monkeypatch.setattr(dcgm, "discover", lambda config=None: RecordingDcgm(log))
    real_load = sources.load_digests

    def load_digests(paths, **kw):
        log.calls.append("export")
        return real_load(paths, **kw)

    monkeypatch.setattr(sources, "load_digests", load_digests)
    config = AgentConfig(coordinator=address, name=name, labels={"pool": "a"}, spool=tmp_path / "spool",
                         work_dir=tmp_path / "work", backends=("fake",), max_backoff_s=0.5,
                         dcgm=dcgm.DcgmConfig(ledger_dir=tmp_path / "dcgm-ledger"))
    agent = Agent(config)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    return agent, thread


@contextmanager
def running_agent(address: str, tmp_path: Path, log: Log, monkeypatch, name: str = "n0",
                  **backend) -> Iterator[tuple[Agent, threading.Thread]]:
    """`start_agent`, closed on the way out, a held export (``export_gate``) let go first so the
    close need not wait it out."""
    agent, thread = start_agent(address, tmp_path, log, monkeypatch, name, **backend)
    try:
        yield agent, thread
    finally:
        if backend.get("export_gate") is not None:
            backend["export_gate"].set()
        agent.close()
        thread.join(10)


def start(sweep_id: str, **kw) -> pb.CoordinatorCommand:
    return pb.CoordinatorCommand(start=pb.StartCapture(sweep_id=sweep_id, backend="fake", duration_s=0.05, **kw))


def test_what_the_capture_went_on_without_is_sent_from_then_on(coordinator, tmp_path: Path, monkeypatch) -> None:
    """A backend's note (a rank that did not record) goes with every later status and is
    kept in the capture's record, so a reconnect or a restarted agent still sends it."""
    servicer, address = coordinator
    note = "no trace from rank 1: the rank exited"
    with running_agent(address, tmp_path, Log(), monkeypatch, note_on_stop=note):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        notes = {pb.NodeState.Name(s.state): list(s.notes) for s in seen}
        assert notes["NODE_STATE_CAPTURING"] == [] and notes["NODE_STATE_EXPORTING"] == [note]
        assert notes["NODE_STATE_UPLOADED"] == notes["NODE_STATE_DCGM_RESUMED"] == [note]
        record = json.loads((tmp_path / "work" / "captures" / "s1" / "capture.json").read_text())
        assert record["notes"] == [note]


def test_an_export_cut_short_is_left_out_and_noted_while_the_others_go_on(coordinator, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """One rank's export cut short failed the whole node at the digest, its other ranks' data
    lost, where an export that nsys says failed is left out with a note."""
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch, cut_short=(1,)):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_DCGM_RESUMED, seen[-1].reason
        (note,) = seen[-1].notes
        assert note.startswith("went on without ") and "r1.parquet" in note and "Parquet" in note
        record = json.loads((tmp_path / "work" / "captures" / "s1" / "capture.json").read_text())
        assert record["ranks"] == [0]


@pytest.mark.parametrize("ahead_s, said", [(30, "30.0 s behind"), (-30, "30.0 s ahead of")])
def test_a_node_whose_clock_is_off_starts_its_window_at_the_sweeps_time(coordinator, tmp_path: Path, monkeypatch, caplog,
                                                                      ahead_s: int, said: str) -> None:
    """A sweep's start is on the coordinator's clock: taken as it was, a node 30 s behind it
    began its window 30 s after the others' (one ahead, at once: its window 30 s early)."""
    servicer, address = coordinator
    servicer.clock_ahead_ns = ahead_s * 10**9
    asked: list[CaptureRequest] = []
    with running_agent(address, tmp_path, Log(), monkeypatch, on_start=asked.append):
        in_2_s = time.time_ns() + 2 * 10**9  # on this clock
        servicer.commands.put(start("s1", start_at_ns=in_2_s + servicer.clock_ahead_ns))
        assert servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED
    assert abs(asked[0].start_at - in_2_s / 1e9) < 0.5
    assert any(said in r.getMessage() and "NTP" in r.getMessage() for r in caplog.records)


def test_the_coordinators_estimate_in_the_command_moves_the_start_not_the_registrations(coordinator, tmp_path: Path,
                                                                                         monkeypatch) -> None:
    """A node clock stepped since the agent registered (NTP at boot): the registration's
    offset is stale, the coordinator's latest pings are not."""
    servicer, address = coordinator
    servicer.clock_ahead_ns = 30 * 10**9  # as it registered: 30 s behind
    asked: list[CaptureRequest] = []
    with running_agent(address, tmp_path, Log(), monkeypatch, on_start=asked.append):
        start_at = time.time_ns() + 2 * 10**9
        command = start("s1", start_at_ns=start_at, node_clock=pb.ClockEstimate(offset_ns=-5_000_000, rtt_ns=1_000_000))
        servicer.commands.put(command)
        assert servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED
        servicer.commands.put(start("s2", start_at_ns=start_at, node_clock=pb.ClockEstimate(offset_ns=-5_000_000,
                                                                                          rtt_ns=20_000_000)))
        assert servicer.statuses("s2", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED
    assert [request.start_at for request in asked] == [(start_at - 5_000_000) / 1e9, start_at / 1e9]  # within its rtt: as sent


def test_a_clock_offset_within_the_registrations_round_trip_is_not_applied(coordinator, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """A registration queued 0.4 s at the coordinator reads as clocks 0.2 s apart: NTP keeps
    them closer, so the sweep's start is taken as sent."""
    servicer, address = coordinator
    servicer.register_delay_s = 0.4
    asked: list[CaptureRequest] = []
    with running_agent(address, tmp_path, Log(), monkeypatch, on_start=asked.append):
        start_at = time.time_ns() + 2 * 10**9
        servicer.commands.put(start("s1", start_at_ns=start_at))
        assert servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED
    assert asked[0].start_at == start_at / 1e9


def test_a_failed_capture_leaves_only_its_record_on_the_node(coordinator, tmp_path: Path, monkeypatch) -> None:
    """An export failing for a full disk kept the capture's reports (GiBs a rank, for nsys) for
    the week its record is kept: every later capture of the node failed "disk full" too."""
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch, fail_export="No space left on device"):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].reason == "No space left on device"
        folder = tmp_path / "work" / "captures" / "s1"
        wait_for_files = time.monotonic() + WAIT_S
        while len(list(folder.iterdir())) > 1 and time.monotonic() < wait_for_files:
            time.sleep(0.05)
        assert [p.name for p in folder.iterdir()] == ["capture.json"]
        assert json.loads((folder / "capture.json").read_text())["capture"]["state"] == "failed"


def test_exports_that_cannot_be_removed_once_uploaded_leave_the_capture_a_success(coordinator, tmp_path: Path,
                                                                                 monkeypatch, caplog) -> None:
    """Dropping what the coordinator has is housekeeping: a file that would not go (read-only,
    another user's) failed the node after its upload, or, after a failure, ended the capture's
    thread in a traceback."""
    servicer, address = coordinator
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self.suffix == ".parquet":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with running_agent(address, tmp_path, Log(), monkeypatch):
        servicer.commands.put(start("s1"))
        assert servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED
    assert any("not removed" in r.getMessage() for r in caplog.records)


def test_every_export_cut_short_fails_the_node_with_the_reason(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch, cut_short=(0, 1)):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and "not a readable Parquet digest" in seen[-1].reason


def test_a_node_named_at_the_longest_uploads_its_digest(coordinator, tmp_path: Path, monkeypatch) -> None:
    # A node name may run to 253 characters: "<name>.digest.parquet" was past a file name's 255.
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch, name="n" * 253):
        servicer.commands.put(start("s1"))
        states = [s.state for s in servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)]
        assert pb.NODE_STATE_UPLOADED in states and pb.NODE_STATE_FAILED not in states


def test_dcgm_comes_back_as_the_window_begins_where_no_rank_reads_the_counters(coordinator, tmp_path: Path,
                                                                              monkeypatch) -> None:
    """The sampler fell back to no GPU metrics (the counters held by another tool, or not its
    user's): DCGM stayed paused through the window all the same, its profiling series dark
    for nothing (dcgm.md §9.2). Resumed once, as the window began, and said so."""
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch, counters_once_started=False):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
    assert log.calls[:5] == ["dcgm.pause", "backend.start", "dcgm.resume", "backend.stop", "backend.release"]
    assert log.calls.count("dcgm.resume") == 1
    assert seen[-1].state == pb.NODE_STATE_DCGM_RESUMED and seen[-1].dcgm == pb.DCGM_OUTCOME_RESUMED
    assert seen[-1].dcgm_detail == "resumed as the window began: no rank reads the GPU counters"


def test_capture_pauses_before_and_resumes_before_export(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        assert [s.state for s in seen] == [pb.NODE_STATE_PENDING, pb.NODE_STATE_PAUSING_DCGM, pb.NODE_STATE_CAPTURING,
                                           pb.NODE_STATE_EXPORTING, pb.NODE_STATE_UPLOADING, pb.NODE_STATE_UPLOADED,
                                           pb.NODE_STATE_DCGM_RESUMED]
        assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "backend.release", "dcgm.resume",
                             "backend.export", "export"]
        uploaded = seen[-2]
        (ref,) = uploaded.artifacts
        assert ref.kind == pb.ARTIFACT_KIND_DIGEST and list(ref.ranks) == [0, 1]
        assert servicer.complete[ref.upload_id] == ref.sha256
        assert seen[-1].dcgm == pb.DCGM_OUTCOME_RESUMED
        reg = servicer.registered[0]
        assert reg.node == "n0" and dict(reg.labels) == {"pool": "a"} and list(reg.backends) == ["fake"]
        # Repeating the command re-reports, it does not capture again.
        servicer.commands.put(start("s1"))
        again = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        assert [s.state for s in again] == [pb.NODE_STATE_UPLOADED, pb.NODE_STATE_DCGM_RESUMED]
        assert again[0].artifacts[0].sha256 == ref.sha256 and log.calls.count("backend.start") == 1
        # Exports are gone from the node once the coordinator has them; the record stays.
        assert [p.name for p in (tmp_path / "work" / "captures" / "s1").iterdir()] == ["capture.json"]


def test_failure_mid_capture_resumes_dcgm_and_names_the_reason(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch, fail_on_stop=True):
        servicer.commands.put(start("s2"))
        seen = servicer.statuses("s2", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and "profiler crashed" in seen[-1].reason
        assert log.calls[-1] == "dcgm.resume" and "export" not in log.calls


def test_a_step_of_the_failure_plan_that_fails_still_sends_the_failed_report(coordinator, tmp_path: Path,
                                                                            monkeypatch) -> None:
    """The failure's own resume raising replaced the plan with an empty one: the FAILED report
    never went, the coordinator waited out its timeout, and DCGM stayed paused to the lease's end."""
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch, fail_on_stop=True, fail_release=True):
        servicer.commands.put(start("s2"))
        seen = servicer.statuses("s2", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED
        assert seen[-1].reason == "StopCapture: RuntimeError: profiler crashed"
        assert seen[-1].dcgm == pb.DCGM_OUTCOME_RESUMED
        assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "backend.stop", "backend.release",
                             "dcgm.resume"]


def test_a_capture_that_cannot_start_fails_without_pausing_dcgm(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch, cannot_start="nsys not found"):
        servicer.commands.put(start("s3"))
        seen = servicer.statuses("s3", pb.NODE_STATE_DCGM_RESUMED)
        assert [s.state for s in seen] == [pb.NODE_STATE_PENDING, pb.NODE_STATE_FAILED]
        assert seen[-1].reason == "nsys not found" and log.calls == []  # telemetry never went dark


@pytest.mark.parametrize("field, value, refused", [
    ("duration_s", float("nan"), "StartCapture's capture window of nans is not a positive number of seconds to wait"),
    ("duration_s", float("inf"), "StartCapture's capture window of infs is not a positive number of seconds to wait"),
    ("duration_s", -1.0, "StartCapture's capture window of -1s is not a positive number of seconds to wait"),
    ("timeout_s", float("inf"), "StartCapture's timeout of infs is not a number of seconds to wait (0: none)"),
    ("timeout_s", float("nan"), "StartCapture's timeout of nans is not a number of seconds to wait (0: none)"),
    ("timeout_s", -5.0, "StartCapture's timeout of -5s is not a number of seconds to wait (0: none)"),
    ("timeout_s", 1e300, "StartCapture's timeout of 1e+300s is not a number of seconds to wait (0: none)"),
])
def test_a_window_or_timeout_no_wait_can_take_fails_the_node_before_dcgm(coordinator, tmp_path: Path, monkeypatch,
                                                                         field, value, refused) -> None:
    """From the wire as sent: a NaN window leased DCGM's pause for ever (a NaN expiry never
    comes) and spun the lease timer, an inf one or an inf timeout overflowed a wait (the deadline
    timer's thread died, the window's wait failed with a traceback)."""
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch):
        command = start("w1")
        setattr(command.start, field, value)
        servicer.commands.put(command)
        seen = servicer.statuses("w1", pb.NODE_STATE_DCGM_RESUMED)
        assert [s.state for s in seen] == [pb.NODE_STATE_PENDING, pb.NODE_STATE_FAILED] and log.calls == []
        assert seen[-1].reason == refused


def test_a_capture_option_the_backend_does_not_read_fails_the_node_before_dcgm(coordinator, tmp_path: Path,
                                                                               monkeypatch) -> None:
    """`--option gpu_metric=false` (for gpu_metrics) would otherwise do nothing, silently; the
    agent's own labels, which join the options, are not the sweep's to be checked."""
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch):
        servicer.commands.put(start("s6", options={"gpu_metric": "false"}))
        seen = servicer.statuses("s6", pb.NODE_STATE_DCGM_RESUMED)
        assert [s.state for s in seen] == [pb.NODE_STATE_PENDING, pb.NODE_STATE_FAILED] and log.calls == []
        assert seen[-1].reason == "unknown capture option 'gpu_metric' for the fake backend (it reads: gpu_metrics)"
        servicer.commands.put(start("s7", options={"gpu_metrics": "false"}))
        assert servicer.statuses("s7", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED


def test_registration_says_what_capture_options_each_backend_reads(coordinator, tmp_path: Path, monkeypatch) -> None:
    """From it the coordinator refuses a sweep asking for another before it starts (one capture
    failing on it on every node was the only refusal)."""
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch) as (agent, _):
        assert agent.registered.wait(WAIT_S)
        assert list(servicer.registered[0].backend_options) == [pb.BackendOptions(backend="fake",
                                                                                   options=["gpu_metrics"])]


def test_a_backend_that_cannot_load_says_nothing_of_its_options(monkeypatch) -> None:
    """Its captures fail on the node, saying why; the coordinator does not judge its options."""
    monkeypatch.setitem(agent_mod.BACKENDS, "torch", "rankscope.agent.not_installed_here")
    assert agent_mod.backend_options(["sim", "torch", "nsys"]) == [
        pb.BackendOptions(backend="sim", options=["sim.*"]), pb.BackendOptions(backend="nsys", options=["gpu_metrics"])]


def test_pings_are_answered_with_the_agent_clock(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch):
        servicer.commands.put(pb.CoordinatorCommand(ping=pb.Ping(ping_id=7, coordinator_time_ns=123)))
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            event = servicer.events.get(timeout=WAIT_S)
            if event.HasField("pong"):
                assert event.pong.ping_id == 7 and event.pong.coordinator_time_ns == 123
                assert abs(event.pong.agent_time_ns - time.time_ns()) < 60e9
                break
        else:
            raise AssertionError("no pong")


def _heartbeat_ranks(servicer: Coordinator, wanted: list[int]) -> pb.Heartbeat:
    """The first heartbeat whose ranks are ``wanted``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        event = servicer.events.get(timeout=WAIT_S)
        if event.HasField("heartbeat") and [r.rank for r in event.heartbeat.ranks.ranks] == wanted:
            return event.heartbeat
    raise AssertionError(f"no heartbeat with ranks {wanted}")


def test_heartbeats_carry_the_ranks_announced_now(coordinator, tmp_path: Path, monkeypatch) -> None:
    """The ranks went up only when the agent registered: a job started after it was not seen
    until the agent restarted (`rankscope nodes` showed the node with none)."""
    servicer, address = coordinator
    with running_agent(address, tmp_path, Log(), monkeypatch):
        assert _heartbeat_ranks(servicer, []).HasField("ranks")  # none announced: said, not left out
        info = spool.RankInfo(rank=5, local_rank=1, world_size=8, pid=os.getpid(), host="n0", job_id="job-7",
                              token=spool.new_token(os.getpid()))
        spool.announce(tmp_path / "spool", info)
        (rank,) = _heartbeat_ranks(servicer, [5]).ranks.ranks
        assert (rank.local_rank, rank.world_size, rank.pid, rank.job_id) == (1, 8, os.getpid(), "job-7")
        spool.withdraw(tmp_path / "spool", info)
        _heartbeat_ranks(servicer, [])


def test_agent_restarted_mid_upload_finishes_it(coordinator, tmp_path: Path, monkeypatch) -> None:
    """A persisted UPLOADING capture is uploaded by the next agent process without a new capture."""
    servicer, address = coordinator
    log = Log()
    agent, thread = start_agent(address, tmp_path, log, monkeypatch)
    servicer.commands.put(start("s3"))
    servicer.statuses("s3", pb.NODE_STATE_DCGM_RESUMED)
    agent.close()
    thread.join(10)
    record_path = tmp_path / "work" / "captures" / "s3" / "capture.json"
    # Rewind the record to "uploading" with its digest back on disk, and forget the upload.
    record = json.loads(record_path.read_text())
    artifact = Path(tmp_path / "work" / "captures" / "s3" / "n0.digest.parquet")
    fake_digest(artifact, 0, "n0")
    record["capture"].update(state="uploading", artifacts=[str(artifact)])
    record["uploaded"] = []
    record_path.write_text(json.dumps(record))
    servicer.uploads.clear()
    servicer.complete.clear()
    log.calls.clear()
    with running_agent(address, tmp_path, log, monkeypatch):
        seen = servicer.statuses("s3", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_DCGM_RESUMED
        assert "backend.start" not in log.calls
        assert servicer.complete  # uploaded again by the new process


def test_labels_and_backends_are_checked() -> None:
    assert parse_labels("a=1, b = x,") == {"a": "1", "b": "x"}
    with pytest.raises(argparse.ArgumentTypeError, match="not key=value"):
        parse_labels("oops")
    assert load_backend("sim") is SimBackend
    with pytest.raises(ConfigError, match="unknown capture backend 'gpu'"):
        load_backend("gpu")
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    commands.register(sub)
    args = parser.parse_args(["agent", "--coordinator", "h:1", "--backend", "sim,nope"])
    with pytest.raises(ConfigError, match="'nope'"):
        commands.config_from_args(args)
    args = parser.parse_args(["agent", "--coordinator", "h:1", "--backend", "sim", "--name", "x", "--spool", "/s"])
    config = commands.config_from_args(args)
    assert config.work_dir == Path("/s/agent-x") and config.backends == ("sim",)
    assert safe_name("../a/b..c") == "a_b.c"
    assert len(safe_name("n" * 253)) == 200 and safe_name("n" * 252 + "a") != safe_name("n" * 252 + "b")
    for bad, message in ((["--coordinator", "nohost"], "must be HOST:PORT"), (["--coordinator", "h:x"], "must be HOST:PORT"),
                         (["--coordinator", "h:1", "--max-backoff", "0"], "--max-backoff must be positive"),
                         (["--coordinator", "h:1", "--upload-limit", "nan"], "--upload-limit must be positive"),
                         (["--coordinator", "h:1", "--name", "a,b"], "--name 'a,b': a node name is 1 to 253 letters"),
                         (["--coordinator", "h:1", "--name", "rack 1/gpu"], "--name 'rack 1/gpu': a node name"),
                         (["--coordinator", "h:1", "--name", ""], "--name '': a node name is 1 to 253")):
        with pytest.raises(ConfigError, match=message):
            commands.config_from_args(parser.parse_args(["agent", "--backend", "sim", *bad]))


def test_cancel_ends_the_window_early_fails_the_node_and_resumes_dcgm(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch):
        servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="s4", backend="fake",
                                                                          duration_s=600)))
        servicer.statuses("s4", pb.NODE_STATE_CAPTURING)
        servicer.commands.put(pb.CoordinatorCommand(cancel=pb.CancelCapture(sweep_id="s4", reason="timed out")))
        seen = servicer.statuses("s4", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].reason == "timed out"
        # The ranks' recording was stopped, not abandoned, and DCGM given back; nothing exported.
        assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "backend.release", "dcgm.resume"]


def test_an_agent_stopped_as_the_window_opens_stops_the_recording_before_dcgm_resumes(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """SIGTERM after the ranks began recording but before the window's wait began: the agent
    left them recording and resumed DCGM on its way out, the two then fighting for the counters."""
    servicer, address = coordinator
    log, agents = Log(), []

    def stopped_meanwhile(request: CaptureRequest) -> None:  # a stop not by a signal (`halt` ends captures first)
        threading.Thread(target=agents[0].session.close).start()
        assert agents[0].stop.wait(WAIT_S)

    agent, thread = start_agent(address, tmp_path, log, monkeypatch, on_start=stopped_meanwhile)
    agents.append(agent)
    servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="s4b", backend="fake", duration_s=600)))
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "dcgm.resume"]


def test_agent_restarted_mid_capture_fails_the_node_and_stops_the_window(coordinator, tmp_path: Path,
                                                                          monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    agent, thread = start_agent(address, tmp_path, log, monkeypatch)
    servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="s5", backend="fake", duration_s=600)))
    servicer.statuses("s5", pb.NODE_STATE_CAPTURING)
    # The agent stops mid-capture, not by a signal (`halt` fails the capture first): the record
    # keeps the window open for the next one.
    agent.stop.set()
    agent.session.close()
    thread.join(10)
    record = json.loads((tmp_path / "work" / "captures" / "s5" / "capture.json").read_text())
    assert record["capture"]["state"] == "capturing" and record["capture"]["window_open"]
    log.calls.clear()
    # Registering takes a while: the restart's failure is settled before there is a session to say it on.
    servicer.register_delay_s = 1.0
    with running_agent(address, tmp_path, log, monkeypatch):
        seen = servicer.statuses("s5", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and "restarted while capturing" in seen[-1].reason
        assert "backend.stop" in log.calls and "backend.start" not in log.calls


def test_an_agent_stopped_by_a_signal_mid_capture_fails_the_node_saying_why_before_it_goes(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """Its captures were left for a restart that may never come (a pod deleted, a job ended),
    the coordinator told nothing: the sweep waited out its timeout for the node."""
    servicer, address = coordinator
    log = Log()
    agent, thread = start_agent(address, tmp_path, log, monkeypatch)
    servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="h1", backend="fake", duration_s=600,
                                                                      timeout_s=900)))
    servicer.statuses("h1", pb.NODE_STATE_CAPTURING)
    agent.halt("agent stopped by SIGTERM")
    seen = servicer.statuses("h1", pb.NODE_STATE_DCGM_RESUMED)
    assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].reason == "agent stopped by SIGTERM while capturing"
    assert seen[-1].dcgm == pb.DCGM_OUTCOME_RESUMED
    thread.join(WAIT_S)
    assert not thread.is_alive()
    # The ranks' recording stopped before DCGM got the counters back, as on a cancel.
    assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "backend.release", "dcgm.resume"]
    record = json.loads((tmp_path / "work" / "captures" / "h1" / "capture.json").read_text())
    assert record["capture"]["state"] == "failed"  # not carried on by a restart


def test_an_agent_stopped_by_a_signal_mid_raw_upload_ends_its_node_on_the_stored_digest(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    servicer.raw_incomplete = True
    agent, thread = start_agent(address, tmp_path, Log(), monkeypatch)
    servicer.commands.put(start("h2", upload_raw=True, timeout_s=900))
    seen = servicer.statuses("h2", pb.NODE_STATE_UPLOADING)
    while not seen[-1].artifacts:  # the digest is stored, the raw exports on their way
        seen = servicer.statuses("h2", pb.NODE_STATE_UPLOADING)
    agent.halt("agent stopped by SIGTERM")
    seen = servicer.statuses("h2", pb.NODE_STATE_DCGM_RESUMED)
    assert [s.state for s in seen] == [pb.NODE_STATE_UPLOADED, pb.NODE_STATE_DCGM_RESUMED]
    assert [a.kind for a in seen[0].artifacts] == [pb.ARTIFACT_KIND_DIGEST]
    assert list(seen[-1].notes) == [f"raw export r{r}.parquet not uploaded: agent stopped by SIGTERM while uploading"
                                    for r in (0, 1)]
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_a_capture_asked_for_as_a_signal_stops_the_agent_fails_without_pausing_dcgm(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    log, gate = Log(), threading.Event()
    agent, thread = start_agent(address, tmp_path, log, monkeypatch, export_gate=gate)
    servicer.commands.put(start("h3", timeout_s=900))
    servicer.statuses("h3", pb.NODE_STATE_EXPORTING)
    agent.halt("agent stopped by SIGTERM")  # its export holds the stop until the gate opens
    servicer.commands.put(start("h4", timeout_s=900))
    seen = servicer.statuses("h4", pb.NODE_STATE_DCGM_RESUMED)
    assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].reason == "agent stopped by SIGTERM while pending"
    gate.set()
    seen = servicer.statuses("h3", pb.NODE_STATE_DCGM_RESUMED)
    assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].reason == "agent stopped by SIGTERM while exporting"
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert log.calls.count("dcgm.pause") == 1


def test_a_capture_asked_for_once_a_signals_stop_closed_the_session_does_not_pause_dcgm(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """The halt's last word: its session half-closed (stop set), the coordinator's commands
    still read until it ends the stream. A StartCapture read then was cancelled, yet paused
    DCGM (the cancel is not acted on once stop is set), and where the halt's wait for its
    captures had used up CLOSE_WAIT_S, close() ended the pause manager first: DCGM stayed
    paused after the agent had gone."""
    servicer, address = coordinator
    log = Log()
    agent, thread = start_agent(address, tmp_path, log, monkeypatch)
    assert agent.registered.wait(WAIT_S)
    with agent._lock:  # as `halt` leaves it for Session.close(linger_s)
        agent.stopping = "agent stopped by SIGTERM"
    agent.stop.set()
    servicer.commands.put(start("h5", timeout_s=900))
    deadline = time.monotonic() + WAIT_S
    while "h5" not in agent.runs and time.monotonic() < deadline:
        time.sleep(0.02)
    agent.runs["h5"].join(WAIT_S)
    assert agent.runs["h5"].capture.state is agent_mod.NodeState.FAILED
    assert agent.runs["h5"].capture.reason == "agent stopped by SIGTERM while pending"
    agent.close()
    thread.join(WAIT_S)
    assert "dcgm.pause" not in log.calls


def test_a_stop_as_a_capture_begins_waits_for_it_without_a_traceback(coordinator, tmp_path: Path,
                                                                    monkeypatch) -> None:
    """A stop's `_end_runs` coming between a capture's thread made and started joined a thread
    not started: RuntimeError, and close() ended there, before it closed the DCGM pauses."""
    servicer, address = coordinator
    agent, thread = start_agent(address, tmp_path, Log(), monkeypatch)
    assert agent.registered.wait(WAIT_S)
    ended: list[BaseException | None] = []
    real = threading.Thread

    def end_runs() -> None:
        try:
            agent._end_runs()
        except BaseException as exc:  # what the stop would have raised
            ended.append(exc)
        else:
            ended.append(None)

    class StoppedAsItStarts(real):
        def start(self) -> None:
            if self.name.startswith("capture-"):
                stop = real(target=end_runs, daemon=True)
                stop.start()
                stop.join(0.5)  # the stop goes as far as it can before this thread starts
            super().start()

    monkeypatch.setattr(agent_mod.threading, "Thread", StoppedAsItStarts)
    servicer.commands.put(start("h7", timeout_s=900))
    deadline = time.monotonic() + WAIT_S
    while not ended and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ended == [None]
    agent.runs["h7"].join(WAIT_S)
    assert agent.runs["h7"].capture.state is agent_mod.NodeState.FAILED
    assert agent.runs["h7"].capture.reason.startswith("agent stopping")
    agent.close()
    thread.join(WAIT_S)
    assert not thread.is_alive()


def test_raw_exports_not_begun_when_a_signal_stops_the_agent_are_not_hashed_nor_sent(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """Past the raw upload the stop cut, each later raw export was read whole for its sha256
    and offered to the coordinator, to be given up at once: nsys exports, GiBs a rank, ate
    the stop's CLOSE_WAIT_S, and with it the node's last word."""
    from rankscope.agent import uploader

    servicer, address = coordinator
    servicer.raw_incomplete = True
    hashed, halted = [], threading.Event()
    real = uploader.sha256_of
    monkeypatch.setattr(uploader, "sha256_of", lambda path: hashed.append((path.name, halted.is_set())) or real(path))
    agent, thread = start_agent(address, tmp_path, Log(), monkeypatch)
    servicer.commands.put(start("h6", upload_raw=True, timeout_s=900))
    seen = servicer.statuses("h6", pb.NODE_STATE_UPLOADING)
    while not seen[-1].artifacts:  # the digest is stored, the first raw export on its way
        seen = servicer.statuses("h6", pb.NODE_STATE_UPLOADING)
    halted.set()
    agent.halt("agent stopped by SIGTERM")
    seen = servicer.statuses("h6", pb.NODE_STATE_DCGM_RESUMED)
    assert list(seen[-1].notes) == [f"raw export r{r}.parquet not uploaded: agent stopped by SIGTERM while uploading"
                                    for r in (0, 1)]
    thread.join(WAIT_S)
    assert ("r1.parquet", True) not in hashed


def test_a_capture_whose_step_outlasts_a_signals_wait_still_ends_its_node_saying_why(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """SIGTERM while the ranks' `nsys start` hung (told to go, a rank records until told to stop,
    so the agent waits for its start, up to minutes): past CLOSE_WAIT_S the halt closed the
    session without a word for the node, and the sweep waited out its timeout (seen with real
    processes: the node CAPTURING, DCGM paused, no reason, 100 s after the agent had gone)."""
    servicer, address = coordinator
    log, hung, release = Log(), threading.Event(), threading.Event()
    monkeypatch.setattr(agent_mod, "CLOSE_WAIT_S", 1.0)

    def hangs(request: CaptureRequest) -> None:
        hung.set()
        release.wait(WAIT_S)

    agent, thread = start_agent(address, tmp_path, log, monkeypatch, on_start=hangs)
    try:
        servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="h7", backend="fake",
                                                                          duration_s=600, timeout_s=900)))
        assert hung.wait(WAIT_S)
        agent.halt("agent stopped by SIGTERM")
        seen = servicer.statuses("h7", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED
        assert seen[-1].reason.startswith("agent stopped by SIGTERM while capturing")
        thread.join(WAIT_S)
        assert not thread.is_alive()
        assert log.calls[-1] == "dcgm.resume"  # on the way out, the step still hung
    finally:
        release.set()


def test_a_signal_that_lands_while_the_main_thread_holds_the_agents_lock_stops_it_all_the_same(tmp_path: Path) -> None:
    """The handler (commands.run: agent.halt) runs on the main thread, between two of its
    steps; halt took the agent's lock, which that thread may hold then (start_capture writes a
    capture's record under it): the handler waited on its own thread for ever, and each later
    SIGTERM with it (seen: `rankscope agent` alive 10 s past timeout's SIGTERM, until SIGKILL)."""
    config = AgentConfig(coordinator="127.0.0.1:1", name="n0", labels={}, spool=tmp_path / "spool",
                         work_dir=tmp_path / "work", backends=("fake",), max_backoff_s=0.5,
                         dcgm=dcgm.DcgmConfig(mode="none", ledger_dir=tmp_path / "dcgm-ledger"))
    agent = Agent(config)
    returned = threading.Event()

    def interrupted() -> None:  # as the signal lands on the thread that holds the lock
        with agent._lock:
            agent.halt("agent stopped by SIGTERM")
            returned.set()

    threading.Thread(target=interrupted, daemon=True).start()
    assert returned.wait(5), "halt waited on a lock its own thread held"
    deadline = time.monotonic() + WAIT_S
    while not agent.stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert agent.stopping == "agent stopped by SIGTERM" and agent.stop.is_set()  # the session closed
    agent.close()


def test_another_agent_taking_over_the_node_stops_this_one_with_one_line(coordinator, tmp_path: Path, capsys) -> None:
    servicer, address = coordinator
    servicer.session_refusal = (grpc.StatusCode.ALREADY_EXISTS,
                                "node n0: a newer agent session from ipv4:10.0.0.9:4242 took over; give each agent its own --name")
    code = main(["agent", "--coordinator", address, "--name", "n0", "--spool", str(tmp_path / "spool"),
                 "--work-dir", str(tmp_path / "work"), "--backend", "sim", "--dcgm", "none", "--max-backoff", "0.5"])
    assert code == 2  # not retried: reconnecting would take the node back, and so on without end
    assert capsys.readouterr().err.splitlines()[-1] == (
        "rankscope: error: coordinator: node n0: a newer agent session from ipv4:10.0.0.9:4242 took over; "
        "give each agent its own --name")
    assert len(servicer.registered) == 1


def test_a_second_agent_on_a_work_dir_in_use_stops_before_touching_it(coordinator, tmp_path: Path, monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch) as (agent, thread):
        assert agent.registered.wait(WAIT_S)
        second = Agent(agent.config)
        with pytest.raises(FolderInUse, match=f"work: in use by agent pid {os.getpid()} on .*; one agent per folder$"):
            second.run()
        assert len(servicer.registered) == 1 and log.calls == []  # never registered, no DCGM call
        servicer.commands.put(start("s9"))  # the first still owns its captures
        assert servicer.statuses("s9", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED


def test_the_agent_command_on_a_work_dir_in_use_prints_only_why_it_stops(tmp_path: Path, capsys) -> None:
    # found by review: it printed its banner ("rankscope agent n0 (pid ...) -> ...") first, as
    # if it ran, and only then the error
    hold = FolderLock(tmp_path / "work", "agent").acquire()
    try:
        assert main(["agent", "--coordinator", "127.0.0.1:1", "--name", "n0", "--spool", str(tmp_path / "spool"),
                     "--work-dir", str(tmp_path / "work"), "--dcgm", "none"]) == 2
    finally:
        hold.release()
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        f"rankscope: error: {tmp_path / 'work'}: in use by agent pid {os.getpid()} on {socket.gethostname()}; "
        "one agent per folder"]


@pytest.mark.parametrize("option, said", [
    ("--work-dir", "not a folder"),
    ("--dcgm-state", "cannot use the DCGM pause ledger (not a folder); pass --dcgm-state DIR"),
])
def test_an_agent_given_a_file_for_a_folder_makes_no_folder(option: str, said: str, tmp_path: Path, capsys) -> None:
    # `--work-dir afile` said so in one line, exit 2, but after making the spool; a file for
    # the DCGM pause ledger was found only once the agent ran: its banner printed, the spool and
    # the work dir made. A dcgmi on PATH (never run here) is what gives the agent a ledger.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dcgmi").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "dcgmi").chmod(0o755)
    (tmp_path / "afile").write_text("")
    before = sorted(tmp_path.rglob("*"))
    folders = {"--work-dir": str(tmp_path / "work"), "--dcgm-state": str(tmp_path / "dcgm"), option: str(tmp_path / "afile")}
    assert main(["agent", "--coordinator", "127.0.0.1:1", "--name", "n0", "--spool", str(tmp_path / "spool"),
                 *(word for pair in folders.items() for word in pair), "--dcgm", "dcgmi",
                 "--dcgmi", str(tmp_path / "bin" / "dcgmi")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [f"rankscope: error: {tmp_path / 'afile'}: {said}"]
    assert sorted(tmp_path.rglob("*")) == before


def test_stopping_the_agent_logs_no_warning_about_its_own_cancelled_session(coordinator, tmp_path: Path,
                                                                           monkeypatch, caplog) -> None:
    agent, thread = start_agent(coordinator[1], tmp_path, Log(), monkeypatch)
    assert agent.registered.wait(WAIT_S)
    agent.close()
    thread.join(10)
    assert not thread.is_alive()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []


def test_a_session_refused_after_registering_backs_off_and_warns_once(coordinator, tmp_path: Path, monkeypatch,
                                                                     caplog) -> None:
    # A coordinator at its session limit registers the agent, then refuses the session:
    # registering must not count as the end of the outage.
    servicer, address = coordinator
    servicer.session_refusal = (grpc.StatusCode.RESOURCE_EXHAUSTED, "coordinator at its limit of 2 agent sessions")
    with running_agent(address, tmp_path, Log(), monkeypatch):
        deadline = time.monotonic() + WAIT_S
        while len(servicer.registered) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(servicer.registered) >= 4
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["coordinator session: RESOURCE_EXHAUSTED: coordinator at its limit of 2 agent sessions"]


def test_a_capture_past_its_sweeps_deadline_is_given_up_without_the_coordinators_cancel(coordinator, tmp_path: Path,
                                                                                        monkeypatch) -> None:
    """The coordinator cancels at the deadline; an agent that cannot hear it (its link down)
    must not capture and upload on for ever, holding the node and its DCGM pause."""
    monkeypatch.setattr(agent_mod, "DEADLINE_GRACE_S", 0.5)
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch):
        servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="s9", backend="fake",
                                                                          duration_s=600, timeout_s=1.0)))
        seen = servicer.statuses("s9", pb.NODE_STATE_DCGM_RESUMED)  # no cancel is ever sent
        assert seen[-1].state == pb.NODE_STATE_FAILED
        assert seen[-1].reason == "the sweep's 1s timeout passed with no word from the coordinator"
        assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "backend.release", "dcgm.resume"]


def test_the_node_reports_exporting_while_the_backend_exports_with_dcgm_already_back(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """nsys exports of 8 large reports take minutes: the node must say it exports (not that it
    still captures), with telemetry already resumed, and tell the coordinator its bound on it."""
    servicer, address = coordinator
    log, gate = Log(), threading.Event()
    with running_agent(address, tmp_path, log, monkeypatch, export_gate=gate) as (agent, thread):
        servicer.commands.put(start("e1"))
        seen = servicer.statuses("e1", pb.NODE_STATE_EXPORTING)
        assert seen[-1].state == pb.NODE_STATE_EXPORTING and seen[-1].export_timeout_s == 42.0
        assert seen[-2].state == pb.NODE_STATE_CAPTURING and seen[-2].export_timeout_s == 0
        while "backend.export" not in log.calls:  # the export runs now, held by the gate
            assert thread.is_alive()
            time.sleep(0.05)
        assert log.calls == ["dcgm.pause", "backend.start", "backend.stop", "backend.release", "dcgm.resume",
                             "backend.export"]
        gate.set()
        assert servicer.statuses("e1", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED


def test_a_cancel_reaches_the_running_export_and_fails_the_node_at_once(coordinator, tmp_path: Path,
                                                                         monkeypatch) -> None:
    servicer, address = coordinator
    log = Log()
    with running_agent(address, tmp_path, log, monkeypatch, export_until_cancelled=True) as (agent, thread):
        servicer.commands.put(start("e3"))
        servicer.statuses("e3", pb.NODE_STATE_EXPORTING)
        while "backend.export" not in log.calls:
            assert thread.is_alive()
            time.sleep(0.05)
        servicer.commands.put(pb.CoordinatorCommand(cancel=pb.CancelCapture(sweep_id="e3", reason="stopped by user")))
        seen = servicer.statuses("e3", pb.NODE_STATE_FAILED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].reason == "stopped by user"


def test_export_time_is_not_counted_against_the_sweeps_timeout_by_the_agent(coordinator, tmp_path: Path,
                                                                            monkeypatch) -> None:
    """An export still running when the deadline passes is not given up: it has its own bound
    (as at the coordinator), and the deadline moves back by the time it took."""
    monkeypatch.setattr(agent_mod, "DEADLINE_GRACE_S", 0.0)
    servicer, address = coordinator
    log, gate = Log(), threading.Event()
    with running_agent(address, tmp_path, log, monkeypatch, export_gate=gate):
        servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="e2", backend="fake",
                                                                          duration_s=0.05, timeout_s=4.0)))
        servicer.statuses("e2", pb.NODE_STATE_EXPORTING)
        record_path = tmp_path / "work" / "captures" / "e2" / "capture.json"
        deadline = json.loads(record_path.read_text())["deadline"]
        while time.time() < deadline + 1.0:  # the deadline passes while the export runs (and the
            # few seconds before it were enough: after it, the upload has the rest of the timeout)
            time.sleep(0.05)
        gate.set()
        seen = servicer.statuses("e2", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_DCGM_RESUMED, seen[-1].reason
        assert json.loads(record_path.read_text())["deadline"] >= deadline + 1.0


def test_the_dcgm_lease_runs_from_when_the_window_opens(coordinator, tmp_path: Path, monkeypatch) -> None:
    """A slow start (8 ranks of `nsys start`) must not eat the window's share of the lease:
    renewed when the window opens, it outlives a start that took longer than the margin."""
    monkeypatch.setattr(agent_mod, "LEASE_MARGIN_S", 2.0)
    servicer, address = coordinator
    log, held = Log(), {}

    def slow_start(request: CaptureRequest) -> None:  # done as the lease from the pause nears its end
        (expiry,) = [until for cid, until in held["agent"].pauses._leases.items() if cid == request.sweep_id]
        while time.time() < expiry - 1.0:  # unrenewed, the lease would end 1 s into the 3 s window
            time.sleep(0.05)

    with running_agent(address, tmp_path, log, monkeypatch, on_start=slow_start) as (agent, thread):
        held["agent"] = agent
        servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="l1", backend="fake",
                                                                          duration_s=3.0)))
        servicer.statuses("l1", pb.NODE_STATE_CAPTURING)
        while "backend.stop" not in log.calls:
            assert thread.is_alive()
            time.sleep(0.05)
        assert servicer.statuses("l1", pb.NODE_STATE_DCGM_RESUMED)[-1].state == pb.NODE_STATE_DCGM_RESUMED
        # renewed from the window's opening; the pause's own lease would have run out mid-window
        assert log.calls[:4] == ["dcgm.pause", "backend.start", "backend.stop", "backend.release"]
        assert log.calls.count("dcgm.resume") == 1


def test_a_start_that_outlasts_the_dcgm_lease_fails_the_capture(coordinator, tmp_path: Path, monkeypatch) -> None:
    """A wedged start past the lease: DCGM was resumed by the lease's expiry (never left dark),
    so the window must not run on against DCGM: the node fails, its ranks stopped."""
    monkeypatch.setattr(agent_mod, "LEASE_MARGIN_S", 0.2)
    servicer, address = coordinator
    log, held = Log(), {}

    def wedged_start(request: CaptureRequest) -> None:  # answers only after the lease expired
        while request.sweep_id in held["agent"].pauses.holders():
            time.sleep(0.05)

    with running_agent(address, tmp_path, log, monkeypatch, on_start=wedged_start) as (agent, thread):
        held["agent"] = agent
        servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="l2", backend="fake",
                                                                          duration_s=0.05)))
        seen = servicer.statuses("l2", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED
        assert seen[-1].reason.startswith("starting the ranks' recording outlasted the DCGM pause's 0.25s lease")
        assert log.calls == ["dcgm.pause", "backend.start", "dcgm.resume", "backend.stop", "backend.release"]


def test_a_capture_record_that_cannot_be_saved_does_not_leave_dcgm_paused(coordinator, tmp_path: Path,
                                                                            monkeypatch, caplog) -> None:
    """The disk filling up mid-capture: saving the capture's record fails from the pause on.
    The capture goes on from memory to its end, DCGM resumed, the failure logged once;
    before, the capture thread died on the error, the node stuck with DCGM paused."""
    servicer, address = coordinator
    log = Log()
    real_write = atomic.write_text

    def write_text(path, text, *args, **kw):
        if Path(path).name == "capture.json" and "dcgm.pause" in log.calls:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_write(path, text, *args, **kw)

    monkeypatch.setattr(atomic, "write_text", write_text)
    with running_agent(address, tmp_path, log, monkeypatch):
        servicer.commands.put(start("s9"))
        seen = servicer.statuses("s9", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_DCGM_RESUMED and seen[-1].dcgm == pb.DCGM_OUTCOME_RESUMED
        assert log.calls[-1] == "export" and "dcgm.resume" in log.calls
        assert sum("its record was not saved" in r.getMessage() for r in caplog.records) == 1


def _ledger_full_from(monkeypatch, log: Log, call: str) -> None:
    """The host's pause ledger unwritable (a full disk) from ``call`` until DCGM's resume
    frees some space."""
    real_write = pause_ledger.PauseLedger.write

    def write(self, *args) -> None:
        if call in log.calls and "dcgm.resume" not in log.calls:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, *args)

    monkeypatch.setattr(pause_ledger.PauseLedger, "write", write)


@pytest.mark.parametrize("full_from, reason, calls", [
    # once DCGM is paused: the node failed with DCGM left paused until the lease ran out;
    # nothing may be recorded under a pause it could not keep
    ("dcgm.pause", "DCGM paused, then resumed at once: the pause ledger {ledger} cannot be written "
     "(No space left on device)", ["dcgm.pause", "dcgm.resume"]),
    # renewed as the window opens: the lease renewed here but not on record, where the
    # host's other agents read it
    ("backend.start", "DCGM's pause could not be renewed: the pause ledger {ledger} cannot be written "
     "(No space left on device)", ["dcgm.pause", "backend.start", "backend.stop", "backend.release", "dcgm.resume"]),
], ids=["pause", "renewal"])
def test_a_pause_ledger_that_cannot_be_written_fails_the_node_with_dcgm_resumed(
        coordinator, tmp_path: Path, monkeypatch, caplog, full_from: str, reason: str, calls: list[str]) -> None:
    """The host's pause ledger unwritable (a full disk): the OSError came out as a traceback."""
    servicer, address = coordinator
    log = Log()
    _ledger_full_from(monkeypatch, log, full_from)
    with running_agent(address, tmp_path, log, monkeypatch):
        servicer.commands.put(start("s1"))
        seen = servicer.statuses("s1", pb.NODE_STATE_DCGM_RESUMED)
        assert seen[-1].state == pb.NODE_STATE_FAILED and seen[-1].dcgm == pb.DCGM_OUTCOME_RESUMED
        assert seen[-1].reason == reason.format(ledger=tmp_path / "dcgm-ledger")
        assert log.calls == calls
        assert not [r for r in caplog.records if r.exc_info]


def test_an_agent_stopped_mid_export_keeps_the_export_clock_for_its_restart(
        coordinator, tmp_path: Path, monkeypatch) -> None:
    """Stopping the agent sets the run's cancel, which now kills its exports: the export's
    `finally` must not close the export clock (`_export_began`: "kept across a restart"), or
    the restart's downtime counts against the agent's deadline while the coordinator's clock,
    started at the first EXPORTING, runs on."""
    servicer, address = coordinator
    log = Log()
    agent, thread = start_agent(address, tmp_path, log, monkeypatch, export_until_cancelled=True)
    servicer.commands.put(pb.CoordinatorCommand(start=pb.StartCapture(sweep_id="e9", backend="fake",
                                                                      duration_s=0.05, timeout_s=600.0)))
    servicer.statuses("e9", pb.NODE_STATE_EXPORTING)
    record_path = tmp_path / "work" / "captures" / "e9" / "capture.json"
    while "backend.export" not in log.calls:
        assert thread.is_alive()
        time.sleep(0.05)
    before = json.loads(record_path.read_text())
    agent.close()
    thread.join(10)
    after = json.loads(record_path.read_text())
    assert after["capture"]["state"] == "exporting"  # a restart carries on exporting
    assert after.get("exporting_since") == before["exporting_since"]
    assert after["deadline"] == before["deadline"]


def _wire_name(outcome: int) -> str:
    return pb.DcgmOutcome.Name(outcome).removeprefix("DCGM_OUTCOME_").lower()


def test_progress_lines_name_dcgm_outcomes_as_the_node_record_does() -> None:
    # The CAPTURING line shows the pause's outcome (DcgmOutcome values, capture.NOT_NEEDED);
    # the DCGM_RESUMED line and the report show the wire's name: one word for one outcome.
    from rankscope.agent import capture

    assert {outcome.value: _wire_name(wire) for outcome, wire in agent_mod.DCGM_OUTCOMES.items()} == {
        name: name for name in ("not_present", "not_supported", "paused", "resumed")}
    assert capture.NOT_NEEDED == _wire_name(pb.DCGM_OUTCOME_NOT_NEEDED)
