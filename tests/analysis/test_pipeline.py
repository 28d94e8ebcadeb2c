"""analyze() end to end: synthetic digests, and the real nsys samples (issue 2, "must show" 1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rankscope.analysis import digest
from rankscope.analysis.pipeline import analyze
from rankscope.analysis.report import Report, kernel_labels
from rankscope.analysis.testing import SyntheticJob, synthetic_job
from rankscope.errors import InputError, RankscopeWarning

# What analyze says of the torchrun nsys sample, whose send/recv pair names no communicator.
INFERRED_SENDRECV = (r"^1 communicator\(s\) without member lists \(inferred:sendrecv\): members inferred from the ranks "
                     "that use them$")


def test_report_contract_on_a_synthetic_job() -> None:
    digests, truth = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=4, steps=25, stragglers={2: 200_000}, seed=11))
    report = analyze(digests)
    data = json.loads(report.to_json())
    assert data["schema"] == "rankscope.report/1"
    assert [r["rank"] for r in data["ranks"]] == list(range(8))
    assert data["stragglers"] == [2]
    kinds = {c["comm_id"]: c["kind"] for c in data["communicators"]}
    assert kinds == {"tp0": "tp", "tp1": "tp", **{f"dp{i}": "dp" for i in range(4)}}
    assert {t["comm_id"] for t in data["tp_overhead"]} == {"tp0", "tp1"}
    assert data["alignment"]["matched_collectives"] == 25 * (4 * 2 + 4)
    assert data["alignment"]["happens_before_violations"] == 0
    rank2 = data["ranks"][2]
    assert rank2["late_mean_ns"] == pytest.approx(truth.late_mean_ns[2], abs=1_000)
    assert rank2["nccl_wait_ns"] + rank2["nccl_transfer_ns"] == rank2["nccl_kernel_ns"]
    assert 0 < rank2["gpu_busy_pct"] <= 100
    split = [rank2[f"gpu_{part}_pct"] for part in ("compute_only", "comm_only", "overlap")]
    assert min(split) >= 0 and sum(split) == pytest.approx(rank2["gpu_busy_pct"])  # no copies in this job
    assert rank2["gpu_idle_pct"] == pytest.approx(100 - rank2["gpu_busy_pct"])


def test_hosts_are_listed_in_the_fleets_numbering() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=3, gpus_per_node=1, steps=10, seed=3))
    renamed = {"node000": "h10", "node001": "h2", "node002": "h9"}
    host = pa.array([renamed[h] for h in digests.column("host").to_pylist()])
    report = analyze(digests.set_column(digests.schema.get_field_index("host"), "host", host))
    assert [h.host for h in report.alignment.hosts] == ["h2", "h9", "h10"]


def test_ranks_missing_from_the_input_are_named_against_the_jobs_world_size() -> None:
    import pyarrow.compute as pc

    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=4, steps=10, seed=11))
    whole = analyze(digests)
    assert (whole.world_size, whole.missing_ranks) == (8, [])
    assert whole.render_table().splitlines()[0].endswith(": 8 ranks on 2 host(s)")
    with (pytest.warns(RankscopeWarning, match=r"2 of the job's 8 ranks not in the input \(5,6\)"),
          pytest.warns(RankscopeWarning, match=r"^3 communicator\(s\) with listed members not in the input "
                                               r"\(dp1: rank 5 missing, 1 of 2 present, dp2: rank 6 missing, 1 "
                                               r"of 2 present, tp1: ranks 5,6 missing, 2 of 4 present\): matched "
                                               "among the members present$")):
        part = analyze(digests.filter(pc.invert(pc.is_in(digests.column("rank"), value_set=pa.array([5, 6])))))
    assert (part.world_size, part.missing_ranks) == (8, [5, 6])
    assert part.render_table().splitlines()[0].endswith(": 6 of 8 ranks on 2 host(s) (missing: 5,6)")
    assert ("2 of the job's 8 ranks not in the input (5,6): lateness, blame and stragglers are relative to the "
            "6 present alone") in part.warnings
    again = Report.from_dict(json.loads(part.to_json()))
    assert (again.world_size, again.missing_ranks) == (8, [5, 6])


def test_a_world_size_no_job_has_is_taken_as_unknown() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=2, steps=5, seed=11))
    column = digests.schema.get_field_index("world_size")
    huge = pa.array([2**31 - 1] * digests.num_rows, digests.schema.field(column).type)
    with pytest.warns(RankscopeWarning, match="world size 2,147,483,647 in the traces is past 4,194,304 ranks"):
        report = analyze(digests.set_column(column, digests.schema.field(column), huge))
    assert (report.world_size, report.missing_ranks) == (None, [])
    assert any("taken as unknown" in w for w in report.warnings)


def test_a_rank_in_the_input_that_recorded_no_collectives_is_named() -> None:
    import pyarrow.compute as pc

    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=4, steps=10, seed=11))
    column = digests.schema.get_field_index("collectives")
    calls = digests.column(column).to_pylist()
    calls[digests.column("rank").to_pylist().index(5)] = []  # a rank that hung before its first collective
    silent = digests.set_column(column, digests.schema.field(column), pa.array(calls, digests.schema.field(column).type))
    with (pytest.warns(RankscopeWarning, match=r"1 of the 8 ranks in the input recorded no collectives \(5\)"),
          pytest.warns(RankscopeWarning, match=r"^2 communicator\(s\) with members that recorded none of their calls "
                                               r"\(dp1: rank 5, tp1: rank 5\): matched among the members that did")):
        report = analyze(silent)
    assert report.missing_ranks == []  # it is present, only silent
    assert not any("not in the input" in w for w in report.warnings)
    assert report.ranks[5].late_mean_ns is None and report.ranks[5].blame_ns == 0
    # Its communicators dp1 and tp1 are matched among the members that called them, as with rank
    # 5 not in the input: none of their instances dropped as cut by the capture window.
    with (pytest.warns(RankscopeWarning, match=r"^1 of the job's 8 ranks not in the input \(5\)"),
          pytest.warns(RankscopeWarning, match=r"^2 communicator\(s\) with listed members not in the input")):
        absent = analyze(digests.filter(pc.not_equal(digests.column("rank"), 5)))
    assert report.alignment.dropped_incomplete == absent.alignment.dropped_incomplete == 0
    assert report.alignment.matched_collectives == absent.alignment.matched_collectives
    assert [r.late_mean_ns for r in report.ranks if r.rank != 5] == [r.late_mean_ns for r in absent.ranks]


def test_clock_hints_only_change_the_gauge() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=3, gpus_per_node=2, steps=25, seed=12))
    plain = analyze(digests)
    with pytest.warns(RankscopeWarning) as caught:
        hinted = analyze(digests, clock_hints={"node000": 5_000_000, "node001": 0, "node002": 0})
    # The hints are made up, not the simulated clocks: each host's fit disagrees with its hint.
    assert [str(w.message).partition(": collective-fitted clock offset differs from the coordinator's by ")[0]
            for w in caught] == ["host node000", "host node001", "host node002"]
    late = lambda r: [x.late_mean_ns for x in r.ranks]  # noqa: E731
    assert np.allclose(late(plain), late(hinted), atol=2)
    offsets = {h.host: h.offset_ns for h in hinted.alignment.hosts}
    assert np.mean(list(offsets.values())) == pytest.approx(5_000_000 / 3, abs=10)


def test_no_ranks_or_no_collectives_is_an_input_error() -> None:
    with pytest.raises(InputError, match="no ranks"):
        analyze(digest.concat([]))
    row = digest.digest_row(
        {"rank": 0, "rank_source": "t", "host": "h", "source_format": "t", "source_file": "f",
         "window_start_ns": 0, "window_end_ns": 1, "gpu_busy_ns": 0, "compute_only_ns": 0, "comm_only_ns": 0,
         "overlap_ns": 0}
    )
    with pytest.raises(InputError, match="no collectives"):
        analyze(row)


def test_dsl_two_node_allreduce(samples) -> None:
    from rankscope.analysis.sources import load_digests

    with pytest.warns(RankscopeWarning, match=r"^1 communicator\(s\) without member lists \(inferred:allreduce\): "
                                              "members inferred from the ranks that use them$"):
        report = analyze(load_digests([samples / "nsys" / "dsl_2node_2rank_allreduce"]))
    hosts = {r.rank: r.host for r in report.ranks}
    assert hosts == {0: "ault43.cscs.ch", 1: "ault44.cscs.ch"}
    assert report.alignment.matched_collectives == 1
    assert report.alignment.happens_before_violations == 0
    by_rank = {r.rank: r for r in report.ranks}
    # rank 1 (ault44) started its AllReduce kernel ~1.8 ms after rank 0; ends agree within ~1 us
    assert by_rank[1].late_mean_ns == pytest.approx(1.79e6, rel=0.02)
    assert by_rank[0].late_mean_ns == 0
    assert by_rank[1].last_arrival_share == 1.0 and by_rank[1].blame_ns == pytest.approx(1.79e6, rel=0.02)
    assert report.late_ranks == [1]
    assert abs(by_rank[0].clock_offset_ns - by_rank[1].clock_offset_ns) < 5_000
    table = report.render_table()
    assert "rank 1 (1.79 ms)" in table


def test_torchrun_file_splits_into_two_ranks_with_sendrecv_matched(samples) -> None:
    from rankscope.analysis.sources import load_digests

    with pytest.warns(RankscopeWarning, match=INFERRED_SENDRECV):
        report = analyze(load_digests([samples / "nsys" / "nsysai_2gpu_sendrecv" / "mfu_2gpu_before.sqlite"]))
    assert [r.rank for r in report.ranks] == [0, 1]
    assert report.alignment.method == "single host (shared clock)"
    (comm,) = report.communicators
    assert comm.ranks == [0, 1] and [o.op for o in comm.ops] == ["sendrecv"]
    assert report.alignment.matched_collectives == comm.ops[0].instances == 33
    assert report.alignment.dropped_inconsistent == 0
    assert all(r.matched == 33 for r in report.ranks)
    assert Report.from_dict(json.loads(report.to_json())) == report


def test_one_node_job_tells_its_dp_groups_from_tp_by_what_they_run(tmp_path) -> None:
    """One 4-GPU node, TP=2: consecutive pairs are TP, the strided pairs reduce gradients
    (DP); only TP groups get a TP overhead."""
    from rankscope.analysis import simulate
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=1, gpus_per_node=4, tp=2, steps=5, seed=3)
    report = analyze(load_digests(simulate.simulate(spec, tmp_path)))
    kinds = {tuple(c.ranks): c.kind for c in report.communicators}
    assert kinds == {(0, 1): "tp", (2, 3): "tp", (0, 2): "dp", (1, 3): "dp"}
    tp_ids = {c.comm_id for c in report.communicators if c.kind == "tp"}
    assert {t.comm_id for t in report.tp_overhead} == tp_ids


def test_nccl_time_of_collectives_matched_to_no_instance_is_accounted_for(tmp_path) -> None:
    """Rank 3 missing: its TP partner 2's TP calls match no instance. Their time was in
    nccl_kernel_ns but in neither wait nor transfer, and said nowhere."""
    from rankscope.analysis import simulate
    from rankscope.analysis.sources import load_digests

    paths = simulate.simulate(simulate.JobSpec(nodes=2, gpus_per_node=4, tp=2, steps=5, seed=3), tmp_path, fmt="kineto")
    with (pytest.warns(RankscopeWarning, match=r"^1 of the job's 8 ranks not in the input \(3\)"),
          pytest.warns(RankscopeWarning, match=r"^2 communicator\(s\) with listed members not in the input "
                                               r"\(1\.1: rank 3 missing, 1 of 2 present, 2\.1: rank 3 missing, "
                                               r"3 of 4 present\)")):
        report = analyze(load_digests([p for p in paths if not p.name.startswith("sim_rank00003")]))
    for r in report.ranks:
        assert r.nccl_kernel_ns == r.nccl_wait_ns + r.nccl_transfer_ns + r.nccl_unmatched_ns
    assert {r.rank for r in report.ranks if r.nccl_unmatched_ns} == {2}


def test_a_pair_that_only_sends_and_receives_is_not_tensor_parallel(samples) -> None:
    from rankscope.analysis.sources import load_digests

    with pytest.warns(RankscopeWarning, match=INFERRED_SENDRECV):
        report = analyze(load_digests([samples / "nsys" / "nsysai_2gpu_sendrecv" / "mfu_2gpu_before.sqlite"]))
    (comm,) = report.communicators
    assert comm.kind == "other" and not report.tp_overhead


def test_the_default_group_beside_a_tp_group_of_the_same_ranks_is_not_tp(tmp_path) -> None:
    """One node, TP over all 4 GPUs, a world barrier each step (Kineto names the groups):
    the TP group "1.0" is TP; torch's default group "0", with the same members, is not."""
    from rankscope.analysis import simulate
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=1, gpus_per_node=4, tp=4, steps=4, barrier=True, seed=3)
    report = analyze(load_digests(simulate.simulate(spec, tmp_path, fmt="kineto")))
    assert {c.comm_id: c.kind for c in report.communicators} == {"0": "other", "1.0": "tp"}
    assert [t.comm_id for t in report.tp_overhead] == ["1.0"]


