"""`rankscope rank -- CMD...`: run one rank of a job where the node's agent can profile it.

Users put it in their launch line after the launcher (``srun rankscope rank -- python
train.py``, torchrun's ``--no-python``, a pod's command). It reads the rank's identity
from the launcher's environment, runs CMD inside its own nsys interactive session,
announces the rank in the spool folder, starts and stops captures in that session when
the node's agent asks (window.py: no restart of the job, and nsys driven by the user and
container that launched it), forwards signals, and exits with CMD's exit code. One-shot mode
(``--one-shot``) runs CMD under ``nsys profile`` for short jobs instead.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

from rankscope.agent import nsys, window
from rankscope.agent.spool import DEFAULT_SPOOL, RankInfo, announce, new_token, ranks_dir, withdraw
from rankscope import output
from rankscope.cli import parse_duration, parse_path
from rankscope.errors import CommandError, InputError, RankscopeError, ToolError, shown
from rankscope.lock import FolderInUse, FolderLock
from rankscope.launchers import JOB_ENV, LOCAL_RANK_ENV, RANK_ENV, WORLD_SIZE_ENV, job_id, starts_ranks

log = logging.getLogger(__name__)

# The same variables, in the same order, as the nsys ingest reads back from a report's
# captured environment, so the rank announced here is the rank the digest says.
JOB_ID_VARS = ("RANKSCOPE_JOB_ID", *JOB_ENV)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SESSION_WAIT_S = 30.0  # how long nsys may take to list a freshly launched session


# The nsys options' defaults: under --backend torch, one set otherwise was given for nothing.
_NSYS_DEFAULTS = {"nsys": nsys.NSYS, "trace": ",".join(nsys.DEFAULT_TRACE), "nccl_trace": "legacy"}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rank", help="run one rank under nsys (or the torch hook) so the node agent can profile it",
        description="Run CMD as one rank of a job, inside an nsys interactive session this wrapper "
                    "starts and stops when the node's agent asks. Rank identity comes from the launcher's "
                    "environment (torchrun, Slurm, Open MPI, PMI). Under nsys, CMD runs only where nsys "
                    "does: without it the command fails before CMD starts (--backend torch needs none). "
                    "Exit status: CMD's, or 1 and 2 for rankscope's own errors.",
    )
    parser.add_argument("--backend", choices=("nsys", "torch"), default="nsys",
                        help="profiler the rank runs under (default: nsys)")
    parser.add_argument("--spool", type=parse_path, default=DEFAULT_SPOOL,
                        help=f"the node agent's spool folder (default: {DEFAULT_SPOOL})")
    parser.add_argument("--nsys", default=_NSYS_DEFAULTS["nsys"], help="nsys executable (default: $RANKSCOPE_NSYS, else nsys on PATH)")
    parser.add_argument("--trace", default=_NSYS_DEFAULTS["trace"], metavar="LIST",
                        help="nsys --trace kinds (default: %(default)s)")
    parser.add_argument("--nccl-trace", choices=nsys.NCCL_MODES, default=_NSYS_DEFAULTS["nccl_trace"],
                        help="NCCL tracing: legacy = NCCL's NVTX ranges (what rankscope reads; default), "
                             "advanced = nsys -t nccl, auto = advanced where this nsys has it")
    parser.add_argument("--one-shot", action="store_true",
                        help="profile once with `nsys profile` instead of an on-demand session")
    parser.add_argument("--duration", type=parse_duration, default=None, metavar="DURATION",
                        help="one-shot: how long to collect (20s, 500ms, 2m, or seconds)")
    parser.add_argument("--capture-range", choices=("cudaProfilerApi", "nvtx"), default=None,
                        help="one-shot: collect inside this capture range instead of a duration")
    parser.add_argument("--nvtx-capture", default=None, metavar="RANGE@DOMAIN",
                        help="one-shot with --capture-range nvtx: the NVTX range that opens the capture")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the rank's command")
    parser.set_defaults(func=run)


def _check_options_apply(args: argparse.Namespace) -> None:
    """An option the chosen mode would ignore is a mistake to name, not to drop: a rank
    started for a one-shot profile must not run unprofiled until an agent happens to capture."""
    if not args.one_shot:
        given = [flag for flag, value in (("--duration", args.duration), ("--capture-range", args.capture_range),
                                          ("--nvtx-capture", args.nvtx_capture)) if value is not None]
        if given:
            raise InputError(f"{given[0]} is for --one-shot: without it the rank records only when the node's "
                             "agent captures (`rankscope capture --duration`)")
    if args.backend == "torch":
        given = (["--one-shot"] if args.one_shot else []) + [
            f"--{name.replace('_', '-')}" for name, default in _NSYS_DEFAULTS.items() if getattr(args, name) != default]
        if given:
            raise InputError(f"{given[0]} is for --backend nsys: the torch hook records only when the node's "
                             "agent captures, with the PyTorch profiler")


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    if not cmd:
        raise InputError("no command: usage `rankscope rank [options] -- CMD...`")
    _check_options_apply(args)
    if args.one_shot and (args.duration is None) == (args.capture_range is None):
        raise InputError("--one-shot needs exactly one of --duration SECONDS or --capture-range")
    if (args.capture_range == "nvtx") != (args.nvtx_capture is not None):
        raise InputError("--capture-range nvtx needs --nvtx-capture RANGE@DOMAIN (and only it takes one)")
    # Else nsys is handed them as they are, and runs CMD without ever capturing, or not at all.
    if args.nvtx_capture is not None and not all(part.strip() for part in args.nvtx_capture.split("@", 1)):
        raise InputError(f"--nvtx-capture {args.nvtx_capture!r} is not RANGE or RANGE@DOMAIN")
    kinds = [kind.strip() for kind in args.trace.split(",") if kind.strip()]
    if not kinds:
        raise InputError(f"--trace {args.trace!r} names no trace kind (default: {_NSYS_DEFAULTS['trace']})")
    launcher = starts_ranks(cmd)
    if args.backend == "torch" and launcher:
        # The hook lives in the process it starts (and not in that process's children).
        raise InputError(f"--backend torch profiles the Python process it runs, and {launcher} starts the ranks "
                         "as its children: put the wrapper inside the launcher, e.g. `torchrun ... --no-python "
                         "rankscope rank --backend torch -- python train.py`")
    if launcher:  # nsys follows the launcher's children, so this works, but as one "rank"
        log.warning("%s starts the ranks: they share this one nsys session and announcement (rank identities "
                    "come from each process's trace); one wrapper per rank, inside the launcher, is what "
                    "the agent expects: `torchrun ... --no-python rankscope rank -- python train.py`", launcher)
    info = rank_info(os.environ, pid=os.getpid(), backend=args.backend)
    # Shared by every job's user on the node (a folder made 0755 here would shut the others
    # out); the ranks folder checked before CMD starts: announcing it comes too late to fail.
    output.make_folder(args.spool, shared=True)
    output.make_folder(ranks_dir(args.spool), shared=True)
    if args.backend == "torch":
        from rankscope.agent import torch_hook  # provided with the torch backend

        return int(torch_hook.run(info, cmd, args.spool))
    exe = nsys.find_nsys(args.nsys)
    nccl = args.nccl_trace
    supported = nccl != "legacy" and nsys.supports_nccl_trace(
        command="profile" if args.one_shot else "launch", nsys=exe)
    trace = nsys.trace_flag(kinds, nccl, nccl_supported=supported)
    if args.one_shot:
        return run_one_shot(info, cmd, args, exe, trace)
    session = nsys.session_name(info.job_id, info.rank, info.pid)
    info = RankInfo(**{**info.__dict__, "session": session})
    apart = _env_changes_folder()
    if not apart:
        log.warning("this system's env has no --chdir: nsys runs in the job's folder, and leaves an empty "
                    "report<N>.nsys-rep there where no capture reaches this rank")
    argv = nsys.launch_command(session, in_folder(_job_folder(), cmd) if apart else cmd, trace=trace, nsys=exe)
    log.info("rank %d: %s", info.rank, shlex.join(argv))
    with _launch_folder(args.spool, session) if apart else nullcontext() as folder:
        return run_in_session(argv, info, args.spool, exe, cwd=folder)


# nsys writes a session that never collected (its application ended before any `start`) as "a
# fully formed .nsys-rep file containing no data" in its default place, report<N>.nsys-rep in its
# working folder (User Guide, interactive CLI): for every rank no capture reached, in the job's
# folder, where ranks sharing one would also write the same file. `nsys launch` runs in a folder
# of the spool instead, and the application in the job's, through coreutils' `env --chdir`: it
# changes folder and replaces itself with the application (one process, as --wait=primary counts
# them), leaves the environment as it was (a shell would set OLDPWD, SHLVL or _), and exits 127
# or 126 where the application cannot be run, as a shell does.


def in_folder(folder: str, cmd: Sequence[str]) -> list[str]:
    """``cmd`` run in ``folder``, as the same process."""
    return ["env", f"--chdir={folder}", "--", *cmd]


@functools.cache
def _env_changes_folder() -> bool:
    """Whether this system's `env` has --chdir (coreutils 8.28, 2017; not BusyBox's)."""
    try:
        return subprocess.run(in_folder("/", ["true"]), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _job_folder() -> str:
    """The folder the rank was started in, as its shell names it ($PWD, links kept) where
    that is still this folder."""
    try:
        here = os.getcwd()
    except OSError as exc:
        raise InputError(f"the working folder is gone ({exc.strerror or exc})") from None
    named = os.environ.get("PWD", "")
    try:
        return named if named and os.path.samefile(named, here) else here
    except OSError:
        return here


@contextmanager
def _launch_folder(spool: Path, session: str) -> Iterator[Path]:
    """`nsys launch`'s working folder for this rank, removed (with what nsys left in it) once
    the rank has ended."""
    folder = output.make_folder(spool / "launch", shared=True) / session
    folder.mkdir(exist_ok=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def rank_info(environ: Mapping[str, str], *, pid: int, backend: str = "nsys") -> RankInfo:
    """Who this rank is, from the launcher's environment (a lone process is rank 0 of 1)."""
    rank = _int_var(environ, RANK_ENV, 0)
    world = _int_var(environ, WORLD_SIZE_ENV, max(rank + 1, 1))
    local = _int_var(environ, LOCAL_RANK_ENV, None)
    if local is None:
        if world > 1:
            log.warning("no local rank in the environment (%s): assuming 0", ", ".join(LOCAL_RANK_ENV))
        local = 0
    if not 0 <= rank < world:
        raise InputError(f"rank {rank} is outside a world of {world} (check {', '.join(RANK_ENV)})")
    return RankInfo(rank=rank, local_rank=local, world_size=world, pid=pid, host=socket.gethostname(),
                    job_id=job_id(environ, JOB_ID_VARS) or "", gpu=_gpu(environ, local), backend=backend,
                    token=new_token(pid), protocol=window.PROTOCOL)


