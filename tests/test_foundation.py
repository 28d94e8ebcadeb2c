"""The package installs under one namespace and the CLI edge turns errors into one line."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys

import pytest

from rankscope.cli import main
from rankscope.errors import ExportError, RankscopeError


@pytest.mark.parametrize("name", ["rankscope.coordinator", "rankscope.agent", "rankscope.analysis", "rankscope.proto"])
def test_parts_import_under_rankscope(name: str) -> None:
    assert importlib.import_module(name).__name__ == name


def test_no_bare_top_level_packages_are_installed() -> None:
    code = "import importlib.util as u; print([n for n in ('agent','analysis','coordinator','proto') if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


def test_error_names_the_file_and_exits_with_its_code() -> None:
    error = ExportError("not an nsys export", path="/data/x.sqlite")
    assert isinstance(error, RankscopeError) and isinstance(error, ValueError)
    assert str(error) == "/data/x.sqlite: not an nsys export"
    assert error.exit_code == 2


def test_console_command_lists_subcommands(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    # the commands the README documents, named here rather than read from cli.COMMANDS,
    # which a command dropped from it would leave agreeing with itself
    listed = capsys.readouterr().out
    for command in ("digest", "analyze", "simulate", "coordinator", "capture", "sweeps", "report", "cancel",
                    "fetch", "agent", "rank", "demo"):
        assert re.search(rf"^\s+{command}\s", listed, re.M), f"rankscope --help does not list {command}"


def test_analysis_public_api_resolves() -> None:
    import rankscope.analysis as analysis

    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name
    with pytest.raises(AttributeError):
        analysis.no_such_name  # noqa: B018
