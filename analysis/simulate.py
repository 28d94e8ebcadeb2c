"""Simulated multi-node training jobs, written as the exports real profilers leave.

The job (``simulated_job``: its ranks, groups and the collectives of a step) runs in
true time. Physics: a rank arrives at a collective when its compute is done (later for
injected stragglers); every member's NCCL kernel starts at its own arrival and ends at
the last arrival plus the transfer, plus ~1 us of per-rank end jitter (end
coincidence, alignment-and-metrics.md §2).

Each node has its own clock, ``local = true + offset + drift * (true - t0)``, and
each rank's export carries that clock: nsys SQLite or Kineto JSON, written by
``simulated_exports``.

The whole job is simulated in every call (it is cheap) from random streams keyed by
(seed, rank), (seed, node) and (seed, collective), so writing any subset of nodes
gives byte-identical files to writing all of them: agents on different machines can
each write their own node's ranks of one consistent job. ``truth`` gives what the
analysis should recover, computed on true times.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rankscope import output
from rankscope.cli import parse_count, parse_path
from rankscope.analysis import ops
from rankscope.analysis.simulated_exports import RankTimes, write_kineto, write_nsys
from rankscope.analysis.simulated_job import (
    MAX_RANKS, MAX_STEPS, MAX_TP_COLLECTIVES, MS, STRAGGLER_KINDS, US, JobSpec, Phase, Straggler, comm_hash,
    comm_kinds, group_of, host_name, members, phases_of)
from rankscope.progress import counted
from rankscope.errors import ConfigError, InputError

TRUTH_SCHEMA = "rankscope.sim-truth/1"
FORMATS = ("nsys", "kineto")


def _rng(spec: JobSpec, *key: int) -> np.random.Generator:
    return np.random.default_rng([spec.seed & 0xFFFFFFFF, *key])


_RANK_STREAM, _NODE_STREAM, _COLL_STREAM = 1, 2, 3


# --------------------------------------------------------------------------- clocks


def node_clocks(spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per node: offset (ns, at t0) and drift (ppm) of its clock against true time."""
    offsets = np.empty(spec.nodes)
    drifts = np.empty(spec.nodes)
    for node in range(spec.nodes):
        rng = _rng(spec, _NODE_STREAM, node)
        offsets[node] = rng.uniform(-spec.max_offset_ns, spec.max_offset_ns)
        drifts[node] = rng.uniform(-spec.max_drift_ppm, spec.max_drift_ppm)
    if spec.clock_offsets_ns is not None:
        offsets = np.asarray(spec.clock_offsets_ns, dtype=float)
    if spec.clock_drifts_ppm is not None:
        drifts = np.asarray(spec.clock_drifts_ppm, dtype=float)
    return np.round(offsets), drifts


def _local_ns(true_rel: np.ndarray, offset: float, drift_ppm: float) -> np.ndarray:
    """A node's clock reading (ns since t0 on that clock) at true times (ns since t0)."""
    return np.round(true_rel + offset + drift_ppm * 1e-6 * true_rel).astype(np.int64)


# --------------------------------------------------------------------------- physics

# Host-side costs (ns): API call durations and CPU->GPU launch latency.
_LAUNCH_API = (3 * US, 6 * US)
_HOST_GAP = (5 * US, 25 * US)  # python between the last compute launch and the NCCL call
_NCCL_API = (12 * US, 20 * US)
_LAUNCH_LATENCY = 2.5 * US
_KERNEL_GAP = 1.0 * US
_SYNC_LATENCY = 8 * US
_GROUP_LAUNCH = 6 * US  # one GPU's kernel launch in an NCCL group, after the one before
_STEP_GAP = (2 * US, 10 * US)
_SESSION_LEAD = (200 * MS, 230 * MS)  # nsys session start before t0
_KERNEL_SHARE = np.array([0.35, 0.30, 0.25, 0.10])
# Bus bandwidth (B/s) and latency (ns) inside a node (NVLink) and across nodes (IB).
_INTRA = (300e9, 8 * US)
_INTER = (40e9, 20 * US)
SLOW_LINK_SHARE = 0.5  # a degraded NIC or cable: half the bandwidth
_TRANSFER_CV = 0.02