def test_a_balanced_pair_names_no_late_rank_and_a_slowed_one_is_named(tmp_path) -> None:
    """Lateness counts from the earlier arrival, so each rank of a balanced pair is late about
    half the time (12-16 us means in such simulated jobs): only a difference tells a late rank."""
    from rankscope.analysis import simulate
    from rankscope.analysis.sources import load_digests

    for seed in range(1, 4):
        simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=20, seed=seed), tmp_path / f"b{seed}")
        balanced = analyze(load_digests([tmp_path / f"b{seed}"]))
        assert max(r.late_mean_ns for r in balanced.ranks) > 0 and balanced.late_ranks == []
    slowed = simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=20, seed=1,
                              stragglers=(simulate.Straggler(1, "compute", 200 * simulate.US),))
    simulate.simulate(slowed, tmp_path / "s")
    assert analyze(load_digests([tmp_path / "s"])).late_ranks == [1]


def test_tp_groups_with_no_collective_inside_the_traced_steps_are_named() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=4, steps=10, seed=11))
    assert {t.comm_id for t in analyze(digests).tp_overhead} == {"tp0", "tp1"}
    assert digests.column("steps").to_pylist()[0]  # the ranks traced steps
    column = digests.schema.get_field_index("collectives")
    calls = [[{**call, "step": None} for call in rank] for rank in digests.column(column).to_pylist()]
    outside = digests.set_column(column, digests.schema.field(column), pa.array(calls, digests.schema.field(column).type))
    with pytest.warns(RankscopeWarning, match=r"2 TP communicator\(s\) ran no collective inside the traced steps "
                                              r"\(tp0, tp1\): no TP overhead for them"):
        report = analyze(outside)
    assert report.tp_overhead == []


