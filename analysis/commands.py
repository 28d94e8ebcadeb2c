"""`rankscope digest` and `rankscope analyze`: the offline analysis commands."""

from __future__ import annotations

import argparse
import contextlib
import logging
import stat
import sys
import time
import warnings
from pathlib import Path

from rankscope import output
from rankscope.analysis import digest, engine, sources
from rankscope.cli import parse_path
from rankscope.errors import InputError, RankscopeWarning, shown

RANK_FROM_HELP = (
    "where each export's rank comes from, overriding the captured environment: "
    "env:VAR (a variable of the profiled process's environment) or filename:REGEX "
    "(first group, else the whole match, of REGEX searched in the file name)"
)
# Progress lines are worth drawing only when there are many files to read.
_PROGRESS_FROM = 8
log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    digest_parser = subparsers.add_parser(
        "digest", help="build the per-rank digest (Parquet) of one export",
        description="Read one nsys SQLite export (or Kineto trace) and write its per-rank digest rows as Parquet.",
    )
    digest_parser.add_argument("export", type=parse_path, help="nsys .sqlite export, .nsys-rep report or Kineto .json[.gz]")
    digest_parser.add_argument("-o", "--output", type=parse_path, required=True, help="digest Parquet file to write (FILE.parquet)")
    digest_parser.add_argument("--rank-from", metavar="SPEC", help=RANK_FROM_HELP)
    digest_parser.set_defaults(func=run_digest)

    analyze_parser = subparsers.add_parser(
        "analyze", help="align ranks and report stragglers from exports or digests",
        description="Analyse exports and digests of one job (files or folders): align rank clocks on "
        "collectives, measure lateness, NCCL time, GPU busy, and name the stragglers.",
    )
    analyze_parser.add_argument("paths", nargs="+", type=parse_path, metavar="PATH", help="exports, digests, or folders of them")
    analyze_parser.add_argument("--format", choices=("table", "json"),
                                help="report format (default: json where -o names a .json file, else table)")
    analyze_parser.add_argument("-o", "--output", type=_report_path,
                                help="write the report here instead of stdout ('-': stdout; ./- names a file '-')")
    analyze_parser.add_argument("--rank-from", metavar="SPEC", help=RANK_FROM_HELP)
    analyze_parser.add_argument("--engine", choices=("local", "ray"), default="local", help="where per-file reads run (default: local)")
    analyze_parser.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to join with --engine ray (default: start a local one)")
    analyze_parser.add_argument("--plot", type=parse_path, metavar="FILE", help="also draw the per-rank picture (PNG/SVG/PDF; needs matplotlib)")
    analyze_parser.set_defaults(func=run_analyze)


def _report_path(value: str) -> Path | None:
    """-o's value: '-' is standard output, as tools that take a file take it."""
    return None if value == "-" else parse_path(value)


def run_digest(args: argparse.Namespace) -> int:
    if stat.S_ISDIR(sources.stat_input(args.export).st_mode):
        raise InputError("a folder: `rankscope digest` builds one export's digest (`rankscope analyze` reads folders)",
                         path=args.export)
    output.check_writable(args.output)
    output.check_not_input(args.output, [args.export])
    if args.output.suffix.lower() != sources.DIGEST_SUFFIX:  # else unread: `analyze` goes by the suffix
        raise InputError(f"a digest's name ends in {sources.DIGEST_SUFFIX}, which `rankscope analyze` reads it by",
                         path=args.output)
    table = sources.read_one(args.export, rank_from=args.rank_from)
    digest.check_consistent(table)
    digest.write(table, args.output)
    # `analyze` lists them in its report; here nothing else would show them.
    for note in dict.fromkeys(note for notes in table.column("warnings").to_pylist() for note in notes):
        warnings.warn(f"{shown(args.export)}: {note}", RankscopeWarning, stacklevel=1)
    return 0


def _format(args: argparse.Namespace) -> str:
    """--format, else as -o's suffix says: a table written into report.json reads as a broken JSON file."""
    if args.format is not None:
        return args.format
    return "json" if args.output is not None and args.output.suffix.lower() == ".json" else "table"


def run_analyze(args: argparse.Namespace) -> int:
    from rankscope.analysis import pipeline  # heavy: only when analysing

    if args.output is not None:
        output.check_writable(args.output)
    if args.plot is not None:
        from rankscope.analysis import plot

        plot.check(args.plot)
    files = sources.discover(args.paths)
    for destination in filter(None, (args.output, args.plot)):
        output.check_not_input(destination, files)
    map_engine = engine.create(args.engine, address=args.ray_address)
    started = time.perf_counter()
    digests = sources.load_digests(
        files, rank_from=args.rank_from, progress=len(files) >= _PROGRESS_FROM, map_engine=map_engine
    )
    read = time.perf_counter()
    log.info("read %d file(s) in %.2f s: %d rank(s)", len(files), read - started, digests.num_rows)
    report = pipeline.analyze(digests)
    log.info("analysed in %.2f s: clocks %s; %d collective call(s), %d instance(s) matched across ranks (%s)",
             time.perf_counter() - read, report.alignment.method, report.alignment.collectives,
             report.alignment.matched_collectives, report.alignment.matching)
    text = report.to_json() if _format(args) == "json" else report.render_table()
    if not text.endswith("\n"):
        text += "\n"
    with contextlib.ExitStack() as outputs:
        # The report is written first and kept once the plot is too: a plot that could not
        # be written (a full disk) left the report behind, its run failed.
        if args.output is not None:
            outputs.enter_context(output.replacing(args.output)).write_text(text, encoding="utf-8")
        if args.plot is not None:
            plot.save(report, args.plot)
        if args.output is None:
            sys.stdout.write(text)
    return 0
