"""Kineto ingest against every real trace in ../shared/samples/kineto, plus the cases
those traces cannot show (ns timestamps, key order, the torch hook's Flight Recorder)."""

from __future__ import annotations

import decimal
import gzip
import json
import math
import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rankscope.analysis import digest
from rankscope.analysis.gloo_pairing import _fifo as _real_fifo
from rankscope.analysis.kineto import read_kineto
from rankscope.errors import ExportError

GLOO = "kineto/gloo_cpu_torch2.13"
HTA = "kineto/hta"


def _row(table) -> dict:
    assert table.num_rows == 1
    return table.to_pylist()[0]


def _collectives(table):
    return digest.explode(table, "collectives")


# ------------------------------------------------------------------ every real sample


@pytest.mark.parametrize(
    "name, rank, world, ops, comms",
    [
        (f"{GLOO}/rank0.json", 0, 2, {"allreduce", "broadcast", "allgather", "barrier", "alltoall", "send"}, {"0", "0/p2p"}),
        (f"{GLOO}/rank1.json", 1, 2, {"allreduce", "broadcast", "allgather", "barrier", "alltoall", "recv"}, {"0", "0/p2p"}),
        (f"{GLOO}/rc_rank0.json", 0, 2, {"allreduce"}, {"unresolved-pg:allreduce"}),
        (f"{HTA}/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", 34, 300, {"allreduce"},
         {"unresolved-pg:allreduce"}),
        (f"{HTA}/nccl_parser_config/nccl_data.json.gz", 0, 2, {"allreduce", "broadcast"}, {"0"}),
        (f"{HTA}/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 0, 1, set(), set()),
        (f"{HTA}/df_index_resolver/df_index_resolver.json.gz", 1, 2, {"allreduce"}, None),
        (f"{HTA}/negative_queue_length_values_check/rank0.json.gz", 0, 16, None, None),
        (f"{HTA}/trace_diff/control/control.json.gz", 3, 8, {"allreduce", "alltoall"}, None),
        # a SendRecv kernel launched before the trace began: its name's hint, sendrecv
        (f"{HTA}/trace_diff/test/test.json.gz", 1, 2, {"allreduce", "alltoall", "sendrecv"}, None),
        (f"{HTA}/trace_filter/sampled_rank-0.json.gz", 0, 128, {"allreduce", "alltoall", "allgather"}, None),
    ],
)
def test_every_sample_ingests(samples, name, rank, world, ops, comms):
    table = read_kineto(samples / name)
    row = _row(table)
    assert (row["rank"], row["world_size"], row["rank_source"]) == (rank, world, "distributedInfo.rank")
    assert row["source_format"] == "kineto-json"
    # Epoch ns on the rank's clock: 2022..2027, int64, never through float.
    assert 1.6e18 < row["window_start_ns"] < row["window_end_ns"] < 1.9e18
    assert row["gpu_busy_ns"] > 0
    # the split is of the kernels; busy also holds the copies
    assert row["compute_only_ns"] + row["comm_only_ns"] + row["overlap_ns"] <= row["gpu_busy_ns"]
    coll = _collectives(table)
    if ops is not None:
        assert set(coll["op"]) == ops
    if comms is not None:
        assert set(coll["comm_id"]) == comms
    if len(coll):
        assert (coll["end_ns"] >= coll["start_ns"]).all()
        assert (coll["start_ns"] >= row["window_start_ns"]).all()
        # (comm_id, seq) is an identity: unique within the rank.
        assert not coll.duplicated(["comm_id", "seq"]).any()


@pytest.mark.parametrize(
    "name, what",
    [
        (f"{HTA}/distributed_info_unavailable/distributed_info_not_found.json.gz", "no distributedInfo"),
        (f"{HTA}/rank_unavailable/rank_not_found.json.gz", "distributedInfo has no rank"),
    ],
)
def test_missing_rank_is_a_clear_error_naming_the_file_then_file_name_fallback(samples, tmp_path, name, what):
    source = samples / name
    with pytest.raises(ExportError) as err:
        read_kineto(source)
    assert str(source) in str(err.value) and what in str(err.value)
    # Named like the profiler's own output, the file gives the rank, with a warning.
    renamed = tmp_path / "rank-7.Apr_03.pt.trace.json.gz"
    shutil.copy(source, renamed)
    row = _row(read_kineto(renamed))
    assert (row["rank"], row["rank_source"]) == (7, "filename")
    assert any(note.endswith("rank 7 taken from the file name") for note in row["warnings"])
    # An explicit pattern wins over distributedInfo.
    row = _row(read_kineto(samples / f"{GLOO}/rank1.json", rank_from=r"filename:rank(\d)"))
    assert (row["rank"], row["rank_source"]) == (1, "filename")
    with pytest.raises(ExportError, match="--rank-from env:RANK: a Kineto trace can only take its rank from"):
        read_kineto(samples / f"{GLOO}/rank1.json", rank_from="env:RANK")
    # found by review: a pattern that finds no rank was quoted as Python writes it ('filename:\\d+'),
    # under the internal name rank_from, and the user told to pass the --rank-from just passed
    with pytest.raises(ExportError) as refused:
        read_kineto(samples / f"{GLOO}/rank1.json", rank_from=r"filename:node(\d+)")
    assert str(refused.value) == (f"{samples / GLOO / 'rank1.json'}: --rank-from filename:node(\\d+): "
                                  "no rank number in the file name")  # as nsys exports say


def test_a_file_name_rank_of_a_digit_that_is_no_number_is_no_rank(tmp_path):
    # Found by fuzzing: str.isdigit() passes '²', which int() refused in a ValueError traceback.
    data = _trace(_gloo_events("200.000", "201.000"))
    del data["distributedInfo"]
    path = _write(tmp_path / "rank²_a.json", data)
    with pytest.raises(ExportError, match=f"^{path}: --rank-from filename:rank\\(.\\): no rank number in the file name$"):
        read_kineto(path, rank_from="filename:rank(.)")
    assert _row(read_kineto(_write(tmp_path / "rank٣_a.json", data)))["rank"] == 3  # a decimal digit, as int() reads it


def test_a_file_name_rank_beyond_int32_is_said_to_be_so(tmp_path):
    # Found by fuzzing: refused as "malformed trace metadata (Python int too large to convert
    # to C long)", blaming the trace for its file name.
    data = _trace(_gloo_events("200.000", "201.000"))
    del data["distributedInfo"]
    path = _write(tmp_path / "rank2147483648.json", data)
    with pytest.raises(ExportError) as err:
        read_kineto(path)
    assert str(err.value) == f"{path}: no distributedInfo: the file name's rank 2147483648 is beyond any rank (int32)"
    path = _write(tmp_path / "rank99999999999999999999.json", data)
    with pytest.raises(ExportError) as err:
        read_kineto(path, rank_from=r"filename:rank(\d+)")
    assert str(err.value) == f"{path}: --rank-from filename:rank(\\d+): 99999999999999999999 is beyond any rank (int32)"
    assert _row(read_kineto(_write(tmp_path / "rank2147483647.json", data)))["rank"] == 2**31 - 1


def test_a_rank_that_is_no_whole_number_is_named_as_such_not_as_missing(tmp_path):
    events = _gloo_events("100.0", "101.0")
    for rank in (1.0, "3"):
        path = _write(tmp_path / "trace.json", _trace(events, distributedInfo={"backend": "gloo", "rank": rank}))
        with pytest.raises(ExportError) as refused:
            read_kineto(path)
        assert f"distributedInfo's rank '{rank}' is not a whole number: the file name gives no rank" in str(refused.value)
    renamed = _write(tmp_path / "rank2.json", _trace(events, distributedInfo={"backend": "gloo", "rank": 1.0}))
    row = _row(read_kineto(renamed))
    assert row["rank"] == 2 and "distributedInfo's rank '1.0' is not a whole number: rank 2 taken from the file name" in row["warnings"]


def test_gloo_pair_matches_instance_by_instance(samples):
    """torch 2.13 gloo: worker op = arrival; both ranks see the same ops in the same order
    per process group, and every instance ends within a few ms on the shared clock."""
    a, b = (_collectives(read_kineto(samples / f"{GLOO}/rank{r}.json")) for r in (0, 1))
    both = a.merge(b, on=["comm_id", "seq"], suffixes=("_0", "_1"))
    assert len(both) == len(a) == len(b) == 14
    n_to_n = both[both["comm_id"] == "0"]
    assert (n_to_n["op_0"] == n_to_n["op_1"]).all()
    assert (n_to_n["bytes_0"].fillna(-1) == n_to_n["bytes_1"].fillna(-1)).all()
    assert set(both.loc[both["comm_id"] == "0/p2p", "op_0"]) == {"send"}
    assert set(both.loc[both["comm_id"] == "0/p2p", "op_1"]) == {"recv"}
    assert (abs(n_to_n["end_ns_0"] - n_to_n["end_ns_1"]) < 5_000_000).all()
    # Worker start is later than the enqueue on the main thread.
    assert (a["start_ns"] >= a["cpu_call_ns"]).all()
    assert set(a["step"]) == {1, 2}


def test_a_gloo_barrier_moves_no_bytes(samples):
    """torch 2.13 gloo: c10d::barrier shows a 1-byte tensor (Input Dims [[1]], unsigned char),
    the one torch's ProcessGroup::barrier makes to dispatch on; gloo's barrier sends nothing
    (its worker op shows no tensor). Its bytes were 1: they are 0, and the barriers of the
    two ranks, alike in size, still match instance by instance."""
    from rankscope.analysis.pipeline import analyze

    tables = [read_kineto(samples / f"{GLOO}/rank{r}.json") for r in (0, 1)]
    for table in tables:
        coll = _collectives(table)
        assert coll.loc[coll["op"] == "barrier", "bytes"].tolist() == [0, 0]
    report = analyze(digest.concat(tables))
    barriers = [o for c in report.communicators for o in c.ops if o.op == "barrier"]
    assert [(o.instances, o.bytes_median, o.busbw_gbps) for o in barriers] == [(2, 0.0, None)]


def test_nccl_args_give_bytes_pg_and_exclude_wait(samples):
    table = read_kineto(samples / f"{HTA}/nccl_parser_config/nccl_data.json.gz")
    coll = _collectives(table)
    assert len(coll) == 21  # 15 allreduce + 6 broadcast; the 6 `wait` records are not collectives
    assert (coll["bytes"] % 4 == 0).all() and coll["bytes"].min() > 0  # In msg nelems x Float
    assert list(coll["seq"]) == list(range(1, 22)) and set(coll["seq_source"]) == {"ordinal"}
    comms = digest.explode(table, "communicators")
    assert comms.loc[0, "comm_id"] == "0" and list(comms.loc[0, "ranks"]) == [0, 1]
    kernels = digest.explode(table, "kernels")
    assert kernels.loc[kernels["name"].str.startswith("ncclKernel_"), "is_comm"].all()


def test_sampled_pair_is_numbered_per_group_not_by_global_index(samples):
    """The trace_filter pair (ranks 0 and 1 of one job) issues collectives in a different
    global order on each rank. Numbering per group (here: stream and op, the trace names
    no PG) pairs the instances that really are one collective: they end within 0.5 ms
    of each other, where global-index pairing is off by up to 164 ms. The pair was
    *sampled* (events filtered out), so the allreduce and alltoall groups lost different
    instances on each rank; those ordinals cannot pair and carry different sizes, which
    the matcher's op/size check has to reject."""
    r0, r1 = (_collectives(read_kineto(samples / f"{HTA}/trace_filter/sampled_rank-{r}.json.gz")) for r in (0, 1))
    global_index = np.abs(r0.sort_values("cpu_call_ns")["end_ns"].to_numpy()
                          - r1.sort_values("cpu_call_ns")["end_ns"].to_numpy())
    assert global_index.max() > 100_000_000
    both = r0.merge(r1, on=["comm_id", "seq"], suffixes=("_0", "_1"))
    assert (both["op_0"] == both["op_1"]).all()
    gather = both[both["op_0"] == "allgather"]
    assert len(gather) == 2
    assert (gather["bytes_0"] == gather["bytes_1"]).all()
    assert (abs(gather["end_ns_0"] - gather["end_ns_1"]) < 500_000).all()
    same_size = both[(both["op_0"] == "allreduce") & (both["bytes_0"] == both["bytes_1"])]
    assert len(same_size) == 2
    assert (abs(same_size["end_ns_0"] - same_size["end_ns_1"]) < 500_000).all()


def test_reduce_scatter_and_all_gather_count_the_shard_as_nccl_does(samples):
    """The FSDP-style sample shards tensors over 8 ranks. Its ReduceScatter's annotation
    shows only the full input (65536 rows); the c10d call shows output and input: the
    digest keeps NCCL's recvcount (8192 rows), the size the matching AllGather sends."""
    coll = _collectives(read_kineto(samples / f"{HTA}/negative_queue_length_values_check/rank0.json.gz"))
    shard = {8192 * 384 * 4, 8192 * 64 * 4}
    assert set(coll.loc[coll["op"] == "reducescatter", "bytes"]) == shard
    assert set(coll.loc[coll["op"] == "allgather", "bytes"]) == shard


# ------------------------------------------------------------------ timestamps and parsing


def _trace(events, **top) -> dict:
    # A base of 0 keeps the ts given as the times read (without a base, ts are epoch µs).
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 3, "world_size": 4},
            "baseTimeNanoseconds": 0, **top, "traceEvents": events}


def _event(name, ts, dur, *, cat="cpu_op", tid=1, args=None) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": args or {}}


def _gloo_events(ts_call: str, ts_work: str, ts_mm: str = "100.0") -> list:
    # ts_mm: where the call's are epoch µs, the matmul's too (events days apart are refused)
    return [
        _event("c10d::allreduce_", ts_call, "5.5", tid=1),
        _event("gloo:all_reduce", ts_work, "1000.25", cat="user_annotation", tid=2,
               args={"Input Dims": [[1024]], "Input type": ["float"]}),
        _event("aten::mm", ts_mm, "50.000", tid=1),
    ]


def _write(path: Path, data: dict, *, compact=False, gz=False) -> Path:
    # ts as raw decimal text, exactly as a profiler writes it (no float round trip).
    text = json.dumps(data, separators=(",", ":") if compact else (", ", ": "))
    text = text.replace('"ts": "', '"ts": ').replace('"ts":"', '"ts":')
    text = text.replace('"dur": "', '"dur": ').replace('"dur":"', '"dur":')
    for field in ("ts", "dur"):
        import re

        text = re.sub(rf'("{field}":\s?)(-?[\d.]+)"', r"\1\2", text)
    raw = text.encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def test_absolute_microseconds_keep_nanoseconds(tmp_path):
    """1712195495520871.123 µs has 19 significant digits: float64 would lose the ns."""
    events = _gloo_events("1712195495520871.123", "1712195495520880.0005", "1712195495520800.0")
    data = _trace(events)
    del data["baseTimeNanoseconds"]
    path = _write(tmp_path / "abs.json", data)
    coll = _collectives(read_kineto(path))
    assert coll.loc[0, "cpu_call_ns"] == 1712195495520871123
    assert coll.loc[0, "start_ns"] == 1712195495520880001  # 0.5 ns rounds half up
    assert coll.loc[0, "end_ns"] == 1712195495520880001 + 1000250
    assert float(1712195495520871.123) * 1000 != 1712195495520871123  # the trap this avoids


