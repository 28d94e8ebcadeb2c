"""Input discovery: folders as nsys leaves them, lone reports, digests, Kineto, refusals."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rankscope.agent import nsys as nsys_cli
from rankscope.analysis import digest, nsys, sources
from rankscope.analysis import simulate as sim
from rankscope.errors import ConsistencyError, ExportError, InputError, RankscopeWarning, ToolError

DSL = "nsys/dsl_2node_2rank_allreduce"


@pytest.fixture(scope="module")
def dsl(samples: Path) -> Path:
    return samples / DSL


def test_folder_skips_reports_beside_their_exports(dsl: Path) -> None:
    assert len(list(dsl.glob("*.nsys-rep"))) == 2
    files = sources.discover([dsl])
    assert [f.suffix for f in files] == [".sqlite", ".sqlite"]
    table = sources.load_digests([dsl])
    assert table.column("rank").to_pylist() == [0, 1]
    assert table.column("host").to_pylist() == ["ault43.cscs.ch", "ault44.cscs.ch"]


def test_a_report_named_alone_reads_the_export_beside_it(dsl: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")  # no nsys needed
    report = sorted(dsl.glob("*ault44*.nsys-rep"))[0]
    table = sources.load_digests([report])
    assert table.column("rank").to_pylist() == [1]
    assert table.column("source_file").to_pylist() == [str(report.with_suffix(".sqlite"))]


def test_same_file_named_twice_is_read_once(dsl: Path) -> None:
    export = sorted(dsl.glob("*.sqlite"))[0]
    assert sources.discover([export, dsl]).count(export) == 1


def test_one_file_under_two_names_is_read_once_by_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A link, or a relative and an absolute path, named it twice: it claimed its ranks twice,
    # and its two reads (on two threads, with two SQLite libraries) could drop each other's lock.
    sim.simulate(sim.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, seed=1), tmp_path / "job")
    first = sorted((tmp_path / "job").glob("*.sqlite"))[0]
    (tmp_path / "link.sqlite").symlink_to(first)
    monkeypatch.chdir(tmp_path)
    relative = Path("job") / first.name
    assert sources.discover([relative, first, tmp_path / "link.sqlite"]) == [relative]
    assert sources.load_digests([tmp_path / "job", tmp_path / "link.sqlite"]).num_rows == 2


def _lone_report(dsl: Path, tmp_path: Path) -> Path:
    report = tmp_path / "rank0.nsys-rep"
    shutil.copy(sorted(dsl.glob("*ault43*.nsys-rep"))[0], report)
    return report


def test_lone_report_without_nsys_names_the_command_to_run(dsl: Path, tmp_path: Path, monkeypatch) -> None:
    report = _lone_report(dsl, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ExportError) as err:
        sources.load_digests([tmp_path])
    message = str(err.value)
    assert str(report) in message
    command = f"nsys export --type=sqlite --output={tmp_path / 'rank0.sqlite'} --force-overwrite=true --include-blobs=true {report}"
    assert message.endswith(f"run: {command}")


@pytest.mark.parametrize("nsys_here", [False, True])
def test_the_export_command_suggested_for_a_lone_report_runs_as_pasted(dsl: Path, tmp_path: Path, monkeypatch,
                                                                        nsys_here: bool) -> None:
    # found by review: a path with a space or `;` was put in bare, so the pasted line ran
    # `nsys export ... --output=/a` and then `b/rank 0.sqlite ...` as a second command
    folder = tmp_path / "job a;b"
    folder.mkdir()
    report = _lone_report(dsl, folder)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nsys_here:  # one that fails: the message says what failed, and what to try
        fake = bin_dir / "nsys"
        fake.write_text("#!/bin/sh\necho 'Importer error' >&2\nexit 1\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(ToolError if nsys_here else ExportError) as err:
        sources.load_digests([folder])
    message = str(err.value)
    suggested = message.rpartition("try: " if nsys_here else "run: ")[2]
    assert shlex.split(suggested) == nsys_cli.export_command(report, folder / "rank0.sqlite")
    if nsys_here:
        failed = re.search(r"`([^`]*)` failed", message)[1]
        assert shlex.split(failed)[-1] == str(report)


def test_lone_report_is_exported_with_nsys_when_installed(dsl: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "reports").mkdir()
    report = _lone_report(dsl, tmp_path / "reports")
    # A stand-in `nsys` that, like `nsys export --type=sqlite --output=OUT ... REP`, writes OUT.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    export = sorted(dsl.glob("*ault43*.sqlite"))[0]
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2 $5" = "export --type=sqlite --include-blobs=true" ] || exit 3\n'
        f'cp "{export}" "${{3#--output=}}"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    table = sources.load_digests([report.parent])
    assert table.column("rank").to_pylist() == [0]
    assert table.column("source_file").to_pylist() == [str(report)]
    assert not list(report.parent.glob("*.sqlite"))  # the export went to a temporary folder


def test_digests_and_exports_mix(dsl: Path, tmp_path: Path) -> None:
    exports = sorted(dsl.glob("*.sqlite"))
    digest.write(nsys.read_nsys(exports[0]), tmp_path / "rank0.parquet")
    table = sources.load_digests([tmp_path / "rank0.parquet", exports[1]])
    assert table.column("rank").to_pylist() == [0, 1]
    assert table.column("source_format").to_pylist() == ["nsys-sqlite", "nsys-sqlite"]
    direct = nsys.read_nsys(exports[0])
    same = ["warnings", "source_file"]
    assert table.slice(0, 1).drop_columns(same).equals(direct.drop_columns(same))
    # messages name the digest given, beside the export it was made from
    assert table.column("source_file").to_pylist() == [f"{tmp_path / 'rank0.parquet'} (digest of {exports[0]})",
                                                       str(exports[1])]


def test_an_export_beside_its_own_digest_is_read_once(dsl: Path, tmp_path: Path, monkeypatch) -> None:
    original = sorted(dsl.glob("*.sqlite"))[0]
    export = tmp_path / original.name
    shutil.copy(original, export)
    monkeypatch.chdir(tmp_path)  # as `rankscope digest` run in the folder writes it: a relative source
    digest.write(nsys.read_nsys(Path(export.name)), tmp_path / "rank0.parquet")
    with pytest.warns(RankscopeWarning) as caught:
        table = sources.load_digests([tmp_path])
    assert table.column("source_file").to_pylist() == [str(export)]
    assert [str(w.message) for w in caught] == [
        f"{tmp_path / 'rank0.parquet'}: a digest of {export}, which is in the input too "
        "(same rank 0, host, process and window); read the export alone"]


def test_a_node_digest_beside_its_exports_warns_once_not_per_rank(dsl: Path, tmp_path: Path, monkeypatch) -> None:
    # found by review: `rankscope fetch` lays a node's digest beside the node's exports, and
    # `analyze` on that folder warned once per rank (512 lines for a fetched 512-rank sweep).
    exports = [tmp_path / p.name for p in sorted(dsl.glob("*.sqlite"))]
    for original, export in zip(sorted(dsl.glob("*.sqlite")), exports):
        shutil.copy(original, export)
    monkeypatch.chdir(tmp_path)
    digest.write(digest.concat([nsys.read_nsys(Path(e.name)) for e in exports]), tmp_path / "node.digest.parquet")
    with pytest.warns(RankscopeWarning) as caught:
        table = sources.load_digests([tmp_path])
    assert table.column("source_file").to_pylist() == [str(e) for e in exports]
    assert [str(w.message) for w in caught] == [
        f"{tmp_path / 'node.digest.parquet'}: a digest of 2 exports in the input too (ranks 0,1, {exports[0]} to "
        f"{exports[1]}; same host, process and window each); read the exports alone"]


def test_node_digests_beside_their_exports_warn_once_for_the_sweep(dsl: Path, tmp_path: Path, monkeypatch) -> None:
    # `rankscope fetch` of a sweep run with --upload-raw lays each node's digest beside that
    # node's exports: one warning per node buried a large sweep's report in them.
    monkeypatch.chdir(tmp_path)
    for node, original in zip(("node-a", "node-b"), sorted(dsl.glob("*.sqlite"))):
        (tmp_path / node).mkdir()
        export = Path(node) / original.name
        shutil.copy(original, export)
        digest.write(nsys.read_nsys(export), tmp_path / node / f"{node}.digest.parquet")
    with pytest.warns(RankscopeWarning) as caught:
        table = sources.load_digests([tmp_path])
    assert sorted(table.column("rank").to_pylist()) == [0, 1]
    assert all("(digest of" not in source for source in table.column("source_file").to_pylist())
    assert [str(w.message) for w in caught] == [
        f"2 digests of exports in the input too ({tmp_path / 'node-a' / 'node-a.digest.parquet'} to "
        f"{tmp_path / 'node-b' / 'node-b.digest.parquet'}: ranks 0,1; same host, process and window each); "
        "read the exports alone"]


def test_a_digest_of_another_capture_beside_an_export_names_both_files(dsl: Path, tmp_path: Path) -> None:
    original = sorted(dsl.glob("*.sqlite"))[0]
    export = tmp_path / original.name
    shutil.copy(original, export)
    stale = nsys.read_nsys(export)  # as if built from the capture before this one, an hour earlier
    for name in ("window_start_ns", "window_end_ns"):
        stale = stale.set_column(stale.schema.get_field_index(name), name,
                                 pa.array([stale.column(name)[0].as_py() - 3600 * 10**9], pa.int64()))
    digest.write(stale, tmp_path / "rank0.parquet")
    with pytest.raises(ConsistencyError) as caught:
        sources.load_digests([tmp_path])
    assert str(caught.value) == (f"{tmp_path / 'rank0.parquet'} (digest of {export}): "
                                 f"rank 0 is also claimed by {export} (the digest is of an earlier export of that name: "
                                 "rebuild it with `rankscope digest`, or remove it)")


def test_folder_walk_takes_digests_but_not_other_parquet(dsl: Path, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    digest.write(nsys.read_nsys(sorted(dsl.glob("*.sqlite"))[0]), tmp_path / "rank0.parquet")
    tables = tmp_path / "report_pqtdir"
    tables.mkdir()
    pq.write_table(pa.table({"start": [1, 2]}), tables / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    assert sources.discover([tmp_path]) == [tmp_path / "rank0.parquet"]
    with pytest.raises(ExportError, match="not a rankscope digest"):
        sources.load_digests([tables / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"])


def _digest_edited(dsl: Path, path: Path, marker: bytes | None = None, **columns: pa.Array) -> Path:
    """A digest of the DSL sample's rank 0 with columns or its schema marker replaced,
    written as Parquet (not by `digest.write`, which would cast it back)."""
    import pyarrow.parquet as pq

    table = _dsl_digest(dsl)
    for name, column in columns.items():
        table = table.set_column(table.schema.get_field_index(name), pa.field(name, column.type), column)
    pq.write_table(table.replace_schema_metadata({b"rankscope.schema": marker or digest.DIGEST_VERSION.encode()}), path)
    return path


@pytest.mark.parametrize("rank, error", [
    (pa.nulls(1, pa.int32()), "Casting field 'rank' with null values to non-nullable"),  # a ValueError
    (pa.array([{"a": 1}]), "Unsupported cast from struct"),  # an ArrowNotImplementedError
    (pa.array(["zero"]), "Failed to parse string"),
])
def test_a_digest_whose_rank_does_not_fit_the_schema_is_an_error_naming_it(dsl: Path, tmp_path: Path, rank: pa.Array,
                                                                          error: str) -> None:
    # Only KeyError and ArrowInvalid were caught: the others ended in a traceback.
    edited = _digest_edited(dsl, tmp_path / "edited.parquet", rank=rank)
    with pytest.raises(ExportError, match=f"digest does not match rankscope.digest/1: {error}") as err:
        digest.read(edited)
    assert str(edited) in str(err.value)


def test_a_digest_whose_collective_ends_before_it_starts_is_an_error_naming_it(dsl: Path, tmp_path: Path) -> None:
    # A damaged or hand-edited digest: its negative length was analysed as transfer time, unsaid.
    table = nsys.read_nsys(sorted(dsl.glob("*.sqlite"))[0])
    column = table.column("collectives").combine_chunks()
    flat = pc.list_flatten(column)
    assert len(flat) == 1
    start = flat.field("start_ns")
    fields = {f.name: flat.field(f.name) for f in flat.type} | {"end_ns": pc.subtract(start, 5)}
    inverted = pa.ListArray.from_arrays(column.offsets, pa.StructArray.from_arrays(list(fields.values()), fields=list(flat.type)))
    edited = _digest_edited(dsl, tmp_path / "edited.parquet", collectives=inverted)
    comm = flat.field("comm_id")[0].as_py()
    with pytest.raises(ExportError, match=rf"1 of its 1 collectives end before they start \(a damaged digest\): the first, "
                                          rf"rank 0's seq 0 on communicator {comm}, ends 5 ns before its start") as err:
        digest.read(edited)
    assert str(err.value).startswith(f"{edited}: ")
    with pytest.raises(ExportError, match="collectives end before they start"):
        sources.load_digests([tmp_path])
    digest.write(table, tmp_path / "edited.parquet")  # as written: read back whole
    assert digest.read(tmp_path / "edited.parquet").column("collectives").equals(digest.concat([table]).column("collectives"))


def test_a_digest_marker_that_is_not_utf8_is_an_error_naming_it(dsl: Path, tmp_path: Path) -> None:
    # Parquet metadata holds any bytes: a UnicodeDecodeError traceback named no file.
    edited = _digest_edited(dsl, tmp_path / "edited.parquet", marker=b"\xff\xfe")
    with pytest.raises(ExportError, match=r"not a rankscope digest \(schema '\\\\xff\\\\xfe'") as err:
        digest.read(edited)
    assert str(edited) in str(err.value)


def test_a_digest_of_another_rankscope_version_says_so(dsl: Path, tmp_path: Path) -> None:
    # It said "not a rankscope digest (schema 'rankscope.digest/2' ...)" of one of ours.
    edited = _digest_edited(dsl, tmp_path / "newer.parquet", marker=b"rankscope.digest/2")
    with pytest.raises(ExportError, match=r"a digest of another rankscope version \('rankscope.digest/2'; this one "
                                          r"reads 'rankscope.digest/1'\)") as err:
        digest.read(edited)
    assert str(edited) in str(err.value)


def _dsl_digest(dsl: Path) -> pa.Table:
    return nsys.read_nsys(sorted(dsl.glob("*.sqlite"))[0]).cast(digest.DIGEST_SCHEMA)


def _without(table: pa.Table, part: str, *names: str) -> pa.Array:
    """A list part's column with these fields of its structs dropped."""
    column = table.column(part).combine_chunks()
    flat = pc.list_flatten(column)
    kept = [f for f in flat.type if f.name not in names]
    return pa.ListArray.from_arrays(column.offsets, pa.StructArray.from_arrays([flat.field(f.name) for f in kept], fields=kept))


