"""The sim backend: each node writes only its own ranks, and the nodes add up to one job."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from rankscope.agent.backend import CaptureRequest
from rankscope.agent.sim_backend import SimBackend
from rankscope.analysis import digest
from rankscope.analysis.pipeline import analyze
from rankscope.analysis.sources import load_digests
from rankscope.errors import ConfigError
from rankscope.sim_options import job_spec, node_index

JOB = {"sim.nodes": "4", "sim.gpus_per_node": "2", "sim.tp": "2", "sim.steps": "6", "sim.seed": "11",
       "sim.stragglers": "3:compute:3000"}


def request(tmp_path: Path, node: str, **options: str) -> CaptureRequest:
    return CaptureRequest("s1", 0.0, tmp_path / node, (), {**JOB, "node": node, **options})


def test_each_node_simulates_its_own_ranks_and_together_they_are_one_job(tmp_path: Path) -> None:
    tables = []
    for index, node in enumerate(["a", "b", "c", "d"]):
        req = request(tmp_path, node, **{"sim.node_index": str(index)})
        backend = SimBackend()
        backend.start(req)
        exports = backend.stop(req)
        assert all(p.parent == req.workdir / "exports" and p.suffix == ".sqlite" for p in exports)
        table = load_digests(exports)
        assert sorted(table.column("rank").to_pylist()) == [2 * index, 2 * index + 1]
        tables.append(table)
    joined = digest.concat(tables)
    digest.check_consistent(joined)
    assert len(set(joined.column("host").to_pylist())) == 4
    with warnings.catch_warnings():  # what the analysis infers is its tests' business, not this one's
        warnings.simplefilter("ignore")
        report = analyze(joined)
    assert report.stragglers == [3]


def test_per_node_index_beats_the_shared_one() -> None:
    options = {"node": "b", "sim.node_index": "0", "sim.node_index.b": "1"}
    assert node_index(options) == 1
    assert node_index({"node": "a", "sim.node_index": "0"}) == 0


def test_spec_fields_come_from_options_and_bad_ones_are_refused(tmp_path: Path) -> None:
    spec = job_spec(JOB)
    assert (spec.nodes, spec.gpus_per_node, spec.steps, spec.seed) == (4, 2, 6, 11)
    assert [(s.rank, s.kind, s.extra_ns) for s in spec.stragglers] == [(3, "compute", 3_000_000)]
    with pytest.raises(ConfigError, match="no field 'gpus'"):
        job_spec({"sim.gpus": "2"})
    with pytest.raises(ConfigError) as refused:  # says what would have been right
        job_spec({"sim.straggler": "3"})
    assert "no field 'straggler' (it has: " in str(refused.value)
    assert all(f" {name}," in str(refused.value) for name in ("nodes", "gpus_per_node", "seed", "stragglers"))
    assert "clock_offsets_ns" not in str(refused.value)  # no capture option can set it
    with pytest.raises(ConfigError, match="sim.steps: 'many' is not a whole number"):
        job_spec({"sim.steps": "many"})
    with pytest.raises(ConfigError, match="sim.jitter_ns: 'inf' is not a whole number"):
        job_spec({"sim.jitter_ns": "inf"})
    with pytest.raises(ConfigError, match="clock drifts must be finite"):
        job_spec({"sim.max_drift_ppm": "nan"})
    with pytest.raises(ConfigError, match="sim.nodes: '2.5' is not a whole number"):  # not quietly 2
        job_spec({"sim.nodes": "2.5"})
    assert job_spec({"sim.compute_ns": "3e6", "sim.start_utc_ns": "1780000000000000001"}).start_utc_ns == 1780000000000000001
    with pytest.raises(ConfigError, match="sim.stragglers"):
        job_spec({"sim.stragglers": "x:compute"})
    assert job_spec({"sim.nodes": "4", "sim.slow_links": "3, 19"}).slow_links == (3, 19)
    assert job_spec({"sim.dp_sharded": "true", "sim.barrier": "off"}).dp_sharded is True
    with pytest.raises(ConfigError, match="sim.barrier: 'maybe' is not yes or no"):  # not quietly False
        job_spec({"sim.barrier": "maybe"})
    with pytest.raises(ConfigError, match="sim.slow_links: 'x' is not a comma-separated list of ranks"):
        job_spec({"sim.slow_links": "x"})
    with pytest.raises(ConfigError, match="no sim.node_index"):
        SimBackend().start(request(tmp_path, "c"))
    with pytest.raises(ConfigError, match="outside"):
        SimBackend().stop(request(tmp_path, "c", **{"sim.node_index": "4"}))


def test_a_node_index_outside_the_job_fails_at_start_not_after_the_window(tmp_path: Path) -> None:
    # found by review: the start checked only that the index was a number, so a sweep of more
    # agents than sim.nodes ran the whole window on the extra nodes before they failed.
    req = request(tmp_path, "e", **{"sim.node_index": "4"})  # JOB has 4 nodes: 0..3
    with pytest.raises(ConfigError, match=r"sim.node_index 4 is outside the simulated job's nodes 0..3"):
        SimBackend().start(req)
    assert not (req.workdir / "exports").exists()


def test_sim_needs_no_gpu_counters() -> None:
    assert SimBackend.name == "sim" and not SimBackend().needs_gpu_counters(None)


def test_the_sim_backend_reads_the_sim_family_of_options_only() -> None:
    assert SimBackend().unknown_options(["sim.nodes", "sim.node_index.n3", "gpu_metric"]) == ["gpu_metric"]
