"""The node agent: runs each capture the coordinator asks for, from DCGM pause to upload.

The lifecycle itself is the pure machine in ``capture.py``; this module is the shell
that executes its instructions (DCGM through ``dcgm.PauseManager``, the capture
through a backend, digests at the edge, uploads) and feeds the results back as
events. Every capture's machine and request live in ``<work-dir>/captures/<sweep>/``
(written atomically after each step), so an agent killed mid-upload picks the upload
up again from the coordinator's committed offset when it starts.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import queue
import re
import shutil
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rankscope import __version__, atomic, output, states, tls
from rankscope.agent import capture as cap
from rankscope.agent import dcgm as dcgm_mod
from rankscope.agent import window
from rankscope.agent.backend import CaptureBackend, CaptureRequest
from rankscope.agent.session import CHANNEL_OPTIONS, REGISTER_TIMEOUT_S, Registration, Session
from rankscope.agent.spool import local_ranks
from rankscope.agent.uploader import Artifact, Uploader
from rankscope.analysis import digest as digest_mod
from rankscope.errors import ConfigError, ExportError, RankscopeError, TransportError, shown
from rankscope.lock import FolderLock
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.states import NodeState

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

# Backends by name, imported only when used (nsys and torch need tools this node may lack).
BACKENDS = {
    "sim": "rankscope.agent.sim_backend",
    "nsys": "rankscope.agent.nsys",
    "torch": "rankscope.agent.torch_backend",
}
DCGM_OUTCOMES = {
    dcgm_mod.DcgmOutcome.NOT_PRESENT: pb.DCGM_OUTCOME_NOT_PRESENT,
    dcgm_mod.DcgmOutcome.NOT_SUPPORTED: pb.DCGM_OUTCOME_NOT_SUPPORTED,
    dcgm_mod.DcgmOutcome.PAUSED: pb.DCGM_OUTCOME_PAUSED,
    dcgm_mod.DcgmOutcome.RESUMED: pb.DCGM_OUTCOME_RESUMED,
}
# A node clock this far from the coordinator's is named when the agent registers (NTP keeps
# nodes within milliseconds).
CLOCK_WARN_NS = 1_000_000_000
RECORD_KEEP_S = 7 * 86400.0  # a finished capture's record answers a repeated StartCapture this long
# Past its sweep's deadline the coordinator cancels a capture; an agent that cannot hear it
# (its link down) gives the capture up itself this much later.
DEADLINE_GRACE_S = 30.0
LEASE_MARGIN_S = 120.0  # beyond the window: stop and release may take a while on a busy node
# At exit, how long captures get to stop their ranks' recording before DCGM is resumed all
# the same. Their nsys commands and uploads run in their own threads: this bounds them all.
CLOSE_WAIT_S = 60.0
# Stopped by a signal, how long the captures' last statuses get to reach the coordinator once
# they have ended (it ends the session when it has read them).
LAST_WORD_S = 5.0
# The longest the agent takes to end on SIGTERM, for its supervisors to allow (deploy/, checked
# by tests/test_deploy.py). Worst case, DCGM answering nothing: the main thread first ends a
# Register call or, just started, recover()'s resume series (stopped as it waited for windows a
# previous process left recording, that series comes in close(), once they stop, in place of the
# lock holder's, which no lease then re-asserts); the captures get CLOSE_WAIT_S, then
# LAST_WORD_S to say how they ended; then close() waits for the pause lock's holder (the lease
# timer re-asserting, then its resume series or a capture's) and makes its own series. One capture
# at a time holds a pause (the coordinator's busy rule); other agents of the host holding the
# ledger meanwhile are not counted.
STOP_BUDGET_S = (max(REGISTER_TIMEOUT_S, dcgm_mod.RESUME_WORST_S) + CLOSE_WAIT_S + LAST_WORD_S
                 + dcgm_mod.DCGM_TIMEOUT_S + 2 * dcgm_mod.RESUME_WORST_S)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# The longest window or timeout a StartCapture may carry: a wait past threading.TIMEOUT_MAX
# overflows; half of it leaves room for the margins added (lease, deadline grace).
MAX_WIRE_S = threading.TIMEOUT_MAX / 2


@dataclass(frozen=True)
class AgentConfig:
    coordinator: str
    name: str = field(default_factory=socket.gethostname)
    labels: Mapping[str, str] = field(default_factory=dict)
    spool: Path = Path("/tmp/rankscope-spool")
    work_dir: Path = Path("/tmp/rankscope-agent")
    backends: tuple[str, ...] = ("nsys",)  # offered to the coordinator; the first is the default
    dcgm: dcgm_mod.DcgmConfig = field(default_factory=dcgm_mod.DcgmConfig)
    upload_limit_bps: float | None = None
    max_backoff_s: float = 30.0
    tls: tls.TlsFiles | None = None  # None: plaintext


def load_backend(name: str) -> type[CaptureBackend]:
    """The CaptureBackend subclass registered under ``name``, imported on first use."""
    module_name = BACKENDS.get(name)
    if module_name is None:
        raise ConfigError(f"unknown capture backend {name!r} (known: {', '.join(sorted(BACKENDS))})")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"capture backend {name!r} is not available here ({exc})") from None
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, CaptureBackend) and getattr(value, "name", None) == name:
            return value
    raise ConfigError(f"{module_name} defines no capture backend named {name!r}")


def backend_options(backends: Iterable[str]) -> list[pb.BackendOptions]:
    """The capture options each of ``backends`` reads, for the coordinator to refuse a sweep's
    others before it starts. One that cannot load here says nothing: its captures fail on the
    node, saying why."""
    said = []
    for name in backends:
        try:
            options = load_backend(name).options
        except ConfigError:
            continue
        said.append(pb.BackendOptions(backend=name, options=sorted(options)))
    return said


def node_gpus() -> list[pb.Gpu]:
    """GPUs through NVML where pynvml is importable and a driver answers; none otherwise."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
            gpus.append(pb.Gpu(uuid=_text(uuid), name=_text(name), index=index))
        return gpus
    except pynvml.NVMLError as exc:
        log.warning("NVML: %s", exc)
        return []
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def safe_name(text: str) -> str:
    """A file name the coordinator accepts: no "/", no "..", no leading dot; short enough
    for a suffix (a node name may run to 253 characters)."""
    return output.bounded(re.sub(r"\.{2,}", ".", _UNSAFE.sub("_", text)).strip("._") or "x")


