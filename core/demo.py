"""`rankscope demo`: the whole product on one machine with no GPU, in under two minutes.

It starts a coordinator (SQLite state, local artifact store) and two agents acting as
two nodes, launches a real PyTorch job (gloo collectives on CPU, 2 nodes x 4 ranks) in
which one rank does extra compute, each rank under ``rankscope rank --backend torch``,
captures it through the coordinator like any sweep, and prints the report naming the
slow rank and where the full report lies. Every process it starts is stopped on exit.

The job itself is this module run as ``python -m rankscope.demo``: a data-parallel loop
of fixed-time compute then an all_reduce of the gradients, ending when a stop file
appears (agreed by all ranks every few steps through a tiny all_reduce, so none is
left waiting).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from rankscope import output
from rankscope.cli import parse_count, parse_duration, parse_path
from rankscope.errors import InputError, RankscopeError, ToolError, shown

DEFAULT_RANKS_PER_NODE = 4
MIN_RANKS_PER_NODE = 2  # 4 ranks: naming a straggler needs 3+ (analysis.stragglers.not_judged)
GRAD_ELEMENTS = 1 << 16  # 256 KiB of float32 gradients per step
STOP_EVERY = 10  # steps between the ranks' agreement on stopping (one tiny all_reduce)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the whole product locally: coordinator, two agents, a real PyTorch job",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--workdir", type=parse_path, default=None, help="keep everything here (default: a temp folder)")
    parser.add_argument("--ranks-per-node", type=_ranks_per_node(), default=DEFAULT_RANKS_PER_NODE,
                        help=f"ranks on each of the two nodes (default {DEFAULT_RANKS_PER_NODE}; at least "
                             f"{MIN_RANKS_PER_NODE}, as naming a straggler needs 3+ ranks; at most this "
                             f"machine's CPUs, or {DEFAULT_RANKS_PER_NODE} where it has fewer)")
    parser.add_argument("--slow-rank", type=int, default=None,
                        help="the rank given extra compute (default: the second rank of the second node)")
    parser.add_argument("--duration", type=parse_duration, default=4.0, help="capture window (default 4 s)")
    parser.set_defaults(func=run)


def _ranks_per_node() -> Callable[[str], int]:
    """--ranks-per-node's type: at most the machine's CPUs (or the default, which a 2-core
    machine runs): each rank is a PyTorch process, under its `rankscope rank` wrapper,
    started at once with cold imports, and a typo would fork thousands. At least 2: with one
    rank a node the job's 2 ranks are too few to name a straggler, and the demo could only fail."""
    cpus = os.cpu_count() or 1
    return parse_count(MIN_RANKS_PER_NODE, max(DEFAULT_RANKS_PER_NODE, cpus),
                       f"naming a straggler needs 3+ ranks; this machine has {cpus} CPUs, each rank a PyTorch process")


def _terminated(signum: int, frame) -> None:
    # SIGTERM (a CI timeout, `kill`) ends the demo the way Ctrl-C does: its processes are stopped.
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    per_node = args.ranks_per_node
    world = len(NODES) * per_node
    slow = min(per_node + 1, world - 1) if args.slow_rank is None else args.slow_rank
    if not 0 <= slow < world:
        raise InputError(f"--slow-rank {slow} is not a rank of the {world}-rank job")
    signal.signal(signal.SIGTERM, _terminated)
    workdir = output.make_folder(Path(args.workdir or tempfile.mkdtemp(prefix="rankscope-demo-")).resolve())
    started = time.monotonic()
    with _Processes(workdir) as procs:
        _say(started, f"work folder {shown(workdir)}")
        address = procs.coordinator()
        _say(started, f"coordinator on {address} (SQLite state and artifacts in {shown(workdir / 'coordinator')})")
        for name in NODES:
            procs.agent(name, address)
        _say(started, f"agents {', '.join(NODES)} started (one per simulated node, --backend torch; both on "
                      f"this machine, so the report shows one host sharing one clock)")
        procs.job(per_node, slow)
        _say(started, f"PyTorch job: {world} ranks (gloo, {len(NODES)} nodes x {per_node}), rank {slow} computes "
                      f"{EXTRA_MS:g} ms more per step; each rank under `rankscope rank --backend torch`")
        procs.wait_ready(world)
        _say(started, "job running; capturing through the coordinator")
        reply = _sweep(address, args.duration, started, on_captured=procs.end_job)
        procs.stop_job()
    from rankscope.analysis.report import Report

    report = Report.from_dict(json.loads(reply.report_json))
    print(report.render_table())
    verdict = (f"rankscope named rank {report.stragglers[0]} as the straggler (the demo slowed rank {slow})"
               if report.stragglers == [slow] else
               f"rankscope flagged {report.stragglers or 'no rank'}; the demo slowed rank {slow}")
    print(f"\n{verdict}\nfull report: {reply.path}\ndone in {time.monotonic() - started:.0f} s")
    return 0 if report.stragglers == [slow] else 1


