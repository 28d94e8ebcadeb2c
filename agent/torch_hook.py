"""The PyTorch-profiler hook: record a ``torch.profiler`` window on demand, no script change.

``rankscope rank --backend torch -- python train.py`` runs the command with a
``sitecustomize`` on ``PYTHONPATH`` that installs this hook in the rank's Python process
(and only there: the hook removes its environment variable, so the rank's own
subprocesses start without it). The hook's daemon thread records the windows the agent's
torch backend asks for through the spool (window.py); a window's output is the Kineto
trace ``rank<R>.<key>.pt.trace.json`` in the capture's folder, written atomically.

A job that exits while a window is open ends the window there: the trace is still
written, before the interpreter shuts down.

The profiler records every thread (gloo's worker threads do the real work) with CPU
activity, and CUDA too where a GPU is present; where none is, the ops' input shapes too
(gloo's worker ops' sizes, matched to their calls' entries below). gloo events carry no
process group or sequence number (nccl-in-traces.md §4), so at stop the hook adds the
Flight Recorder's entries for the window — (PG, ``collective_seq_id``, op, creation time)
— to the trace's metadata; the Kineto ingest joins them to the ``c10d::`` calls by time.
The Flight Recorder is switched on through ``TORCH_FR_BUFFER_SIZE`` unless the user set it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rankscope import atomic
from rankscope.agent import window
from rankscope.agent.spool import RankInfo, announce, withdraw
from rankscope.agent.window import NoWindow

ENV = "RANKSCOPE_TORCH_HOOK"
FR_BUFFER = "20000"  # Flight Recorder entries kept per process (a ring buffer)
EXIT_WAIT_S = 120.0  # at exit, how long the job waits for an open window's trace to be written
SITECUSTOMIZE = """\
import importlib.machinery, importlib.util, os, sys
if os.environ.get("RANKSCOPE_TORCH_HOOK"):
    try:
        from rankscope.agent.torch_hook import install
        install()
    except Exception as exc:  # the job must run even when the hook cannot
        sys.stderr.write(f"rankscope: torch hook not installed in {sys.executable} ({exc}): the job runs unprofiled\\n")
# Python runs only the first sitecustomize on sys.path: run the one this file shadows
# (the user's, a virtualenv's or the distribution's), as if it had been found first.
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here])
if _spec is not None and _spec.loader is not None:
    _shadowed = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _shadowed
    _spec.loader.exec_module(_shadowed)
"""


def trace_name(rank: int, key: str) -> str:
    return f"rank{rank}.{key}.pt.trace.json"


def run(info: RankInfo, cmd: list[str], spool: Path) -> int:
    """Run ``cmd`` as one rank with the hook installed; announce it to the node's agent."""
    from rankscope.agent.rank import supervise

    spool = Path(spool)
    info = replace(info, backend="torch", session=str(spool), spool=str(spool))
    # This wrapper's own folder (0700), not one in the spool every job's user shares: the
    # first user's would shut the others out, and code there runs in every rank that reads it.
    boot = Path(tempfile.mkdtemp(prefix="rankscope-hook-"))
    try:
        atomic.write_text(boot / "sitecustomize.py", SITECUSTOMIZE)
        os.environ[ENV] = json.dumps(asdict(info))
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), os.environ.get("PYTHONPATH", "")) if p)
        announce(spool, info)
        try:
            return supervise(cmd)
        finally:
            withdraw(spool, info)
    finally:
        shutil.rmtree(boot, ignore_errors=True)


def install() -> None:
    """Start the hook's watcher thread in this process (called from sitecustomize)."""
    info = RankInfo(**json.loads(os.environ.pop(ENV)))
    watcher = window.Watcher(Path(info.spool), info.key, lambda folder, options: _Window(info))
    watcher.start()
    # Registered first, so it runs after the job's own exit handlers, while the interpreter
    # still works: a daemon thread caught inside torch's C++ code by finalization aborts the
    # process (pytorch/pytorch#38228), and a profiler left running crashes it at exit.
    atexit.register(watcher.close, EXIT_WAIT_S)