def test_relative_microseconds_with_base_and_gzip(tmp_path):
    base = 1790857026000000000
    data = _trace(_gloo_events("5089065858023.077", "5089065858128.380", "5089065858000.0"), baseTimeNanoseconds=base)
    coll = _collectives(read_kineto(_write(tmp_path / "rel.json.gz", data, gz=True)))
    assert coll.loc[0, "cpu_call_ns"] == base + 5089065858023077
    assert coll.loc[0, "start_ns"] == base + 5089065858128380


def test_relative_microseconds_without_a_base_are_an_error_naming_the_trace_not_another_run(tmp_path):
    # Read as epoch µs, a trace whose base was stripped lay in 1970; beside a rank of its host
    # it was refused as "another run", and alone it was analysed unsaid.
    data = _trace(_gloo_events("950.000", "960.000", "0.250"))
    del data["baseTimeNanoseconds"]
    path = _write(tmp_path / "rank3.json", data)
    with pytest.raises(ExportError, match=f"^{path}: its events start at ts 0.250 µs, with no baseTimeNanoseconds: "
                                          "times relative to a start the trace does not give, not Unix-epoch µs"):
        read_kineto(path)


def test_timestamp_text_converts_exactly_like_decimal():
    """All numbers at once, digit by digit: every spelling JSON allows, no float64 loss."""
    from decimal import ROUND_HALF_UP, Decimal

    import msgspec

    from rankscope.analysis.kineto_events import _ns

    rng = np.random.default_rng(3)
    texts = ["0", "17", "-3", "-0.5", "0.0005", "12.3", "1712195495520871.123", "5089065858023.0774",
             "1.5e3", "2E-4", "-1.25e+2", ""]
    texts += [f"{w}.{f:0{n}d}" for w, f, n in zip(rng.integers(0, 2**52, 200), rng.integers(0, 999, 200),
                                                    rng.integers(3, 5, 200))]
    got = _ns([msgspec.Raw(t.encode()) for t in texts], len(texts))
    want = [int((Decimal(t or "0") * 1000).quantize(Decimal(1), ROUND_HALF_UP)) for t in texts]
    assert got.dtype == np.int64 and got.tolist() == want


def test_plain_timestamp_texts_read_digit_by_digit_like_decimal():
    """Texts as Kineto writes them (no exponent, at most 3 decimals) skip Arrow's cast and
    give the same ns; one text it cannot read sends them all to the cast."""
    from decimal import Decimal

    import msgspec

    from rankscope.analysis import kineto_events

    rng = np.random.default_rng(5)
    texts = ["0", "7", "-3", "-0.5", "0.001", "12.3", "", "1712195495520871.123", "-922337203685477.807",
             "9223372036854775.807"]
    texts += [f"{s}{w}.{f:0{n}d}" for s, w, f, n in zip(rng.choice(["", "-"], 300), rng.integers(0, 10**15, 300),
                                                         rng.integers(0, 999, 300), rng.integers(1, 4, 300))]
    texts += [str(w) for w in rng.integers(-(10**15), 10**15, 100)]
    want = [int(Decimal(t or "0") * 1000) for t in texts]
    joined = np.frombuffer(",".join(texts).encode() + b",", np.uint8)
    plain = kineto_events._plain_ns(joined, np.flatnonzero(joined == ord(",")))
    assert plain is not None and plain.dtype == np.int64 and plain.tolist() == want
    assert kineto_events._ns([msgspec.Raw(t.encode()) for t in texts], len(texts)).tolist() == want
    for other in ("1e3", "0.0005", "9223372036854775.808", "12345678901234567", "-1712195495520871.123"):
        joined = np.frombuffer(f"1.5,{other},".encode(), np.uint8)
        assert kineto_events._plain_ns(joined, np.flatnonzero(joined == ord(","))) is None, other


def test_timestamp_texts_empty_or_not_numbers():
    """Empty texts (a missing ``dur``) are 0 wherever they stand; a time that is not a JSON
    number (a string, even one holding a comma) is refused, not misread."""
    import msgspec
    import pyarrow as pa

    from rankscope.analysis.kineto_events import _ns

    raws = [msgspec.Raw(t) for t in (b"", b"1.5", b"", b"2")]
    assert _ns(raws, 4).tolist() == [0, 1500, 0, 2000]
    assert _ns(raws[:1], 1).tolist() == [0] and _ns([], 0).tolist() == []
    for bad in (b'"1,5"', b'"15"'):
        with pytest.raises(pa.ArrowInvalid):
            _ns([msgspec.Raw(b"1"), msgspec.Raw(bad)], 2)


@pytest.mark.parametrize("layout", ["compact", "reordered"])
def test_other_layouts_give_the_same_digest(samples, tmp_path, layout):
    """Kineto's own key order, a compact re-serialisation and reversed keys in every
    event give the same digest."""
    source = samples / f"{GLOO}/rank0.json"
    data = json.loads(source.read_text(), parse_float=str)
    if layout == "reordered":
        data["traceEvents"] = [dict(reversed(list(e.items()))) for e in data["traceEvents"]]
    path = _write(tmp_path / "rank0.json", data, compact=layout == "compact")
    expected, got = read_kineto(source), read_kineto(path)
    for column in ("collectives", "kernels", "steps", "communicators", "gpu_busy_ns", "window_start_ns"):
        assert got.column(column).to_pylist() == expected.column(column).to_pylist(), column


def _nccl_allreduce(**comm_args) -> dict:
    """One NCCL AllReduce of 256 floats, its call linked to its kernel by a driver-API launch."""
    comm = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Process Group Name": "0",
            "Seq": 7, **comm_args}
    events = [
        _event("c10d::allreduce_", "100.000", "50.000", tid=1, args={"External id": 1}),
        _event("record_param_comms", "101.000", "40.000", tid=1, args={"External id": 2, **comm}),
        _event("cuLaunchKernelEx", "110.000", "5.000", cat="cuda_driver", tid=1, args={"correlation": 9}),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "120.500", "30.250", cat="kernel", tid=7,
               args={"correlation": 9, "stream": 7}),
    ]
    data = _trace(events, baseTimeNanoseconds=1790857026000000000)
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1, 2, 3]}]
    return data


def test_nccl_kernel_links_to_its_call_through_a_driver_api_launch(tmp_path):
    """NCCL >= 2.19 launches with cuLaunchKernelEx (Kineto: cat cuda_driver). The kernel's
    correlation id names that launch, and the launch lies inside the c10d call; no External
    id links them here, so this is the only way to the call."""
    coll = _collectives(read_kineto(_write(tmp_path / "t.json", _nccl_allreduce())))
    assert len(coll) == 1
    row = coll.iloc[0]
    assert (row["op"], row["comm_id"], row["seq"], row["seq_source"], row["bytes"]) == ("allreduce", "0", 7, "trace", 1024)
    assert (row["start_ns"], row["end_ns"]) == (1790857026000120500, 1790857026000150750)
    assert row["cpu_call_ns"] == 1790857026000100000


def test_gpu_busy_window_is_the_devices_active_span_as_nsys_and_hta_take_it(tmp_path):
    """Host work before the first kernel (a data loader, the first launch) and after the
    last is no device time: the window GPU busy divides by runs from the first kernel or
    copy to the last, as the nsys reader's does (HTA: last kernel end - first start)."""
    base = 1790857026000000000
    comm = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Process Group Name": "0"}
    events = [
        _event("ProfilerStep#1", "0.000", "3000.000", cat="user_annotation", tid=1),
        _event("aten::mm", "900.000", "20.000", tid=1, args={"External id": 3}),
        _event("cudaLaunchKernel", "905.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 8}),
        _event("c10d::allreduce_", "950.000", "50.000", tid=1, args={"External id": 1}),
        _event("record_param_comms", "951.000", "40.000", tid=1, args={"External id": 2, **comm}),
        _event("cudaLaunchKernel", "960.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 9}),
        _event("gemm", "1000.000", "100.000", cat="kernel", tid=7, args={"correlation": 8, "stream": 7}),
        _event("Memcpy DtoH", "1150.000", "50.000", cat="gpu_memcpy", tid=7, args={"stream": 7}),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "1200.000", "100.000", cat="kernel", tid=7,
               args={"correlation": 9, "stream": 7}),
    ]
    data = _trace(events, baseTimeNanoseconds=base)
    data["distributedInfo"].update(backend="nccl", pg_config=[{"pg_name": "0", "ranks": [0, 1, 2, 3]}])
    row = _row(read_kineto(_write(tmp_path / "rank3.json", data)))
    assert (row["window_start_ns"], row["window_end_ns"]) == (base + 1_000_000, base + 1_300_000)
    assert row["gpu_busy_ns"] == 250_000  # 50 us idle between the gemm and the copy


@pytest.mark.parametrize("digits", [16, 20, 5000])
def test_a_step_numbered_past_what_the_analysis_counts_is_no_step(tmp_path, digits):
    # Found by fuzzing: ProfilerStep# and 20 digits ended in an OverflowError traceback (5,000:
    # int()'s ValueError), naming no file; steps are float64 in the analysis, exact to 2**53.
    events = [
        _event("ProfilerStep#1", "0.000", "3000.000", cat="user_annotation", tid=1),
        _event("ProfilerStep#" + "9" * digits, "3000.000", "3000.000", cat="user_annotation", tid=1),
        *_gloo_events("950.000", "1000.000"),
    ]
    row = _row(read_kineto(_write(tmp_path / "rank3.json", _trace(events))))
    assert [step["step"] for step in row["steps"]] == [1]


@pytest.mark.parametrize("base", [-(10**18), 2**63 - 10**15])
def test_events_before_1970_or_at_the_end_of_int64_are_refused_as_the_digest_would_be(tmp_path, base):
    # Found by fuzzing: `rankscope digest` wrote such a trace's digest, which `analyze` then
    # refused as damaged (its window_start_ns), and `analyze` of the trace went on unsaid.
    path = _write(tmp_path / "rank3.json", _trace(_gloo_events("200.000", "201.000"), baseTimeNanoseconds=base))
    with pytest.raises(ExportError, match=r"its events start at -?[\d,]+ ns from 1970 \(baseTimeNanoseconds \+ ts\), "
                                          "outside the UTC epoch ns a capture can have") as err:
        read_kineto(path)
    assert str(err.value).startswith(f"{path}: ")


def test_an_event_with_a_negative_duration_is_an_instant_and_named(tmp_path):
    # Taken as it was, a kernel of -300 us ended before it began: the window left out its
    # start, its backwards interval went into the busy union, and nothing said so.
    events = [
        _event("c10d::allreduce_", "950.000", "50.000", tid=1),
        _event("gemm", "1000.000", "100.000", cat="kernel", tid=7, args={"stream": 7}),
        _event("gemm", "1200.000", "-300.000", cat="kernel", tid=7, args={"stream": 7}),
    ]
    row = _row(read_kineto(_write(tmp_path / "rank3.json", _trace(events, baseTimeNanoseconds=0))))
    assert (row["window_start_ns"], row["window_end_ns"]) == (1_000_000, 1_200_000)
    assert row["gpu_busy_ns"] == 100_000
    assert "1 event(s) with a negative duration: taken as instants (dur 0)" in row["warnings"]


@pytest.mark.parametrize("host, note", [
    (["node0"], "host_name is not text"), (7, "host_name is not text"), (None, "no host_name in trace")])
def test_a_host_name_that_is_no_text_is_no_host_and_said(tmp_path, host, note):
    # Found by fuzzing: a list or a number was taken as text ("['node0']", "7"): a host of
    # its own, the rank moved out of its node's clock domain, unsaid.
    data = _trace(_gloo_events("950.000", "960.000"), baseTimeNanoseconds=0, host_name=host)
    path = _write(tmp_path / "rank3.json", data)
    row = _row(read_kineto(path))
    assert row["host"] == f"unknown-host:{path.name}"
    assert f"{note}: it is its own clock domain (unknown-host:{path.name})" in row["warnings"]


def test_complete_events_without_a_ts_or_a_dur_are_counted_and_said(tmp_path):
    # Found by fuzzing: a step or kernel without its ts was left out unsaid (a straggler's
    # score moved from 0.09 to 0.46), one without its dur read as an instant unsaid.
    events = [
        _event("c10d::allreduce_", "950.000", "50.000", tid=1),
        _event("gemm", "1000.000", "100.000", cat="kernel", tid=7, args={"stream": 7}),
        _event("gemm", "1200.000", "100.000", cat="kernel", tid=7, args={"stream": 7}),
        _event("gemm", "1400.000", "100.000", cat="kernel", tid=7, args={"stream": 7}),
    ]
    del events[2]["ts"], events[3]["dur"]
    row = _row(read_kineto(_write(tmp_path / "rank3.json", _trace(events, baseTimeNanoseconds=0))))
    assert "1 complete (ph X) event(s) without a ts: left out" in row["warnings"]
    assert "1 complete (ph X) event(s) without a dur: taken as instants (dur 0)" in row["warnings"]
    assert row["gpu_busy_ns"] == 100_000  # the first kernel's: one left out, one an instant


@pytest.mark.parametrize("ts, dur, problem", [
    ("1200.000", "9000000000000", r"an event lasts 104 days \(its dur\)"),  # 9e12 us
    ("-1000000000000000", "100.000", r"its events lie 11,574 days apart \(their ts\)"),
])
def test_an_event_days_long_or_days_away_is_an_error_naming_the_trace(tmp_path, ts, dur, problem):
    # Found by fuzzing: one such kernel gave a top kernel of 104 days, or stretched the
    # window so the GPU read 5e-9 % busy, with no word.
    events = [
        _event("c10d::allreduce_", "950.000", "50.000", tid=1),
        _event("gemm", "1000.000", "100.000", cat="kernel", tid=7, args={"stream": 7}),
        _event("gemm", ts, dur, cat="kernel", tid=7, args={"stream": 7}),
    ]
    path = _write(tmp_path / "rank3.json", _trace(events, baseTimeNanoseconds=10**18))
    with pytest.raises(ExportError, match=problem) as err:
        read_kineto(path)
    assert str(err.value).startswith(f"{path}: ")


def test_a_copy_is_busy_time_but_not_compute_as_the_nsys_reader_takes_it(tmp_path):
    """A memcpy beside a collective does not hide its exposed time (TP overhead counts
    compute kernels) and one before it does not make the arrival compute-bound; the device
    is busy (not idle) in both."""
    base = 1790857026000000000
    comm = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Process Group Name": "0"}
    events = [
        _event("c10d::allreduce_", "100.000", "50.000", tid=1, args={"External id": 1}),
        _event("record_param_comms", "101.000", "40.000", tid=1, args={"External id": 2, **comm}),
        _event("cudaLaunchKernel", "110.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 9}),
        _event("gemm", "100.000", "40.000", cat="kernel", tid=7, args={"stream": 7}),
        _event("Memcpy DtoD", "140.000", "60.000", cat="gpu_memcpy", tid=8, args={"stream": 8}),  # 60 us before, 50 beside
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "150.000", "100.000", cat="kernel", tid=7,
               args={"correlation": 9, "stream": 7}),
        _event("gemm", "230.000", "30.000", cat="kernel", tid=9, args={"stream": 9}),  # 20 us beside
    ]
    data = _trace(events, baseTimeNanoseconds=base)
    data["distributedInfo"].update(backend="nccl", pg_config=[{"pg_name": "0", "ranks": [0, 1, 2, 3]}])
    table = read_kineto(_write(tmp_path / "rank3.json", data))
    coll = _collectives(table).iloc[0]
    assert coll["compute_overlap_ns"] == 20_000
    assert (coll["compute_before_ns"], coll["idle_before_ns"]) == (40_000, 0)  # from the window's start, 100 us
    row = _row(table)
    assert row["gpu_busy_ns"] == 160_000
    assert (row["compute_only_ns"], row["comm_only_ns"], row["overlap_ns"]) == (50_000, 80_000, 20_000)


def _allreduce_rank(rank: int, arrival_us: float) -> dict:
    """One rank's trace that began while its first AllReduce was already queued: that
    kernel (80 us) has no launch or call in the trace; the second one (100 us) has both."""
    comm = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 256, "Process Group Name": "0"}
    events = [
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "20.000", "80.000", cat="kernel", tid=7,
               args={"correlation": 4, "stream": 7}),
        _event("c10d::allreduce_", "100.000", "50.000", tid=1, args={"External id": 1}),
        _event("record_param_comms", "101.000", "40.000", tid=1, args={"External id": 2, **comm}),
        _event("cudaLaunchKernel", "110.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 9}),
        _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", f"{arrival_us:.3f}", f"{300 - arrival_us:.3f}", cat="kernel",
               tid=7, args={"correlation": 9, "stream": 7}),
    ]
    data = _trace(events, baseTimeNanoseconds=1790857026000000000, host_name="node-a")
    data["distributedInfo"].update(rank=rank, world_size=2, backend="nccl", pg_config=[{"pg_name": "0", "ranks": [0, 1]}])
    return data


