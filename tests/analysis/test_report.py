"""The report contract (rankscope.report/1), its round trip and the terminal table."""

from __future__ import annotations

import json

import pytest

from rankscope.analysis.pipeline import analyze
from rankscope.analysis.report import Report, fmt_gbps, fmt_ns, kernel_labels, ranks_text
from rankscope.analysis.testing import SyntheticJob, synthetic_job
from rankscope.errors import InputError

RANK_KEYS = {
    "rank", "host", "clock_offset_ns", "clock_uncertainty_ns", "late_mean_ns", "late_p99_ns", "late_max_ns",
    "last_arrival_share", "blame_ns", "nccl_kernel_ns", "nccl_wait_ns", "nccl_transfer_ns", "gpu_busy_pct",
}


@pytest.fixture(scope="module")
def report() -> Report:
    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=2, steps=25, stragglers={3: 300_000}, seed=21))
    return analyze(digests)


def test_json_has_the_contract_keys(report: Report) -> None:
    data = json.loads(report.to_json())
    assert data["schema"] == "rankscope.report/1"
    for row in data["ranks"]:
        assert RANK_KEYS <= set(row)
    assert data["stragglers"] == [3]
    for comm in data["communicators"]:
        assert {"ranks", "kind", "ops"} <= set(comm)
        assert comm["kind"] in {"tp", "dp", "other"}
        for op in comm["ops"]:
            assert {"op", "imbalance_cv", "network_cv", "transfer_mean_ns"} <= set(op)
    for tp in data["tp_overhead"]:
        assert {"comm_id", "ranks", "exposed_frac", "exposed_wait_frac", "exposed_transfer_frac"} <= set(tp)
    assert {"method", "matched_collectives", "happens_before_violations"} <= set(data["alignment"])
    assert isinstance(data["warnings"], list)


def test_round_trip(report: Report) -> None:
    again = Report.from_dict(json.loads(report.to_json()))
    assert again == report
    assert again.to_json() == report.to_json()


def test_from_dict_refuses_other_documents() -> None:
    with pytest.raises(InputError, match="not a rankscope.report/1"):
        Report.from_dict({"schema": "something/2"})
    with pytest.raises(InputError, match="malformed"):
        Report.from_dict({"schema": "rankscope.report/1", "ranks": []})


def test_table_names_stragglers_first_then_ranks_in_order(report: Report) -> None:
    lines = report.render_table().splitlines()
    straggler_line = next(i for i, line in enumerate(lines) if line.startswith("STRAGGLERS"))
    header = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    assert straggler_line < header
    assert lines[straggler_line + 1].strip().startswith("rank 3 on node001: compute")
    ranks = [line.split()[0] for line in lines[header + 2 : header + 6]]
    assert ranks == ["0", "1", "2", "3"]
    assert lines[header + 5].rstrip().endswith("*")  # rank 3 marked
    assert any(line.startswith("COMMUNICATORS") for line in lines)
    assert any(line.startswith("TP OVERHEAD") for line in lines)


def test_durations_are_printed_with_units() -> None:
    assert fmt_ns(512) == "512 ns"
    assert fmt_ns(1_790_000) == "1.79 ms"
    assert fmt_ns(12_300) == "12.3 µs"
    assert fmt_ns(None) == "-"


def test_bandwidths_are_printed_in_a_unit_that_reads() -> None:
    """A 4-byte flag's AllReduce on gloo runs at KB/s: "1.97e-06 GB/s" was printed."""
    assert fmt_gbps(285.36) == "285 GB/s"
    assert fmt_gbps(0.317) == "317 MB/s"
    assert fmt_gbps(1.97e-06) == "1.97 KB/s"
    assert fmt_gbps(0.0) == "0 KB/s"
    assert fmt_gbps(None) == fmt_gbps(float("nan")) == "-"


def test_a_large_job_table_shows_the_ranks_to_look_at_and_says_what_it_left_out() -> None:
    """80 ranks: the terminal gets the straggler and the most blamed (TABLE_ROWS of them, in
    rank order) and a line saying how many more the JSON holds; a small job shows every rank."""
    from rankscope.analysis.report import TABLE_ROWS

    digests, truth = synthetic_job(SyntheticJob(nodes=10, gpus_per_node=8, steps=8, stragglers={77: 300_000}, seed=3))
    report = analyze(digests)
    assert truth.stragglers == [77] and report.stragglers == [77] and len(report.ranks) == 80 > TABLE_ROWS
    lines = report.render_table().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rank "))
    rows = lines[header + 2: header + 2 + TABLE_ROWS]
    shown = [int(line.split()[0]) for line in rows]
    assert shown == sorted(shown) and 77 in shown and rows[shown.index(77)].rstrip().endswith("*")
    others = sorted((r for r in report.ranks if r.rank != 77), key=lambda r: (-r.blame_ns, r.rank))
    most_blamed = others[: TABLE_ROWS - 1]
    assert {r.rank for r in most_blamed} | {77} == set(shown)
    assert lines[header + 2 + TABLE_ROWS] == (f"({80 - TABLE_ROWS} more not shown: those shown are the stragglers and "
                                              "the most blamed ranks; --format json lists all 80)")
    assert len(report.to_dict()["ranks"]) == 80


