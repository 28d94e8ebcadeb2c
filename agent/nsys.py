"""Nsight Systems on the node: one argv builder per nsys command, and the ``nsys`` backend.

Every rank runs inside its own named nsys interactive session (``nsys launch
--session-new=NAME``, started by ``rankscope rank``), so a capture window can open and
close on demand with ``nsys start/stop --session=NAME``, which the rank's wrapper runs
when the agent asks (`SessionWindow`, window.py); the agent exports each report to
SQLite at the edge (reference/nsys-export.md §1, §9, §10). Trace flags belong to
``launch``; output and GPU-metric flags belong to ``start``.

Every subprocess has a timeout: a wedged nsys becomes a ToolError naming the command,
never a hung agent or rank wrapper.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rankscope.agent import window
from rankscope.agent.backend import CaptureBackend, CaptureRequest
from rankscope.agent.spool import RankInfo
from rankscope.agent.window import NoWindow
from rankscope import capture_options, cpus, output
from rankscope.errors import ToolError, shown

log = logging.getLogger(__name__)

NSYS = os.environ.get("RANKSCOPE_NSYS", "nsys")
# NCCL's own NVTX ranges ("legacy" NCCL tracing, nccl-in-traces.md §1) are what the
# ingest reads; nsys's advanced NCCL tracing (-t nccl) turns them off, so it is opt-in.
# Nothing else is read: no OS runtime calls, and no CPU sampling (`NO_SAMPLING`), whose
# cost every rank pays and whose data slows every stop and export (nsys-export.md §10).
DEFAULT_TRACE = ("cuda", "nvtx")
# Sampling is a collection's setting (`start`, `profile`; `launch` refuses it).
NO_SAMPLING = ("--sample=none", "--cpuctxsw=none")
# A CUDA graph's kernels as kernels: by default nsys traces a graph launch as one range, and
# NCCL kernels captured in graphs (torch.compile, Megatron's CUDA graphs) would go unseen.
GRAPH_NODES = "--cuda-graph-trace=node"
NCCL_MODES = ("legacy", "advanced", "auto")
REPORT_SUFFIX = ".nsys-rep"
COMMAND_TIMEOUT_S = 60.0
EXPORT_TIMEOUT_S = 900.0
CANCEL_POLL_S = 0.2  # how soon a cancelled capture's running nsys command is killed
MIN_FREE_BYTES = 64 << 20  # below this, an export is bound to fail: say "disk full" first

_SESSION_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


# -- argv builders (one per nsys command) --------------------------------------------------


def session_name(job_id: str, rank: int, pid: int) -> str:
    """A session name unique on the node: job, rank and the wrapper's pid."""
    job = _SESSION_UNSAFE.sub("_", job_id) or "nojob"
    return f"rankscope_{job}_r{rank}_{pid}"


def trace_flag(trace: Sequence[str], nccl: str = "legacy", *, nccl_supported: bool = False) -> str:
    """``--trace=...``; ``nccl`` added for advanced NCCL tracing where this nsys has it.

    ``nccl``: legacy (NCCL's NVTX ranges only), advanced (require ``-t nccl``), auto
    (advanced where supported, else legacy)."""
    if nccl not in NCCL_MODES:
        raise ValueError(f"unknown NCCL tracing mode {nccl!r} (one of {', '.join(NCCL_MODES)})")
    kinds = [k for k in trace if k != "nccl"]
    if nccl == "advanced" and not nccl_supported:
        raise ToolError("this nsys has no advanced NCCL tracing (--nccl-trace needs nsys >= 2025.6.1); "
                        "use --nccl-trace legacy")
    if nccl == "advanced" or (nccl == "auto" and nccl_supported):
        kinds.append("nccl")
    if "nvtx" not in kinds:
        kinds.append("nvtx")  # legacy NCCL ranges and step ranges are NVTX
    return "--trace=" + ",".join(kinds)


