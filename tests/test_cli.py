"""The command table: each command is registered by the module listed for it, and naming
one imports only that module (the rank wrapper starts on every rank of a job)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


def test_the_help_says_what_the_program_does() -> None:
    # found by review: `rankscope --help` opened with "The `rankscope` command: one entry point,
    # subcommands registered by each part", the module's docstring, which tells a user nothing
    text = build_parser().format_help()
    assert "registered by each part" not in text
    assert "Find the slow rank in a multi-node GPU job" in text


@pytest.mark.parametrize("argv, verbose", [
    (["-v", "analyze", "x"], True), (["analyze", "x", "-v"], True), (["analyze", "--verbose", "x"], True),
    (["analyze", "x"], False), (["rank", "--", "python", "-v"], False),
])
def test_verbose_goes_before_or_after_the_command(argv: list[str], verbose: bool) -> None:
    # found by review: `rankscope analyze PATH -v` stopped at "unrecognized arguments: -v"
    assert build_parser().parse_args(argv).verbose is verbose


def test_each_command_help_says_what_it_does_and_each_argument_what_it_is() -> None:
    # found by review: coordinator, capture, sweeps and cancel --help had no description, and
    # report's SWEEP and --format, cancel's SWEEP, no help
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in subparsers.choices.items():
        assert parser.description, f"rankscope {name} --help: no description"
        for action in parser._actions:
            assert action.help, f"rankscope {name} --help: {action.dest} has no help"


def test_each_option_with_a_default_says_it() -> None:
    # found by review: capture --format and cancel --reason named no default, and agent
    # --backend's "(sim, nsys, torch)" read as the default where it is nsys alone
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in subparsers.choices.items():
        for action in parser._actions:
            if isinstance(action.default, str) and action.default != argparse.SUPPRESS:
                assert "default" in action.help, f"rankscope {name} --help: {action.dest} names no default"
    assert "(default: nsys)" in " ".join(subparsers.choices["agent"].format_help().split())


def test_rank_help_names_the_variable_its_nsys_default_comes_from(monkeypatch) -> None:
    # found by review: `rank --nsys` said "default: nsys on PATH", where the default is
    # $RANKSCOPE_NSYS when set, the variable rank's "nsys not found" error says to set
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    (nsys_option,) = [a for a in subparsers.choices["rank"]._actions if "--nsys" in a.option_strings]
    assert "$RANKSCOPE_NSYS" in nsys_option.help


def test_the_rank_wrapper_starts_without_the_analysis() -> None:
    code = "import sys; from rankscope import cli; cli.build_parser('rank'); print(sorted(m for m in sys.modules if m in ('pandas', 'pyarrow', 'rankscope.analysis')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_analyses_without_importing_pandas_and_reports_the_same(tmp_path) -> None:
    """pyarrow would import pandas (~0.4 s, ~36 MiB) on its first array; the command's own
    process keeps it out, and its report is the one an in-process run writes."""
    from rankscope.analysis import simulate

    simulate.simulate(simulate.JobSpec(nodes=2, gpus_per_node=2, tp=2, steps=4, seed=3), tmp_path / "job")
    code = ("import sys; from rankscope import cli; sys.argv = ['rankscope', *sys.argv[1:]]; code = cli.run(); "
            "print(code, 'pandas' in sys.modules)")
    command = [sys.executable, "-c", code, "analyze", str(tmp_path / "job"), "--format", "json", "-o", str(tmp_path / "own.json")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["0", "False"], done.stderr
    assert cli.main(["analyze", str(tmp_path / "job"), "--format", "json", "-o", str(tmp_path / "shared.json")]) == 0
    assert (tmp_path / "own.json").read_text() == (tmp_path / "shared.json").read_text()


def test_pyarrow_kept_from_pandas_still_converts_to_pandas_when_asked() -> None:
    code = ("import sys; from rankscope import cli; import pyarrow as pa; cli.arrow_without_pandas(); "
            "before = 'pandas' in sys.modules; frame = pa.table({'x': [1, None]}).to_pandas(); "
            "import pandas as pd; back = pa.Table.from_pandas(pd.DataFrame({'x': [1.5]})); "
            "print(before, frame['x'].isna().tolist(), back.column('x').to_pylist())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False [False, True] [1.5]", done.stderr


def test_the_rank_wrapper_command_does_not_load_pyarrow_to_keep_it_from_pandas() -> None:
    code = ("import sys; from rankscope import cli; sys.argv = ['rankscope', 'rank', '--help']\n"
            "try:\n    cli.run()\nexcept SystemExit:\n    pass\nprint('pyarrow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "False", done.stderr
    assert cli.ARROW_COMMANDS <= set(cli.COMMANDS)


@pytest.mark.parametrize("argv", [["--help"], [], ["nosuch"]])
def test_listing_the_commands_imports_every_module_but_not_pandas(argv) -> None:
    """With no command, or none known, every command's module is imported to list them, the
    analysis with its pyarrow arrays among them: pyarrow's first array brought pandas too."""
    code = ("import sys; from rankscope import cli; sys.argv = ['rankscope', *sys.argv[1:]]\n"
            "try:\n    cli.run()\nexcept SystemExit:\n    pass\n"
            "print('rankscope.analysis.commands' in sys.modules, 'pandas' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "True False", done.stderr


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


def test_an_agent_given_a_ca_file_that_is_not_one_makes_no_folder(tmp_path) -> None:
    # found by a bad-input campaign: the spool and work folders were made before the TLS files were read
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    args = [*AGENT, "--spool", str(tmp_path / "spool"), "--dcgm-state", str(tmp_path / "dcgm"), "--dcgm", "none",
            "--tls-ca", str(tmp_path / "ca.pem")]
    done = subprocess.run([sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"rankscope: error: {tmp_path / 'ca.pem'}: not a PEM CA certificate"), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.pem"]


@pytest.mark.parametrize("dcgm, option", [("dcgmi", "--dcgmi"), ("bindings", "--dcgm-bindings")])
def test_an_agent_given_a_dcgm_that_is_not_there_stops_in_one_line(dcgm: str, option: str, tmp_path) -> None:
    """Named, it is expected there: exit 2 naming it, before dialling (it only warned, then
    ran every capture without pausing DCGM)."""
    args = [*AGENT, "--spool", str(tmp_path), "--dcgm-state", str(tmp_path / "dcgm"), "--dcgm", dcgm,
            option, str(tmp_path / "nope")]
    done = subprocess.run([sys.executable, "-m", "rankscope", *args], capture_output=True, text=True, timeout=30)
    lines = done.stderr.strip().splitlines()
    problem = "not found, or not executable" if dcgm == "dcgmi" else "not found, or not a folder"
    assert done.returncode == 2, done.stderr
    assert lines == [f"rankscope: error: {option} '{tmp_path / 'nope'}': {problem}"], done.stderr


@pytest.mark.parametrize("output", [[], ["-o", "/dev/stdout"]], ids=["printed", "written"])
def test_a_reader_that_goes_away_ends_the_command_quietly(output: list[str], tmp_path) -> None:
    """`rankscope report ... | head`: exit as SIGPIPE would end it (141), with no traceback;
    the same for a report written (-o) into the pipe, which said "cannot write the output"
    and exited 2. /dev/stdout is the subprocess's own: the pipe made here."""
    import signal

    from rankscope.analysis import simulate

    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), tmp_path)
    read, write = os.pipe()
    os.close(read)  # gone before the command writes its report
    done = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(tmp_path), *output], stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert done.returncode == 128 + signal.SIGPIPE and not done.stderr, done.stderr


