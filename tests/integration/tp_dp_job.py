"""A 4-rank gloo job laid out as TP=2 x DP=2: TP pairs {0,1} and {2,3} all-reduce activations
twice a step, DP pairs {0,2} and {1,3} all-reduce gradients, the world agrees on stopping.
``--slow-rank`` computes 30 ms a layer where the others compute 4. Run by test_torch_e2e.py."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", type=Path, required=True)
    parser.add_argument("--ready-dir", type=Path, required=True)
    parser.add_argument("--slow-rank", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)  # four ranks share two cores here: intra-op threads would stretch every op
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group, in order
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    args.ready_dir.mkdir(exist_ok=True)
    (args.ready_dir / str(rank)).touch()
    layer_s = 0.030 if rank == args.slow_rank else 0.004
    weights = torch.randn(128, 128) / 128**0.5
    activations, gradients, stop = torch.randn(16384), torch.randn(65536), torch.zeros(1)
    while True:
        for _ in range(2):
            end, x = time.perf_counter() + layer_s, weights  # a fixed wall time, whatever the contention
            while time.perf_counter() < end:
                x = (x @ weights).tanh_()
            dist.all_reduce(activations, group=tp)
        dist.all_reduce(gradients, group=dp)
        stop[0] = float(args.stop_file.exists())
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop[0] > 0:
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
