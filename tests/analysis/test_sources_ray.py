"""load_digests with the Ray engine: the same digests as the local engine (one Ray start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analysis import engine, sources

ray = pytest.importorskip("ray")

DSL = "nsys/dsl_2node_2rank_allreduce"


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_ray_engine_gives_the_local_digest_table(samples: Path, monkeypatch) -> None:
    paths = sorted((samples / DSL).glob("*.sqlite"))
    local = sources.load_digests(paths)
    monkeypatch.setattr(sources, "TASK_CHUNK", 1)  # one task per file: the chunks really split
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = sources.load_digests(paths, map_engine=engine.create("ray"))
    finally:
        ray.shutdown()
    assert remote.column("rank").to_pylist() == [0, 1]
    assert remote.equals(local)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_a_ray_address_nobody_answers_fails_at_once(address: str) -> None:
    """Ray would retry for a minute or more; the engine says so in one line first."""
    from rankscope.errors import TransportError

    address = address.format(port=_closed_port())
    with pytest.raises(TransportError, match=f"no Ray cluster answers at {address}"):
        engine.create("ray", address=address)
    assert not ray.is_initialized()


def test_a_ray_address_without_the_ray_engine_is_a_usage_error() -> None:
    from rankscope.errors import ConfigError

    with pytest.raises(ConfigError, match="--ray-address is for --engine ray"):
        engine.create("local", address="127.0.0.1:6379")
