"""read_nsys recovers what the simulator put into its nsys-schema exports (plan.md contract)."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rankscope.analysis import digest, kineto, nsys, nsys_export
from rankscope.analysis import simulate, simulated_job
from rankscope.analysis.simulated_exports import without_payloads
from rankscope.errors import ConsistencyError, ExportError

SPEC = dict(nodes=2, gpus_per_node=2, tp=2, steps=3, seed=5, job_id="simjob")


@pytest.fixture(autouse=True, params=["sqlite3", "arrow"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here twice: exports read by the sqlite3 module, and by ADBC's driver
    (which hands what it cannot read as promised to the sqlite3 reader)."""
    monkeypatch.setattr(nsys_export, "ARROW_FROM_BYTES", sys.maxsize if request.param == "sqlite3" else 0)
    return request.param


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, list[Path]]:
    spec = simulate.JobSpec(**SPEC)
    return spec, simulate.simulate(spec, tmp_path_factory.mktemp("sim"))


def _edited(export: Path, copy: Path, sql: str) -> Path:
    """A copy of ``export`` with one SQL statement applied."""
    copy.write_bytes(export.read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute(sql)
    return copy


def _one_more_kernel(export: Path, copy: Path, which: str, change: str) -> Path:
    """A copy of ``export`` with one more kernel: the first ``which`` selects, with ``change``
    set and a correlation id of no launch."""
    copy.write_bytes(export.read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute(f"CREATE TEMP TABLE one AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE {which} LIMIT 1")
        db.execute(f"UPDATE one SET {change}, correlationId = -7")
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM one")
    return copy


def _long(table: pa.Table, part: str):
    column = table.column(part).combine_chunks()
    frame = pa.Table.from_struct_array(pc.list_flatten(column)).to_pandas()
    frame.insert(0, "rank", table.column("rank").to_numpy()[pc.list_parent_indices(column).to_numpy()])
    return frame


def test_ranks_hosts_gpus_and_job(job) -> None:
    spec, paths = job
    table = digest.concat(nsys.read_nsys(p) for p in paths)
    assert table.column("rank").to_pylist() == list(range(4))
    assert set(table.column("rank_source").to_pylist()) == {"env:RANK"}
    assert table.column("host").to_pylist() == [simulated_job.host_name(spec, r // 2) for r in range(4)]
    assert table.column("gpu").to_pylist() == [simulated_job.gpu_uuid(spec, r // 2, r % 2) for r in range(4)]
    assert set(table.column("job_id").to_pylist()) == {"simjob"}
    assert table.column("local_rank").to_pylist() == [0, 1, 0, 1]
    assert table.column("world_size").to_pylist() == [4] * 4
    assert all(not ws for ws in table.column("warnings").to_pylist())


def test_communicator_ids_and_bytes_from_payloads(job) -> None:
    spec, paths = job
    coll = _long(digest.concat(nsys.read_nsys(p) for p in paths), "collectives")
    expected = {
        f"{simulated_job.comm_hash(spec, kind, group):016x}": (kind, simulated_job.members(spec, kind, group))
        for kind in ("tp", "dp") for group in range(2)
    }
    assert set(coll["comm_id"]) == set(expected)
    for comm_id, rows in coll.groupby("comm_id"):
        kind, members = expected[comm_id]
        assert sorted(rows["rank"].unique().tolist()) == members
        assert set(rows["bytes"]) == {spec.tp_bytes if kind == "tp" else spec.dp_bytes}
        assert set(rows["op"]) == {"allreduce"}
        # Every member sees the same numbered instances.
        per_rank = rows.groupby("rank")["seq"].apply(sorted)
        assert all(seqs == per_rank.iloc[0] for seqs in per_rank)
    assert set(coll["step"]) == set(range(spec.steps))


def test_communicator_sizes_from_init_payloads(job) -> None:
    spec, paths = job
    comms = _long(digest.concat(nsys.read_nsys(p) for p in paths), "communicators")
    sizes = {f"{simulated_job.comm_hash(spec, kind, group):016x}": len(simulated_job.members(spec, kind, group))
             for kind in ("tp", "dp") for group in range(2)}
    assert dict(zip(comms["comm_id"], comms["size"])) == sizes
    assert comms["ranks"].isna().all()  # one rank's export cannot list the others


def _without_environment(source: Path, target: Path) -> Path:
    """As if profiled with --discard-environment=true: no captured env rows."""
    target.write_bytes(source.read_bytes())
    with sqlite3.connect(target) as db:
        db.execute("DELETE FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'")
    return target


def test_rank_from_world_communicator_payload_when_environment_was_discarded(tmp_path: Path) -> None:
    spec = simulate.JobSpec(**{**SPEC, "barrier": True})  # adds a world communicator
    paths = simulate.simulate(spec, tmp_path / "sim", nodes=[1])
    table = nsys.read_nsys(_without_environment(paths[1], tmp_path / "no_env.sqlite"))
    assert table.column("rank").to_pylist() == [3]
    assert table.column("rank_source").to_pylist() == ["nccl:CommInitRank"]
    assert table.column("world_size").to_pylist() == [4]


def test_one_process_driving_its_nodes_gpus_is_read_as_their_ranks_and_analysed_alike(tmp_path: Path) -> None:
    # JAX, or one Slurm task per node: an export per node, a thread per GPU, and each
    # communicator of one id on every GPU (NCCL's commHash). Each GPU's kernels were given
    # their group's calls only on the GPU of the process's first CommInitRank.
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=6, barrier=True, seed=3,
                            stragglers=(simulated_job.Straggler(5, "compute", 2 * simulated_job.MS),))
    per_gpu = simulate.simulate(spec, tmp_path / "gpu")
    per_node = simulate.simulate(dataclasses.replace(spec, node_process=True), tmp_path / "node")
    assert len(per_node) == 2
    table = nsys.read_many(per_node)
    assert table.column("rank").to_pylist() == list(range(8))
    assert set(table.column("rank_source").to_pylist()) == {"nccl:CommInitRank"}
    assert table.column("gpu").to_pylist() == nsys.read_many(per_gpu).column("gpu").to_pylist()
    by_node, by_gpu = (analyze(load_digests(paths)).to_dict() for paths in (per_node, per_gpu))
    assert by_node["stragglers"] == by_gpu["stragglers"] == [5]
    # per step: two TP groups of two calls, four DP pairs, one world barrier
    assert by_node["alignment"]["matched_collectives"] == by_gpu["alignment"]["matched_collectives"] == 6 * (2 * 2 + 4 + 1)
    for mine, theirs in zip(by_node["ranks"], by_gpu["ranks"], strict=True):
        assert mine["clock_offset_ns"] == pytest.approx(theirs["clock_offset_ns"])
        assert mine["late_mean_ns"] == pytest.approx(theirs["late_mean_ns"])
    assert by_node["warnings"] == []


def test_one_thread_driving_its_nodes_gpus_in_nccl_groups_gives_each_gpus_kernel_its_calls_bytes(tmp_path: Path) -> None:
    # nccl-tests -g N: one thread makes each collective an NCCL group of one call per GPU, all
    # on one communicator id, and launches every GPU's kernel in ncclGroupEnd. Each kernel
    # serves the group's calls; which is whose the export does not say, and their bytes (alike)
    # were left unknown (no busbw) with a warning.
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=6, barrier=True, seed=3, node_process=True,
                            one_thread=True, stragglers=(simulated_job.Straggler(5, "compute", 2 * simulated_job.MS),))
    paths = simulate.simulate(spec, tmp_path)
    table = nsys.read_many(paths)
    assert table.column("rank").to_pylist() == list(range(8))
    assert table.column("warnings").to_pylist() == [[]] * 8
    coll = _long(table, "collectives")
    assert coll.groupby("op")["bytes"].unique().map(sorted).to_dict() == {"allreduce": [4, spec.tp_bytes, spec.dp_bytes]}
    report = analyze(load_digests(paths)).to_dict()
    assert report["stragglers"] == [5] and report["warnings"] == []
    assert report["alignment"]["matched_collectives"] == 6 * (2 * 2 + 4 + 1)
    assert report["alignment"]["happens_before_violations"] == 0
    assert all(c["ops"][0]["busbw_gbps"] for c in report["communicators"])


def test_one_threads_launch_straggler_is_found_as_its_whole_node_as_the_truth_says(tmp_path: Path) -> None:
    # The one thread's stall before rank 5's collective launches all of node 1's GPUs late
    # (three nodes: of two, half the job would be late, and no rank a straggler).
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=3, gpus_per_node=4, tp=4, steps=6, barrier=True, seed=3, node_process=True,
                            one_thread=True, stragglers=(simulated_job.Straggler(5, "launch", 2 * simulated_job.MS),))
    report = analyze(load_digests(simulate.simulate(spec, tmp_path))).to_dict()
    assert report["stragglers"] == simulate.truth(spec)["stragglers"] == [4, 5, 6, 7]


def test_a_group_of_one_call_per_gpu_missing_a_kernel_at_the_window_edge_gives_the_others_their_bytes(
        tmp_path: Path) -> None:
    # One thread driving four GPUs; GPU 3's first NCCL kernel cut off by the window: the group
    # still holds four calls (one a GPU the process set the communicator up on), served by three
    # kernels, whose bytes were left unknown for want of a fourth.
    spec = simulate.JobSpec(nodes=1, gpus_per_node=4, tp=4, steps=3, node_process=True, one_thread=True, seed=2)
    path = simulate.simulate(spec, tmp_path)[0]
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = (SELECT k.rowid FROM CUPTI_ACTIVITY_KIND_KERNEL "
                   "AS k JOIN StringIds AS s ON k.shortName = s.id WHERE k.deviceId = 3 AND s.value LIKE 'nccl%' "
                   "ORDER BY k.start LIMIT 1)")
    coll = _long(nsys.read_many([path]), "collectives")
    assert coll.groupby("rank").size().tolist() == [6, 6, 6, 5]
    assert coll["bytes"].tolist() == [spec.tp_bytes] * 23


@pytest.mark.parametrize("layout", [
    dict(nodes=2, gpus_per_node=2, tp=1),  # pure DP: its DP group and the barrier's both hold every rank
    dict(nodes=1, gpus_per_node=4, tp=4),  # one node: its TP group and the barrier's both hold every rank
])
def test_two_communicators_of_every_rank_that_agree_name_the_ranks_of_one_process_of_a_node(
        tmp_path: Path, layout: dict) -> None:
    # Tied for the widest, they were taken as TP and DP groups of equal size (which give one
    # rank's export the same position by chance) and named no rank: the pure-DP job's node
    # processes were refused as each other's ranks 0-1, and the one-node job had no world size.
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(**layout, steps=3, barrier=True, seed=3)
    per_gpu = simulate.simulate(spec, tmp_path / "gpu")
    per_node = simulate.simulate(dataclasses.replace(spec, node_process=True), tmp_path / "node")
    table = nsys.read_many(per_node)
    assert table.column("rank").to_pylist() == list(range(4))
    assert set(table.column("rank_source").to_pylist()) == {"nccl:CommInitRank"}
    assert table.column("world_size").to_pylist() == [4] * 4
    by_node, by_gpu = (analyze(load_digests(paths)).to_dict() for paths in (per_node, per_gpu))
    assert by_node["world_size"] == by_gpu["world_size"] == 4
    assert by_node["warnings"] == by_gpu["warnings"]
    assert [r["late_mean_ns"] for r in by_node["ranks"]] == pytest.approx([r["late_mean_ns"] for r in by_gpu["ranks"]])


def test_the_communicators_of_one_process_of_a_node_name_no_rank_where_none_holds_every_rank(tmp_path: Path) -> None:
    # Without a world communicator the widest (TP, all four in the process) was taken for the
    # job's: both nodes' processes named their GPUs ranks 0-3, refused as each other's ranks.
    from rankscope.analysis.sources import load_digests

    paths = simulate.simulate(simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=2, node_process=True), tmp_path)
    assert set(nsys.read_many(paths).column("rank_source").to_pylist()) == {"order:pid"}
    with pytest.raises(ConsistencyError, match=r"each report numbered its \(process, GPU\) pairs 0, 1, ... by pid: .* \(where one "
                                               r"communicator holds every rank\)"):
        load_digests(paths)


def test_node_processes_numbered_by_pid_are_told_so_where_their_clocks_keep_their_windows_apart(tmp_path: Path) -> None:
    # Two hosts' clocks 200 ms apart put their 3-step windows apart: the refusal blamed another
    # run ("another capture window") where each node's report had numbered its GPUs 0-3.
    from rankscope.analysis.sources import load_digests

    spec = simulate.JobSpec(nodes=2, gpus_per_node=4, tp=4, steps=3, node_process=True,
                            clock_offsets_ns=(0, 200 * simulated_job.MS))
    paths = simulate.simulate(spec, tmp_path)
    with pytest.raises(ConsistencyError, match=r"each report numbered its \(process, GPU\) pairs 0, 1, ... by pid"):
        load_digests(paths)


def test_equal_sized_tp_and_dp_communicators_do_not_name_the_rank(job, tmp_path: Path) -> None:
    # Rank 3 is position 1 of both its TP and DP pairs: neither position is its global rank.
    _, paths = job
    table = nsys.read_nsys(_without_environment(paths[3], tmp_path / "no_env.sqlite"))
    assert table.column("rank_source").to_pylist() == ["default"]
    assert any("--rank-from" in w for w in table.column("warnings")[0].as_py())


def test_reading_runs_without_the_cyclic_collector_and_restores_it(job, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fetched rows are acyclic tuples: the collector is off while they are read and built
    (its walks of them cost ~15% of a load), and back on afterwards, error or not."""
    import gc

    _, paths = job
    seen: list[bool] = []
    read_file = nsys_export.read_file

    def spy(path: Path):
        seen.append(gc.isenabled())
        return read_file(path)

    monkeypatch.setattr(nsys, "read_file", spy)  # where read_many looks it up
    assert gc.isenabled()
    nsys.read_many(paths)
    assert seen == [False] * len(paths) and gc.isenabled()
    with pytest.raises(nsys.ExportError):
        nsys.read_many([*paths, paths[0].with_name("missing.sqlite")])
    assert gc.isenabled()
    gc.disable()  # a caller that had it off keeps it off
    try:
        nsys.read_many(paths)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_rows_fetched_a_few_at_a_time_give_the_same_digest(job, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sqlite3 reader fetches the big tables `FETCH_ROWS` at a time into arrays: chunks
    that split kernels, launches and NVTX rows anywhere join up to the digest of one fetch."""
    _, paths = job
    whole = nsys.read_many(paths)
    kernels = nsys_export.read_file(paths[0]).kernels
    assert len(kernels) > 7 * 3  # several chunks of 7, the last one short
    monkeypatch.setattr(nsys_export, "ARROW_FROM_BYTES", sys.maxsize)
    monkeypatch.setattr(nsys_export, "FETCH_ROWS", 7)
    assert nsys_export.read_file(paths[0]).kernels.tolist() == kernels.tolist()
    assert nsys.read_many(paths).equals(whole)


@pytest.mark.parametrize("edit, table", [
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL WHERE rowid = 1", "kernels"),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 1", "kernels"),
    ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 1e300 WHERE rowid = 1", "kernels"),  # past int64
    ("UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS)", "nvtx"),
])
def test_a_null_where_integers_are_read_is_an_error_naming_the_export(job, tmp_path: Path, edit: str, table: str) -> None:
    # The schema lets globalPid and globalTid be NULL; a traceback named no file.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", edit)
    with pytest.raises(ExportError, match=f"its {table} rows hold a NULL or a non-integer") as err:
        nsys.read_nsys(copy)
    assert str(copy) in str(err.value)


@pytest.mark.parametrize("edit, note", [
    ("UPDATE META_DATA_EXPORT SET value = NULL", "export schema version unknown"),
    ("UPDATE NVTX_PAYLOAD_SCHEMA_ENTRIES SET type = 'x'", "no NCCL payload schemas to decode them"),
    ('UPDATE NVTX_PAYLOAD_SCHEMA_ENTRIES SET "offset" = 1e300', "no NCCL payload schemas to decode them"),
])
def test_metadata_and_payload_schemas_of_the_wrong_type_are_read_as_absent(job, tmp_path: Path, edit: str,
                                                                          note: str) -> None:
    # SQLite keeps any value in any column: a TypeError or OverflowError named no file.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", edit)
    (notes,) = nsys.read_nsys(copy).column("warnings").to_pylist()
    assert any(note in n for n in notes), notes


@pytest.mark.parametrize("version, note", [
    ("3." + "9" * 5000, f"export schema version unknown (EXPORT_SCHEMA_VERSION '3.{'9' * 62}'... is no version)"),
    ("9" * 5000 + ".1", f"export schema version unknown (EXPORT_SCHEMA_VERSION '{'9' * 64}'... is no version)"),
    ("3.99." + "x" * 5000, f"export schema '3.99.{'x' * 59}'... is outside the tested 3.13 to 3.28"),
])
def test_a_schema_version_of_thousands_of_digits_is_read_as_unknown_with_a_warning(job, tmp_path: Path, version: str,
                                                                                   note: str) -> None:
    # Found by fuzzing: int() refuses past 4,300 digits, a ValueError traceback naming no file.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   f"UPDATE META_DATA_EXPORT SET value = '{version}' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    (notes,) = nsys.read_nsys(copy).column("warnings").to_pylist()
    assert any(n.startswith(note) for n in notes), notes


def test_a_schema_version_of_another_major_is_refused_in_a_line_of_bounded_length(job, tmp_path: Path) -> None:
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   f"UPDATE META_DATA_EXPORT SET value = '4.0.{'x' * 5000}' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    with pytest.raises(ExportError) as err:
        nsys.read_nsys(copy)
    assert str(err.value) == f"{copy}: unsupported nsys export schema '4.0.{'x' * 60}'... (supported: 3.13 to 3.28)"


@pytest.mark.parametrize("shift, shown", [
    ("--5", "'--5'"), ("\u00b2", "'\u00b2'"), ("1e3", "'1e3'"), (" 7", "' 7'"), ("1.5", "'1.5'"), ("abc", "'abc'"),
    pytest.param("1" * 5000, f"'{'1' * 64}'...", id="5000-digits"),
])
def test_a_time_shift_that_is_not_an_integer_is_read_as_absent_with_a_warning(job, tmp_path: Path, shift: str,
                                                                             shown: str) -> None:
    # str.isdigit() of '--5'.lstrip('-') and of '\u00b2' is True, which int() refused in a
    # ValueError traceback naming no file, as it did 5,000 digits; then each was passed by unsaid.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   f"UPDATE META_DATA_EXPORT SET value = '{shift}' WHERE name = 'EXPORT_CONFIG_TIME_SHIFT'")
    expected = nsys.read_nsys(paths[0]).column("window_start_ns").to_pylist()
    edited = nsys.read_nsys(copy)
    assert edited.column("window_start_ns").to_pylist() == expected  # by EXPORT_PARAM_TIME_NORMALIZE
    (notes,) = edited.column("warnings").to_pylist()
    assert f"EXPORT_CONFIG_TIME_SHIFT {shown} is not an integer (int64 ns); used EXPORT_PARAM_TIME_NORMALIZE=false" in notes


def test_payload_ranks_out_of_any_range_are_read_as_absent(job, tmp_path: Path) -> None:
    # Read as 8 bytes from the blob's start, a rank is the communicator id's garbage: it
    # ended building the digest's int32 columns in an ArrowInvalid traceback.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", "UPDATE NVTX_PAYLOAD_SCHEMA_ENTRIES SET type = 22, "
                   "\"offset\" = 0 WHERE name IN ('No. of ranks', 'Rank', 'CUDA device')")
    original, edited = nsys.read_nsys(paths[0]), nsys.read_nsys(copy)
    (notes,) = edited.column("warnings").to_pylist()
    assert any("NCCL payload ranks or counts out of range" in n for n in notes), notes
    assert edited.column("rank").to_pylist() == original.column("rank").to_pylist()  # from the environment


@pytest.mark.parametrize("offset", [-1, -1_000_000, -(2**63), 2**63 - 41, 2**40])
def test_payload_schema_offsets_out_of_any_blob_are_read_as_absent(job, tmp_path: Path, offset: int) -> None:
    # Found by fuzzing: -1,000,000 indexed before the blobs (an IndexError traceback), 2**63 - 41
    # wrapped round past the check that a field ends within its blob.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   f"UPDATE NVTX_PAYLOAD_SCHEMA_ENTRIES SET \"offset\" = {offset} WHERE name = 'NCCL communicator ID'")
    original, edited = nsys.read_nsys(paths[0]), nsys.read_nsys(copy)
    (notes,) = edited.column("warnings").to_pylist()
    assert any("NCCL payload schema offsets out of range" in n for n in notes), notes
    assert edited.column("rank").to_pylist() == original.column("rank").to_pylist()
    (collectives,) = edited.column("collectives").to_pylist()
    assert all(c["comm_id"].startswith("inferred:") for c in collectives), collectives[0]  # no id read


@pytest.mark.parametrize("value", ["3000000000", "99999999999999999999"])
def test_a_rank_beyond_int32_is_an_error_naming_the_export(job, tmp_path: Path, value: str) -> None:
    # The digest's rank is int32: an ArrowInvalid or OverflowError traceback named no file.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   f"""UPDATE META_DATA_CAPTURE SET value = 'RANK="{value}"' WHERE value LIKE 'RANK=%'""")
    with pytest.raises(ExportError, match=f"RANK='{value}' in the captured environment is beyond any rank"):
        nsys.read_nsys(copy)
    named = tmp_path / f"rank{value}.sqlite"
    named.write_bytes(paths[0].read_bytes())
    with pytest.raises(ExportError, match=rf"--rank-from filename:rank\(\\d\+\): {value} is beyond any rank"):
        nsys.read_nsys(named, rank_from=r"filename:rank(\d+)")


def test_a_rank_of_thousands_of_digits_is_the_same_one_line_error(job, tmp_path: Path) -> None:
    # int() refuses past 4,300 digits: a ValueError traceback, and the value whole in the message.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   f"""UPDATE META_DATA_CAPTURE SET value = 'RANK="{"7" * 5000}"' WHERE value LIKE 'RANK=%'""")
    with pytest.raises(ExportError, match=f"RANK='{'7' * 64}'\\.\\.\\. in the captured environment is beyond any rank"):
        nsys.read_nsys(copy)


def test_a_kernel_on_another_gpu_of_a_rank_process_is_left_out_not_taken_for_a_rank(job, tmp_path: Path) -> None:
    # PyTorch work on cuda:0 before torch.cuda.set_device made a second "rank" numbered
    # by pid, which then collided with the real rank 0 and dropped the env rank.
    _, paths = job
    copy = _one_more_kernel(paths[1], tmp_path / "stray.sqlite", "deviceId = (SELECT deviceId FROM "
                            "CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1)", "deviceId = deviceId + 1")
    original, edited = nsys.read_nsys(paths[1]), nsys.read_nsys(copy)
    assert edited.num_rows == 1
    assert edited.column("rank").to_pylist() == original.column("rank").to_pylist() == [1]
    assert edited.column("rank_source").to_pylist() == ["env:RANK"]
    assert edited.column("gpu_busy_ns").equals(original.column("gpu_busy_ns"))
    (warnings,) = edited.column("warnings").to_pylist()
    assert any("but its NCCL kernels on another GPU" in w for w in warnings)


def test_a_helper_process_without_nccl_kernels_is_left_out_not_taken_for_a_rank(job, tmp_path: Path) -> None:
    # nsys traces the rank's child processes too: one that ran a kernel (a compile worker's
    # autotuning, say) made the export one of two processes, numbered by pid, so the rank
    # lost its env rank and took rank 0, which the real rank 0 also claimed.
    _, paths = job
    copy = _one_more_kernel(paths[1], tmp_path / "helper.sqlite",
                            "shortName NOT IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%')",
                            "globalPid = (globalPid & ~(16777215 << 24)) | (7 << 24)")
    original, edited = nsys.read_nsys(paths[1]), nsys.read_nsys(copy)
    assert edited.num_rows == 1
    assert edited.column("rank").to_pylist() == original.column("rank").to_pylist() == [1]
    assert edited.column("rank_source").to_pylist() == ["env:RANK"]
    assert edited.column("pid").equals(original.column("pid"))
    assert edited.column("gpu_busy_ns").equals(original.column("gpu_busy_ns"))
    (warnings,) = edited.column("warnings").to_pylist()
    assert any("pid 7 ran kernels on cuda:" in w and "made no NCCL call" in w for w in warnings)


@contextlib.contextmanager
def _writing(path: Path, *statements: str) -> Iterator[None]:
    """A writer in another process, as nsys export is, that has run ``statements`` and holds
    its connection open. Not this process: the reader's SQLite (ADBC's own copy) and the
    sqlite3 module's share the process's POSIX locks, so one does not see the other's."""
    code = ("import sqlite3, sys\ndb = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "for statement in sys.argv[2:]:\n    db.execute(statement)\nprint('held', flush=True)\nsys.stdin.read()")
    writer = subprocess.Popen([sys.executable, "-c", code, str(path), *statements],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "held\n"
        yield
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)


def test_an_export_being_written_is_refused_and_a_wal_export_read_whole(job, tmp_path: Path) -> None:
    # Opened immutable=1, an export under a writer's lock read as finished (here: without
    # its NVTX rows, so no op, communicator or call time), and a -wal file was ignored.
    _, paths = job
    whole = nsys.read_nsys(paths[0])
    locked = tmp_path / "locked.sqlite"
    locked.write_bytes(paths[0].read_bytes())
    with _writing(locked, "BEGIN EXCLUSIVE", "DELETE FROM NVTX_EVENTS"):
        with pytest.raises(ExportError, match="export is locked by a process writing it") as err:
            nsys.read_nsys(locked)
    assert str(locked) in str(err.value) and "\n" not in str(err.value)

    wal = tmp_path / "wal.sqlite"
    wal.write_bytes(paths[0].read_bytes())
    # wal_autocheckpoint=0: the change stays in wal.sqlite-wal.
    with _writing(wal, "PRAGMA journal_mode=WAL", "PRAGMA wal_autocheckpoint=0",
                  "UPDATE TARGET_INFO_SYSTEM_ENV SET value = 'walhost' WHERE name = 'Hostname'"):
        assert nsys.read_nsys(wal).column("host").to_pylist() == ["walhost"] != whole.column("host").to_pylist()


@pytest.mark.parametrize("table, column, rows, named", [
    ("StringIds", "value", "1", "StringIds.value"), ("META_DATA_EXPORT", "value", "1", "META_DATA_EXPORT.value"),
    ("META_DATA_CAPTURE", "value", "1", "META_DATA_CAPTURE.value"),
    ("TARGET_INFO_SYSTEM_ENV", "value", "1", "TARGET_INFO_SYSTEM_ENV.value"),
    ("TARGET_INFO_CUDA_DEVICE", "uuid", "1", "TARGET_INFO_CUDA_DEVICE.uuid"),
    # The NCCL domain's creation keeps its name, so that its ranges are read.
    ("NVTX_EVENTS", "text", "eventType != 75", "NVTX_EVENTS.text or StringIds.value"),
])
def test_strings_stored_as_blobs_are_read_as_text_or_refused_naming_the_export_and_column(
        job, tmp_path: Path, table: str, column: str, rows: str, named: str) -> None:
    # SQLite keeps a BLOB in a TEXT column as it is: it came back as bytes, which ended in a
    # TypeError (str methods) or an ArrowInvalid (the digest's string columns) traceback.
    # Refused, it named the column as the statement's cast, 'CAST(value AS TEXT)'.
    _, paths = job
    blobs = _edited(paths[0], tmp_path / "blobs.sqlite", f"UPDATE {table} SET {column} = CAST({column} AS BLOB)")
    assert nsys.read_nsys(blobs).drop_columns("source_file").equals(nsys.read_nsys(paths[0]).drop_columns("source_file"))
    garbled = _edited(paths[0], tmp_path / "garbled.sqlite", f"UPDATE {table} SET {column} = X'fffe00' WHERE {rows}")
    with pytest.raises(ExportError, match=f"cannot read the SQLite export \\(Could not decode to UTF-8 column '{named}'") as err:
        nsys.read_nsys(garbled)
    assert str(err.value).startswith(f"{garbled}: ")


def test_times_that_leave_int64_at_epoch_ns_are_an_error_naming_the_export(job, tmp_path: Path) -> None:
    # numpy's addition of the offset wrapped round: a window starting ~1678 read as fine.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite",
                   "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 9223372036854775000")
    with pytest.raises(ExportError, match="times in its kernels leave int64 once moved to UTC epoch ns") as err:
        nsys.read_nsys(copy)
    assert str(copy) in str(err.value)
    late = _one_more_kernel(paths[0], tmp_path / "late.sqlite", "1",
                            'start = 9223372036854775000, "end" = 9223372036854775800')
    with pytest.raises(ExportError, match="times in its kernels leave int64 once moved to UTC epoch ns"):
        nsys.read_nsys(late)


@pytest.mark.parametrize("when", ["start = 4611686018427387904, \"end\" = 4611686018427388904",  # 2**62: int64-safe
                                  '"end" = "end" + 8 * 86400 * 1000000000'])
def test_a_kernel_days_from_the_session_start_is_an_error_naming_the_export(job, tmp_path: Path, when: str) -> None:
    # Within int64 still, so it was read: one rank's window ran 146 years, its lateness 7.5e9 s.
    _, paths = job
    far = _one_more_kernel(paths[0], tmp_path / "far.sqlite", "1", when)
    with pytest.raises(ExportError, match=r"times in its kernels lie [\d,]+ days from the session start \(utcEpochNs\)") as err:
        nsys.read_nsys(far)
    assert str(err.value).startswith(f"{far}: ")


@pytest.mark.parametrize("beyond", [2**40, -(2**16)])
def test_a_copy_on_a_device_beyond_any_gpu_is_an_error_not_busy_time_of_another_export(job, tmp_path: Path,
                                                                                        beyond: int) -> None:
    # Found by fuzzing: a rank is keyed (export, pid) * 2**16 + device, so a MEMCPY row's
    # deviceId 2**40 + d keyed the next export's rank of that pid on cuda:d, whose window and
    # GPU busy time took the copy in silently (as -2**16 + d the export's own previous pid's).
    _, paths = job
    with contextlib.closing(sqlite3.connect(paths[1])) as db:
        other_pid, other_device = db.execute("SELECT globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone()
    copy = tmp_path / "copies.sqlite"
    copy.write_bytes(paths[0].read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute('CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER, "end" INTEGER, deviceId INTEGER, globalPid INTEGER)')
        db.execute('INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY SELECT start - 100000000, "end", ?, ? '
                   "FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1", (beyond + other_device, other_pid))
    with pytest.raises(ExportError) as err:
        nsys.read_many([copy, paths[1]])
    assert str(err.value) == (f"{copy}: CUPTI_ACTIVITY_KIND_MEMCPY/CUPTI_ACTIVITY_KIND_MEMSET.deviceId outside "
                              f"0..{nsys_export.MAX_DEVICE - 1}")


@pytest.mark.parametrize("digits", [16, 20, 5000])
def test_a_step_numbered_past_what_the_analysis_counts_is_no_step(job, tmp_path: Path, digits: int) -> None:
    # Found by fuzzing: "step" and 20 digits ended in an OverflowError traceback (5,000: int()'s
    # ValueError), naming no file; steps are float64 in the analysis, exact to 2**53.
    _, paths = job
    (steps,) = nsys.read_nsys(paths[0]).column("steps").to_pylist()
    copy = _edited(paths[0], tmp_path / "edited.sqlite", f"UPDATE NVTX_EVENTS SET text = 'step {'9' * digits}' "
                   f"WHERE text = 'step {steps[-1]['step']}'")
    (edited,) = nsys.read_nsys(copy).column("steps").to_pylist()
    assert edited == steps[:-1]


@pytest.mark.parametrize("edit", ["start = start - 8 * 86400 * 1000000000", '"end" = "end" + 8 * 86400 * 1000000000'])
def test_an_nccl_range_days_from_the_session_start_is_an_error_naming_the_export(job, tmp_path: Path, edit: str) -> None:
    # Found by fuzzing: NVTX times were not bounded, so a damaged NCCL range's start became
    # its kernel's host call time days away (in 1970, for a normalized export's NULL start):
    # `analyze` went on, and `digest` wrote a digest that `analyze` refused as damaged.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", f"UPDATE NVTX_EVENTS SET {edit} WHERE rowid = "
                   "(SELECT n.rowid FROM NVTX_EVENTS AS n JOIN StringIds AS s ON s.id = n.textId "
                   "WHERE s.value = 'ncclAllReduce' LIMIT 1)")
    with pytest.raises(ExportError, match=r"times in its nvtx lie 8 days from the session start \(utcEpochNs\)") as err:
        nsys.read_nsys(copy)
    assert str(err.value).startswith(f"{copy}: ")


def test_a_string_that_is_not_utf8_is_an_error_naming_the_export(job, tmp_path: Path) -> None:
    # The sqlite3 module raises this one itself: an OperationalError without a SQLite code.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "latin1.sqlite",
                   "UPDATE TARGET_INFO_SYSTEM_ENV SET value = CAST(X'ff' AS TEXT) WHERE name = 'Hostname'")
    with pytest.raises(ExportError, match="cannot read the SQLite export .*UTF-8 column 'TARGET_INFO_SYSTEM_ENV.value'") as err:
        nsys.read_nsys(copy)
    assert str(copy) in str(err.value)


def test_a_table_name_damaged_past_utf8_is_an_error_naming_the_export(job, tmp_path: Path) -> None:
    # Found by fuzzing: SQLite's "malformed database schema (NVTX_PAY\xfaOAD...)" could not
    # be decoded by the sqlite3 module, whose UnicodeDecodeError ended in a traceback.
    _, paths = job
    copy = tmp_path / "schema.sqlite"
    copy.write_bytes(paths[0].read_bytes())
    with sqlite3.connect(copy) as db:
        db.execute("PRAGMA writable_schema = ON")
        db.execute("UPDATE sqlite_master SET name = CAST(X'4e5654585ffa' AS TEXT) WHERE name = 'NVTX_PAYLOAD_SCHEMAS'")
    with pytest.raises(ExportError, match=r"cannot read the SQLite export \(malformed database schema") as err:
        nsys.read_nsys(copy)
    assert str(err.value).startswith(f"{copy}: ")


@pytest.mark.parametrize("value, problem", [
    # Times stayed within int64, so a raw export was analysed on a clock ~127 years before 1970.
    *((v, f"TARGET_INFO_SESSION_START_TIME.utcEpochNs {v:,} puts the session start before 1970") for v in (-4 * 10**18, -1)),
    # A text there ended in int()'s ValueError traceback, which named no file.
    *((v, "export has no session start time (utcEpochNs is missing or not an integer)") for v in ("NULL", "'soon'")),
])
def test_a_session_start_before_1970_or_not_an_integer_is_an_error_naming_the_export(job, tmp_path: Path, value,
                                                                                   problem: str) -> None:
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", f"UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = {value}")
    with pytest.raises(ExportError) as err:
        nsys.read_nsys(copy)
    assert str(err.value).startswith(f"{copy}: {problem}") and "\n" not in str(err.value)


_SECOND_SESSION = ("INSERT INTO TARGET_INFO_SESSION_START_TIME (utcEpochNs, utcTime, localTime) "
                   "SELECT utcEpochNs + {shift}, utcTime, localTime FROM TARGET_INFO_SESSION_START_TIME")


def test_two_session_start_times_are_an_error_naming_the_export(job, tmp_path: Path) -> None:
    # nsys writes one row: the second of two sessions merged into one export was ignored,
    # and times relative to it placed on the first's clock, unsaid.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", _SECOND_SESSION.format(shift=3600 * 10**9))
    db = sqlite3.connect(paths[0])
    (utc,), = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchall()
    db.close()
    with pytest.raises(ExportError) as err:
        nsys.read_nsys(copy)
    assert str(err.value) == (f"{copy}: TARGET_INFO_SESSION_START_TIME holds 2 different session start times "
                              f"(utcEpochNs {utc} and {utc + 3600 * 10**9}): rows of several sessions merged, whose "
                              "times cannot be placed")


def test_a_null_session_start_beside_one_is_named_null_not_the_text_none(job, tmp_path: Path) -> None:
    # Python's None was quoted as the text 'None', a value the export does not hold.
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", _SECOND_SESSION.replace("utcEpochNs + {shift}", "NULL"))
    db = sqlite3.connect(paths[0])
    (utc,), = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchall()
    db.close()
    for arrow in (False, True):
        with pytest.raises(ExportError) as err:
            nsys_export.read_file(copy, arrow=arrow)
        assert f"(utcEpochNs {utc} and NULL)" in str(err.value)


def test_a_session_start_time_repeated_is_read_as_one(job, tmp_path: Path) -> None:
    _, paths = job
    copy = _edited(paths[0], tmp_path / "edited.sqlite", _SECOND_SESSION.format(shift=0))
    assert nsys.read_nsys(copy).drop_columns("source_file").equals(nsys.read_nsys(paths[0]).drop_columns("source_file"))


def test_a_step_holds_the_times_from_its_start_up_to_its_end_not_its_end_as_the_kineto_reader_takes_it() -> None:
    # A call at a step's very end, with a gap after it, fell in the step read from nsys and
    # in none read from Kineto: the same job's collectives got different steps by source.
    times = np.array([99, 100, 150, 200, 250, 299, 300, 301])
    start, end, step = np.array([100, 250]), np.array([200, 300]), np.array([1, 2])
    values, missing = nsys._step_of({"step": step, "start": start, "end": end, "process": np.array([7, 7])},
                                    np.full(times.size, 7), times)
    from_kineto = kineto._step_of(times, {"step": step, "start_ns": start, "end_ns": end})
    assert np.where(missing, -1, values).tolist() == from_kineto.tolist() == [-1, 1, 1, -1, 2, 2, -1, -1]


def test_a_kernel_that_ends_before_it_starts_counts_no_time_and_is_warned(job, tmp_path: Path) -> None:
    # It took its length off the rank's GPU busy time and summed a negative time into its
    # top kernels, unsaid.
    _, paths = job
    original = nsys.read_nsys(paths[0])
    compute = next(k for k in original.column("kernels")[0].as_py() if not k["is_comm"])
    with sqlite3.connect(paths[0]) as db:
        (name_id,) = db.execute("SELECT id FROM StringIds WHERE value = ?", (compute["name"],)).fetchone()
    inverted = _one_more_kernel(paths[0], tmp_path / "inverted.sqlite", f"COALESCE(demangledName, shortName) = {name_id}", '"end" = start - 1000000')
    edited = nsys.read_nsys(inverted)
    assert edited.column("gpu_busy_ns").equals(original.column("gpu_busy_ns"))
    (kernel,) = [k for k in edited.column("kernels")[0].as_py() if k["name"] == compute["name"]]
    assert (kernel["count"], kernel["total_ns"]) == (compute["count"] + 1, compute["total_ns"])
    (warnings,) = edited.column("warnings").to_pylist()
    (said,) = [w for w in warnings if "end before they start" in w]
    assert said.endswith(f"1 of {sum(k['count'] for k in edited.column('kernels')[0].as_py())} kernels end before "
                         "they start (a damaged export): each counts no GPU time")


def test_kernels_without_communicator_ids_keep_their_stream(tmp_path: Path) -> None:
    """A TP=2 x DP=2 job exported without NCCL payloads: each rank runs its TP and its DP
    all-reduces on two NCCL streams (as PyTorch gives each process group one), which then
    alone tell them apart (lines.py), so the digest keeps each such kernel's stream; with
    the payloads, the communicator id does, and no stream is kept. That calls are pooled is
    said by the analysis, which sees every rank, where it cannot tell them apart: no longer
    by the ingest, of every rank."""
    spec = simulate.JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=5, seed=3)
    paths = simulate.simulate(spec, tmp_path / "tpdp")
    with_ids = _long(nsys.read_many(paths), "collectives")
    assert with_ids["stream"].isna().all() and not with_ids["comm_id"].str.startswith("inferred:").any()
    without_payloads(paths)
    table = nsys.read_many(paths)
    without = _long(table, "collectives")
    assert without["comm_id"].eq("inferred:allreduce").all()
    kind = {f"{simulated_job.comm_hash(spec, kind, group):016x}": kind for kind in ("tp", "dp") for group in range(2)}
    streams = without.groupby(with_ids["comm_id"].map(kind).to_numpy())["stream"].unique()
    assert {k: v.tolist() for k, v in streams.items()} == {"dp": [27], "tp": [23]}
    assert not [w for row in table.column("warnings").to_pylist() for w in row if "streams" in w]
