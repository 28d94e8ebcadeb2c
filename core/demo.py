"""`rankscope demo`: the whole product on one machine with no GPU, in under two minutes.

It starts a coordinator (SQLite state, local artifact store) and two agents acting as
two nodes, launches a real PyTorch job (gloo collectives on CPU, 2 nodes x 4 ranks) in
which one rank does extra compute, each rank under ``rankscope rank --backend torch``,
captures it through the coordinator like any sweep, and prints the report naming the
slow rank and where the full report lies. Every process it starts is stopped on exit.

The job itself is this module run as ``python -m rankscope.demo``: a data-parallel loop
of fixed-time compute then an all_reduce of the gradients, ending when a stop file
appears (agreed by all ranks through a tiny all_reduce, so none is left waiting).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

GRAD_ELEMENTS = 1 << 16  # 256 KiB of float32 gradients per step


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the whole product locally: coordinator, two agents, a real PyTorch job",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep everything here (default: a temp folder)")
    parser.add_argument("--ranks-per-node", type=int, default=4, help="ranks on each of the two nodes (default 4)")
    parser.add_argument("--slow-rank", type=int, default=None, help="the rank given extra compute (default: 5)")
    parser.add_argument("--duration", type=float, default=4.0, help="capture window in seconds (default 4)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankscope.errors import ToolError

    raise ToolError("the demo's control-plane part is not wired yet")


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
    weights = torch.randn(64, 64)
    compute_s = args.compute_ms / 1e3 + (args.extra_ms / 1e3 if rank == args.slow_rank else 0.0)
    deadline = time.monotonic() + args.max_seconds
    stop = torch.zeros(1)
    dist.all_reduce(stop)
    if args.ready_dir is not None:
        args.ready_dir.mkdir(parents=True, exist_ok=True)
        (args.ready_dir / str(rank)).touch()
    while True:
        _busy(weights, compute_s)
        dist.all_reduce(grads)
        grads.fill_(1.0)
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


if __name__ == "__main__":
    raise SystemExit(job())
