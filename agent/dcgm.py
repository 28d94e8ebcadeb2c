"""DCGM profiling pause/resume: the host's authority over the global pause flag.

On pre-Hopper GPUs DCGM's profiling metrics and nsys GPU metrics need the same perfmon
resource, so a capture that samples GPU counters must pause DCGM first (reference/dcgm.md).
DCGM keeps ONE global, non-reference-counted flag per host engine that nothing resumes by
itself, so this module owns what DCGM lacks: a reference count of overlapping captures (of
every agent on the host, through the shared ``pause_ledger``), a lease per capture that
resumes on expiry without the coordinator, and recovery of a pause whose agent is gone.

Three ways to reach the host engine, picked by :func:`discover`: DCGM's own Python bindings
(``BindingsControl``, shipped with DCGM, not on PyPI), the ``dcgmi`` CLI (``DcgmiControl``),
or nothing (``NoDcgm``: no DCGM on the node means nothing holds the counters).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import ModuleType

from rankscope.agent.pause_ledger import DEFAULT_FOLDER, Holder, NoLedger, PauseLedger
from rankscope.cli import parse_path
from rankscope.errors import ConfigError, ToolError, shown

log = logging.getLogger(__name__)

# Bindings folders of DCGM 4 and DCGM 3 installs (dcgm.md §2).
BINDINGS_DIRS = (
    Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"),
    Path("/usr/local/dcgm/bindings/python3"),
)
BINDING_MODULES = ("dcgm_structs", "dcgm_agent")  # what such a folder holds, imported from it
DEFAULT_HOST = "localhost"
DEFAULT_DCGMI = "dcgmi"  # looked up on PATH
# dcgmReturn_t codes (dcgm.md §7).
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_MODULE_NOT_LOADED = -33
# dcgmi exits with the dcgmReturn_t as an unsigned byte (dcgm.md §3, unverified on hardware).
DCGMI_EXIT_NOT_SUPPORTED = DCGM_ST_NOT_SUPPORTED & 0xFF
DCGM_TIMEOUT_S = 10.0  # one host-engine call: a dcgmi run, or the bindings' connect
RESUME_RETRIES = 3
RESUME_RETRY_DELAY_S = 0.5  # doubled after each failed attempt
# One resume series at its longest, on an engine that answers nothing: each attempt its
# timeout, and the delays between them.
RESUME_WORST_S = (RESUME_RETRIES * DCGM_TIMEOUT_S
                  + sum(RESUME_RETRY_DELAY_S * 2**i for i in range(RESUME_RETRIES - 1)))


class DcgmOutcome(str, Enum):
    """What a pause or resume did. Values are the wire's names (`DcgmOutcome` in the proto,
    lower case, less its prefix) where there is one, so progress lines and the sweep's node
    record say the same."""

    PAUSED = "paused"
    RESUMED = "resumed"
    NOT_SUPPORTED = "not_supported"  # Hopper and newer: counters are shared, no pause needed
    NOT_PRESENT = "not_present"  # no DCGM on the node: nothing to pause
    NOT_HELD = "not_held"  # released by a capture this process holds no lease for
    FAILED = "failed"


class PauseNotRecorded(ToolError):
    """The pause ledger could not take a capture's pause (a full disk, a read-only folder), or
    the manager is closed (the agent going): a pause it cannot keep on record (renewed,
    released, read by the host's other agents) is not held. ``undone``: how the pause was
    given back (a `release` outcome), None where none was made."""

    def __init__(self, message: str, *, undone: DcgmOutcome | None) -> None:
        super().__init__(message)
        self.undone = undone


MODES = ("auto", "bindings", "dcgmi", "none")


@dataclass(frozen=True)
class DcgmConfig:
    """How to reach the node's DCGM host engine."""

    mode: str = "auto"  # one of MODES
    host: str = DEFAULT_HOST  # host[:port] or unix:///path (a k8s Service name works)
    bindings_path: Path | None = None  # folder holding pydcgm.py/dcgm_agent.py
    dcgmi: str = DEFAULT_DCGMI
    timeout_s: float = DCGM_TIMEOUT_S
    ledger_dir: Path = DEFAULT_FOLDER  # shared by every agent on the host (pause_ledger)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DcgmConfig:
        """RANKSCOPE_DCGM (mode), RANKSCOPE_DCGM_HOST, RANKSCOPE_DCGM_BINDINGS, RANKSCOPE_DCGMI,
        RANKSCOPE_DCGM_STATE (the pause ledger's folder)."""
        bindings = environ.get("RANKSCOPE_DCGM_BINDINGS")
        return cls(
            mode=environ.get("RANKSCOPE_DCGM", "auto"),
            host=environ.get("RANKSCOPE_DCGM_HOST", DEFAULT_HOST),
            bindings_path=Path(bindings) if bindings else None,
            dcgmi=environ.get("RANKSCOPE_DCGMI", DEFAULT_DCGMI),
            ledger_dir=Path(environ.get("RANKSCOPE_DCGM_STATE", DEFAULT_FOLDER)),
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's DCGM flags; defaults come from the RANKSCOPE_DCGM* environment."""
    env = DcgmConfig.from_env()
    group = parser.add_argument_group("DCGM")
    group.add_argument("--dcgm", choices=MODES, default=env.mode,
                       help="how to pause DCGM profiling (default: auto-detect)")
    group.add_argument("--dcgm-host", default=env.host,
                       help="host engine address: host[:port] or unix:///path (default: localhost)")
    group.add_argument("--dcgm-bindings", type=parse_path, default=env.bindings_path,
                       help="folder with DCGM's Python bindings (default: the install's)")
    group.add_argument("--dcgmi", default=env.dcgmi, help="dcgmi executable (default: dcgmi on PATH)")
    group.add_argument("--dcgm-state", type=parse_path, default=env.ledger_dir, metavar="DIR",
                       help="folder where the agents of this host record their DCGM pauses, so none "
                            "resumes while another captures; every agent on the host must share it "
                            f"(default: {DEFAULT_FOLDER})")


def config_from_args(args: argparse.Namespace) -> DcgmConfig:
    if args.dcgm not in MODES:  # argparse checks the flag's choices, not a default from the environment
        raise ConfigError(f"$RANKSCOPE_DCGM {args.dcgm!r}: not one of {', '.join(MODES)} (a mode it does not know "
                          "would run every capture without pausing DCGM)")
    config = DcgmConfig(mode=args.dcgm, host=args.dcgm_host, bindings_path=args.dcgm_bindings,
                        dcgmi=args.dcgmi, ledger_dir=args.dcgm_state)
    _check_named(config)
    return config


def _check_named(config: DcgmConfig, environ: Mapping[str, str] = os.environ) -> None:
    """The bindings folder and the dcgmi named (--dcgm-bindings, --dcgmi or their RANKSCOPE_*
    variables) where the mode may use them are expected there: a ConfigError where they are
    not, rather than captures that never pause DCGM. The defaults (the install's folders,
    dcgmi on PATH) may be missing: `discover` then finds no DCGM to pause."""
    if config.bindings_path is not None and config.mode in ("auto", "bindings"):
        _expect("--dcgm-bindings", "RANKSCOPE_DCGM_BINDINGS", config.bindings_path, _bindings_problem(config.bindings_path),
                environ)
    if config.dcgmi != DEFAULT_DCGMI and config.mode in ("auto", "dcgmi"):
        _expect("--dcgmi", "RANKSCOPE_DCGMI", config.dcgmi,
                None if shutil.which(config.dcgmi) else "not found, or not executable", environ)


def _bindings_problem(folder: Path) -> str | None:
    if not folder.is_dir():
        return "not found, or not a folder"
    missing = [f"{module}.py" for module in BINDING_MODULES if not (folder / f"{module}.py").is_file()]
    return f"holds no DCGM Python bindings (no {', '.join(missing)})" if missing else None


def _expect(option: str, variable: str, named: str | Path, problem: str | None, environ: Mapping[str, str]) -> None:
    """A ConfigError for what ``option`` named, where there is a ``problem`` with it; named as
    the environment variable where that holds the value (the user may never have typed the flag)."""
    if problem is None:
        return
    source = f"${variable}" if environ.get(variable) and Path(environ[variable]) == Path(named) else option
    raise ConfigError(f"{source} {str(named)!r}: {problem}")


class DcgmControl(ABC):
    """Pause or resume DCGM profiling on one host engine. Never raises: failures are FAILED
    with the one-line reason in ``error``."""

    error: str = ""
    # A FAILED call that may have taken effect all the same (it went unanswered): a pause
    # then owes a resume, which is harmless where it had not (resume is idempotent).
    unanswered: bool = False

    @abstractmethod
    def pause(self) -> DcgmOutcome:
        """Pause profiling (idempotent): PAUSED, NOT_SUPPORTED, NOT_PRESENT or FAILED."""

    @abstractmethod
    def resume(self) -> DcgmOutcome:
        """Resume profiling (idempotent): RESUMED, NOT_SUPPORTED, NOT_PRESENT or FAILED."""

    @abstractmethod
    def describe(self) -> str:
        """Which engine, through what: recorded in the pause ledger and the node record."""


class NoDcgm(DcgmControl):
    def __init__(self, reason: str = "no DCGM found on this node") -> None:
        self.error = reason

    def pause(self) -> DcgmOutcome:
        return DcgmOutcome.NOT_PRESENT

    def resume(self) -> DcgmOutcome:
        return DcgmOutcome.NOT_PRESENT

    def describe(self) -> str:
        return "none"


class DcgmiControl(DcgmControl):
    """``dcgmi profile --pause|--resume --host ADDR`` (dcgm.md §3)."""

    def __init__(self, dcgmi: str = DEFAULT_DCGMI, host: str = DEFAULT_HOST, timeout_s: float = DCGM_TIMEOUT_S) -> None:
        self.dcgmi, self.host, self.timeout_s = dcgmi, host, timeout_s

    def command(self, action: str) -> list[str]:
        return profile_command(self.dcgmi, action, self.host)

    def pause(self) -> DcgmOutcome:
        return self._run("pause", DcgmOutcome.PAUSED)

    def resume(self) -> DcgmOutcome:
        return self._run("resume", DcgmOutcome.RESUMED)

    def describe(self) -> str:
        return f"dcgmi --host {self.host}"

    def _run(self, action: str, success: DcgmOutcome) -> DcgmOutcome:
        argv = self.command(action)
        self.unanswered = False
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            self.error = f"{shown(self.dcgmi)} not found"
            # Gone since discover() found it (an upgrade, a volume unmounted): a pause it made
            # stands, so a resume it cannot run stays owed, to be retried.
            return DcgmOutcome.FAILED if success is DcgmOutcome.RESUMED else DcgmOutcome.NOT_PRESENT
        except OSError as exc:  # not executable (any more), say: a failure to say, never to raise
            self.error = f"{shown(self.dcgmi)} cannot run ({exc.strerror or exc})"
            return DcgmOutcome.FAILED
        except subprocess.TimeoutExpired:  # a busy host engine may have paused all the same
            self.error = f"`{shlex.join(argv)}` did not answer within {self.timeout_s:g} s"
            self.unanswered = True
            return DcgmOutcome.FAILED
        text = " ".join((done.stdout + " " + done.stderr).split())
        if done.returncode == 0:
            self.error = ""
            return success
        if done.returncode == DCGMI_EXIT_NOT_SUPPORTED or "Feature not supported" in text:
            self.error = text
            return DcgmOutcome.NOT_SUPPORTED
        self.error = f"`{shlex.join(argv)}` exited {done.returncode}: {text or 'no output'}"
        return DcgmOutcome.FAILED


def profile_command(dcgmi: str, action: str, host: str) -> list[str]:
    """argv of ``dcgmi profile --pause|--resume --host HOST`` (dcgm.md §3)."""
    if action not in ("pause", "resume"):
        raise ValueError(f"unknown dcgmi profile action {action!r}")
    return [dcgmi, "profile", f"--{action}", "--host", host]


class BindingsControl(DcgmControl):
    """DCGM's own Python bindings (``dcgm_agent``/``dcgm_structs``), connecting to a standalone
    host engine per call so an engine restart between captures costs nothing."""

    def __init__(self, bindings_path: Path | None = None, host: str = DEFAULT_HOST,
                 timeout_s: float = DCGM_TIMEOUT_S) -> None:
        self.bindings_path, self.host, self.timeout_s = bindings_path, host, timeout_s
        self._agent: ModuleType | None = None
        self._structs: ModuleType | None = None

    def describe(self) -> str:
        return f"DCGM bindings --host {self.host}"

    def pause(self) -> DcgmOutcome:
        return self._call("dcgmProfPause", DcgmOutcome.PAUSED)

    def resume(self) -> DcgmOutcome:
        return self._call("dcgmProfResume", DcgmOutcome.RESUMED)

    def load(self) -> None:
        """Import the bindings (ToolError-free: raises ImportError when absent)."""
        if self._agent is not None:
            return
        folder = self.bindings_path or next((d for d in BINDINGS_DIRS if d.is_dir()), None)
        if folder is not None and str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
        self._structs, self._agent = map(importlib.import_module, BINDING_MODULES)

    def _call(self, function: str, success: DcgmOutcome) -> DcgmOutcome:
        try:
            self.load()
        except ImportError as exc:
            self.error = f"DCGM Python bindings not found ({exc})"
            return DcgmOutcome.NOT_PRESENT
        agent, structs = self._agent, self._structs
        handle = None
        try:
            structs._dcgmInit()  # loads libdcgm.so; LIBRARY_NOT_FOUND when DCGM is absent
            agent.dcgmInit()
            handle = agent.dcgmConnect_v2(*self._address(structs))
            getattr(agent, function)(handle)
        except structs.DCGMError as exc:
            return self._failed(function, exc)
        finally:
            if handle is not None:
                try:
                    agent.dcgmDisconnect(handle)
                except structs.DCGMError:
                    log.debug("disconnect from DCGM at %s failed", self.host)
        self.error = ""
        return success

    def _address(self, structs: ModuleType) -> tuple[str, object]:
        params = structs.c_dcgmConnectV2Params_v2()
        params.version = structs.c_dcgmConnectV2Params_version
        params.timeoutMs = int(self.timeout_s * 1000)
        params.persistAfterDisconnect = 0
        unix = self.host.startswith("unix://")
        params.addressIsUnixSocket = 1 if unix else 0
        return (self.host[len("unix://"):] if unix else self.host), params

    def _failed(self, function: str, exc: Exception) -> DcgmOutcome:
        code = getattr(exc, "value", None)
        self.error = f"{function} on DCGM at {self.host}: {exc} ({code})"
        if code in (DCGM_ST_NOT_SUPPORTED, DCGM_ST_MODULE_NOT_LOADED):
            return DcgmOutcome.NOT_SUPPORTED
        if code == DCGM_ST_LIBRARY_NOT_FOUND:
            return DcgmOutcome.NOT_PRESENT
        return DcgmOutcome.FAILED


def discover(config: DcgmConfig | None = None) -> DcgmControl:
    """The control for this node: bindings if importable, else dcgmi if on PATH, else NoDcgm."""
    config = config or DcgmConfig.from_env()
    if config.mode == "none":
        return NoDcgm("DCGM disabled by configuration")
    if config.mode in ("auto", "bindings"):
        control = BindingsControl(config.bindings_path, config.host, config.timeout_s)
        try:
            control.load()
            return control
        except ImportError as exc:
            if config.mode == "bindings":
                return NoDcgm(f"DCGM Python bindings not importable ({exc})")
    if config.mode in ("auto", "dcgmi"):
        path = shutil.which(config.dcgmi)
        if path:
            return DcgmiControl(path, config.host, config.timeout_s)
        if config.mode == "dcgmi":
            return NoDcgm(f"{shown(config.dcgmi)} not found, or not executable")
        return NoDcgm(f"neither DCGM's Python bindings nor {shown(config.dcgmi)} found")
    return NoDcgm(f"unknown DCGM mode {config.mode!r}")


class PauseManager:
    """One process's pauses: reference-counted leases over DCGM's global flag, shared host-wide.

    ``acquire`` pauses (idempotently, so it also re-asserts a pause someone else resumed) and
    records a lease; ``release`` drops it and resumes when no lease of any agent on the host
    is left (``pause_ledger``). A lease not released by its expiry is released by a local
    timer, so a lost coordinator never leaves the node dark; the same timer resumes a pause
    whose agent ended without resuming it. The ledger is written (durably) before every Pause
    call, so a crash at any point leaves enough on disk for the next agent to resume.
    """

    def __init__(self, control: DcgmControl, ledger_dir: Path, *, who: str = "rankscope",
                 clock: Callable[[], float] = time.time, resume_retries: int = RESUME_RETRIES,
                 retry_delay_s: float = RESUME_RETRY_DELAY_S, reassert_s: float = 30.0) -> None:
        self.control = control
        self.ledger = NoLedger() if isinstance(control, NoDcgm) else PauseLedger(
            ledger_dir, f"{who} pid {os.getpid()} on {socket.gethostname()} ({control.describe()})")
        self.clock = clock
        self.resume_retries = resume_retries
        self.retry_delay_s = retry_delay_s
        self.reassert_s = reassert_s
        self._asserted = 0.0  # when Pause was last called
        self._checked = 0.0  # when the ledger was last looked at while idle
        self.error = ""  # reason behind the last FAILED / NOT_SUPPORTED / NOT_PRESENT
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._paused = False  # this process paused DCGM and owes the resume
        self._stale = False  # the ledger could not be written: its record claims more than is held
        self._leases: dict[str, float] = {}  # capture id -> wall expiry
        self._outcomes: dict[str, DcgmOutcome] = {}  # acquire outcome per capture not yet released
        self._released: dict[str, DcgmOutcome] = {}  # so a repeated release answers the same
        self._timer: threading.Thread | None = None
        self._opened = False
        self._closed = False

    # -- public -----------------------------------------------------------------------------

    def check(self) -> None:
        """The ConfigError `open` raises where the host's ledger is unusable, before anything is made."""
        self.ledger.check()

    def open(self) -> None:
        """Join the host's ledger (ConfigError where it is unusable) and start the timer."""
        with self._lock:
            if not self._opened:
                self.ledger.open()
                self._opened = True
            self._ensure_timer()

    def acquire(self, capture_id: str, lease_s: float) -> DcgmOutcome:
        """Pause DCGM for one capture, holding it at most ``lease_s`` seconds."""
        with self._lock:
            if self._closed:  # the agent is going: no lease timer would expire it, no close resume it
                raise PauseNotRecorded("DCGM not paused: the agent is stopping", undone=None)
            self.open()
            self._released.pop(capture_id, None)
            with self.ledger.deciding() as others:
                self._leases[capture_id] = self.clock() + lease_s
                try:
                    self._save()  # ledger first: a crash inside Pause is still recovered
                except OSError as exc:
                    del self._leases[capture_id]
                    raise PauseNotRecorded(f"DCGM not paused: {self._unwritable(exc)}", undone=None) from None
                outcome = self.control.pause()
                self.error = self.control.error
                if outcome is DcgmOutcome.PAUSED:
                    self._paused = True
                    self._asserted = self.clock()
                    for holder in others:  # our pause covers what they left: our resume ends it
                        if holder.left_behind:
                            self.ledger.forget(holder)
                    try:
                        self._save()
                    except OSError as exc:
                        raise self._undo(capture_id, others, exc) from None
                else:
                    del self._leases[capture_id]
                    # unanswered, it may have paused: the resume is owed (the timer runs it)
                    self._paused = self._paused or (outcome is DcgmOutcome.FAILED and self.control.unanswered)
                    self._save_shrunk()
            self._outcomes[capture_id] = outcome
            self._wake.notify_all()
            log.info("DCGM pause for %s: %s %s", capture_id, outcome.value, self.error)
            return outcome

    def renew(self, capture_id: str, lease_s: float) -> bool:
        """Hold a capture's lease ``lease_s`` more seconds from now (when its window actually
        opens, however long the start took). False where it expired already: DCGM may have
        been resumed meanwhile, and the capture cannot count on the counters. ToolError where
        the ledger cannot record it: the lease runs to its old expiry."""
        with self._lock:
            if capture_id not in self._leases:
                return False
            with self.ledger.deciding():
                before, self._leases[capture_id] = self._leases[capture_id], self.clock() + lease_s
                try:
                    self._save()
                except OSError as exc:  # the host's other agents see the old expiry: it stands here too
                    self._leases[capture_id] = before
                    raise ToolError(f"DCGM's pause could not be renewed: {self._unwritable(exc)}") from None
            self._wake.notify_all()
            return True

    def release(self, capture_id: str) -> DcgmOutcome:
        """Drop a capture's lease; resume DCGM if it was the host's last one.

        Returns RESUMED when this call resumed, PAUSED while other captures (of this agent or
        another on the host) still hold it, the acquire outcome for a capture that never
        paused, FAILED if resume kept failing (the timer keeps retrying), NOT_HELD for a
        capture this process holds nothing for (its lease expired, or a restart's recovery
        resumed it). Repeating a release answers the same as the first."""
        with self._lock:
            if capture_id in self._released:  # released already (e.g. early, before export)
                return self._released[capture_id]
            outcome = self._outcomes.pop(capture_id, None)
            if self._leases.pop(capture_id, None) is None:
                return outcome or DcgmOutcome.NOT_HELD
            with self.ledger.deciding() as others:
                outcome = self._settle(others) or DcgmOutcome.RESUMED
            self._released[capture_id] = outcome
            return outcome

    def recover(self) -> DcgmOutcome | None:
        """At agent start: resume a pause that an agent gone from this host left behind, unless
        a live one still holds it. The outcome when something was resumed, else None."""
        with self._lock:
            self.open()
            with self.ledger.deciding() as others:
                self._checked = self.clock()
                outcome = self._settle(others)
            return None if outcome is DcgmOutcome.PAUSED else outcome

    def close(self) -> DcgmOutcome | None:
        """Agent exit: drop every lease, resume if nothing else on the host holds the pause,
        and leave the ledger."""
        self._closed = True  # before the lock: the timer starts no retry while close() waits for it
        with self._lock:
            self._wake.notify_all()
            self._outcomes.clear()
            if not self._opened:  # never joined the ledger, or closed already
                return None
            self._opened = False
            self._leases.clear()
            try:
                with self.ledger.deciding() as others:
                    return self._settle(others)
            finally:
                # A resume still owed stays on record, unlocked: the next agent on the host
                # finds it left behind and resumes.
                self.ledger.close(keep=self._paused)

    def holders(self) -> list[str]:
        with self._lock:
            return sorted(self._leases)

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._paused

    # -- internals (the caller holds the lock and, but for _resume, the ledger) ---------------

    def _settle(self, others: list[Holder]) -> DcgmOutcome | None:
        """After leases changed: resume when no lease on the host needs the pause any more.
        PAUSED while one does, the resume's outcome when one ran, None when none was owed."""
        if self._leases or any(holder.holds(self.clock()) for holder in others):
            self._paused = self._paused and bool(self._leases)  # a holder left owes the resume now
            self._save_shrunk()
            return DcgmOutcome.PAUSED
        left = [holder for holder in others if holder.left_behind]
        if not (self._paused or left):
            return None
        if left:
            log.warning("resuming DCGM left paused by %s", ", ".join(holder.who for holder in left))
        outcome = self._resume()
        if outcome is not DcgmOutcome.FAILED:
            for holder in left:
                self.ledger.forget(holder)
        return outcome

    def _resume(self) -> DcgmOutcome:
        """Resume with retries; until one succeeds the pause stays owed (on disk too)."""
        outcome = DcgmOutcome.FAILED
        for attempt in range(self.resume_retries):
            outcome = self.control.resume()
            if outcome is not DcgmOutcome.FAILED:
                break
            log.warning("DCGM resume failed (attempt %d): %s", attempt + 1, self.control.error)
            if attempt + 1 < self.resume_retries:
                time.sleep(self.retry_delay_s * 2**attempt)  # holding the ledger: no acquire races a resume
        self.error = self.control.error
        self._paused = outcome is DcgmOutcome.FAILED
        self._save_shrunk()
        self._wake.notify_all()  # the timer retries a failed resume
        return outcome

    def _save(self) -> None:
        self.ledger.write(self._paused, self._leases)

    def _save_shrunk(self) -> None:
        """Record a lease or pause given up. Where that write fails (a full disk), the record
        left claims more: a lease the host's other agents leave the resume to this process
        for. So it keeps owing the resume, made again (it is idempotent) whenever no lease on
        the host needs the pause, until the record can be written; what it gave up stands."""
        try:
            self._save()
            self._stale = False
        except OSError as exc:
            self._paused = True
            if not self._stale:
                log.warning("DCGM pause ledger: %s; this agent resumes DCGM until it can be", self._unwritable(exc))
            self._stale = True

    def _unwritable(self, exc: OSError) -> str:
        return f"the pause ledger {shown(self.ledger.folder)} cannot be written ({exc.strerror or exc})"

    def _undo(self, capture_id: str, others: list[Holder], exc: OSError) -> PauseNotRecorded:
        """Give back a pause the ledger could not record, at once: DCGM resumed unless another
        capture of the host still holds it."""
        del self._leases[capture_id]
        undone = self._settle(others) or DcgmOutcome.RESUMED
        after = {DcgmOutcome.FAILED: f"its resume failed ({self.error}), retried",
                 DcgmOutcome.PAUSED: "left to the other captures that hold it"}.get(undone, "resumed at once")
        return PauseNotRecorded(f"DCGM paused, then {after}: {self._unwritable(exc)}", undone=undone)

    def _expire(self) -> None:
        """Release leases past their expiry, retry a resume that failed earlier, re-assert a
        held pause now and then (any client's Resume clears DCGM's one flag, dcgm.md §9.6),
        and resume a pause another agent on the host left behind."""
        now = self.clock()
        with self.ledger.deciding() as others:
            if self._paused and self._leases and now - self._asserted >= self.reassert_s:
                self._asserted = now
                if self.control.pause() is not DcgmOutcome.PAUSED:
                    log.warning("re-asserting the DCGM pause failed: %s", self.control.error)
            expired = [cid for cid, until in self._leases.items() if until <= now]
            for cid in expired:
                log.warning("DCGM pause lease of %s expired: releasing it", cid)
                self._outcomes.pop(cid, None)
                del self._leases[cid]
            if expired or (self._paused and not self._leases) or any(holder.left_behind for holder in others):
                self._settle(others)

    def _next_wake(self) -> float:
        """Seconds to the next look: a lease's expiry or a re-assertion while holding, a resume
        retry while one is owed, else the idle look for pauses other agents left."""
        if self._leases:
            until = min(min(self._leases.values()), self._asserted + self.reassert_s)
        elif self._paused:
            until = self._checked + self.retry_delay_s * 4
        else:
            until = self._checked + self.reassert_s
        return until - self.clock()

    def _ensure_timer(self) -> None:
        if self._timer is None or not self._timer.is_alive():
            self._timer = threading.Thread(target=self._watch, name="dcgm-lease", daemon=True)
            self._timer.start()

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                delay = self._next_wake()
                if delay > 0:
                    self._wake.wait(min(delay, 1.0))  # woken early by changes; wall-clock jumps re-read
                    continue
                try:
                    self._expire()
                except OSError as exc:  # the ledger's folder went away under us: say so, keep trying
                    log.warning("DCGM pause ledger %s: %s", shown(self.ledger.folder), exc)
                    self._wake.wait(self.retry_delay_s * 4)
                finally:
                    # From the look's end: a resume failing slowly (each call its timeout) was
                    # retried at once, the lock never let go, close() and captures kept waiting.
                    self._checked = self.clock()
