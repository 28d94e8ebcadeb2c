"""Synthetic digests with known clocks and stragglers, for tests without any export.

`synthetic_job` runs a tiny event model of a TP x DP training job in true time: per
step, ``tp_calls`` AllReduces in each TP group (contiguous ranks of one node), then one
AllReduce per DP group (same local rank across nodes). Every collective starts on a
rank after its own compute; it ends for all members at the last arrival plus a
transfer time. Each node's clock then reads ``true + offset + drift * (true - t0)``.
Stragglers get extra compute before each of their TP collectives, so lateness
propagates to their node-mates exactly as in a real job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from rankscope.analysis.digest import concat, digest_row

T0_NS = 1_764_000_000_000_000_000  # an epoch-ns start time: far beyond float64's exact range


@dataclass
class SyntheticJob:
    nodes: int = 2
    gpus_per_node: int = 4
    tp: int | None = None  # TP group size; default one group per node
    steps: int = 30
    tp_calls: int = 4
    compute_ns: int = 200_000
    jitter_ns: int = 5_000  # mean of exponential compute jitter
    transfer_ns: int = 40_000
    end_jitter_ns: int = 200  # uniform spread of one collective's end across ranks
    stragglers: dict[int, int] = field(default_factory=dict)  # rank -> extra compute ns per TP call
    max_offset_ns: int = 20_000_000
    max_drift_ppm: float = 50.0
    offsets_ns: list[int] | None = None  # per node, overrides max_offset_ns
    drift_ppm: list[float] | None = None
    rate_steps: dict[int, tuple[int, float]] = field(default_factory=dict)  # node -> (true ns, extra ppm after it)
    seq_source: str = "trace"
    named_comms: bool = False
    job_id: str = "synthetic"
    seed: int = 0


@dataclass
class Truth:
    offsets_ns: dict[str, float]  # host -> local minus true at t0
    drift_ppm: dict[str, float]
    late_mean_ns: dict[int, float]
    stragglers: list[int]
    t0_ns: int

    rate_steps: dict[str, tuple[int, float]] = field(default_factory=dict)

    def clock_at(self, host: str, true_ns: int) -> float:
        """How far the host's clock reads ahead of true time at one instant."""
        rel = true_ns - self.t0_ns
        at, ppm = self.rate_steps.get(host, (rel, 0.0))
        return self.offsets_ns[host] + self.drift_ppm[host] * 1e-6 * rel + ppm * 1e-6 * max(rel - at, 0)


def host_name(node: int) -> str:
    return f"node{node:03d}"


def synthetic_job(job: SyntheticJob) -> tuple[pa.Table, Truth]:
    rng = np.random.default_rng(job.seed)
    gpn, tp = job.gpus_per_node, job.tp or job.gpus_per_node
    world = job.nodes * gpn
    ranks = np.arange(world)
    node_of = ranks // gpn
    offsets = np.asarray(job.offsets_ns if job.offsets_ns is not None else rng.uniform(-1, 1, job.nodes) * job.max_offset_ns)
    drifts = np.asarray(job.drift_ppm if job.drift_ppm is not None else rng.uniform(-1, 1, job.nodes) * job.max_drift_ppm)
    extra = np.zeros(world)
    for rank, ns in job.stragglers.items():
        extra[rank] = ns

    tp_groups = [ranks[i : i + tp] for i in range(0, world, tp)]
    dp_groups = [ranks[ranks % gpn == local] for local in range(gpn)] if job.nodes > 1 else []
    cursor = np.zeros(world)
    rows: list[tuple] = []  # (rank, comm, seq, step, start, end, compute_before)
    seq: dict[str, int] = {}
    step_bounds = np.zeros((job.steps, world, 2))
    for step in range(job.steps):
        step_bounds[step, :, 0] = cursor
        calls = [(f"tp{g}", members, True) for _ in range(job.tp_calls) for g, members in enumerate(tp_groups)]
        calls += [(f"dp{g}", members, False) for g, members in enumerate(dp_groups)]
        for comm, members, is_tp in calls:
            compute = job.compute_ns + rng.exponential(job.jitter_ns, len(members)) + (extra[members] if is_tp else 0)
            arrival = cursor[members] + compute
            end = arrival.max() + job.transfer_ns + rng.uniform(0, job.end_jitter_ns, len(members))
            number = seq.get(comm, 0)
            seq[comm] = number + 1
            rows += [(int(r), comm, number, step, a, e, c) for r, a, e, c in zip(members, arrival, end, compute)]
            cursor[members] = end
        step_bounds[step, :, 1] = cursor
    frame = pd.DataFrame(rows, columns=["rank", "comm_id", "seq", "step", "true_start", "true_end", "compute"])

    inst = frame.groupby(["comm_id", "seq"])["true_start"].transform("min")
    late = (frame["true_start"] - inst).groupby(frame["rank"]).mean()
    truth = Truth(
        offsets_ns={host_name(n): float(offsets[n]) for n in range(job.nodes)},
        drift_ppm={host_name(n): float(drifts[n]) for n in range(job.nodes)},
        late_mean_ns={int(r): float(v) for r, v in late.items()},
        stragglers=sorted(job.stragglers),
        t0_ns=T0_NS,
        rate_steps={host_name(n): v for n, v in job.rate_steps.items()},
    )

    steps_at = np.full(job.nodes, np.inf)
    steps_ppm = np.zeros(job.nodes)
    for node, (at, ppm) in job.rate_steps.items():
        steps_at[node], steps_ppm[node] = at, ppm

    def local(true: np.ndarray, rank_nodes: np.ndarray) -> np.ndarray:
        skew = offsets[rank_nodes] + drifts[rank_nodes] * 1e-6 * true
        skew = skew + steps_ppm[rank_nodes] * 1e-6 * np.maximum(true - steps_at[rank_nodes], 0.0)
        return T0_NS + np.rint(true + skew).astype(np.int64)

    frame["start_ns"] = local(frame["true_start"].to_numpy(), node_of[frame["rank"]])
    frame["end_ns"] = local(frame["true_end"].to_numpy(), node_of[frame["rank"]])
    digests = [
        _rank_digest(job, int(rank), frame[frame["rank"] == rank], step_bounds[:, rank], local, tp_groups, dp_groups, node_of)
        for rank in ranks
    ]
    return concat(digests), truth