def test_an_unnamed_group_of_every_rank_on_one_host_is_taken_as_tp_with_a_warning(tmp_path) -> None:
    """One node, no names in the trace (nsys): a TP=4 job and a 4-way DDP job look the same."""
    from rankscope.analysis import simulate
    from rankscope.analysis.sources import load_digests

    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=4, tp=1, steps=5), tmp_path / "ddp")
    report = analyze(load_digests([tmp_path / "ddp"]))
    (world,) = [c.comm_id for c in report.communicators if c.kind == "tp"]
    assert any(w.startswith("1 unnamed communicator(s) spanning every rank, on one host, taken as TP by their layout "
                            f"({world})") for w in report.warnings)
    simulate.simulate(simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=5), tmp_path / "tp")
    two_nodes = analyze(load_digests([tmp_path / "tp"]))  # TP groups of one node each: no doubt, no warning
    assert {c.kind for c in two_nodes.communicators} == {"tp", "dp"}
    assert not any("taken as TP by their layout" in w for w in two_nodes.warnings)


def test_instantiations_of_one_kernel_template_are_top_kernels_of_their_own_from_either_trace(tmp_path) -> None:
    """The simulated job's two flash_fwd_kernel<...> instantiations share nsys's shortName:
    keyed by it, nsys summed them into one kernel (Kineto, naming kernels in full, did not),
    and the table, cutting names at 60 characters, showed them alike."""
    from rankscope.analysis import simulate
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, seed=3)
    reports = {fmt: analyze(load_digests(simulate.simulate(spec, tmp_path / fmt, fmt=fmt))) for fmt in ("nsys", "kineto")}
    tops = {fmt: {(k["name"], k["count"]) for k in report.top_kernels} for fmt, report in reports.items()}
    assert tops["nsys"] == tops["kineto"]
    flash = sorted(name for name, _ in tops["nsys"] if name.startswith("void flash_fwd_kernel<"))
    assert len(flash) == 2 and flash[0][:60] == flash[1][:60]
    data = json.loads(reports["nsys"].to_json())  # full names, for the job and each rank
    assert set(flash) <= {k["name"] for k in data["top_kernels"]}
    assert all(set(flash) <= {k["name"] for k in rank["top_kernels"]} for rank in data["ranks"])
    lines = reports["nsys"].render_table().splitlines()
    table = lines[lines.index("TOP KERNELS (all ranks)") + 3:]
    labels = kernel_labels(flash)  # parameter lists elided, template arguments whole
    assert labels[0] != labels[1] and [sum(line.endswith(f"  {label}") for line in table) for label in labels] == [1, 1]