def test_a_digest_written_before_collectives_kept_their_stream_reads_with_none(dsl: Path, tmp_path: Path) -> None:
    # Digests stored by earlier agents lack the last collective field: read with it null, not refused.
    table = _dsl_digest(dsl)
    flat = pc.list_flatten(table.column("collectives").combine_chunks())
    assert flat.field("stream").null_count == 0  # no payloads in the sample: its calls keep their stream
    read = digest.read(_digest_edited(dsl, tmp_path / "older.parquet", collectives=_without(table, "collectives", "stream")))
    assert pc.list_flatten(read.column("collectives").combine_chunks()).field("stream").null_count == len(flat)


@pytest.mark.parametrize("part, names", [
    ("collectives", ("bytes",)),  # nullable: the cast filled it with nulls, unsaid
    ("communicators", ("ranks", "size")),
    ("kernels", ("total_ns",)),  # not nullable: the cast named it inside the struct's whole type
    ("steps", ("step",)),  # no rows: nothing failed, nulls or not
])
def test_a_digest_lacking_fields_of_its_schema_is_an_error_naming_them(dsl: Path, tmp_path: Path, part: str,
                                                                      names: tuple[str, ...]) -> None:
    edited = _digest_edited(dsl, tmp_path / "edited.parquet", **{part: _without(_dsl_digest(dsl), part, *names)})
    lacking = ", ".join(f"{part}.{name}" for name in names)
    with pytest.raises(ExportError) as err:
        digest.read(edited)
    assert str(err.value) == (f"{edited}: digest does not match rankscope.digest/1: it lacks the "
                              f"field{'s' * (len(names) > 1)} {lacking}")