def test_ranks_text_runs_and_lists() -> None:
    assert ranks_text([]) == "-"
    assert ranks_text((3, 4, 5, 6)) == "3-6"  # a tuple (a communicator's members) as a list
    assert ranks_text([0, 8, 16]) == "0,8,16"
    assert ranks_text([0, 1, 3]) == "0,1,3"
    assert ranks_text(list(range(10))[::-1]) == "9,8,7,6,5,4,…"
    assert ranks_text([0, 2_000_000_000]) == "0,2000000000"  # no range built between them


def test_no_happens_before_check_is_not_shown_as_a_pass() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=2, steps=5, seed=3))
    report = analyze(digests)
    assert "happens-before violations 0/" in report.render_table().splitlines()[1]
    report.alignment.happens_before_checked = 0
    assert report.render_table().splitlines()[1].endswith("; happens-before not checked (no N-to-N instance matched)")


def test_the_headline_names_the_job_where_the_traces_do_and_no_placeholder_where_not() -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=2, steps=5, seed=3))
    report = analyze(digests)
    report.job_id = "4242"
    assert report.render_table().splitlines()[0] == "rankscope report — job 4242: 4 ranks on 2 host(s)"
    report.job_id = None  # Kineto traces carry none: it read 'job ?'
    assert report.render_table().splitlines()[0] == "rankscope report — 4 ranks on 2 host(s)"


def test_kernel_table_shows_parameter_lists_elided_and_template_arguments_whole() -> None:
    accessor = "at::GenericPackedTensorAccessor<c10::Half, 1ul, at::RestrictPtrTraits, long>"
    fbgemm = f"void split_embedding_kernel<c10::Half, 2ul, 32>({', '.join([accessor] * 30)}, float)"
    names = [
        fbgemm,
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "void at::native::elementwise_kernel<128, 2, (anonymous namespace)::f>(int, (anonymous namespace)::f)",
        "Memcpy HtoD (Pageable -> Device)",  # a parenthesis after a space: no parameter list
        "gloo:all_reduce",
        "void empty_params_kernel<float>()",
        "void overloaded(int)",  # overloads: elided, they would read alike
        "void overloaded(float)",
    ]
    assert kernel_labels(names) == [
        "void split_embedding_kernel<c10::Half, 2ul, 32>(…)",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(…)",
        "void at::native::elementwise_kernel<128, 2, (anonymous namespace)::f>(…)",
        "Memcpy HtoD (Pageable -> Device)",
        "gloo:all_reduce",
        "void empty_params_kernel<float>()",
        "void overloaded(int)",
        "void overloaded(float)",
    ]


def test_the_table_elides_a_kernel_s_parameters_and_the_json_keeps_them(report: Report) -> None:
    name = "void k<float>(" + ", ".join(["at::GenericPackedTensorAccessor<float, 2ul>"] * 20) + ")"
    report.top_kernels = [{"name": name, "count": 3, "total_ns": 9000, "is_comm": False}]
    table = report.render_table()
    assert "void k<float>(…)" in table and name not in table
    assert json.loads(report.to_json())["top_kernels"][0]["name"] == name


def test_the_table_says_where_nccl_time_is_not_split_into_wait_and_transfer(report: Report) -> None:
    """Calls matched to no instance count in a rank's NCCL time but in neither part: a line
    under the rank table says how much, per rank, so the three columns add up."""
    from dataclasses import replace

    assert "matched to no instance" not in report.render_table()
    ranks = [replace(r, nccl_unmatched_ns=2_500_000 if r.rank == 1 else 0) for r in report.ranks]
    lines = replace(report, ranks=ranks).render_table().splitlines()
    note = next(line for line in lines if "matched to no instance" in line)
    assert "rank 1: 2.50 ms" in note and "rank 0" not in note
    assert lines.index(note) < next(i for i, line in enumerate(lines) if line.startswith("COMMUNICATORS"))


def test_the_tables_tell_long_communicator_names_apart(report: Report) -> None:
    """Names cut at the column's width read alike where they differ past it (two inferred
    groups of one prefix showed as ``inferred:allgather+reducesc…``): cut in the middle,
    both ends stay; names still alike then are shown whole."""
    from dataclasses import replace

    names = ["inferred:allgather+reducescatter:0-3", "inferred:allgather+reducescatter+allreduce:0-3",
             "pg:" + "a" * 20 + "1" + "b" * 20, "pg:" + "a" * 20 + "2" + "b" * 20]
    assert len(report.communicators) >= len(names)
    renamed = {c.comm_id: name for c, name in zip(report.communicators, names)}
    table = replace(
        report,
        communicators=[replace(c, comm_id=renamed.get(c.comm_id, c.comm_id)) for c in report.communicators],
        tp_overhead=[replace(t, comm_id=renamed.get(t.comm_id, t.comm_id)) for t in report.tp_overhead],
    ).render_table()
    assert "inferred:allg…ucescatter:0-3" in table and "inferred:allg…+allreduce:0-3" in table
    assert names[2] in table and names[3] in table  # alike when cut: whole
