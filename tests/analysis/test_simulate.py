"""The simulator writes real-schema nsys exports of one consistent job, with truth to check against."""

from __future__ import annotations

import json
import re
import sqlite3
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from rankscope.analysis import simulate as sm
from rankscope.analysis import simulated_exports, simulated_job
from rankscope.cli import main
from rankscope.errors import ConfigError, InputError

SMALL = dict(nodes=2, gpus_per_node=4, tp=4, steps=4, seed=7, job_id="t")
EXTRA = 2_000_000


def _spec(**kw) -> sm.JobSpec:
    return sm.JobSpec(**{**SMALL, **kw})


def _query(path: Path, sql: str, *params) -> list[tuple]:
    con = sqlite3.connect(path)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def _dump_tables(sql_path: Path) -> dict[str, list[str]]:
    """table -> column names, parsed from a `sqlite3 .schema` dump of a real export."""
    tables = {}
    for m in re.finditer(r"CREATE TABLE (\w+) \((.*?)\n\);", sql_path.read_text(), re.S):
        cols = []
        for line in m.group(2).splitlines():
            line = line.split("--")[0].strip()
            if line and not line.upper().startswith("PRIMARY KEY"):
                cols.append(line.split()[0])
        tables[m.group(1)] = cols
    return tables


def _decode(con: sqlite3.Connection, blob: bytes) -> dict[str, int]:
    """Decode an NVTX payload blob by the schema entries' names, as an ingester must."""
    domain, schema, size, offset = struct.unpack_from("<4Q", blob)
    payload = blob[offset:offset + size]
    entries = con.execute(
        "SELECT name, type, COALESCE(offset, 0) FROM NVTX_PAYLOAD_SCHEMA_ENTRIES "
        "WHERE domainId=? AND schemaId=? ORDER BY idx", (domain, schema)).fetchall()
    fmt = {18: "<Q", 22: "<Q", 5: "<i"}
    return {name: struct.unpack_from(fmt.get(typ, "<i"), payload, off)[0] for name, typ, off in entries}


def test_subset_of_nodes_writes_byte_identical_files(tmp_path):
    spec = _spec(stragglers=(sm.Straggler(5),))
    full = sm.simulate(spec, tmp_path / "full")
    part = sm.simulate(spec, tmp_path / "part", nodes=[1])
    assert [p.name for p in part] == [p.name for p in full[4:]]
    for a, b in zip(full[4:], part):
        assert a.read_bytes() == b.read_bytes()
    kin_full = sm.simulate(spec, tmp_path / "kfull", fmt="kineto")
    kin_part = sm.simulate(spec, tmp_path / "kpart", nodes=[0], fmt="kineto")
    assert [a.read_bytes() for a in kin_full[:4]] == [b.read_bytes() for b in kin_part]
    # A different seed is a different job.
    other = sm.simulate(_spec(seed=8, stragglers=(sm.Straggler(5),)), tmp_path / "other", nodes=[1])
    assert other[0].read_bytes() != part[0].read_bytes()