def _rank_digest(job, rank, rows, bounds, local, tp_groups, dp_groups, node_of) -> pa.Table:
    node = node_of[rank]
    nodes = np.full(len(bounds), node)
    starts, ends = local(bounds[:, 0], nodes), local(bounds[:, 1], nodes)
    compute_ns = rows["compute"].to_numpy()
    nccl = (rows["end_ns"] - rows["start_ns"]).to_numpy()
    collectives = pd.DataFrame(
        {
            "comm_id": rows["comm_id"],
            "seq": rows["seq"],
            "seq_source": job.seq_source,
            "op": "allreduce",
            "bytes": np.where(rows["comm_id"].str.startswith("tp"), 8 << 20, 64 << 20),
            "start_ns": rows["start_ns"],
            "end_ns": rows["end_ns"],
            "compute_before_ns": np.rint(compute_ns).astype(np.int64),
            "idle_before_ns": 0,
            "compute_overlap_ns": 0,
            "step": rows["step"],
        }
    )
    communicators = [
        {"comm_id": f"tp{g}", "ranks": m.tolist(), "name": "TP" if job.named_comms else None}
        for g, m in enumerate(tp_groups) if rank in m
    ] + [
        {"comm_id": f"dp{g}", "ranks": m.tolist(), "name": "DP" if job.named_comms else None}
        for g, m in enumerate(dp_groups) if rank in m
    ]
    kernels = pd.DataFrame(
        {
            "name": ["sm90_xmma_gemm_bf16", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"],
            "count": [len(rows), len(rows)],
            "total_ns": [int(compute_ns.sum()), int(nccl.sum())],
            "is_comm": [False, True],
        }
    )
    window_start, window_end = int(starts[0]) - 1_000_000, int(ends[-1]) + 1_000_000
    busy = int(compute_ns.sum() + nccl.sum())
    meta = {
        "rank": rank,
        "rank_source": "synthetic",
        "local_rank": rank % job.gpus_per_node,
        "world_size": job.nodes * job.gpus_per_node,
        "host": host_name(node),
        "job_id": job.job_id,
        "source_format": "synthetic",
        "source_file": f"synthetic/rank{rank}",
        "window_start_ns": window_start,
        "window_end_ns": window_end,
        "gpu_busy_ns": busy,
        "compute_only_ns": int(compute_ns.sum()),
        "comm_only_ns": int(nccl.sum()),
        "overlap_ns": 0,
    }
    steps = pd.DataFrame({"step": np.arange(len(bounds)), "start_ns": starts, "end_ns": ends})
    return digest_row(
        meta,
        collectives=collectives,
        communicators=pd.DataFrame(communicators),
        kernels=kernels,
        steps=steps,
    )