def _int_var(environ: Mapping[str, str], names: Sequence[str], default: int | None) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            try:
                number = int(value)
            except ValueError:
                raise InputError(f"{name}={value!r} is not an integer") from None
            if not -(2**31) <= number < 2**31:  # the wire's int32: the agent could not register the rank
                raise InputError(f"{name}={value!r} is beyond any rank or world size (int32)")
            return number
    return default


def _gpu(environ: Mapping[str, str], local_rank: int) -> str:
    """The rank's GPU as the launcher exposed it: its own entry of CUDA_VISIBLE_DEVICES when the
    launcher left every GPU visible (torchrun), the only entry when it narrowed them (Slurm)."""
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if len(visible) == 1:
        return visible[0]
    if local_rank < len(visible):
        return visible[local_rank]
    return ""


def supervise(argv: Sequence[str], started: Callable[[subprocess.Popen], object] | None = None, *,
              cwd: Path | None = None) -> int:
    """Run ``argv`` (in ``cwd``) forwarding the launcher's signals to it; its exit code (128+N if
    killed by N)."""
    try:
        child = subprocess.Popen(list(argv), cwd=cwd)
    except OSError as exc:
        raise CommandError(f"cannot run the command ({exc.strerror or exc})", path=argv[0],
                           exit_code=126 if isinstance(exc, PermissionError) else 127) from None
    previous = {sig: signal.signal(sig, lambda signum, frame: _forward(child, signum))
                for sig in FORWARDED_SIGNALS}
    try:
        if started is not None:
            started(child)
        return _exit_code(child.wait())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if child.poll() is None:
            child.kill()
            child.wait()


