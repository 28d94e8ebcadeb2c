"""Canonical collective operation names, and the one table that maps trace names to them.

Every ingest (nsys NVTX ranges, NCCL kernel names, PyTorch/Kineto names) maps its own
spelling to one lower-case canonical op here, so matching across ranks and formats
compares like with like. Kernel names are only a *hint* (nccl-in-traces.md §2: the
specialised entry kernel may run other ops, grouped ops share one kernel); they are
used when nothing better is traced, never as an identity.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
import fnmatch

import numpy as np

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
REDUCESCATTER = "reducescatter"
BROADCAST = "broadcast"
REDUCE = "reduce"
ALLTOALL = "alltoall"
SENDRECV = "sendrecv"
SEND = "send"
RECV = "recv"
BARRIER = "barrier"
GATHER = "gather"
SCATTER = "scatter"
UNKNOWN = "unknown"

CANONICAL_OPS = frozenset(
    {ALLREDUCE, ALLGATHER, REDUCESCATTER, BROADCAST, REDUCE, ALLTOALL, SENDRECV, SEND, RECV, BARRIER, GATHER, SCATTER}
)
# Every member of the communicator takes part and waits for all others: their arrival
# times are comparable, so they anchor clock alignment and lateness.
N_TO_N_OPS = frozenset({ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, BARRIER})
P2P_OPS = frozenset({SEND, RECV, SENDRECV})
# torch's description of its default process group, the job's world (Kineto distributedInfo pg_desc).
WORLD_PG_DESC = "default_pg"

# Normalised spelling (lower case, no separators) -> canonical op. One table for all
# sources: NCCL API names without the `nccl` prefix, kernel collective tokens, c10d op
# names without trailing underscores, gloo/nccl profiling names, record_param_comms
# `Collective name` values.
_ALIASES = {
    "allreduce": ALLREDUCE,
    "allreducecoalesced": ALLREDUCE,
    "allgather": ALLGATHER,
    "allgatherbase": ALLGATHER,
    "allgatherintotensor": ALLGATHER,
    "allgatherintotensorcoalesced": ALLGATHER,
    "allgathercoalesced": ALLGATHER,
    "reducescatter": REDUCESCATTER,
    "reducescatterbase": REDUCESCATTER,
    "reducescattertensor": REDUCESCATTER,
    "reducescattertensorcoalesced": REDUCESCATTER,
    "broadcast": BROADCAST,
    "bcast": BROADCAST,
    "reduce": REDUCE,
    "alltoall": ALLTOALL,
    "alltoallbase": ALLTOALL,
    "alltoallv": ALLTOALL,
    "sendrecv": SENDRECV,
    "send": SEND,
    "recv": RECV,
    "recvanysource": RECV,
    "barrier": BARRIER,
    "gather": GATHER,
    "scatter": SCATTER,
}

# NCCL API ranges that are not operations on data (group brackets, bookkeeping).
_NCCL_META = re.compile(r"^nccl(groupstart|groupend|comm\w*|getuniqueid|getversion|memalloc|memfree|\w*register\w*)$", re.I)
_SEPARATORS = re.compile(r"[^a-z0-9]")
# Kernel names, old and new: ncclKernel_<Coll>_..., ncclDevKernel_<Coll>_...,
# ncclSymDevKernel_<Coll>_..., ncclSymkDevKernel_<coll>_... (nccl-in-traces.md §2), or
# their mangled names (`COMM_KERNEL_GLOBS`), whose argument types follow the base name.
_KERNEL = re.compile(r"^(?:_Z[1-9][0-9]*)?nccl(?:symk?)?(?:dev)?kernel_([a-z]+)", re.I)
# What names an NCCL kernel, as GLOB patterns over the lower-cased name: SQLite's GLOB and
# fnmatch read them alike, so the ingest's SQL (nsys_export `queries`) and `is_comm_kernel` share
# this one definition. A demangled or short name starts with nccl (nccl-in-traces.md §2);
# one known only mangled is NCCL's entry kernel, a free function, as Itanium mangles it:
# `_Z<length><name>`, the name starting with nccl, so the length is 4 or more, without a
# leading zero (`_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE`).
COMM_KERNEL_GLOBS = ("nccl*", "_z[4-9]nccl*", "_z[1-9][0-9]nccl*", "_z[1-9][0-9][0-9]nccl*")
# The same globs as one expression (fnmatch's own translation of each): a trace has hundreds
# of distinct kernel names, and trying each glob in turn on each was ~4x the matching.
_COMM_KERNEL = re.compile("|".join(f"(?:{fnmatch.translate(glob)})" for glob in COMM_KERNEL_GLOBS))


def canonical(name: str | None) -> str | None:
    """The canonical op for any supported spelling, or None when it names no operation.

    Accepts `ncclAllReduce`, `c10d::allreduce_`, `c10d::_allgather_base_`, `gloo:all_reduce`,
    `nccl:all_reduce`, `nccl:_reduce_scatter_base`, `allreduce` (record_param_comms
    `Collective name`), `AllReduce` (kernel token), in any case.
    """
    if not name:
        return None
    text = name.strip()
    for prefix in ("c10d::", "gloo:", "nccl:", "mpi:", "ucc:"):
        if text.lower().startswith(prefix):
            text = text[len(prefix) :]
            break
    else:
        if text.lower().startswith("nccl"):
            text = text[4:]
    key = _SEPARATORS.sub("", text.lower())
    return _ALIASES.get(key)


def from_nccl_api(name: str | None) -> str | None:
    """Op of an NCCL API range (`ncclAllReduce` -> allreduce); None for group/comm calls."""
    if not name or _NCCL_META.match(name):
        return None
    return canonical(name)


def from_kernel_name(name: str | None) -> str | None:
    """A *hint* from an NCCL kernel name (`ncclKernel_AllReduce_RING_LL_Sum_float`,
    `ncclDevKernel_SendRecv`, `ncclSymkDevKernel_allgather_...`, or mangled:
    `_Z22ncclDevKernel_SendRecv24...`); None for `Generic` or unknown names. Never an
    identity: see the module docstring."""
    match = _KERNEL.match(name or "")
    return canonical(match.group(1)) if match else None


def is_comm_kernel(names: Sequence[str | None]) -> np.ndarray:
    """True where a kernel name is an NCCL communication kernel; called on the distinct
    names of a trace (few), not on its kernels (many).

    Classification only (`COMM_KERNEL_GLOBS`: a case-insensitive `nccl` prefix, mangled
    or not); the operation and communicator always come from the trace's own ids.
    """
    return np.fromiter((isinstance(name, str) and _COMM_KERNEL.match(name.lower()) is not None for name in names),
                       dtype=bool, count=len(names))


def bus_factor(op: str, ranks: np.ndarray) -> np.ndarray:
    """nccl-tests' bus bandwidth over (message size / time) for ``op`` on instances of
    ``ranks`` participants each; NaN where no factor is claimed.

    nccl-tests (doc/PERFORMANCE.md): busbw = S / t x factor, S the operation's whole size;
    AllReduce 2(n-1)/n, AllGather and ReduceScatter (n-1)/n, Broadcast and Reduce 1. The
    digests carry the per-rank size m that NCCL's API takes (AllGather: sendcount,
    ReduceScatter: recvcount): S = m, but n*m for AllGather and ReduceScatter; a Send or
    Recv moves S = m one way, factor 1. Left out: AllToAll, whose size is the whole send
    buffer in PyTorch's args and may be split unevenly, and a fused SendRecv kernel, whose
    size may add both directions.
    """
    n = np.where(np.asarray(ranks) > 1, np.asarray(ranks, dtype=np.float64), np.nan)  # one rank moves nothing
    if op == ALLREDUCE:
        return 2 * (n - 1) / n
    if op in (ALLGATHER, REDUCESCATTER):
        return n - 1
    if op in (BROADCAST, REDUCE, SEND, RECV):
        return n / n
    return np.full_like(n, np.nan)
