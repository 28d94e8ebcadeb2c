"""HOST:PORT addresses, one parser for the coordinator's listen, the agent's and Ray's dial."""

from __future__ import annotations

import socket

import pytest

from rankscope.address import bind_problem, dial_problem, host_port


@pytest.mark.parametrize("text, parsed", [
    ("rankscope-coordinator:7443", ("rankscope-coordinator", 7443)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:6379", ("::1", 6379)),
    ("notaport", None), (":7443", None), ("host:", None), ("host:x", None),
    ("host:65535", ("host", 65535)), ("host:65536", None), ("host:99999", None),  # 99999 bound 34463
    ("http://gpu-head:7443", None), (" gpu-head:7443", None),  # were dialled, as names no resolver knows
    ("::1:7443", None), ("[::1:7443", None),  # gRPC took ::1:7443 as an IPv6 address on port 443
    ("a" * 64 + ":7443", None), ("a..b:7443", None),  # the resolver raised UnicodeError, a traceback
    ("a" * 63 + ".example:7443", ("a" * 63 + ".example", 7443)),
])
def test_host_port(text: str, parsed) -> None:
    assert host_port(text) == parsed


def test_bind_problem_says_why_an_address_cannot_be_listened_on() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = f"127.0.0.1:{held.getsockname()[1]}"
        assert bind_problem(taken) == "address already in use"
    assert bind_problem("127.0.0.1:0") is None
    assert bind_problem("no-such-host.invalid:7443").startswith("cannot resolve no-such-host.invalid")


def test_a_listen_port_out_of_range_is_refused_not_taken_modulo_65536(tmp_path) -> None:
    from rankscope.coordinator import config
    from rankscope.errors import ConfigError

    with pytest.raises(ConfigError, match=r"listen address '127.0.0.1:99999' must be HOST:PORT, the port 0-65535"):
        config.resolve({"listen": "127.0.0.1:99999", "data_dir": tmp_path})


def test_a_dial_port_out_of_range_is_refused(capsys) -> None:
    import argparse

    from rankscope.agent import commands as agent_commands
    from rankscope.cli import main
    from rankscope.errors import ConfigError

    assert main(["capture", "--coordinator", "127.0.0.1:99999", "--all"]) == 2
    assert "coordinator address '127.0.0.1:99999' must be HOST:PORT" in capsys.readouterr().err
    parser = argparse.ArgumentParser()
    agent_commands.register(parser.add_subparsers())
    with pytest.raises(ConfigError, match="--coordinator '127.0.0.1:70000' must be HOST:PORT"):
        agent_commands.config_from_args(parser.parse_args(["agent", "--coordinator", "127.0.0.1:70000"]))


def test_a_host_no_resolver_takes_is_one_line_from_the_commands(tmp_path, capsys) -> None:
    from rankscope.cli import main

    long_name = "a" * 300 + ":7443"
    assert main(["sweeps", "--coordinator", long_name]) == 2
    assert capsys.readouterr().err == f"rankscope: error: coordinator address {long_name!r} must be HOST:PORT, the port at most 65535\n"
    # An IPv6 host without brackets: gRPC failed to bind it after the state was opened.
    for listen in (long_name, "::1:7443"):
        assert main(["coordinator", "--listen", listen, "--data-dir", str(tmp_path / "data")]) == 2
        assert capsys.readouterr().err.startswith(f"rankscope: error: listen address {listen!r} must be HOST:PORT")
    assert not (tmp_path / "data").exists()


def test_a_coordinator_to_dial_is_host_port_or_a_unix_target() -> None:
    assert dial_problem("gpu-head:7443") is None and dial_problem("unix:///run/rankscope.sock") is None
    for bad in ("gpu-head", "gpu-head:99999", ":7443"):
        assert dial_problem(bad) == "must be HOST:PORT, the port at most 65535"