def test_a_report_to_dev_stdout_goes_into_the_stream_not_over_the_file_behind_it(tmp_path) -> None:
    """`analyze -o /dev/stdout >> log`: /dev/stdout leads to log (through /proc/self/fd/1);
    the report is added to it, not written as a new file in its place."""
    from rankscope.analysis import simulate

    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), tmp_path / "job")
    log = tmp_path / "log"
    log.write_text("earlier\n")
    inode = log.stat().st_ino
    with log.open("a") as stdout:  # the subprocess's /dev/stdout is this file, under tmp_path
        done = subprocess.run([sys.executable, "-m", "rankscope", "analyze", str(tmp_path / "job"), "--format", "json",
                               "-o", "/dev/stdout"], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = log.read_text()
    assert text.startswith("earlier\n{") and json.loads(text.removeprefix("earlier\n"))["ranks"]
    assert log.stat().st_ino == inode


def test_a_report_to_dash_is_printed_and_one_to_dot_slash_dash_is_a_file(tmp_path, monkeypatch, capsys) -> None:
    """`-o -` is standard output, as most tools take it (it wrote a file named '-'); `-o ./-`
    still names that file."""
    from rankscope.analysis import simulate

    simulate.simulate(simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=2), tmp_path / "job")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["analyze", "job", "--format", "json", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["ranks"] and not (tmp_path / "-").exists()
    assert cli.main(["analyze", "job", "--format", "json", "-o", "./-"]) == 0
    assert capsys.readouterr().out == "" and json.loads((tmp_path / "-").read_text())["ranks"]


README = Path(__file__).resolve().parent.parent / "README.md"


def _readme_synopses(text: str) -> list[tuple[str, str]]:
    """(command, rest of the line) for each `rankscope COMMAND ...` the README shows a user."""
    lines = re.findall(r"`([^`\n]*rankscope [a-z]+[^`\n]*)`", text)
    lines += [line.split("#")[0] for line in text.splitlines() if line.lstrip().startswith(".venv/bin/rankscope ")]
    return [(m.group(1), m.group(2)) for line in lines for m in re.finditer(r"rankscope ([a-z]+)([^`]*)", line)]


def test_the_readme_shows_each_command_with_the_options_it_has_and_a_required_choice_as_required(monkeypatch) -> None:
    # found by review: `capture [--nodes a,b | --labels k=v]` showed the choice of nodes as
    # optional, and left --all out; without one of the three, capture stops at its usage.
    monkeypatch.delenv("RANKSCOPE_COORDINATOR", raising=False)
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    synopses = [(c, rest) for c, rest in _readme_synopses(README.read_text()) if c in subparsers.choices]
    assert {c for c, _ in synopses} >= {"agent", "analyze", "capture", "digest", "simulate"}
    for command, rest in synopses:
        parser = subparsers.choices[command]
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest):
            assert flag in parser._option_string_actions, f"README: `rankscope {command}` has no {flag}"
        for group in parser._mutually_exclusive_groups:
            flags = [a.option_strings[0] for a in group._group_actions]
            if not group.required or not any(re.search(rf"{f}\b", rest) for f in flags):
                continue
            choice = re.search(r"\(([^()]*)\)", rest)
            assert choice and all(f in choice.group(1) for f in flags), \
                f"README: `rankscope {command}` must show one of {', '.join(flags)} as required: ({' | '.join(flags)})"