def test_tables_and_columns_are_nsys_own(tmp_path, samples):
    real = _dump_tables(samples / "nsys" / "schema_3.25.0_nsys2026.2.1.sql")
    older = _dump_tables(samples / "nsys" / "schema_3.13.2_nsys2024.5.1.sql")
    path = sm.simulate(_spec(), tmp_path)[0]
    con = sqlite3.connect(path)
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert {"CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "StringIds", "TARGET_INFO_SESSION_START_TIME"} <= set(names)
    for table in names:
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
        if table in real:
            assert cols == real[table], table
        elif table in older:  # absent from the cut 3.25.0 sample, present in full exports
            assert cols == older[table], table
        else:  # NVIDIA SQLite Schema Reference (3.28.1); in neither sample
            assert table == "TARGET_INFO_CUDA_DEVICE"
            assert cols == ["gpuId", "cudaId", "pid", "uuid", "numMultiprocessors"]
    meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
    assert meta["EXPORT_SCHEMA_VERSION"] == "3.25.0"
    assert meta["EXPORT_PARAM_INCLUDE_BLOBS"] == "true"
    assert meta["EXPORT_PARAM_TIME_NORMALIZE"] == "false"
    con.close()


def test_identity_and_ids_follow_nsys_layout(tmp_path):
    spec = _spec()
    path = sm.simulate(spec, tmp_path, nodes=[1])[2]  # rank 6
    env = [v for (v,) in _query(path, "SELECT value FROM META_DATA_CAPTURE "
                                      "WHERE name='PROCESS_0:ENVIRONMENT_VARIABLE'")]
    assert 'RANK="6"' in env and 'LOCAL_RANK="2"' in env and 'WORLD_SIZE="8"' in env
    assert 'SLURM_JOB_ID="t"' in env
    assert _query(path, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name='Hostname'") == [("t-node001",)]
    (gpid, device), = _query(path, "SELECT DISTINCT globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL")
    pid = (gpid >> 24) & 0xFFFFFF
    assert _query(path, "SELECT pid FROM PROCESSES") == [(pid,)]
    tids = {t for (t,) in _query(path, "SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")}
    assert tids == {gpid | pid}
    uuid = _query(path, "SELECT g.uuid FROM TARGET_INFO_CUDA_DEVICE d JOIN TARGET_INFO_GPU g ON g.id=d.gpuId "
                        "WHERE d.pid=? AND d.cudaId=?", pid, device)
    assert uuid == [(simulated_job.gpu_uuid(spec, 1, 2),)]


def test_clock_model_is_what_the_export_shows(tmp_path):
    offsets, drifts = (0, 5_000_000), (0.0, 40.0)
    spec = _spec(clock_offsets_ns=offsets, clock_drifts_ppm=drifts, steps=6)
    paths = sm.simulate(spec, tmp_path)

    def dp_ends(path: Path) -> np.ndarray:
        (utc,), = _query(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
        rows = _query(path, "SELECT k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id=k.shortName "
                            "WHERE s.value LIKE 'nccl%' AND k.streamId=27 ORDER BY k.start")
        return np.array([r[0] for r in rows], dtype=np.int64) + utc

    # Rank 1 (node 0) and rank 5 (node 1) are one DP pair: their ends coincide in true time.
    node0, node1 = dp_ends(paths[1]), dp_ends(paths[5])
    assert len(node0) == len(node1) == spec.steps
    since_t0 = (node0 - spec.start_utc_ns).astype(float)  # node 0's clock is true time
    expected = offsets[1] + drifts[1] * 1e-6 * since_t0
    assert np.all(np.abs((node1 - node0) - expected) < 5_000)  # end jitter only (Laplace, 1 us)
    truth = sm.truth(spec)
    assert [n["offset_ns"] for n in truth["nodes"]] == list(offsets)
    assert [n["drift_ppm"] for n in truth["nodes"]] == list(drifts)


def test_drawn_clocks_stay_within_bounds():
    spec = _spec(nodes=6, gpus_per_node=2, tp=2, max_offset_ns=3_000_000, max_drift_ppm=10)
    nodes = sm.truth(spec)["nodes"]
    assert all(abs(n["offset_ns"]) <= 3_000_000 and abs(n["drift_ppm"]) <= 10 for n in nodes)
    assert len({n["offset_ns"] for n in nodes}) == 6


def test_payload_blobs_decode_by_entry_name(tmp_path):
    spec = _spec()
    path = sm.simulate(spec, tmp_path, nodes=[1])[1]  # rank 5: TP group 1 (position 1), DP group 1
    con = sqlite3.connect(path)
    (domain,), = con.execute("SELECT domainId FROM NVTX_EVENTS WHERE eventType=75 AND text='NCCL'").fetchall()
    ranges = con.execute("SELECT s.value, n.start, n.end, n.globalTid, n.binaryData FROM NVTX_EVENTS n "
                         "JOIN StringIds s ON s.id=n.textId WHERE n.domainId=? AND n.eventType=59 ORDER BY n.start",
                         (domain,)).fetchall()
    inits = [_decode(con, blob) for name, *_, blob in ranges if name == "ncclCommInitRank"]
    tp_hash, dp_hash = sm.comm_hash(spec, "tp", 1), sm.comm_hash(spec, "dp", 1)
    assert inits == [
        {"NCCL communicator ID": tp_hash, "No. of ranks": 4, "Rank": 1, "CUDA device": 1},
        {"NCCL communicator ID": dp_hash, "No. of ranks": 2, "Rank": 1, "CUDA device": 1},
    ]
    calls = [(r, _decode(con, r[4])) for r in ranges if r[0] == "ncclAllReduce"]
    assert len(calls) == spec.steps * 3
    sizes = {p["NCCL communicator ID"]: p["Message size [bytes]"] for _, p in calls}
    assert sizes == {tp_hash: spec.tp_bytes, dp_hash: spec.dp_bytes}
    assert {p["Reduction operation"] for _, p in calls} == {0}
    (op_name,), = con.execute("SELECT name FROM NVTX_PAYLOAD_ENUM_ENTRIES WHERE schemaId=16777232 "
                              "AND COALESCE(value, 0)=0").fetchall()
    assert op_name == "Sum"
    # Every NCCL kernel was launched inside one ncclAllReduce range on the same thread.
    launches = con.execute("SELECT r.start, r.end, r.globalTid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                           "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId=k.correlationId "
                           "JOIN StringIds s ON s.id=k.shortName WHERE s.value LIKE 'nccl%' ORDER BY r.start").fetchall()
    assert len(launches) == len(calls)
    for (start, end, tid), (call, _) in zip(launches, calls):
        assert call[1] <= start and end <= call[2] and tid == call[3]
    con.close()


def test_sharded_dp_calls_are_nccl_own_all_gather_and_reduce_scatter(tmp_path):
    """FSDP-style DP: per step an AllGather (payload: comm, size) and a ReduceScatter
    (comm, size, reduction) of the rank's shard, NCCL's sendcount and recvcount, under
    their own schema ids (2**24 + NVTX_SID_AllGather 4, ReduceScatter 7) and kernels."""
    spec = _spec(dp_sharded=True)
    path = sm.simulate(spec, tmp_path, nodes=[1])[1]
    con = sqlite3.connect(path)
    ranges = con.execute("SELECT s.value, n.binaryData FROM NVTX_EVENTS n JOIN StringIds s ON s.id=n.textId "
                         "WHERE n.binaryData IS NOT NULL ORDER BY n.start").fetchall()
    dp_hash, shard = sm.comm_hash(spec, "dp", 1), spec.dp_bytes // spec.dp
    calls = {name: [_decode(con, blob) for n, blob in ranges if n == name] for name in ("ncclAllGather", "ncclReduceScatter")}
    assert calls["ncclAllGather"] == [{"NCCL communicator ID": dp_hash, "Message size [bytes]": shard}] * spec.steps
    assert calls["ncclReduceScatter"] == [
        {"NCCL communicator ID": dp_hash, "Message size [bytes]": shard, "Reduction operation": 0}] * spec.steps
    schemas = {sid for (sid,) in con.execute("SELECT schemaId FROM NVTX_PAYLOAD_SCHEMAS")}
    assert schemas == {2**24 + 0, 2**24 + 4, 2**24 + 5, 2**24 + 7}  # CommInitRank, AllGather, AllReduce (TP), ReduceScatter
    kernels = {name for (name,) in con.execute("SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                               "JOIN StringIds s ON s.id=k.shortName WHERE s.value LIKE 'nccl%'")}
    assert kernels == {"ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclDevKernel_AllGather_RING_LL",
                       "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL"}
    con.close()
    per_step = sm.truth(spec)["collectives_per_step"]
    assert [(c["comm"], c["op"], c["bytes"]) for c in per_step if c["comm"] == "dp"] == [
        ("dp", "allgather", shard), ("dp", "reducescatter", shard)]


@pytest.mark.parametrize("layout", [dict(tp=2), dict(tp=1), dict(tp=4, barrier=True)])
def test_every_member_names_the_same_communicators(tmp_path, layout):
    spec = _spec(**layout)
    truth = sm.truth(spec)
    expected = {(c["comm_hash"], r): (len(c["ranks"]), c["ranks"].index(r))
                for c in truth["communicators"] for r in c["ranks"]}
    seen = {}
    for rank, path in enumerate(sm.simulate(spec, tmp_path)):
        con = sqlite3.connect(path)
        blobs = con.execute("SELECT n.binaryData FROM NVTX_EVENTS n JOIN StringIds s ON s.id=n.textId "
                            "WHERE s.value='ncclCommInitRank'").fetchall()
        for (blob,) in blobs:
            p = _decode(con, blob)
            seen[(p["NCCL communicator ID"], rank)] = (p["No. of ranks"], p["Rank"])
        con.close()
    assert seen == expected
    kinds = {c["kind"] for c in truth["communicators"]}
    assert kinds == ({"tp"} if spec.tp > 1 else set()) | {"dp"} | ({"world"} if spec.barrier else set())


def test_step_ranges_enclose_their_device_work(tmp_path):
    spec = _spec()
    path = sm.simulate(spec, tmp_path, nodes=[0])[0]
    steps = _query(path, "SELECT text, start, end FROM NVTX_EVENTS WHERE domainId=0 AND eventType=59 ORDER BY start")
    assert [s[0] for s in steps] == [f"step {i}" for i in range(spec.steps)]
    kernels = np.array(_query(path, "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start"))
    per_step = len(kernels) // spec.steps
    for i, (_, start, end) in enumerate(steps):
        chunk = kernels[i * per_step:(i + 1) * per_step]
        assert start <= chunk[:, 0].min() and chunk[:, 1].max() <= end


def _rank(truth: dict, rank: int) -> dict:
    return truth["ranks"][rank]


@pytest.mark.parametrize("kind", ["compute", "launch"])
def test_truth_straggler_is_late_by_its_extra(kind):
    spec = _spec(stragglers=(sm.Straggler(5, kind, EXTRA),))
    truth = sm.truth(spec)
    assert truth["stragglers"] == [5]
    tp = _rank(truth, 5)["by_comm"]["tp"]
    # Late by the extra at the step's first TP collective, on time at the second; the
    # rest is compute jitter (4 kernels x 10 us std on each of the 4 members).
    assert abs(tp["late_max_ns"] - EXTRA) < 200_000
    assert abs(tp["late_mean_ns"] - EXTRA / 2) < 100_000
    # Its TP peers were not late in TP, but the whole node reached the DP AllReduce late.
    for peer in (4, 6, 7):
        assert _rank(truth, peer)["by_comm"]["tp"]["late_max_ns"] < 150_000
        assert abs(_rank(truth, peer)["by_comm"]["dp"]["late_mean_ns"] - EXTRA) < 100_000
    for other in range(4):
        assert _rank(truth, other)["late_max_ns"] < 150_000


def test_one_threads_launch_straggler_makes_its_whole_node_late_and_the_truth_names_them_all():
    # One thread launches every GPU of the node: its stall before rank 5's collective holds
    # back its node's GPUs alike (late in DP; in TP, all four together, none), and nothing
    # in the exports says which one it was for. A compute straggler stays its own GPU's.
    launch = sm.truth(_spec(node_process=True, one_thread=True, stragglers=(sm.Straggler(5, "launch", EXTRA),)))
    assert launch["stragglers"] == [4, 5, 6, 7]
    for rank in (4, 5, 6, 7):
        assert abs(_rank(launch, rank)["by_comm"]["dp"]["late_max_ns"] - EXTRA) < 200_000
    compute = sm.truth(_spec(node_process=True, one_thread=True, stragglers=(sm.Straggler(5, "compute", EXTRA),)))
    assert compute["stragglers"] == [5]
    # On one node the stall holds back the whole job: no rank is late against another.
    alone = sm.truth(_spec(nodes=1, node_process=True, one_thread=True, stragglers=(sm.Straggler(1, "launch", EXTRA),)))
    assert alone["stragglers"] == [] and max(r["late_max_ns"] for r in alone["ranks"]) < 150_000


def test_straggler_kinds_differ_on_the_device(tmp_path):
    def gap_and_busy(spec: sm.JobSpec, rank: int) -> tuple[int, int]:
        path = sm.simulate(spec, tmp_path / spec.stragglers[0].kind, nodes=[rank // 4])[rank % 4]
        rows = _query(path, "SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                            "JOIN StringIds s ON s.id=k.shortName ORDER BY k.start")
        first_nccl = next(i for i, r in enumerate(rows) if r[2].startswith("nccl"))
        busy = sum(e - s for s, e, _ in rows[:first_nccl])
        return rows[first_nccl][0] - rows[first_nccl - 1][1], busy

    compute = _spec(stragglers=(sm.Straggler(5, "compute", EXTRA),))
    launch = _spec(stragglers=(sm.Straggler(5, "launch", EXTRA),))
    gap_c, busy_c = gap_and_busy(compute, 5)
    gap_l, busy_l = gap_and_busy(launch, 5)
    assert gap_c < 10_000 and busy_c > compute.compute_ns + EXTRA * 0.9
    assert gap_l > EXTRA and busy_l < launch.compute_ns * 1.1


def test_every_nth_step_only():
    truth = sm.truth(_spec(steps=6, stragglers=(sm.Straggler(2, "compute", EXTRA, every=3),)))
    tp = _rank(truth, 2)["by_comm"]["tp"]
    assert abs(tp["late_max_ns"] - EXTRA) < 100_000
    assert abs(tp["late_mean_ns"] - EXTRA * 2 / 12) < 50_000  # 2 of 6 steps, 1 of 2 TP calls each


def test_balanced_job_has_no_lateness_to_speak_of():
    truth = sm.truth(_spec(nodes=4, steps=8))
    assert truth["stragglers"] == []
    late = [r["late_max_ns"] for r in truth["ranks"]]
    assert max(late) < 150_000  # kernel jitter only: 10 us per kernel
    assert all(r["late_mean_ns"] >= 0 for r in truth["ranks"])


def test_kernels_are_named_in_full_alike_in_both_formats_and_one_short_name_covers_two(tmp_path):
    # A real export's template instantiations share a shortName; Kineto names each in full,
    # as nsys's demangledName does (its NCCL kernels too: it had their short names).
    spec = _spec(nodes=1)
    nsys_path = sm.simulate(spec, tmp_path / "nsys", nodes=[0])[0]
    kineto_path = sm.simulate(spec, tmp_path / "kineto", nodes=[0], fmt="kineto")[0]
    rows = _query(nsys_path, "SELECT DISTINCT s.value, d.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                             "JOIN StringIds s ON s.id = k.shortName JOIN StringIds d ON d.id = k.demangledName")
    assert len({d for s, d in rows if s == "flash_fwd_kernel"}) == 2
    events = json.loads(kineto_path.read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("cat") == "kernel"} == {d for _, d in rows}


def test_kineto_export_carries_groups_and_seq(tmp_path):
    spec = _spec(stragglers=(sm.Straggler(1),))
    path = sm.simulate(spec, tmp_path, nodes=[0], fmt="kineto")[1]
    doc = json.loads(path.read_text())
    info = doc["distributedInfo"]
    assert (info["rank"], info["world_size"]) == (1, 8)
    pgs = {pg["pg_desc"]: pg for pg in info["pg_config"]}
    assert pgs["TENSOR_MODEL_PARALLEL_GROUP"]["ranks"] == [0, 1, 2, 3]
    assert pgs["DATA_PARALLEL_GROUP"]["ranks"] == [1, 5]
    events = doc["traceEvents"]
    comms = [e for e in events if e["name"] == "record_param_comms"]
    kernels = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    assert len(comms) == len(kernels) == spec.steps * 3
    for c, k in zip(comms, kernels):
        assert k["pid"] == 1 and c["args"]["Seq"] == k["args"]["Seq"]
        assert c["args"]["Process Group Name"] == k["args"]["Process Group Name"]
        assert c["ts"] < k["ts"]
    tp_seqs = [c["args"]["Seq"] for c in comms if c["args"]["Process Group Ranks"] == "[0, 1, 2, 3]"]
    first = 1 + simulated_exports.KINETO_WARMUP_STEPS * 2
    assert tp_seqs == list(range(first, first + spec.steps * 2))
    steps = [e["name"] for e in events if e["name"].startswith("ProfilerStep#")]
    assert steps == [f"ProfilerStep#{i}" for i in range(spec.steps)]
    # Same clock as the nsys export of the same rank.
    nsys = sm.simulate(spec, tmp_path / "nsys", nodes=[0])[1]
    (utc,), = _query(nsys, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    (first,), = _query(nsys, "SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
    kfirst = min(e["ts"] for e in events if e.get("cat") == "kernel")
    assert abs(doc["baseTimeNanoseconds"] + kfirst * 1000 - (utc + first)) < 2


def test_cli_writes_exports_and_truth(tmp_path, capsys):
    out = tmp_path / "job"
    rc = main(["simulate", str(out), "--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--steps", "2",
               "--straggler", "3:launch:500", "--max-offset-ms", "1", "--seed", "3", "--job-id", "j9", "--fsdp"])
    assert rc == 0
    assert sorted(p.name for p in out.glob("*.sqlite")) == [f"j9_rank{r:05d}.sqlite" for r in range(4)]
    truth = json.loads((out / "truth.json").read_text())
    assert truth["stragglers"] == [3]
    assert truth["spec"]["stragglers"] == [{"rank": 3, "kind": "launch", "extra_ns": 500_000, "every": 1}]
    assert sm.read_spec(out / "truth.json") == sm.JobSpec(
        nodes=2, gpus_per_node=2, tp=2, steps=2, stragglers=(sm.Straggler(3, "launch", 500_000),),
        max_offset_ns=1_000_000, dp_sharded=True, seed=3, job_id="j9")
    assert str(out / "truth.json") in capsys.readouterr().out
    assert not list(out.glob("*.tmp"))


def test_cli_counts_the_exports_it_writes_on_a_terminal(tmp_path, capsys, monkeypatch):
    # found by review: a 1024-rank job took seconds on end with nothing on the screen (analyze counts its reads)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["simulate", str(tmp_path / "job"), "--nodes", "2", "--gpus-per-node", "2", "--tp", "2",
                 "--steps", "2"]) == 0
    err = capsys.readouterr().err
    assert err == "".join(f"\rwriting nsys exports: {done}/4" for done in range(1, 5)) + "\n"


def test_cli_interrupted_leaves_whole_exports_and_their_truth(tmp_path, capsys, monkeypatch):
    # found by review: Ctrl-C left complete exports but no truth.json, so nothing said whose they were
    from rankscope.analysis import nsys

    write, calls = sm.write_nsys, []

    def interrupted_on_the_third(ranks, path):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt  # as Ctrl-C lands inside a write
        write(ranks, path)

    monkeypatch.setattr(sm, "write_nsys", interrupted_on_the_third)
    out = tmp_path / "job"
    assert main(["simulate", str(out), "--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--steps", "2",
                 "--seed", "4"]) == 130
    assert sm.read_spec(out / "truth.json") == sm.JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=2, seed=4)
    assert sorted(out.glob("*.sqlite")) == sorted(calls[:2])
    assert sorted(nsys.read_many(calls[:2]).column("rank").to_pylist()) == [0, 1]
    assert not list(out.glob("*.tmp"))
    assert f"{out / 'truth.json'} describes their job" in capsys.readouterr().err


def test_cli_refuses_to_leave_another_jobs_ranks_beside_its_own(tmp_path, capsys):
    """A smaller job written over a larger one would leave the larger one's extra ranks in
    the folder under the new truth; the same job written node by node adds up."""
    def simulate(*extra: str) -> int:
        return main(["simulate", str(tmp_path / "job"), "--nodes", "2", "--gpus-per-node", "2", "--tp", "2",
                     "--steps", "2", *extra])

    assert simulate("--only-nodes", "0") == 0 and simulate("--only-nodes", "1") == 0  # one job, two nodes
    assert simulate("--seed", "9") == 0  # another job, every file replaced
    capsys.readouterr()
    before = sorted((tmp_path / "job").iterdir())
    assert main(["simulate", str(tmp_path / "job"), "--nodes", "1", "--gpus-per-node", "2", "--tp", "2"]) == 2
    assert capsys.readouterr().err == (
        f"rankscope: error: {tmp_path / 'job'}: holds 2 simulated export(s) this job would not replace "
        "(sim_rank00002.sqlite, sim_rank00003.sqlite): analysed together they mix two jobs; write to an empty folder\n")
    assert simulate("--only-nodes", "1", "--steps", "3") == 2  # another job's node 0 would stay
    assert sorted((tmp_path / "job").iterdir()) == before


def test_cli_writes_an_export_per_node_where_one_process_drives_its_gpus(tmp_path, capsys):
    out = tmp_path / "job"
    args = ["simulate", str(out), "--nodes", "2", "--gpus-per-node", "2", "--tp", "2", "--steps", "2"]
    assert main([*args, "--one-process-per-node"]) == 0
    assert sorted(p.name for p in out.glob("*.sqlite")) == ["sim_node00000.sqlite", "sim_node00001.sqlite"]
    with sqlite3.connect(out / "sim_node00001.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM PROCESSES").fetchone() == (1,)
        assert db.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1").fetchall() == [(0,), (1,)]
    capsys.readouterr()
    assert main([*args, "--seed", "1"]) == 2  # a job of rank files would leave the node files beside it
    assert "holds 2 simulated export(s) this job would not replace (sim_node00000.sqlite" in capsys.readouterr().err
    assert main([*args, "--one-thread"]) == 2
    assert "one_thread drives a node's GPUs from one thread of one process: it needs node_process" \
        in capsys.readouterr().err
    assert main([*args, "--one-process-per-node", "--one-thread", "--seed", "2"]) == 0
    with sqlite3.connect(out / "sim_node00001.sqlite") as db:
        assert db.execute("SELECT COUNT(DISTINCT globalTid) FROM NVTX_EVENTS WHERE domainId != 0").fetchone() == (1,)
        assert db.execute("SELECT COUNT(*) FROM NVTX_EVENTS JOIN StringIds ON textId = id WHERE value = 'ncclGroupEnd'"
                          ).fetchone() == (2 * 3,)  # two steps of two TP and a DP all-reduce
    capsys.readouterr()
    assert main([*args, "--one-process-per-node", "--format", "kineto"]) == 2
    assert capsys.readouterr().err == ("rankscope: error: simulate: a PyTorch profiler trace is one process per GPU: "
                                       "one process per node is written as nsys exports only\n")


@pytest.mark.parametrize("layout", [dict(nodes=1, gpus_per_node=1, tp=1), dict(nodes=1, gpus_per_node=3, tp=3, tp_collectives=0)])
def test_a_job_of_no_collectives_is_refused_saying_which_layouts_make_none(layout):
    # Three ranks of TP without a TP call were refused as "a single-rank job".
    with pytest.raises(ConfigError, match=r"no collectives to simulate: one rank, or TP only with tp_collectives=0 "
                                          r"and no barrier"):
        sm.JobSpec(**layout)


def test_cli_rejects_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(tmp_path), "--straggler", "x:slow"])
    assert exc.value.code == 2
    assert main(["simulate", str(tmp_path / "a"), "--gpus-per-node", "4", "--tp", "3"]) == 2
    assert "tp=3 must divide" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "b"), "--nodes", "1", "--straggler", "9"]) == 2


@pytest.mark.parametrize("flag", ["--max-offset-ms=nan", "--max-drift-ppm=nan", "--jitter-us=inf",
                                  "--straggler=1:compute:inf"])
def test_cli_refuses_a_number_that_is_not_finite(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exc:  # a usage error, not a traceback from the draws
        main(["simulate", str(tmp_path), "--nodes", "1", "--gpus-per-node", "2", "--tp", "2", flag])
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--straggler=1:compute:-5", "--straggler=1:launch:5:0"])
def test_cli_says_a_bad_straggler_in_the_flags_terms(tmp_path, capsys, flag):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(tmp_path / "out"), "--nodes", "1", "--gpus-per-node", "2", "--tp", "2", flag])
    assert exc.value.code == 2
    assert capsys.readouterr().err.endswith(f"argument --straggler: bad straggler '{flag.partition('=')[2]}': "
                                            "EXTRA_US must be >= 0 and EVERY >= 1\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--straggler=1:compute:1e30", "--jitter-us=1e30", "--max-offset-ms=1e20",
                                  "--straggler=1:compute:3.6e9"])
def test_cli_refuses_times_past_int64_before_writing_any_export(tmp_path, capsys, flag):
    # Finite but huge: once overflowed int64 (a traceback) or wrote exports of wrapped times.
    assert main(["simulate", str(tmp_path / "out"), "--nodes", "1", "--gpus-per-node", "2", "--tp", "2", flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "simulated job:" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, bound", [("--nodes", "MAX_RANKS"), ("--gpus-per-node", "MAX_RANKS"),
                                         ("--steps", "MAX_STEPS"), ("--tp-collectives", "MAX_TP_COLLECTIVES")])
def test_cli_refuses_a_job_past_its_size_bound_as_a_usage_error_writing_nothing(tmp_path, capsys, flag, bound):
    # found by review: a typo like --nodes 100000 started writing 800,000 exports (or ran
    # out of memory first), and --tp-collectives 10**9 built a list of 10**9 phases
    limit = getattr(sm, bound, None)
    assert limit, f"simulate has no {bound}"
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(tmp_path / "out"), flag, str(limit + 1)])
    assert exc.value.code == 2
    assert f"argument {flag}: '{limit + 1}' is not a whole number from " in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, problem", [
    (["--nodes", "2048", "--gpus-per-node", "16"], "2048 nodes x 16 GPUs per node is 32768 ranks, more than 16384"),
    (["--nodes", "1024", "--steps", "10000"], "kernels, more than"),
])
def test_cli_refuses_a_job_whose_sizes_multiply_past_the_bound_in_one_line(tmp_path, capsys, argv, problem):
    assert main(["simulate", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err, err
    assert not (tmp_path / "out").exists()


def test_the_benchmarks_jobs_fit_the_size_bounds():
    _spec(nodes=64, gpus_per_node=8, tp=8, steps=200)  # bench/analyze_scale.py's largest
    _spec(nodes=8, gpus_per_node=4, tp=4, steps=40, kernels_per_phase=300)  # bench/vs_hta.py's


@pytest.mark.parametrize("argv", [
    ["--max-drift-ppm", "2e6"], ["--job-id", "../escape"], ["--job-id", "a/b"], ["--job-id", ""],
    ["--job-id", ".hidden"],
])
def test_cli_refuses_a_backwards_clock_and_job_ids_that_leave_outdir_in_one_line_writing_nothing(tmp_path, capsys,
                                                                                                argv):
    # A drift of -1e6 ppm or more stops or reverses a drawn clock; a job id prefixes the
    # file names, so a "/" wrote the exports outside OUTDIR (from a sweep's sim.job_id,
    # anywhere on the agent's host).
    try:
        code = main(["simulate", str(tmp_path / "job"), "--nodes", "2", *argv])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.strip().splitlines()[-1].startswith(("rankscope: error: ", "rankscope simulate: error: ")), err
    assert not (tmp_path / "job").exists() and not (tmp_path / "escape").exists()


def test_spec_validation():
    with pytest.raises(ConfigError, match="given twice"):
        _spec(stragglers=(sm.Straggler(1), sm.Straggler(1, "launch")))
    with pytest.raises(ConfigError, match="kind"):
        _spec(stragglers=(sm.Straggler(1, "slow"),))
    with pytest.raises(ConfigError, match="clock_offsets_ns"):
        _spec(clock_offsets_ns=(0,))
    with pytest.raises(ConfigError, match="clock drifts must be finite"):
        _spec(max_drift_ppm=float("nan"))
    with pytest.raises(ConfigError, match="node 5"):
        sm.simulate(_spec(), "/nonexistent-never-created", nodes=[5])


def test_truth_round_trips_the_spec(tmp_path):
    spec = _spec(clock_offsets_ns=(1, -2), clock_drifts_ppm=(0.5, -3.0), barrier=True,
                 stragglers=(sm.Straggler(3, "launch", 10_000, every=2),))
    assert sm.read_spec(sm.write_truth(spec, tmp_path / "truth.json")) == spec
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InputError, match="bad.json"):
        sm.read_spec(tmp_path / "bad.json")


def test_every_option_says_what_it_sets_and_its_default():
    # found by review: --nodes, --gpus-per-node, --steps, --seed, --format and --job-id had no
    # help at all, so `simulate --help` did not say the job it writes is 8x8 ranks of 20 steps
    import argparse

    parser = argparse.ArgumentParser()
    sm.register(parser.add_subparsers())
    (simulate,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices.values()
    for action in simulate._actions:
        assert action.help, f"simulate {action.dest}: no help"
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.dest != "straggler":
            assert "default" in action.help, f"simulate {action.dest}: help names no default"