def test_an_nccl_kernel_launched_before_the_trace_began_is_nccl_time_and_its_groups_first_instance(tmp_path):
    """The kernel ran in the window, so it is NCCL kernel time (the nsys reader keeps a
    kernel outside any NCCL range too), and it is the first instance of its group on
    every rank whose trace began as late: the calls after it keep their instances."""
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    paths = [_write(tmp_path / f"rank{r}.json", _allreduce_rank(r, at)) for r, at in ((0, 200.0), (1, 250.0))]
    coll = _collectives(read_kineto(paths[0]))
    assert coll[["op", "comm_id", "seq"]].values.tolist() == [["allreduce", "0", 1], ["allreduce", "0", 2]]
    assert pd.isna(coll.loc[0, "cpu_call_ns"]) and coll.loc[1, "cpu_call_ns"] == 1790857026000100000
    report = analyze(load_digests(paths))
    assert [r.nccl_kernel_ns for r in report.ranks] == [80_000 + 100_000, 80_000 + 50_000]
    assert [r.matched for r in report.ranks] == [2, 2]
    assert [r.late_max_ns for r in report.ranks] == [0, 50_000]


def test_a_kernel_queued_before_the_trace_began_keeps_its_place_where_the_next_call_came_first(tmp_path):
    """The host runs ahead of the GPU: rank 0's trace began after its first AllReduce was
    queued (kernel at 105 us, no call in the trace), and its second call came at 100 us, before
    that kernel started; rank 1 traced both calls. Numbered by the call's time where known and
    the kernel's start where not, rank 0's second AllReduce came out first, and matching, which
    follows the ingest's numbers, paired it with rank 1's first: happens-before broken."""
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    def rank_trace(rank: int, arrival_us: float) -> dict:
        data = _allreduce_rank(rank, arrival_us)
        data["traceEvents"][0].update(ts=105.0)
        if rank:  # its first call traced: made at 10 us, launched at 20 us
            comm = {k: v for k, v in data["traceEvents"][2]["args"].items() if k != "External id"}
            data["traceEvents"][:0] = [
                _event("c10d::allreduce_", "10.000", "50.000", tid=1, args={"External id": 11}),
                _event("record_param_comms", "11.000", "40.000", tid=1, args={"External id": 12, **comm}),
                _event("cudaLaunchKernel", "20.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 4}),
            ]
        return data

    paths = [_write(tmp_path / f"rank{r}.json", rank_trace(r, at)) for r, at in ((0, 200.0), (1, 250.0))]
    coll = _collectives(read_kineto(paths[0]))
    assert coll.sort_values("seq")["start_ns"].tolist() == [1790857026000105000, 1790857026000200000]
    report = analyze(load_digests(paths))
    assert [r.matched for r in report.ranks] == [2, 2]
    assert report.alignment.happens_before_violations == 0
    assert [r.late_max_ns for r in report.ranks] == [0, 50_000]


def _reduce_scatter_rank(rank: int, arrival_us: float, *, flight_recorder: bool = False) -> dict:
    """One rank of a 2-rank ReduceScatter of 2 x 4096 floats as PyTorch records it: by
    record_param_comms' In msg nelems (the input) and Out msg nelems (the shard); or, as
    older traces do, only by the annotation's input, with the hook's Flight Recorder entry
    (input and output) beside it."""
    base = 1790857026000000000
    comm = {"Collective name": "_reduce_scatter_base", "dtype": "Float", "In msg nelems": 8192,
            "Out msg nelems": 4096, "Process Group Name": "0", "Seq": 1}
    events = [
        _event("c10d::_reduce_scatter_base_", "100.000", "50.000", tid=1, args={"External id": 1}),
        _event("cudaLaunchKernel", "110.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 9}),
        _event("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", f"{arrival_us:.3f}", f"{250 - arrival_us:.3f}",
               cat="kernel", tid=7, args={"correlation": 9, "stream": 7}),
    ]
    top = {"baseTimeNanoseconds": base, "host_name": "node-a"}
    if flight_recorder:
        events.append(_event("nccl:_reduce_scatter_base", "102.000", "30.000", cat="user_annotation", tid=1,
                             args={"Input Dims": [[8192]], "Input type": ["float"]}))
        top["rankscope"] = {"rank": rank, "flight_recorder": {
            "columns": ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes", "out_bytes"],
            "rows": [["0", 1, "nccl:_reduce_scatter_base", base + 105_000, False, 8192 * 4, 4096 * 4]]}}
    else:
        events.append(_event("record_param_comms", "101.000", "40.000", tid=1, args={"External id": 2, **comm}))
    data = _trace(events, **top)
    data["distributedInfo"].update(rank=rank, world_size=2, backend="nccl", pg_config=[{"pg_name": "0", "ranks": [0, 1]}])
    return data


@pytest.mark.parametrize("flight_recorder", [False, True], ids=["record_param_comms", "flight_recorder"])
def test_reduce_scatter_counts_its_shard_and_gets_bus_bandwidth(tmp_path, flight_recorder):
    """Out msg nelems, not In, is NCCL's recvcount, and so is the Flight Recorder's output;
    bus bandwidth is then nccl-tests' own: recvcount x (n - 1) over the transfer, from the
    last arrival (rank 1 at 150 us) to the end (250 us)."""
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    paths = [_write(tmp_path / f"rank{r}.json", _reduce_scatter_rank(r, at, flight_recorder=flight_recorder))
             for r, at in ((0, 120.0), (1, 150.0))]
    coll = _collectives(read_kineto(paths[0]))
    assert (coll.loc[0, "op"], coll.loc[0, "bytes"]) == ("reducescatter", 4096 * 4)
    (spread,) = analyze(load_digests(paths)).communicators[0].ops
    assert spread.busbw_gbps == pytest.approx(4096 * 4 * (2 - 1) / 100e-6 / 1e9)


def test_a_coalesced_all_gather_counts_every_tensor_it_sends(tmp_path):
    """record_param_comms' In and Out msg nelems are totals over the coalesced tensors; the
    annotation lists each tensor. Two 4096-float shards gathered at once: 2 x 4096 floats."""
    comm = {"Collective name": "allgather_into_tensor_coalesced", "dtype": "Float", "In msg nelems": 8192,
            "Out msg nelems": 16384, "Process Group Name": "0", "Seq": 3}
    events = [
        _event("c10d::allgather_into_tensor_coalesced_", "100.000", "50.000", tid=1,
               args={"External id": 1, "Input Dims": [[[8192], [8192]], [[4096], [4096]]],
                     "Input type": ["TensorList", "TensorList"]}),
        _event("record_param_comms", "101.000", "40.000", tid=1, args={"External id": 2, **comm}),
        _event("nccl:all_gather_into_tensor_coalesced", "102.000", "30.000", cat="user_annotation", tid=1,
               args={"Input Dims": [[4096], [4096]], "Input type": ["float", "float"]}),
        _event("cudaLaunchKernel", "110.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 9}),
        _event("ncclDevKernel_AllGather_RING_LL", "120.000", "30.000", cat="kernel", tid=7,
               args={"correlation": 9, "stream": 7}),
    ]
    data = _trace(events, baseTimeNanoseconds=1790857026000000000)
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [2, 3]}]
    coll = _collectives(read_kineto(_write(tmp_path / "t.json", data)))
    assert (coll.loc[0, "op"], coll.loc[0, "bytes"]) == ("allgather", 8192 * 4)


def _doubled(source: Path, path: Path, times: int = 2) -> tuple[Path, int]:
    """The trace with every event ``times`` times over, as when a trace is joined with copies
    of itself; and how many complete events it had."""
    with (gzip.open(source, "rt") if source.suffix == ".gz" else open(source)) as file:
        data = json.load(file, parse_float=str)
    data["traceEvents"] = data["traceEvents"] * times
    return _write(path, data), sum(e.get("ph") == "X" and "ts" in e for e in data["traceEvents"]) // times


def _counted_once(source: Path, doubled: Path, complete: int, said: str = "twice") -> str:
    """Asserts the joined trace reads as its source, with a note saying how often its
    events appear; returns the note."""
    expected, got = read_kineto(source), read_kineto(doubled)
    for column in ("collectives", "kernels", "steps", "communicators", "gpu_busy_ns", "window_start_ns"):
        assert got.column(column).to_pylist() == expected.column(column).to_pylist(), column
    (note,) = [n for n in got.column("warnings")[0].as_py() if "every field alike" in n]
    assert note.startswith(f"{complete} event(s) appear {said}, every field alike")
    assert "every field alike" not in " ".join(expected.column("warnings")[0].as_py())
    return note


@pytest.mark.parametrize("name", [f"{GLOO}/rank0.json", f"{HTA}/nccl_parser_config/nccl_data.json.gz"])
def test_a_real_trace_joined_with_a_copy_of_itself_counts_each_event_once_and_says_so(samples, tmp_path, name):
    """Every kernel and call twice had doubled NCCL time, calls and busy time, unsaid: each
    event now counts once, with a note. (A CPU-only gloo trace; one of NCCL kernels.)"""
    _counted_once(samples / name, *_doubled(samples / name, tmp_path / "doubled.json"))


def test_a_simulated_trace_joined_with_a_copy_of_itself_counts_each_event_once(tmp_path):
    from rankscope.analysis.simulate import JobSpec, simulate

    (source, *_) = simulate(JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3), tmp_path / "sim", fmt="kineto")
    _counted_once(source, *_doubled(source, tmp_path / "doubled.json"))


@pytest.mark.parametrize("times", [3, 5])
def test_a_trace_joined_with_more_copies_of_itself_says_how_many_times_its_events_appear(tmp_path, times):
    # Three copies were said to be "2N event(s) appear twice".
    from rankscope.analysis.simulate import JobSpec, simulate

    (source, *_) = simulate(JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3), tmp_path / "sim", fmt="kineto")
    joined, complete = _doubled(source, tmp_path / "joined.json", times)
    note = _counted_once(source, joined, complete, f"{times} times")
    kernels = sum(e.get("cat") == "kernel" and e.get("ph") == "X" for e in json.loads(source.read_text())["traceEvents"])
    assert kernels and note.endswith(f"every field alike ({kernels} kernel(s) among them): each counted once (was the "
                                     "trace joined with copies of itself?)")