def test_kineto_traces_go_to_the_kineto_reader(samples: Path) -> None:
    folder = samples / "kineto" / "gloo_cpu_torch2.13"
    table = sources.load_digests([folder / "rank0.json", folder / "rank1.json"])
    assert table.column("rank").to_pylist() == [0, 1]
    assert set(table.column("source_format").to_pylist()) == {"kineto-json"}


def test_refusals(dsl: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        sources.load_digests([tmp_path / "missing.sqlite"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no exports or digests found in .*empty$"):
        sources.load_digests([tmp_path / "empty"])
    odd = tmp_path / "notes.txt"
    odd.write_text("hello")
    with pytest.raises(ExportError, match="unknown input type"):
        sources.load_digests([odd])
    export = sorted(dsl.glob("*ault43*.sqlite"))[0]
    twin = tmp_path / "twin.sqlite"
    shutil.copy(export, twin)
    with pytest.raises(ConsistencyError, match="rank 0 is also claimed"):
        sources.load_digests([export, twin])


def test_folder_walk_skips_json_that_is_not_a_kineto_trace(samples: Path, tmp_path: Path) -> None:
    import gzip

    from rankscope.errors import RankscopeWarning

    source = samples / "kineto" / "gloo_cpu_torch2.13"
    for name in ("rank0.json", "rank1.json", "fr_rank0.json"):
        shutil.copy(source / name, tmp_path / name)
    # A Flight Recorder dump as the profiler's users often keep it: gzipped, beside the traces.
    (tmp_path / "fr_rank1.json.gz").write_bytes(gzip.compress((source / "fr_rank1.json").read_bytes()))
    with pytest.warns(RankscopeWarning, match="not Kineto traces") as caught:
        files = sources.discover([tmp_path])
    assert [f.name for f in files] == ["rank0.json", "rank1.json"]
    # Said once for all (found by fuzzing: a folder of 300 such files was 300 lines on stderr).
    assert [str(w.message) for w in caught] == [
        f"2 JSON files without traceEvents are not Kineto traces (e.g. Flight Recorder dumps): skipped "
        f"({tmp_path / 'fr_rank0.json'} to {tmp_path / 'fr_rank1.json.gz'})"]
    with pytest.warns(RankscopeWarning, match="not Kineto traces"):
        table = sources.load_digests([tmp_path])
    assert table.column("rank").to_pylist() == [0, 1]
    # Named explicitly, it is still read, and refused with a clear one-line error.
    with pytest.raises(ExportError, match="not a Kineto trace") as err:
        sources.load_digests([tmp_path / "fr_rank0.json"])
    assert str(tmp_path / "fr_rank0.json") in str(err.value) and "\n" not in str(err.value)


def test_folder_walk_leaves_a_garbled_gzip_trace_to_its_reader(samples: Path, tmp_path: Path) -> None:
    # The walk's look for "traceEvents" passed zlib's error on: a traceback, where a
    # trace that cannot be read is the reader's to refuse, by name.
    import gzip

    packed = gzip.compress((samples / "kineto" / "gloo_cpu_torch2.13" / "rank0.json").read_bytes())
    garbled = tmp_path / "rank0.json.gz"
    garbled.write_bytes(packed[:20] + b"\xff" * 30 + packed[50:])
    assert sources.discover([tmp_path]) == [garbled]
    with pytest.raises(ExportError, match="cannot read Kineto trace") as err:
        sources.load_digests([tmp_path])
    assert str(garbled) in str(err.value)


def test_folder_walk_finds_the_key_across_reads_and_deep_in_the_file(tmp_path: Path, monkeypatch) -> None:
    """The key is looked for a read at a time: found where it straddles two reads, and
    past the first read, plain or gzipped."""
    import gzip

    monkeypatch.setattr(sources, "_SNIFF_BYTES", 7)
    head = b'{"deviceProperties": [' + b'{"id": 0}, ' * 50 + b'{"id": 1}], '
    (tmp_path / "a.json").write_bytes(head + b'"traceEvents": []}')
    (tmp_path / "b.json.gz").write_bytes(gzip.compress(head + b' "traceEvents": []}'))
    assert [f.name for f in sources.discover([tmp_path])] == ["a.json", "b.json.gz"]


def test_digests_already_in_the_schema_are_not_cast_or_joined_again(dsl: Path) -> None:
    """One table, one chunk, in the digest schema: returned as it is; chunks are joined and
    other schemas cast, with equal rows."""
    table = sources.load_digests([dsl])
    assert digest.concat([table]) is table
    two_chunks = pa.concat_tables([table.slice(0, 1), table.slice(1)])
    joined = digest.concat([two_chunks])
    assert joined is not two_chunks and joined.equals(table) and joined.column(0).num_chunks == 1
    unmarked = table.replace_schema_metadata(None)
    assert digest.concat([unmarked]).schema.equals(digest.DIGEST_SCHEMA, check_metadata=True)
    assert digest.concat([table.slice(0, 1), table.slice(1)]).equals(table)


def test_exports_read_in_batches_match_one_file_at_a_time(samples: Path, monkeypatch) -> None:
    exports = [*sorted((samples / DSL).glob("*.sqlite")), samples / "nsys" / "nsysai_2gpu_sendrecv" / "mfu_2gpu_after.sqlite"]
    one_by_one = digest.concat(nsys.read_nsys(path) for path in exports)
    assert one_by_one.column("rank").to_pylist() == [0, 1, 0, 1]
    together = nsys.read_many(exports)  # one batch: three files' rows built at once
    assert together.equals(one_by_one)
    monkeypatch.setattr(nsys, "BATCH_ROWS", 1)  # a batch per file
    assert nsys.read_many(exports).equals(one_by_one)


def test_a_simulated_folder_is_analysed_without_a_word_about_its_truth_file_or_an_earlier_report(tmp_path: Path) -> None:
    import warnings

    from rankscope.analysis import simulate

    spec = simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, seed=3)
    simulate.simulate(spec, tmp_path, fmt="kineto")
    simulate.write_truth(spec, tmp_path / "truth.json")
    from rankscope.analysis.pipeline import analyze

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tmp_path / "report.json").write_text(analyze(sources.load_digests([tmp_path])).to_json())
    (tmp_path / "fr_dump.json").write_text('{"version": "2.4", "entries": []}')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = sources.discover([tmp_path])
    assert sorted(f.name for f in files) == ["sim_rank00000.json", "sim_rank00001.json"]
    # The report an earlier `analyze -o` wrote into the folder is ours too; other JSON is named.
    assert [str(w.message) for w in caught] == [
        f"{tmp_path / 'fr_dump.json'}: JSON without traceEvents is not a Kineto trace (e.g. a Flight Recorder "
        "dump); skipped"]


def test_one_rank_claimed_twice_says_what_the_two_likely_are(dsl: Path, samples: Path, tmp_path: Path) -> None:
    export = sorted(dsl.glob("*ault43*.sqlite"))[0]
    shutil.copy(export, tmp_path / "twin.sqlite")
    with pytest.raises(ConsistencyError, match=r"\(the same capture: one file given twice\?\)$"):
        sources.load_digests([export, tmp_path / "twin.sqlite"])
    with pytest.raises(ConsistencyError, match=r"\(at the same time: two processes of one job took one rank; "):
        sources.load_digests([dsl], rank_from="env:SLURM_LOCALID")  # both nodes' rank is local rank 0
    with pytest.raises(ConsistencyError, match=r"\(another capture window: analyse one run at a time\)$"):
        sources.load_digests([samples / "nsys" / "nsysai_2gpu_sendrecv"])  # before and after a fix


def test_a_profiler_schedules_cycles_are_told_to_be_analysed_one_window_at_a_time() -> None:
    """Real torch 2.13 traces of a profiler with schedule(repeat=2): each rank's process wrote
    one file a cycle (data/gloo_schedule_repeat2/README.md). Refused, as one rank claimed
    twice, with "analyse one run at a time": they are one run. One window's files are a job."""
    folder = Path(__file__).with_name("data") / "gloo_schedule_repeat2"
    with pytest.raises(ConsistencyError, match=r"\(another capture window of the same process, as a profiler "
                                               r"schedule writes one a cycle: analyse one window's files at a time\)$"):
        sources.load_digests([folder])
    first = [sorted(folder.glob(f"rank{rank}.*.gz"))[0] for rank in (0, 1)]
    assert sources.load_digests(first).column("rank").to_pylist() == [0, 1]


@pytest.mark.parametrize("name", ["rank2.json", "rank2.json.gz", "rank2.sqlite", "rank2.parquet"])
def test_an_empty_file_is_refused_by_name_not_skipped_or_misread(name: str, tmp_path: Path) -> None:
    """An empty trace in a folder walk is a capture cut short, not JSON to skip; named, it
    is refused as empty rather than with its reader's "truncated" or "not a database"."""
    from rankscope.analysis import simulate

    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), tmp_path, fmt="kineto")
    empty = tmp_path / name
    empty.touch()
    for given in ([tmp_path], [empty]):
        with pytest.raises(ExportError, match=r"empty file \(0 bytes\)") as err:
            sources.load_digests(given)
        assert str(err.value).startswith(f"{empty}: ")
    with pytest.raises(ExportError, match=r"empty file \(0 bytes\)"):
        sources.read_one(empty)
    with pytest.raises(InputError, match="no such file or folder"):
        sources.read_one(tmp_path / "gone.json")


