"""`rankscope digest` and `rankscope analyze` end to end, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rankscope.analysis import digest

DSL = "nsys/dsl_2node_2rank_allreduce"
TORCHRUN = "nsys/nsysai_2gpu_sendrecv/mfu_2gpu_before.sqlite"


def rankscope(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rankscope", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.fixture(scope="module")
def exports(samples: Path) -> list[Path]:
    return sorted((samples / DSL).glob("*.sqlite"))


def test_digest_writes_a_readable_parquet_digest(exports: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "rank1.parquet"
    result = rankscope("digest", exports[1], "-o", out)
    assert result.returncode == 0, result.stderr
    table = digest.read(out)
    assert table.column("rank").to_pylist() == [1]
    assert table.column("host").to_pylist() == ["ault44.cscs.ch"]
    assert [c["op"] for c in table.column("collectives")[0].as_py()] == ["allreduce"]
    assert not list(tmp_path.glob(".*tmp"))
    # What it noted is said, each once, as `analyze` lists it in its report.
    notes = table.column("warnings")[0].as_py()
    assert notes and result.stderr == "".join(f"rankscope: warning: {exports[1]}: {note}\n" for note in notes)


def test_analyze_two_node_allreduce_names_the_late_rank(samples: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    result = rankscope("analyze", samples / DSL, "--format", "json", "-o", out)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["schema"] == "rankscope.report/1"
    ranks = {row["rank"]: row for row in report["ranks"]}
    assert {r: row["host"] for r, row in ranks.items()} == {0: "ault43.cscs.ch", 1: "ault44.cscs.ch"}
    assert report["alignment"]["matched_collectives"] == 1
    # The kernels end together but rank 1's started ~1.8 ms later: it arrived late.
    assert ranks[0]["late_max_ns"] == 0
    assert 1_500_000 < ranks[1]["late_max_ns"] < 2_100_000


def test_analyze_torchrun_report_with_digest_input_and_table_output(samples: Path, tmp_path: Path) -> None:
    digest_file = tmp_path / "torchrun.parquet"
    assert rankscope("digest", samples / TORCHRUN, "-o", digest_file).returncode == 0
    result = rankscope("analyze", digest_file)
    assert result.returncode == 0, result.stderr
    assert "modal" in result.stdout and "sendrecv" in result.stdout
    as_json = json.loads(rankscope("analyze", digest_file, "--format", "json").stdout)
    assert sorted(row["rank"] for row in as_json["ranks"]) == [0, 1]
    assert all(row["collectives"] == 33 for row in as_json["ranks"])


def _bad_inputs(exports: list[Path], tmp: Path) -> dict[str, tuple[list[Path], Path]]:
    """name -> (inputs, the file the error must name)."""
    truncated = tmp / "truncated.sqlite"
    truncated.write_bytes(exports[0].read_bytes()[:600_000])
    text = tmp / "notes.sqlite"
    text.write_text("this is a text file\n")
    no_kernels = tmp / "no_kernels.sqlite"
    shutil.copy(exports[0], no_kernels)
    with sqlite3.connect(no_kernels) as db:
        db.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    plain = tmp / "plain.sqlite"
    with sqlite3.connect(plain) as db:
        db.execute("CREATE TABLE t (x)")
    twin = tmp / "twin.sqlite"
    shutil.copy(exports[0], twin)
    other_job = tmp / "other_job.sqlite"
    shutil.copy(exports[1], other_job)
    with sqlite3.connect(other_job) as db:
        db.execute("UPDATE META_DATA_CAPTURE SET value = 'SLURM_JOB_ID=\"999\"' WHERE value LIKE 'SLURM_JOB_ID=%'")
    other_world = tmp / "other_world.sqlite"  # the same job id: only the world size tells
    shutil.copy(exports[1], other_world)
    with sqlite3.connect(other_world) as db:
        db.execute("UPDATE META_DATA_CAPTURE SET value = replace(value, '\"2\"', '\"4\"') "
                   "WHERE value LIKE 'PMI_SIZE=%' OR value LIKE 'SLURM_NTASKS=%'")
    return {
        "truncated": ([truncated, exports[1]], truncated),
        "not sqlite": ([exports[0], text], text),
        "no kernels": ([no_kernels], no_kernels),
        "not nsys": ([plain], plain),
        "rank twice": ([exports[0], twin], twin),
        "other job": ([exports[0], other_job], other_job),
        "other world": ([exports[0], other_world], other_world),
    }


CASES = ["truncated", "not sqlite", "no kernels", "not nsys", "rank twice", "other job", "other world"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_one_line_exit_2_no_output(case: str, exports: list[Path], tmp_path: Path) -> None:
    inputs, culprit = _bad_inputs(exports, tmp_path)[case]
    out = tmp_path / "report.json"
    result = rankscope("analyze", *inputs, "--format", "json", "-o", out)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("rankscope: error:"), result.stderr
    assert str(culprit) in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not out.exists() and not list(tmp_path.glob(".report.json*"))
    if len(inputs) == 1:
        digest_out = tmp_path / "digest.parquet"
        result = rankscope("digest", inputs[0], "-o", digest_out)
        assert result.returncode == 2 and str(culprit) in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not digest_out.exists()


def test_a_name_with_a_newline_is_shown_escaped_in_its_one_line(exports: list[Path], tmp_path: Path) -> None:
    # `analyze $'bad\nname.json'` said "bad name.json: not a Kineto JSON trace": one line,
    # as the CLI makes every error, but naming another file (one that may be there)
    bad = tmp_path / "bad\nname.json"
    bad.write_text("not json")
    (tmp_path / "bad name.json").write_text("{}")
    result = rankscope("analyze", bad)
    assert result.returncode == 2 and result.stderr.startswith(f"rankscope: error: '{tmp_path}/bad\\nname.json': not a Kineto")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    out = tmp_path / "no\tsuch" / "r.\rtxt"
    result = rankscope("analyze", exports[0], "-o", out)
    assert (result.returncode, result.stderr) == (
        2, f"rankscope: error: '{tmp_path}/no\\tsuch/r.\\rtxt': folder '{tmp_path}/no\\tsuch' does not exist\n")
    result = rankscope("analyze", exports[0], bad.with_name("rank\n0.sqlite"))
    assert (result.returncode, result.stderr) == (2, f"rankscope: error: '{tmp_path}/rank\\n0.sqlite': no such file or folder\n")
    # the other file an inconsistency names too (the one given first, which the other claims again)
    twin = tmp_path / "twin\n.sqlite"
    shutil.copy(exports[0], twin)
    result = rankscope("analyze", twin, exports[0])
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "rank 0 is also claimed by" in result.stderr and f"'{twin.parent}/twin\\n.sqlite'" in result.stderr
    # and a warning's
    folder = tmp_path / "job"
    folder.mkdir()
    shutil.copy(exports[0], folder / "rank0.sqlite")
    (folder / "fr\n0.json").write_text("{}")
    result = rankscope("analyze", folder)
    assert result.returncode == 0 and f"rankscope: warning: '{folder}/fr\\n0.json': JSON without traceEvents" in result.stderr


@pytest.mark.parametrize("command", ["analyze", "digest"])
def test_a_digest_with_a_garbled_footer_is_one_line_exit_2(command: str, exports: list[Path], tmp_path: Path) -> None:
    # pyarrow's thrift error ends in a newline (and may quote a control byte): the error
    # took two lines, the second a lone ')'.
    good = tmp_path / "good.parquet"
    assert rankscope("digest", exports[0], "-o", good).returncode == 0
    data = good.read_bytes()
    garbled = tmp_path / "garbled.parquet"
    garbled.write_bytes(data[:-100] + b"\xee" * 92 + data[-8:])  # footer's thrift, length and magic kept
    out = tmp_path / ("report.json" if command == "analyze" else "again.parquet")
    result = rankscope(command, garbled, "-o", out)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"rankscope: error: {garbled}: not a readable Parquet digest"), lines
    assert r"\x0e" in lines[0] and "\x0e" not in lines[0]  # the byte shown, escaped
    assert not out.exists()


def test_a_digest_lacking_a_field_of_its_schema_is_one_line_exit_2(exports: list[Path], tmp_path: Path) -> None:
    # Rewritten without a collective's bytes, it was analysed with them all null, unsaid.
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    assert rankscope("digest", exports[0], "-o", good).returncode == 0
    table = pq.read_table(good)
    column = table.column("collectives").combine_chunks()
    flat = pc.list_flatten(column)
    kept = [f for f in flat.type if f.name != "bytes"]
    edited = pa.ListArray.from_arrays(column.offsets, pa.StructArray.from_arrays([flat.field(f.name) for f in kept], fields=kept))
    damaged = tmp_path / "damaged.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("collectives"), "collectives", edited), damaged)
    out = tmp_path / "report.json"
    result = rankscope("analyze", damaged, "-o", out)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert lines == [f"rankscope: error: {damaged}: digest does not match rankscope.digest/1: it lacks the field "
                     "collectives.bytes"]
    assert not out.exists()


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> Path:
    from rankscope.analysis import simulate

    folder = tmp_path_factory.mktemp("sim")
    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), folder)
    return folder


def test_analyze_verbose_says_what_it_read_and_matched(simulated: Path) -> None:
    done = rankscope("analyze", simulated, "-v")
    assert done.returncode == 0, done.stderr
    assert "read 2 file(s) in " in done.stderr and "s: 2 rank(s)" in done.stderr
    assert "instance(s) matched across ranks" in done.stderr


def test_a_report_written_to_a_json_file_is_json_unless_format_says_otherwise(simulated: Path, tmp_path: Path) -> None:
    for name, extra in (("report.json", ()), ("report.txt", ()), ("table.JSON", ("--format", "table"))):
        done = rankscope("analyze", simulated, *extra, "-o", tmp_path / name)
        assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["schema"] == "rankscope.report/1"
    assert (tmp_path / "report.txt").read_text().startswith("rankscope report")
    assert (tmp_path / "table.JSON").read_text().startswith("rankscope report")


# /proc takes no new files, for root (ENOENT) and others (EACCES) alike.
@pytest.mark.parametrize("command", ["digest", "analyze -o", "analyze --plot", "simulate"])
def test_an_output_that_cannot_be_written_is_one_line_exit_2(command: str, simulated: Path) -> None:
    target = Path("/proc/rankscope-test-output")
    args = {
        "digest": ["digest", sorted(simulated.glob("*.sqlite"))[0], "-o", target],
        "analyze -o": ["analyze", simulated, "-o", target],
        "analyze --plot": ["analyze", simulated, "--plot", target.with_suffix(".png")],
        "simulate": ["simulate", target, "--nodes", "1", "--gpus-per-node", "2", "--tp", "2"],
    }[command]
    if command == "analyze --plot":
        pytest.importorskip("matplotlib", reason="plots need matplotlib (the [plot] extra)")
    result = rankscope(*args)
    lines = [line for line in result.stderr.splitlines() if line.strip() and ": warning:" not in line]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith(f"rankscope: error: {target}"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""  # refused before any work


@pytest.mark.parametrize("flag", ["-o", "--plot"])
def test_an_output_that_is_a_fifo_is_refused_at_once_not_waited_on(flag: str, simulated: Path, tmp_path: Path) -> None:
    # `analyze -o FIFO` waited for ever for a reader; `--plot FIFO.svg` too, and one .png failed after the work
    if flag == "--plot":
        pytest.importorskip("matplotlib", reason="plots need matplotlib (the [plot] extra)")
    fifo = tmp_path / "out.svg"
    os.mkfifo(fifo)
    result = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(simulated), flag, str(fifo)],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"rankscope: error: {fifo}: a FIFO (named pipe), not a regular file: writing would wait " \
                            "for a reader (to pipe the output, name /dev/stdout)\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.svg"]


@pytest.fixture
def other_user(exports: list[Path]):
    """A run as nobody, in a folder of its own beside ``locked``, which nobody may look into
    (root may: the test needs another user), holding a copy of an export."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("runs as another user (needs root and setpriv)")
    import pwd

    nobody = pwd.getpwnam("nobody")
    shared = Path(tempfile.mkdtemp(prefix="rankscope-other-"))  # tmp_path is root's alone
    shared.chmod(0o755)
    shutil.copy(exports[0], shared / "rank0.sqlite")
    (shared / "locked").mkdir(mode=0o000)

    def run(*args: str | Path) -> subprocess.CompletedProcess:
        return subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                               sys.executable, "-m", "rankscope", *map(str, args)],
                              capture_output=True, text=True, cwd=shared, timeout=120)

    yield run
    shutil.rmtree(shared)


