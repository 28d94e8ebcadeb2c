"""The `rankscope` command: one entry point, subcommands registered by each part.

User mistakes surface as RankscopeError and are printed here, once, as one line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rankscope import __version__, signals
from rankscope.errors import RankscopeError

# Each module exposes register(subparsers) for the commands it is listed with; the parser
# it adds sets `func(args) -> int`.
COMMANDS = {
    "digest": "rankscope.analysis.commands",
    "analyze": "rankscope.analysis.commands",
    "simulate": "rankscope.analysis.simulate",
    "coordinator": "rankscope.coordinator.commands",
    "capture": "rankscope.coordinator.commands",
    "sweeps": "rankscope.coordinator.commands",
    "nodes": "rankscope.coordinator.commands",
    "report": "rankscope.coordinator.commands",
    "cancel": "rankscope.coordinator.commands",
    "fetch": "rankscope.coordinator.commands",
    "agent": "rankscope.agent.commands",
    "rank": "rankscope.agent.rank",
    "demo": "rankscope.demo",
}
# Commands whose process works with Arrow tables (digests, analysis): see `arrow_without_pandas`.
ARROW_COMMANDS = frozenset({"digest", "analyze", "agent", "coordinator"})


# What `rankscope --help` tells a user first (the README's opening, in one line).
DESCRIPTION = ("Find the slow rank in a multi-node GPU job: capture every rank at once, put their "
               "timelines on one clock, and report who arrives late, who the others wait for, and slow links.")


# An argument that starts like a negative number ('-1s', '-5m', '-.5', '-1e3'): no option
# of ours does (a test keeps it so), so it is an option's value or a positional.
NEGATIVE_VALUE = re.compile(r"-\.?\d")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, taking `NEGATIVE_VALUE` arguments as values: its own pattern takes
    only plain numbers ('-1', '-0.5'), so `--duration -1s` stopped at "expected one argument"
    where `--duration=-1s` reaches the option's own check. Subparsers are made of this class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_VALUE  # private, the same name and use in 3.11 to 3.14

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # 3.11's argparse drops '--' given as an option's own value (`--duration=--`) and
        # hands the option [], unchecked by its type and choices: a traceback later. Kept
        # as the value, the option's own check refuses it.
        if arg_strings == ["--"] and action.option_strings and action.nargs is None:
            value = self._get_value(action, "--")
            self._check_value(action, value)
            return value
        return super()._get_values(action, arg_strings)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of ``command``'s module where one is named: the
    rank wrapper starts on every rank of a job, and must not wait for the analysis to import."""
    parser = _Parser(prog="rankscope", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and debug detail")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    for name in names:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
    for sub in subparsers.choices.values():  # `rankscope analyze PATH -v` as well as `rankscope -v analyze PATH`
        sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="log progress and debug detail")
    return parser


_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)\s*(ms|s|m|h)?\s*")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'20s', '500ms', '2m', '1h' or plain seconds."""
    match = _DURATION.fullmatch(text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration like 20s, 500ms, 2m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_path(text: str) -> Path:
    """A file or folder option's value. An empty one (``--data-dir "$DIR"`` with DIR unset) is a
    usage error: as Path('') it was the current folder, and a coordinator kept its state there."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path (an unset variable?)")
    return Path(text)


def parse_count(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """A whole-number option's type, bounded: beyond, a usage error naming the bounds (and
    ``why``, where they need saying)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from {low} to {high}"
                                             + (f" ({why})" if why else ""))
        return value
    return parse


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` as given to --labels (agents and sweeps share the syntax)."""
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise argparse.ArgumentTypeError(f"{item!r} is not key=value")
        if key.strip() in labels:  # the last would win unseen: a sweep by a=1,a=2 would target a=2
            raise argparse.ArgumentTypeError(f"label {key.strip()!r} given twice")
        labels[key.strip()] = value.strip()
    return labels


# Control characters other than whitespace, shown escaped: a garbled file's bytes quoted in
# a library's message would otherwise reach the terminal as they are.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# A message's characters shown at most: the file and the problem come first; past this a
# library's text quoted in it runs on (pyarrow's for a Parquet file of a repeated column
# prints the file's whole schema, 1.4 KB).
LONGEST_MESSAGE = 600


def _one_line(text: object) -> str:
    """``text`` as one line: runs of whitespace (newlines too) as one space, other control
    characters escaped, cut at LONGEST_MESSAGE characters. A library's message quoted in an
    error (pyarrow's thrift errors end in a newline) or a name with a newline in it would
    otherwise split the line."""
    line = " ".join(str(text).split())
    if len(line) > LONGEST_MESSAGE:
        line = f"{line[:LONGEST_MESSAGE]}... ({len(line) - LONGEST_MESSAGE:,} more characters)"
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", line)


def _show_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> None:
    # Inferred or skipped input is worth a line, not a source-code excerpt.
    print(f"rankscope: warning: {_one_line(message)}", file=sys.stderr)


def run() -> int:
    """The `rankscope` command in a process of its own (the console script, ``python -m
    rankscope``): `main`, with pyarrow kept from pandas where the command uses Arrow."""
    command = _command(sys.argv[1:])
    # gRPC's C core logs some failures (a TLS handshake) at INFO on stderr, beside the one
    # line the command prints about them; its errors still show, and a user's setting wins.
    # Not for `rank`: it uses no gRPC, and its environment is the training process's.
    if command != "rank":
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    # No command, or none known: every command's module is imported to list them (`--help`).
    if command in ARROW_COMMANDS or command not in COMMANDS:
        arrow_without_pandas()
    return main()


def arrow_without_pandas() -> None:
    """Let pyarrow find no pandas when it first looks for it.

    pyarrow looks on its first ``pa.array`` and imports pandas wherever it is installed
    (apache/arrow#34994): ~0.4 s and ~36 MiB on every command, for nothing, as rankscope
    hands pyarrow no pandas object. Its explicit pandas calls (``to_pandas``,
    ``from_pandas``) still import pandas when made. Only for a process of rankscope's own:
    there, ``pa.array`` of a pandas Series would no longer read NaN as null.
    """
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    blocker = _NoPandas()
    sys.meta_path.insert(0, blocker)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(blocker)


class _NoPandas:
    """An import finder that refuses pandas (for `arrow_without_pandas`)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] == "pandas":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _one_line_undecodable(record: logging.LogRecord) -> bool:
    """gRPC logs a message that does not decode (bytes from a client that are no protobuf of
    the call's type) as ERROR with its whole traceback: in a coordinator's log, one line
    with the cause says it (--verbose keeps the traceback)."""
    if record.exc_info and record.exc_info[1] is not None:
        error = record.exc_info[1]
        record.msg, record.args = f"{record.getMessage()} ({type(error).__name__}: {error})", ()
        record.exc_info = record.exc_text = None
    return True


def _command(argv: Sequence[str]) -> str | None:
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if _command(argv) is None and not {"-h", "--help", "--version"} & set(argv):
        build_parser().print_help(sys.stderr)  # the commands, where argparse named only 'COMMAND' as missing
        return 2
    args = build_parser(_command(argv)).parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("grpc._common").addFilter(_one_line_undecodable)
    warnings.showwarning = _show_warning
    try:
        return int(args.func(args) or 0)
    except RankscopeError as exc:
        print(f"rankscope: error: {_one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, RuntimeError) as exc:
        if not signals.interrupted(exc):
            raise
        print("rankscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as a program SIGPIPE ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor fail again flushing at exit
        return 128 + signal.SIGPIPE
