"""Input discovery: files and folders of exports and digests -> one digest table.

A folder is read as nsys and the profilers leave it: `.nsys-rep` reports beside their
`.sqlite` exports are skipped (the export is what we read); a lone `.nsys-rep` is
exported with nsys where it is installed; other JSON met on a walk (Flight Recorder
dumps, configs) is skipped with a warning. Every file becomes digest rows through the
reader for its format, nsys exports in batches (one vectorised build per batch); the
result is checked for one rank twice or mixed jobs.
"""

from __future__ import annotations

import gzip
import os
import shlex
import shutil
import stat
import tempfile
import warnings
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from rankscope import cpus, output
from rankscope.analysis import digest, engine, nsys
from rankscope.errors import ExportError, InputError, RankscopeWarning, ToolError, shown
from rankscope.progress import counted

NSYS_REPORT = ".nsys-rep"
SQLITE = ".sqlite"
KINETO_SUFFIXES = (".json", ".json.gz")
DIGEST_SUFFIX = ".parquet"
_KNOWN = (NSYS_REPORT, SQLITE, DIGEST_SUFFIX, *KINETO_SUFFIXES)
# Files per read task: one nsys batch build each. Locally big batches amortise the build;
# on Ray smaller ones spread the files over the workers.
LOCAL_CHUNK = 256
TASK_CHUNK = 32
_KINETO_KEY = b'"traceEvents"'
# rankscope's own outputs found beside the traces: a report, the simulator's truth file.
_OWN_SCHEMA = b'"schema": "rankscope.'
# Read at a time while looking for the key: it is near the top, and a gzipped trace is
# decompressed only as far as it is read (1 MiB of it: ~1.5 ms per trace; 64 KiB: ~0.15).
_SNIFF_BYTES = 1 << 16
# A digest's rows name the digest given beside the export it was built from (`digest.digest_of`).


def load_digests(
    paths: Sequence[Path | str],
    *,
    rank_from: str | None = None,
    progress: bool = False,
    map_engine: engine.Engine | None = None,
) -> pa.Table:
    """Digest rows for every rank found in ``paths`` (files or folders), checked for
    consistency. ``map_engine`` runs the reads, a chunk of files per call (local by
    default, or one Ray task per chunk); each chunk's nsys exports are built as a batch."""
    files = discover(paths)
    runner = map_engine or engine.LocalEngine()
    local = isinstance(runner, engine.LocalEngine)
    size = LOCAL_CHUNK if local else TASK_CHUNK
    # A task runs in its worker's folder, not this one: it is handed absolute paths, and the
    # digests name the files as given.
    given = {} if local else {str(f.absolute()): str(f) for f in files}
    shipped = files if local else [f.absolute() for f in files]
    chunks = [shipped[i : i + size] for i in range(0, len(shipped), size)]
    # A Ray task reads on one thread (Ray spreads the tasks); locally, on every CPU allowed.
    results = runner.map(_Reader(rank_from, cpus.usable() if local else 1), chunks)
    if progress:
        results = counted(results, len(chunks), f"reading exports ({size} per batch)")
    digests = digest.concat(results)
    if given:
        digests = digest.named(digests, [given.get(name, name) for name in digests.column("source_file").to_pylist()])
    digests = _without_digests_of_exports(digests)
    digest.check_consistent(digests)
    return digests


def _without_digests_of_exports(digests: pa.Table) -> pa.Table:
    """The rows less each digest's whose export is in the input too (a digest written
    beside its export: a folder then holds both): the same capture of a rank, from
    an export of the file name the digest was built from. The export is read, with a
    warning. Other rows claiming one rank stay, for `digest.check_consistent` to refuse."""
    ranks = digests.column("rank").to_pylist()
    if len(set(ranks)) == len(ranks):
        return digests
    files = digests.column("source_file").to_pylist()
    captures = digest.captures(digests)
    exports = {(capture, Path(file).name): file for capture, file in zip(captures, files) if not digest.DIGEST_OF.fullmatch(file)}
    keep = []
    skipped: dict[str, list[tuple[int, str]]] = {}
    for capture, file in zip(captures, files):
        made = digest.DIGEST_OF.fullmatch(file)
        export = made and exports.get((capture, Path(made["export"]).name))
        keep.append(not export)
        if export:
            skipped.setdefault(made["digest"], []).append((capture.rank, export))
    if skipped:
        warnings.warn(_digests_of_exports(skipped), RankscopeWarning, stacklevel=3)
    return digests.filter(pa.array(keep))


