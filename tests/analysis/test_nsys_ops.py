"""The canonical op table: every source's spelling maps to one op; kernel names only hint."""

from __future__ import annotations

import pytest

from rankscope.analysis import ops


@pytest.mark.parametrize(
    ("name", "op"),
    [
        # NCCL API ranges (nsys legacy NCCL tracing)
        ("ncclAllReduce", "allreduce"),
        ("ncclAllGather", "allgather"),
        ("ncclReduceScatter", "reducescatter"),
        ("ncclBroadcast", "broadcast"),
        ("ncclReduce", "reduce"),
        ("ncclSend", "send"),
        ("ncclRecv", "recv"),
        ("ncclAlltoAll", "alltoall"),
        ("ncclGather", "gather"),
        ("ncclScatter", "scatter"),
        # PyTorch c10d ops, profiling names, record_param_comms `Collective name`
        ("c10d::allreduce_", "allreduce"),
        ("c10d::_allgather_base_", "allgather"),
        ("c10d::allgather_into_tensor_coalesced_", "allgather"),
        ("c10d::_reduce_scatter_base_", "reducescatter"),
        ("c10d::alltoall_base_", "alltoall"),
        ("c10d::barrier", "barrier"),
        ("c10d::recv_any_source_", "recv"),
        ("gloo:all_reduce", "allreduce"),
        ("gloo:all_to_all", "alltoall"),
        ("gloo:barrier", "barrier"),
        ("nccl:all_reduce", "allreduce"),
        ("nccl:_reduce_scatter_base", "reducescatter"),
        ("allreduce", "allreduce"),
        ("reduce_scatter_tensor", "reducescatter"),
        ("ALL_GATHER", "allgather"),
    ],
)
def test_canonical_maps_every_source_spelling(name: str, op: str) -> None:
    assert ops.canonical(name) == op
    assert op in ops.CANONICAL_OPS


@pytest.mark.parametrize("name", ["ncclGroupStart", "ncclGroupEnd", "ncclCommInitRank", "ncclCommCount", "ncclCommDestroy", "", None])
def test_nccl_bookkeeping_calls_are_not_operations(name) -> None:
    assert ops.from_nccl_api(name) is None


def test_unknown_names_are_not_guessed() -> None:
    assert ops.canonical("aten::mm") is None
    assert ops.canonical("nccl:coalesced") is None


@pytest.mark.parametrize(
    ("kernel", "op"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float", "allreduce"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "sendrecv"),
        ("ncclDevKernel_AllGather_RING_LL", "allgather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL128", "reducescatter"),
        ("ncclDevKernel_SendRecv", "sendrecv"),
        ("nccldevkernel_allreduce_sum_f32_ring_ll", "allreduce"),
        ("ncclSymDevKernel_AllReduce_AGxLL_R_sum_f32", "allreduce"),
        ("ncclSymkDevKernel_allgather_LL", "allgather"),
        ("ncclDevKernel_Generic", None),
        ("flash_fwd_kernel", None),
        ("_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE", "sendrecv"),
        ("_Z38ncclKernel_AllReduce_RING_LL_Sum_floatP11ncclDevCommmP8ncclWork", "allreduce"),
    ],
)
def test_kernel_names_give_a_hint_old_and_new(kernel: str, op) -> None:
    assert ops.from_kernel_name(kernel) == op


def test_is_comm_kernel_is_case_insensitive() -> None:
    names = ["ncclDevKernel_SendRecv", "NCCLKERNEL_AllReduce", "nccldevkernel_x", "gemm_nccl", None, "sm90_xmma"]
    assert ops.is_comm_kernel(names).tolist() == [True, True, True, False, False, False]


def test_is_comm_kernel_knows_nccl_kernels_by_their_mangled_names_only() -> None:
    # An export whose demangled and short names are absent or dangle names a kernel by its
    # mangledName: NCCL's were taken for compute, and none of the trace's collectives were found.
    nccl = ["_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE",
            "_Z38ncclKernel_AllReduce_RING_LL_Sum_floatP11ncclDevCommmP8ncclWork", "_Z4ncclv", "_Z120ncclSymkDevKernel_x"]
    others = ["_Z9gemm_ncclv", "_Z2ncclv", "_Z04ncclv", "_ZN4nccl6kernelEv", "_Z8mynccl_kv", "x_Z22ncclDevKernel_SendRecv",
              "_Z22ncclDevKernel_SendRecv"[1:]]
    assert ops.is_comm_kernel(nccl + others).tolist() == [True] * len(nccl) + [False] * len(others)