class _Window:
    """One profiler window, made ready, started and ended on the hook's thread (Kineto
    requires one thread). Its activity tracing reads no GPU counters.

    A process has one Kineto session: the job's own ``torch.profiler`` and ours cannot
    overlap. So no window starts while the job's profiler records, and where the job starts
    one during the window (it takes the session over), ours is abandoned: stopping or
    exporting a session taken over crashes the process (torch 2.13, SIGSEGV), and the job's
    own profile must come out unharmed."""

    def __init__(self, info: RankInfo) -> None:
        import torch
        import torch.autograd.profiler as autograd_profiler
        from torch.profiler import ProfilerActivity, profile

        self._autograd_profiler = autograd_profiler
        self._refuse_beside_the_jobs_own()
        self.info = info
        self.torch = torch
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        # The hook's thread is not the training thread: record all threads.
        config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
        # Without a GPU (gloo on CPU) the ingest pairs gloo's worker ops with their calls by
        # order, and their input shapes tell calls of one op apart where workers took them
        # up together; with a GPU, NCCL kernels link to their calls by id: no shapes needed.
        shapes = not torch.cuda.is_available()
        self.profiler = profile(activities=activities, record_shapes=shapes, experimental_config=config)
        # What a first profiler start imports (torch 2.13: torch._inductor, for its CUDA-graph
        # setting; 1 to 2.5 s), imported now, so that `start` is quick and the node's ranks
        # begin together.
        with contextlib.suppress(ImportError):
            importlib.import_module("torch._inductor.config")
        self.notes: list[str] = []
        self.counters = False
        self.taken_over = False

    def start(self) -> None:
        self._refuse_beside_the_jobs_own()  # the job may have started its own since
        self.started_ns = time.time_ns()
        self.profiler.start()
        self._watch_takeover(self._autograd_profiler.profile)

    def _refuse_beside_the_jobs_own(self) -> None:
        if getattr(self._autograd_profiler, "_is_profiler_enabled", False):
            raise NoWindow("the job's own torch.profiler is recording: a second one would end it, "
                           "so this rank records no window")

    def _watch_takeover(self, session_class: type) -> None:
        """Note any profiler the job starts until `close` (each starts through ``_start_trace``)."""
        original = session_class._start_trace

        def start_trace(profiler, *args, **kwargs):
            self.taken_over = True
            return original(profiler, *args, **kwargs)

        session_class._start_trace = start_trace
        self._unwatch = lambda: setattr(session_class, "_start_trace", original)

    def close(self, folder: Path) -> None:
        """Stop the profiler and write its trace, with rankscope's metadata, into ``folder``."""
        self._unwatch()
        if self.taken_over:
            raise NoWindow("the job started its own torch.profiler during the window, which ends "
                           "rankscope's recording: no trace from this rank (the job's own profile is unharmed)")
        try:
            meta = {
                "rank": self.info.rank,
                "local_rank": self.info.local_rank,
                "world_size": self.info.world_size,
                "host": self.info.host,
                "job_id": self.info.job_id,
                "gpu": self.info.gpu,
                "torch": self.torch.__version__,
                "flight_recorder": _flight_recorder(self.started_ns),
            }
            self.profiler.add_metadata_json("rankscope", json.dumps(meta))
        finally:  # whatever went wrong gathering it, no profiler is left running in the job
            self.profiler.stop()
        with atomic.replacing(folder / trace_name(self.info.rank, self.info.key)) as tmp:  # not .gz: Kineto writes it plain
            self.profiler.export_chrome_trace(str(tmp))


def _flight_recorder(since_ns: int) -> dict[str, Any] | None:
    """Flight Recorder entries created since ``since_ns``: columns + rows, or None."""
    from torch._C import _distributed_c10d as c10d

    dump = getattr(c10d, "_dump_fr_trace_json", None)
    if dump is None:
        return None
    try:
        entries = json.loads(dump()).get("entries", [])
    except Exception:  # no process group, or the recorder is off
        return None
    columns = ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes", "out_bytes"]
    rows = [
        [e["process_group"][0], e["p2p_seq_id"] if e.get("is_p2p") else e["collective_seq_id"],
         e.get("profiling_name"), e["time_created_ns"], bool(e.get("is_p2p")), _bytes(e, "input"), _bytes(e, "output")]
        for e in entries
        if e.get("time_created_ns", 0) >= since_ns
    ]
    return {"columns": columns, "rows": rows, "evicted_before_ns": _evicted_before(entries, since_ns)}


def _evicted_before(entries: list[dict], since_ns: int) -> int | None:
    """Where the ring (TORCH_FR_BUFFER_SIZE entries) dropped entries of the window: the
    creation time of its oldest entry left, before which the window's calls lost theirs.
    ``record_id`` counts every entry ever made, so an oldest one above 0 means entries were
    dropped; they were the window's where that oldest one is in the window too."""
    oldest = min(entries, key=lambda e: e.get("record_id", 0), default=None)
    if oldest is None or not oldest.get("record_id") or oldest.get("time_created_ns", 0) < since_ns:
        return None
    return oldest["time_created_ns"]


def _bytes(entry: dict, side: str) -> int | None:
    """Total size of the entry's ``side`` ("input" or "output") tensors, as PyTorch's
    record_param_comms counts a call (a coalesced one: all its tensors)."""
    import math

    import torch

    sizes, dtypes = entry.get(f"{side}_sizes") or [], entry.get(f"{side}_dtypes") or []
    kinds = [getattr(torch, str(name).lower(), None) for name in dtypes]
    if not sizes or len(kinds) != len(sizes) or not all(isinstance(k, torch.dtype) for k in kinds):
        return None
    return sum(math.prod(int(dim) for dim in shape) * kind.itemsize for shape, kind in zip(sizes, kinds))


