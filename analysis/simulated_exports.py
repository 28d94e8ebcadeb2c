"""The exports of a simulated job, one file per rank, as real profilers leave them.

Each writer takes one rank's `RankTimes` (its events on its node's clock) and a path:

- ``write_nsys``: an Nsight Systems SQLite export as nsys 2026.2.1 writes it, schema
  3.25.0 (reference/nsys-export.md; ``NSYS_DDL`` says where each table is from):
  session-relative timestamps, ``utcEpochNs`` = the node clock at session start, NCCL
  2.27 NVTX ranges with their payloads as exported with ``--include-blobs=true``
  (reference/nccl-in-traces.md §1). Of one rank's process, or of one process driving
  every GPU of its node (JAX; one task per node), a thread per GPU or one for all.
- ``write_kineto``: a Kineto (PyTorch profiler) JSON trace, times in µs relative to
  ``baseTimeNanoseconds``, each NCCL call as torch records it (reference/nccl-in-traces.md §4).

The two are one module because they describe one process: its pid, its kernels and
streams, and how each NCCL call is named and recorded (``_APIS``) are the same in both.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rankscope import output
from rankscope.analysis import ops
from rankscope.analysis.simulated_job import (
    MS, US, JobSpec, Phase, comm_hash, gpu_uuid, group_of, host_name, members, position_in)


@dataclass
class RankTimes:
    """One rank's events on its node's clock, as int64 ns since t0 on that clock."""

    spec: JobSpec
    rank: int
    node: int
    local: int
    phases: tuple[Phase, ...]
    session_local: int  # the node clock at session start, ns since t0
    step_start: np.ndarray
    step_end: np.ndarray
    launch_start: np.ndarray  # (S, P, K), garbage where ~kernel_valid
    launch_end: np.ndarray
    kernel_start: np.ndarray
    kernel_end: np.ndarray
    kernel_valid: np.ndarray  # (P, K) bool
    api_start: np.ndarray  # (S, P)
    api_end: np.ndarray
    cu_start: np.ndarray
    cu_end: np.ndarray
    arrival: np.ndarray
    end: np.ndarray
    comm_init: np.ndarray  # (C, 2)
    comm_kinds: list[str] = field(default_factory=list)

    @property
    def session_utc_ns(self) -> int:
        return self.spec.start_utc_ns + self.session_local


def _pid(spec: JobSpec, rank: int) -> int:
    return 4100 + 37 * (rank % spec.gpus_per_node) + (rank // spec.gpus_per_node) % 29


# --------------------------------------------------------------------------- nsys SQLite

NSYS_VERSION = "2026.2.1.210"
NSYS_SCHEMA_VERSION = "3.25.0"
NCCL_VERSION = "2.27.5"
NVTX_PUSHPOP = 59
NVTX_DOMAIN_CREATE = 75
NCCL_DOMAIN_ID = 1
# NCCL 2.27 static payload schema ids: 2**24 + NVTX_SID_* (nccl src/include/nvtx.h).
SCHEMA_STATIC_START = 1 << 24
SID_COMM_INIT_RANK = SCHEMA_STATIC_START + 0
SID_ALL_GATHER = SCHEMA_STATIC_START + 4
SID_ALL_REDUCE = SCHEMA_STATIC_START + 5
SID_REDUCE_SCATTER = SCHEMA_STATIC_START + 7
NCCL_REDOP_ENUM = SCHEMA_STATIC_START + 16  # NCCL 2.27 (16777232, as in the 2026.2.1 sample)
_BLOB_HEADER = 32  # [domainId u64][schemaId u64][payloadSize u64][payloadOffset u64]
_COMPUTE_STREAM = 7
_NCCL_STREAM = {"tp": 23, "dp": 27, "world": 31}
_ALLREDUCE_KERNEL = {"tp": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",  # its protocol differs by link
                     "dp": "ncclDevKernel_AllReduce_Sum_f32_RING_LL128",
                     "world": "ncclDevKernel_AllReduce_Sum_f32_RING_LL"}
# (shortName, demangledName, mangledName, grid, block, registers, static smem, dynamic smem).
# Two instantiations of one template share a shortName (flash_fwd_kernel: Is_even_MN
# true, then false for a ragged sequence length), as in real exports; only the demangled
# name tells them apart.
_COMPUTE_KERNELS = (
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas",
     None, None, (132, 1, 1), (384, 1, 1), 168, 0, 213248),
    ("flash_fwd_kernel",
     "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, false, false, false, true, true, false>(Flash_fwd_params)",
     "_Z16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass10bfloat16_tEELb0ELb0ELb0ELb0ELb1ELb1ELb0EEv16Flash_fwd_params",
     (16, 32, 8), (128, 1, 1), 255, 0, 49152),
    ("flash_fwd_kernel",
     "void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, false, false, false, false, true, false>(Flash_fwd_params)",
     "_Z16flash_fwd_kernelI23Flash_fwd_kernel_traitsILi128ELi128ELi64ELi4ELb0ELb0EN7cutlass10bfloat16_tEELb0ELb0ELb0ELb0ELb0ELb1ELb0EEv16Flash_fwd_params",
     (16, 32, 8), (128, 1, 1), 255, 0, 49152),
    ("vectorized_elementwise_kernel",
     "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
     "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIN3c108BFloat16EEENS_6detail5ArrayIPcLi3EEEEEviT0_T1_",
     (1024, 1, 1), (128, 1, 1), 28, 0, 0),
)
_NCCL_GRID = ((32, 1, 1), (640, 1, 1), 96, 21568, 82240)

# CREATE TABLE statements verbatim from `sqlite3 .schema` of an nsys 2026.2.1 (schema
# 3.25.0) export (../shared/samples/nsys/schema_3.25.0_nsys2026.2.1.sql). The 3.25.0
# sample is a cut window that lacks NVTX_PAYLOAD_ENUMS*, TARGET_INFO_GPU: those are
# from the 3.13.2 dump (schema_3.13.2_nsys2024.5.1.sql); TARGET_INFO_CUDA_DEVICE is in
# neither dump and is from NVIDIA's SQLite Schema Reference (schema 3.28.1).
NSYS_DDL = """\
CREATE TABLE StringIds (
    -- Consolidation of repetitive string values.

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- ID reference value.
    value                       TEXT      NOT NULL                     -- String value.
);;
CREATE TABLE NVTX_PAYLOAD_SCHEMAS (
    -- NVTX payload schema attributes.

    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    schemaId                    INTEGER,                               -- Identifier of the payload schema.
    name                        TEXT,                                  -- Schema name.
    type                        INTEGER,                               -- Schema type.
    flags                       INTEGER,                               -- Schema flags.
    numEntries                  INTEGER,                               -- Number of payload schema entries.
    payloadSize                 INTEGER,                               -- Size of the static payload.
    alignTo                     INTEGER                                -- Field alignment in bytes.
);;
CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES (
    -- NVTX payload schema entries.

    domainId                    INTEGER   NOT NULL,                    -- User-controlled ID that can be used to group events.
    schemaId                    INTEGER   NOT NULL,                    -- Identifier of the payload schema.
    idx                         INTEGER   NOT NULL,                    -- Index of the entry in the payload schema.
    flags                       INTEGER,                               -- Payload entry flags.
    type                        INTEGER,                               -- Payload entry type.
    name                        TEXT,                                  -- Label of the payload entry.
    description                 TEXT,                                  -- Description of the payload entry.
    arrayOrUnionDetail          INTEGER,                               -- Array length (index) or selected union member.
    offset                      INTEGER                                -- Entry offset in the binary data in bytes.
);;
CREATE TABLE TARGET_INFO_SYSTEM_ENV (
    globalVid                   INTEGER,                               -- Serialized GlobalId.
    devStateName                TEXT      NOT NULL,                    -- Device state name.
    name                        TEXT      NOT NULL,                    -- Property name.
    nameEnum                    INTEGER   NOT NULL,                    -- Property enum value.
    value                       TEXT      NOT NULL                     -- Property value.
);;
CREATE TABLE TARGET_INFO_SESSION_START_TIME (
    utcEpochNs                  INTEGER,                               -- UTC Epoch timestamp at start of the capture (ns).
    utcTime                     TEXT,                                  -- Start of the capture in UTC.
    localTime                   TEXT,                                  -- Start of the capture in local time of target.
    systemClockNs               INTEGER                                -- Target system clock timestamp at start of the capture (ns).
);;
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    deviceId                    INTEGER   NOT NULL,                    -- Device ID.
    contextId                   INTEGER   NOT NULL,                    -- Context ID.
    greenContextId              INTEGER,                               -- Green context ID.
    streamId                    INTEGER   NOT NULL,                    -- Stream ID.
    correlationId               INTEGER,                               -- REFERENCES CUPTI_ACTIVITY_KIND_RUNTIME(correlationId)
    globalPid                   INTEGER,                               -- Serialized GlobalId.
    demangledName               INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Kernel function name w/ templates
    shortName                   INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Base kernel function name
    mangledName                 INTEGER,                               -- REFERENCES StringIds(id) -- Raw C++ mangled kernel function name
    launchType                  INTEGER,                               -- REFERENCES ENUM_CUDA_KERNEL_LAUNCH_TYPE(id)
    cacheConfig                 INTEGER,                               -- REFERENCES ENUM_CUDA_FUNC_CACHE_CONFIG(id)
    registersPerThread          INTEGER   NOT NULL,                    -- Number of registers required for each thread executing the kernel.
    gridX                       INTEGER   NOT NULL,                    -- X-dimension grid size.
    gridY                       INTEGER   NOT NULL,                    -- Y-dimension grid size.
    gridZ                       INTEGER   NOT NULL,                    -- Z-dimension grid size.
    blockX                      INTEGER   NOT NULL,                    -- X-dimension block size.
    blockY                      INTEGER   NOT NULL,                    -- Y-dimension block size.
    blockZ                      INTEGER   NOT NULL,                    -- Z-dimension block size.
    staticSharedMemory          INTEGER   NOT NULL,                    -- Static shared memory allocated for the kernel (B).
    dynamicSharedMemory         INTEGER   NOT NULL,                    -- Dynamic shared memory reserved for the kernel (B).
    localMemoryPerThread        INTEGER   NOT NULL,                    -- Amount of local memory reserved for each thread (B).
    localMemoryTotal            INTEGER   NOT NULL,                    -- Total amount of local memory reserved for the kernel (B).
    gridId                      INTEGER   NOT NULL,                    -- Unique grid ID of the kernel assigned at runtime.
    sharedMemoryExecuted        INTEGER,                               -- Shared memory size set by the driver.
    graphNodeId                 INTEGER,                               -- REFERENCES CUDA_GRAPH_NODE_EVENTS(graphNodeId)
    sharedMemoryLimitConfig     INTEGER,                               -- REFERENCES ENUM_CUDA_SHARED_MEM_LIMIT_CONFIG(id)
    qmdBulkReleaseDone          INTEGER,                               -- QMD bulk release done timestamp from CWD events.
    qmdPreexitDone              INTEGER,                               -- QMD pre-exit done timestamp from CWD events.
    qmdLastCtaDone              INTEGER,                               -- QMD last CTA done timestamp from CWD events.
    graphId                     INTEGER,                               -- Kernel graph ID.
    clusterX                    INTEGER,                               -- Cluster X dimension.
    clusterY                    INTEGER,                               -- Cluster Y dimension.
    clusterZ                    INTEGER,                               -- Cluster Z dimension.
    clusterSchedulingPolicy     INTEGER,                               -- Cluster scheduling policy.
    maxPotentialClusterSize     INTEGER,                               -- Maximum potential cluster size.
    maxActiveClusters           INTEGER,                               -- Maximum active clusters.
    sharedMemoryRequestedPercentage   INTEGER,                         -- Shared memory requested percentage.
    tensorSizeMinusOneElements   TEXT      NOT NULL                    -- TMA descriptor tensor size minus one elements array.
);;
CREATE TABLE PROCESSES (
    -- Names and identifiers of processes captured in the report.

    globalPid                   INTEGER,                               -- Serialized GlobalId.
    pid                         INTEGER,                               -- The process ID.
    name                        TEXT                                   -- The process name.
);;
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER   NOT NULL,                    -- Event end timestamp (ns).
    eventClass                  INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_CLASS(id)
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    correlationId               INTEGER,                               -- ID used to identify events that this function call has triggered.
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Function name
    returnValue                 INTEGER   NOT NULL,                    -- Return value of the function call.
    callchainId                 INTEGER                                -- REFERENCES CUDA_CALLCHAINS(id)
);;
CREATE TABLE NVTX_EVENTS (
    start                       INTEGER   NOT NULL,                    -- Event start timestamp (ns).
    end                         INTEGER,                               -- Event end timestamp (ns).
    eventType                   INTEGER   NOT NULL,                    -- REFERENCES ENUM_NSYS_EVENT_TYPE(id)
    rangeId                     INTEGER,                               -- Correlation ID returned from a nvtxRangeStart call.
    category                    INTEGER,                               -- User-controlled ID that can be used to group events.
    color                       INTEGER,                               -- Encoded ARGB color value.
    text                        TEXT,                                  -- Explicit name/text (non-registered string)
    globalTid                   INTEGER,                               -- Serialized GlobalId.
    endGlobalTid                INTEGER,                               -- Serialized GlobalId.
    textId                      INTEGER,                               -- REFERENCES StringIds(id) -- Registered NVTX domain/string
    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    uint64Value                 INTEGER,                               -- One of possible payload value union members.
    int64Value                  INTEGER,                               -- One of possible payload value union members.
    doubleValue                 REAL,                                  -- One of possible payload value union members.
    uint32Value                 INTEGER,                               -- One of possible payload value union members.
    int32Value                  INTEGER,                               -- One of possible payload value union members.
    floatValue                  REAL,                                  -- One of possible payload value union members.
    jsonTextId                  INTEGER,                               -- One of possible payload value union members.
    jsonText                    TEXT,                                  -- One of possible payload value union members.
    binaryData                  TEXT                                   -- Binary payload. See docs for format.
);;
CREATE TABLE ThreadNames (
    nameId                      INTEGER   NOT NULL,                    -- REFERENCES StringIds(id) -- Thread name
    priority                    INTEGER,                               -- Priority of the thread.
    globalTid                   INTEGER                                -- Serialized GlobalId.
);;
CREATE TABLE ENUM_NSYS_EVENT_TYPE (
    -- Nsys event type labels

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- Enum numerical value.
    name                        TEXT,                                  -- Enum symbol name.
    label                       TEXT                                   -- Enum human name.
);;
CREATE TABLE ENUM_NSYS_EVENT_CLASS (
    -- Nsys event class labels

    id                          INTEGER   NOT NULL   PRIMARY KEY,      -- Enum numerical value.
    name                        TEXT,                                  -- Enum symbol name.
    label                       TEXT                                   -- Enum human name.
);;
CREATE TABLE META_DATA_CAPTURE (
    -- information about nsys capture parameters

    name                        TEXT      NOT NULL,                    -- Name of meta-data record
    value                       TEXT                                   -- Value of meta-data record
);;
CREATE TABLE META_DATA_EXPORT (
    -- information about nsys export process

    name                        TEXT      NOT NULL,                    -- Name of meta-data record
    value                       TEXT                                   -- Value of meta-data record
);;
CREATE TABLE NVTX_PAYLOAD_ENUMS (
    -- NVTX payload enum attributes.

    domainId                    INTEGER,                               -- User-controlled ID that can be used to group events.
    schemaId                    INTEGER,                               -- Identifier of the payload schema.
    name                        TEXT,                                  -- Schema name.
    numEntries                  INTEGER,                               -- Number of entries in the enum.
    size                        INTEGER                                -- Size of enumeration type in bytes.
);;
CREATE TABLE NVTX_PAYLOAD_ENUM_ENTRIES (
    -- NVTX payload enum entries.

    domainId                    INTEGER   NOT NULL,                    -- User-controlled ID that can be used to group events.
    schemaId                    INTEGER   NOT NULL,                    -- Identifier of the payload schema.
    idx                         INTEGER   NOT NULL,                    -- Index of the entry in the payload schema.
    name                        TEXT,                                  -- Name of the enum value.
    value                       INTEGER,                               -- Value of the enum entry.
    isFlag                      INTEGER                                -- Indicates that the entry sets a specific set of bits, which can be used to define bitsets.
);;
CREATE TABLE TARGET_INFO_GPU (
    vmId                        INTEGER   NOT NULL,                    -- Serialized GlobalId.
    id                          INTEGER   NOT NULL,                    -- Device ID.
    name                        TEXT,                                  -- Device name.
    busLocation                 TEXT,                                  -- PCI bus location.
    isDiscrete                  INTEGER,                               -- True if discrete, false if integrated.
    l2CacheSize                 INTEGER,                               -- Size of L2 cache (B).
    totalMemory                 INTEGER,                               -- Total amount of memory on the device (B).
    memoryBandwidth             INTEGER,                               -- Amount of memory transferred (B).
    clockRate                   INTEGER,                               -- Clock frequency (Hz).
    smCount                     INTEGER,                               -- Number of multiprocessors on the device.
    pwGpuId                     INTEGER,                               -- PerfWorks GPU ID.
    uuid                        TEXT,                                  -- Device UUID.
    luid                        INTEGER,                               -- Device LUID.
    chipName                    TEXT,                                  -- Chip name.
    cuDevice                    INTEGER,                               -- CUDA device ID.
    ctxswDevPath                TEXT,                                  -- GPU context switch device node path.
    ctrlDevPath                 TEXT,                                  -- GPU control device node path.
    revision                    INTEGER,                               -- Revision number.
    nodeMask                    INTEGER,                               -- Device node mask.
    constantMemory              INTEGER,                               -- Memory available on device for __constant__ variables (B).
    maxIPC                      INTEGER,                               -- Maximum instructions per count.
    maxRegistersPerBlock        INTEGER,                               -- Maximum number of 32-bit registers available per block.
    maxShmemPerBlock            INTEGER,                               -- Maximum optin shared memory per block.
    maxShmemPerBlockOptin       INTEGER,                               -- Maximum optin shared memory per block.
    maxShmemPerSm               INTEGER,                               -- Maximum shared memory available per multiprocessor (B).
    maxRegistersPerSm           INTEGER,                               -- Maximum number of 32-bit registers available per multiprocessor.
    threadsPerWarp              INTEGER,                               -- Warp size in threads.
    asyncEngines                INTEGER,                               -- Number of asynchronous engines.
    maxWarpsPerSm               INTEGER,                               -- Maximum number of warps per multiprocessor.
    maxBlocksPerSm              INTEGER,                               -- Maximum number of blocks per multiprocessor.
    maxThreadsPerBlock          INTEGER,                               -- Maximum number of threads per block.
    maxBlockDimX                INTEGER,                               -- Maximum X-dimension of a block.
    maxBlockDimY                INTEGER,                               -- Maximum Y-dimension of a block.
    maxBlockDimZ                INTEGER,                               -- Maximum Z-dimension of a block.
    maxGridDimX                 INTEGER,                               -- Maximum X-dimension of a grid.
    maxGridDimY                 INTEGER,                               -- Maximum Y-dimension of a grid.
    maxGridDimZ                 INTEGER,                               -- Maximum Z-dimension of a grid.
    computeMajor                INTEGER,                               -- Major compute capability version number.
    computeMinor                INTEGER,                               -- Minor compute capability version number.
    smMajor                     INTEGER,                               -- Major multiprocessor version number.
    smMinor                     INTEGER                                -- Minor multiprocessor version number.
);;
CREATE TABLE TARGET_INFO_CUDA_DEVICE (
    gpuId                       INTEGER,                               -- GPU ID.
    cudaId                      INTEGER   NOT NULL,                    -- CUDA device ID.
    pid                         INTEGER   NOT NULL,                    -- Process ID.
    uuid                        TEXT,                                  -- Device UUID.
    numMultiprocessors          INTEGER                                -- Number of SMs available on the device.
);
"""


def _nvtx_payload_rows(used: Sequence[str]) -> tuple[list[tuple], list[tuple], list[tuple], list[tuple]]:
    """NCCL 2.27's schema rows as nsys exports them (zero exported as NULL, §6.1): those of
    CommInitRank and of the collectives ``used`` (NCCL registers a schema at first use)."""
    d = NCCL_DOMAIN_ID
    schemas = [(d, SID_COMM_INIT_RANK, None, 1, None, 4, 24, None)]
    entries = [
        (d, SID_COMM_INIT_RANK, 0, None, 18, "NCCL communicator ID", None, None, None),
        (d, SID_COMM_INIT_RANK, 1, None, 5, "No. of ranks", None, None, 8),
        (d, SID_COMM_INIT_RANK, 2, None, 5, "Rank", None, None, 12),
        (d, SID_COMM_INIT_RANK, 3, None, 5, "CUDA device", None, None, 16),
    ]
    for op in used:
        api = _APIS[op]
        fields = [(18, "NCCL communicator ID", None), (22, "Message size [bytes]", 8)]
        if "op" in api.payload.names:
            fields.append((NCCL_REDOP_ENUM, "Reduction operation", 16))
        schemas.append((d, api.schema, None, 1, None, len(fields), api.payload.itemsize, None))
        entries += [(d, api.schema, i, None, kind, name, None, None, offset) for i, (kind, name, offset) in enumerate(fields)]
    enums = [(d, NCCL_REDOP_ENUM, None, 5, 4)]
    enum_entries = [(d, NCCL_REDOP_ENUM, i, name, i or None, None)
                    for i, name in enumerate(("Sum", "Product", "Max", "Min", "Avg"))]
    return schemas, entries, enums, enum_entries


_EVENT_TYPES = [(34, "NvtxMark", "NvtxMark"), (59, "NvtxPushPopRange", "NvtxPushPopRange"),
                (60, "NvtxStartEndRange", "NvtxStartEndRange"), (75, "NvtxDomainCreate", "NvtxDomainCreate"),
                (76, "NvtxDomainDestroy", "NvtxDomainDestroy")]
_EVENT_CLASSES = [(0, "TRACE_PROCESS_EVENT_CUDA_RUNTIME", "CUDA runtime"),
                  (1, "TRACE_PROCESS_EVENT_CUDA_DRIVER", "CUDA driver")]


class _Strings:
    """StringIds: one id per distinct string, in first-use order."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, value: str) -> int:
        return self.ids.setdefault(value, len(self.ids) + 1)

    def rows(self) -> list[tuple[int, str]]:
        return [(i, v) for v, i in self.ids.items()]


