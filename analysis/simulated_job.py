"""A simulated training job's spec, and what follows from it alone: its layout and the
names of its hosts and GPUs.

A job is ``nodes x gpus_per_node`` ranks (rank = node * gpus_per_node + local) in
tensor-parallel groups of ``tp`` consecutive ranks and data-parallel groups of the
ranks with the same TP index. Every step runs compute kernels then one or more TP
AllReduces, more compute then a DP AllReduce of the gradients (or, sharded as FSDP and
ZeRO-3 do, an AllGather of the parameters and a ReduceScatter of the gradients, each
after its own compute), optionally a small world AllReduce (a barrier).

``simulate`` runs the job in time and ``simulated_exports`` writes its exports; both
need its layout, so it lives here, importing neither.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from rankscope.analysis import ops
from rankscope.errors import ConfigError

STRAGGLER_KINDS = ("compute", "launch")

US = 1_000
MS = 1_000_000
# Bound on each simulated duration, offset and jitter: the job's times are int64 ns from
# start_utc_ns (1.78e18 of int64's 9.2e18), which a 1e30 straggler or jitter overflows.
MAX_TIME_NS = 3_600_000 * MS
# Bounds on a job's size, so a typo (--nodes 100000) is refused rather than written until
# the disk or memory runs out. Far above the benchmarks' jobs (bench/analyze_scale.py: up to
# 512 ranks x 20 steps; bench/vs_hta.py: 32 ranks x 40 steps x 300 kernels per collective).
MAX_RANKS = 16_384  # nodes x GPUs per node: 32x the largest benchmark
MAX_STEPS = 10_000  # the job's steps are held in memory (~11 KB each): ~110 MB
MAX_TP_COLLECTIVES = 1_000  # per step: a 250-layer model's forward and backward
MAX_KERNELS = 20_000_000  # every rank's kernels, ~100 B each in an export: ~2 GB
_JOB_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Straggler:
    """A rank that is late on every ``every``-th step, before that step's first collective.

    ``compute``: its compute kernels run ``extra_ns`` longer (device busy).
    ``launch``: its host issues the collective ``extra_ns`` after the compute ended
    (device idle before the NCCL kernel).
    """

    rank: int
    kind: str = "compute"
    extra_ns: int = 2 * MS
    every: int = 1


@dataclass(frozen=True)
class JobSpec:
    nodes: int = 8
    gpus_per_node: int = 8
    tp: int = 8
    steps: int = 20
    stragglers: tuple[Straggler, ...] = ()
    max_offset_ns: int = 20 * MS
    max_drift_ppm: float = 50.0
    # Explicit per-node clocks; drawn from (seed, node) when None.
    clock_offsets_ns: tuple[int, ...] | None = None
    clock_drifts_ppm: tuple[float, ...] | None = None
    jitter_ns: int = 10 * US  # std of each compute kernel's duration
    end_jitter_ns: int = 1 * US  # Laplace scale of per-rank collective end jitter
    compute_ns: int = 3 * MS  # compute per phase (before each collective)
    kernels_per_phase: int = 4
    tp_collectives: int = 2  # TP AllReduces per step
    tp_bytes: int = 32 << 20
    dp_bytes: int = 64 << 20
    # FSDP / ZeRO-3: DP syncs by an AllGather and a ReduceScatter of each rank's shard
    # (dp_bytes / DP size) instead of one AllReduce of dp_bytes.
    dp_sharded: bool = False
    barrier: bool = False  # a small world AllReduce closing each step
    slow_links: tuple[int, ...] = ()  # ranks whose network link runs at simulate.SLOW_LINK_SHARE of the inter-node bandwidth
    # One process drives every GPU of its node, a thread each (JAX; one Slurm task per node):
    # an export per node, its ranks told apart by device and NCCL's CommInitRank payloads.
    node_process: bool = False
    # With node_process: one host thread drives every GPU (nccl-tests -g N), each collective an
    # NCCL group over them; the node's GPUs are launched to together, as that thread gets there.
    one_thread: bool = False
    seed: int = 0
    job_id: str = "sim"
    start_utc_ns: int = 1_780_000_000_000_000_000  # true UTC of t0 (first step)

    def __post_init__(self) -> None:
        # Accept lists (e.g. from JSON) but keep the spec hashable.
        object.__setattr__(self, "stragglers", tuple(
            s if isinstance(s, Straggler) else Straggler(**s) for s in self.stragglers))
        for name in ("clock_offsets_ns", "clock_drifts_ppm"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "slow_links", tuple(self.slow_links))
        _validate(self)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.world_size // self.tp


def _validate(spec: JobSpec) -> None:
    def bad(message: str) -> ConfigError:
        return ConfigError(f"simulated job: {message}")

    if spec.nodes < 1 or spec.gpus_per_node < 1 or spec.steps < 1:
        raise bad("nodes, gpus_per_node and steps must be >= 1")
    if spec.world_size > MAX_RANKS:
        raise bad(f"{spec.nodes} nodes x {spec.gpus_per_node} GPUs per node is {spec.world_size} ranks, "
                  f"more than {MAX_RANKS}")
    if spec.steps > MAX_STEPS or spec.tp_collectives > MAX_TP_COLLECTIVES:  # before phases_of lists them
        raise bad(f"at most {MAX_STEPS} steps and {MAX_TP_COLLECTIVES} tp_collectives")
    if spec.tp < 1 or spec.gpus_per_node % spec.tp:
        raise bad(f"tp={spec.tp} must divide gpus_per_node={spec.gpus_per_node} (TP groups are intra-node)")
    if spec.kernels_per_phase < 1 or spec.compute_ns <= 0 or spec.tp_collectives < 0:
        raise bad("kernels_per_phase and compute_ns must be positive, tp_collectives >= 0")
    if spec.jitter_ns < 0 or spec.end_jitter_ns < 0 or spec.max_offset_ns < 0 or spec.max_drift_ppm < 0:
        raise bad("jitter, offset and drift bounds must be >= 0")
    # NaN fails the test too; at -1e6 ppm a drawn clock stands still, past it runs backwards.
    if not all(abs(drift) < 1e6 for drift in (spec.max_drift_ppm, *(spec.clock_drifts_ppm or ()))):
        raise bad("clock drifts must be finite and below 1e6 ppm in size")
    times = (spec.jitter_ns, spec.end_jitter_ns, spec.compute_ns, spec.max_offset_ns,
             *(abs(o) for o in spec.clock_offsets_ns or ()), *(s.extra_ns for s in spec.stragglers))
    if max(times) > MAX_TIME_NS:
        raise bad("compute, jitter, clock offsets and straggler delays must each be at most 1 h")
    if not _JOB_ID.fullmatch(spec.job_id):  # it prefixes file names: a "/" wrote them outside OUTDIR
        raise bad(f"job id {spec.job_id!r}: letters, digits, '.', '_' or '-', not first a '.' (a hidden file)")
    for name in ("clock_offsets_ns", "clock_drifts_ppm"):
        value = getattr(spec, name)
        if value is not None and len(value) != spec.nodes:
            raise bad(f"{name} has {len(value)} values for {spec.nodes} nodes")
    seen = set()
    for s in spec.stragglers:
        if not 0 <= s.rank < spec.world_size:
            raise bad(f"straggler rank {s.rank} outside 0..{spec.world_size - 1}")
        if s.kind not in STRAGGLER_KINDS:
            raise bad(f"straggler kind {s.kind!r} is not one of {', '.join(STRAGGLER_KINDS)}")
        if s.extra_ns < 0 or s.every < 1:
            raise bad(f"straggler {s.rank}: extra_ns must be >= 0 and every >= 1")
        if s.rank in seen:
            raise bad(f"straggler rank {s.rank} given twice")
        seen.add(s.rank)
    if spec.one_thread and not spec.node_process:
        raise bad("one_thread drives a node's GPUs from one thread of one process: it needs node_process")
    for rank in spec.slow_links:
        if not 0 <= rank < spec.world_size:
            raise bad(f"slow link rank {rank} outside 0..{spec.world_size - 1}")
    phases = phases_of(spec)
    if not phases:
        raise bad("no collectives to simulate: one rank, or TP only with tp_collectives=0 and no barrier")
    kernels = spec.world_size * spec.steps * sum(phase.kernels + 1 for phase in phases)
    if kernels > MAX_KERNELS:
        raise bad(f"{spec.world_size} ranks x {spec.steps} steps is {kernels:,} kernels, more than {MAX_KERNELS:,}")
    longest_phase = spec.compute_ns + max((s.extra_ns for s in spec.stragglers), default=0)
    if spec.steps * len(phases) * longest_phase > 24 * MAX_TIME_NS:
        raise bad(f"{spec.steps} steps of this job would run over a day of simulated time")


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Phase:
    """One compute block followed by one collective on one kind of communicator."""

    comm: str  # "tp" | "dp" | "world"
    nbytes: int  # per rank, as NCCL's API counts it (AllGather's sendcount, ReduceScatter's recvcount)
    kernels: int
    op: str = ops.ALLREDUCE


def phases_of(spec: JobSpec) -> tuple[Phase, ...]:
    phases: list[Phase] = []
    if spec.tp > 1:
        phases += [Phase("tp", spec.tp_bytes, spec.kernels_per_phase)] * spec.tp_collectives
    if spec.dp > 1 and spec.dp_sharded:
        shard = spec.dp_bytes // spec.dp
        phases += [Phase("dp", shard, spec.kernels_per_phase, op) for op in (ops.ALLGATHER, ops.REDUCESCATTER)]
    elif spec.dp > 1:
        phases.append(Phase("dp", spec.dp_bytes, spec.kernels_per_phase))
    if spec.barrier and spec.world_size > 1:
        phases.append(Phase("world", 4, 0))
    return tuple(phases)


def group_of(spec: JobSpec, comm: str, ranks: np.ndarray) -> np.ndarray:
    """Which communicator of this kind each rank belongs to."""
    if comm == "tp":
        return ranks // spec.tp
    if comm == "dp":
        return ranks % spec.tp
    return np.zeros_like(ranks)


def position_in(spec: JobSpec, comm: str, ranks: np.ndarray) -> np.ndarray:
    """The rank's NCCL rank inside its communicator."""
    if comm == "tp":
        return ranks % spec.tp
    if comm == "dp":
        return ranks // spec.tp
    return ranks


def members(spec: JobSpec, comm: str, group: int) -> list[int]:
    """Global ranks of one communicator, in NCCL rank order."""
    everyone = np.arange(spec.world_size)
    return everyone[group_of(spec, comm, everyone) == group].tolist()


def comm_hash(spec: JobSpec, comm: str, group: int) -> int:
    """The u64 NCCL commHash: the same on every member, like a hashed ncclUniqueId."""
    key = f"{spec.job_id}/{spec.seed}/{comm}/{group}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def comm_kinds(spec: JobSpec) -> list[str]:
    return list(dict.fromkeys(p.comm for p in phases_of(spec)))


# --------------------------------------------------------------------------- identities


def host_name(spec: JobSpec, node: int) -> str:
    return f"{spec.job_id}-node{node:03d}"


def gpu_uuid(spec: JobSpec, node: int, local: int) -> str:
    h = hashlib.blake2b(f"{spec.job_id}/gpu/{node}/{local}".encode(), digest_size=16).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
