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