def launch_command(session: str, cmd: Sequence[str], *, trace: str = trace_flag(DEFAULT_TRACE),
                   wait: str = "primary", nsys: str = NSYS) -> list[str]:
    """``nsys launch --session-new=NAME --trace=... --cuda-graph-trace=node --wait=primary CMD...``:
    inject, not collecting."""
    _require_cmd(cmd)
    return [nsys, "launch", f"--session-new={session}", trace, GRAPH_NODES, f"--wait={wait}", *cmd]


def start_command(session: str, output: Path, *, gpu_metrics: bool = False, nsys: str = NSYS) -> list[str]:
    """``nsys start --session=NAME --output=PATH --force-overwrite=true --sample=none
    --cpuctxsw=none [--gpu-metrics-devices=all]``.

    GPU metrics sample the whole node, so only one session per node asks for them (§10)."""
    argv = [nsys, "start", f"--session={session}", f"--output={output}", "--force-overwrite=true", *NO_SAMPLING]
    if gpu_metrics:
        argv.append("--gpu-metrics-devices=all")
    return argv


def gpu_metrics_sampler(ranks: Sequence[RankInfo]) -> RankInfo | None:
    """The one rank of the node whose session samples GPU metrics: a local rank 0, the first
    by job and rank. GPU metrics cover the whole node, and sessions that each ask for them
    contend for the counters (nsys-export.md §10: one sampler per node; the User Guide has
    concurrent `nsys` instances each try to collect); a node shared by several jobs (Slurm,
    one-GPU pods) holds a local rank 0 of each."""
    return min((r for r in ranks if r.local_rank == 0), key=lambda r: (r.job_id, r.rank, r.pid), default=None)


def stop_command(session: str, *, nsys: str = NSYS) -> list[str]:
    return [nsys, "stop", f"--session={session}"]


def cancel_command(session: str, *, nsys: str = NSYS) -> list[str]:
    """``nsys cancel --session=NAME``: the collection ends, its data dropped (no report)."""
    return [nsys, "cancel", f"--session={session}"]


def sessions_list_command(*, nsys: str = NSYS) -> list[str]:
    return [nsys, "sessions", "list"]


def export_command(report: Path, output: Path, *, type: str = "sqlite", nsys: str = NSYS) -> list[str]:
    """``nsys export --type=sqlite --include-blobs=true ...``: the blobs carry NCCL's NVTX
    payloads (communicator id, bytes), without which collectives cannot be matched."""
    return [nsys, "export", f"--type={type}", f"--output={output}", "--force-overwrite=true",
            "--include-blobs=true", str(report)]


def export_path(report: Path) -> Path:
    """Where `NsysBackend` exports ``report``: beside it, as the ``.sqlite`` analysis/nsys_export.py reads."""
    return report.with_name(report.name.removesuffix(REPORT_SUFFIX) + ".sqlite")


def profile_command(cmd: Sequence[str], output: Path, *, trace: str = trace_flag(DEFAULT_TRACE),
                    duration_s: float | None = None, capture_range: str | None = None,
                    nvtx_capture: str | None = None, gpu_metrics: bool = False, nsys: str = NSYS) -> list[str]:
    """One-shot ``nsys profile``: a ``--duration`` window or a ``--capture-range``
    (``nvtx`` names its range with ``--nvtx-capture=RANGE@DOMAIN``).

    ``--kill=none``: nsys otherwise kills the application when a --duration ends; a capture
    range ends with ``--capture-range-end=stop``, which leaves it running, not the default
    ``stop-shutdown`` (nsys-export.md §9): the rank lives on, and its exit code is its own.
    ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0``: an NVTX range opens only on a registered string
    otherwise, and PyTorch's ``torch.cuda.nvtx.range_push`` registers none."""
    _require_cmd(cmd)
    if (duration_s is None) == (capture_range is None):
        raise ValueError("one-shot profiling needs exactly one of a duration or a capture range")
    if (capture_range == "nvtx") != (nvtx_capture is not None):
        raise ValueError("--capture-range=nvtx goes with --nvtx-capture=RANGE@DOMAIN, and only with it")
    argv = [nsys, "profile", trace, GRAPH_NODES, *NO_SAMPLING, f"--output={output}", "--force-overwrite=true"]
    if duration_s is not None:
        argv += [f"--duration={max(1, round(duration_s))}", "--kill=none"]
    else:
        argv += [f"--capture-range={capture_range}", "--capture-range-end=stop", "--kill=none"]
        if nvtx_capture is not None:
            argv += [f"--nvtx-capture={nvtx_capture}", "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0"]
    if gpu_metrics:
        argv.append("--gpu-metrics-devices=all")
    return [*argv, *cmd]