def run_in_session(argv: Sequence[str], info: RankInfo, spool: Path, exe: str, *, cwd: Path | None = None) -> int:
    """nsys launch (in ``cwd``); announce the rank once its session is listed, and record
    the windows the node's agent asks of it in that session; withdraw when it ends."""
    watching: list[window.Watcher] = []

    def started(child: subprocess.Popen) -> None:
        if not _wait_for_session(child, info.session, exe):
            return
        watcher = window.Watcher(spool, info.key, lambda folder, options: nsys.SessionWindow(
            info.session, options, ended=lambda: child.poll() is not None, nsys=exe))
        announce(spool, info)
        watcher.start()
        watching.append(watcher)

    try:
        return supervise(argv, started, cwd=cwd)
    finally:
        for watcher in watching:  # a window still open: say the rank ended in it
            watcher.close(nsys.COMMAND_TIMEOUT_S)
        withdraw(spool, info)


def _wait_for_session(child: subprocess.Popen, session: str, exe: str) -> bool:
    deadline = time.monotonic() + SESSION_WAIT_S
    while child.poll() is None:
        if nsys.session_listed(session, nsys=exe):
            return True
        if time.monotonic() > deadline:
            log.warning("nsys session %s not listed after %g s: announcing anyway", session, SESSION_WAIT_S)
            return True
        time.sleep(0.1)
    return False  # CMD already ended: nothing to announce


