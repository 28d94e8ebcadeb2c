"""Four gloo ranks, two process groups (the world, and a group of all four): each step calls
each collective torch.distributed runs on gloo (list and tensor forms) once on the group,
each between all_reduces on the world and on the group, recorded through the torch hook's
own window (its trace carries the Flight Recorder's entries). Each rank writes
rank<R>.<key>.pt.trace.json. Run by test_kineto.py: python gloo_collectives_job.py PORT OUT_DIR."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rankscope.agent.spool import RankInfo
from rankscope.agent.torch_hook import _Window

WORLD = 4
STEPS = 2
N = 256  # floats per rank's chunk


def collectives(group: dist.ProcessGroup) -> dict[str, Callable[[], object]]:
    """One call of each collective on ``group``, by the c10d op it makes."""
    root = dist.get_rank(group) == 0

    def chunks() -> list[torch.Tensor]:
        return [torch.ones(N) for _ in range(WORLD)]

    return {
        "reduce_scatter_": lambda: dist.reduce_scatter(torch.empty(N), chunks(), group=group),
        "_reduce_scatter_base_": lambda: dist.reduce_scatter_tensor(torch.empty(N), torch.ones(WORLD * N), group=group),
        "allgather_": lambda: dist.all_gather(chunks(), torch.ones(N), group=group),
        "_allgather_base_": lambda: dist.all_gather_into_tensor(torch.empty(WORLD * N), torch.ones(N), group=group),
        "gather_": lambda: dist.gather(torch.ones(N), chunks() if root else None, group_dst=0, group=group),
        "scatter_": lambda: dist.scatter(torch.empty(N), chunks() if root else None, group_src=0, group=group),
        "alltoall_": lambda: dist.all_to_all(chunks(), chunks(), group=group),
        "alltoall_base_": lambda: dist.all_to_all_single(torch.empty(WORLD * N), torch.ones(WORLD * N), group=group),
        "barrier": lambda: dist.barrier(group=group),
        "reduce_": lambda: dist.reduce(torch.ones(N), group_dst=0, group=group),
        "broadcast_": lambda: dist.broadcast(torch.ones(N), group_src=0, group=group),
    }


def rank_main(rank: int, port: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCH_FR_BUFFER_SIZE="2000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    group = dist.new_group(list(range(WORLD)))
    calls = collectives(group)
    buffer = torch.ones(2 * N)
    window = _Window(RankInfo(rank=rank, local_rank=rank, world_size=WORLD, pid=os.getpid(), host="localhost"))
    window.start()
    for _ in range(STEPS):
        for call in calls.values():
            dist.all_reduce(buffer)
            call()
            dist.all_reduce(buffer, group=group)
    window.close(Path(out))  # rank<N>.<key>.pt.trace.json
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # as gloo_async_job.py: torch 2.13's teardown with the Flight Recorder on is no part of the test


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2]), nprocs=WORLD)
