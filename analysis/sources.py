"""Input discovery: files and folders of exports and digests -> one digest table.

A folder is read as nsys and the profilers leave it: `.nsys-rep` reports beside their
`.sqlite` exports are skipped (the export is what we read); a lone `.nsys-rep` is
exported with nsys where it is installed. Every file becomes digest rows through the
reader for its format; the result is checked for one rank twice or mixed jobs.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from rankscope.analysis import digest, engine, nsys
from rankscope.errors import ExportError, InputError, ToolError

NSYS_REPORT = ".nsys-rep"
SQLITE = ".sqlite"
KINETO_SUFFIXES = (".json", ".json.gz")
DIGEST_SUFFIX = ".parquet"
_KNOWN = (NSYS_REPORT, SQLITE, DIGEST_SUFFIX, *KINETO_SUFFIXES)


def load_digests(
    paths: Sequence[Path | str],
    *,
    rank_from: str | None = None,
    progress: bool = False,
    map_engine: engine.Engine | None = None,
) -> pa.Table:
    """Digest rows for every rank found in ``paths`` (files or folders), checked for
    consistency. ``map_engine`` runs the per-file reads (local by default, or Ray)."""
    files = discover(paths)
    if not files:
        raise InputError("no exports or digests found in " + ", ".join(str(p) for p in paths))
    runner = map_engine or engine.LocalEngine()
    results = runner.map(_Reader(rank_from), files)
    if progress:
        results = engine.with_progress(results, len(files), "reading exports")
    digests = digest.concat(list(results))
    digest.check_consistent(digests)
    return digests


def discover(paths: Sequence[Path | str]) -> list[Path]:
    """The input files named by ``paths``, folders walked (sorted), reports that have an
    export beside them dropped."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p) in _KNOWN)
            # nsys `--type parquetdir` tables may sit in the same tree: only digests count.
            files.extend(p for p in found if _suffix(p) != DIGEST_SUFFIX or digest.is_digest(p))
        elif path.is_file():
            files.append(path)
        else:
            raise InputError("no such file or folder", path=path)
    exports = {_stem(p) for p in files if _suffix(p) == SQLITE}
    kept = [p for p in files if not (_suffix(p) == NSYS_REPORT and _stem(p) in exports)]
    return list(dict.fromkeys(kept))


class _Reader:
    """Picklable per-file reader (Ray ships it to tasks)."""

    def __init__(self, rank_from: str | None) -> None:
        self.rank_from = rank_from

    def __call__(self, path: Path) -> pa.Table:
        return read_one(path, rank_from=self.rank_from)


def read_one(path: Path, *, rank_from: str | None = None) -> pa.Table:
    """Digest rows of one file, by its format."""
    suffix = _suffix(path)
    if suffix == SQLITE:
        return nsys.read_nsys(path, rank_from=rank_from)
    if suffix == NSYS_REPORT:
        return _read_report(path, rank_from)
    if suffix in KINETO_SUFFIXES:
        from rankscope.analysis import kineto  # F's reader; imported only when needed

        return kineto.read_kineto(path, rank_from=rank_from)
    if suffix == DIGEST_SUFFIX or digest.is_digest(path):
        return digest.read(path)
    raise ExportError(
        "unknown input type (expected an nsys .sqlite export or .nsys-rep report, Kineto .json/.json.gz, or a digest .parquet)",
        path=path,
    )


def _read_report(path: Path, rank_from: str | None) -> pa.Table:
    """Read the report's SQLite export: the one beside it, else one nsys makes now in a
    temporary folder."""
    beside = path.with_suffix(SQLITE)
    if beside.is_file():
        return nsys.read_nsys(beside, rank_from=rank_from)
    nsys_bin = shutil.which("nsys")
    command = f"nsys export --type sqlite --output {path.with_suffix(SQLITE)} {path}"
    if nsys_bin is None:
        raise ExportError(f"an nsys report without its SQLite export and no nsys here; run: {command}", path=path)
    with tempfile.TemporaryDirectory(prefix="rankscope-export-") as tmp:
        output = Path(tmp) / (path.stem + SQLITE)
        result = subprocess.run(
            [nsys_bin, "export", "--type", "sqlite", "--output", str(output), str(path)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0 or not output.is_file():
            detail = (result.stderr or result.stdout).strip().splitlines()
            raise ToolError(f"nsys export failed ({detail[-1] if detail else f'exit {result.returncode}'}); try: {command}", path=path)
        table = nsys.read_nsys(output, rank_from=rank_from)
    # The temporary export is gone: name the report the user gave.
    return table.set_column(table.schema.get_field_index("source_file"), "source_file", pa.array([str(path)] * table.num_rows))


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return ".json.gz" if name.endswith(".json.gz") else path.suffix.lower()


def _stem(path: Path) -> Path:
    return path.with_name(path.name[: -len(_suffix(path))])