def test_traces_of_two_runs_on_one_host_are_refused(tmp_path: Path) -> None:
    # Plain Kineto traces carry no job id: ranks 0-1 of one run and 2-3 of a run 44 s later
    # were analysed as one job, ranks 2 and 3 "late" by 44 s.
    from rankscope.analysis import simulate

    base = simulate.JobSpec(nodes=1, gpus_per_node=4, tp=4, steps=3, seed=2, max_offset_ns=0)
    first = simulate.simulate(base, tmp_path / "a", fmt="kineto")
    later = simulate.simulate(simulate.JobSpec(**{**base.__dict__, "start_utc_ns": base.start_utc_ns + 44 * 10**9}),
                              tmp_path / "b", fmt="kineto")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in (*first[:2], *later[2:]):
        shutil.copy(path, mixed / path.name)
    with pytest.raises(ConsistencyError, match=r"rank00002.json: its capture window starts 4\d s after that of .*rank00001.json on the same host"):
        sources.load_digests([mixed])
    assert sources.load_digests([tmp_path / "a"]).num_rows == 4


def test_folder_walk_passes_hidden_files_and_folders_by(tmp_path: Path) -> None:
    # found by review: a writer killed mid-write leaves `.NAME.PID.TID.tmp.sqlite` (its suffix
    # kept), and a notebook its checkpoint copies: each claimed a rank twice
    from rankscope.analysis import simulate as sim

    job = tmp_path / "job"
    exports = sim.simulate(sim.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), job)
    shutil.copy(exports[0], job / f".{exports[0].stem}.4242.4243.tmp.sqlite")
    (job / ".ipynb_checkpoints").mkdir()
    shutil.copy(exports[1], job / ".ipynb_checkpoints" / exports[1].name)
    assert sources.discover([job]) == sorted(exports)
    assert sources.load_digests([job]).column("rank").to_pylist() == [0, 1]