# found by review: pathlib's is_dir() raises, not answers, under a folder one may not look into
@pytest.mark.parametrize("command", ["digest", "analyze -o", "analyze --plot", "simulate into", "simulate"])
def test_an_output_under_a_folder_one_may_not_look_into_is_one_line_exit_2(command: str, other_user) -> None:
    args, named = {
        "digest": (["digest", "rank0.sqlite", "-o", "locked/sub/d.parquet"], "locked/sub/d.parquet: cannot look into folder locked"),
        "analyze -o": (["analyze", "rank0.sqlite", "-o", "locked/r.json"], "locked/r.json: cannot look into folder locked"),
        "analyze --plot": (["analyze", "rank0.sqlite", "--plot", "locked/r.png"], "locked/r.png: cannot look into folder locked"),
        "simulate into": (["simulate", "locked/sim", "--nodes", "1"], "locked/sim: cannot look into folder locked"),
        "simulate": (["simulate", "locked", "--nodes", "1"], "locked: cannot list the folder"),
    }[command]
    if command == "analyze --plot":
        pytest.importorskip("matplotlib", reason="plots need matplotlib (the [plot] extra)")
    result = other_user(*args)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "warning" not in line.lower()]
    assert result.returncode == 2, result.stderr
    assert lines == [f"rankscope: error: {named} (Permission denied)"], result.stderr
    assert result.stdout == ""