def test_a_straggler_late_by_less_than_the_lateness_bar_is_still_among_the_late_ranks(tmp_path) -> None:
    """One rank per TP group (tp=1): rank 6, 0.3 ms late on 3 ms collectives, is named a
    straggler by its own delay, below the 10%-of-NCCL-time bar lateness alone must pass; a
    report naming it the root cause of lateness listed no late rank."""
    from rankscope.analysis.simulate import JobSpec, Straggler, simulate
    from rankscope.analysis.sources import load_digests

    spec = JobSpec(nodes=4, gpus_per_node=4, tp=1, stragglers=[Straggler(rank=6, kind="compute", extra_ns=300_000)])
    report = analyze(load_digests(simulate(spec, tmp_path)))
    assert report.stragglers == [6] and report.late_ranks == [6]


def test_happens_before_broken_on_communicators_of_inferred_members_says_groups_may_be_paired(tmp_path) -> None:
    """A TP=2 x DP=2 job exported without NCCL payloads (`nsys export` leaves --include-blobs
    false): its TP and DP all-reduces, told apart by nothing, are paired by call order across
    all four ranks. Happens-before breaks, and the note put it down to clock noise ("lateness
    near the clock uncertainty"), while ranks 2 and 3 showed ~650 us of lateness, 9x that
    uncertainty. Found by a helper's review. The digests now keep each such call's stream, by
    which the analysis tells the groups apart (lines.py) and happens-before holds; digests
    without streams (an earlier rankscope's) are paired as before, and the note says why."""
    from rankscope.analysis.simulate import JobSpec, Straggler, simulate
    from rankscope.analysis.simulated_exports import without_payloads
    from rankscope.analysis.sources import load_digests

    spec = JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=10, stragglers=[Straggler(rank=1, kind="compute", extra_ns=2_000_000)])
    paths = simulate(spec, tmp_path)
    with_ids = analyze(load_digests(paths))
    assert not any("happens-before" in w for w in with_ids.warnings)
    without_payloads(paths)
    digests = load_digests(paths)
    with pytest.warns(RankscopeWarning, match=r"^8 lines \(a rank's NCCL calls on one stream\) without communicator ids "
                                              "told apart by their end times into 4 communicators"):
        told = analyze(digests)
    assert not any("happens-before" in w for w in told.warnings)
    assert told.stragglers == with_ids.stragglers == [1]
    with pytest.warns(RankscopeWarning, match=r"^1 communicator\(s\) without member lists \(inferred:allreduce\)"):
        report = analyze(_without_streams(digests))
    note = next(w for w in report.warnings if "happens-before" in w)
    assert "on communicators whose members were inferred (inferred:allreduce)" in note
    assert "calls of different groups may be paired as one collective" in note
    assert "lateness near the clock uncertainty" not in note