@pytest.mark.parametrize("command", [["capture", "--coordinator", "127.0.0.1:1"], ["agent", "--coordinator", "127.0.0.1:1"]])
def test_a_label_given_twice_is_a_usage_error(command: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:  # parsed only: an agent would run
        build_parser(command[0]).parse_args([*command, "--labels", "rack=r1,gpu=h100,rack=r2"])
    assert exc.value.code == 2 and "error: argument --labels: label 'rack' given twice" in capsys.readouterr().err


@pytest.mark.parametrize("command, option, value, problem", [
    (["capture", "--coordinator", "127.0.0.1:1", "--all"], "--duration", "-1s", "is not a positive duration"),
    (["capture", "--coordinator", "127.0.0.1:1", "--all"], "--timeout", "-5m", "is not a positive duration"),
    (["coordinator"], "--node-timeout", "-.5s", "is not a positive duration"),
    (["simulate", "out"], "--jitter-us", "-1e400", "is not a finite number"),
])
def test_a_value_like_a_negative_number_reaches_the_options_own_check(command: list[str], option: str, value: str,
                                                                      problem: str, capsys) -> None:
    # found by review: `capture --duration -1s` stopped at "expected one argument", where
    # `--duration=-1s` said what is wrong with it
    with pytest.raises(SystemExit) as exc:
        build_parser(command[0]).parse_args([*command, option, value])
    assert exc.value.code == 2 and f"error: argument {option}: {value!r} {problem}" in capsys.readouterr().err


@pytest.mark.parametrize("command, option, problem", [
    (["capture", "--coordinator", "127.0.0.1:1", "--all"], "--duration", "'--' is not a positive duration"),
    (["sweeps", "--coordinator", "127.0.0.1:1"], "--limit", "'--' is not a whole number"),
    (["nodes", "--coordinator", "127.0.0.1:1"], "--format", "invalid choice: '--'"),
])
def test_dash_dash_as_an_options_own_value_reaches_its_check(command: list[str], option: str, problem: str,
                                                             capsys) -> None:
    # found by a bad-input campaign: `--duration=--` came through as [] (a TypeError traceback)
    with pytest.raises(SystemExit) as exc:
        build_parser(command[0]).parse_args([*command, f"{option}=--"])
    assert exc.value.code == 2 and f"error: argument {option}: {problem}" in capsys.readouterr().err


def test_dash_dash_as_the_coordinator_is_no_address(capsys) -> None:
    assert cli.main(["sweeps", "--coordinator=--"]) == 2
    assert capsys.readouterr().err == "rankscope: error: coordinator address '--' must be HOST:PORT, the port at most 65535\n"


@pytest.mark.parametrize("command, option", [
    (["coordinator"], "--data-dir"), (["coordinator"], "--port-file"), (["coordinator"], "--tls-cert"),
    (["fetch", "--coordinator", "127.0.0.1:1", "S"], "--output"), (["report", "--coordinator", "127.0.0.1:1", "S"], "--plot"),
    (["sweeps", "--coordinator", "127.0.0.1:1"], "--tls-ca"), (["agent", "--coordinator", "127.0.0.1:1"], "--spool"),
    (["agent", "--coordinator", "127.0.0.1:1"], "--dcgm-state"), (["rank", "--", "true"], "--spool"),
    (["analyze", "x"], "--output"), (["analyze", "x"], "--plot"), (["digest", "x"], "--output"), (["demo"], "--workdir"),
])
def test_an_empty_path_is_a_usage_error_not_the_current_folder(command: list[str], option: str, capsys) -> None:
    # found by a bad-input campaign: `coordinator --data-dir ''` kept its state in the current folder
    with pytest.raises(SystemExit) as exc:
        build_parser(command[0]).parse_args([command[0], f"{option}=", *command[1:]])
    assert exc.value.code == 2 and f"{option}: an empty path (an unset variable?)" in capsys.readouterr().err


@pytest.mark.parametrize("args, argument", [
    (["analyze", ""], "PATH"), (["analyze", "x", ""], "PATH"), (["digest", "", "-o", "d.parquet"], "export"),
    (["simulate", ""], "OUTDIR"),
])
def test_an_empty_path_argument_is_a_usage_error_not_the_current_folder(args: list[str], argument: str, capsys) -> None:
    # `simulate "$OUT"` with OUT unset wrote 64 exports into the current folder; `analyze ""` read it
    with pytest.raises(SystemExit) as exc:
        build_parser(args[0]).parse_args(args)
    assert exc.value.code == 2 and f"argument {argument}: an empty path (an unset variable?)" in capsys.readouterr().err


def test_an_option_after_an_option_that_wants_a_value_is_still_an_option(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser("capture").parse_args(["capture", "--coordinator", "127.0.0.1:1", "--all", "--duration", "-v"])
    assert "argument --duration: expected one argument" in capsys.readouterr().err
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in subparsers.choices.items():  # else it would be read as a value
        flags = [flag for flag in parser._option_string_actions if cli.NEGATIVE_VALUE.match(flag)]
        assert not flags, f"rankscope {name}: {flags} look like negative values"


@pytest.mark.parametrize("argv", [[], ["-v"]], ids=["bare", "only -v"])
def test_no_command_lists_the_commands(argv: list[str], capsys) -> None:
    """It said only 'the following arguments are required: COMMAND', naming none of them."""
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert not out
    assert all(f"    {name} " in err for name in ("analyze", "capture", "agent", "demo"))


def test_an_error_quoting_a_library_s_long_text_is_cut_to_a_line_a_terminal_shows(tmp_path, capsys) -> None:
    """Found by fuzzing: pyarrow's message for a Parquet file of a repeated column quotes the
    file's whole schema (1.4 KB for a digest). The file and the problem come first; the rest
    is cut, and said to be."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d0.parquet"
    columns = {f"column_{i}_of_a_long_schema": pa.array([i]) for i in range(100)}
    pq.write_table(pa.Table.from_arrays([pa.array([0]), *columns.values()], names=["rank", *columns]).append_column(
        "rank", pa.array([1])), path)
    assert cli.main(["analyze", str(path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"rankscope: error: {path}: not a readable Parquet digest (")
    cut = re.fullmatch(r"(.*)\.\.\. \(([\d,]+) more characters\)", line)
    assert cut and len(cut[1]) == len("rankscope: error: ") + cli.LONGEST_MESSAGE and int(cut[2].replace(",", "")) > 2000