def _claim_sampler(spool: Path) -> bool:
    """Whether this process takes the node's GPU-metrics sampler role: one sampler per node
    (nsys-export.md §10), and a node shared by two jobs has two local rank 0s, which may start
    together, before either's sampling shows to the other's check. The role is an flock held
    for the process's life (never released: the kernel drops it however the process ends)."""
    try:
        FolderLock(spool / "gpu-metrics", "GPU-metrics sampler", shared=True).acquire()
    except FolderInUse:
        log.warning("another rank samples this node's GPU metrics: profiling without them")
        return False
    except RankscopeError as exc:  # the lock cannot be made here: sample, as every local rank 0 did
        log.warning("%s: sampling GPU metrics, unable to tell whether another rank does", exc)
    return True


def _forward(child: subprocess.Popen, signum: int) -> None:
    if child.poll() is None:
        child.send_signal(signum)


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run_one_shot(info: RankInfo, cmd: Sequence[str], args: argparse.Namespace, exe: str, trace: str) -> int:
    """``nsys profile`` for the whole run, then the SQLite export beside the report in the spool."""
    folder = output.make_folder(args.spool / "reports", shared=True)
    base = folder / f"{nsys.session_name(info.job_id, info.rank, info.pid)}"
    gpu_metrics = info.local_rank == 0 and _claim_sampler(args.spool)
    if gpu_metrics and nsys.gpu_metrics_held(nsys=exe):
        # No agent paused DCGM here: sampling beside it would fight it for the counters (dcgm.md §9.5).
        log.warning("GPU counters are held by another tool (DCGM?): profiling without GPU metrics")
        gpu_metrics = False
    argv = nsys.profile_command(cmd, base, trace=trace, duration_s=args.duration,
                                capture_range=args.capture_range, nvtx_capture=args.nvtx_capture,
                                gpu_metrics=gpu_metrics, nsys=exe)
    log.info("rank %d: %s", info.rank, shlex.join(map(str, argv)))
    code = supervise(argv)
    report = Path(f"{base}{nsys.REPORT_SUFFIX}")
    if not report.exists():
        log.warning("nsys profile wrote no report at %s", shown(report))
        return code
    try:
        nsys.run(nsys.export_command(report, Path(f"{base}.sqlite"), nsys=exe), timeout_s=nsys.EXPORT_TIMEOUT_S)
    except ToolError as exc:  # the rank's own exit code stands: its run went as it went
        log.warning("rank %d: the report %s was not exported: %s", info.rank, shown(report), exc)
    return code