@dataclass
class Timeline:
    """True times (ns since t0, float64) of everything every rank does."""

    phases: tuple[Phase, ...]
    session_start: np.ndarray  # (W,)
    step_start: np.ndarray  # (W, S)
    step_end: np.ndarray  # (W, S)
    launch_start: np.ndarray  # (W, S, P, K) compute kernel launch API
    launch_end: np.ndarray
    kernel_start: np.ndarray  # (W, S, P, K) compute kernels (NaN where the phase has fewer)
    kernel_end: np.ndarray
    api_start: np.ndarray  # (W, S, P) the NCCL call's NVTX range (ncclAllReduce, ...)
    api_end: np.ndarray
    cu_start: np.ndarray  # (W, S, P) cuLaunchKernelEx inside it
    cu_end: np.ndarray
    arrival: np.ndarray  # (W, S, P) NCCL kernel start
    end: np.ndarray  # (W, S, P) NCCL kernel end
    comm_init: np.ndarray  # (W, C, 2) ncclCommInitRank range per communicator kind


def _node_max(spec: JobSpec) -> Callable[[np.ndarray], np.ndarray]:
    """Per rank, the latest of its node's ranks' times (ranks are numbered node by node)."""
    return lambda times: times.reshape(spec.nodes, spec.gpus_per_node).max(axis=1).repeat(spec.gpus_per_node)


def _kernel_shares(k: int) -> np.ndarray:
    shares = np.resize(_KERNEL_SHARE, k)
    return shares / shares.sum()


def _transfer_ns(spec: JobSpec, phase: Phase, group: int) -> float:
    n = len(members(spec, phase.comm, group))
    busbw, latency = link(spec, phase.comm, group)
    return latency + float(ops.bus_factor(phase.op, np.array([n]))[0]) * phase.nbytes / busbw * 1e9