NODES = ("node-a", "node-b")
EXTRA_MS = 50.0  # well above the scheduling noise of 8 processes on a small shared machine
START_S = 120.0  # cold imports of torch/pyarrow/grpc in many processes on a small machine


def _say(started: float, text: str) -> None:
    print(f"[{time.monotonic() - started:5.1f}s] {text}", file=sys.stderr, flush=True)


def _sweep(address: str, duration: float, started: float, on_captured) -> object:
    """Run one torch sweep on both nodes; ``on_captured`` once no node is capturing any more."""
    from rankscope.coordinator.client import SweepClient, node_progress
    from rankscope.proto.v1 import rankscope_pb2 as pb

    with SweepClient(address) as client:
        deadline = time.monotonic() + START_S
        while True:  # the agents may still be dialling in
            try:
                sweep = client.start(nodes=NODES, duration_s=duration, backend="torch")
                break
            except RankscopeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        _say(started, f"sweep {sweep.sweep_id}: {duration:g} s window on {', '.join(NODES)}")
        seen: dict[str, int] = {}
        final = None
        windows = {pb.NODE_STATE_PENDING, pb.NODE_STATE_PAUSING_DCGM, pb.NODE_STATE_CAPTURING}
        for event in client.watch(sweep.sweep_id):
            final = event.sweep
            for node in final.nodes:  # every node at first, then the one that changed
                if seen.get(node.node) != node.state:
                    seen[node.node] = node.state
                    _say(started, f"  {node.node}: {' '.join(node_progress(node))}".rstrip())
            if not any(state in windows for state in seen.values()):
                on_captured()  # the job is no longer needed: its CPU goes to the digests
        if final is None or final.state == pb.SWEEP_STATE_FAILED:
            raise ToolError(f"sweep {sweep.sweep_id} failed: {final.error if final else 'no news'}")
        return client.report(sweep.sweep_id)