def _unrunnable(start: pb.StartCapture) -> str:
    """Why a StartCapture's window or timeout cannot be run as sent ("" where they can): both
    are waited on and the window leases DCGM's pause, where a NaN lease never expires, an inf
    wait overflows and a negative window is none. 0 is the wire's "no timeout"."""
    if not (math.isfinite(start.duration_s) and 0 < start.duration_s <= MAX_WIRE_S):
        return f"StartCapture's capture window of {start.duration_s:g}s is not a positive number of seconds to wait"
    if not (math.isfinite(start.timeout_s) and 0 <= start.timeout_s <= MAX_WIRE_S):
        return f"StartCapture's timeout of {start.timeout_s:g}s is not a number of seconds to wait (0: none)"
    return ""


def _raw(outputs: tuple[str, ...], exports: list[Path]) -> tuple[str, ...]:
    """What --upload-raw sends: the exports, and the profiler's own files beside them where
    they are others (nsys: the .nsys-rep reports, which the Nsight Systems GUI opens; an
    export that failed leaves its report all the same)."""
    exported = tuple(map(str, exports))
    return exported + tuple(p for p in outputs if p not in exported and Path(p).is_file())


class Agent:
    """One node's agent: a session to the coordinator and the captures it asks for."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.stop = threading.Event()
        self.channel = tls.channel(config.coordinator, config.tls, CHANNEL_OPTIONS)
        self.session = Session(self.channel, self.register_request, self.on_command, self.on_connect,
                               max_backoff_s=config.max_backoff_s, stop=self.stop,
                               explain=lambda: tls.refusal(config.coordinator, config.tls, "this agent"),
                               beat=self.heartbeat)
        self.hold = FolderLock(config.work_dir, "agent")
        self.pauses = dcgm_mod.PauseManager(dcgm_mod.discover(config.dcgm), config.dcgm.ledger_dir,
                                             who=f"agent {config.name}")
        self.runs: dict[str, CaptureRun] = {}
        self.registered = threading.Event()
        self.stopping = ""  # why a signal stops the agent (`halt`): its captures in flight end with it
        self._runs_end_by: float | None = None  # when the captures' wait at a stop ends (`_end_runs`)
        self._recover_at_close = False  # a stop came as `run` waited for windows left recording
        self._lock = threading.Lock()
        # What `halt` is told, for a thread of its own: put() takes no lock a signal may have cut into.
        self._halts: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        threading.Thread(target=self._halt, name="halt", daemon=True).start()

    # lifecycle ----------------------------------------------------------------------

    def run(self) -> None:
        """Reconcile what a previous process left, then serve until stopped."""
        try:
            self.hold.acquire()  # before reading what only one agent may carry on
            recording = []
            for run in CaptureRun.load_all(self):
                with self._lock:  # listed and begun at once, as `start_capture` does
                    self.runs[run.sweep_id] = run
                    if not run.capture.done:
                        if run.capture.window_open and run.capture.owes_resume:  # sampling the counters
                            recording.append(run)
                        run.begin(restarted=True)  # a window left open is stopped first
            # As in close(): DCGM gets the counters back once the windows the previous process
            # left recording are stopped; resumed sooner, the two fight over them (dcgm.md §7).
            # A stop meanwhile (a halt too) ends the wait: close() gives them CLOSE_WAIT_S, as its
            # budget says; counted twice, the stop would outlast STOP_BUDGET_S. The recovery then
            # waits for that too (close() runs it): run here, it resumed DCGM under those windows.
            deadline = time.monotonic() + CLOSE_WAIT_S
            while recording and not self._stopping_or_stopped() and time.monotonic() < deadline:
                recording = [run for run in recording if not run.window_shut.wait(0.1)]
            self._recover_at_close = bool(recording) and self._stopping_or_stopped()
            if not self._recover_at_close:
                self._recover()
            self.session.run()  # a halt's last word, the restarted captures' failures with it, goes out here
        finally:
            self.close()

    def _stopping_or_stopped(self) -> bool:
        return self.stop.is_set() or bool(self.stopping)

    def halt(self, why: str) -> None:
        """Stop for ``why``, a signal: a pod deleted, a job ended, a service stopped, where no
        restart may come to carry the captures on while their sweeps wait out their timeouts.
        Each capture in flight ends first, as a cancel ends it (the ranks' recording stopped,
        then DCGM resumed), and says so on the session, still open; then the session closes and
        `run` returns through `close`. Returns at once, and takes no lock: a signal handler
        calls it, on the main thread, which may hold the agent's lock as the signal lands."""
        if not self.stopping:  # the first signal's reason stands
            self.stopping = why  # set at once: a StartCapture from now on ends unbegun (`start_capture`)
        self._halts.put(why)  # SimpleQueue.put is reentrant: safe in a signal handler

    def _halt(self) -> None:
        """The first `halt`'s work, on its own thread (None from `close`: no halt came)."""
        if self._halts.get() is None:
            return
        self._end_runs()
        for run in list(self.runs.values()):
            run.outlasted_stop()
        self.session.close(linger_s=LAST_WORD_S)

    def _recover(self) -> None:
        left = self.pauses.recover()
        if left is not None:
            error = f" ({self.pauses.error})" if self.pauses.error else ""
            log.warning("a DCGM pause left by a previous agent: %s%s", left.value, error)

    def close(self) -> None:
        self._halts.put(None)  # no halt to wait for any more (one under way goes on)
        self.stop.set()
        self.session.close()
        self._end_runs()
        if self._recover_at_close:  # stopped while windows a previous process left still recorded
            self._recover_at_close = False
            self._recover()
        self.pauses.close()
        self.channel.close()
        self.hold.release()

    def _end_runs(self) -> None:
        """Cancel the captures in flight and wait for them, CLOSE_WAIT_S at most from the first
        call (a halt's, then close()'s): DCGM gets the counters back only once the ranks'
        recording has stopped (nsys stop writes its report first, seconds on end): resumed
        sooner, the two fight over them."""
        with self._lock:
            if self._runs_end_by is None:
                self._runs_end_by = time.monotonic() + CLOSE_WAIT_S
            runs = list(self.runs.values())
        for run in runs:
            if not run.cancelled.is_set():  # a cancel's reason stands
                run.cancel(self._why_ended(run))
        for run in runs:
            run.join(max(0.0, self._runs_end_by - time.monotonic()))

    def _why_ended(self, run: CaptureRun) -> str:
        return f"{self.stopping} while {run.capture.state.value}" if self.stopping else "agent stopping"

    # coordinator ---------------------------------------------------------------------

    def announced(self) -> list[pb.LocalRank]:
        """The ranks announced in the spool now."""
        return [pb.LocalRank(rank=r.rank, local_rank=r.local_rank, pid=r.pid, gpu=r.gpu, backend=r.backend,
                             world_size=r.world_size, job_id=r.job_id) for r in local_ranks(self.config.spool)]

    def heartbeat(self) -> pb.Heartbeat:
        """A heartbeat with the ranks announced now (`rankscope nodes` shows them): a job's ranks
        come and go after the agent registered."""
        return pb.Heartbeat(agent_time_ns=time.time_ns(), ranks=pb.LocalRanks(ranks=self.announced()))

    def register_request(self) -> pb.RegisterRequest:
        return pb.RegisterRequest(
            node=self.config.name, hostname=socket.gethostname(), labels=dict(self.config.labels),
            gpus=node_gpus(), ranks=self.announced(), versions=pb.Versions(rankscope=__version__),
            backends=list(self.config.backends), backend_options=backend_options(self.config.backends),
            agent_time_ns=time.time_ns(),
        )

    def on_connect(self, registration: Registration) -> None:
        """Re-report captures in flight, and those whose last news found no session (a capture
        that a restart failed before the coordinator was reached): the coordinator may have
        missed them. Others that are finished are re-reported when their StartCapture comes again."""
        self.registered.set()
        if abs(registration.clock_offset_ns) > max(CLOCK_WARN_NS, registration.round_trip_ns):  # as `local_ns` moves
            log.warning("this node's clock is %.1f s %s the coordinator's (is NTP running?): sweeps' start times are "
                        "moved onto it", abs(registration.clock_offset_ns) / 1e9,
                        "behind" if registration.clock_offset_ns > 0 else "ahead of")
        for run in list(self.runs.values()):
            if not run.capture.done or run.unsent:
                run.report_latest()

    def on_command(self, command: pb.CoordinatorCommand) -> None:
        if command.HasField("start"):
            self.start_capture(command.start)
        elif command.HasField("cancel"):
            run = self.runs.get(command.cancel.sweep_id)
            if run is not None:
                run.cancel(command.cancel.reason or "cancelled by the coordinator")

    def start_capture(self, start: pb.StartCapture) -> None:
        with self._lock:
            run = self.runs.get(start.sweep_id)
            if run is not None:  # StartCapture is idempotent: say where we are instead
                run.report_latest()
                return
            run = CaptureRun.new(self, start)
            self.runs[start.sweep_id] = run
            if self.stopping:  # come as a signal stops the agent: it ends before it pauses DCGM, saying why
                run.cancel(self._why_ended(run))
            # Under the lock: a stop's `_end_runs` lists the runs under it, and joined one whose
            # thread was made but not yet started ("cannot join thread before it is started"),
            # which ended close() before it closed the DCGM pauses.
            run.begin()

    def local_ns(self, start: pb.StartCapture) -> int:
        """The sweep's start (on the coordinator's clock) on this node's; 0, none, stays 0. By
        the coordinator's estimate of this node's clock that the command carries (its latest
        pings'), else by the registration's round trip (a node's clock may have been stepped
        since: NTP at boot), where the offset passes its round trip: within it, a request
        queued at the coordinator may be all it measured, and NTP keeps clocks closer. Taken
        as it is, a node whose clock is off began its window that far from the other nodes'."""
        registration = self.session.registration
        if start.HasField("node_clock"):
            offset, round_trip = start.node_clock.offset_ns, start.node_clock.rtt_ns
        elif registration is not None:
            offset, round_trip = -registration.clock_offset_ns, registration.round_trip_ns
        else:
            return start.start_at_ns
        return start.start_at_ns + offset if start.start_at_ns and abs(offset) > round_trip else start.start_at_ns

    def send_status(self, status: pb.NodeStatus) -> bool:
        """Queue a status on the session; False while there is none."""
        return self.session.send(pb.AgentEvent(status=status))

    def uploader(self, run: CaptureRun) -> Uploader:
        """An uploader for one capture, once registered (uploads carry the session token)."""
        while not self.registered.wait(0.5):
            if run.cancelled.is_set():
                raise TransportError(f"sweep {run.sweep_id}: cancelled before the coordinator was reached")
        reg = self.session.registration
        return Uploader(
            self.channel,
            session_token=lambda: self.session.registration.session_token,
            chunk_bytes=reg.chunk_bytes or 1 << 20,
            max_bytes=reg.max_upload_bytes,
            rate_limit_bps=self.config.upload_limit_bps,
            stop=run.cancelled,
            on_progress=run.note_upload,
            max_attempts=1000,  # bounded by the sweep's timeout and cancel, not a count
        )


