"""A sweep's report as the coordinator builds it, and what the sweep keeps of it: the
stragglers and the slow links, listed by `rankscope sweeps` for scheduled health sweeps."""

from __future__ import annotations

import json
import warnings

import pyarrow.compute as pc
import pytest

from rankscope.analysis import digest, nsys
from rankscope.analysis import simulate as sm
from rankscope.cli import main
from rankscope.coordinator import commands, reports
from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.server import sweep_message
from rankscope.errors import ConsistencyError, InputError

S = 1_000_000_000
SPEC = sw.SweepSpec(backend="nsys", duration_s=5.0, timeout_s=30.0)


@pytest.fixture(scope="module")
def slow_link_job(tmp_path_factory):
    """Per-node digests of a simulated 4-node job whose rank 19 has a slow network link."""
    job = sm.JobSpec(nodes=4, gpus_per_node=8, tp=8, steps=10, slow_links=(19,))
    exports = tmp_path_factory.mktemp("exports")
    sm.simulate(job, exports)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = nsys.read_many(sorted(exports.glob("*.sqlite")))
    out = tmp_path_factory.mktemp("digests")
    paths = []
    for node in range(job.nodes):
        host = sm.host_name(job, node)
        paths.append(out / f"{host}.parquet")
        digest.write(table.filter(pc.equal(table.column("host"), host)), paths[-1])
    return job, paths


def test_the_sweep_keeps_the_reports_slow_link_and_lists_it(slow_link_job, tmp_path, monkeypatch, capsys) -> None:
    job, paths = slow_link_job
    hosts = [sm.host_name(job, n) for n in range(job.nodes)]
    sweep, _ = sw.Sweep.start(SPEC, hosts, 0, sweep_id="s1")
    done = reports.build(sweep, [(path, host, path.name, ()) for path, host in zip(paths, hosts)], {}, tmp_path / "s1.json",
                         7 * S)
    (slow,) = [c for c in sm.truth(job)["communicators"] if c["kind"] == "dp" and 19 in c["ranks"]]
    assert [(link.comm_id, link.op, link.ranks) for link in done.slow_links] == [
        (slow["comm_id"], "allreduce", tuple(slow["ranks"]))]
    assert done.stragglers == () and done.at_ns == 7 * S
    stored = json.loads((tmp_path / "s1.json").read_text())
    assert [c["comm_id"] for c in stored["slow_communicators"]] == [slow["comm_id"]]

    sweep.state = sw.SweepState.ANALYSING
    sweep.handle(done)
    assert sweep.slow_links == list(done.slow_links)
    wire = sweep_message(sweep)
    assert [list(link.ranks) for link in wire.slow_links] == [slow["ranks"]]

    header, row = _listing(wire, monkeypatch, capsys)
    assert "SLOW LINKS" in header and f"{','.join(map(str, slow['ranks']))}:50%" in row and "none" in row