def test_events_repeated_unevenly_say_the_least_and_most_times(samples, tmp_path):
    source = samples / GLOO / "rank0.json"
    data = json.loads(source.read_text(), parse_float=str)
    events = data["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    data["traceEvents"] = events * 2 + complete[:1]  # one event three times, the others twice
    note = _counted_once(source, _write(tmp_path / "joined.json", data), len(complete), "2 to 3 times")
    assert note.endswith("(was the trace joined with copies of itself?)")


def test_host_ops_alike_in_name_and_times_are_no_repeat_to_mend(tmp_path):
    """An op nested in its parent of one name and the same µs times (real traces hold a few:
    aten::to in aten::to) is two ops; no note, both kept."""
    events = [*_gloo_events("100.0", "101.0"), _event("aten::to", "300.0", "2.0"), _event("aten::to", "300.0", "2.0")]
    row = _row(read_kineto(_write(tmp_path / "t.json", _trace(events))))
    assert not [n for n in row["warnings"] if "every field alike" in n]


def test_traces_without_collectives_name_their_files(tmp_path):
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests
    from rankscope.errors import InputError

    paths = []
    for rank in (0, 1):
        data = _trace([_event("gemm", "1.000", "2.000", cat="kernel", tid=7)])
        data["distributedInfo"].update(rank=rank, world_size=2)
        paths.append(_write(tmp_path / f"r{rank}.json", data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InputError, match=f"^{paths[0]}: no collectives in this rank's trace"):
            analyze(load_digests(paths[:1]))
        with pytest.raises(InputError, match=f"of 2 files \\({paths[0]}, {paths[1]}\\): nothing to align"):
            analyze(load_digests(paths))


def test_a_rank_outside_its_own_world_is_refused(tmp_path):
    from rankscope.errors import ConsistencyError

    data = _trace(_gloo_events("1000.000", "1010.000"))
    data["distributedInfo"]["world_size"] = 2  # rank 3
    path = _write(tmp_path / "r3.json", data)
    with pytest.raises(ConsistencyError, match=f"^{path}: rank 3 is outside its world of 2 ranks"):
        digest.check_consistent(read_kineto(path))


@pytest.mark.parametrize("rank", [-1, -(2**31)])
def test_a_negative_rank_is_refused_where_the_trace_gives_no_world_size_too(tmp_path, rank):
    # Found by fuzzing: distributedInfo {"rank": -1} without a world_size was analysed as
    # rank -1, unsaid (with a world size it was refused as outside it).
    from rankscope.analysis.sources import load_digests
    from rankscope.errors import ConsistencyError

    data = _trace(_gloo_events("1000.000", "1010.000"))
    data["distributedInfo"] = {"backend": "gloo", "rank": rank}
    path = _write(tmp_path / "r0.json", data)
    with pytest.raises(ConsistencyError, match=f"^{path}: rank {rank} is no rank \\(ranks count from 0\\)$"):
        digest.check_consistent(read_kineto(path))
    with pytest.raises(ConsistencyError, match=f"^{path}: rank {rank} is no rank"):
        load_digests([path])


def test_two_jobs_are_named_as_such_before_their_ranks_0_as_one_rank_claimed_twice(tmp_path):
    import pyarrow as pa

    from rankscope.errors import ConsistencyError

    def rank_0(name: str, world: int, job: str | None) -> pa.Table:
        data = _trace(_gloo_events("1000.000", "1010.000"))
        data["distributedInfo"].update(rank=0, world_size=world)
        table = read_kineto(_write(tmp_path / name, data))
        return table.set_column(table.schema.get_field_index("job_id"), "job_id", pa.array([job], pa.string()))

    a = rank_0("a.json", 2, "101")
    with pytest.raises(ConsistencyError, match=f"^{tmp_path}/b.json: job '102' differs from job '101' of {tmp_path}/a.json$"):
        digest.check_consistent(digest.concat([a, rank_0("b.json", 2, "102")]))
    with pytest.raises(ConsistencyError, match=f"^{tmp_path}/c.json: its world of 4 ranks differs from the 2 of "
                                               f"{tmp_path}/a.json: traces of two jobs"):
        digest.check_consistent(digest.concat([a, rank_0("c.json", 4, None)]))
    with pytest.raises(ConsistencyError, match=f"^{tmp_path}/d.json: rank 0 is also claimed by {tmp_path}/a.json"):
        digest.check_consistent(digest.concat([a, rank_0("d.json", 2, None)]))


def test_not_a_trace_is_an_export_error(tmp_path):
    bad = tmp_path / "rank0.json"
    bad.write_text("{not json")
    with pytest.raises(ExportError, match="rank0.json"):
        read_kineto(bad)
    bad.write_text('{"traceEvents": []}')
    with pytest.raises(ExportError, match="no complete"):
        read_kineto(bad)


def test_flight_recorder_from_the_hook_gives_pg_and_seq(tmp_path):
    """The torch hook adds the Flight Recorder's (PG, seq) created inside each c10d call."""
    base = 1790857026000000000
    events = []
    rows = []
    for i in range(3):
        t = 1000.0 + i * 100
        events.append(_event("c10d::allreduce_", f"{t:.3f}", "20.000", tid=1))
        events.append(_event("gloo:all_reduce", f"{t + 30:.3f}", "40.000", cat="user_annotation", tid=2))
        rows.append(["tp", 41 + i, "gloo:all_reduce", base + int(t * 1000) + 10_000, False, 4096])
    hook = {"rank": 3, "host": "node-a", "job_id": "j1", "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes"], "rows": rows}}
    data = _trace(events, baseTimeNanoseconds=base, rankscope=hook)
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "tp", "ranks": [2, 3]}]
    table = read_kineto(_write(tmp_path / "t.json", data))
    coll = _collectives(table)
    assert list(coll["comm_id"]) == ["tp"] * 3
    assert list(coll["seq"]) == [41, 42, 43] and set(coll["seq_source"]) == {"trace"}
    assert set(coll["bytes"]) == {4096}
    row = _row(table)
    assert (row["host"], row["job_id"]) == ("node-a", "j1")
    comms = digest.explode(table, "communicators")
    assert list(comms.loc[0, "ranks"]) == [2, 3]


# ------------------------------------------------------------------ simulator output


def test_simulated_kineto_job_ingests_and_names_its_straggler(tmp_path):
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.simulate import JobSpec, Straggler, simulate, truth

    spec = JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=4, stragglers=[Straggler(rank=3, extra_ns=3_000_000)])
    paths = simulate(spec, tmp_path, fmt="kineto")
    table = digest.concat([read_kineto(p) for p in paths])
    assert sorted(table.column("rank").to_pylist()) == [0, 1, 2, 3]
    coll = _collectives(table)
    assert set(coll["seq_source"]) == {"trace"}  # the simulator writes Seq as torch 2026 does
    assert analyze(table).stragglers == truth(spec)["stragglers"] == [3]


# ------------------------------------------------------------------ decoding by windows


def _by_split(monkeypatch):
    """Make the reader split every trace by decoding it (the fallback of reading by windows)."""
    from rankscope.analysis import kineto_events

    monkeypatch.setattr(kineto_events, "_windows", lambda text, columns: None)


@pytest.mark.parametrize("name", [f"{GLOO}/rank0.json", f"{HTA}/trace_filter/sampled_rank-0.json.gz",
                                  f"{HTA}/nccl_parser_config/nccl_data.json.gz"])
def test_events_decoded_a_window_at_a_time_give_the_same_digest(samples, name, monkeypatch):
    """Events become columns a window of text at a time (names coded, times and ids read,
    identity args kept per window): windows of a few events give the digest one window
    gives, and so does splitting the text by decoding it, in chunks of 7 events."""
    from rankscope.analysis import kineto_events

    whole = _row(read_kineto(samples / name))
    monkeypatch.setattr(kineto_events, "_WINDOW", 300)
    monkeypatch.setattr(kineto_events, "_ONE_WINDOW", 0)
    assert _row(read_kineto(samples / name)) == whole
    monkeypatch.setattr(kineto_events, "_CHUNK", 7)
    _by_split(monkeypatch)
    assert _row(read_kineto(samples / name)) == whole


def _awkward_trace() -> dict:
    """Text that looks like a cut between events where there is none: inside strings and
    inside nested args, at the end of the list too, and keys after the list."""
    events = _gloo_events("200.000", "201.000")
    events[0]["args"]["note"] = 'a "}, {" and a }] in a string, \\ and \\"'
    events[2]["args"]["nested"] = [{"a": 1}, {"b": [{"c": 2}]}]
    events.append(_event("aten::add", "160.000", "5.000", tid=1, args={"deep": [{"x": "}]"}, {"y": "}, {"}]}))
    data = _trace(events, baseTimeNanoseconds=1790857026000000000)
    data["traceName"] = "}]"
    data["deviceProperties"] = [{"id": 0}, {"id": 1}]
    return data


@pytest.mark.parametrize("window", [1, 40, 1 << 20, None])
@pytest.mark.parametrize("compact", [False, True])
def test_cut_lookalikes_in_strings_and_nested_args_do_not_cut(tmp_path, monkeypatch, window, compact):
    """A cut candidate inside a string or a nested value is never used: its window does
    not decode, and the reader takes the next, or splits the text by decoding it. (None:
    a small text, decoded as one window.)"""
    from rankscope.analysis import kineto_events

    if window is not None:
        monkeypatch.setattr(kineto_events, "_WINDOW", window)
        monkeypatch.setattr(kineto_events, "_ONE_WINDOW", 0)
    path = _write(tmp_path / "t.json", _awkward_trace(), compact=compact)
    got = _row(read_kineto(path))
    _by_split(monkeypatch)
    assert got == _row(read_kineto(path))


@pytest.mark.parametrize("window", [1, 40, 1 << 20, None])
def test_windows_are_the_path_taken_and_a_nested_traceevents_key_falls_back(tmp_path, monkeypatch, window):
    """A Kineto trace is read by windows, also where a list of objects follows the events
    (its cuts are tried and fail first); a "traceEvents" key nested before the real one
    makes the reader split the text by decoding it, with the same digest as without it."""
    from rankscope.analysis import kineto_events

    taken = []
    windows = kineto_events._windows
    monkeypatch.setattr(kineto_events, "_windows", lambda text, columns: taken.append(windows(text, columns)) or taken[-1])
    if window is not None:  # None: a small text, decoded as one window
        monkeypatch.setattr(kineto_events, "_WINDOW", window)
        monkeypatch.setattr(kineto_events, "_ONE_WINDOW", 0)
    data = _trace(_gloo_events("200.000", "201.000"), host_name="node-a")
    plain = _row(read_kineto(_write(tmp_path / "a.json", data)))
    assert taken[-1] is not None
    after = {**data, "deviceProperties": [{"id": 0}, {"id": 1, "x": [{"y": 2}]}]}
    assert _row(read_kineto(_write(tmp_path / "a.json", after))) == plain
    assert taken[-1] is not None
    data = {"meta": {"traceEvents": []}, **data}
    assert _row(read_kineto(_write(tmp_path / "b.json", data))) | {"source_file": None} == plain | {"source_file": None}
    assert taken[-1] is None


def test_megabytes_of_spaces_between_events_read_as_the_trace_without_them(tmp_path):
    """Found by fuzzing: whitespace around the events was skipped a byte at a time in Python
    (~180 ns a byte): a 300 KB gzipped trace holding 300 MB of spaces took 33 s to refuse,
    where a real 35 MB trace reads in 0.3 s; it is now one regular-expression match (20 MB:
    3.6 s before, 0.04 s after, measured once: no timed assertion on these noisy machines).
    Here 8 MB of spaces, past a window's end, read as the trace without them."""
    data = _trace(_gloo_events("200.000", "201.000"), host_name="node-a")
    plain = _row(read_kineto(_write(tmp_path / "rank3.json", data)))
    text = _write(tmp_path / "rank3.json", data).read_bytes()
    spaced = tmp_path / "spaced" / "rank3.json.gz"
    spaced.parent.mkdir()
    at = text.rindex(b"]")  # the events list's end: the spaces after its last event
    spaced.write_bytes(gzip.compress(text[:at] + b" " * (8 << 20) + text[at:]))
    assert _row(read_kineto(spaced)) | {"source_file": None} == plain | {"source_file": None}


def test_kept_args_do_not_pin_their_windows_text(tmp_path, monkeypatch):
    """Input shapes stay text until a size needs them; the text of an identity event's args
    is copied out of its window, so the window's bytes are freed with the window."""
    import sys

    from rankscope.analysis import kineto, kineto_events

    windows = []

    class Recording:
        def decode(self, text):
            windows.append(text)
            return decoder.decode(text)

    decoder = kineto_events._EVENTS
    monkeypatch.setattr(kineto_events, "_EVENTS", Recording())
    monkeypatch.setattr(kineto_events, "_WINDOW", 1)
    monkeypatch.setattr(kineto_events, "_ONE_WINDOW", 0)
    events = [_event("c10d::allreduce_", "100.000", "50.000", tid=1,
                     args={"External id": 1, "Input Dims": [[4, 8]], "Input type": ["float"]}),
              _event("gloo:all_reduce", "110.000", "30.000", cat="user_annotation", tid=2)]
    trace = kineto_events.load(_write(tmp_path / "t.json", _trace(events, baseTimeNanoseconds=1790857026000000000)))
    (args,) = trace.args([0])
    assert bytes(args.dims).replace(b" ", b"") == b"[[4,8]]"
    refs = [sys.getrefcount(windows[i]) for i in range(len(windows))]
    assert refs == [2, 2], refs  # the list's and the call's only
    assert kineto._sizes([args])[0] == 128


@pytest.mark.parametrize("name", [f"{HTA}/trace_filter/sampled_rank-0.json.gz", f"{HTA}/nccl_parser_config/nccl_data.json.gz"])
def test_a_large_gzipped_trace_is_mapped_from_a_temporary_file(samples, name, monkeypatch):
    """Past the in-memory size, a gzipped trace is decompressed to an unnamed temporary
    file and mapped (in memory where the file cannot be written): the same digest."""
    from rankscope.analysis import kineto_events

    whole = _row(read_kineto(samples / name))
    assert kineto_events._Text(samples / name).mapped is None
    monkeypatch.setattr(kineto_events, "_GZIP_IN_MEMORY", 0)
    assert kineto_events._Text(samples / name).mapped is not None
    assert _row(read_kineto(samples / name)) == whole

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kineto_events.tempfile, "TemporaryFile", no_room)  # then it is decompressed in memory
    assert kineto_events._Text(samples / name).mapped is None
    assert _row(read_kineto(samples / name)) == whole


@pytest.mark.parametrize("in_memory", [1 << 30, 0])
def test_corrupt_or_truncated_gzip_is_an_export_error(tmp_path, monkeypatch, in_memory):
    from rankscope.analysis import kineto_events

    monkeypatch.setattr(kineto_events, "_GZIP_IN_MEMORY", in_memory)
    packed = gzip.compress(json.dumps(_trace(_gloo_events("200.000", "201.000"))).encode() * 50)
    (tmp_path / "corrupt.json.gz").write_bytes(packed[:20] + b"\xff" * 30 + packed[50:])
    (tmp_path / "truncated.json.gz").write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ExportError, match="cannot read Kineto trace"):
        read_kineto(tmp_path / "corrupt.json.gz")
    with pytest.raises(ExportError, match=r"ends early: its gzip stream is incomplete \(was its capture or its copy cut"):
        read_kineto(tmp_path / "truncated.json.gz")


def test_truncated_json_is_said_to_end_early(tmp_path):
    text = json.dumps(_trace(_gloo_events("200.000", "201.000")))
    (tmp_path / "rank0.json").write_text(text[: len(text) // 2])
    with pytest.raises(ExportError, match=r"Kineto trace ends early: its JSON is incomplete"):
        read_kineto(tmp_path / "rank0.json")
    (tmp_path / "rank1.json").write_text(text.replace('"traceEvents"', '"traceEvents" x', 1))
    with pytest.raises(ExportError, match="not a Kineto JSON trace"):  # malformed, not short
        read_kineto(tmp_path / "rank1.json")
    read_kineto(_write(tmp_path / "rank2.json.gz", _trace(_gloo_events("200.000", "201.000"))))  # plain: read so
    shutil.copy(tmp_path / "rank1.json", tmp_path / "rank3.json.gz")
    with pytest.raises(ExportError, match=r"not a Kineto JSON trace \(named .gz but not gzip data; JSON is malformed"):
        read_kineto(tmp_path / "rank3.json.gz")


def test_values_nested_past_the_decoders_depth_are_an_export_error(tmp_path):
    # msgspec raises RecursionError, not a DecodeError, for them: a traceback.
    data = _trace(_gloo_events("200.000", "201.000"))
    data["traceEvents"][0]["args"]["deep"] = "DEEP"
    text = json.dumps(data).replace('"DEEP"', "[" * 20000 + "]" * 20000)
    (tmp_path / "rank0.json").write_text(text)
    with pytest.raises(ExportError, match=r"not a Kineto JSON trace \(values nested too deep to decode\)"):
        read_kineto(tmp_path / "rank0.json")


def test_empty_file_is_an_export_error(tmp_path):
    """An empty file cannot be mapped: it is read as empty text, not a trace."""
    empty = tmp_path / "rank0.json"
    empty.write_bytes(b"")
    with pytest.raises(ExportError, match="Kineto trace ends early: its JSON is incomplete"):
        read_kineto(empty)


def test_pg_size_without_member_list_gives_communicator_size(tmp_path):
    """pg_config without ``ranks`` but with ``pg_size``: the size lets matching check the
    members it infers; with ``ranks`` the list says it all."""
    data = _trace(_gloo_events("200.000", "201.000"))
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_size": 4}]
    comms = digest.explode(read_kineto(_write(tmp_path / "a.json", data)), "communicators")
    assert (comms.loc[0, "comm_id"], comms.loc[0, "size"]) == ("0", 4) and comms.loc[0, "ranks"] is None
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]}]
    comms = digest.explode(read_kineto(_write(tmp_path / "b.json", data)), "communicators")
    assert pd.isna(comms.loc[0, "size"]) and list(comms.loc[0, "ranks"]) == [0, 1, 2, 3]