def _digests_of_exports(skipped: dict[str, list[tuple[int, str]]]) -> str:
    """One warning for every digest left out for its exports (digest -> its (rank, export)):
    a node's digest, as `rankscope fetch` lays it beside the node's exports, holds every rank
    of the node, and a fetched sweep has one per node; a line per rank, or per node, buried
    the report."""
    from rankscope.analysis.report import ranks_text

    found = sorted(pair for pairs in skipped.values() for pair in pairs)
    ranks = ranks_text([rank for rank, _ in found])
    if len(skipped) > 1:
        names = sorted(skipped)
        return (f"{len(names)} digests of exports in the input too ({shown(names[0])} to {shown(names[-1])}: ranks {ranks}; same "
                "host, process and window each); read the exports alone")
    (name,) = skipped
    if len(found) > 1:
        return (f"{shown(name)}: a digest of {len(found)} exports in the input too (ranks {ranks}, {shown(found[0][1])} to "
                f"{shown(found[-1][1])}; same host, process and window each); read the exports alone")
    return (f"{shown(name)}: a digest of {shown(found[0][1])}, which is in the input too (same rank {ranks}, host, process and "
            "window); read the export alone")


def discover(paths: Sequence[Path | str]) -> list[Path]:
    """The input files named by ``paths``, folders walked (sorted), reports that have an
    export beside them dropped; on a walk, JSON that is not a Kineto trace is skipped
    with a warning (a file named explicitly is always read). None found is an error."""
    files: list[tuple[Path, os.stat_result]] = []
    not_traces: list[Path] = []
    for raw in paths:
        path = Path(raw)
        mode = stat_input(path).st_mode  # one call where is_dir() then is_file() made two
        if stat.S_ISDIR(mode):
            found = [(p, _not_empty(p)) for p in sorted(_files_under(path)) if _suffix(p) in _KNOWN]
            # nsys `--type parquetdir` tables may sit in the same tree: only digests count.
            found = [(p, s) for p, s in found if _suffix(p) != DIGEST_SUFFIX or digest.is_digest(p)]
            for p, s in found:
                trace = _suffix(p) not in KINETO_SUFFIXES or _is_kineto(p)
                if trace:
                    files.append((p, s))
                elif trace is False:
                    not_traces.append(p)
        elif stat.S_ISREG(mode):
            files.append((path, _not_empty(path)))
        else:
            raise InputError("not a file or folder (a device, a pipe?)", path=path)
    if not_traces:
        warnings.warn(_not_traces(not_traces), RankscopeWarning, stacklevel=2)
    suffixes = [_suffix(p) for p, _ in files]
    if NSYS_REPORT in suffixes:
        exports = {_stem(p) for (p, _), suffix in zip(files, suffixes) if suffix == SQLITE}
        files = [(p, s) for (p, s), suffix in zip(files, suffixes) if not (suffix == NSYS_REPORT and _stem(p) in exports)]
    if not files:
        raise InputError("no exports or digests found in " + ", ".join(map(shown, paths)))
    return _once(files)


def _once(files: list[tuple[Path, os.stat_result]]) -> list[Path]:
    """Each file once, under the name it was first given: one file named twice (the same
    path, a link to it, its relative and absolute paths) claimed its ranks twice, and was
    read on two threads at once by two SQLite libraries, whose first close dropped the
    other's lock on it."""
    found: dict[tuple[int, int], Path] = {}
    for path, info in files:
        found.setdefault((info.st_dev, info.st_ino), path)
    return list(found.values())


