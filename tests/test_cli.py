"""The command table: each command is registered by the module listed for it, and naming
one imports only that module (the rank wrapper starts on every rank of a job)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

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


AGENT = ["agent", "--coordinator", "127.0.0.1:1", "--backend", "sim"]
COORDINATOR = ["coordinator", "--listen", "127.0.0.1:0"]


@pytest.mark.parametrize("args, folder", [
    ([*COORDINATOR, "--data-dir", "/proc/rankscope-test"], "/proc/rankscope-test"),
    ([*COORDINATOR, "--data-dir", "{file}"], "{file}"),
    ([*AGENT, "--spool", "/proc/rankscope-test"], "/proc/rankscope-test"),
    ([*AGENT, "--spool", "{tmp}", "--work-dir", "{file}"], "{file}"),
], ids=["coordinator data-dir in /proc", "coordinator data-dir a file", "agent spool in /proc", "agent work-dir a file"])
def test_a_daemon_given_a_folder_it_cannot_write_in_says_so_in_one_line(args: list[str], folder: str, tmp_path) -> None:
    """Before serving or dialling: exit 2 naming the folder, no traceback."""
    (tmp_path / "file").write_text("")
    args, folder = [a.format(file=tmp_path / "file", tmp=tmp_path) for a in args], folder.format(file=tmp_path / "file")
    done = subprocess.run([sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"rankscope: error: {folder}: "), done.stderr