def test_a_walk_warns_of_an_input_name_on_what_is_not_a_file(tmp_path: Path) -> None:
    # Found by fuzzing: a broken link or a pipe named rank5.sqlite was passed by unsaid, its
    # rank then reported missing with no word of why.
    sim.simulate(sim.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, seed=1), tmp_path)
    (tmp_path / "rank5.sqlite").symlink_to(tmp_path / "gone.sqlite")
    os.mkfifo(tmp_path / "rank6.sqlite")
    (tmp_path / "notes.txt").symlink_to(tmp_path / "gone.txt")  # not an input name: nothing to say
    with pytest.warns(RankscopeWarning) as caught:
        table = sources.load_digests([tmp_path])
    assert table.num_rows == 2
    assert sorted(str(w.message) for w in caught) == [
        f"{tmp_path / name}: not a file (a broken or looping link, a pipe?); passed by"
        for name in ("rank5.sqlite", "rank6.sqlite")]


def test_a_digest_of_no_rows_is_refused_by_name(tmp_path: Path) -> None:
    # Found by fuzzing: it read as no ranks at all, and analyze said "no ranks to analyse",
    # naming no file.
    export = sim.simulate(sim.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2, seed=1), tmp_path / "job")[0]
    digest.write(nsys.read_nsys(export).slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(ExportError, match=r"digest holds no ranks \(0 rows\)") as err:
        sources.load_digests([tmp_path / "empty.parquet"])
    assert str(err.value).startswith(f"{tmp_path / 'empty.parquet'}: ")


@pytest.mark.parametrize("part, field, value, said", [
    (None, "window_start_ns", -(2**63), "window_start_ns is -9,223,372,036,854,775,808 (UTC epoch ns from 1970"),
    (None, "gpu_busy_ns", -1, "gpu_busy_ns is -1 (0 to its window's length"),
    ("collectives", "start_ns", -(2**63), "collective start_ns is -9,223,372,036,854,775,808 (within 7 days of its window"),
    ("collectives", "compute_overlap_ns", -5, "collective compute_overlap_ns is -5 (0 to its collective's length"),
    ("kernels", "count", -1, "kernel count is -1 (0 or more"),
    # Found by fuzzing: top kernels of 4,611,686,018 s, and a TP overhead taken down by an
    # overlap longer than its collective, unsaid.
    ("kernels", "total_ns", 2**62, "kernel total_ns is 4,611,686,018,427,387,904 (0 to its count times its window's length"),
    ("collectives", "compute_overlap_ns", 10**15, "collective compute_overlap_ns is 1,000,000,000,000,000 (0 to its "
     "collective's length"),
    ("collectives", "idle_before_ns", 10**15, "collective idle_before_ns is 1,000,000,000,000,000 (0 to its window's length"),
    ("steps", "end_ns", 2**62, "step end_ns is 4,611,686,018,427,387,904 (within 7 days of its window"),
    # Found by fuzzing: the analysis takes steps as float64; 2**63 - 1 cast back to int64 was a
    # numpy "invalid value encountered in cast" on the warning line, and the step INT64_MIN.
    ("collectives", "step", 2**63 - 1, "collective step is 9,223,372,036,854,775,807 (0 to 999,999,999,999,999"),
    ("steps", "step", 10**15, "step step is 1,000,000,000,000,000 (0 to 999,999,999,999,999"),
])
def test_a_digest_holding_values_no_reader_writes_is_refused_by_name(tmp_path: Path, part, field, value, said) -> None:
    # Found by fuzzing: each went into the report unsaid (negative NCCL and wait times,
    # a GPU -1.8e-6 % busy, top kernels of negative counts).
    export = sim.simulate(sim.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, seed=1), tmp_path / "job")[0]
    table = nsys.read_nsys(export).cast(digest.DIGEST_SCHEMA)
    at = table.schema.get_field_index(part or field)
    if part is None:
        cells = [value]
    else:
        (cells,) = table.column(part).to_pylist()
        cells[0][field] = value
        cells = [cells]
    table = table.set_column(at, table.schema.field(at), pa.array(cells, table.schema.field(at).type))
    digest.write(table, tmp_path / "edited.parquet")
    with pytest.raises(ExportError, match=rf"a damaged digest: rank \d+'s {re.escape(said)}") as err:
        sources.load_digests([tmp_path / "edited.parquet"])
    assert str(err.value).startswith(f"{tmp_path / 'edited.parquet'}: ")


def test_a_digest_marker_of_a_megabyte_is_quoted_in_part(dsl: Path, tmp_path: Path) -> None:
    # Found by fuzzing: the whole marker was quoted, a message of a megabyte.
    edited = _digest_edited(dsl, tmp_path / "edited.parquet", marker=b"x" * 1_000_000)
    with pytest.raises(ExportError, match=r"not a rankscope digest \(schema 'x{64}'\.\.\., expected") as err:
        digest.read(edited)
    assert len(str(err.value)) < 200 + len(str(edited))