def _without_streams(digests: pa.Table) -> pa.Table:
    """The digests as an earlier rankscope wrote them: no collective's stream."""
    column = digests.column("collectives").combine_chunks()
    rows = column.flatten()
    fields = [pa.nulls(len(rows), f.type) if f.name == "stream" else rows.field(f.name) for f in rows.type]
    collectives = pa.ListArray.from_arrays(column.offsets, pa.StructArray.from_arrays(fields, fields=list(rows.type)))
    return digests.set_column(digests.schema.get_field_index("collectives"), "collectives", collectives)


@pytest.mark.parametrize(("gpus", "steps", "end_jitter_ns", "seed"), [
    (2, 10, 3_000_000, 0), (2, 10, 3_000_000, 8), (2, 10, 3_000_000, 27), (4, 20, 500_000, 13),
    (2, 5, 5_000, 1), (2, 10, 200_000, 12), (2, 10, 200_000, 17)])
def test_end_jitter_alone_does_not_shift_communicators_whose_members_recorded_every_call(
        tmp_path, gpus: int, steps: int, end_jitter_ns: int, seed: int) -> None:
    """The same job exported with NCCL payloads, ends jittered by 3 ms: each DP group's two
    members (one per node) recorded every one of its calls. Jitter past the steps' own variation
    makes their gaps miss alike at every shift, and one came out 4x closer than unshifted by
    chance: seed 0's rank 2 was read as 2 calls behind (0.22 ms, -1 at 0.23), 4 instances
    dropped and 12 of the 58 left broke happens-before, blamed on the clocks; seed 8's 5
    ahead (0.17 ms, 2.7x closer than any other shift, but 1/68 of a step); seed 27's two
    members 4 ahead (one 1/230 of a step but 1.6x, the other 4.9x but 1/99). With 4 GPUs a
    node, 20 steps and 0.5 ms, seed 13's rank 7 was read as 11 calls behind, past the near
    shifts: 4.7x closer than any other shift, but 1/126 of a step. A shift the equal counts do
    not account for is taken only where it lines the gaps up as aligned ones are and stands
    out from every other shift, by more than chance allows on the gaps it compares: with
    5 steps and ends jittered by 5 us, seed 1's rank 2 was read as 2 calls behind on 2 gaps
    (0.8 us; 3.6 us at -1, 9 us unshifted), and rank 0 named late; with 10 steps and 0.2 ms,
    seed 12's rank 3 4 behind on 5 gaps (34 us, 73 us at -4), seed 17's 5 behind on 4."""
    from rankscope.analysis.simulate import JobSpec, simulate
    from rankscope.analysis.sources import load_digests

    spec = JobSpec(nodes=2, gpus_per_node=gpus, tp=2, steps=steps, end_jitter_ns=end_jitter_ns, seed=seed)
    report = analyze(load_digests(simulate(spec, tmp_path)))
    assert not [w for w in report.warnings if "re-aligned" in w or "missing a participant" in w]
    assert report.alignment.dropped_incomplete == 0
    assert report.alignment.happens_before_violations == 0
    assert report.late_ranks == [] and report.stragglers == []