def test_cpu_op_starting_100ns_before_the_previous_ends_is_nested_at_epoch_times(tmp_path):
    """CPU-only traces count top-level CPU ops. At absolute epoch µs two ops 100 ns apart
    are one float64 (256 ns apart at 1.7e18 ns): the nesting test compares int64 ns."""
    events = _gloo_events("1712195495520100.000", "1712195495520110.000", "1712195495520050.000")
    events += [_event("aten::outer", "1712195495520000.000", "10.000", tid=1),
               _event("aten::inner", "1712195495520009.900", "5.000", tid=1)]
    kernels = digest.explode(read_kineto(_write(tmp_path / "abs.json", _trace(events))), "kernels")
    assert "aten::outer" in set(kernels["name"]) and "aten::inner" not in set(kernels["name"])


def test_gloo_collectives_of_several_groups_without_their_names_are_grouped_by_op(tmp_path):
    """torch 2.13's gloo c10d ops carry no process group; where the trace lists several,
    each op is its own guessed group, and the warning says so in so many words."""
    data = _trace(_gloo_events("200.000", "201.000"))
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "ranks": [0, 1, 2, 3]}, {"pg_name": "1", "ranks": [2, 3]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # kept for the report (by rank), not printed per file
        table = read_kineto(_write(tmp_path / "a.json", data))
    assert set(_collectives(table)["comm_id"]) == {"unresolved-pg:allreduce"}
    notes = [note for note in _row(table)["warnings"] if "carry no process group" in note]
    assert notes == ["1 collective(s) carry no process group and the trace lists 2 group(s): "
                     "grouped by op, ordered within the group; where the ranks call several groups, calls of "
                     "different groups are paired (the rankscope torch hook's Flight Recorder names each call's group)"]


# `Input type` as torch 2.13's profiler writes it for these dtypes (recorded on this CPU build)
@pytest.mark.parametrize(("spelling", "element"), [
    ("c10::BFloat16", 2), ("c10::Half", 2), ("long int", 8), ("short int", 2), ("short unsigned int", 2),
    ("unsigned int", 4), ("c10::Float8_e4m3fn", 1), ("c10::complex<float>", 8), ("c10::complex<c10::Half>", 4),
])
def test_message_bytes_from_torchs_type_spellings(tmp_path, spelling, element):
    events = _gloo_events("200.000", "201.000")
    events[1]["args"]["Input type"] = [spelling]
    coll = _collectives(read_kineto(_write(tmp_path / "rank0.json", _trace(events))))
    assert coll.loc[0, "bytes"] == 1024 * element


def test_gloo_runs_a_reduce_scatter_as_an_allreduce_worker(tmp_path):
    """torch 2.13's gloo names a reduce_scatter_tensor's worker op gloo:all_reduce (seen in
    real traces): paired by op alone, it shifted every later allreduce off its call, and all
    but the first instance of a step were dropped."""
    events = []
    for i, call in enumerate(["c10d::allreduce_", "c10d::_reduce_scatter_base_", "c10d::allreduce_"] * 2):
        t = 1000 * i
        events += [_event(call, f"{t}.000", "20.000", tid=1),
                   _event("gloo:all_reduce", f"{t + 30}.000", "400.000", cat="user_annotation", tid=2,
                          args={"Input Dims": [[1024]], "Input type": ["float"]})]
    coll = _collectives(read_kineto(_write(tmp_path / "rank0.json", _trace(events))))
    assert coll["op"].tolist() == ["allreduce", "reducescatter", "allreduce"] * 2
    assert coll["start_ns"].tolist() == [(1000 * i + 30) * 1000 for i in range(6)]


def test_the_flight_recorder_names_a_gloo_reduce_scatter_by_its_worker_op(tmp_path):
    """The hook's Flight Recorder (torch 2.13 gloo) records a reduce_scatter_tensor as
    gloo:all_reduce too: its entry still gives the call its process group and sequence number."""
    base = 1_700_000_000_000_000_000
    events, rows = [], []
    for i, call in enumerate(["c10d::allreduce_", "c10d::_reduce_scatter_base_", "c10d::allreduce_"]):
        t = 1000 * i
        events += [_event(call, f"{t}.000", "20.000", tid=1),
                   _event("gloo:all_reduce", f"{t + 30}.000", "400.000", cat="user_annotation", tid=2,
                          args={"Input Dims": [[1024]], "Input type": ["float"]})]
        rows.append(["0", i + 1, "gloo:all_reduce", base + t * 1000 + 5_000, False, 4096, 4096])
    top = {"baseTimeNanoseconds": base, "rankscope": {"rank": 3, "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes", "out_bytes"], "rows": rows}}}
    coll = _collectives(read_kineto(_write(tmp_path / "rank3.json", _trace(events, **top))))
    assert coll["op"].tolist() == ["allreduce", "reducescatter", "allreduce"]
    assert coll["seq"].tolist() == [1, 2, 3] and set(coll["seq_source"]) == {"trace"}


def test_a_gloo_scatters_bytes_are_each_members_chunk_on_the_root_and_off_it(tmp_path):
    """torch 2.13 gloo, through the hook's Flight Recorder: a scatter of 4096-float chunks to
    3 ranks records on its root an input of all 3 chunks (49152 bytes) and an output of one,
    elsewhere no input. Its bytes were the root's input and None elsewhere (a real job:
    scatter 49152 beside gather 16384 for the same chunks); the per-rank size, as for
    ReduceScatter, is the chunk (NCCL's recvcount), and a Gather's its sendcount."""
    base = 1_700_000_000_000_000_000
    chunk, three = [[4096]], [[4096], [4096], [4096]]
    calls = [("c10d::scatter_", "gloo:scatter", three, 49152, 16384),  # the root
             ("c10d::scatter_", "gloo:scatter", None, None, 16384),
             ("c10d::gather_", "gloo:gather", chunk, 16384, 49152),  # the root
             ("c10d::gather_", "gloo:gather", chunk, 16384, None)]
    events, rows = [], []
    for i, (call, work, dims, size, out) in enumerate(calls):
        t = 1000 * i
        args = {"Input Dims": dims, "Input type": ["float"] * len(dims)} if dims else {}
        events += [_event(call, f"{t}.000", "20.000", tid=1),
                   _event(work, f"{t + 30}.000", "400.000", cat="user_annotation", tid=2, args=args)]
        rows.append(["0", i + 1, work, base + t * 1000 + 5_000, False, size, out])
    top = {"baseTimeNanoseconds": base, "rankscope": {"rank": 1, "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes", "out_bytes"], "rows": rows}}}
    coll = _collectives(read_kineto(_write(tmp_path / "rank1.json", _trace(events, **top))))
    assert coll["op"].tolist() == ["scatter", "scatter", "gather", "gather"]
    assert coll["bytes"].tolist() == [16384] * 4


def test_a_record_param_comms_naming_no_collective_takes_the_op_of_its_nccl_annotation(tmp_path):
    """Older traces (HTA's trace_diff): an all_to_all is a bare record_param_comms, no
    Collective name, around nccl:all_to_all and the launch; its SendRecv kernel was dropped."""
    def events(annotation):
        inner = [_event(annotation, "105.000", "30.000", cat="user_annotation", tid=1)] if annotation else []
        return [_event("record_param_comms", "100.000", "50.000", tid=1, args={"External id": 5}), *inner,
                _event("cudaLaunchKernel", "110.000", "5.000", cat="cuda_runtime", tid=1, args={"correlation": 9}),
                _event("ncclKernel_SendRecv", "200.000", "50.000", cat="kernel", tid=7,
                       args={"correlation": 9, "stream": 7})]
    table = read_kineto(_write(tmp_path / "rank0.json", _trace(events("nccl:all_to_all"))))
    assert _collectives(table)["op"].tolist() == ["alltoall"]
    bare = read_kineto(_write(tmp_path / "rank1.json", _trace(events(None))))
    assert _collectives(bare).empty  # the kernel's name alone is never the op
    assert "1 NCCL call(s) name no operation (no Collective name, no nccl: annotation): not matched" in _row(bare)["warnings"]


def test_a_gloo_workers_message_is_every_tensor_it_moves(tmp_path):
    """torch 2.13 gloo: all_reduce_coalesced([10 floats, 20 floats]) runs as gloo:all_reduce with
    Input Dims [[10], [20]], all_to_all of two 8-float chunks as gloo:all_to_all [[8], [8]]
    (the whole send buffer, as record_param_comms counts an AllToAll)."""
    events = [_event("c10d::allreduce_coalesced_", "100.000", "5.000", tid=1),
              _event("gloo:all_reduce", "110.000", "50.000", cat="user_annotation", tid=2,
                     args={"Input Dims": [[10], [20]], "Input type": ["float", "float"]}),
              _event("c10d::alltoall_", "200.000", "5.000", tid=1),
              _event("gloo:all_to_all", "210.000", "50.000", cat="user_annotation", tid=2,
                     args={"Input Dims": [[8], [8]], "Input type": ["float", "float"]})]
    coll = _collectives(read_kineto(_write(tmp_path / "rank0.json", _trace(events))))
    assert coll[["op", "bytes"]].values.tolist() == [["allreduce", 120], ["alltoall", 64]]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(distributedInfo=[0, 2]), "malformed trace: distributedInfo is a list, not an object"),
    (lambda d: d.update(rankscope="x"), "malformed trace: rankscope is a str, not an object"),
    (lambda d: d.update(rankscope={"flight_recorder": {"columns": ["seq"], "rows": []}}),
     "malformed trace: rankscope.flight_recorder lacks columns and rows with pg_name, seq"),
    (lambda d: d["distributedInfo"].update(rank=True), r"malformed trace metadata \(Expected integer, got bool\)"),
    (lambda d: d["distributedInfo"].update(world_size="4"), r"malformed trace metadata \(Could not convert '4'"),
    # Beyond int64 (a corrupt trace): one error naming the file, not an OverflowError's traceback.
    (lambda d: d["distributedInfo"].update(rank=2**70), r"malformed trace metadata \(Python int too large"),
    (lambda d: d.update(baseTimeNanoseconds=2**70), r"baseTimeNanoseconds 1180591620717411303424 is beyond int64 ns"),
    (lambda d: d["traceEvents"][1]["args"].update({"External id": 2**70}),
     r"Expected `int` <= 9223372036854775807 - at `\$\.traceEvents\[1\]\.args\.External id`\)$"),
    # Times that leave int64 ns: refused, where numpy's sum wrapped them round (busy time vanished).
    (lambda d: d.update(baseTimeNanoseconds=1_790_857_026_000_000_000) or d["traceEvents"][2].update(ts="8000000000000000"),
     r"unreadable event time \(an event's ts is past int64 ns once baseTimeNanoseconds 1790857026000000000 is added"),
    (lambda d: d["traceEvents"][2].update(ts="9223372036854775.000", dur="1000"),
     r"unreadable event time \(an event ends past int64 ns \(its ts \+ dur\)\)"),
    # Arrow's decimal cast wraps past 38 digits: 2**128 + 320 µs read as 320.
    (lambda d: d["traceEvents"][1].update(dur=str(2**128 + 320)),
     r"unreadable event time \(an event time has more than 20 digits before its point: beyond int64 ns\)"),
    # Past the first chunk of events decoded: the place in the trace, not in the chunk.
    (lambda d: d["traceEvents"].__setitem__(slice(0, 0), [d["traceEvents"][0]] * 5000 + [1]),
     r"Expected `object`, got `int` - at `\$\.traceEvents\[5000\]`\)$"),
    # Iterated (a TypeError traceback), and cast to the digest's string (an ArrowNotImplementedError one).
    (lambda d: d["distributedInfo"].update(pg_config=-1), "malformed trace: distributedInfo.pg_config is a int, not a list"),
    (lambda d: d["distributedInfo"].update(pg_config=[{"pg_name": "0", "pg_desc": ["a"]}]),
     r"malformed trace metadata \(Unsupported cast from list<item: string> to utf8"),
])
def test_trace_metadata_of_the_wrong_shape_is_one_export_error(tmp_path, edit, message):
    data = _trace(_gloo_events("200.000", "201.000"))
    edit(data)
    with pytest.raises(ExportError, match=message):
        read_kineto(_write(tmp_path / "rank0.json", data))


@pytest.mark.parametrize(("comm_args", "seq", "size"), [
    ({}, (7, "trace"), 1024),
    ({"Seq": 2**70}, (1, "ordinal"), 1024),
    ({"Seq": 1e300}, (1, "ordinal"), 1024),
    ({"In msg nelems": 2**70}, (7, "trace"), None),
    ({"In msg nelems": 2**62}, (7, "trace"), None),  # x 4 bytes: past int64
])
def test_an_integer_arg_beyond_int64_is_read_as_absent(tmp_path, comm_args, seq, size):
    """A sequence number or size no int64 column holds (a corrupt trace) is no identity or
    size: the collective is read as if the trace gave none, not an OverflowError."""
    coll = _collectives(read_kineto(_write(tmp_path / "t.json", _nccl_allreduce(**comm_args))))
    row = coll.iloc[0]
    assert (row["op"], (row["seq"], row["seq_source"])) == ("allreduce", seq)
    assert row["bytes"] == size if size else pd.isna(row["bytes"])


@pytest.mark.parametrize("comm_args", [{"Collective name": []}, {"Collective name": {"a": 1}}, {"dtype": []}])
def test_a_name_arg_that_is_no_string_is_read_as_absent(tmp_path, comm_args):
    # The names' caches hashed the arg first: a list or object ended in a TypeError traceback.
    got = _collectives(read_kineto(_write(tmp_path / "t.json", _nccl_allreduce(**comm_args)))).iloc[0]
    assert (got["op"], got["comm_id"], got["seq"]) == ("allreduce", "0", 7)  # the op from the c10d call
    assert got["bytes"] == 1024 if "dtype" not in comm_args else pd.isna(got["bytes"])