def test_an_input_one_may_not_look_at_says_so_not_that_it_is_missing_or_empty(other_user) -> None:
    # found by review: "no such file or folder" and "no exports or digests found", where both were there
    for args, said in ((["locked/rank0.sqlite"], "locked/rank0.sqlite: cannot read (Permission denied)"),
                       (["locked"], "locked: cannot list the folder (Permission denied)")):
        result = other_user("analyze", *args)
        assert (result.returncode, result.stderr) == (2, f"rankscope: error: {said}\n")
    result = other_user("digest", "locked/rank0.sqlite", "-o", "d.parquet")  # was a PermissionError traceback
    assert (result.returncode, result.stderr) == (2, "rankscope: error: locked/rank0.sqlite: cannot read (Permission denied)\n")
    # Inside a tree, such a folder is passed by, and said to be.
    result = other_user("analyze", ".")
    assert result.returncode == 0, result.stderr
    assert "rankscope: warning: ./locked: cannot list the folder (Permission denied); passed by\n" in result.stderr


@pytest.mark.parametrize("command", ["analyze", "digest"])
def test_a_device_or_a_pipe_as_input_is_named_as_such_not_as_missing_or_empty(command: str, tmp_path: Path) -> None:
    # found by review: `analyze /dev/null` said "no such file or folder", `digest` of a pipe "empty file"
    fifo = tmp_path / "rank0.sqlite"
    os.mkfifo(fifo)
    said = {"analyze": "not a file or folder (a device, a pipe?)", "digest": "not a file (a device, a pipe?): exports are files"}
    for source in (fifo, Path("/dev/null")):
        args = ["-o", tmp_path / "d.parquet"] if command == "digest" else []
        result = rankscope(command, source, *args)
        assert (result.returncode, result.stderr) == (2, f"rankscope: error: {source}: {said[command]}\n")
    assert [p.name for p in tmp_path.iterdir()] == ["rank0.sqlite"]