def test_ordinal_pairs_that_break_happens_before_by_far_more_than_the_clocks_are_dropped(samples) -> None:
    """The HTA trace_filter pair (ranks 0 and 1 of a 128-rank job, sampled: each rank's trace
    lost different alltoall calls). Its alltoalls name no group, and their sizes differ per
    rank by nature, so op and order alone paired them: rank 0's 3rd and 4th alltoall with
    rank 1's 1st and 2nd, which had ended 553 and 579 ms before rank 0's began, against a
    clock uncertainty of 0.3 ms. Kept, the two made rank 0 the late rank (mean 205 ms, blame
    1.23 s), where every pair whose ends coincide (the allreduces and allgathers) has rank 1
    arriving last, as HTA's straggler analysis also finds. Found by a helper's review."""
    import warnings

    from rankscope.analysis.sources import load_digests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(load_digests([samples / "kineto" / "hta" / "trace_filter"]))
    assert report.late_ranks == [1]
    rank0, rank1 = sorted(report.ranks, key=lambda r: r.rank)
    assert rank0.blame_ns < rank1.blame_ns
    note = next(w for w in report.warnings if "broke happens-before" in w)
    assert "dropped" in note
    # Their communicator is named by no trace: groups pooled, or calls lost (these were).
    assert ("(calls of several process groups their traces do not name, pooled as one, or a capture that lost calls "
            "of one rank)") in note
    # Wrong, and reported: no order pairs these alltoalls (of their ends only rank 0's 2nd and rank 1's
    # 1st coincide). Paired 2 calls off, on one gap that missed its reference's by 21 of 67 ms (taken
    # before: four calls each, a shift their counts do not account for), both pairs broke happens-before
    # by far and were dropped; in order, one does and is dropped, and three break it by less: rank 0's
    # lateness (39.7 ms) is theirs, and the note says the pairing is in doubt.
    assert not any("re-aligned" in w for w in report.warnings)
    assert report.alignment.happens_before_violations == 3
    violated = next(w for w in report.warnings if "violate happens-before" in w)
    assert "calls of different groups may be paired as one collective" in violated