@pytest.mark.parametrize("edit", [
    lambda rows: rows.__setitem__(0, ["0"]),  # short
    lambda rows: rows[0].__setitem__(3, "x"),  # time_created_ns
    lambda rows: rows[0].__setitem__(1, 2**70),  # seq beyond int64
])
def test_a_flight_recorder_row_of_the_wrong_shape_is_one_export_error(tmp_path, edit):
    data = _reduce_scatter_rank(0, 120.0, flight_recorder=True)
    edit(data["rankscope"]["flight_recorder"]["rows"])
    with pytest.raises(ExportError, match="malformed trace: a rankscope.flight_recorder row is not 7 values with an "
                                          "integer seq and time_created_ns"):
        read_kineto(_write(tmp_path / "rank0.json", data))


def test_a_shard_size_beyond_int64_is_read_as_absent(tmp_path):
    data = _reduce_scatter_rank(0, 120.0)
    data["traceEvents"][-1]["args"].update({"In msg nelems": 2**62, "Out msg nelems": 2**62})
    assert pd.isna(_collectives(read_kineto(_write(tmp_path / "rank0.json", data))).loc[0, "bytes"])


def test_sends_the_flight_recorder_never_records_are_kept_and_meet_their_recvs(tmp_path):
    """torch 2.13 gloo's Flight Recorder records no send or recv: such calls are no window's
    edge. With several process groups and none named on the call, sends and recvs share one
    unresolved group, so a send can still pair with its recv."""
    base = 1_700_000_000_000_000_000
    comms = []
    for rank, (call, worker) in enumerate([("c10d::send", "gloo:send"), ("c10d::recv_", "gloo:recv")]):
        events = [_event("c10d::allreduce_", "0.000", "20.000", tid=1),
                  _event("gloo:all_reduce", "30.000", "100.000", cat="user_annotation", tid=2),
                  _event(call, "1000.000", "20.000", tid=1),
                  _event(worker, "1030.000", "100.000", cat="user_annotation", tid=2)]
        top = {"baseTimeNanoseconds": base, "rankscope": {"rank": rank, "flight_recorder": {
            "columns": ["pg_name", "seq", "profiling_name", "time_created_ns"],
            "rows": [["0", 1, "gloo:all_reduce", base + 5_000]]}}}
        data = _trace(events, **top)
        data["distributedInfo"].update(rank=rank, world_size=2, pg_config=[{"pg_name": "0", "ranks": [0, 1]},
                                                                          {"pg_name": "1", "ranks": [0, 1]}])
        table = read_kineto(_write(tmp_path / f"rank{rank}.json", data))
        coll = _collectives(table)
        assert coll["op"].tolist() == ["allreduce", call.removeprefix("c10d::").rstrip("_")]
        assert not any("window's edges" in w for w in _row(table)["warnings"])
        comms.append(coll["comm_id"].tolist()[1])
    assert comms == ["unresolved-pg:p2p/p2p"] * 2


def _p2p_rank(rank: int, peer: int, send_first: bool, pg_config: list) -> dict:
    """torch 2.13 gloo, record_shapes: c10d::send / c10d::recv_ name their peer (a rank in
    the group) third in Concrete Inputs; gloo:send / gloo:recv run on the calling thread."""
    calls = [("c10d::send", "gloo:send"), ("c10d::recv_", "gloo:recv")]
    events = []
    for i, (call, worker) in enumerate(calls if send_first else calls[::-1]):
        t = 1000 * (i + 1)
        events += [_event(call, f"{t}.000", "20.000", tid=1, args={"Concrete Inputs": ["", "", str(peer), "0"],
                                                                    "Input type": ["TensorList", "", "Scalar", "Scalar"]}),
                   _event(worker, f"{t + 5}.000", "100.000", cat="user_annotation", tid=1,
                          args={"Input Dims": [[512]], "Input type": ["float"]})]
    events += [_event("c10d::allreduce_", "3000.000", "20.000", tid=1),
               _event("gloo:all_reduce", "3030.000", "100.000", cat="user_annotation", tid=2)]
    data = _trace(events)
    data["distributedInfo"].update(rank=rank, world_size=4, pg_config=pg_config)
    return data


def test_gloo_sends_and_recvs_take_their_peer_from_the_calls_concrete_inputs(tmp_path):
    """Four gloo ranks on the world group, 0 with 2 and 1 with 3 (real torch 2.13 traces of
    send/recv and isend/irecv show the peer only there). Without it no send or recv of a
    group of more than two ranks was ever matched ("point-to-point call(s) without a known
    peer"); with it each send meets its recv. Where the call's group is not known (several
    groups, none named), the peer, a rank within it, is not taken for a global one."""
    from rankscope.analysis.pipeline import analyze

    world = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]}]
    tables = [read_kineto(_write(tmp_path / f"rank{r}.json", _p2p_rank(r, r ^ 2, r < 2, world))) for r in range(4)]
    assert [_collectives(t).query("op != 'allreduce'")["peer"].tolist() for t in tables] == [[2, 2], [3, 3], [0, 0],
                                                                                              [1, 1]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(digest.concat(tables))
    assert not any("without a known peer" in w for w in report.warnings)
    p2p = {(c.comm_id, o.op): o.instances for c in report.communicators for o in c.ops if o.op in ("send", "recv")}
    assert p2p == {("0/p2p", "send"): 4, ("0/p2p", "recv"): 4}
    two = world + [{"pg_name": "1", "ranks": [0, 2]}]
    unsure = _collectives(read_kineto(_write(tmp_path / "rank0_two.json", _p2p_rank(0, 1, True, two))))
    assert unsure.query("op != 'allreduce'")["peer"].isna().all()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_async_gloo_ops_of_two_groups_keep_their_own_groups_worker_timing(tmp_path):
    """Real torch 2.13 gloo: worker events name no group, and paired to calls by op and
    order alone, rank 0's last call on group a took group b's worker op (started first) and
    b's call took a's, silently: an instance's arrival came from another collective. Each
    group runs its ops on its own worker threads: pairs come from the thread's group, and
    those that could still be either group's are left unmatched, with a warning."""
    pytest.importorskip("torch")
    job = Path(__file__).with_name("gloo_groups_job.py")
    subprocess.run([sys.executable, str(job), str(_free_port()), str(tmp_path)], check=True, timeout=150)
    for rank in (0, 1):
        path = tmp_path / f"rank{rank}.json"
        data = json.loads(path.read_text())
        base = data["baseTimeNanoseconds"]
        worker_bytes = {base + round(e["ts"] * 1000): 4 * e["args"]["Input Dims"][0][0]
                        for e in data["traceEvents"] if e.get("name") == "gloo:all_reduce"}
        table = read_kineto(path)
        coll = _collectives(table)
        assert set(coll["comm_id"]) == {"1", "2"} and set(coll["seq_source"]) == {"trace"}
        starts = np.array(sorted(worker_bytes))
        nearest = starts[np.abs(starts[:, None] - coll["start_ns"].to_numpy()[None, :]).argmin(axis=0)]
        assert [worker_bytes[s] for s in nearest] == coll["bytes"].tolist(), f"rank {rank}"
        doubtful = [w for w in _row(table)["warnings"] if "more than one process group" in w or "another order" in w]
        assert len(coll) + sum(int(w.split()[0]) for w in doubtful) == 6


_ASYNC_PLAIN = Path(__file__).with_name("data") / "gloo_async_plain"
_ASYNC_SIZES = (16384, 32768, 49152)  # bytes of each step's three calls, in call order


def test_gloo_calls_left_out_in_doubt_keep_their_place_in_the_order_of_the_others(tmp_path):
    """Real torch 2.13 gloo, plain profiler, three async all_reduces of three sizes a step
    (data/gloo_async_plain/README.md), without their shapes (as recorded without
    record_shapes): 8 to 10 worker ops per rank could be either of two calls and are left
    out. Numbered after leaving them out, every later call on that rank moved up a place:
    ordinal matching met calls of other sizes, 11 of 16 instances dropped as disagreeing and
    2 of the 3 left broke happens-before. The calls left out keep their numbers: each kept
    call's is its place in the program's order (the size its worker op had)."""
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    for path in sorted(_ASYNC_PLAIN.glob("rank*.json.gz")):
        text = gzip.decompress(path.read_bytes())
        exact = json.loads(text, parse_float=decimal.Decimal)  # ns from the decimal text
        sizes = {exact["baseTimeNanoseconds"] + int(e["ts"] * 1000): 4 * math.prod(e["args"]["Input Dims"][0])
                 for e in exact["traceEvents"] if e.get("name") == "gloo:all_reduce"}
        data = json.loads(text)
        for event in data["traceEvents"]:
            for key in ("Input Dims", "Input type", "Input Strides"):
                event.get("args", {}).pop(key, None)
        bare = tmp_path / path.name.removesuffix(".gz")
        bare.write_text(json.dumps(data))
        coll = _collectives(read_kineto(bare))
        assert len(coll) < 24 and set(coll["seq_source"]) == {"ordinal"}
        assert [sizes[s] for s in coll["start_ns"]] == [_ASYNC_SIZES[(s - 1) % 3] for s in coll["seq"]], path.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(load_digests([tmp_path]))
    assert report.alignment.dropped_inconsistent == 0 and report.alignment.happens_before_violations == 0
    assert report.alignment.matched_collectives >= 9 and report.late_ranks == [0]


def test_gloo_async_calls_are_told_apart_by_their_element_counts_without_the_flight_recorder():
    """The same traces with their shapes: a worker op lists its tensor (float, 4096), its c10d
    call the same as a TensorList with no dtype, so the calls had no size to pair by without
    the hook's Flight Recorder, and the ops in doubt were left out. Element counts tell each
    call's op: every call is matched and rank 0, which slept 30 ms a step, is the straggler."""
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    for path in sorted(_ASYNC_PLAIN.glob("rank*.json.gz")):
        table = read_kineto(path)
        coll = _collectives(table)
        assert coll["seq"].tolist() == list(range(1, 25)) and not [w for w in _row(table)["warnings"] if "not matched" in w]
        assert coll["bytes"].tolist() == list(_ASYNC_SIZES) * 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(load_digests([_ASYNC_PLAIN]))
    assert report.alignment.matched_collectives == 24 and report.stragglers == [0]
    rank0 = next(r for r in report.ranks if r.rank == 0)
    assert 25e6 < rank0.late_p50_ns < 35e6


def _worker_bytes(path: Path) -> dict[int, int]:
    """Each gloo worker event's own size (Input Dims x 4: float buffers), by start (ns, from
    the exact decimal text: a float of µs since the base is off by a ns at times)."""
    data = json.loads(path.read_text(), parse_float=decimal.Decimal)
    return {data["baseTimeNanoseconds"] + int(e["ts"] * 1000): 4 * sum(math.prod(d) for d in e["args"]["Input Dims"])
            for e in data["traceEvents"] if e.get("name", "").startswith("gloo:")}


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_async_gloo_ops_taken_up_together_are_told_apart_by_size_under_the_hook(tmp_path):
    """Real torch 2.13 gloo through the hook's window, one group, four async all_reduces of
    distinct sizes a step: the two worker threads take calls up together and start them in
    either order, so pairing by order alone left about a third of them unmatched (in doubt).
    The hook records input shapes on CPU, and a worker op's size (its tensors) must be its
    call's (the Flight Recorder entry's inputs): every op is matched, each to the call of its
    own size."""
    pytest.importorskip("torch")
    job = Path(__file__).with_name("gloo_async_job.py")
    subprocess.run([sys.executable, str(job), str(_free_port()), str(tmp_path)], check=True, timeout=150)
    for rank in (0, 1):
        (path,) = tmp_path.glob(f"rank{rank}.*.pt.trace.json")
        worker_bytes = _worker_bytes(path)
        table = read_kineto(path)
        coll = _collectives(table)
        assert not [w for w in _row(table)["warnings"] if "not matched" in w], f"rank {rank}"
        assert sorted(coll["seq"]) == list(range(1, 33))  # every call of the window, once
        assert [worker_bytes[s] for s in coll["start_ns"]] == coll["bytes"].tolist(), f"rank {rank}"


def test_a_flight_recorder_ring_too_short_drops_only_the_calls_that_need_it_and_says_so(tmp_path):
    """TORCH_FR_BUFFER_SIZE shorter than the window: the ring kept only the last call's entry.
    A call whose record_param_comms names its group and Seq needs none and is matched; one
    without is dropped, said to be lost to the ring, not to the window's edges."""
    base = 1_700_000_000_000_000_000
    events = []
    for i, identity in enumerate([{"Process Group Name": "0", "Seq": 1}, None, None]):
        t = 1000 * i
        events += [_event("c10d::allreduce_", f"{t}.000", "20.000", tid=1),
                   _event("gloo:all_reduce", f"{t + 30}.000", "400.000", cat="user_annotation", tid=2)]
        if identity:
            events.append(_event("record_param_comms", f"{t + 1}.000", "5.000", tid=1,
                                 args={"Collective name": "allreduce", **identity}))
    entry_ns = base + 2000 * 1000 + 5_000
    top = {"baseTimeNanoseconds": base, "rankscope": {"rank": 3, "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns"], "rows": [["0", 3, "gloo:all_reduce", entry_ns]],
        "evicted_before_ns": entry_ns}}}
    table = read_kineto(_write(tmp_path / "rank3.json", _trace(events, **top)))
    coll = _collectives(table)
    assert coll["seq"].tolist() == [1, 3] and coll["start_ns"].tolist() == [base + 30_000, base + 2_030_000]
    warnings_ = _row(table)["warnings"]
    assert ("1 collective call(s) have no Flight Recorder entry: the ring (TORCH_FR_BUFFER_SIZE) was too short "
            "for the window and dropped their entries: not matched") in warnings_
    assert not any("window's edges" in w for w in warnings_)


def _groups_trace(calls, workers, worker_order, **recorder) -> dict:
    """A gloo trace whose all_reduce calls ((µs, group, seq)) the hook's Flight Recorder names
    (group None: it has no entry), and worker ops ((µs, tid)) written in ``worker_order``."""
    base = 1_700_000_000_000_000_000
    events = [_event("c10d::allreduce_", f"{t}.000", "20.000", tid=1) for t, _, _ in calls]
    events += [_event("gloo:all_reduce", f"{workers[i][0]}.000", "100.000", cat="user_annotation", tid=workers[i][1])
               for i in worker_order]
    rows = [[pg, seq, "gloo:all_reduce", base + t * 1000 + 5_000] for t, pg, seq in calls if pg]
    data = _trace(events, baseTimeNanoseconds=base, rankscope={"rank": 3, "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns"], "rows": rows, **recorder}})
    data["distributedInfo"]["pg_config"] = [{"pg_name": "1", "ranks": [0, 1, 2, 3]}, {"pg_name": "2", "ranks": [0, 1, 2, 3]}]
    return data


