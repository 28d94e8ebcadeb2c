"""Two gloo ranks, two process groups, each group's worker events told apart by size: group
a all-reduces 4096 floats, group b 16384. One sync all_reduce on each, then rank 0 queues
three on a, which rank 1 joins only after b's, so a's two worker threads are busy and its
third op starts after rank 0's later one on b: b's worker op starts first, by causality, not
by timing. Each rank writes rank<R>.json with the hook's Flight Recorder metadata.
Run by test_kineto.py: python gloo_groups_job.py PORT OUT_DIR."""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from rankscope.agent.torch_hook import _flight_recorder


def rank_main(rank: int, port: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, TORCH_FR_BUFFER_SIZE="2000")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    small, large = torch.ones(4096), torch.ones(16384)
    since = time.time_ns()
    config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    # record_shapes: the worker events' sizes say which group ran each (the test's truth)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, experimental_config=config) as prof:
        dist.all_reduce(small, group=a)
        dist.all_reduce(large, group=b)
        if rank == 0:
            works = [dist.all_reduce(small, group=a, async_op=True) for _ in range(3)]
            works.append(dist.all_reduce(large, group=b, async_op=True))
        else:
            dist.all_reduce(large, group=b)
            works = [dist.all_reduce(small, group=a, async_op=True) for _ in range(3)]
        for work in works:
            work.wait()
        prof.add_metadata_json("rankscope", json.dumps({"rank": rank, "flight_recorder": _flight_recorder(since)}))
    prof.export_chrome_trace(os.path.join(out, f"rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], sys.argv[2]), nprocs=2)
