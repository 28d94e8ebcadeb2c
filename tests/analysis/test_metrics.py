"""Metric definitions on hand-made aligned instances (reference/alignment-and-metrics.md §7)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rankscope.analysis import metrics


def _aligned(rows: list[tuple], sigma: float = 0.0) -> pd.DataFrame:
    """(instance, rank, host, start, end) on one aligned clock."""
    frame = pd.DataFrame(rows, columns=["instance", "rank", "host", "start", "end"])
    frame["duration"] = frame["end"] - frame["start"]
    frame["sigma"] = sigma
    frame["comm_id"] = "c"
    frame["op"] = "allreduce"
    frame["bytes"] = 1024
    return frame


def _instances(aligned: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(metrics.instance_frame(aligned))


def test_lateness_wait_blame_and_transfer() -> None:
    inst = _instances(
        _aligned([(0, 0, "a", 100, 1000), (0, 1, "b", 400, 1000), (0, 2, "c", 700, 1010),
                  (1, 0, "a", 2000, 2500), (1, 1, "b", 2000, 2500), (1, 2, "c", 2100, 2500)])
    )
    row = inst.set_index(["instance", "rank"])
    assert row.loc[(0, 1), "lateness"] == 300 and row.loc[(0, 2), "lateness"] == 600
    assert row.loc[(0, 0), "wait"] == 600 and row.loc[(0, 2), "wait"] == 0
    assert row.loc[(0, 2), "blame"] == 300 and row.loc[(0, 1), "blame"] == 0
    assert row.loc[(0, 0), "transfer_c"] == 300  # median end 1000 - last start 700
    ranks, columns = metrics.rank_lateness(inst)
    per_rank = pd.DataFrame(columns, index=ranks)
    assert per_rank.loc[2, "late_mean_ns"] == pytest.approx((600 + 100) / 2)
    assert per_rank.loc[2, "late_max_ns"] == 600
    assert per_rank.loc[2, "last_arrival_share"] == 1.0 and per_rank.loc[0, "last_arrival_share"] == 0.0
    assert per_rank.loc[2, "blame_ns"] == 300 + 100
    # kernel time = wait + transfer for matched collectives
    assert per_rank.loc[0, "nccl_wait_ns"] + per_rank.loc[0, "nccl_transfer_ns"] == 900 + 500


def test_wait_is_clamped_to_the_kernel() -> None:
    inst = _instances(_aligned([(0, 0, "a", 0, 50), (0, 1, "b", 500, 600)]))
    assert inst.set_index("rank").loc[0, "wait"] == 50


def test_lateness_within_clock_uncertainty_is_hidden() -> None:
    rows = [(0, 0, "a", 0, 1000), (0, 1, "b", 20, 1000), (0, 2, "a", 5000, 6000)]
    inst = _instances(_aligned(rows, sigma=10.0)).set_index("rank")
    assert inst.loc[1, "lateness"] == 0  # 20 ns < 3 * sqrt(2) * 10 ns between hosts a and b
    assert inst.loc[2, "lateness"] == 5000
    same_host = _instances(_aligned([(0, 0, "a", 0, 100), (0, 1, "a", 20, 100)], sigma=10.0))
    assert same_host.set_index("rank").loc[1, "lateness"] == 20  # one clock: no alignment error
    tie = _instances(_aligned([(0, 0, "a", 0, 100), (0, 1, "b", 20, 100)], sigma=10.0))
    assert not tie["is_last"].any()  # skew within noise: nobody "arrived last"


def test_communicator_kind() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    assert metrics.communicator_kind(None, (0, 1), hosts) == "tp"
    assert metrics.communicator_kind(None, (1, 0), hosts) == "tp"
    assert metrics.communicator_kind(None, (0, 2), hosts) == "dp"
    assert metrics.communicator_kind(None, (0, 1, 2, 3), hosts) == "other"
    assert metrics.communicator_kind("TP::layer", (0, 2), hosts) == "tp"
    assert metrics.communicator_kind("data_parallel", (0, 1), hosts) == "dp"
    # one node of 4 with TP=2: the strided groups are DP (or pipeline stages), not TP
    node = {r: "a" for r in range(4)}
    assert [metrics.communicator_kind(None, g, node) for g in ((0, 1), (2, 3), (0, 2), (1, 3))] == ["tp", "tp", "other", "other"]


@pytest.mark.parametrize(("ranks", "op_names", "kind"), [
    ((0, 2), {"allreduce"}, "dp"),  # one 4-GPU node, TP=2: the strided groups reduce gradients
    ((1, 3), {"allgather", "reducescatter"}, "dp"),  # ... or shard them (FSDP, ZeRO-3)
    ((0, 2), {"sendrecv"}, "other"),  # ... or pass activations between pipeline stages
    ((0, 1), {"send", "recv"}, "other"),  # consecutive, but point to point: not TP
    ((0, 4), {"sendrecv"}, "other"),  # pipeline stages on two hosts: not DP
    ((0, 4), {"alltoall"}, "other"),  # expert parallel
    ((0, 4), {"allreduce", "broadcast"}, "dp"),
    ((0, 1), {"allreduce", "sendrecv"}, "tp"),
])
def test_communicator_kind_weighs_what_the_group_ran(ranks, op_names, kind) -> None:
    hosts = {r: "a" if r < 4 else "b" for r in range(8)}
    assert metrics.communicator_kind(None, ranks, hosts, frozenset(op_names)) == kind


def test_a_strided_group_with_several_members_on_each_host_is_dp_where_it_reduces() -> None:
    # 2 hosts of 4 GPUs, TP=2: the DP groups {0, 2, 4, 6} and {1, 3, 5, 7} were "other"
    hosts = {r: "a" if r < 4 else "b" for r in range(8)}
    assert metrics.communicator_kind(None, (0, 2, 4, 6), hosts, frozenset({"allreduce"})) == "dp"
    assert metrics.communicator_kind(None, (1, 3, 5, 7), hosts, frozenset({"allgather", "reducescatter"})) == "dp"
    assert metrics.communicator_kind(None, (0, 2, 4, 6), hosts, frozenset({"sendrecv"})) == "other"
    assert metrics.communicator_kind(None, (0, 1, 4, 5), hosts, frozenset({"allreduce"})) == "other"  # blocks
    assert metrics.communicator_kind(None, (0, 2, 4), hosts, frozenset({"allreduce"})) == "other"  # 2 + 1


def test_a_group_holding_a_smaller_tp_group_is_not_tp_by_its_layout() -> None:
    # One node, TP=4, and a world barrier around both TP groups: it was a third "TP group".
    node = {r: "a" for r in range(8)}
    members = {"tp0": (0, 1, 2, 3), "tp1": (4, 5, 6, 7), "world": tuple(range(8)), "named": tuple(range(8))}
    kinds = metrics.communicator_kinds(members, {"named": "TP::all"}, node, {})
    assert kinds == {"tp0": "tp", "tp1": "tp", "world": "other", "named": "tp"}


def test_torchs_default_group_on_one_node_is_not_taken_for_tensor_parallel() -> None:
    """Single-node DDP reduces gradients on the default group: consecutive ranks on one
    host, but not a TP group."""
    node = {r: "a" for r in range(4)}
    assert metrics.communicator_kind("default_pg", (0, 1, 2, 3), node, frozenset({"allreduce"})) == "other"
    assert metrics.communicator_kind("undefined", (0, 1, 2, 3), node, frozenset({"allreduce"})) == "tp"


def test_communicator_ops_are_each_communicators_distinct_operations() -> None:
    events = {"comm_id": np.array(["pp", "tp", "pp", "tp", "tp"], object),
              "op": np.array(["send", "allreduce", "recv", "allreduce", "allgather"], object)}
    assert metrics.communicator_ops(events) == {"pp": {"send", "recv"}, "tp": {"allreduce", "allgather"}}


def test_tp_overhead_splits_exposed_time() -> None:
    events = pd.DataFrame(
        {
            "comm_id": ["tp", "tp", "tp", "tp"],
            "rank": [0, 0, 1, 1],
            "duration": [100, 100, 100, 100],
            "compute_overlap_ns": [20, 0, 0, None],
            "wait": [50, 0, 0, 30],
            "step": [0, 1, 0, 1],
        }
    )
    steps = pd.DataFrame({"rank": [0, 0, 1, 1], "step": [0, 1, 0, 1], "start_ns": [0, 500, 0, 500], "end_ns": [500, 1000, 500, 1000]})
    meta = pd.DataFrame({"rank": [0, 1], "window_start_ns": [0, 0], "window_end_ns": [5000, 5000]})
    out = pd.DataFrame(metrics.tp_overhead(events, steps, meta, ["tp"])).iloc[0]
    # rank 0: exposed 80 + 100, wait min(50, 80) = 50; rank 1: exposed 200, wait 30
    assert out["exposed_ns"] == pytest.approx(190)
    assert out["exposed_wait_ns"] == pytest.approx(40)
    assert out["step_time_ns"] == 1000
    assert out["exposed_transfer_frac"] == pytest.approx(150 / 1000)
    assert bool(out["stepped"])


def test_imbalance_and_network_spread() -> None:
    rows = []
    for i, transfer in enumerate([100, 100, 100, 300]):
        base = i * 10_000
        rows += [(i, 0, "a", base, base + 500 + transfer), (i, 1, "b", base + 500, base + 500 + transfer)]
    aligned = _aligned(rows)
    inst = metrics.instance_frame(aligned)
    spread = pd.DataFrame(metrics.op_spread(aligned, inst, {"c": 2})).iloc[0]
    assert spread["instances"] == 4
    assert spread["transfer_mean_ns"] == pytest.approx(150)
    assert spread["network_cv"] > 0.5
    assert spread["imbalance_cv"] > 0.3  # rank 0 waits 500 ns in every call
    # AllReduce over 2 ranks: busbw = size / transfer x 2(n-1)/n = 1024 B / 100 ns x 1 (the median transfer)
    assert spread["busbw_gbps"] == pytest.approx(10.24)
    of_four = pd.DataFrame(metrics.op_spread(aligned, inst, {"c": 4})).iloc[0]  # two members not in the input
    assert of_four["busbw_gbps"] == pytest.approx(10.24 * 1.5)  # 2(n-1)/n of the communicator, not of those present


def test_a_send_recv_pair_counts_under_both_ops_whoever_arrives_first() -> None:
    # 4 send/recv instances on one pair; the sender arrives first in the first two, the
    # receiver in the last two; transfer (i + 1) us after the last arrival, skew (i + 1) x 100 ns
    rows = []
    for i in range(4):
        base, lag = i * 10_000, 100 * (i + 1)
        send, recv = (base, base + lag) if i < 2 else (base + lag, base)
        end = base + lag + 1000 * (i + 1)
        rows += [(i, 0, "a", send, end), (i, 1, "a", recv, end)]
    aligned = _aligned(rows)
    aligned["op"] = np.where(aligned["rank"] == 0, "send", "recv")
    aligned["comm_id"] = "pp"
    inst = metrics.instance_frame(aligned)
    spread = pd.DataFrame(metrics.op_spread(aligned, inst, {"pp": 2})).set_index("op")
    for op in ("send", "recv"):
        assert spread.loc[op, "instances"] == 4
        assert spread.loc[op, "transfer_mean_ns"] == pytest.approx(2500)  # (1 + 2 + 3 + 4) us / 4
        assert spread.loc[op, "skew_mean_ns"] == pytest.approx(250)
        # a pair, factor 1: the median of 1024 B over 1, 2, 3 and 4 us
        assert spread.loc[op, "busbw_gbps"] == pytest.approx((1024 / 2000 + 1024 / 3000) / 2)


def test_network_variance_is_the_coefficient_of_variation_of_transfer() -> None:
    rows = []
    for i, transfer in enumerate([100, 100, 400]):
        base = i * 10_000
        rows += [(i, 0, "a", base, base + 500 + transfer), (i, 1, "a", base + 500, base + 500 + transfer)]
    aligned = _aligned(rows)
    spread = pd.DataFrame(metrics.op_spread(aligned, metrics.instance_frame(aligned), {"c": 2})).iloc[0]
    # mean 200 ns, sample std sqrt((100^2 + 100^2 + 200^2) / 2) = 173.2 ns: CV 0.866 (std / median: 1.73)
    assert spread["network_cv"] == pytest.approx(np.sqrt(3) / 2)


def test_rank_lateness_quantiles_are_each_ranks_own() -> None:
    # rank 0 arrives first at every instance; rank 1 is late by 0, 10, ..., 990 ns over 100
    # instances: its median lateness is 495 ns, its p99 980.1 ns, its mean 495 and max 990
    rows = []
    for i in range(100):
        rows += [(i, 0, "a", i * 10_000, i * 10_000 + 5_000), (i, 1, "a", i * 10_000 + 10 * i, i * 10_000 + 5_000)]
    ranks, columns = metrics.rank_lateness(_instances(_aligned(rows)))
    per_rank = pd.DataFrame(columns, index=ranks)
    assert per_rank.loc[1, "late_p50_ns"] == pytest.approx(495.0)
    assert per_rank.loc[1, "late_p99_ns"] == pytest.approx(980.1)  # 0.99 x 99 = 98.01: 980 + 0.01 x 10
    assert per_rank.loc[1, "late_max_ns"] == 990 and per_rank.loc[1, "late_mean_ns"] == pytest.approx(495.0)
    assert per_rank.loc[0, ["late_p50_ns", "late_p99_ns", "late_max_ns"]].tolist() == [0, 0, 0]


def test_op_spread_takes_the_median_size_and_the_p99_of_skew() -> None:
    # five instances: skews 100, 200, 300, 400 and 1000 ns; sizes 64, 64, 64, 64 and 4096 B
    rows = []
    for i, (skew, size) in enumerate([(100, 64), (200, 64), (300, 64), (400, 64), (1000, 4096)]):
        base = i * 10_000
        rows += [(i, 0, "a", base, base + 2_000, size), (i, 1, "a", base + skew, base + 2_000, size)]
    aligned = _aligned([r[:5] for r in rows])
    aligned["bytes"] = [r[5] for r in rows]
    spread = pd.DataFrame(metrics.op_spread(aligned, metrics.instance_frame(aligned), {"c": 2})).iloc[0]
    assert spread["bytes_median"] == 64  # the mean would be 870.4
    assert spread["skew_mean_ns"] == pytest.approx(400)
    assert spread["skew_p99_ns"] == pytest.approx(400 + 0.96 * 600)  # 0.99 x 4 = 3.96 of the way


def test_rank_frame_counts_each_ranks_collectives_and_its_gpu_busy_share_and_split() -> None:
    aligned = _aligned([(0, 0, "a", 0, 1000), (0, 1, "b", 400, 1000), (1, 0, "a", 2000, 2500), (1, 1, "b", 2000, 2500)])
    events = {"rank": np.array([0, 0, 0, 1, 1]), "duration": np.array([1000, 500, 70, 600, 500]),
              "instance": np.array([0, 1, -1, 0, 1])}  # rank 0's third call matched nothing
    meta = {"rank": np.array([1, 0]), "host": np.array(["b", "a"], object), "window_start_ns": np.array([0, 0]),
            "window_end_ns": np.array([10_000, 0]), "gpu_busy_ns": np.array([2_500.0, 100.0]),
            "compute_only_ns": np.array([1_000, 50]), "comm_only_ns": np.array([1_200, 50]), "overlap_ns": np.array([300, 0])}
    frame = pd.DataFrame(metrics.rank_frame(meta, events, metrics.instance_frame(aligned))).set_index("rank")
    assert frame["collectives"].to_dict() == {0: 3, 1: 2}
    assert frame.loc[1, "gpu_busy_pct"] == pytest.approx(25.0)  # 2.5 us busy in a 10 us window
    assert np.isnan(frame.loc[0, "gpu_busy_pct"])  # no window: no share, not a division by zero
    split = ["gpu_compute_only_pct", "gpu_comm_only_pct", "gpu_overlap_pct", "gpu_idle_pct"]
    assert frame.loc[1, split].tolist() == pytest.approx([10.0, 12.0, 3.0, 75.0])  # with idle, the window's 100%
    assert frame.loc[0, split].isna().all()
    assert frame["nccl_kernel_ns"].to_dict() == {0: 1570, 1: 1100} and frame.loc[0, "nccl_unmatched_ns"] == 70


def test_top_kernels_are_the_longest_few_per_rank_and_for_the_job() -> None:
    kernels = {"rank": np.array([0] * 7 + [1]), "name": np.array([f"k{i}" for i in range(7)] + ["k6"], object),
               "count": np.ones(8, np.int64), "total_ns": np.array([10, 70, 30, 60, 20, 50, 40, 100]),
               "is_comm": np.zeros(8, bool)}
    per_rank = metrics.top_kernels(kernels, limit=3)
    assert list(zip(per_rank["rank"].tolist(), list(per_rank["name"]))) == [(0, "k1"), (0, "k3"), (0, "k5"), (1, "k6")]
    job = metrics.job_top_kernels(kernels, limit=3)
    assert list(job["name"]) == ["k6", "k1", "k3"] and job["total_ns"].tolist() == [140, 70, 60]
    assert job["ranks"].tolist() == [2, 1, 1]


def test_exposed_wait_is_no_more_than_the_exposed_time() -> None:
    # a 100 ns call overlapped by 60 ns of compute: 40 ns exposed, of which the 50 ns wait can be 40 at most
    events = pd.DataFrame({"comm_id": ["tp"], "rank": [0], "duration": [100], "compute_overlap_ns": [60.0],
                           "wait": [50], "step": [0]})
    steps = pd.DataFrame({"rank": [0], "step": [0], "start_ns": [0], "end_ns": [1000]})
    meta = pd.DataFrame({"rank": [0], "window_start_ns": [0], "window_end_ns": [1000]})
    out = pd.DataFrame(metrics.tp_overhead(events, steps, meta, ["tp"])).iloc[0]
    assert out["exposed_ns"] == pytest.approx(40) and out["exposed_wait_ns"] == pytest.approx(40)
    assert out["exposed_transfer_ns"] == pytest.approx(0)