def gpu_metrics_devices_command(*, nsys: str = NSYS) -> list[str]:
    """``nsys profile --gpu-metrics-devices=help``: lists the GPUs, and which are held."""
    return [nsys, "profile", "--gpu-metrics-devices=help"]


def help_command(command: str, *, nsys: str = NSYS) -> list[str]:
    return [nsys, command, "--help"]


def _require_cmd(cmd: Sequence[str]) -> None:
    if not cmd:
        raise ValueError("no command to run under nsys")


# -- running nsys --------------------------------------------------------------------------


def find_nsys(nsys: str = NSYS) -> str:
    """The nsys executable, or a ToolError saying how to get one: a name is looked up on
    PATH, a path (RANKSCOPE_NSYS, --nsys) taken as it is."""
    path = shutil.which(nsys)
    if path is not None:
        return path
    if os.sep in nsys:
        why = "is not executable" if os.path.isfile(nsys) else "does not exist"
        raise ToolError(f"nsys at {shown(nsys)} {why}: point RANKSCOPE_NSYS (or --nsys) at Nsight Systems' nsys")
    raise ToolError(f"nsys not found ({nsys!r} is not on PATH): install Nsight Systems or set RANKSCOPE_NSYS")


def run(argv: Sequence[str], *, timeout_s: float = COMMAND_TIMEOUT_S,
        cancelled: threading.Event | None = None) -> subprocess.CompletedProcess:
    """Run one nsys command; any failure is a ToolError naming the command and nsys's words.
    ``cancelled``, once set, kills the command within `CANCEL_POLL_S`, or keeps it from starting."""
    command = shlex.join(map(str, argv))  # quoted: a message's command runs as shown when pasted
    if cancelled is not None and cancelled.is_set():  # queued behind a cancel: starting it only to kill it
        raise ToolError(f"`{command}` was not started: the capture was cancelled")
    try:
        # its own process group: what nsys starts (an export's importer) is killed with it
        proc = subprocess.Popen(list(map(str, argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except FileNotFoundError:
        raise ToolError(f"nsys not found: `{command}` cannot run") from None
    deadline = time.monotonic() + timeout_s
    with proc:
        while True:
            try:
                # communicate may be called again after its timeout, with no output lost
                stdout, stderr = proc.communicate(timeout=max(0.0, min(CANCEL_POLL_S, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if cancelled is not None and cancelled.is_set():
                    why = "was stopped: the capture was cancelled"
                elif time.monotonic() >= deadline:
                    why = f"did not finish within {timeout_s:g} s"
                else:
                    continue
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise ToolError(f"`{command}` {why}") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if done.returncode != 0:
        raise ToolError(f"`{command}` failed (exit {done.returncode}): {_last_words(done)}")
    return done


def stop_leftover_exports(commands: Sequence[Sequence[str]]) -> None:
    """Kill what runs ``commands`` still, left by an agent killed mid-export: `run` starts each
    in its own session, so it outlived that agent, and would write the output beside ours.
    Found by argv (a wrapper script's interpreter may come first) in Linux's /proc; its whole
    process group goes, an export's importer with it."""
    wanted = {tuple(map(str, command[1:])) for command in commands}
    width = len(next(iter(wanted), ()))
    for pid, argv in _processes():
        if tuple(argv[-width:]) not in wanted:
            continue
        try:
            group = os.getpgid(pid)
            if group == os.getpgrp():  # never this agent's own group
                os.kill(pid, signal.SIGKILL)
            else:
                os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:  # ended meanwhile
            continue
        except PermissionError:  # another user's: not an agent of ours left it
            log.warning("`%s` (pid %d) writes this capture's export, but is not ours to stop", shlex.join(argv), pid)
            continue
        log.warning("stopped `%s` (pid %d), left running by an earlier agent", shlex.join(argv), pid)


def _processes() -> list[tuple[int, list[str]]]:
    """Each live process's pid and argv; a zombie's argv is empty."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:  # ended, or not ours to read
            continue
        if raw:
            found.append((int(entry.name), raw.decode(errors="replace").split("\0")[:-1]))
    return found


def _last_words(done: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
    return " | ".join(lines[-3:]) if lines else "no output"


def supports_nccl_trace(*, command: str = "profile", nsys: str = NSYS) -> bool:
    """Whether this nsys has advanced NCCL tracing (``--nccl-trace`` in its help)."""
    try:
        done = subprocess.run(help_command(command, nsys=nsys), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--nccl-trace" in done.stdout + done.stderr


def gpu_metrics_held(*, nsys: str = NSYS) -> bool:
    """Whether another tool holds the GPU counters: nsys lists such a GPU as ``Already under
    profiling`` (dcgm.md §7), e.g. a DCGM engine that was not (or could not be) paused."""
    try:
        done = subprocess.run(gpu_metrics_devices_command(nsys=nsys), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "already under profiling" in (done.stdout + done.stderr).lower()


def session_listed(session: str, *, nsys: str = NSYS) -> bool:
    """Whether ``nsys sessions list`` shows the session (as a whole word)."""
    try:
        out = run(sessions_list_command(nsys=nsys)).stdout
    except ToolError:
        return False
    return any(session in line.split() for line in out.splitlines())


# -- a rank's window (run by its wrapper) --------------------------------------------------


class SessionWindow:
    """A collection in a rank's own nsys session, started and stopped by the rank's wrapper
    (`rankscope rank`, the process that launched the session, as its user and in its
    container) when the agent asks through the spool (window.py). ``options``: the report's
    path, whether this rank samples the node's GPU metrics, the nsys commands' bound. Made
    ready by checking the counters (the sampler: a second or so), so that every rank's
    `nsys start` runs together."""

    def __init__(self, session: str, options: Mapping[str, Any], *, ended: Callable[[], bool], nsys: str = NSYS) -> None:
        self.session = session
        self.nsys = nsys
        self.ended = ended
        self.timeout_s = float(options.get("timeout_s", COMMAND_TIMEOUT_S))
        self.notes: list[str] = []
        if not options.get("output"):
            raise NoWindow("the capture named no report to write")
        self.report = Path(options["output"])
        self.counters = bool(options.get("gpu_metrics"))  # this rank samples the node's GPU metrics
        if self.counters and gpu_metrics_held(nsys=nsys):
            # Tracing does not need the counters; only the GPU-metrics sampler does (dcgm.md §6, §9.5).
            self.notes.append("GPU counters are held by another tool (DCGM not paused?): captured without GPU metrics")
            self.counters = False

    def start(self) -> None:
        if self.counters:
            self._start_sampler(self.report)
        else:
            self._start(start_command(self.session, self.report, nsys=self.nsys))

    def close(self, folder: Path) -> None:
        """Stop collecting: nsys writes the report. A rank that ended during the window has no
        session left to stop, but nsys wrote its report as the process ended."""
        if not self.ended():
            try:
                run(stop_command(self.session, nsys=self.nsys), timeout_s=self.timeout_s)
                return
            except ToolError as exc:
                if not self.ended():
                    raise ToolError(f"{exc}; {self._cancel()}") from None
        self.notes.append(ENDED)

    def _cancel(self) -> str:
        """End the collection a failed stop left open, dropping it: still recording, the
        sampler's session would hold the GPU counters once the agent resumed DCGM, and the
        trace would grow until the next window's start found it."""
        try:
            run(cancel_command(self.session, nsys=self.nsys), timeout_s=self.timeout_s)
        except ToolError as exc:
            return f"cancelling the collection failed too ({exc})"
        return "its collection was cancelled (nsys cancel): no report"

    def _start_sampler(self, report: Path) -> None:
        """Start the node's sampler with GPU metrics; where nsys cannot collect them (another
        profiler holds the counters, or this user may not read them: ERR_NVGPUCTRPERM),
        without, as the other ranks: the trace is what the capture is for, the metrics an extra."""
        try:
            self._start(start_command(self.session, report, nsys=self.nsys, gpu_metrics=True))
        except ToolError as exc:
            self._start(start_command(self.session, report, nsys=self.nsys))
            self.counters = False
            self.notes.append(f"captured without GPU metrics, which nsys could not collect ({exc})")

    def _start(self, argv: list[str]) -> None:
        """Start collecting; if that fails, stop a collection left open in the session (a
        window whose stop failed), and try once more."""
        try:
            run(argv, timeout_s=self.timeout_s)
        except ToolError as first:
            try:
                run(stop_command(self.session, nsys=self.nsys), timeout_s=self.timeout_s)
            except ToolError:
                raise first from None
            log.warning("stopped a collection left open in nsys session %s", self.session)
            run(argv, timeout_s=self.timeout_s)


ENDED = "ended during the window: exported what nsys recorded until then"


# -- the backend ---------------------------------------------------------------------------


class NsysBackend(CaptureBackend):
    """Have the node's announced ranks record in their nsys sessions, export each report to SQLite.

    Each rank's wrapper starts and stops its own session when asked (window.py), all at
    once: one after another, a node's last rank began (and ended) its window seconds after
    its first, and the collectives of those seconds, missing a rank, were dropped as
    incomplete. ``stop`` only ends the windows, so DCGM is resumed the moment they close
    (dcgm.md §9.7); the exports follow in ``export``, one ``nsys export`` process per
    report, as many at once as the agent has CPUs (its affinity, within any cgroup CPU limit)."""

    name = "nsys"
    options = frozenset({"gpu_metrics"})

    def __init__(self, *, nsys: str = NSYS, timeout_s: float = COMMAND_TIMEOUT_S, export_timeout_s: float = EXPORT_TIMEOUT_S,
                 report_wait_s: float = COMMAND_TIMEOUT_S, export_workers: int | None = None) -> None:
        super().__init__()
        self.nsys = nsys
        self.timeout_s = timeout_s
        self.export_timeout_s_each = export_timeout_s
        self.report_wait_s = report_wait_s
        self.export_workers = export_workers or cpus.usable()
        # The ranks each capture started: a rank that dies mid-capture drops out of the spool,
        # and must fail the capture rather than silently go missing from it.
        self._started: dict[str, list[RankInfo]] = {}
        self._counting: dict[str, bool] = {}  # capture -> whether a started rank reads the GPU counters

    def check(self, request: CaptureRequest) -> None:
        capture_options.check_flags(request.options)
        find_nsys(self.nsys)
        self.own_ranks(request)

    def needs_gpu_counters(self, request: CaptureRequest) -> bool:
        """Only the node's sampler (`gpu_metrics_sampler`) reads GPU metrics, where they are asked
        for: plain CUDA, NVTX and NCCL tracing reads no counters (dcgm.md §6), so DCGM is paused
        for nothing else (§9.2)."""
        return (capture_options.flag(request.options, "gpu_metrics", True)
                and gpu_metrics_sampler(self.own_ranks(request)) is not None)

    def start(self, request: CaptureRequest) -> float:
        """Every rank records, or none (a ToolError naming the ranks that could not)."""
        find_nsys(self.nsys)  # the exports need it here
        ranks = self.own_ranks(request)
        output.make_folder(reports_dir(request), shared=True)
        sampler = gpu_metrics_sampler(ranks) if self.needs_gpu_counters(request) else None
        replies = window.open_windows(request.sweep_id, ranks, request.duration_s + window.GRACE_S,
                                      self._start_wait_s(), all_or_none=True, start_at=request.start_at,
                                      cancelled=request.cancelled, options={
            r.key: {"output": str(report_base(request, r)), "gpu_metrics": r is sampler, "timeout_s": self.timeout_s}
            for r in ranks})
        failed = replies.failures()
        if failed:
            self._end(request, [rank for rank, _ in replies.done], ranks)
            raise ToolError(f"not every rank started recording{window.within(failed, self._start_wait_s())}: "
                            + "; ".join(window.reasons(failed, "no answer (is `rankscope rank` running it?)")))
        self._notes(replies)
        self._started[request.sweep_id] = list(ranks)
        self._counting[request.sweep_id] = bool(replies.counters)
        return replies.began

    def counters_held(self, request: CaptureRequest) -> bool:
        """Whether the sampler's window records GPU metrics, as its start reply said (it falls
        back to none where the counters are held or not its user's)."""
        return self._counting.get(request.sweep_id, self.needs_gpu_counters(request))

    def stop(self, request: CaptureRequest) -> list[Path]:
        """End every rank's window; the reports its ranks write, to ``export``. A rank whose
        process ended during the window wrote its report as it ended: it is exported like the
        others. The node's capture fails only where no rank stopped; otherwise the ranks that
        failed are noted and left out."""
        self._counting.pop(request.sweep_id, None)
        ranks = self._started.pop(request.sweep_id, None) or window.asked(request.sweep_id, self.own_ranks(request))
        if not ranks:
            raise ToolError(f"no rank of this node was asked to record for capture {request.sweep_id}")
        replies = window.end_windows(request.sweep_id, ranks, self._stop_wait_s())
        window.forget(request.sweep_id, ranks)
        self._notes(replies)
        for rank in replies.exited:
            self.note(f"rank {rank.rank}: {ENDED}")
        stopped = {id(rank) for rank, _ in replies.done} | {id(rank) for rank in replies.exited}
        errors = window.reasons(replies.failed, f"no answer within {self._stop_wait_s():g} s")
        return self._went_on([Path(f"{report_base(request, r)}{REPORT_SUFFIX}") for r in ranks if id(r) in stopped],
                             errors)

    def export(self, request: CaptureRequest, outputs: Sequence[Path]) -> list[Path]:
        """Export every report to SQLite, several at once (each is its own ``nsys export``
        process); the reports that fail are noted and left out, unless all do."""
        exe = find_nsys(self.nsys)
        stop_leftover_exports([export_command(Path(r), export_path(Path(r)), nsys=exe) for r in outputs])
        workers = max(1, min(len(outputs), self.export_workers))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nsys-export") as pool:
            done = list(pool.map(lambda report: self._export_or_error(exe, request, Path(report)), outputs))
        if request.cancelled.is_set():  # not a partial result to go on with: nobody waits for it
            raise ToolError(f"sweep {request.sweep_id}: exports stopped, the capture was cancelled")
        return self._went_on([r for r in done if isinstance(r, Path)], [r for r in done if isinstance(r, str)])

    def export_timeout_s(self, outputs: Sequence[Path]) -> float:
        """Each wave of exports waits for its reports, then exports them, each bounded."""
        waves = math.ceil(len(outputs) / max(1, self.export_workers))
        return waves * (self.report_wait_s + self.export_timeout_s_each)

    # internals

    def _start_wait_s(self) -> float:
        """A wrapper's start runs up to four nsys commands (start with and without GPU
        metrics, the stop and start again of a collection left open), each bounded."""
        return 4 * self.timeout_s + window.GRACE_S

    def _stop_wait_s(self) -> float:
        """A wrapper's stop runs one nsys command, bounded."""
        return self.timeout_s + window.GRACE_S

    def _end(self, request: CaptureRequest, started: Sequence[RankInfo], asked: Sequence[RankInfo]) -> None:
        """End the windows of a capture that failed to start: none is left recording, nor
        asked to."""
        replies = window.end_windows(request.sweep_id, started, self._stop_wait_s())
        for reason in window.reasons(replies.failed, "no answer"):
            log.warning("capture %s: could not end the window of %s", request.sweep_id, reason)
        window.forget(request.sweep_id, asked)

    def _notes(self, replies: window.Replies) -> None:
        for rank, notes in replies.done:
            for note in notes:
                self.note(f"rank {rank.rank}: {note}")

    def _went_on(self, done: list[Path], errors: list[str]) -> list[Path]:
        if errors and not done:
            raise ToolError("; ".join(errors))
        for error in errors:
            self.note(f"went on without {error}")
        return done

    def _export_or_error(self, exe: str, request: CaptureRequest, report: Path) -> Path | str:
        try:
            return self._export(exe, request, report)
        except ToolError as exc:
            return str(exc)

    def _export(self, exe: str, request: CaptureRequest, report: Path) -> Path:
        output = export_path(report)
        # Exported before an agent restart (a report kept for --upload-raw is exported again:
        # its export may be one a kill cut short).
        if output.exists() and not report.exists():
            return output
        self._wait_for_report(report, request.cancelled)
        free = shutil.disk_usage(request.workdir).free
        if free < max(MIN_FREE_BYTES, 2 * report.stat().st_size):
            raise ToolError(f"disk full: {free >> 20} MiB free in {shown(request.workdir)}, "
                            f"cannot export {shown(report.name)}")
        try:
            run(export_command(report, output, nsys=exe), timeout_s=self.export_timeout_s_each,
                cancelled=request.cancelled)
        except ToolError as exc:
            output.unlink(missing_ok=True)  # a killed export may leave half a database
            raise ToolError(f"{shown(report.name)}: {exc}") from None
        if not output.exists():
            raise ToolError(f"{shown(report.name)}: nsys export reported success but wrote no {shown(output)}")
        if not request.keep_outputs:
            report.unlink()  # the export is what we keep; reports are large
        return output

    def _wait_for_report(self, report: Path, cancelled: threading.Event) -> None:
        """nsys writes the report when the session stops; give it a bounded time to appear."""
        deadline = time.monotonic() + self.report_wait_s
        while not report.exists():
            if time.monotonic() > deadline:
                raise ToolError(f"{shown(report.name)}: nsys stopped the session but wrote no report "
                                f"within {self.report_wait_s:g} s")
            if cancelled.wait(0.1):
                raise ToolError(f"{shown(report.name)}: no longer waited for: the capture was cancelled")


def reports_dir(request: CaptureRequest) -> Path:
    """The capture's folder for its ranks' reports, open to every user (1777, as the spool):
    the ranks' nsys sessions write them as the job's user, the agent may run as another (root)."""
    return request.workdir / "reports"


def report_base(request: CaptureRequest, info: RankInfo) -> Path:
    """Where a rank's report goes (nsys adds ``.nsys-rep``). With its wrapper's pid: two jobs on
    a node each have a rank 0, whose reports, named alike, were written over each other."""
    return reports_dir(request) / f"{request.sweep_id}_{info.host}_rank{info.rank}_{info.pid}"
