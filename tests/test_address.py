"""HOST:PORT addresses, one parser for the coordinator's listen, the agent's and Ray's dial."""

from __future__ import annotations

import pytest

from rankscope.address import host_port


@pytest.mark.parametrize("text, parsed", [
    ("rankscope-coordinator:7443", ("rankscope-coordinator", 7443)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:6379", ("::1", 6379)),
    ("notaport", None), (":7443", None), ("host:", None), ("host:x", None),
])
def test_host_port(text: str, parsed) -> None:
    assert host_port(text) == parsed
