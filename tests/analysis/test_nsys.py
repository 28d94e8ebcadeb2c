"""nsys SQLite ingest against the real exports in ../shared/samples/nsys.

Variants (NCCL payload blobs, a normalized export) are made by editing a *copy* of a
real export with sqlite3, the way `nsys export --include-blobs=true` / `--ts-normalize`
would have written it, so everything else in the file stays real.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rankscope.analysis import digest, nsys, nsys_export
from rankscope.analysis.pipeline import analyze
from rankscope.errors import ConsistencyError, ExportError, InputError, RankscopeWarning

DSL = "nsys/dsl_2node_2rank_allreduce"
TORCHRUN = "nsys/nsysai_2gpu_sendrecv/mfu_2gpu_before.sqlite"
EPOCH_RANGE = (1.6e18, 1.9e18)


@pytest.fixture(scope="module")
def dsl(samples: Path) -> list[Path]:
    return sorted((samples / DSL).glob("*.sqlite"))


@pytest.fixture(scope="module")
def torchrun(samples: Path) -> Path:
    return samples / TORCHRUN


def _collectives(table: pa.Table) -> pd.DataFrame:
    """Long collectives with nullable Int64 columns (exact epoch ns even where some are null)."""
    column = table.column("collectives").combine_chunks()
    frame = pa.Table.from_struct_array(pc.list_flatten(column)).to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    frame.insert(0, "rank", np.asarray(table.column("rank"))[np.asarray(pc.list_parent_indices(column))])
    return frame


def test_dsl_two_nodes_each_one_allreduce_with_rank_and_host(dsl: list[Path]) -> None:
    table = digest.concat(nsys.read_nsys(path) for path in dsl)
    meta = table.select(["rank", "rank_source", "host", "gpu", "job_id", "world_size"]).to_pylist()
    assert [m["rank"] for m in meta] == [0, 1]
    assert [m["host"] for m in meta] == ["ault43.cscs.ch", "ault44.cscs.ch"]
    assert {m["rank_source"] for m in meta} == {"env:PMI_RANK"}  # srun's PMI-2 sets it, equal to SLURM_PROCID
    assert {m["job_id"] for m in meta} == {"524890"}
    assert {m["world_size"] for m in meta} == {2}
    # CUDA_VISIBLE_DEVICES="1" on both nodes: physical GPU 1 of each host, not the first listed.
    assert meta[0]["gpu"] == "9d7f82f3-c503-8ee9-26f2-424ddefe47e2"
    assert meta[1]["gpu"] == "4bab2c5f-3d91-e162-3057-f8068c36d803"
    coll = _collectives(table)
    assert coll["op"].tolist() == ["allreduce", "allreduce"]
    assert coll["comm_id"].nunique() == 1 and coll["seq"].tolist() == [0, 0]
    assert (coll["seq_source"] == "ordinal").all()
    # Normalized export: kernel ends agree within ~1 us, starts differ ~1.8 ms (README).
    assert abs(int(coll["end_ns"].iloc[0]) - int(coll["end_ns"].iloc[1])) < 10_000
    assert 1_500_000 < int(coll["start_ns"].iloc[1]) - int(coll["start_ns"].iloc[0]) < 2_100_000
    # The host call is the ncclAllReduce range, which precedes the kernel.
    assert (coll["cpu_call_ns"] < coll["start_ns"]).all()
    assert all(any("communicator id" in w for w in ws) for ws in table.column("warnings").to_pylist())


def test_dsl_kernel_summary_and_busy_time(dsl: list[Path]) -> None:
    table = nsys.read_nsys(dsl[0])
    kernels = digest.explode(table, "kernels")
    assert kernels["name"].tolist() == ["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm *, unsigned long, ncclWork *)"]
    assert kernels["is_comm"].tolist() == [True] and kernels["count"].tolist() == [1]
    row = table.to_pylist()[0]
    coll = _collectives(table)
    nccl_ns = int(coll["end_ns"].iloc[0] - coll["start_ns"].iloc[0])
    assert row["comm_only_ns"] == nccl_ns == kernels["total_ns"].iloc[0]
    assert row["compute_only_ns"] == 0 and row["overlap_ns"] == 0
    assert row["gpu_busy_ns"] >= nccl_ns  # plus memcpy/memset time
    assert row["window_start_ns"] <= coll["start_ns"].iloc[0] < coll["end_ns"].iloc[0] <= row["window_end_ns"]


@pytest.mark.parametrize(("name", "pids", "count"), [("mfu_2gpu_before", [144, 145], 33), ("mfu_2gpu_after", [148, 149], 31)])
def test_torchrun_report_splits_into_two_ranks_with_their_sendrecv(samples: Path, name: str, pids: list[int], count: int) -> None:
    table = nsys.read_nsys(samples / "nsys" / "nsysai_2gpu_sendrecv" / f"{name}.sqlite")
    assert table.column("pid").to_pylist() == pids
    assert table.column("rank").to_pylist() == [0, 1]
    # The launcher's environment names no rank and there are no payloads: pid order, said so.
    assert set(table.column("rank_source").to_pylist()) == {"order:pid"}
    assert any("numbered 2" in w for w in table.column("warnings")[0].as_py())
    assert table.column("gpu").to_pylist() == [f"pid:{pids[0]}/cuda:0", f"pid:{pids[1]}/cuda:1"]
    coll = _collectives(table)
    assert coll.groupby("rank").size().tolist() == [count, count]
    assert set(coll["op"]) == {"sendrecv"}
    assert coll.groupby("rank")["seq"].apply(lambda s: s.tolist() == list(range(count))).all()
    kernels = digest.explode(table, "kernels")
    sendrecv = kernels[kernels["name"] == "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)"]
    assert sendrecv["count"].tolist() == [count, count] and sendrecv["is_comm"].all()
    assert kernels["is_comm"].sum() == 2
    # Grouped calls launch inside ncclGroupEnd: all but the window-cut ones are linked.
    linked = coll["cpu_call_ns"].notna()
    assert linked.sum() >= 2 * count - 4
    assert (coll.loc[linked, "cpu_call_ns"] < coll.loc[linked, "start_ns"]).all()
    assert (coll["compute_before_ns"] >= 0).all() and (coll["idle_before_ns"] >= 0).all()
    assert (coll["compute_before_ns"] > 0).any()


def test_kernels_are_summed_per_demangled_name_as_nsys_stats_sums_them(torchrun: Path) -> None:
    # Keyed by shortName, every instantiation of a template was one kernel: the sample's
    # 8 elementwise_kernel<...> (add, mul, copy, neg functors) summed into one row.
    db = nsys_export.connect(torchrun)  # read-only
    expected = db.execute(
        "SELECT (k.globalPid >> 24) & 16777215, s.value, COUNT(*), SUM(k.\"end\" - k.start) "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL AS k JOIN StringIds AS s ON s.id = k.demangledName GROUP BY 1, 2").fetchall()
    db.close()
    table = nsys.read_nsys(torchrun)
    kernels = digest.explode(table, "kernels")
    pid = dict(zip(table.column("rank").to_pylist(), table.column("pid").to_pylist()))
    found = {(pid[r], name, n, ns) for r, name, n, ns in kernels[["rank", "name", "count", "total_ns"]].itertuples(index=False)}
    assert found == set(expected)
    instances = kernels[kernels["name"].str.contains("at::native::elementwise_kernel<", regex=False)]
    assert instances.groupby("rank").size().tolist() == [8, 8]  # shortName elementwise_kernel, each rank


def test_a_helper_process_is_no_rank_of_a_torchrun_report(torchrun: Path, tmp_path: Path) -> None:
    # A process that ran kernels but no NCCL kernel and made no NCCL call (pid 100, below
    # the ranks' pids) was numbered rank 0 by pid, shifting ranks 144 and 145 to 1 and 2.
    copy = tmp_path / "helper.sqlite"
    shutil.copy(torchrun, copy)
    with sqlite3.connect(copy) as db:
        db.execute("CREATE TEMP TABLE some AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE (globalPid >> 24) & 16777215 = 144 "
                   "AND shortName NOT IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%') AND rowid % 30 = 0")
        db.execute("UPDATE some SET globalPid = (globalPid & ~(16777215 << 24)) | (100 << 24)")
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM some")
    original, edited = nsys.read_nsys(torchrun), nsys.read_nsys(copy)
    assert edited.column("pid").to_pylist() == [144, 145] and edited.column("rank").to_pylist() == [0, 1]
    for name in ("gpu_busy_ns", "window_start_ns", "window_end_ns", "collectives", "kernels"):
        assert edited.column(name).equals(original.column(name)), name
    with sqlite3.connect(copy) as db:  # pid 145 called NCCL, but none of its NCCL kernels ended in the window
        db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE (globalPid >> 24) & 16777215 = 145 "
                   "AND shortName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%')")
    hung = nsys.read_nsys(copy)
    assert hung.column("pid").to_pylist() == [144, 145] and [len(c) for c in hung.column("collectives").to_pylist()] == [33, 0]


@pytest.mark.parametrize("column", ["shortName", "demangledName"])
def test_a_kernel_name_id_that_dangles_falls_back_on_the_kernels_other_names(torchrun: Path, tmp_path: Path,
                                                                             column: str) -> None:
    # A cut window's StringIds can lack ids its rows hold (README): NCCL kernels whose
    # shortName dangled were read as unnamed, so not NCCL's: no collectives, no NCCL time.
    copy = tmp_path / "dangling.sqlite"
    shutil.copy(torchrun, copy)
    with sqlite3.connect(copy) as db:
        db.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {column} = (SELECT MAX(id) + 1 FROM StringIds) "
                   "WHERE shortName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%')")
    original, edited = nsys.read_nsys(torchrun), nsys.read_nsys(copy)
    for name in ("collectives", "comm_only_ns", "overlap_ns", "gpu_busy_ns"):
        assert edited.column(name).equals(original.column(name)), name
    nccl = [digest.explode(table, "kernels").query("is_comm") for table in (original, edited)]
    assert [frame["total_ns"].sum() for frame in nccl] == [nccl[0]["total_ns"].sum()] * 2 > [0]
    assert nccl[1]["name"].str.startswith("ncclDevKernel_SendRecv").all()


@pytest.mark.parametrize("edit", ["DELETE FROM StringIds", "UPDATE StringIds SET value = ''"])
def test_kernels_whose_names_stringids_lacks_are_said_to_be_unnamed(torchrun: Path, tmp_path: Path, edit: str) -> None:
    # found by fuzzing: an emptied StringIds read as 4,010 kernels named '<unnamed>', none
    # NCCL's, so a digest without collectives, and nothing said.
    copy = tmp_path / "unnamed.sqlite"
    shutil.copy(torchrun, copy)
    with sqlite3.connect(copy) as db:
        db.execute(edit)
    table = nsys.read_nsys(copy)
    assert [len(c) for c in table.column("collectives").to_pylist()] == [0, 0]
    notes = table.column("warnings").to_pylist()
    assert [[n for n in rank if "have no name" in n] for rank in notes] == [
        ["4010 of 4010 kernels have no name (StringIds lacks their name ids, or holds them empty): NCCL's among them "
         "are not seen as NCCL's"]] * 2


@pytest.mark.parametrize("edit", ["dangle", "drop"])
def test_nccl_kernels_known_only_by_their_mangled_name_are_nccls(torchrun: Path, tmp_path: Path, edit: str) -> None:
    # With no demangled or short name (dangling ids, or an export without those columns) a
    # kernel is named `_Z22ncclDevKernel_SendRecv...`: that was no NCCL kernel (no collectives,
    # no NCCL time) and SQL fetched no launches for it.
    copy = tmp_path / "mangled.sqlite"
    shutil.copy(torchrun, copy)
    with sqlite3.connect(copy) as db:
        for column in ("demangledName", "shortName"):
            if edit == "drop":
                db.execute(f"ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN {column}")
            else:
                db.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {column} = {column} + (SELECT MAX(id) + 1 FROM StringIds)")
    original, edited = nsys.read_nsys(torchrun), nsys.read_nsys(copy)
    for name in ("collectives", "comm_only_ns", "overlap_ns", "gpu_busy_ns"):
        assert edited.column(name).equals(original.column(name)), name
    nccl = digest.explode(edited, "kernels").query("is_comm")
    assert set(nccl["name"]) == {"_Z22ncclDevKernel_SendRecv24ncclDevKernelArgsStorageILm4096EE"}


def test_raw_and_normalized_exports_land_on_the_same_utc_base(torchrun: Path, tmp_path: Path) -> None:
    raw = nsys.read_nsys(torchrun)
    with sqlite3.connect(torchrun) as db:
        utc = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        first_kernel = db.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid >> 24 & 16777215 = 144").fetchone()[0]
    assert first_kernel < 1e12  # session-relative as exported
    normalized = tmp_path / "normalized.sqlite"
    shutil.copy(torchrun, normalized)
    with sqlite3.connect(normalized) as db:
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
                      "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            db.execute(f'UPDATE {table} SET start = start + ?, "end" = "end" + ?', (utc, utc))
        db.execute("UPDATE META_DATA_EXPORT SET value = 'true' WHERE name = 'EXPORT_PARAM_TIME_NORMALIZE'")
        db.execute("UPDATE META_DATA_EXPORT SET value = ? WHERE name = 'EXPORT_CONFIG_TIME_SHIFT'", (str(utc),))
    norm = nsys.read_nsys(normalized)
    assert raw.column("window_start_ns").to_pylist()[0] == first_kernel + utc
    for column in ("window_start_ns", "window_end_ns", "gpu_busy_ns"):
        assert norm.column(column).to_pylist() == raw.column(column).to_pylist()
    a, b = _collectives(raw), _collectives(norm)
    for column in ("start_ns", "end_ns", "cpu_call_ns"):
        assert a[column].equals(b[column])
    assert EPOCH_RANGE[0] < a["start_ns"].min() and a["end_ns"].max() < EPOCH_RANGE[1]
    assert a["start_ns"].dtype == pd.Int64Dtype()


def _blob(schema: int, payload: bytes) -> bytes:
    # [domainId u64][schemaId u64][payloadSize u64][payloadOffset u64] then the payload.
    return struct.pack("<QQQQ", 1, schema, len(payload), 0) + payload


COMM = 0xF123_4567_89AB_CDEF  # high bit set: must survive as an unsigned u64


def _with_payloads(source: Path, target: Path, recv_comm: int = COMM) -> None:
    """As if exported with --include-blobs=true by NCCL 2.27: send/recv payloads on every
    call (the recvs on ``recv_comm``), and a CommInitRank range per process giving ranks
    opposite to pid order."""
    shutil.copy(source, target)
    with sqlite3.connect(target) as db:
        ids = dict(db.execute("SELECT value, id FROM StringIds WHERE value IN ('ncclSend', 'ncclRecv')"))
        for pid, peer in ((144, 1), (145, 0)):
            for call, comm in (("ncclSend", COMM), ("ncclRecv", recv_comm)):
                payload = struct.pack("<QQi", comm, 1024, peer) + b"\0" * 4
                db.execute(
                    "UPDATE NVTX_EVENTS SET binaryData = ? WHERE domainId = 1 AND textId = ? AND (globalTid >> 24) & 16777215 = ?",
                    (_blob(16777226, payload), ids[call], pid),
                )
        init_id = db.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()[0]
        db.execute("INSERT INTO StringIds (id, value) VALUES (?, 'ncclCommInitRank')", (init_id,))
        for pid, rank, device in ((144, 1, 0), (145, 0, 1)):
            tid, start = db.execute(
                "SELECT globalTid, MIN(start) FROM NVTX_EVENTS WHERE domainId = 1 AND (globalTid >> 24) & 16777215 = ?", (pid,)
            ).fetchone()
            payload = struct.pack("<Qiii", COMM, 2, rank, device) + b"\0" * 4
            db.execute(
                "INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, textId, domainId, binaryData) VALUES (?, ?, 59, ?, ?, 1, ?)",
                (start - 1000, start - 500, tid, init_id, _blob(16777218, payload)),
            )
        db.execute("UPDATE META_DATA_EXPORT SET value = 'true' WHERE name = 'EXPORT_PARAM_INCLUDE_BLOBS'")


def test_payload_blobs_give_communicator_bytes_peer_and_rank(torchrun: Path, tmp_path: Path) -> None:
    path = tmp_path / "blobs.sqlite"
    _with_payloads(torchrun, path)
    table = nsys.read_nsys(path)
    # Ranks from the CommInitRank payload, not pid order.
    assert dict(zip(table.column("pid").to_pylist(), table.column("rank").to_pylist())) == {144: 1, 145: 0}
    assert set(table.column("rank_source").to_pylist()) == {"nccl:CommInitRank"}
    assert table.column("world_size").to_pylist() == [2, 2]
    coll = _collectives(table)
    linked = coll["cpu_call_ns"].notna() & coll["bytes"].notna()
    assert linked.sum() >= 60
    assert set(coll.loc[linked, "comm_id"]) == {f"{COMM:016x}"}
    # Each group holds 2 ncclSend + 2 ncclRecv of 1024 bytes.
    assert set(coll.loc[linked, "bytes"]) == {4096}
    peers = coll[linked].groupby("rank")["peer"].unique().to_dict()
    assert [list(peers[0]), list(peers[1])] == [[0], [1]]  # rank 0 is pid 145 (peer 0 written)
    unlinked = int(coll["bytes"].isna().sum())
    assert unlinked <= 6  # kernels whose group the capture window cut off: their stream's communicator's
    assert set(coll["comm_id"]) == {f"{COMM:016x}"}
    assert any(f"{unlinked} of 66 NCCL kernels that name no communicator are taken as the one every other NCCL kernel "
               "on their stream names" in w for w in table.column("warnings")[0].as_py())
    assert not any("spanning several communicators" in w for w in table.column("warnings")[0].as_py())


def test_a_group_spanning_two_communicators_is_said_to_be_attributed_to_its_first_call(torchrun: Path,
                                                                                     tmp_path: Path) -> None:
    # The sends of each group on one communicator, the recvs on another: the export ties the
    # group's kernel to no one call, so the report must not pass the first call's off as known.
    path = tmp_path / "two_comms.sqlite"
    _with_payloads(torchrun, path, recv_comm=COMM ^ 1)
    table = nsys.read_nsys(path)
    coll = _collectives(table)
    linked = int(coll["cpu_call_ns"].notna().sum())  # the kernels of a group in the window
    assert linked >= 60
    assert f"{linked} of 66 NCCL kernels were launched by an ncclGroup spanning several communicators: each is " \
           "given the first call's communicator and no bytes (NCCL launches a kernel per communicator; the export " \
           "does not say which calls a kernel serves)" in table.column("warnings")[0].as_py()
    # The sends' bytes are not the recvs' communicator's, nor the recvs' the sends'.
    assert coll["bytes"].isna().all()


def _second_kernel_in_group(path: Path, pid: int, device: int) -> None:
    """Give process ``pid`` one more NCCL kernel (on CUDA ``device``) launched inside the
    same ncclGroupEnd as its median NCCL kernel, right after it."""
    with sqlite3.connect(path) as db:
        new = db.execute("SELECT MAX(correlationId) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        db.execute("CREATE TEMP TABLE one AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE (globalPid >> 24) & 16777215 = ? "
                   "AND shortName IN (SELECT id FROM StringIds WHERE value LIKE 'nccl%') ORDER BY start "
                   "LIMIT 1 OFFSET 16", (pid,))
        old = db.execute("SELECT correlationId FROM one").fetchone()[0]
        db.execute('UPDATE one SET correlationId = ?, deviceId = ?, start = "end" + 1000, "end" = "end" + 3000', (new, device))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM one")
        db.execute("CREATE TEMP TABLE launch AS SELECT * FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE correlationId = ?", (old,))
        db.execute('UPDATE launch SET correlationId = ?, start = start + 1, "end" = "end" + 1', (new,))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME SELECT * FROM launch")


def test_a_group_split_over_two_kernels_gives_neither_the_groups_bytes(torchrun: Path, tmp_path: Path) -> None:
    # NCCL can launch a group past one kernel's budget as several kernels (NVIDIA/nccl#1768):
    # each was given all of the group's calls, its 4096 bytes counted once per kernel.
    path = tmp_path / "split.sqlite"
    _with_payloads(torchrun, path)
    _second_kernel_in_group(path, 144, 0)
    table = nsys.read_nsys(path)
    coll = _collectives(table)
    rank = coll[coll["rank"] == 1]  # pid 144
    split = rank[rank["cpu_call_ns"].duplicated(keep=False) & rank["cpu_call_ns"].notna()]
    assert len(split) == 2 and split["bytes"].isna().all()
    assert set(split["op"]) == {"sendrecv"} and set(split["comm_id"]) == {f"{COMM:016x}"}
    assert set(rank["bytes"].dropna()) == {4096} and rank["bytes"].notna().sum() >= 28
    assert "2 of 67 NCCL kernels share their ncclGroup's calls with other kernels of the group (NCCL launches one " \
           "per GPU and communicator, and splits a large group over several): each is given the calls' op and " \
           "communicator but no bytes, as the export does not say which calls each kernel ran" \
           in table.column("warnings")[0].as_py()


def test_a_group_over_two_gpus_gives_each_gpus_kernel_its_own_communicators_calls(torchrun: Path, tmp_path: Path) -> None:
    # One thread driving two GPUs' communicators in one group (ncclCommInitAll style): pid 144's
    # sends on COMM (GPU 0, its CommInitRank says) and recvs on COMM ^ 1, initialised on GPU 1.
    # Each GPU's kernel was given both communicators' calls and bytes.
    path = tmp_path / "two_gpus.sqlite"
    _with_payloads(torchrun, path, recv_comm=COMM ^ 1)
    with sqlite3.connect(path) as db:
        tid, start, init = db.execute("SELECT globalTid, start, textId FROM NVTX_EVENTS WHERE textId = (SELECT id FROM StringIds "
                                      "WHERE value = 'ncclCommInitRank') AND (globalTid >> 24) & 16777215 = 144").fetchone()
        payload = struct.pack("<Qiii", COMM ^ 1, 2, 1, 1) + b"\0" * 4
        db.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, textId, domainId, binaryData) "
                   "VALUES (?, ?, 59, ?, ?, 1, ?)", (start + 100, start + 200, tid, init, _blob(16777218, payload)))
    _second_kernel_in_group(path, 144, 1)
    coll = _collectives(nsys.read_nsys(path))
    gpu1 = coll[coll["comm_id"] == f"{COMM ^ 1:016x}"]
    assert len(gpu1) == 1 and gpu1["bytes"].tolist() == [2048] and gpu1["op"].tolist() == ["recv"]
    mate = coll[coll["end_ns"] == gpu1["start_ns"].iloc[0] - 1000]  # the GPU 0 kernel it was copied from
    assert mate["bytes"].tolist() == [2048] and mate["op"].tolist() == ["send"] and mate["comm_id"].tolist() == [f"{COMM:016x}"]


def test_a_communicator_a_process_set_up_on_two_gpus_gives_each_gpus_kernel_its_calls(torchrun: Path, tmp_path: Path) -> None:
    # ncclCommInitAll gives each GPU of a process one unique id, so one communicator id
    # (commHash): pid 144 is ranks 1 (GPU 0) and 2 (GPU 1) of COMM, pid 145 rank 0. The GPU 1
    # kernel was given none of its group's calls (the first CommInitRank's GPU took them all),
    # and was left as an 'inferred:sendrecv' communicator of its own.
    path = tmp_path / "init_all.sqlite"
    _with_payloads(torchrun, path)
    with sqlite3.connect(path) as db:
        inits = dict(db.execute("SELECT (globalTid >> 24) & 16777215, rowid FROM NVTX_EVENTS WHERE textId = (SELECT id "
                                "FROM StringIds WHERE value = 'ncclCommInitRank')"))
        for pid, rank, device in ((144, 1, 0), (145, 0, 1)):
            db.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE rowid = ?",
                       (_blob(16777218, struct.pack("<Qiii", COMM, 3, rank, device) + b"\0" * 4), inits[pid]))
        db.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, textId, domainId, binaryData) "
                   "SELECT start + 100, \"end\" + 100, eventType, globalTid, textId, domainId, ? FROM NVTX_EVENTS "
                   "WHERE rowid = ?", (_blob(16777218, struct.pack("<Qiii", COMM, 3, 2, 1) + b"\0" * 4), inits[144]))
    _second_kernel_in_group(path, 144, 1)
    table = nsys.read_nsys(path)
    assert sorted(zip(table.column("pid").to_pylist(), table.column("gpu").to_pylist(), table.column("rank").to_pylist())) \
        == [(144, "pid:144/cuda:0", 1), (144, "pid:144/cuda:1", 2), (145, "pid:145/cuda:1", 0)]
    coll = _collectives(table)
    gpu1 = coll[coll["rank"] == 2]
    assert gpu1["op"].tolist() == ["sendrecv"] and gpu1["comm_id"].tolist() == [f"{COMM:016x}"]
    assert gpu1["bytes"].isna().all()  # the group's calls are both GPUs': which ran which, the export does not say
    assert set(coll["comm_id"]) == {f"{COMM:016x}"}


@pytest.mark.parametrize("payloads", [False, True])
def test_a_launcher_environment_names_neither_world_nor_rank_of_the_ranks_it_launched(torchrun: Path, tmp_path: Path, payloads: bool) -> None:
    # `srun -n1 nsys profile torchrun --nproc_per_node=2`: the captured environment is
    # torchrun's, with srun's one task. Its world of 1 refused rank 1, and hid the payloads.
    path = tmp_path / "srun.sqlite"
    if payloads:
        _with_payloads(torchrun, path)
    else:
        shutil.copy(torchrun, path)
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                       [('SLURM_PROCID="0"',), ('SLURM_NTASKS="1"',)])
    table = nsys.read_nsys(path)
    by_pid = dict(zip(table.column("pid").to_pylist(), table.column("rank").to_pylist()))
    assert by_pid == ({144: 1, 145: 0} if payloads else {144: 0, 145: 1})
    assert table.column("world_size").to_pylist() == ([2, 2] if payloads else [None, None])


def test_a_rank_mpirun_started_inside_a_slurm_batch_script_is_mpiruns(dsl: list[Path], tmp_path: Path) -> None:
    # mpirun's ranks inherit the batch step's SLURM_PROCID: read before Open MPI's, all were one rank.
    path = tmp_path / "mpirun.sqlite"
    shutil.copy(dsl[0], path)
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO META_DATA_CAPTURE (name, value) VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                       [('OMPI_COMM_WORLD_RANK="5"',), ('OMPI_COMM_WORLD_SIZE="8"',)])
    meta = nsys.read_nsys(path).select(["rank", "rank_source", "world_size"]).to_pylist()
    assert meta == [{"rank": 5, "rank_source": "env:OMPI_COMM_WORLD_RANK", "world_size": 8}]


def test_rank_from_override(dsl: list[Path]) -> None:
    by_env = nsys.read_nsys(dsl[1], rank_from="env:SLURM_LOCALID")
    assert by_env.column("rank").to_pylist() == [0]
    assert by_env.column("rank_source").to_pylist() == ["override:env:SLURM_LOCALID"]
    by_name = nsys.read_nsys(dsl[1], rank_from=r"filename:_(\d+)\.sqlite$")
    assert by_name.column("rank").to_pylist() == [1013529]
    with pytest.raises(InputError, match="expected env:VAR or filename:REGEX"):
        nsys.read_nsys(dsl[1], rank_from="bogus")
    with pytest.raises(ExportError, match="NO_SUCH_VAR is not in the captured environment"):
        nsys.read_nsys(dsl[1], rank_from="env:NO_SUCH_VAR")
    with pytest.raises(ExportError, match="HOSTNAME='ault4.*' in the captured environment is not an integer"):
        nsys.read_nsys(dsl[1], rank_from="env:HOSTNAME")


def test_mpi_ranks_name_the_ranks_of_a_report_of_several_processes(torchrun: Path, tmp_path: Path) -> None:
    # `nsys profile -t mpi mpirun ...`: one report, mpirun's environment; MPI_RANKS (nsys-export.md §3)
    # says which process is which MPI rank, here not in pid order. They were numbered by pid.
    path = tmp_path / "mpi.sqlite"
    shutil.copy(torchrun, path)
    with sqlite3.connect(path) as db:
        tids = dict(db.execute("SELECT (globalTid >> 24) & 16777215, MIN(globalTid) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1"))
        db.execute("CREATE TABLE MPI_RANKS (globalTid INTEGER, rank INTEGER NOT NULL)")
        db.executemany("INSERT INTO MPI_RANKS VALUES (?, ?)", [(tids[144], 1), (tids[144] + 1, 1), (tids[145], 0)])
    table = nsys.read_nsys(path)
    assert dict(zip(table.column("pid").to_pylist(), table.column("rank").to_pylist())) == {144: 1, 145: 0}
    assert set(table.column("rank_source").to_pylist()) == {"nsys:MPI_RANKS"}
    assert not any("numbered 2 (process, GPU) pairs by pid" in w for w in table.column("warnings")[0].as_py())


def test_rank_from_cannot_name_several_ranks_of_one_file(torchrun: Path) -> None:
    with pytest.raises(InputError, match=r"holds 2 processes/GPUs: give each rank its own report \(rankscope rank\)"):
        nsys.read_nsys(torchrun, rank_from="env:RANK")


def test_reports_of_two_nodes_each_numbered_by_pid_are_refused_with_what_would_name_their_ranks(torchrun: Path, tmp_path: Path) -> None:
    from rankscope.analysis.sources import load_digests

    for node in ("node0", "node1"):
        path = tmp_path / f"{node}.sqlite"
        shutil.copy(torchrun, path)
        with sqlite3.connect(path) as db:
            db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (node,))
    # The hint was "check RANK or use --rank-from", a flag such a report refuses.
    with pytest.raises(ConsistencyError, match=r"rank 0 is also claimed by .*node0.sqlite \(each report numbered its "
                                               r"\(process, GPU\) pairs 0, 1, ... by pid: give each rank its own report"):
        load_digests([tmp_path])


def test_bad_files_raise_one_line_export_errors(tmp_path: Path, dsl: list[Path]) -> None:
    text = tmp_path / "notes.sqlite"
    text.write_text("not a database\n")
    with pytest.raises(ExportError, match="file is not a database") as err:
        nsys.read_nsys(text)
    assert str(text) in str(err.value) and "\n" not in str(err.value)

    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(dsl[0].read_bytes()[:600_000])
    with pytest.raises(ExportError, match=r"export ends early: 600,000 of its 1,359,872 bytes \(was its export or"):
        nsys.read_nsys(truncated)
    truncated.write_bytes(dsl[0].read_bytes()[:1_358_512])  # inside its last page; read by ADBC
    with pytest.raises(ExportError, match=r"export ends early: 1,358,512 of its 1,359,872 bytes"):
        nsys.read_nsys(truncated)

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(ExportError, match="not an nsys export"):
        nsys.read_nsys(other)

    empty = tmp_path / "empty.sqlite"  # SQLite itself would open it as an empty database
    empty.write_bytes(b"")
    with pytest.raises(ExportError, match="not an SQLite export"):
        nsys.read_nsys(empty)
    with pytest.raises(ExportError, match=r"cannot open \(No such file"):
        nsys.read_nsys(tmp_path / "missing.sqlite")
    with pytest.raises(ExportError, match=r"cannot open \(Is a directory"):
        nsys.read_nsys(tmp_path)

    no_kernels = tmp_path / "no_kernels.sqlite"
    shutil.copy(dsl[0], no_kernels)
    with sqlite3.connect(no_kernels) as db:
        db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(ExportError, match="no CUDA kernels"):
        nsys.read_nsys(no_kernels)

    no_names = tmp_path / "no_names.sqlite"
    shutil.copy(dsl[0], no_names)
    with sqlite3.connect(no_names) as db:
        db.execute("DROP TABLE StringIds")
    with pytest.raises(ExportError, match=r"no StringIds table \(kernel and NVTX names are ids into it\)"):
        nsys.read_nsys(no_names)


@pytest.mark.parametrize("column", ["start", "end", "globalPid", "deviceId", "correlationId"])
def test_a_kernel_table_lacking_a_column_read_is_named(dsl: list[Path], tmp_path: Path, column: str) -> None:
    # Found by fuzzing: without "end", SQLite read the text 'end' in its place, said as kernel
    # rows holding a NULL or a non-integer; without the others, SQLite's "no such column".
    copy = tmp_path / "lacking.sqlite"
    shutil.copy(dsl[0], copy)
    with sqlite3.connect(copy) as db:
        db.execute(f'ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN "{column}" TO "was_{column}"')
    with pytest.raises(ExportError) as err:
        nsys.read_nsys(copy)
    assert str(err.value) == f"{copy}: CUPTI_ACTIVITY_KIND_KERNEL lacks {column}"


def test_an_export_cut_short_says_so_where_its_header_gives_its_length(tmp_path: Path) -> None:
    from rankscope.analysis import simulate

    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), tmp_path)
    whole = (tmp_path / "sim_rank00000.sqlite").read_bytes()
    for cut in (100, len(whole) // 2, len(whole) - 152):  # the last: inside its last page, which SQLite reads as whole
        (tmp_path / "cut.sqlite").write_bytes(whole[:cut])
        with pytest.raises(ExportError, match=f"export ends early: {cut:,} of its {len(whole):,} bytes"):
            nsys.read_nsys(tmp_path / "cut.sqlite")
    (tmp_path / "header.sqlite").write_bytes(whole[:99])  # no whole header: no length to go by
    with pytest.raises(ExportError, match="cannot read the SQLite export"):
        nsys.read_nsys(tmp_path / "header.sqlite")


@pytest.mark.parametrize(
    ("edit", "warning"),
    [
        ("UPDATE META_DATA_EXPORT SET value = '1779782330176752435' WHERE name = 'EXPORT_CONFIG_TIME_SHIFT'", "does not fit"),
        ("DELETE FROM META_DATA_EXPORT WHERE name IN ('EXPORT_PARAM_TIME_NORMALIZE', 'EXPORT_CONFIG_TIME_SHIFT')",
         "export does not record EXPORT_PARAM_TIME_NORMALIZE; timestamps look session-relative"),
        # found by review: a value other than true/false was said not to be recorded at all
        ("UPDATE META_DATA_EXPORT SET value = 'yes' WHERE name = 'EXPORT_PARAM_TIME_NORMALIZE'; "
         "DELETE FROM META_DATA_EXPORT WHERE name = 'EXPORT_CONFIG_TIME_SHIFT'",
         "export records EXPORT_PARAM_TIME_NORMALIZE as 'yes', neither true nor false; timestamps look session-relative"),
    ],
)
def test_time_base_survives_missing_or_inconsistent_export_metadata(torchrun: Path, tmp_path: Path, edit: str, warning: str) -> None:
    expected = nsys.read_nsys(torchrun).column("window_start_ns").to_pylist()
    copy = tmp_path / "edited.sqlite"
    shutil.copy(torchrun, copy)
    with sqlite3.connect(copy) as db:
        db.executescript(edit)
    table = nsys.read_nsys(copy)
    assert table.column("window_start_ns").to_pylist() == expected
    assert any(warning in w for w in table.column("warnings")[0].as_py())


@pytest.mark.parametrize("spread", [1, 1 << 20, 1 << 58], ids=["dense", "sorted", "too-wide-to-pack"])
def test_first_match_finds_the_first_table_row_of_each_key(spread: int) -> None:
    rng = np.random.default_rng(5)
    table = (rng.integers(0, 4, 300), rng.integers(0, 30, 300) * spread)
    query = (rng.integers(0, 5, 500), rng.integers(0, 32, 500) * spread)
    rows = list(zip(*(t.tolist() for t in table)))
    expected = [rows.index(key) if key in rows else -1 for key in zip(*(q.tolist() for q in query))]
    assert nsys._first_match(table, query).tolist() == expected


def test_missing_nvtx_names_say_nothing() -> None:
    facts = nsys._name_facts(np.array(["ncclAllReduce", np.nan, None, "step 3"], dtype=object))
    assert facts["op"].tolist()[1:3] == [-1, -1] and facts["op"][0] >= 0
    assert facts["number"].tolist() == [-1, -1, -1, 3]
    assert not facts["init"].any() and not facts["creates"].any() and not facts["delta"].any()


def test_codes_from_runs_match_sorting_every_row() -> None:
    rng = np.random.default_rng(9)
    runs = np.repeat(rng.integers(0, 5, 40), rng.integers(1, 30, 40))  # a batch's rows: long runs
    scattered = rng.integers(0, 5, 500)
    for file in (runs, scattered):
        tid = (file * 7 + 3) << 24 | rng.integers(0, 2, file.size)  # wide values, as globalTid
        assert nsys._run_codes(file, tid).tolist() == nsys._codes(file, tid).tolist()
        distinct, inverse = nsys._unique_runs(tid)
        expected = np.unique(tid, return_inverse=True)
        assert distinct.tolist() == expected[0].tolist() and inverse.tolist() == expected[1].tolist()


def test_grouped_calls_belong_to_their_outermost_group_end_per_thread() -> None:
    rows = [  # (tid, start, name)
        (1, 0, "ncclGroupEnd"),  # its ncclGroupStart was before the capture window
        (1, 10, "ncclGroupStart"), (1, 11, "ncclGroupStart"), (1, 12, "ncclSend"), (1, 13, "ncclGroupEnd"),
        (1, 14, "ncclRecv"), (1, 15, "ncclGroupEnd"),  # nested: launches at the outer end
        (1, 20, "ncclAllReduce"),  # ungrouped: launches inside its own range
        (2, 12, "ncclGroupStart"), (2, 13, "ncclSend"), (2, 16, "ncclGroupEnd"),  # another thread
    ]
    tid, start, name = (np.array(column) for column in zip(*rows))
    facts = nsys._name_facts(name.astype(object))  # what the build derives from each name
    nccl = {"tid": tid, "start": start, "end": start + 1, "name": name, "delta": facts["delta"], "op": facts["op"]}
    calls, launchers = nsys._group_calls(nccl)
    launch = dict(zip(zip(launchers["tid"].tolist(), launchers["start"].tolist()), launchers["call_group"].tolist()))
    assert sorted(launch) == [(1, 15), (1, 20), (2, 16)]
    served = {key: sorted(calls["name"][calls["call_group"] == group]) for key, group in launch.items()}
    assert served == {(1, 15): ["ncclRecv", "ncclSend"], (1, 20): ["ncclAllReduce"], (2, 16): ["ncclSend"]}
    assert (np.diff(calls["call_group"]) >= 0).all()  # what _served's binary search relies on


def test_ungrouped_calls_each_launch_their_own_kernels() -> None:
    rows = [(2, 5, "ncclAllReduce"), (1, 9, "ncclBroadcast"), (1, 3, "ncclCommInitRank"), (1, 4, "ncclAllGather")]
    tid, start, name = (np.array(column) for column in zip(*rows))
    facts = nsys._name_facts(name.astype(object))
    calls, launchers = nsys._group_calls({"tid": tid, "start": start, "end": start + 1, "name": name,
                                          "delta": facts["delta"], "op": facts["op"]})
    assert calls["name"].tolist() == launchers["name"].tolist() == ["ncclAllGather", "ncclBroadcast", "ncclAllReduce"]
    assert calls["call_group"].tolist() == launchers["call_group"].tolist() == [1, 2, 3]


def test_a_group_end_left_without_an_end_unlinks_its_own_kernels_only(torchrun: Path, tmp_path: Path) -> None:
    # Dropped, its ncclGroupStart left the thread's group depth above 0 for good: every
    # later call looked grouped and 27 more kernels lost their API range.
    path = tmp_path / "open_group.sqlite"
    shutil.copy(torchrun, path)
    with sqlite3.connect(path) as db:
        db.execute("""UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid = (
            SELECT n.rowid FROM NVTX_EVENTS AS n JOIN StringIds AS s ON s.id = n.textId
            WHERE s.value = 'ncclGroupEnd' AND (n.globalTid >> 24) & 16777215 = 144 ORDER BY n.start LIMIT 1 OFFSET 5)""")
    def unlinked(table: pa.Table) -> int:
        (said,) = [w for w in table.column("warnings")[0].as_py() if "have no NCCL API range" in w]
        return int(said.split(" of ")[0])

    assert unlinked(nsys.read_nsys(path)) == unlinked(nsys.read_nsys(torchrun)) + 1


def test_nccl_calls_that_launched_no_kernel_are_said_not_dropped_unsaid(torchrun: Path, tmp_path: Path) -> None:
    # A copy-engine ncclAllGather (nsys-export.md §3: MEMCPY, no kernel) between two send/recv
    # groups of each process: it made no collective row, and nothing said so.
    assert not any("launched no NCCL kernel" in w for w in nsys.read_nsys(torchrun).column("warnings")[0].as_py())
    path = tmp_path / "ce.sqlite"
    shutil.copy(torchrun, path)
    with sqlite3.connect(path) as db:
        top = db.execute("SELECT MAX(id) FROM StringIds").fetchone()[0]
        db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(top + 1, "ncclAllGather"), (top + 2, "cudaMemcpyAsync")])
        corr = db.execute("SELECT MAX(correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0] + 1
        for pid, device in ((144, 0), (145, 1)):
            tid, gpid = db.execute("SELECT globalTid, globalTid & ~16777215 FROM NVTX_EVENTS WHERE domainId = 1 "
                                   "AND (globalTid >> 24) & 16777215 = ? LIMIT 1", (pid,)).fetchone()
            end = db.execute("SELECT \"end\" FROM NVTX_EVENTS WHERE globalTid = ? AND textId = (SELECT id FROM StringIds "
                             "WHERE value = 'ncclGroupEnd') ORDER BY start LIMIT 1 OFFSET 15", (tid,)).fetchone()[0]
            db.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, globalTid, textId, domainId) VALUES (?, ?, 59, ?, ?, 1)",
                       (end + 1000, end + 31_000, tid, top + 1))
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, \"end\", eventClass, globalTid, correlationId, nameId, "
                       "returnValue) VALUES (?, ?, 0, ?, ?, ?, 0)", (end + 11_000, end + 16_000, tid, corr + pid, top + 2))
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY (start, \"end\", deviceId, contextId, greenContextId, streamId, "
                       "correlationId, globalPid, bytes, copyKind, srcKind, dstKind, copyCount) "
                       "VALUES (?, ?, ?, 1, 0, 99, ?, ?, 1048576, 10, 2, 2, 1)", (end + 51_000, end + 901_000, device, corr + pid, gpid))
    table = nsys.read_nsys(path)
    said = "2 of [0-9]+ NCCL API calls launched no NCCL kernel \\(copy-engine collectives, calls captured into a CUDA " \
           "graph, or calls with nothing to move\\?\\): they are in no collective"
    assert [w for w in table.column("warnings")[0].as_py() if re.fullmatch(said, w)]


def test_without_nvtx_the_kernel_name_is_only_a_hint_and_said_so(dsl: list[Path], tmp_path: Path) -> None:
    copy = tmp_path / "no_nvtx.sqlite"
    shutil.copy(dsl[1], copy)
    with sqlite3.connect(copy) as db:
        db.execute("DROP TABLE NVTX_EVENTS")
        launch = db.execute(
            "SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k USING (correlationId)"
        ).fetchone()[0]
    table = nsys.read_nsys(copy)
    coll = _collectives(table)
    assert coll["op"].tolist() == ["allreduce"]  # from ncclKernel_AllReduce_RING_LL_Sum_float
    assert coll["cpu_call_ns"].tolist() == [launch]  # normalized export: no shift
    assert coll["comm_id"].tolist() == ["inferred:allreduce"]
    assert any("no NCCL API range" in w for w in table.column("warnings")[0].as_py())


def test_pooled_streams_name_the_rank_of_a_report_of_several_that_pools(torchrun: Path, tmp_path: Path) -> None:
    # One report of two torchrun processes (pids 144, 145), no communicator ids: only pid 145
    # (rank 1, numbered by pid) runs its NCCL kernels on two streams. The digest keeps each
    # kernel's stream; the analysis, which sees every rank, says which rank pools them. (Said
    # by the ingest as the file's warning, it reached both ranks, and rank 0 read as pooling too.)
    copy = tmp_path / "pooled.sqlite"
    shutil.copy(torchrun, copy)
    with sqlite3.connect(copy) as db:
        db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = streamId + 1000 WHERE rowid % 2 = 0 "
                   "AND (globalPid >> 24) & 16777215 = 145 "
                   "AND shortName IN (SELECT id FROM StringIds WHERE lower(value) LIKE 'nccl%')")
    table = nsys.read_many([copy])
    streams = _collectives(table).groupby("rank")["stream"].nunique().to_dict()
    assert streams == {0: 1, 1: 2}
    inferred = r"^1 communicator\(s\) without member lists \(inferred:sendrecv\)"
    with (pytest.warns(RankscopeWarning, match=inferred),
          pytest.warns(RankscopeWarning, match=r"^NCCL calls without communicator ids \(inferred:sendrecv\) on 3 streams")):
        report = analyze(table)
    (pooled,) = [w for w in report.warnings if "several" in w]
    assert pooled.startswith("NCCL calls without communicator ids (inferred:sendrecv) on 3 streams of 2 ranks; rank 1 "
                             "on several, not told apart: "), pooled
    with pytest.warns(RankscopeWarning, match=inferred):
        assert not [w for w in analyze(nsys.read_many([torchrun])).warnings if "several" in w]