def test_gloo_pairs_in_doubt_are_the_ones_left_unmatched_whatever_the_files_event_order(tmp_path):
    """Group 1's first op ran on thread 3, beyond doubt; threads 4 and 5 could each serve
    either group (1's second call and 2's first came together): those two pairs are in doubt.
    Kineto writes events thread by thread, not by start, and the doubt was worked out in
    another order than the pairs': thread 3's sure pair was dropped and a doubtful one kept."""
    calls = [(0, "1", 1), (1000, "1", 2), (1010, "2", 1)]
    workers = [(30, 3), (1030, 4), (1040, 5)]
    base = 1_700_000_000_000_000_000
    for order in ([0, 1, 2], [1, 2, 0]):
        table = read_kineto(_write(tmp_path / "rank3.json", _groups_trace(calls, workers, order)))
        coll = _collectives(table)
        assert list(zip(coll["comm_id"], coll["seq"], coll["start_ns"])) == [("1", 1, base + 30_000)], order
        assert ("2 gloo worker op(s) could belong to more than one process group's call (their events name no "
                "group, and their threads' groups are not certain): not matched") in _row(table)["warnings"]


def test_gloo_thread_assignments_pair_each_groups_threads_once_not_each_assignment(tmp_path, monkeypatch):
    """Four groups of two worker threads, the threads of groups 3 and 4 with no sure pair:
    4 open threads, 4 groups each, 256 assignments to try. Each group pairs on its own, so
    one pairing per group and set of threads it is given (at most 4 x 16) does: a FIFO
    pairing of every line per assignment made a 20k-op trace take seconds."""
    from rankscope.analysis import gloo_pairing

    calls, workers, t = [], [], 0
    for pg in (1, 2):  # a sure pair on each of their threads: calls far apart
        for k in range(2):
            t += 1000
            calls.append((t, str(pg), len([c for c in calls if c[1] == str(pg)]) + 1))
            workers.append((t + 10, 10 + 2 * pg + k))
    for i in range(200):  # then every call comes before the previous one's worker op starts
        pg = 1 + i % 4
        calls.append((t + 1000 + 10 * i, str(pg), len([c for c in calls if c[1] == str(pg)]) + 1))
        workers.append((t + 1015 + 10 * i, 10 + 2 * pg + (i // 4) % 2))
    fifo_calls = []
    monkeypatch.setattr(gloo_pairing, "_fifo", lambda *a: fifo_calls.append(1) or _real_fifo(*a))
    table = read_kineto(_write(tmp_path / "rank3.json", _groups_trace(calls, workers, range(len(workers)))))
    assert len(fifo_calls) <= 4 * 16 + 2  # the seeds' pairing by op alone, and the last one
    coll = _collectives(table)
    # groups 1 and 2 keep every pair; 3 and 4 could have each other's threads: theirs are in doubt
    assert coll.groupby("comm_id").size().to_dict() == {"1": 52, "2": 52}
    assert (coll["start_ns"] - coll["cpu_call_ns"]).isin([10_000, 15_000]).all()


def test_a_call_the_flight_recorder_ring_dropped_does_not_pair_the_other_groups_by_op_alone(tmp_path):
    """Real 2-rank job, TORCH_FR_BUFFER_SIZE=14: the ring had lost the first calls' entries,
    and a line with a call naming no group was left unsplit, paired by op alone: the kept
    calls of two groups took each other's worker ops again, silently. Here group 1's last
    call came first but group 2's worker op started first."""
    base = 1_700_000_000_000_000_000
    calls = [(0, None, None), (1000, "1", 2), (2000, "2", 1), (3000, "1", 3), (3010, "2", 2)]
    workers = [(30, 3), (1010, 3), (2010, 4), (3030, 3), (3020, 4)]
    data = _groups_trace(calls, workers, range(len(workers)), evicted_before_ns=base + 1_005_000)
    table = read_kineto(_write(tmp_path / "rank3.json", data))
    coll = _collectives(table)
    starts = {(c, s): t - base for c, s, t in zip(coll["comm_id"], coll["seq"], coll["start_ns"])}
    assert starts == {("1", 2): 1_010_000, ("2", 1): 2_010_000, ("1", 3): 3_030_000, ("2", 2): 3_020_000}
    assert not any("enqueued before the window" in w for w in _row(table)["warnings"])


def test_calls_of_two_groups_from_two_threads_running_together_keep_their_own_flight_recorder_entries(tmp_path):
    """Real torch 2.13 gloo, groups 1 and 2 called from two threads; the timings here are
    that run's (µs): its first eight calls, and two later ones that tell the groups of the
    worker threads of the overlapping calls (`_thread_groups`). Entries name no thread: each went to the latest call of its op started
    before it, so both entries made while the threads' third calls ran went to thread 2's,
    which kept group 1's, silently, and thread 1's was dropped; group 2's per-group pairing
    then lost its worker ops (26 of 60 in the run). A thread whose sure entries name one
    group takes that group's entry."""
    base = 1_700_000_000_000_000_000
    # (caller tid, start, dur, group, seq, entry made at, worker tid, worker start, worker dur)
    calls = [(1, 0.0, 635.997, "1", 1, 71.264, 3, 1015.846, 5105.099),
             (2, 267.736, 5931.97, "2", 1, 1078.723, 5, 1188.872, 5571.489),
             (1, 6305.536, 38.405, "1", 2, 6323.281, 4, 6513.218, 4339.951),
             (2, 6935.495, 26.111, "2", 2, 6955.55, 6, 7072.637, 3654.652),
             (1, 10963.117, 289.082, "1", 3, 11197.905, 3, 11211.898, 2965.025),
             (2, 11197.171, 17.135, "2", 3, 11210.519, 5, 11228.016, 3116.484),
             (1, 14239.396, 13.512, "1", 4, 14249.071, 4, 14259.793, 4185.341),
             (2, 14449.752, 16.929, "2", 4, 14461.605, 6, 14475.613, 4187.518),
             (1, 30171.686, 23.646, "1", 7, 30187.015, 3, 32006.559, 264.814),
             (2, 38325.284, 23.135, "2", 7, 38338.64, 5, 38362.571, 519.408)]
    events = [_event("c10d::allreduce_", f"{start:.3f}", f"{dur:.3f}", tid=tid) for tid, start, dur, *_ in calls]
    events += [_event("gloo:all_reduce", f"{work:.3f}", f"{dur:.3f}", cat="user_annotation", tid=worker)
               for *_, worker, work, dur in calls]
    rows = [[pg, seq, "gloo:all_reduce", base + round(made * 1000)] for _, _, _, pg, seq, made, *_ in calls]
    data = _trace(events, baseTimeNanoseconds=base, rankscope={"rank": 3, "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns"], "rows": rows}})
    data["distributedInfo"]["pg_config"] = [{"pg_name": "1", "ranks": [0, 1, 2, 3]}, {"pg_name": "2", "ranks": [0, 1, 2, 3]}]
    table = read_kineto(_write(tmp_path / "rank3.json", data))
    coll = _collectives(table)
    found = {(c, s): (call - base, start - base)
             for c, s, call, start in zip(coll["comm_id"], coll["seq"], coll["cpu_call_ns"], coll["start_ns"])}
    assert found == {(pg, seq): (round(start * 1000), round(work * 1000)) for _, start, _, pg, seq, _, _, work, _ in calls}
    assert not any("Flight Recorder" in w or "enqueued" in w for w in _row(table)["warnings"])


def test_calls_of_two_groups_overlapping_on_threads_that_serve_both_are_left_unmatched_in_their_group(tmp_path):
    """As above, but each thread had already called both groups: which of the two entries
    made while both calls ran is whose cannot be told. Both calls are left unmatched, with
    a warning, keeping no seq; the later calls keep theirs."""
    base = 1_700_000_000_000_000_000
    # (caller tid, start, dur, group, seq, entry made at, worker tid, worker start)
    calls = [(1, 0.0, 50.0, "1", 1, 20.0, 3, 100.0), (1, 1000.0, 50.0, "2", 1, 1020.0, 5, 1100.0),
             (2, 2000.0, 50.0, "1", 2, 2020.0, 4, 2100.0), (2, 3000.0, 50.0, "2", 2, 3020.0, 6, 3100.0),
             (1, 5000.0, 300.0, "1", 3, 5200.0, 3, 5400.0), (2, 5100.0, 150.0, "2", 3, 5210.0, 5, 5410.0),
             (1, 8000.0, 50.0, "1", 4, 8020.0, 4, 8100.0), (2, 9000.0, 50.0, "2", 4, 9020.0, 6, 9100.0)]
    events = [_event("c10d::allreduce_", f"{start:.3f}", f"{dur:.3f}", tid=tid) for tid, start, dur, *_ in calls]
    events += [_event("gloo:all_reduce", f"{work:.3f}", "200.000", cat="user_annotation", tid=worker)
               for *_, worker, work in calls]
    rows = [[pg, seq, "gloo:all_reduce", base + round(made * 1000)] for _, _, _, pg, seq, made, _, _ in calls]
    data = _trace(events, baseTimeNanoseconds=base, rankscope={"rank": 3, "flight_recorder": {
        "columns": ["pg_name", "seq", "profiling_name", "time_created_ns"], "rows": rows}})
    data["distributedInfo"]["pg_config"] = [{"pg_name": "1", "ranks": [0, 1, 2, 3]}, {"pg_name": "2", "ranks": [0, 1, 2, 3]}]
    table = read_kineto(_write(tmp_path / "rank3.json", data))
    coll = _collectives(table)
    found = {(c, s): start - base for c, s, start in zip(coll["comm_id"], coll["seq"], coll["start_ns"])}
    assert found == {(pg, seq): round(work * 1000) for _, _, _, pg, seq, _, _, work in calls if seq != 3}
    assert ("2 collective call(s) ran alongside calls of the same op on other threads when their Flight Recorder "
            "entries were made, and which entry is whose cannot be told (entries name no thread): not matched"
            ) in _row(table)["warnings"]


def test_gloo_ops_one_group_took_up_together_in_another_order_than_they_started_are_left_unmatched(tmp_path):
    """Real torch 2.13 gloo, one group, 12 async all_reduces of distinct sizes: gloo's two
    worker threads took calls 1 and 2 off the queue in order, but op 2 started 180 µs before
    op 1 on the other thread, and FIFO by start gave call 1 op 2's timing, silently. The
    timings here are that run's. Where a thread was free before the other's op started, the
    order is sure: those pairs stay; the two taken up together are left unmatched."""
    base = 1_700_000_000_000_000_000
    calls = [(0, "1", 1), (129, "1", 2), (173, "1", 3), (189, "1", 4)]
    # (start µs, tid): op 2 on thread 4 first; ops 3 and 4 after their threads' previous op ended
    workers = [(480, 3), (298, 4), (948, 4), (1088, 3)]
    durs = {480: 590, 298: 642, 948: 294, 1088: 348}
    data = _groups_trace(calls, workers, range(len(workers)))
    for event in data["traceEvents"]:
        if event["name"] == "gloo:all_reduce":
            event["dur"] = f"{durs[int(event['ts'].split('.')[0])]}.000"
    table = read_kineto(_write(tmp_path / "rank3.json", data))
    coll = _collectives(table)
    assert {s: t - base for s, t in zip(coll["seq"], coll["start_ns"])} == {3: 948_000, 4: 1_088_000}
    assert ("2 gloo worker op(s) could have been taken off their group's queue in another order than they "
            "started (worker threads free together; their events name no call): not matched") in _row(table)["warnings"]


def _sized_trace(calls, workers, *, recorded=1) -> dict:
    """One group's all_reduce calls ((µs, seq, floats; None: no Flight Recorder entry)) and
    worker ops ((µs, tid, floats)) that show their sizes; the entries' inputs are ``recorded``
    times the calls' floats."""
    base = 1_700_000_000_000_000_000
    events = [_event("c10d::allreduce_", f"{t}.000", "5.000", tid=1) for t, _, _ in calls]
    events += [_event("gloo:all_reduce", f"{t}.000", "100.000", cat="user_annotation", tid=tid,
                      args={"Input Dims": [[n]], "Input type": ["float"]}) for t, tid, n in workers]
    rows = [["1", seq, "gloo:all_reduce", base + t * 1000 + 2_000, False, 4 * n * recorded, 4 * n * recorded]
            for t, seq, n in calls if n]
    columns = ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes", "out_bytes"]
    return _trace(events, baseTimeNanoseconds=base,
                  rankscope={"rank": 3, "flight_recorder": {"columns": columns, "rows": rows}})


# Calls 1 and 2 came together, both worker threads free: op 2 started first. Calls 3 and 4
# likewise, but call 4 has no entry (the window's end): its size is not known.
_SIZED_CALLS = [(0, 1, 1024), (10, 2, 2048), (1000, 3, 1024), (1010, 4, None)]
_SIZED_WORKERS = [(40, 3, 1024), (30, 4, 2048), (1040, 3, 1024), (1030, 4, 2048)]


def test_gloo_ops_taken_up_together_pair_by_size_until_a_call_of_unknown_size(tmp_path):
    """Sizes tell calls 1 and 2 apart, and op 3 is call 3's (op 4, of another size, cannot
    be). Call 4's size is not known: by op, ops 3 and 4 are in doubt, and call 4 is dropped
    (no entry), said once, as the window's edge."""
    base = 1_700_000_000_000_000_000
    table = read_kineto(_write(tmp_path / "rank3.json", _sized_trace(_SIZED_CALLS, _SIZED_WORKERS)))
    coll = _collectives(table)
    assert {s: (t - base, b) for s, t, b in zip(coll["seq"], coll["start_ns"], coll["bytes"])} == {
        1: (40_000, 4096), 2: (30_000, 8192), 3: (1_040_000, 4096)}
    notes = [w for w in _row(table)["warnings"] if "not matched" in w]
    assert notes == ["1 collective call(s) at the window's edges have no Flight Recorder entry: not matched"]


def test_gloo_sizes_that_do_not_match_their_calls_entries_pair_by_op_alone(tmp_path):
    """Entries whose inputs are not the sizes the worker ops show (two measures that do not
    agree) tell nothing: the ops taken up together stay in doubt, as without sizes."""
    calls, workers = _SIZED_CALLS[:2], _SIZED_WORKERS[:2]
    table = read_kineto(_write(tmp_path / "rank3.json", _sized_trace(calls, workers, recorded=2)))
    assert _collectives(table).empty
    assert ("2 gloo worker op(s) could have been taken off their group's queue in another order than they "
            "started (worker threads free together; their events name no call): not matched") in _row(table)["warnings"]


def test_no_bus_bandwidth_for_a_communicator_whose_size_only_the_ranks_present_suggest(tmp_path):
    """Two ranks of an 8-rank job whose group lists no members: its size is unknown (the
    ranks using it are 2 of perhaps 8), and nccl-tests' factor, (n - 1) for a ReduceScatter,
    would be taken for n = 2. No bus bandwidth is claimed, and a warning says why; the
    transfer time still is."""
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    paths = []
    for rank, at in ((0, 120.0), (1, 150.0)):
        data = _reduce_scatter_rank(rank, at)
        data["distributedInfo"].update(world_size=8)
        del data["distributedInfo"]["pg_config"]
        paths.append(_write(tmp_path / f"rank{rank}.json", data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze(load_digests(paths))
    (spread,) = report.communicators[0].ops
    assert spread.busbw_gbps is None and spread.transfer_mean_ns > 0
    assert any("no bus bandwidth" in w and report.communicators[0].comm_id in w for w in report.warnings)


# Real torch 2.13 gloo, rank 0 of 4, its first two steps: an all_reduce on the world (group 0),
# a list-form reduce_scatter on group 1 (all four ranks), an all_reduce on group 1. Per call:
# (c10d op, start µs, dur, group, its Flight Recorder entries' times, its worker ops (tid,
# start, dur, floats)). The reduce_scatter runs as four gloo:all_reduce ops, one per member,
# on group 1's two worker threads, and has four entries.
_LIST_REDUCE_SCATTER = [
    ("c10d::allreduce_", 0.0, 519.6, "0", [49.452], [(32, 276.44, 63518.717, 2048)]),
    ("c10d::reduce_scatter_", 65167.052, 121.631, "1", [65256.544, 65270.124, 65277.385, 65285.807],
     [(39, 65441.129, 10096.233, 1024), (40, 65689.677, 10418.682, 1024), (39, 75561.308, 7596.026, 1024),
      (40, 76122.711, 7740.931, 1024)]),
    ("c10d::allreduce_", 84085.301, 56.784, "1", [84122.325], [(39, 84169.425, 5558.534, 2048)]),
    ("c10d::allreduce_", 90125.319, 417.94, "0", [90149.964], [(31, 90273.248, 9028.12, 2048)]),
    ("c10d::reduce_scatter_", 99566.572, 1154.792, "1", [99629.584, 99654.1, 100710.097, 100716.937],
     [(40, 99675.343, 8246.55, 1024), (39, 100756.756, 7214.731, 1024), (40, 107932.059, 7059.931, 1024),
      (39, 107975.383, 7983.921, 1024)]),
    ("c10d::allreduce_", 116172.391, 49.613, "1", [116209.815], [(40, 116239.51, 2306.15, 2048)]),
]
_BASE = 1_700_000_000_000_000_000


def _list_reduce_scatter_trace(calls, *, flight_recorder: bool, tp_of_two: bool = False) -> dict:
    """``calls`` as rank 0's trace, with the hook's Flight Recorder or without (a plain
    torch.profiler trace); ``tp_of_two``: the rank is also in a group of two it makes no call on."""
    events, rows, seq = [], [], {}
    for name, start, dur, pg, entries, workers in calls:
        events.append(_event(name, f"{start:.3f}", f"{dur:.3f}", tid=12))
        events += [_event("gloo:all_reduce", f"{t:.3f}", f"{d:.3f}", cat="user_annotation", tid=tid,
                          args={"Input Dims": [[n]], "Input type": ["float"]}) for tid, t, d, n in workers]
        for made, (*_, n) in zip(entries, workers):
            seq[pg] = seq.get(pg, 0) + 1
            rows.append([pg, seq[pg], "gloo:all_reduce", _BASE + round(made * 1000), False, 4 * n, 4 * n])
    top = {"baseTimeNanoseconds": _BASE}
    if flight_recorder:
        columns = ["pg_name", "seq", "profiling_name", "time_created_ns", "is_p2p", "bytes", "out_bytes"]
        top["rankscope"] = {"rank": 0, "flight_recorder": {"columns": columns, "rows": rows}}
    data = _trace(events, **top)
    data["distributedInfo"].update(rank=0, pg_config=[{"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]},
                                                      {"pg_name": "1", "pg_size": 4, "ranks": [0, 1, 2, 3]}])
    if tp_of_two:
        data["distributedInfo"]["pg_config"].append({"pg_name": "2", "pg_size": 2, "ranks": [0, 1]})
    return data


@pytest.mark.parametrize(("flight_recorder", "tp_of_two"), [(False, False), (True, False), (True, True)],
                         ids=["plain", "flight_recorder", "flight_recorder_groups_of_two_sizes"])
def test_a_list_form_reduce_scatter_is_one_instance_over_one_worker_op_per_group_member(tmp_path, flight_recorder,
                                                                                        tp_of_two):
    """torch 2.13 gloo runs dist.reduce_scatter(output, input_list) as one gloo:all_reduce per
    member of its group (4 here), where reduce_scatter_tensor runs one: paired one op a call,
    its other three took the next calls' places, and all but the first of each op was left
    unmatched, said to be ops enqueued before the window. Each call now takes as many worker
    ops as its group has members (the group's, where the Flight Recorder names it; else the
    size every listed group shares): it starts with the first and ends with the last."""
    data = _list_reduce_scatter_trace(_LIST_REDUCE_SCATTER, flight_recorder=flight_recorder, tp_of_two=tp_of_two)
    table = read_kineto(_write(tmp_path / "rank0.json", data))
    coll = _collectives(table)
    ns = lambda us: _BASE + round(us * 1000)  # noqa: E731
    assert coll["op"].tolist() == ["allreduce", "reducescatter", "allreduce"] * 2
    assert coll["cpu_call_ns"].tolist() == [ns(start) for _, start, *_ in _LIST_REDUCE_SCATTER]
    assert coll["start_ns"].tolist() == [ns(min(w[1] for w in workers)) for *_, workers in _LIST_REDUCE_SCATTER]
    assert coll["end_ns"].tolist() == [max(ns(w[1]) + round(w[2] * 1000) for w in workers)
                                       for *_, workers in _LIST_REDUCE_SCATTER]
    assert coll["bytes"].tolist() == [8192, 4096, 8192] * 2  # the reduce_scatter's: the shard it receives
    if flight_recorder:  # a reduce_scatter's group and seq are its first entry's
        assert list(zip(coll["comm_id"], coll["seq"])) == [("0", 1), ("1", 1), ("1", 5), ("0", 2), ("1", 6), ("1", 10)]
    assert not [w for w in _row(table)["warnings"] if "not matched" in w]


# Real torch 2.13 gloo, rank 0 of 4, two steps: each an async list-form reduce_scatter, an async
# all_reduce and another async list-form reduce_scatter on the world, waited together. The first
# two worker ops of step 2's first reduce_scatter start after the second reduce_scatter's call,
# both threads free: they may have taken each other's op, both of the first reduce_scatter.
_ASYNC_LIST_REDUCE_SCATTER = [
    ("c10d::reduce_scatter_", 0.0, 4945.5, "0", [10.0, 11.0, 12.0, 13.0],
     [(39, 409.5, 6373.2, 4096), (40, 5594.4, 2024.3, 4096), (39, 6810.2, 5051.3, 4096), (40, 7635.4, 5383.8, 4096)]),
    ("c10d::allreduce_", 5129.9, 24.1, "0", [5130.0], [(39, 11882.3, 9942.5, 8192)]),
    ("c10d::reduce_scatter_", 5300.5, 69.3, "0", [5301.0, 5302.0, 5303.0, 5304.0],
     [(40, 13041.8, 5341.8, 4096), (40, 18405.5, 10433.3, 4096), (39, 25057.2, 12023.2, 4096),
      (40, 28854.2, 9171.7, 4096)]),
    ("c10d::reduce_scatter_", 38239.1, 87.4, "0", [38240.0, 38241.0, 38242.0, 38243.0],
     [(40, 38524.8, 6915.5, 4096), (39, 38649.5, 7432.5, 4096), (40, 45943.5, 4878.9, 4096),
      (39, 46178.6, 4705.9, 4096)]),
    ("c10d::allreduce_", 38366.8, 6.5, "0", [38367.0], [(39, 50926.7, 4815.1, 8192)]),
    ("c10d::reduce_scatter_", 38427.3, 39.3, "0", [38428.0, 38429.0, 38430.0, 38431.0],
     [(40, 52786.4, 2916.3, 4096), (40, 55810.8, 7195.9, 4096), (39, 55868.5, 7648.4, 4096),
      (40, 63039.8, 1888.1, 4096)]),
]


@pytest.mark.parametrize(("flight_recorder", "matched"), [(True, [0, 1, 2, 3, 4, 5]), (False, [0, 1, 2, 3])],
                         ids=["flight_recorder", "plain"])
def test_worker_ops_of_one_list_form_reduce_scatter_that_may_have_swapped_leave_no_doubt(tmp_path, flight_recorder,
                                                                                        matched):
    """FIFO doubt is about an op taking a later call's place; two ops of one call swapped
    leave each call its own ops. Taken as doubt, step 2's first reduce_scatter lost two of
    its four ops and was left out, unmatched, though no other call could have had them.
    (Plain, op alone pairs them: step 2's all_reduce op and the next reduce_scatter's first
    may have swapped, truly; the Flight Recorder's sizes tell them apart.)"""
    from rankscope.analysis import ops

    data = _list_reduce_scatter_trace(_ASYNC_LIST_REDUCE_SCATTER, flight_recorder=flight_recorder)
    data["distributedInfo"]["pg_config"] = [{"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]}]
    table = read_kineto(_write(tmp_path / "rank0.json", data))
    coll = _collectives(table)
    calls = [_ASYNC_LIST_REDUCE_SCATTER[i] for i in matched]
    ns = lambda us: _BASE + round(us * 1000)  # noqa: E731
    assert coll["op"].tolist() == [ops.canonical(name) for name, *_ in calls]
    assert coll["start_ns"].tolist() == [ns(min(w[1] for w in workers)) for *_, workers in calls]
    assert coll["end_ns"].tolist() == [max(ns(w[1]) + round(w[2] * 1000) for w in workers) for *_, workers in calls]
    cut = [w for w in _row(table)["warnings"] if "run as one worker op per member" in w]
    assert cut == ([] if flight_recorder else [  # the second reduce_scatter, its first op in doubt
        "1 gloo call(s) run as one worker op per member of their group had only some of those paired (the "
        "window's edges, or ops in doubt): not matched"])


def test_a_list_form_reduce_scatter_of_a_group_whose_size_is_not_known_leaves_its_op_unmatched_and_says_why(tmp_path):
    """A plain trace names no call's group; where the rank's groups differ in size, how many
    all_reduce worker ops each reduce_scatter ran cannot be told, nor which of them are the
    all_reduce calls' own: none of that op is matched, and the warning names the cause."""
    data = _list_reduce_scatter_trace(_LIST_REDUCE_SCATTER, flight_recorder=False, tp_of_two=True)
    table = read_kineto(_write(tmp_path / "rank0.json", data))
    assert _collectives(table).empty
    assert [w for w in _row(table)["warnings"] if "not matched" in w] == [
        "12 gloo worker op(s) of 6 call(s) not matched: gloo runs 2 c10d::reduce_scatter_ call(s) as one "
        "gloo:all_reduce per member of their group, which the trace does not name (its groups differ in size; "
        "the rankscope torch hook's Flight Recorder would), so the gloo:all_reduce ops cannot be counted off to "
        "their calls"]


def test_a_list_form_reduce_scatter_in_a_trace_listing_no_groups_is_said_so(tmp_path):
    """No group listed at all: the warning says that, not that the groups differ in size."""
    data = _list_reduce_scatter_trace(_LIST_REDUCE_SCATTER, flight_recorder=False)
    del data["distributedInfo"]["pg_config"]
    table = read_kineto(_write(tmp_path / "rank0.json", data))
    assert _collectives(table).empty
    (note,) = [w for w in _row(table)["warnings"] if "not matched" in w]
    assert "which the trace does not name (it lists no groups;" in note


@pytest.mark.filterwarnings("default::rankscope.errors.RankscopeWarning")  # `rankscope analyze` prints them: read below
def test_where_no_call_could_be_matched_analyze_says_why_before_its_error(tmp_path, capsys):
    """Both ranks' all_reduce and reduce_scatter ops left unmatched (groups of unknown size):
    no collective is left to align, and the error alone ("no collectives") would hide why.
    The traces' notes come first, as warnings; the error is still one line, exit 2."""
    from rankscope.cli import main

    paths = []
    for rank in (0, 1):
        data = _list_reduce_scatter_trace(_LIST_REDUCE_SCATTER, flight_recorder=False, tp_of_two=True)
        data["distributedInfo"]["rank"] = rank
        paths.append(str(_write(tmp_path / f"rank{rank}.json", data)))
    assert main(["analyze", *paths]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("rankscope: error: no collectives in any rank of 2 files")
    assert any(line.startswith("rankscope: warning: ranks 0,1: 12 gloo worker op(s) of 6 call(s) not matched")
               for line in err[:-1])


def test_a_list_form_reduce_scatter_cut_by_the_windows_end_is_left_out_and_said(tmp_path):
    """The window ended after two of the last reduce_scatter's four worker ops had started:
    an instance of half its ops would end early. It is left out, with a warning; the calls
    before it keep theirs."""
    *whole, (name, start, dur, pg, entries, workers) = _LIST_REDUCE_SCATTER[:5]
    data = _list_reduce_scatter_trace([*whole, (name, start, dur, pg, entries, workers[:2])], flight_recorder=True)
    table = read_kineto(_write(tmp_path / "rank0.json", data))
    assert _collectives(table)["op"].tolist() == ["allreduce", "reducescatter", "allreduce", "allreduce"]
    assert [w for w in _row(table)["warnings"] if "not matched" in w] == [
        "1 gloo call(s) run as one worker op per member of their group had only some of those paired (the "
        "window's edges, or ops in doubt): not matched"]


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_every_gloo_collective_of_a_real_job_is_matched_with_and_without_the_flight_recorder(tmp_path):
    """Real torch 2.13 gloo, 4 ranks, two groups: each collective gloo runs, list and tensor
    forms, each between all_reduces on the world and on the group. A list-form reduce_scatter runs as four
    gloo:all_reduce ops, and paired one op a call, all but 1 of 44 all_reduces and of 4
    reduce_scatters went unmatched (3 of 44 and 1 of 4 with the hook's Flight Recorder).
    Every call is an instance matched on all four ranks, from the hook's trace and from the
    same trace without its metadata (a plain torch.profiler trace)."""
    pytest.importorskip("torch")
    from rankscope.analysis import ops
    from rankscope.analysis.pipeline import analyze

    job = Path(__file__).with_name("gloo_collectives_job.py")
    subprocess.run([sys.executable, str(job), str(_free_port()), str(tmp_path)], check=True, timeout=150)
    hook = sorted(tmp_path.glob("rank*.pt.trace.json"))
    plain = []
    for path in hook:
        data = json.loads(path.read_text())
        del data["rankscope"]
        plain.append(tmp_path / f"plain_{path.name}")
        plain[-1].write_text(json.dumps(data))
    names = [e["name"] for e in json.loads(hook[0].read_text())["traceEvents"] if e["name"].startswith("c10d::")]
    calls = pd.Series([ops.canonical(n) for n in names]).value_counts().to_dict()
    assert calls["reducescatter"] == 4 and calls["allreduce"] == 44
    for paths in (hook, plain):
        tables = [read_kineto(path) for path in paths]
        for table in tables:
            assert not [w for w in _row(table)["warnings"] if "not matched" in w], paths[0].name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # plain: its communicators' members are inferred, and said
            report = analyze(digest.concat(tables))
        instances = pd.DataFrame([(o.op, o.instances) for c in report.communicators for o in c.ops])
        assert instances.groupby(0)[1].sum().to_dict() == calls, paths[0].name