class CaptureRun:
    """Executes one capture's machine on this node, persisting it after every step."""

    def __init__(self, agent: Agent, record: dict) -> None:
        self.agent = agent
        self.record = record
        self.sweep_id: str = record["sweep_id"]
        self.capture = cap.Capture.from_dict(record["capture"])
        self.folder = agent.config.work_dir / "captures" / safe_name(self.sweep_id)
        self.cancelled = threading.Event()
        self.window_shut = threading.Event()  # its ranks no longer record: the window stopped, or never will
        self.cancel_reason = ""
        self.backend: CaptureBackend | None = None
        self._request: CaptureRequest | None = None
        self._thread: threading.Thread | None = None
        self._deadline_timer: threading.Timer | None = None
        self._status_lock = threading.Lock()
        self.unsent = False  # the latest status found no session: on_connect reports it
        self._said_end = False  # its last status (FAILED, DCGM_RESUMED) was sent, or tried
        self._persist_lock = threading.Lock()
        self._unsaved = False  # the last save failed (logged once until one succeeds)

    @classmethod
    def new(cls, agent: Agent, start: pb.StartCapture) -> CaptureRun:
        options = dict(start.options)
        requested = sorted(options)  # the sweep's own; the node's name and labels join them below
        refused = _unrunnable(start)
        options.setdefault("node", agent.config.name)
        for key, value in agent.config.labels.items():  # node-specific settings, e.g. sim.node_index
            options.setdefault(key, value)
        record = {
            "sweep_id": start.sweep_id,
            "backend": start.backend or agent.config.backends[0],
            "duration_s": start.duration_s,
            "start_at_ns": agent.local_ns(start),  # this node's clock: the window waits on it
            "timeout_s": start.timeout_s,
            # wall clock: survives restarts
            "deadline": time.time() + start.timeout_s if start.timeout_s > 0 and not refused else None,
            "refused": refused,  # the node fails with it before anything runs
            "options": options,
            "requested_options": requested,
            "upload_raw": start.upload_raw,
            "capture": cap.Capture(start.sweep_id).to_dict(),
            "dcgm": pb.DCGM_OUTCOME_UNSPECIFIED,
            "dcgm_detail": "",
            "uploaded": [],
            "uploads": {},
            "notes": [],  # what the capture went on without (CaptureBackend.note)
        }
        run = cls(agent, record)
        run.persist()
        return run

    @classmethod
    def load_all(cls, agent: Agent) -> list[CaptureRun]:
        """Captures a previous agent process left; records of long-finished ones are dropped."""
        runs = []
        expired = time.time() - RECORD_KEEP_S
        for path in sorted((agent.config.work_dir / "captures").glob("*/capture.json")):
            try:
                run = cls(agent, json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("%s: unreadable capture record, ignored (%s)", shown(path), exc)
                continue
            if run.capture.done and path.stat().st_mtime < expired:
                shutil.rmtree(path.parent, ignore_errors=True)
                continue
            runs.append(run)
        return runs

    # driving --------------------------------------------------------------------------

    def begin(self, *, restarted: bool = False) -> None:
        self._thread = threading.Thread(target=self._run, args=(restarted,), name=f"capture-{self.sweep_id}",
                                        daemon=True)
        self._thread.start()
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        deadline = self.record.get("deadline")
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        if deadline is not None and not self.capture.done:
            self._deadline_timer = threading.Timer(max(0.0, deadline + DEADLINE_GRACE_S - time.time()),
                                                   self._past_deadline)
            self._deadline_timer.daemon = True
            self._deadline_timer.start()

    def _past_deadline(self) -> None:
        # Export time does not count (as at the coordinator): the timer is armed again, the
        # deadline pushed back by it, when the export ends (the backend bounds the export itself).
        if not self.capture.done and self.capture.state is not NodeState.EXPORTING:
            # the coordinator's cancel never came: it gave up on this node long ago
            self.cancel(f"the sweep's {self.record['timeout_s']:g}s timeout passed with no word from the coordinator")

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def cancel(self, reason: str) -> None:
        self.cancel_reason = reason
        self.cancelled.set()

    def outlasted_stop(self) -> None:
        """A signal's wait for this capture is over, its thread still in a step (an `nsys start`
        or stop that hangs: a rank told to go records until told to stop, so its start is waited
        for): the node fails at the coordinator all the same, saying why, before the session
        closes; else the sweep waited out its timeout for a node whose agent had gone. DCGM is
        resumed on the way out (`Agent.close`)."""
        if not (self.cancelled.is_set() and self._thread is not None and self._thread.is_alive()):
            return
        with self._status_lock:
            if self._said_end:
                return
            self._said_end = True
            status = self._status(NodeState.FAILED, f"{self.cancel_reason}; the capture had not ended when the "
                                                     f"agent exited, {CLOSE_WAIT_S:g} s on")
            if self.capture.owes_resume:
                status.dcgm_detail = "paused for this capture until the agent's exit, which resumes it"
            self.agent.send_status(status)

    def _run(self, restarted: bool) -> None:
        try:
            if restarted:
                first = self._handle(cap.Restarted())
            else:
                self._report(cap.Report(NodeState.PENDING, "capture accepted"))
                # Cancelled before it began (asked for as a signal stops the agent): it fails here,
                # DCGM untouched, also once stop is set, where `_drive` no longer acts on a cancel.
                failed = (cap.Failed(self.cancel_reason) if self.cancelled.is_set()
                          else self._attempt("backend", self._prepare))
                first = self._handle(failed or cap.Begin(self.backend.needs_gpu_counters(self.request())))
            self._drive(first)
            if self.capture.state is NodeState.FAILED:
                # Nothing reads what it left, and it may be what filled the disk (nsys reports,
                # GiBs a rank): kept for the record's week, every later capture failed "disk full".
                self._clean()
        finally:
            self.window_shut.set()

    def _prepare(self) -> None:
        if self.record.get("refused"):
            raise ConfigError(self.record["refused"])
        name = self.record["backend"]
        if name not in self.agent.config.backends:
            raise ConfigError(f"backend {name!r} is not enabled on this agent "
                              f"(--backend {','.join(self.agent.config.backends)})")
        self.backend = load_backend(name)()
        unknown = self.backend.unknown_options(self.record.get("requested_options", ()))
        if unknown:
            known = ", ".join(sorted(self.backend.options)) or "none"
            raise ConfigError(f"unknown capture option {unknown[0]!r} for the {name} backend (it reads: {known})")
        self.backend.check(self.request())  # no DCGM pause for a capture that cannot start

    def _drive(self, instructions: list) -> None:
        pending = deque(instructions)
        try:
            while pending:
                if self.cancelled.is_set() and not self.capture.done and not self.agent.stop.is_set():
                    pending = deque(self._handle(cap.Failed(self.cancel_reason)))
                    continue
                instruction = pending.popleft()
                event = self._attempt(type(instruction).__name__, lambda: self._execute(instruction))
                if event is None:
                    continue
                if isinstance(event, cap.Failed) and self.capture.done:
                    # A step of the failure's own plan failed: the node keeps its first reason,
                    # and the rest of the plan (the FAILED report the coordinator waits for) runs.
                    log.warning("capture %s: %s after the failure: %s", self.sweep_id,
                                type(instruction).__name__, event.reason)
                    continue
                if self.agent.stop.is_set() and not isinstance(event, cap.DcgmResumed):
                    if isinstance(instruction, cap.StartCapture):  # the ranks record: DCGM resumes on the way out
                        self._abort()
                    # stopping, not by a signal (a halt ends its captures before it stops): leave
                    # the record as it is, a restart carries on from here
                    return
                followups = self._handle(event)
                # A failure replaces the plan: what was still queued belongs to the old one.
                pending = deque(followups) if isinstance(event, cap.Failed) else deque([*pending, *followups])
        except cap.TransitionError:
            log.exception("capture %s: the agent fed its capture machine an impossible event", self.sweep_id)

    def _attempt(self, step: str, action: Callable[[], object]):
        """Run one step; any error becomes the Failed event that ends the node, resumed, with a reason."""
        try:
            return action()
        except RankscopeError as exc:
            return cap.Failed(self.cancel_reason if self.cancelled.is_set() else str(exc))
        except Exception as exc:  # a backend bug must not leave the node hanging
            log.exception("capture %s: %s failed", self.sweep_id, step)
            return cap.Failed(f"{step}: {type(exc).__name__}: {exc}")

    def _handle(self, event) -> list:
        instructions = self.capture.handle(event)
        self.persist()
        return instructions

    def _execute(self, instruction):
        if isinstance(instruction, cap.Report):
            self._report(instruction)
            return None
        if isinstance(instruction, cap.PauseDcgm):
            return self._pause()
        if isinstance(instruction, cap.StartCapture):
            try:
                self.record["began"] = self.backend.start(self.request()) or 0.0
            finally:
                self._keep_notes()
            return self._window_opened()
        if isinstance(instruction, cap.StopCapture):
            self.cancelled.wait(self._window_left_s())
            try:
                exports = self.backend.stop(self.request())
            finally:
                self._keep_notes()
            return cap.CaptureStopped(tuple(str(p) for p in exports))
        if isinstance(instruction, cap.AbortCapture):
            self._abort()
            self.window_shut.set()
            return None
        if isinstance(instruction, cap.ResumeDcgm):
            return self._resume(instruction)
        if isinstance(instruction, cap.Export):
            return cap.Exported(self._export(instruction.exports))
        if isinstance(instruction, cap.Upload):
            self._upload(instruction.artifacts)
            self._clean()
            return cap.Uploaded()
        raise TypeError(f"unknown instruction {instruction!r}")

    def request(self) -> CaptureRequest:
        """The same request for start, stop and release: ranks are read from the spool once."""
        if self._request is None:
            self._request = CaptureRequest(
                sweep_id=self.sweep_id, duration_s=self.record["duration_s"], workdir=self.folder,
                start_at=self.record.get("start_at_ns", 0) / 1e9,
                ranks=tuple(local_ranks(self.agent.config.spool)), options=self.record["options"],
                keep_outputs=self.record["upload_raw"], cancelled=self.cancelled,
            )
        return self._request

    # steps --------------------------------------------------------------------------

    def _pause(self):
        try:
            outcome = self.agent.pauses.acquire(self.sweep_id, self._lease_s())
        except dcgm_mod.PauseNotRecorded as exc:  # given back already: the node fails, DCGM not left dark
            if exc.undone is None:
                self._set_dcgm(pb.DCGM_OUTCOME_PAUSE_FAILED, str(exc))
            else:
                self._record_release(exc.undone)
            raise
        detail = self.agent.pauses.error
        if outcome is dcgm_mod.DcgmOutcome.FAILED:
            # Tracing needs no counters; only GPU-metrics sampling does, and DCGM may still
            # hold them: fail that part alone and trace on (dcgm.md §9.4).
            detail = f"pause failed ({detail}); capturing without GPU metrics"
            self.record["options"]["gpu_metrics"] = "false"
            self._request = None
        self._set_dcgm(DCGM_OUTCOMES.get(outcome, pb.DCGM_OUTCOME_PAUSE_FAILED), detail)
        return cap.DcgmPaused(outcome.value, detail)

    def _window_opened(self):
        """The lease runs window + margin from now, not from the pause: a slow ``nsys start``
        (8 ranks, each up to its timeout) must not eat the window's share. A start slower than
        the lease itself fails the capture: DCGM was resumed under it (never left dark)."""
        if self.capture.dcgm_mode != cap.PAUSED:
            return cap.CaptureStarted()
        if not self.backend.counters_held(self.request()):
            self._resume_early()
            return cap.CaptureStarted()
        if self.agent.pauses.renew(self.sweep_id, self._lease_s()):
            return cap.CaptureStarted()
        return cap.Failed(f"starting the ranks' recording outlasted the DCGM pause's {self._lease_s():g}s lease "
                          "(DCGM was resumed meanwhile): the capture would have fought DCGM for the counters")

    def _resume_early(self) -> None:
        """Give DCGM's pause back as the window begins where no rank reads the counters (the
        sampler fell back to no GPU metrics: held by another tool, or not its user's): else
        DCGM's profiling series stayed dark through the window for nothing (dcgm.md §9.2).
        The capture's own resume step then finds it given back."""
        self.record["resumed_early"] = True
        outcome = self.agent.pauses.release(self.sweep_id)
        if outcome is dcgm_mod.DcgmOutcome.RESUMED:
            self._set_dcgm(pb.DCGM_OUTCOME_RESUMED, "resumed as the window began: no rank reads the GPU counters")
        else:
            self._record_release(outcome)

    def _window_left_s(self) -> float:
        """How long the window runs on: the capture's duration, or where the ranks began
        together, until the stop at that time plus the duration (every node of the sweep
        that began at its start ends alike), asked for `window.LEAD_S` ahead."""
        duration = self.record["duration_s"]
        began = self.record.get("began", 0.0)
        if not began:
            return duration
        return min(duration, max(0.0, began + duration - window.LEAD_S - time.time()))

    def _lease_s(self) -> float:
        return self.record["duration_s"] + LEASE_MARGIN_S

    def _loaded_backend(self) -> CaptureBackend:
        """The backend; loaded again by an agent restarted with a capture under way."""
        if self.backend is None:
            self.backend = load_backend(self.record["backend"])()
        return self.backend

    def _abort(self) -> None:
        """Stop the ranks' recording after a failure; its output is not used, its errors only logged."""
        try:
            self._loaded_backend().stop(self.request())  # a restarted agent's ranks may still be recording
        except Exception as exc:  # the node is failing already; the reason stays the first one
            log.warning("capture %s: stopping the window after a failure: %s", self.sweep_id, exc)

    def _resume(self, instruction: cap.ResumeDcgm):
        try:
            if self.backend is not None:
                self.backend.release_counters(self.request())
        finally:  # a backend that cannot let go of the counters must not keep DCGM paused too
            if instruction.pause and not self.record.get("resumed_early"):
                self._record_release(self.agent.pauses.release(self.sweep_id))
        if not instruction.pause:
            if self.record["dcgm"] == pb.DCGM_OUTCOME_UNSPECIFIED:
                self._set_dcgm(pb.DCGM_OUTCOME_NOT_NEEDED, "")
            return None
        return cap.DcgmResumed(self.agent.pauses.error)

    def _record_release(self, outcome: dcgm_mod.DcgmOutcome) -> None:
        """What giving the pause back did, for the node's record (a `PauseManager.release` outcome)."""
        if outcome is dcgm_mod.DcgmOutcome.NOT_HELD:  # no lease left: the restart's recovery resumed it
            self._set_dcgm(pb.DCGM_OUTCOME_RESUMED,
                           "resumed when the previous agent process ended, or as its lease expired")
        elif outcome is dcgm_mod.DcgmOutcome.PAUSED:
            self._set_dcgm(pb.DCGM_OUTCOME_RESUMED, "released; another capture on this host still holds the pause")
        elif outcome is dcgm_mod.DcgmOutcome.FAILED:
            self._set_dcgm(pb.DCGM_OUTCOME_RESUME_FAILED, self.agent.pauses.error)
        else:
            self._set_dcgm(DCGM_OUTCOMES.get(outcome, pb.DCGM_OUTCOME_RESUMED), self.agent.pauses.error)

    def _export(self, outputs: tuple[str, ...]) -> tuple[str, ...]:
        """The backend's exports (DCGM is back by now), then a digest at the edge: only the
        compact per-rank summary has to cross the network."""
        if not outputs:
            return ()
        try:
            exports = self._loaded_backend().export(self.request(), [Path(p) for p in outputs])
        finally:
            self._keep_notes()
            if not self.agent.stop.is_set():  # stopping kills the exports: the clock runs on across the restart
                self._export_ended()
        table, exports = self._digests(list(exports))
        path = self.folder / f"{safe_name(self.agent.config.name)}.digest.parquet"
        digest_mod.write(table, path)
        self.record["ranks"] = sorted(int(r) for r in table.column("rank").to_pylist())
        raw = _raw(outputs, exports) if self.record["upload_raw"] else ()  # kept in the JSON record
        return (str(path), *raw)

    def _digests(self, exports: list[Path]) -> tuple[pa.Table, list[Path]]:
        """The exports' digests, and the exports they came from. One that cannot be read (nsys
        said it exported, but cut it short) is left out and noted, as an export nsys says failed
        is: the node's other ranks still count. Where none can be read, the node fails."""
        from rankscope.analysis.sources import load_digests

        while True:
            try:
                return load_digests(exports), exports
            except ExportError as exc:
                bad = [p for p in exports if str(p) == exc.path]
                if not bad or len(exports) == 1:
                    raise
                exports = [p for p in exports if p not in bad]
                self._loaded_backend().note(f"went on without {exc}")
                self._keep_notes()

    def _upload(self, artifacts: tuple[str, ...]) -> None:
        uploader = self.agent.uploader(self)
        done = {entry["name"] for entry in self.record["uploaded"]}
        for index, name in enumerate(artifacts):
            path = Path(name)
            if path.name in done:
                continue
            digest = index == 0
            if not digest and self.cancelled.is_set() and self.agent.stopping:
                # Not begun as a signal stops the agent: not read whole for its sha256 only to be
                # given up (nsys exports, GiBs a rank, would eat the stop's wait and last word).
                self.record["notes"].append(f"raw export {path.name} not uploaded: {self.cancel_reason}")
                self.persist()
                continue
            artifact = Artifact(path, self.sweep_id, self.agent.config.name,
                                kind=pb.ARTIFACT_KIND_DIGEST if digest else pb.ARTIFACT_KIND_RAW,
                                ranks=tuple(self.record.get("ranks", ())) if digest else ())
            try:
                result = uploader.upload(artifact)
            except RankscopeError as exc:
                if digest or (self.cancelled.is_set() and not self.agent.stopping):
                    raise
                # The digest, stored already, is what the analysis needs: a raw export is extra,
                # also where a signal stops the agent (a cancel ends the node at the coordinator).
                why = self.cancel_reason if self.cancelled.is_set() else exc
                self.record["notes"].append(f"raw export {path.name} not uploaded: {why}")
                self.persist()
                continue
            self.record["uploaded"].append({"name": result.name, "sha256": result.sha256, "size": result.size,
                                            "kind": result.kind, "upload_id": result.upload_id,
                                            "ranks": list(result.ranks), "resumed_from": result.resumed_from})
            self.persist()
            if digest and len(artifacts) > 1:  # the sweep can stand on it, should the raw exports run late
                self._report(cap.Report(NodeState.UPLOADING, "digest uploaded; uploading raw exports"))

    def note_upload(self, upload_id: str, offset: int, size: int) -> None:
        """Called per chunk sent; an upload's first records its id, so an operator (or a test) can query it."""
        uploads = self.record["uploads"]
        if upload_id not in uploads:
            uploads[upload_id] = size
            self.persist()

    def _clean(self) -> None:
        """The coordinator has everything, or the capture failed: drop the exports and
        artifacts, keep the small record."""
        if not self.folder.is_dir():  # its record could not be saved (a full disk) either
            return
        kept = []
        for entry in self.folder.iterdir():
            if entry.name == "capture.json":
                continue
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                continue
            try:
                entry.unlink(missing_ok=True)
            except OSError:  # housekeeping: the capture stands as it ended, uploaded or failed
                kept.append(entry.name)
        if kept:
            log.warning("capture %s: not removed from %s: %s", self.sweep_id, shown(self.folder), ", ".join(map(shown, kept)))

    # reporting ----------------------------------------------------------------------

    def _keep_notes(self) -> None:
        if self.backend.notes != self.record.get("notes", []):
            self.record["notes"] = list(self.backend.notes)
            self.persist()

    def _set_dcgm(self, outcome: int, detail: str) -> None:
        self.record["dcgm"] = outcome
        self.record["dcgm_detail"] = detail
        self.persist()

    def _export_began(self) -> None:
        """Start the export clock (kept across a restart), which the timeout does not count."""
        if "exporting_since" not in self.record:
            self.record["exporting_since"] = time.time()
            self.persist()

    def _export_ended(self) -> None:
        """Push the deadline back by the time spent exporting, up to the bound the coordinator
        was told, as it does for this node, and arm the timer again."""
        since = self.record.pop("exporting_since", None)
        if since is None or self.record.get("deadline") is None:
            return
        bound = self._loaded_backend().export_timeout_s(self.capture.exports)
        self.record["deadline"] += min(time.time() - since, bound)
        self.persist()
        self._arm_deadline()

    def _status(self, state: NodeState, detail: str) -> pb.NodeStatus:
        status = pb.NodeStatus(sweep_id=self.sweep_id, state=states.to_wire(state), detail=detail,
                               dcgm=self.record["dcgm"], dcgm_detail=self.record["dcgm_detail"],
                               agent_time_ns=time.time_ns(), notes=self.record.get("notes", []))
        if state is NodeState.EXPORTING:
            status.export_timeout_s = self._loaded_backend().export_timeout_s(self.capture.exports)
        if state is NodeState.FAILED:
            status.reason = self.capture.reason or detail
        if state in (NodeState.UPLOADING, NodeState.UPLOADED):  # uploading: its digest, once stored
            status.artifacts.extend(
                pb.ArtifactRef(name=e["name"], sha256=e["sha256"], size=e["size"], kind=e["kind"],
                               upload_id=e["upload_id"], ranks=e["ranks"]) for e in self.record["uploaded"]
            )
        return status

    def _report(self, report: cap.Report) -> None:
        log.info("sweep %s: %s %s", self.sweep_id, report.state.value, report.detail)
        self.record["detail"] = report.detail
        if report.state is NodeState.EXPORTING:
            self._export_began()
        with self._status_lock:
            self._said_end |= report.state in states.AGENT_DONE
            self.unsent = not self.agent.send_status(self._status(report.state, report.detail))

    def report_latest(self) -> None:
        """Where this capture stands, as the coordinator expects after a reconnect or a repeated start."""
        state = self.capture.state
        detail = self.record.get("detail", "")
        with self._status_lock:
            if self.capture.done and not self._said_end and self._thread is not None and self._thread.is_alive():
                # Its end's plan runs (the window stopped, then DCGM resumed; a restart's failure
                # too): that plan's own report says it, DCGM as it ended. Said now, DCGM as it was
                # then stood: the coordinator keeps a node's first FAILED.
                return
            if state is NodeState.DCGM_RESUMED:
                self.agent.send_status(self._status(NodeState.UPLOADED, "uploaded"))
            self.unsent = not self.agent.send_status(self._status(state, detail))

    def persist(self) -> None:
        """Save the record, for a restarted agent to carry on from. A save that fails (a full
        disk, say) is logged, once, and the capture goes on from memory: raising here would
        end the capture's thread wherever it stood, DCGM paused and the node never ended."""
        with self._persist_lock:
            self.record["capture"] = self.capture.to_dict()
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                atomic.write_text(self.folder / "capture.json", json.dumps(self.record))
                self._unsaved = False
            except Exception:
                if not self._unsaved:
                    log.exception("capture %s: its record was not saved (an agent restarted now would not "
                                  "know where it stood)", self.sweep_id)
                self._unsaved = True