def test_an_input_in_a_symlink_loop_is_named_as_one(exports: list[Path], tmp_path: Path) -> None:
    # `analyze loop` (ln -s loop loop) said "loop: cannot read (Too many levels of symbolic
    # links)"; an input is named as -o names such a link (output.symlink_loop)
    (tmp_path / "loop").symlink_to("loop")
    for source, said in (("loop", "loop: a symlink loop"), ("loop/rank0.sqlite", "loop/rank0.sqlite: loop is a symlink loop")):
        for args in (["analyze", exports[0], source], ["digest", source, "-o", "d.parquet"]):
            result = rankscope(*args, cwd=tmp_path)
            assert (result.returncode, result.stderr) == (2, f"rankscope: error: {said} (Too many levels of symbolic links)\n")
    assert [p.name for p in tmp_path.iterdir()] == ["loop"]


@pytest.mark.parametrize("name", ["d.json", "d.sqlite", "d"])
def test_a_digest_named_as_no_digest_is_refused(name: str, exports: list[Path], tmp_path: Path) -> None:
    # found by review: `digest -o d.json` wrote Parquet that `analyze` then read as a broken Kineto trace
    result = rankscope("digest", exports[0], "-o", tmp_path / name)
    assert (result.returncode, result.stderr) == (
        2, f"rankscope: error: {tmp_path / name}: a digest's name ends in .parquet, which `rankscope analyze` reads it by\n")
    assert list(tmp_path.iterdir()) == []


