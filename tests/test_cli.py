"""The command table: each command is registered by the module listed for it, and naming
one imports only that module (the rank wrapper starts on every rank of a job)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from rankscope import cli
from rankscope.cli import build_parser


def _commands(parser: argparse.ArgumentParser) -> list[str]:
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(subparsers.choices)


def test_every_command_is_listed_with_the_module_that_registers_it() -> None:
    for command, module in cli.COMMANDS.items():
        assert command in _commands(build_parser(command)), f"{module} does not register {command!r}"
    assert _commands(build_parser()) == sorted(cli.COMMANDS)


def test_the_rank_wrapper_starts_without_the_analysis() -> None:
    code = "import sys; from rankscope import cli; cli.build_parser('rank'); print(sorted(m for m in sys.modules if m in ('pandas', 'pyarrow', 'rankscope.analysis')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
