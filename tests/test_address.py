"""HOST:PORT addresses, one parser for the coordinator's listen, the agent's and Ray's dial."""

from __future__ import annotations

import socket

import pytest

from rankscope.address import bind_problem, host_port


@pytest.mark.parametrize("text, parsed", [
    ("rankscope-coordinator:7443", ("rankscope-coordinator", 7443)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:6379", ("::1", 6379)),
    ("notaport", None), (":7443", None), ("host:", None), ("host:x", None),
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