def test_digest_of_a_folder_points_to_analyze(simulated: Path, tmp_path: Path) -> None:
    result = rankscope("digest", simulated, "-o", tmp_path / "d.parquet")
    assert result.returncode == 2 and result.stderr.strip() == (
        f"rankscope: error: {simulated}: a folder: `rankscope digest` builds one export's digest "
        "(`rankscope analyze` reads folders)")


def test_bad_rank_from_spec_is_a_usage_error(exports: list[Path], tmp_path: Path) -> None:
    result = rankscope("digest", exports[0], "-o", tmp_path / "d.parquet", "--rank-from", "hostname")
    assert result.returncode == 2
    assert "expected env:VAR or filename:REGEX" in result.stderr and "Traceback" not in result.stderr


def test_a_folder_with_nothing_to_read_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("no traces here")
    result = rankscope("analyze", tmp_path)
    assert result.returncode == 2 and result.stderr == f"rankscope: error: no exports or digests found in {tmp_path}\n"


def test_kineto_traces_of_two_jobs_are_refused_by_their_world_sizes(samples: Path) -> None:
    """HTA's trace_diff pair: rank 3 of 8 and rank 1 of 2, two jobs; no job id to tell."""
    folder = samples / "kineto" / "hta" / "trace_diff"
    result = rankscope("analyze", folder)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"rankscope: error: {folder}/test/test.json.gz: its world of 2 ranks differs from the 8 "
                             f"of {folder}/control/control.json.gz: traces of two jobs? analyse one job at a time\n")


def test_kineto_traces_notes_go_to_the_report_and_a_failing_run_ends_in_one_line(samples: Path, tmp_path: Path) -> None:
    """As for nsys exports: each trace's notes (here: CPU-only, no sequence numbers) are
    listed once in the report, by rank, not printed per file; so a run that then fails
    prints its error alone."""
    gloo = samples / "kineto" / "gloo_cpu_torch2.13"
    result = rankscope("analyze", gloo / "rank0.json", gloo / "rank1.json")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "  - ranks 0,1: CPU-only trace: no device activity" in result.stdout
    shutil.copy(gloo / "rank0.json", tmp_path / "again.json")
    result = rankscope("analyze", gloo / "rank0.json", gloo / "rank1.json", tmp_path / "again.json")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(f"rankscope: error: {tmp_path / 'again.json'}: rank 0 is also claimed by ")


def test_an_output_that_is_one_of_the_inputs_is_refused_and_the_input_kept(simulated: Path, tmp_path: Path) -> None:
    """`-o` naming the export itself, or one in the folder analysed (through a link too),
    would replace a capture that may not be taken again."""
    folder = tmp_path / "job"
    shutil.copytree(simulated, folder)
    export = sorted(folder.glob("*.sqlite"))[0]
    (tmp_path / "link.sqlite").symlink_to(export)
    before = export.read_bytes()
    for args in (["digest", export, "-o", export], ["digest", export, "-o", tmp_path / "link.sqlite"],
                 ["analyze", folder, "-o", export], ["analyze", folder, "--format", "json", "-o", tmp_path / "link.sqlite"]):
        result = rankscope(*args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.endswith(": the output is one of the inputs: writing it would destroy that input\n")
        assert len(result.stderr.splitlines()) == 1 and result.stdout == ""
    assert export.read_bytes() == before