def test_pooled_gloo_groups_that_break_happens_before_are_said_to_be_pooled_groups() -> None:
    """Real torch 2.13 gloo traces, TP 2 x DP 2, from a plain profiler: no call names its
    group (data/gloo_tp2dp2_plain/README.md), so all four groups' all_reduces pool into one
    communicator and pair across groups by order; 13 pairs broke happens-before. The note
    blamed a capture that lost calls of one rank, which none had; it names the pooling, and
    the trace's own note what names the groups."""
    import warnings

    from rankscope.analysis.sources import load_digests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(load_digests([Path(__file__).with_name("data") / "gloo_tp2dp2_plain"]))
    assert [c.comm_id for c in report.communicators] == ["unresolved-pg:allreduce"]
    note = next(w for w in report.warnings if "broke happens-before" in w)
    assert "(calls of several process groups their traces do not name, pooled as one, or " in note
    assert any("the rankscope torch hook's Flight Recorder names each call's group" in w for w in report.warnings)


def test_pooled_nccl_communicators_that_break_happens_before_are_said_to_be_pooled_groups(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    """nsys exports without NCCL payloads (a plain `nsys export`) of two nodes of TP=2 with a
    barrier and a slow link: their all-reduce lines not told apart (as before
    `lines._agreed_offsets`, here taken away), TP, DP and world calls pool into one
    communicator and pair across groups by order; 7 pairs broke happens-before. The note
    blamed a capture that lost calls of one rank, where nothing was cut (as it did for pooled
    gloo groups). Found by an accuracy campaign against the simulator's truth."""
    import warnings

    from rankscope.analysis import lines
    from rankscope.analysis import simulate as sim
    from rankscope.analysis.simulated_exports import without_payloads
    from rankscope.analysis.sources import load_digests

    monkeypatch.setattr(lines, "_agreed_offsets", lambda host, a, *rest: np.full(len(a), np.nan))

    spec = sim.JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=9, jitter_ns=300 * sim.US, tp_collectives=1,
                       barrier=True, slow_links=(1,))
    without_payloads(sim.simulate(spec, tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(load_digests([tmp_path]))
    assert any("not told apart" in w for w in report.warnings)
    note = next(w for w in report.warnings if "broke happens-before" in w)
    assert "(calls of several process groups their traces do not name, pooled as one, or " in note
