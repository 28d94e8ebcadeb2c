"""Two gloo ranks, one process group, recorded through the torch hook's own window: each
step all-reduces four buffers of distinct sizes asynchronously, so gloo's two worker threads
take calls off the queue together and start them in either order. Each rank writes
rank<R>.json. Run by test_kineto.py: python gloo_async_job.py PORT OUT_DIR."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rankscope.agent.spool import RankInfo
from rankscope.agent.torch_hook import _Window

STEPS = 8
SIZES = (4096, 8192, 12288, 16384)  # floats; distinct, so a worker op's own size names its call (the test's truth)


def rank_main(rank: int, port: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCH_FR_BUFFER_SIZE="2000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    buffers = [torch.ones(n) for n in SIZES]
    window = _Window(RankInfo(rank=rank, local_rank=rank, world_size=2, pid=os.getpid(), host="localhost"))
    window.start()
    for _ in range(STEPS):
        for work in [dist.all_reduce(b, async_op=True) for b in buffers]:
            work.wait()
    window.close(Path(out))  # rank<N>.<key>.pt.trace.json
    dist.barrier()
    dist.destroy_process_group()
    # The traces are whole; what torch 2.13 does tearing down a process that ran gloo with
    # the Flight Recorder on is no part of this test: about 1 run in 20 a rank aborted in it
    # ("terminate called without an active exception"), a barrier before the destroy and all.
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2]), nprocs=2)