def _blobs(schema_id: int, payload: np.ndarray) -> list[bytes]:
    """binaryData as `nsys export --include-blobs=true` writes it: header then payload."""
    n, size = len(payload), payload.dtype.itemsize
    header = np.zeros(n, dtype=[("domain", "<u8"), ("schema", "<u8"), ("size", "<u8"), ("offset", "<u8")])
    header["domain"], header["schema"], header["size"], header["offset"] = NCCL_DOMAIN_ID, schema_id, size, _BLOB_HEADER
    both = np.empty(n, dtype=[("h", header.dtype), ("p", payload.dtype)])
    both["h"], both["p"] = header, payload
    raw = both.tobytes()
    step = both.dtype.itemsize
    return [raw[i:i + step] for i in range(0, len(raw), step)]


_INIT_PAYLOAD = np.dtype([("comm", "<u8"), ("nranks", "<i4"), ("rank", "<i4"), ("device", "<i4"), ("pad", "<i4")])
_ALLREDUCE_PAYLOAD = np.dtype([("comm", "<u8"), ("size", "<u8"), ("op", "<i4"), ("pad", "<i4")])
_ALLGATHER_PAYLOAD = np.dtype([("comm", "<u8"), ("size", "<u8")])


@dataclass(frozen=True)
class _Api:
    """How one collective's call is recorded: NCCL's NVTX range, payload and kernel, and
    PyTorch's c10d op and record_param_comms name."""

    nvtx: str
    schema: int
    payload: np.dtype  # a reduction's has an "op" field
    c10d: str
    torch_name: str
    kernel: str | None = None  # None: AllReduce's, by communicator kind
    whole: str = ""  # "in" or "out": the side holding every rank's shard (n x the per-rank size)

    def kernel_of(self, phase: Phase) -> str:
        """The NCCL kernel's short (base) name."""
        return self.kernel or _ALLREDUCE_KERNEL[phase.comm]

    def demangled_kernel_of(self, phase: Phase) -> str:
        """Its full name, as nsys's demangledName and Kineto name it (NCCL's entry kernels
        are not templates: their base name, then their parameters)."""
        return f"{self.kernel_of(phase)}(ncclDevKernelArgsStorage<(unsigned long)4096>)"

    def nelems(self, phase: Phase, n: int) -> tuple[int, int]:
        """record_param_comms' In and Out msg nelems (float32)."""
        return tuple((n if self.whole == side else 1) * phase.nbytes // 4 for side in ("in", "out"))


_APIS = {
    ops.ALLREDUCE: _Api("ncclAllReduce", SID_ALL_REDUCE, _ALLREDUCE_PAYLOAD, "c10d::allreduce_", "allreduce"),
    ops.ALLGATHER: _Api("ncclAllGather", SID_ALL_GATHER, _ALLGATHER_PAYLOAD, "c10d::_allgather_base_", "_allgather_base",
                        kernel="ncclDevKernel_AllGather_RING_LL", whole="out"),
    ops.REDUCESCATTER: _Api("ncclReduceScatter", SID_REDUCE_SCATTER, _ALLREDUCE_PAYLOAD, "c10d::_reduce_scatter_base_",
                            "_reduce_scatter_base", kernel="ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", whole="in"),
}


def global_pid(pid: int) -> int:
    """nsys serialized id <HW:8><VM:8><PID:24><TID:24> with VM id 1 (nsys-export.md §4)."""
    return (1 << 48) | (pid << 24)


def _iso(utc_ns: int) -> str:
    return dt.datetime.fromtimestamp(utc_ns // 10**9, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


@dataclass(frozen=True)
class _Process:
    """The process and the thread driving one rank's GPU, as nsys serializes them
    (nsys-export.md §4): its main thread, or the process's ``thread``-th after it."""

    pid: int
    gpid: int
    gtid: int

    @classmethod
    def of(cls, spec: JobSpec, rank: int, thread: int = 0) -> _Process:
        pid = _pid(spec, rank)
        gpid = global_pid(pid)
        return cls(pid, gpid, gpid | (pid + thread))


def write_nsys(ranks: Sequence[RankTimes], path: Path) -> None:
    """One process's export: of one rank, or of several ranks of a node (one process
    driving their GPUs, a thread each), on one session start, the earliest of theirs."""
    base = min(rt.session_local for rt in ranks)
    ranks = [replace(rt, session_local=base) for rt in ranks]
    strings = _Strings()
    one_thread = ranks[0].spec.one_thread
    procs = [_Process.of(rt.spec, ranks[0].rank, 0 if one_thread else rt.local - ranks[0].local) for rt in ranks]
    calls, nvtx = _grouped(ranks, strings, procs[0]) if one_thread else ([(rt.api_start, rt.api_end) for rt in ranks], [])
    kernels, launched = [], []
    first_id = 1  # CUDA correlation ids are the process's
    for i, (rt, proc, at) in enumerate(zip(ranks, procs, calls)):
        launches = _launches(rt)
        kernels += _kernel_rows(rt, launches, strings, proc, first_id)
        launched += _runtime_rows(launches, strings, proc, first_id)
        nvtx += _nvtx_rows(rt, strings, proc, at, first=i == 0)
        first_id += len(launches.kind)
    tables = {
        "CUPTI_ACTIVITY_KIND_KERNEL": (_KERNEL_COLUMNS, kernels),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (_RUNTIME_COLUMNS, launched),
        "NVTX_EVENTS": (_NVTX_COLUMNS, nvtx),
        **_target_rows(ranks, strings, procs, path),
    }
    tables = {"StringIds": ([], strings.rows()), **tables}  # complete only now
    with output.replacing(path) as tmp:
        tmp.write_bytes(_empty_export())
        con = sqlite3.connect(tmp, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            con.execute("BEGIN")
            for table, (columns, rows) in tables.items():
                names = f" ({', '.join(columns)})" if columns else ""
                width = len(columns) if columns else len(rows[0])
                con.executemany(f"INSERT INTO {table}{names} VALUES ({','.join('?' * width)})", rows)
            con.execute("COMMIT")
        finally:
            con.close()


def without_payloads(paths: Sequence[Path]) -> None:
    """The exports as a plain `nsys export` leaves them: --include-blobs defaults to false,
    so no NCCL payloads (no communicator ids, sizes or ranks) (nccl-in-traces.md §1.1)."""
    for path in paths:
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE NVTX_EVENTS SET binaryData = NULL")
            db.execute("UPDATE META_DATA_EXPORT SET value = 'false' WHERE name = 'EXPORT_PARAM_INCLUDE_BLOBS'")


@functools.lru_cache(maxsize=1)
def _empty_export() -> bytes:
    """An SQLite file holding just the tables, built once: parsing the DDL per file costs more."""
    con = sqlite3.connect(":memory:")
    try:
        for statement in NSYS_DDL.split(";\n"):
            if statement.strip():
                con.execute(statement)
        return con.serialize()
    finally:
        con.close()


@dataclass
class _Launches:
    """Every kernel of the rank in issue order (per step and phase: compute, then NCCL)."""

    api_start: np.ndarray  # ns on the node clock, relative to the session start
    api_end: np.ndarray
    start: np.ndarray
    end: np.ndarray
    kind: np.ndarray  # index into _COMPUTE_KERNELS, or len(_COMPUTE_KERNELS) + phase for NCCL

    @property
    def nccl(self) -> np.ndarray:
        return self.kind >= len(_COMPUTE_KERNELS)


def _launches(rt: RankTimes) -> _Launches:
    S, P, K = rt.kernel_start.shape
    valid = np.concatenate([np.broadcast_to(rt.kernel_valid, (S, P, K)), np.ones((S, P, 1), bool)], axis=2)
    kind = np.concatenate([np.broadcast_to(np.arange(K) % len(_COMPUTE_KERNELS), (S, P, K)),
                           np.broadcast_to(len(_COMPUTE_KERNELS) + np.arange(P)[:, None], (S, P, 1))], axis=2)

    def issued(compute: np.ndarray, nccl: np.ndarray) -> np.ndarray:
        both = np.concatenate([compute, nccl[:, :, None]], axis=2)
        return both[valid] - rt.session_local

    return _Launches(api_start=issued(rt.launch_start, rt.cu_start), api_end=issued(rt.launch_end, rt.cu_end),
                     start=issued(rt.kernel_start, rt.arrival), end=issued(rt.kernel_end, rt.end),
                     kind=kind[valid])


_KERNEL_COLUMNS = (
    "start", "end", "deviceId", "contextId", "greenContextId", "streamId", "correlationId", "globalPid",
    "demangledName", "shortName", "mangledName", "launchType", "cacheConfig", "registersPerThread",
    "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "staticSharedMemory", "dynamicSharedMemory",
    "localMemoryPerThread", "localMemoryTotal", "gridId", "sharedMemoryExecuted", "sharedMemoryLimitConfig",
    "tensorSizeMinusOneElements",
)


def _kernel_types(rt: RankTimes, strings: _Strings) -> list[tuple]:
    """Per launch kind: (stream, demangled, short, mangled ids, grid, block, regs, smem...)."""
    types = [(_COMPUTE_STREAM, strings(dem or short), strings(short), strings(man or short), *grid, *block, regs,
              static, dynamic) for short, dem, man, grid, block, regs, static, dynamic in _COMPUTE_KERNELS]
    grid, block, regs, static, dynamic = _NCCL_GRID
    for ph in rt.phases:
        api = _APIS[ph.op]
        name = api.kernel_of(ph)
        types.append((_NCCL_STREAM[ph.comm], strings(api.demangled_kernel_of(ph)),
                      strings(name), strings(f"_Z{len(name)}{name}24ncclDevKernelArgsStorageILm4096EE"),
                      *grid, *block, regs, static, dynamic))
    return types


def _kernel_rows(rt: RankTimes, launches: _Launches, strings: _Strings, proc: _Process, first_id: int) -> list[tuple]:
    n = len(launches.kind)
    attrs = np.array(_kernel_types(rt, strings), dtype=np.int64)[launches.kind].T.tolist()
    stream, dem, short, man, gx, gy, gz, bx, by, bz, regs, static, dynamic = attrs
    const = [[value] * n for value in (rt.local, 1, 0)]  # deviceId, contextId, greenContextId
    ids = np.arange(first_id, first_id + n).tolist()
    return list(zip(
        launches.start.tolist(), launches.end.tolist(), *const, stream, ids, [proc.gpid] * n, dem, short, man,
        [1] * n, [0] * n, regs, gx, gy, gz, bx, by, bz, static, dynamic, [0] * n, [0] * n,
        (np.arange(first_id, first_id + n) + 1000).tolist(), dynamic, [1] * n, ["[]"] * n,
    ))


_RUNTIME_COLUMNS = ("start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue")


def _runtime_rows(launches: _Launches, strings: _Strings, proc: _Process, first_id: int) -> list[tuple]:
    n = len(launches.kind)
    # NCCL 2.27 launches with the driver API (eventClass 1), PyTorch ops with the runtime (0).
    name = np.where(launches.nccl, strings("cuLaunchKernelEx"), strings("cudaLaunchKernel_v7000"))
    return list(zip(launches.api_start.tolist(), launches.api_end.tolist(), launches.nccl.astype(int).tolist(),
                    [proc.gtid] * n, range(first_id, first_id + n), name.tolist(), [0] * n))


_NVTX_COLUMNS = ("start", "end", "eventType", "text", "globalTid", "textId", "domainId", "binaryData")


def _ranges(proc: _Process, base: int, start: np.ndarray, end: np.ndarray, text, text_id, domain, blobs) -> list[tuple]:
    """NVTX push/pop ranges on ``proc``'s thread, times relative to ``base``; ``text``,
    ``text_id`` and ``blobs``: one for all, or a list of one each."""
    n = start.size
    texts = text if isinstance(text, list) else [text] * n
    text_ids = text_id if isinstance(text_id, list) else [text_id] * n
    return list(zip((start - base).ravel().tolist(), (end - base).ravel().tolist(), [NVTX_PUSHPOP] * n, texts,
                    [proc.gtid] * n, text_ids, [domain] * n, blobs if blobs is not None else [None] * n))


def _nvtx_rows(rt: RankTimes, strings: _Strings, proc: _Process, calls: tuple[np.ndarray, np.ndarray],
               first: bool) -> list[tuple]:
    """The rank's NCCL ranges on its thread, its calls' at ``calls`` (start, end; (S, P)); for
    the process's ``first`` rank, the NCCL domain and the steps too (a process marks its
    steps once, as JAX's and PyTorch's step annotations do)."""
    spec, base = rt.spec, rt.session_local
    S, P = rt.arrival.shape
    me = np.array([rt.rank])
    ranges = functools.partial(_ranges, proc, base)

    # The NCCL domain is created just before the first communicator.
    rows: list[tuple] = [(int(rt.comm_init[0, 0]) - base - 5 * MS, None, NVTX_DOMAIN_CREATE, "NCCL", proc.gtid,
                          None, NCCL_DOMAIN_ID, None)] if first else []
    init = np.zeros(len(rt.comm_kinds), dtype=_INIT_PAYLOAD)
    for c, kind in enumerate(rt.comm_kinds):
        group = int(group_of(spec, kind, me)[0])
        init[c] = (comm_hash(spec, kind, group), len(members(spec, kind, group)),
                   int(position_in(spec, kind, me)[0]), rt.local, 0)
    rows += ranges(rt.comm_init[:, 0], rt.comm_init[:, 1], None, strings("ncclCommInitRank"), NCCL_DOMAIN_ID,
                   _blobs(SID_COMM_INIT_RANK, init))
    # Each call's range, in (step, phase) order, named and with the payload of its op.
    names, blobs = np.empty((S, P), np.int64), np.empty((S, P), object)
    for p, ph in enumerate(rt.phases):
        api = _APIS[ph.op]
        call = np.zeros(S, dtype=api.payload)
        call["comm"] = comm_hash(spec, ph.comm, int(group_of(spec, ph.comm, me)[0]))
        call["size"] = ph.nbytes
        names[:, p] = strings(api.nvtx)
        blobs[:, p] = _blobs(api.schema, call)
    rows += ranges(*calls, None, names.ravel().tolist(), NCCL_DOMAIN_ID, blobs.ravel().tolist())
    if first:
        rows += ranges(rt.step_start, rt.step_end, [f"step {s}" for s in range(S)], None, 0, None)
    return rows


_GROUP_SPACING_NS = 300  # between the ranges of one thread's group, each 100 ns shorter


def _grouped(ranks: Sequence[RankTimes], strings: _Strings, proc: _Process) -> tuple[list[tuple], list[tuple]]:
    """Where one thread drives every GPU (nccl-tests -g N), each collective is an NCCL group
    on it: ncclGroupStart, one call per GPU in GPU order, and ncclGroupEnd, inside which
    each GPU's kernel is launched (nccl-in-traces.md §1). Per rank, where its calls' ranges
    lie (start, end; (S, P)); and the groups' bracket ranges."""
    gap, count = _GROUP_SPACING_NS, len(ranks)
    launch_start = np.min([rt.cu_start for rt in ranks], axis=0) - gap
    launch_end = np.max([rt.cu_end for rt in ranks], axis=0) + gap
    calls = [(launch_start - (count - d) * gap, launch_start - (count - d) * gap + gap - 100) for d in range(count)]
    opened = launch_start - (count + 1) * gap
    ranges = functools.partial(_ranges, proc, ranks[0].session_local)
    return calls, (ranges(opened, opened + gap - 100, None, strings("ncclGroupStart"), NCCL_DOMAIN_ID, None)
                   + ranges(launch_start, launch_end, None, strings("ncclGroupEnd"), NCCL_DOMAIN_ID, None))


def _target_rows(ranks: Sequence[RankTimes], strings: _Strings, procs: Sequence[_Process],
                 path: Path) -> dict[str, tuple[tuple[str, ...], list[tuple]]]:
    """Payload schemas, target, process and capture metadata (full rows, no column list)."""
    rt, proc = ranks[0], procs[0]
    spec = rt.spec
    host = host_name(spec, rt.node)
    utc = rt.session_utc_ns
    schemas, entries, enums, enum_entries = _nvtx_payload_rows(list(dict.fromkeys(ph.op for ph in rt.phases)))
    sys_env = [(1 << 48, "Local (CLI)", name, enum, value) for name, enum, value in (
        ("CpuCores", 1, "96"), ("NvDriverVersion", 205, "570.124.06"), ("OsDescription", 605, "Ubuntu 22.04.5 LTS"),
        ("CudaDriverVersion", 611, "12080"), ("Hostname", 619, host), ("SupportsNCCL", 925, "1"))]
    gpus = [(1 << 48, g, "NVIDIA H100 80GB HBM3", f"0000:{0x18 + 0x10 * g:02x}:00.0", 1, 52428800, 85520809984,
             3352320000000, 1980000000, 132, g, gpu_uuid(spec, rt.node, g), 0, "GH100", g, None, None, 161, 0,
             65536, 4, 65536, 49152, 232448, 233472, 65536, 32, 3, 64, 32, 1024, 1024, 1024, 64, 2147483647,
             65535, 65535, 9, 0, 9, 0) for g in range(spec.gpus_per_node)]
    # The process sees every GPU of its node (torchrun, no CUDA_VISIBLE_DEVICES) and uses its local rank's.
    cuda_devices = [(g, g, proc.pid, gpu_uuid(spec, rt.node, g), 132) for g in range(spec.gpus_per_node)]
    session_end = max(int(each.end.max()) for each in ranks) + 50 * MS
    return {name: ((), rows) for name, rows in {
        "NVTX_PAYLOAD_SCHEMAS": schemas,
        "NVTX_PAYLOAD_SCHEMA_ENTRIES": entries,
        "NVTX_PAYLOAD_ENUMS": enums,
        "NVTX_PAYLOAD_ENUM_ENTRIES": enum_entries,
        "TARGET_INFO_SYSTEM_ENV": sys_env,
        "TARGET_INFO_SESSION_START_TIME": [(utc, _iso(utc), _iso(utc), 3_600 * 10**9 + rt.rank * 17 * MS)],
        "TARGET_INFO_GPU": gpus,
        "TARGET_INFO_CUDA_DEVICE": cuda_devices,
        "PROCESSES": [(proc.gpid, proc.pid, "python3")],
        "ThreadNames": [(strings("python3"), 20, gtid) for gtid in dict.fromkeys(each.gtid for each in procs)]
        + [(strings("pt_nccl_watchdg"), 20, proc.gpid | (proc.pid + len(procs) + 56))],  # after the GPUs' threads
        "ENUM_NSYS_EVENT_TYPE": _EVENT_TYPES,
        "ENUM_NSYS_EVENT_CLASS": _EVENT_CLASSES,
        "META_DATA_CAPTURE": _meta_capture(rt, session_end - rt.session_local, len(ranks) > 1),
        "META_DATA_EXPORT": _meta_export(rt, path, utc),
    }.items()}


def _meta_capture(rt: RankTimes, duration_ns: int, node_process: bool) -> list[tuple[str, str]]:
    spec = rt.spec
    if node_process:  # one Slurm task per node, no torchrun
        env = {"SLURM_JOB_ID": spec.job_id, "SLURM_PROCID": rt.node, "SLURM_LOCALID": 0, "SLURM_NODEID": rt.node,
               "SLURM_NTASKS": spec.nodes, "NCCL_DEBUG": "WARN"}
    else:
        env = {
            "RANK": rt.rank, "LOCAL_RANK": rt.local, "WORLD_SIZE": spec.world_size,
            "LOCAL_WORLD_SIZE": spec.gpus_per_node, "GROUP_RANK": rt.node, "MASTER_ADDR": host_name(spec, 0),
            "MASTER_PORT": 29500, "SLURM_JOB_ID": spec.job_id, "SLURM_PROCID": rt.rank, "SLURM_LOCALID": rt.local,
            "SLURM_NODEID": rt.node, "SLURM_NTASKS": spec.world_size, "NCCL_DEBUG": "WARN",
        }
    session_uuid = hashlib.blake2b(f"{spec.job_id}/{spec.seed}/{rt.rank}".encode(), digest_size=16).hexdigest()
    rows = [("DEVICE_ID", "Local (CLI)"), ("CAPTURE_EVENT_TYPE", "NvtxEvents"), ("CAPTURE_EVENT_TYPE", "Cuda"),
            ("DEVICE_DISPLAY_NAME", host_name(spec, rt.node)), ("PROCESS_0:COMMAND", "python3"),
            ("PROCESS_0:ARGUMENT_0", "train.py"), ("PROCESS_0:PID", "0"),
            ("PROCESS_0:COLLECT_NVTX_TRACE", "true"), ("PROCESS_0:COLLECT_CUDA_TRACE", "true")]
    rows += [("PROCESS_0:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in env.items()]
    rows += [("PROFILING_SESSION_UUID", f"{session_uuid[:8]}-{session_uuid[8:12]}-{session_uuid[12:16]}-"
              f"{session_uuid[16:20]}-{session_uuid[20:]}"), ("RUN_DURATION_MS", str(duration_ns // MS))]
    return rows


def _meta_export(rt: RankTimes, path: Path, utc: int) -> list[tuple[str, str]]:
    major, minor, micro = NSYS_SCHEMA_VERSION.split(".")
    report = path.with_suffix(".nsys-rep").name
    return [
        ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"), ("EXPORT_PRODUCT_VERSION", NSYS_VERSION),
        ("EXPORT_SCHEMA_VERSION", NSYS_SCHEMA_VERSION), ("EXPORT_SCHEMA_VERSION_MAJOR", major),
        ("EXPORT_SCHEMA_VERSION_MINOR", minor), ("EXPORT_SCHEMA_VERSION_MICRO", micro),
        ("EXPORT_TIME_UTC", _iso(utc + 600 * 10**9)), ("EXPORT_HOST", host_name(rt.spec, rt.node)),
        ("EXPORT_PARAM_EXPORT_TYPE", "SQLite"), ("EXPORT_PARAM_INPUT_FILE", report),
        ("EXPORT_PARAM_OUTPUT_FILE", path.name), ("EXPORT_PARAM_LAZY", "true"),
        ("EXPORT_PARAM_INCLUDE_JSON", "false"), ("EXPORT_PARAM_INCLUDE_BLOBS", "true"),
        ("EXPORT_PARAM_TIME_NORMALIZE", "false"), ("EXPORT_PARAM_TIME_SHIFT", "0"),
        ("EXPORT_CONFIG_TIME_SHIFT", "0"),
    ]


# --------------------------------------------------------------------------- Kineto JSON

KINETO_WARMUP_STEPS = 10
_PG_DESC = {"world": ops.WORLD_PG_DESC, "tp": "TENSOR_MODEL_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP"}


def _pg_name(kind: str, group: int) -> str:
    # torch numbers process groups in creation order; the default group is "0".
    return {"world": "0", "tp": f"1.{group}", "dp": f"2.{group}"}[kind]


class _KinetoEvents:
    """Complete ("X") events with Kineto's relative microsecond times:
    unix_ns = baseTimeNanoseconds + ts * 1000."""

    def __init__(self, base_local: int) -> None:
        self.base_local = base_local
        self.events: list[dict] = []

    def add(self, cat: str, name: str, pid: int, tid: int, start: int, end: int, args: dict) -> None:
        ts = round((int(start) - self.base_local) / 1e3, 3)
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                            "dur": round((int(end) - int(start)) / 1e3, 3), "args": args})


def write_kineto(rt: RankTimes, path: Path) -> None:
    spec = rt.spec
    pid = _pid(spec, rt.rank)
    me = np.array([rt.rank])
    # torch always has the default (world) group "0", whether or not it is used.
    groups = {k: int(group_of(spec, k, me)[0]) for k in ["world", *rt.comm_kinds]}
    base_local = (rt.session_local + spec.start_utc_ns) // 10**9 * 10**9 - spec.start_utc_ns
    out = _KinetoEvents(base_local)
    for s in range(len(rt.step_start)):
        out.add("user_annotation", f"ProfilerStep#{s}", pid, pid, rt.step_start[s], rt.step_end[s],
                {"External id": s + 1})
    _kineto_kernels(rt, groups, pid, out)
    metadata = [{"name": key, "ph": "M", "ts": 0, "pid": proc, "tid": 0, "args": {arg: value}}
                for proc, label in ((pid, "CPU"), (rt.local, f"GPU {rt.local}"))
                for key, arg, value in (("process_name", "name", "python3"), ("process_labels", "labels", label))]
    pg_config = [{"pg_name": _pg_name(k, g), "pg_desc": _PG_DESC[k], "backend_config": "cuda:nccl",
                  "pg_size": len(members(spec, k, g)), "ranks": members(spec, k, g)} for k, g in groups.items()]
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": g, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85520809984,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}
                             for g in range(spec.gpus_per_node)],
        "distributedInfo": {"backend": "nccl", "rank": rt.rank, "world_size": spec.world_size,
                            "pg_count": len(pg_config), "pg_config": pg_config, "nccl_version": NCCL_VERSION},
        "host_name": host_name(spec, rt.node),
        "trace_id": hashlib.blake2b(f"{spec.job_id}/{spec.seed}/{rt.rank}".encode(), digest_size=16).hexdigest().upper(),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": spec.start_utc_ns + base_local,
        "traceEvents": metadata + out.events,
        "traceName": path.name,
    }
    output.write_bytes(path, json.dumps(doc).encode())


def _kineto_kernels(rt: RankTimes, groups: dict[str, int], pid: int, out: _KinetoEvents) -> None:
    """Launches and kernels in issue order; each NCCL call as torch records it: c10d op >
    record_param_comms (the collective's identity, also copied onto the kernel) > launch."""
    spec = rt.spec
    S, P = rt.arrival.shape
    # torch's per-group Seq starts at 1; the capture window opens after warm-up steps.
    seq = {k: 1 + KINETO_WARMUP_STEPS * sum(ph.comm == k for ph in rt.phases) for k in rt.comm_kinds}
    ext = S + 1  # External ids after the step annotations'
    corr = 1
    group_ranks = {k: members(spec, k, groups[k]) for k in rt.comm_kinds}
    for s in range(S):
        for p, ph in enumerate(rt.phases):
            for k in range(ph.kernels):
                short, demangled, _, grid, block, *_ = _COMPUTE_KERNELS[k % len(_COMPUTE_KERNELS)]
                out.add("cuda_runtime", "cudaLaunchKernel", pid, pid, rt.launch_start[s, p, k],
                        rt.launch_end[s, p, k], {"External id": ext, "correlation": corr})
                out.add("kernel", demangled or short, rt.local, _COMPUTE_STREAM, rt.kernel_start[s, p, k],
                        rt.kernel_end[s, p, k], {"External id": ext, "device": rt.local, "stream": _COMPUTE_STREAM,
                                                 "correlation": corr, "grid": list(grid), "block": list(block)})
                ext, corr = ext + 1, corr + 1
            ranks, api = group_ranks[ph.comm], _APIS[ph.op]
            in_nelems, out_nelems = api.nelems(ph, len(ranks))
            comm = {"Collective name": api.torch_name, "dtype": "Float", "In msg nelems": in_nelems,
                    "Out msg nelems": out_nelems, "Group size": len(ranks), "In split size": "[]",
                    "Out split size": "[]", "Process Group Name": _pg_name(ph.comm, groups[ph.comm]),
                    "Process Group Description": _PG_DESC[ph.comm], "Process Group Ranks": str(ranks),
                    "Seq": seq[ph.comm]}
            seq[ph.comm] += 1
            stream = _NCCL_STREAM[ph.comm]
            call, call_end = rt.api_start[s, p], rt.api_end[s, p]
            out.add("cpu_op", api.c10d, pid, pid, call - 4 * US, call_end + 1 * US, {"External id": ext})
            out.add("cpu_op", "record_param_comms", pid, pid, call, call_end, {"External id": ext + 1, **comm})
            out.add("cuda_driver", "cuLaunchKernelEx", pid, pid, rt.cu_start[s, p], rt.cu_end[s, p],
                    {"External id": ext + 1, "correlation": corr})
            out.add("kernel", api.demangled_kernel_of(ph), rt.local, stream, rt.arrival[s, p], rt.end[s, p],
                    {"External id": ext + 1, "device": rt.local, "stream": stream, "correlation": corr,
                     "grid": list(_NCCL_GRID[0]), "block": list(_NCCL_GRID[1]), **comm})
            ext, corr = ext + 2, corr + 1