class _Processes:
    """Every process the demo starts, each in its own process group, all stopped on exit."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.ranks: list[subprocess.Popen] = []
        self.logs = workdir / "logs"
        self.logs.mkdir(exist_ok=True)
        self.stop_file = workdir / "stop"
        self.ready = workdir / "ready"
        self.stop_file.unlink(missing_ok=True)
        shutil.rmtree(self.ready, ignore_errors=True)

    def __enter__(self) -> _Processes:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc) -> None:
        if exc_type is None:
            self.stop_job()
        # On a failure or Ctrl-C the job is stopped with the rest: asked to end, ranks still
        # starting would not read the stop file for seconds.
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.logs / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.procs.append(proc)
        return proc

    def coordinator(self) -> str:
        port_file = self.workdir / "coordinator.port"
        port_file.unlink(missing_ok=True)
        proc = self.spawn("coordinator", [*RANKSCOPE, "coordinator", "--listen", "127.0.0.1:0", "--data-dir",
                                          str(self.workdir / "coordinator"), "--port-file", str(port_file)])
        deadline = time.monotonic() + START_S
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ToolError(f"the coordinator did not start: see {shown(self.logs / 'coordinator.log')}")
            time.sleep(0.1)
        return f"127.0.0.1:{int(port_file.read_text())}"

    def agent(self, name: str, address: str) -> None:
        self.spawn(f"agent-{name}", [*RANKSCOPE, "agent", "--coordinator", address, "--name", name, "--backend",
                                     "torch", "--spool", str(self.spool(name)), "--work-dir",
                                     str(self.workdir / f"work-{name}"), "--dcgm", "none", "--max-backoff", "1"])

    def spool(self, node: str) -> Path:
        return self.workdir / f"spool-{node}"

    def job(self, per_node: int, slow: int) -> None:
        port = _free_port()
        world = len(NODES) * per_node
        for index, node in enumerate(NODES):
            for local in range(per_node):
                rank = index * per_node + local
                env = {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANKSCOPE_JOB_ID": "demo"}
                self.ranks.append(self.spawn(f"rank{rank}", [
                    *RANKSCOPE, "rank", "--backend", "torch", "--spool", str(self.spool(node)), "--",
                    sys.executable, "-m", "rankscope.demo", "--stop-file", str(self.stop_file),
                    "--ready-dir", str(self.ready), "--slow-rank", str(slow), "--extra-ms", str(EXTRA_MS),
                    "--max-seconds", "600"], env))

    def wait_ready(self, world: int) -> None:
        deadline = time.monotonic() + START_S
        while len(list(self.ready.glob("*"))) < world:
            dead = [i for i, p in enumerate(self.ranks) if p.poll() is not None]
            if dead:
                raise ToolError(f"rank {dead[0]} of the demo job exited: see {shown(self.logs / f'rank{dead[0]}.log')}")
            if time.monotonic() > deadline:
                raise ToolError(f"the demo job did not start within {START_S:g} s: see {shown(self.logs)}")
            time.sleep(0.2)

    def end_job(self) -> None:
        """Ask the job to end (it agrees on the step through an all_reduce); do not wait."""
        self.stop_file.touch()

    def stop_job(self) -> None:
        if not self.ranks:
            return
        self.end_job()
        for proc in self.ranks:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.ranks = []


RANKSCOPE = [sys.executable, "-m", "rankscope"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job(argv: list[str] | None = None) -> int:
    """One rank of the demo job; identity from the launcher's RANK/WORLD_SIZE/MASTER_* env."""
    parser = argparse.ArgumentParser(prog="python -m rankscope.demo")
    parser.add_argument("--stop-file", type=Path, required=True, help="the job ends once this file exists")
    parser.add_argument("--compute-ms", type=float, default=20.0, help="compute per step, every rank")
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank computes longer (-1: none)")
    parser.add_argument("--extra-ms", type=float, default=30.0, help="the slow rank's extra compute per step")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="end anyway after this long")
    parser.add_argument("--ready-dir", type=Path, default=None, help="touch <dir>/<rank> once collectives run")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    grads = torch.ones(GRAD_ELEMENTS)
    weights = torch.randn(256, 256) / 256**0.5  # ~0.5 ms a matmul on an idle core: few events a step, a small trace
    compute_s = args.compute_ms / 1e3 + (args.extra_ms / 1e3 if rank == args.slow_rank else 0.0)
    deadline = time.monotonic() + args.max_seconds
    stop = torch.zeros(1)
    dist.all_reduce(stop)
    if args.ready_dir is not None:
        args.ready_dir.mkdir(parents=True, exist_ok=True)
        (args.ready_dir / str(rank)).touch()
    step = 0
    while True:
        _busy(weights, compute_s)
        dist.all_reduce(grads)
        grads.fill_(1.0)
        step += 1
        if step % STOP_EVERY:
            continue
        stop.fill_(float(args.stop_file.exists() or time.monotonic() > deadline))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
    dist.destroy_process_group()
    return 0


def _busy(weights, seconds: float) -> None:
    """Compute for a fixed wall time, so the imbalance does not depend on CPU contention."""
    end = time.perf_counter() + seconds
    x = weights
    while time.perf_counter() < end:
        x = (x @ weights).tanh_()


def _exit_skipping_teardown(code: int) -> NoReturn:
    """End a finished rank without the interpreter's teardown, its exit handlers run first.

    torch's own teardown after gloo and the profiler can abort the process: once in CI the
    slowed rank, its trace written and its process group destroyed, died with SIGABRT
    ("terminate called without an active exception") past the point where faulthandler
    still reports, i.e. in interpreter or C++ static teardown. It did not recur here in 388
    rank exits under load, so its cause is not pinned down. The exit handlers, the torch hook's
    among them, still run, so nothing written at exit is lost.
    """
    atexit._run_exitfuncs()  # what the interpreter's own exit would run first
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_skipping_teardown(job())