def _listing(wire, monkeypatch, capsys) -> list[str]:
    """`rankscope sweeps` lines, the coordinator answering ListSweeps with ``wire`` alone."""
    class Listing:  # the coordinator's answer, without a server
        def __init__(self, *_): ...
        def __enter__(self): return self
        def __exit__(self, *_): return False
        def sweeps(self, limit): return [wire]

    monkeypatch.setattr(commands, "SweepClient", Listing)
    assert main(["sweeps", "--coordinator", "127.0.0.1:1"]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_sweep_whose_report_could_not_judge_is_listed_so_not_as_none(tmp_path, monkeypatch, capsys) -> None:
    """A health sweep that could not tell (two ranks: too few to judge) must not read as a
    clean bill: the reason travels from the report to the stored sweep and the wire, and
    `rankscope sweeps` says "not judged"."""
    from rankscope.analysis.testing import SyntheticJob, synthetic_job

    table, _ = synthetic_job(SyntheticJob(nodes=1, gpus_per_node=2, steps=10, stragglers={1: 300_000}, seed=4))
    digest.write(table, tmp_path / "node-a.parquet")
    sweep, _ = sw.Sweep.start(SPEC, ["node-a"], 0, sweep_id="s1")
    done = reports.build(sweep, [(tmp_path / "node-a.parquet", "node-a", "node-a.parquet", ())], {}, tmp_path / "s1.json",
                         7 * S)
    assert done.stragglers == () and done.stragglers_not_judged == "needs 3+ ranks with consecutive collectives"
    sweep.state = sw.SweepState.ANALYSING
    sweep.handle(done)
    stored = sw.Sweep.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert stored.stragglers_not_judged == done.stragglers_not_judged
    wire = sweep_message(stored)
    assert wire.stragglers_not_judged == done.stragglers_not_judged
    header, row = _listing(wire, monkeypatch, capsys)
    assert header.split()[6] == "STRAGGLERS" and row.split()[6:8] == ["not", "judged"]


def _listed(sweep_id: str, stragglers=(), links=(), analysed: bool = True):
    return sweep_message(sw.Sweep(
        sweep_id=sweep_id, spec=SPEC, created_ns=0, deadline_ns=0, nodes={}, report_path="r.json" if analysed else "",
        stragglers=[sw.RankOn(rank, node) for rank, node in stragglers],
        slow_links=[sw.SlowLink("c", "allreduce", ranks, 20.0, 40.0) for ranks in links]))


def test_findings_that_come_back_across_sweeps_are_summed_up() -> None:
    sweeps = [
        _listed("s1", stragglers=[(5, "node-b")], links=[(3, 11)]),
        _listed("s2", stragglers=[(5, "node-b"), (1, "node-a")], links=[(3, 11)]),
        _listed("s3", stragglers=[(6, "node-b")]),
        _listed("s4", stragglers=[(1, "node-a")], analysed=False),  # no report: not counted
    ]
    assert commands.repeat_findings(sweeps) == "node node-b in 3 of 3 sweeps, link of ranks 3,11 in 2 of 3 sweeps"
    assert commands.repeat_findings(sweeps[2:]) == ""


@pytest.mark.parametrize("second, said", [
    ("another", "job 'another' differs from job 'synthetic' of node gpu-a (digest of synthetic/rank0)"),
    ("synthetic", "rank 0 is also claimed by node gpu-a (digest of synthetic/rank0) (the same capture: "
                  "one file given twice?)"),
], ids=["two jobs", "a rank twice"])
def test_digests_that_disagree_fail_the_analysis_naming_the_nodes_that_sent_them(tmp_path, second: str,
                                                                                  said: str) -> None:
    """It named the traces' files ('synthetic/rank0' twice, or a path on each node), not the
    sweep's nodes: which two nodes disagree could not be told."""
    from rankscope.analysis.testing import SyntheticJob, synthetic_job

    uploads = []
    for node, job_id in (("gpu-a", "synthetic"), ("gpu-b", second)):
        table, _ = synthetic_job(SyntheticJob(nodes=1, gpus_per_node=2, steps=10, job_id=job_id))
        digest.write(table, tmp_path / f"{node}.parquet")
        uploads.append((tmp_path / f"{node}.parquet", node, f"{node}.digest.parquet", ()))
    sweep, _ = sw.Sweep.start(SPEC, ["gpu-a", "gpu-b"], 0, sweep_id="s1")
    with pytest.raises(ConsistencyError) as caught:
        reports.build(sweep, uploads, {}, tmp_path / "s1.json", 7 * S)
    assert str(caught.value) == f"node gpu-b (digest of synthetic/rank0): {said}"
    assert not (tmp_path / "s1.json").exists()


def _node_digests(tmp_path, ranks_of: dict[str, list[int]], world: int = 4) -> list[tuple]:
    """(path, node, artifact name, the ranks its upload named) for each node's digest of
    ``ranks_of[node]``'s rows of one synthetic job of ``world`` ranks (a rank outside it: rank
    0's row renumbered)."""
    import pyarrow as pa

    from rankscope.analysis.testing import SyntheticJob, synthetic_job

    table, _ = synthetic_job(SyntheticJob(nodes=world // 2, gpus_per_node=2, steps=10))
    uploads = []
    for node, ranks in ranks_of.items():
        rows = table.take([rank if 0 <= rank < world else 0 for rank in ranks])
        rows = rows.set_column(rows.schema.get_field_index("rank"), rows.schema.field("rank"), pa.array(ranks, pa.int32()))
        digest.write(rows, tmp_path / f"{node}.parquet")
        uploads.append((tmp_path / f"{node}.parquet", node, f"{node}.digest.parquet", tuple(ranks)))
    return uploads


def test_a_node_whose_own_digests_claim_a_rank_twice_fails_alone(tmp_path) -> None:
    """Its two digests both hold rank 0: which is wrong cannot be told, but they are both
    that node's, so it alone fails; the other node is analysed."""
    [(path, _, _, named)] = _node_digests(tmp_path, {"gpu-a": [0, 1]})
    uploads = [(path, "gpu-a", "one.digest.parquet", named), (path, "gpu-a", "two.digest.parquet", named),
               *_node_digests(tmp_path, {"gpu-b": [2, 3]})]
    sweep, _ = sw.Sweep.start(SPEC, ["gpu-a", "gpu-b"], 0, sweep_id="s1")
    done = reports.build(sweep, uploads, {}, tmp_path / "s1.json", 7 * S)
    assert done.unusable == (("gpu-a", "its digest two.digest.parquet (digest of synthetic/rank0): rank 0 is also "
                                       "claimed by one.digest.parquet (digest of synthetic/rank0) (the same capture: "
                                       "one file given twice?)"),)
    assert sweep.missing == ["gpu-a"] and sweep.nodes["gpu-a"].reason == done.unusable[0][1]
    facts = json.loads((tmp_path / "s1.json").read_text())["sweep"]
    assert facts["state"] == "partial" and facts["nodes"]["gpu-b"]["ranks"] == [2, 3]


@pytest.mark.parametrize("named, shown", [((2,), "2"), ((4, 3, 2), "2-4")], ids=["fewer", "more"])
def test_a_node_whose_digest_holds_other_ranks_than_its_upload_named_fails_alone(tmp_path, named, shown) -> None:
    """Its ranks would be put under its name in the report: where its upload said it holds
    others, the digest is not what the node said it sent. An upload that named none (an older
    agent's) is taken as it is."""
    gpu_a, gpu_b, gpu_c = _node_digests(tmp_path, {"gpu-a": [0, 1], "gpu-b": [2, 3], "gpu-c": [4, 5]}, world=6)
    uploads = [gpu_a[:3] + ((),), gpu_b[:3] + (named,), gpu_c]
    sweep, _ = sw.Sweep.start(SPEC, ["gpu-a", "gpu-b", "gpu-c"], 0, sweep_id="s1")
    done = reports.build(sweep, uploads, {}, tmp_path / "s1.json", 7 * S)
    assert done.unusable == (("gpu-b", f"its digest gpu-b.digest.parquet holds ranks 2,3, not the ranks {shown} its "
                                       "upload named"),)
    assert sweep.missing == ["gpu-b"] and sweep.nodes["gpu-b"].state is sw.NodeState.FAILED
    facts = json.loads((tmp_path / "s1.json").read_text())["sweep"]
    assert {node: facts["nodes"][node]["ranks"] for node in ("gpu-a", "gpu-b", "gpu-c")} == {
        "gpu-a": [0, 1], "gpu-b": [], "gpu-c": [4, 5]}


def test_where_every_node_holds_a_rank_outside_the_world_the_analysis_fails_naming_each(tmp_path) -> None:
    uploads = _node_digests(tmp_path, {"gpu-a": [0, 9], "gpu-b": [-1, 3]})
    sweep, _ = sw.Sweep.start(SPEC, ["gpu-a", "gpu-b"], 0, sweep_id="s1")
    with pytest.raises(InputError) as caught:
        reports.build(sweep, uploads, {}, tmp_path / "s1.json", 7 * S)
    assert str(caught.value) == (
        "node gpu-a: its digest gpu-a.digest.parquet (digest of synthetic/rank0): rank 9 is outside its world of 4 "
        "ranks; node gpu-b: its digest gpu-b.digest.parquet (digest of synthetic/rank0): rank -1 is outside its "
        "world of 4 ranks")
    assert not (tmp_path / "s1.json").exists()


def test_where_every_node_s_digest_is_lost_the_analysis_fails_naming_each(tmp_path) -> None:
    sweep, _ = sw.Sweep.start(SPEC, ["gpu-a", "gpu-b"], 0, sweep_id="s1")
    with pytest.raises(InputError, match=r"^node gpu-a: its digest is gone; node gpu-b: so is this one$"):
        reports.build(sweep, [], {}, tmp_path / "s1.json", 7 * S,
                      lost=[("gpu-a", "its digest is gone"), ("gpu-b", "so is this one")])
    assert not (tmp_path / "s1.json").exists()


def test_stragglers_are_named_by_the_node_that_uploaded_them(tmp_path) -> None:
    """In a pod the trace's host is the pod's name, gone by the next scheduled sweep: the
    sweep keeps the agent's node name, which `sweeps` counts across sweeps."""
    from rankscope.analysis.testing import SyntheticJob, synthetic_job

    table, truth = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=2, steps=20, stragglers={3: 400_000}))
    paths = []
    for pod, node, ranks in (("trainer-0", "gpu-node-a", (0, 1)), ("trainer-1", "gpu-node-b", (2, 3))):
        host = table.column("host").unique()[len(paths)].as_py()
        paths.append((tmp_path / f"{pod}.parquet", node, f"{pod}.parquet", ranks))
        digest.write(table.filter(pc.equal(table.column("host"), host)), paths[-1][0])
    sweep, _ = sw.Sweep.start(SPEC, ["gpu-node-a", "gpu-node-b"], 0, sweep_id="s1")
    done = reports.build(sweep, paths, {}, tmp_path / "s1.json", 7 * S)
    assert truth.stragglers == [3] and done.stragglers == (sw.RankOn(3, "gpu-node-b"),)
    nodes = json.loads((tmp_path / "s1.json").read_text())["sweep"]["nodes"]  # which ranks each node delivered
    assert {name: facts["ranks"] for name, facts in nodes.items()} == {"gpu-node-a": [0, 1], "gpu-node-b": [2, 3]}
    assert [(r.rank, r.node) for r in sweep_message(sw.Sweep(
        sweep_id="s1", spec=SPEC, created_ns=0, deadline_ns=0, nodes={}, stragglers=list(done.stragglers))).stragglers] == [
        (3, "gpu-node-b")]


def test_a_straggler_stored_with_its_trace_host_still_loads() -> None:
    sweep = sw.Sweep(sweep_id="s1", spec=SPEC, created_ns=0, deadline_ns=0, nodes={}, stragglers=[sw.RankOn(2, "n")])
    data = json.loads(json.dumps(sweep.to_dict()))
    data["stragglers"] = [{"rank": 2, "host": "node000"}]  # as stored before the node was kept
    assert sw.Sweep.from_dict(data).stragglers == [sw.RankOn(2, "node000")]