def stat_input(path: Path) -> os.stat_result:
    """``path``'s stat; an InputError where it is not there, or may not be looked at (a
    folder on the way refuses it, a link in a loop: named as outputs name it)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise InputError("no such file or folder", path=path) from None
    except OSError as exc:  # an ExportError: the agent goes on without such an export
        raise ExportError(output.symlink_loop(path, exc) or f"cannot read ({exc.strerror or exc})", path=path) from None


def _not_empty(path: Path) -> os.stat_result:
    """``path``'s stat, refused where it is empty: each reader's own message for no bytes (a
    JSON decoder's "truncated", SQLite's "not a database") hides the plain cause, and a
    walk would skip an empty trace as JSON that is not Kineto. A stream has no size to
    tell: it is refused too."""
    found = stat_input(path)
    if not stat.S_ISREG(found.st_mode):
        raise ExportError("not a file (a device, a pipe?): exports are files", path=path)
    if found.st_size == 0:
        raise ExportError("empty file (0 bytes): was its capture cut short?", path=path)
    return found


def _files_under(folder: Path) -> Iterator[Path]:
    """The files in a folder tree, as ``Path.rglob`` finds them (links to files, not into
    linked folders), by os.walk: a third of rglob's cost (~0.2 ms the first time in a
    process, which compiles its pattern). Hidden ones, and hidden folders, are passed by:
    a temporary file a killed writer left (`atomic.replacing` keeps an export's suffix), a
    broken fetch's bytes, editors' and notebooks' copies would each claim a rank twice.
    An input's name on what is not a file (a broken link, a pipe) is passed by with a warning.
    A folder that cannot be listed is an error where it is the one named, else passed by
    with a warning (a file system's lost+found, root's alone, in a tree of exports)."""

    def unlisted(exc: OSError) -> None:
        if exc.filename == os.fspath(folder):
            raise InputError(f"cannot list the folder ({exc.strerror or exc})", path=folder)
        warnings.warn(f"{shown(exc.filename)}: cannot list the folder ({exc.strerror or exc}); passed by",
                      RankscopeWarning, stacklevel=4)

    for root, folders, names in os.walk(folder, onerror=unlisted):
        folders[:] = [f for f in folders if not f.startswith(".")]
        for name in names:
            file = Path(root, name)
            if name.startswith("."):
                continue
            if file.is_file():
                yield file
            elif _suffix(file) in _KNOWN:  # named as input, yet nothing to read: its ranks go missing
                warnings.warn(f"{shown(file)}: not a file (a broken or looping link, a pipe?); passed by",
                              RankscopeWarning, stacklevel=4)


def _is_kineto(path: Path) -> bool | None:
    """True for a Kineto trace (it has a "traceEvents" key, near the top as the profiler
    writes it); other JSON found on a folder walk is skipped: False, to be said
    (`_not_traces`), None where it is rankscope's own output (a report written into the
    folder, the simulator's truth). A file that cannot be read counts as a trace, so its
    reader reports the problem."""
    opener = gzip.open if _suffix(path) == ".json.gz" else open
    seen, ours, keep = b"", False, max(len(_KINETO_KEY), len(_OWN_SCHEMA))
    try:
        with opener(path, "rb") as handle:
            while chunk := handle.read(_SNIFF_BYTES):
                seen += chunk
                if _KINETO_KEY in seen:
                    return True
                ours = ours or _OWN_SCHEMA in seen
                seen = seen[-keep:]
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):  # zlib: a stream garbled mid-way
        return True
    return None if ours else False


def _not_traces(paths: list[Path]) -> str:
    """One warning for the JSON files a walk skipped (`_is_kineto`): a job's Flight Recorder
    dumps, one a rank, lie beside its traces, and a line each made a line a rank."""
    if len(paths) == 1:
        return f"{shown(paths[0])}: JSON without traceEvents is not a Kineto trace (e.g. a Flight Recorder dump); skipped"
    return (f"{len(paths)} JSON files without traceEvents are not Kineto traces (e.g. Flight Recorder dumps): "
            f"skipped ({shown(paths[0])} to {shown(paths[-1])})")


class _Reader:
    """Picklable reader of a chunk of files (Ray ships it to tasks): digest rows in file
    order, consecutive nsys exports read as one batch."""

    def __init__(self, rank_from: str | None, workers: int) -> None:
        self.rank_from = rank_from
        self.workers = workers  # threads reading a batch's exports (`nsys.read_many`)

    def __call__(self, paths: Sequence[Path]) -> pa.Table:
        tables, exports = [], []
        for path in paths:
            export = _export_of(path)
            if export is not None:
                exports.append(export)
                continue
            if exports:
                tables.append(nsys.read_many(exports, rank_from=self.rank_from, workers=self.workers))
                exports = []
            tables.append(read_one(path, rank_from=self.rank_from))
        if exports:
            tables.append(nsys.read_many(exports, rank_from=self.rank_from, workers=self.workers))
        return digest.concat(tables)


def _export_of(path: Path) -> Path | None:
    """The SQLite export to read for ``path``: itself, or the one beside a report."""
    suffix = _suffix(path)
    if suffix == SQLITE:
        return path
    if suffix == NSYS_REPORT and path.with_suffix(SQLITE).is_file():
        return path.with_suffix(SQLITE)
    return None


def read_one(path: Path, *, rank_from: str | None = None) -> pa.Table:
    """Digest rows of one file, by its format."""
    _not_empty(path)
    suffix = _suffix(path)
    if suffix == SQLITE:
        return nsys.read_nsys(path, rank_from=rank_from)
    if suffix == NSYS_REPORT:
        return _read_report(path, rank_from)
    if suffix in KINETO_SUFFIXES:
        from rankscope.analysis import kineto  # F's reader; imported only when needed

        return kineto.read_kineto(path, rank_from=rank_from)
    if suffix == DIGEST_SUFFIX or digest.is_digest(path):
        table = digest.read(path)
        # Messages name the file given, beside the export it was made from (which may be
        # in the same input: then both claim its ranks).
        return digest.named(table, [digest.digest_of(str(path), source) for source in table.column("source_file").to_pylist()])
    raise ExportError(
        "unknown input type (expected an nsys .sqlite export or .nsys-rep report, Kineto .json/.json.gz, or a digest .parquet)",
        path=path,
    )


def _read_report(path: Path, rank_from: str | None) -> pa.Table:
    """Read the report's SQLite export: the one beside it, else one nsys makes now in a
    temporary folder, with the same command line the agent uses."""
    from rankscope.agent import nsys as nsys_cli  # the one place nsys command lines are built

    beside = _export_of(path)
    if beside is not None:
        return nsys.read_nsys(beside, rank_from=rank_from)
    suggestion = shlex.join(nsys_cli.export_command(path, path.with_suffix(SQLITE)))  # to paste: quoted
    if shutil.which(nsys_cli.NSYS) is None:
        raise ExportError(f"an nsys report without its SQLite export and no nsys here; run: {suggestion}", path=path)
    with tempfile.TemporaryDirectory(prefix="rankscope-export-") as tmp:
        output = Path(tmp) / (path.stem + SQLITE)
        try:
            nsys_cli.run(nsys_cli.export_command(path, output))
        except ToolError as exc:
            raise ToolError(f"{exc}; try: {suggestion}", path=path) from None
        table = nsys.read_nsys(output, rank_from=rank_from)
    return digest.named(table, [str(path)] * table.num_rows)  # the temporary export is gone: the report the user gave


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return ".json.gz" if name.endswith(".json.gz") else path.suffix.lower()


def _stem(path: Path) -> Path:
    return path.with_name(path.name[: -len(_suffix(path))])