def link(spec: JobSpec, kind: str, group: int) -> tuple[float, float]:
    """The simulated links of one communicator: (bus bandwidth B/s, latency ns). NVLink
    inside a node, the network across nodes, slowed where a member's link is slow."""
    ranks = members(spec, kind, group)
    if len({r // spec.gpus_per_node for r in ranks}) == 1:
        return _INTRA
    busbw, latency = _INTER
    return busbw * (SLOW_LINK_SHARE if not set(ranks).isdisjoint(spec.slow_links) else 1.0), latency


def _rank_draws(spec: JobSpec, rank: int, n_phases: int, k: int) -> dict[str, np.ndarray]:
    s = spec.steps
    rng = _rng(spec, _RANK_STREAM, rank)
    return {
        "kernel_noise": rng.standard_normal((s, n_phases, k)),
        "launch_api": rng.uniform(*_LAUNCH_API, (s, n_phases, k)),
        "host_gap": rng.uniform(*_HOST_GAP, (s, n_phases)),
        "nccl_api": rng.uniform(*_NCCL_API, (s, n_phases)),
        "end_jitter": rng.laplace(0.0, 1.0, (s, n_phases)),
        "step_gap": rng.uniform(*_STEP_GAP, s),
        "session_lead": rng.uniform(*_SESSION_LEAD, 1),
    }


def _straggler_masks(spec: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """(W, S) extra ns per rank and step, for compute and for launch stragglers."""
    compute = np.zeros((spec.world_size, spec.steps))
    launch = np.zeros((spec.world_size, spec.steps))
    steps = np.arange(spec.steps)
    for s in spec.stragglers:
        target = compute if s.kind == "compute" else launch
        target[s.rank] = np.where(steps % s.every == 0, s.extra_ns, 0)
    return compute, launch


@functools.lru_cache(maxsize=4)
def timeline(spec: JobSpec) -> Timeline:
    """Simulate the whole job in true time (vectorised over ranks)."""
    phases = phases_of(spec)
    W, S, P, K = spec.world_size, spec.steps, len(phases), spec.kernels_per_phase
    ranks = np.arange(W)
    draws = [_rank_draws(spec, r, P, K) for r in ranks]
    d = {key: np.stack([x[key] for x in draws]) for key in draws[0]}
    compute_extra, launch_extra = _straggler_masks(spec)

    groups = [group_of(spec, ph.comm, ranks) for ph in phases]
    # Per collective instance: transfer time, with network variance from its own stream.
    transfer = []
    for p, ph in enumerate(phases):
        n_groups = int(groups[p].max()) + 1
        per_group = np.empty((n_groups, S))
        for g in range(n_groups):
            noise = np.abs(_rng(spec, _COLL_STREAM, p, g).normal(0.0, _TRANSFER_CV, S))
            per_group[g] = _transfer_ns(spec, ph, g) * (1 + noise)
        transfer.append(per_group)

    shape_k = (W, S, P, K)
    t = {name: np.full(shape_k, np.nan) for name in ("ls", "le", "ks", "ke")}
    t.update({name: np.empty((W, S, P)) for name in ("as", "ae", "cs", "ce", "arr", "end")})
    step_start = np.empty((W, S))
    step_end = np.empty((W, S))

    # One host thread per node (spec.one_thread) gets to a point once every GPU's work
    # before it is launched; its NCCL launches follow one another, in GPU order.
    thread = _node_max(spec) if spec.one_thread else (lambda times: times)
    in_turn = (ranks % spec.gpus_per_node) * _GROUP_LAUNCH if spec.one_thread else 0.0
    host = np.zeros(W)
    device = np.zeros(W)
    for s in range(S):
        step_start[:, s] = host
        for p, ph in enumerate(phases):
            base = spec.compute_ns * _kernel_shares(max(ph.kernels, 1))
            host = thread(host)
            for k in range(ph.kernels):
                ls = host
                le = ls + d["launch_api"][:, s, p, k]
                duration = base[k] + spec.jitter_ns * np.clip(d["kernel_noise"][:, s, p, k], -3, 3)
                duration = np.maximum(duration, 0.2 * base[k])
                if p == 0:
                    duration = duration + compute_extra[:, s] / ph.kernels
                ks = np.maximum(device + _KERNEL_GAP, le + _LAUNCH_LATENCY)
                ke = ks + duration
                t["ls"][:, s, p, k], t["le"][:, s, p, k] = ls, le
                t["ks"][:, s, p, k], t["ke"][:, s, p, k] = ks, ke
                host, device = le + 1 * US, ke
            call = host + d["host_gap"][:, s, p]
            if p == 0:
                # A late launch: the host waited for the device, then stalled.
                late = launch_extra[:, s] > 0
                call = np.where(late, np.maximum(call, device) + launch_extra[:, s], call)
            call = thread(call)
            cs = call + 3 * US + in_turn
            ce = cs + 5 * US
            ae = np.maximum(ce + 2 * US, call + d["nccl_api"][:, s, p])
            arrival = np.maximum(device + _KERNEL_GAP, ce + _LAUNCH_LATENCY)
            last = np.full(groups[p].max() + 1, -np.inf)
            np.maximum.at(last, groups[p], arrival)
            tr = transfer[p][groups[p], s]
            jitter = np.clip(spec.end_jitter_ns * d["end_jitter"][:, s, p], -0.4 * tr, 0.4 * tr)
            end = last[groups[p]] + tr + jitter
            t["as"][:, s, p], t["ae"][:, s, p], t["cs"][:, s, p], t["ce"][:, s, p] = call, ae, cs, ce
            t["arr"][:, s, p], t["end"][:, s, p] = arrival, end
            host, device = ae + 2 * US, end
        # The step ends with a host sync on the device (loss.item(), optimizer step).
        step_end[:, s] = thread(np.maximum(host, device + _SYNC_LATENCY))
        host = thread(step_end[:, s] + d["step_gap"][:, s])

    session = -d["session_lead"][:, 0]
    kinds = comm_kinds(spec)
    # Communicators are created one after another between session start and t0.
    init_start = session[:, None] + (20 + 40 * np.arange(len(kinds)))[None, :] * MS
    comm_init = np.stack([init_start, init_start + 25 * MS], axis=-1)
    return Timeline(
        phases=phases, session_start=session, step_start=step_start, step_end=step_end,
        launch_start=t["ls"], launch_end=t["le"], kernel_start=t["ks"], kernel_end=t["ke"],
        api_start=t["as"], api_end=t["ae"], cu_start=t["cs"], cu_end=t["ce"],
        arrival=t["arr"], end=t["end"], comm_init=comm_init,
    )


# --------------------------------------------------------------------------- truth


def lateness(spec: JobSpec) -> np.ndarray:
    """(W, S, P) true lateness: arrival minus the earliest member's arrival."""
    tl = timeline(spec)
    ranks = np.arange(spec.world_size)
    out = np.empty_like(tl.arrival)
    for p, ph in enumerate(tl.phases):
        groups = group_of(spec, ph.comm, ranks)
        first = np.full((groups.max() + 1, spec.steps), np.inf)
        np.minimum.at(first, groups, tl.arrival[:, :, p])
        out[:, :, p] = tl.arrival[:, :, p] - first[groups]
    return out


def _late_stats(values: np.ndarray) -> dict[str, int]:
    return {
        "late_mean_ns": int(round(float(values.mean()))),
        "late_p99_ns": int(round(float(np.percentile(values, 99)))),
        "late_max_ns": int(round(float(values.max()))),
    }


def _late_ranks(spec: JobSpec) -> list[int]:
    """The ranks the stragglers make late. With one thread per node (spec.one_thread) a
    launch straggler stalls the thread that launches every GPU of its node, all alike: late
    against the other nodes' ranks, and against none where its node is the whole job."""
    g = spec.gpus_per_node
    late: set[int] = set()
    for s in spec.stragglers:
        if not (spec.one_thread and s.kind == "launch"):
            late.add(s.rank)
        elif spec.nodes > 1:
            node_start = s.rank // g * g
            late.update(range(node_start, node_start + g))
    return sorted(late)


def truth(spec: JobSpec) -> dict[str, Any]:
    """What an analysis of the simulated exports should recover."""
    tl = timeline(spec)
    late = lateness(spec)
    offsets, drifts = node_clocks(spec)
    ranks = []
    for r in range(spec.world_size):
        entry = {"rank": r, "node": r // spec.gpus_per_node, "host": host_name(spec, r // spec.gpus_per_node),
                 "local_rank": r % spec.gpus_per_node, **_late_stats(late[r])}
        entry["by_comm"] = {
            kind: _late_stats(late[r][:, [p for p, ph in enumerate(tl.phases) if ph.comm == kind]])
            for kind in comm_kinds(spec)
        }
        ranks.append(entry)
    communicators = []
    for kind in comm_kinds(spec):
        for g in range(int(group_of(spec, kind, np.arange(spec.world_size)).max()) + 1):
            h = comm_hash(spec, kind, g)
            # comm_id: the hash as 16 hex digits, the digest's spelling of NCCL's commHash.
            communicators.append({"kind": kind, "comm_hash": h, "comm_id": f"{h:016x}",
                                  "ranks": members(spec, kind, g), "bus_bandwidth_gbps": link(spec, kind, g)[0] / 1e9})
    return {
        "schema": TRUTH_SCHEMA,
        "spec": dataclasses.asdict(spec),
        "t0_utc_ns": spec.start_utc_ns,
        "clock_model": "local_utc = true_utc + offset_ns + drift_ppm*1e-6*(true_utc - t0_utc_ns)",
        "nodes": [{"node": n, "host": host_name(spec, n), "offset_ns": int(offsets[n]),
                   "drift_ppm": float(drifts[n])} for n in range(spec.nodes)],
        "stragglers": _late_ranks(spec),
        "slow_links": sorted(spec.slow_links),
        "collectives_per_step": [{"comm": ph.comm, "op": ph.op, "bytes": ph.nbytes} for ph in tl.phases],
        "communicators": communicators,
        "ranks": ranks,
    }


def write_truth(spec: JobSpec, path: Path | str) -> Path:
    path = Path(path)
    output.write_bytes(path, (json.dumps(truth(spec), indent=1) + "\n").encode())
    return path


def read_spec(path: Path | str) -> JobSpec:
    """The spec recorded in a truth.json."""
    try:
        data = json.loads(Path(path).read_text())
        return JobSpec(**data["spec"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"not a simulator truth file: {exc}", path=path) from exc


# --------------------------------------------------------------------------- public entry


_EXPORT_NAME = re.compile(r".+_(rank|node)\d{5}\.(sqlite|json)")  # what export_name gives, for any job


def export_name(spec: JobSpec, rank: int, fmt: str) -> str:
    """The file holding ``rank``: its own, or its node's (``spec.node_process``)."""
    suffix = {"nsys": "sqlite", "kineto": "json"}[fmt]
    if spec.node_process:
        return f"{spec.job_id}_node{rank // spec.gpus_per_node:05d}.{suffix}"
    return f"{spec.job_id}_rank{rank:05d}.{suffix}"


def _files(spec: JobSpec, nodes: Sequence[int], fmt: str) -> dict[str, list[int]]:
    """Each export of these nodes, by name, with the ranks it holds (in rank order)."""
    files: dict[str, list[int]] = {}
    for node in sorted(set(nodes)):
        for rank in range(node * spec.gpus_per_node, (node + 1) * spec.gpus_per_node):
            files.setdefault(export_name(spec, rank, fmt), []).append(rank)
    return files


def simulate(spec: JobSpec, outdir: Path | str, *, nodes: Sequence[int] | None = None,
             fmt: str = "nsys", progress: bool = False) -> list[Path]:
    """Write one export per rank of the chosen nodes (all by default), or per node where one
    process drives its GPUs (``spec.node_process``); returns their paths. With ``progress``,
    a counter of the exports written is drawn on stderr where it is a terminal."""
    _check_format(spec, fmt)
    chosen = range(spec.nodes) if nodes is None else list(nodes)
    for node in chosen:
        if not 0 <= node < spec.nodes:
            raise ConfigError(f"simulate: node {node} outside 0..{spec.nodes - 1}")
    outdir = output.make_folder(Path(outdir))
    view = _RankView.prepare(spec)
    files = _files(spec, chosen, fmt)
    paths = []
    for name in counted(files, len(files), f"writing {fmt} exports") if progress else files:
        path = outdir / name
        ranks = [view.rank(rank) for rank in files[name]]
        if fmt == "nsys":
            write_nsys(ranks, path)
        else:
            write_kineto(ranks[0], path)  # one per rank
        paths.append(path)
    return paths


def _check_format(spec: JobSpec, fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"simulate: format {fmt!r} is not one of {', '.join(FORMATS)}")
    if spec.node_process and fmt != "nsys":
        raise ConfigError("simulate: a PyTorch profiler trace is one process per GPU: one process per node is "
                          "written as nsys exports only")


@dataclass
class _RankView:
    spec: JobSpec
    tl: Timeline
    offsets: np.ndarray
    drifts: np.ndarray

    @classmethod
    def prepare(cls, spec: JobSpec) -> _RankView:
        offsets, drifts = node_clocks(spec)
        return cls(spec, timeline(spec), offsets, drifts)

    def rank(self, rank: int) -> RankTimes:
        spec, tl = self.spec, self.tl
        node = rank // spec.gpus_per_node
        off, drift = self.offsets[node], self.drifts[node]

        def local(a: np.ndarray) -> np.ndarray:
            return _local_ns(np.nan_to_num(a[rank]), off, drift)

        valid = np.array([[k < ph.kernels for k in range(spec.kernels_per_phase)] for ph in tl.phases])
        return RankTimes(
            spec=spec, rank=rank, node=node, local=rank % spec.gpus_per_node, phases=tl.phases,
            session_local=int(_local_ns(tl.session_start[rank:rank + 1], off, drift)[0]),
            step_start=local(tl.step_start), step_end=local(tl.step_end),
            launch_start=local(tl.launch_start), launch_end=local(tl.launch_end),
            kernel_start=local(tl.kernel_start), kernel_end=local(tl.kernel_end), kernel_valid=valid,
            api_start=local(tl.api_start), api_end=local(tl.api_end),
            cu_start=local(tl.cu_start), cu_end=local(tl.cu_end),
            arrival=local(tl.arrival), end=local(tl.end), comm_init=local(tl.comm_init),
            comm_kinds=comm_kinds(spec),
        )


# --------------------------------------------------------------------------- CLI


def parse_straggler(text: str) -> Straggler:
    """RANK[:compute|launch[:EXTRA_US[:EVERY]]]"""
    parts = text.split(":")
    try:
        if not 1 <= len(parts) <= 4:
            raise ValueError
        rank = int(parts[0])
        kind = parts[1] if len(parts) > 1 and parts[1] else "compute"
        extra_ns = int(round(_finite(parts[2]) * US)) if len(parts) > 2 else 2 * MS
        every = int(parts[3]) if len(parts) > 3 else 1
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(
            f"bad straggler {text!r}: expected RANK[:compute|launch[:EXTRA_US[:EVERY]]]") from None
    if kind not in STRAGGLER_KINDS:
        raise argparse.ArgumentTypeError(f"bad straggler {text!r}: kind must be compute or launch")
    if extra_ns < 0 or every < 1:  # said in the flag's terms, before the job's check says it in JobSpec's
        raise argparse.ArgumentTypeError(f"bad straggler {text!r}: EXTRA_US must be >= 0 and EVERY >= 1")
    return Straggler(rank=rank, kind=kind, extra_ns=extra_ns, every=every)


def _finite(text: str) -> float:
    """A float flag's value; NaN and infinity are refused like a word (they have no ns)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _node_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad node list {text!r}: expected e.g. 0,3") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "simulate", help="write simulated per-rank exports of a multi-node job, plus truth.json",
        description="Write nsys-schema SQLite (or Kineto JSON) exports, one per rank, of a simulated "
                    "TP/DP training job with injected stragglers and skewed node clocks, and the ground "
                    "truth (truth.json) beside them.")
    p.add_argument("outdir", type=parse_path, metavar="OUTDIR", help="folder for the exports and truth.json")
    p.add_argument("--nodes", type=parse_count(1, MAX_RANKS), default=8, help="nodes, each its own clock (default: %(default)s)")
    p.add_argument("--gpus-per-node", type=parse_count(1, MAX_RANKS), default=8, help="ranks per node (default: %(default)s)")
    p.add_argument("--tp", type=int, default=8,
                   help="tensor-parallel group size (divides --gpus-per-node; default: %(default)s)")
    p.add_argument("--steps", type=parse_count(1, MAX_STEPS), default=20, help="training steps (default: %(default)s)")
    p.add_argument("--straggler", type=parse_straggler, action="append", default=[],
                   metavar="RANK[:compute|launch[:EXTRA_US[:EVERY]]]",
                   help="inject a straggler (default compute, 2000 us, every step); repeatable")
    p.add_argument("--max-offset-ms", type=_finite, default=20.0, help="node clock offsets drawn within +-this (default: %(default)g)")
    p.add_argument("--max-drift-ppm", type=_finite, default=50.0, help="node clock drifts drawn within +-this (default: %(default)g)")
    p.add_argument("--jitter-us", type=_finite, default=10.0, help="std of each compute kernel's duration (default: %(default)g)")
    p.add_argument("--tp-collectives", type=parse_count(0, MAX_TP_COLLECTIVES), default=2, help="TP AllReduces per step (default: %(default)s)")
    p.add_argument("--barrier", action="store_true", help="close each step with a small world AllReduce")
    p.add_argument("--fsdp", action="store_true",
                   help="shard DP as FSDP/ZeRO-3: an AllGather and a ReduceScatter of each rank's shard per step, "
                        "not one AllReduce")
    p.add_argument("--one-process-per-node", action="store_true",
                   help="one process drives every GPU of its node, a thread each (JAX; one Slurm task per node): "
                        "an nsys export per node")
    p.add_argument("--one-thread", action="store_true",
                   help="with --one-process-per-node: one thread drives the node's GPUs, each collective an NCCL "
                        "group over them (nccl-tests -g N)")
    p.add_argument("--slow-link", type=int, action="append", default=[], metavar="RANK",
                   help=f"this rank's network link runs at {SLOW_LINK_SHARE:g} of the bandwidth; repeatable")
    p.add_argument("--seed", type=int, default=0, help="the random draws' seed: a seed writes the same job (default: 0)")
    p.add_argument("--format", choices=FORMATS, default="nsys",
                   help="nsys SQLite exports or Kineto JSON traces (default: %(default)s)")
    p.add_argument("--job-id", default="sim", help="the job's id, and the files' prefix (default: %(default)s)")
    p.add_argument("--only-nodes", type=_node_list, default=None, metavar="N[,N...]",
                   help="write only these nodes' ranks (same files as a full run)")
    p.set_defaults(func=_run_cli)


def _check_outdir(spec: JobSpec, outdir: Path, nodes: Sequence[int] | None, fmt: str) -> None:
    """Refuse a folder where simulated exports this run does not write would stay beside
    its own (a larger job's ranks): analysing the folder would mix two jobs under one
    truth. The same job's, written node by node with --only-nodes, add up."""
    output.check_reachable(outdir)
    if not outdir.is_dir():
        return
    every = nodes is None or _same_job(spec, outdir / "truth.json")
    written = _files(spec, range(spec.nodes) if every else nodes, fmt)
    try:
        names = [p.name for p in outdir.iterdir()]
    except OSError as exc:
        raise InputError(f"cannot list the folder ({exc.strerror or exc})", path=outdir) from None
    others = sorted(name for name in names if _EXPORT_NAME.fullmatch(name) and name not in written)
    if others:
        raise ConfigError(f"holds {len(others)} simulated export(s) this job would not replace ({', '.join(others[:3])}"
                          f"{', ...' if len(others) > 3 else ''}): analysed together they mix two jobs; "
                          "write to an empty folder", path=outdir)


def _same_job(spec: JobSpec, truth_file: Path) -> bool:
    try:
        return truth_file.is_file() and read_spec(truth_file) == spec
    except InputError:  # not a truth file of ours: no job to add to
        return False


def _run_cli(args: argparse.Namespace) -> int:
    spec = JobSpec(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, tp=args.tp, steps=args.steps,
        stragglers=tuple(args.straggler), max_offset_ns=int(round(args.max_offset_ms * MS)),
        max_drift_ppm=args.max_drift_ppm, jitter_ns=int(round(args.jitter_us * US)),
        tp_collectives=args.tp_collectives, barrier=args.barrier, dp_sharded=args.fsdp,
        slow_links=tuple(args.slow_link), node_process=args.one_process_per_node,
        one_thread=args.one_thread, seed=args.seed,
        job_id=args.job_id,
    )
    _check_format(spec, args.format)  # before the folder: what is asked cannot be written anywhere
    _check_outdir(spec, args.outdir, args.only_nodes, args.format)
    truth_file = args.outdir / "truth.json"
    try:
        paths = simulate(spec, args.outdir, nodes=args.only_nodes, fmt=args.format, progress=True)
    except KeyboardInterrupt:
        # Each export written is whole: the truth names their job, as it does for
        # --only-nodes, so the set can be analysed, or completed by running this again.
        if args.outdir.is_dir():
            write_truth(spec, truth_file)
            print(f"rankscope: the exports written so far are whole; {truth_file} describes their job", file=sys.stderr)
        raise
    truth_path = write_truth(spec, truth_file)
    print(f"wrote {len(paths)} {args.format} exports ({spec.nodes}x{spec.gpus_per_node} ranks, tp={spec.tp}, "
          f"{spec.steps} steps) to {args.outdir}")
    print(f"ground truth: {truth_path}")
    return 0
