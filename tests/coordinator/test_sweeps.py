"""The sweep state machine on its own: events in, instructions out, no network."""

from __future__ import annotations

import json

import pytest

from rankscope.coordinator import sweeps as sw
from rankscope.errors import InputError

S = 1_000_000_000
T0 = 1_764_000_000 * S
SPEC = sw.SweepSpec(backend="sim", duration_s=5.0, timeout_s=30.0)
DIGEST = sw.ArtifactInfo("rank0.parquet", "a" * 64, 10, "digest", "u-a", (0, 1))
LINK = sw.SlowLink("dp3", "allreduce", (3, 11, 19, 27), 19.6, 39.2)


def started(*nodes: str) -> sw.Sweep:
    sweep, instructions = sw.Sweep.start(SPEC, nodes, T0, sweep_id="s1")
    assert [i for i in instructions if isinstance(i, sw.SendCapture)] == [sw.SendCapture(n) for n in sorted(nodes)]
    return sweep


def finish(sweep: sw.Sweep, node: str, at: int = T0 + S, artifacts=(DIGEST,)) -> list[sw.Instruction]:
    out: list[sw.Instruction] = []
    for state in (sw.NodeState.PENDING, sw.NodeState.CAPTURING, sw.NodeState.UPLOADING):
        out += sweep.handle(sw.NodeReported(node, state, at))
    out += sweep.handle(sw.NodeReported(node, sw.NodeState.UPLOADED, at, artifacts=tuple(artifacts)))
    out += sweep.handle(sw.NodeReported(node, sw.NodeState.DCGM_RESUMED, at, dcgm="resumed"))
    return out


def analyses(instructions: list[sw.Instruction]) -> list[sw.Analyse]:
    return [i for i in instructions if isinstance(i, sw.Analyse)]


def test_every_node_finished_is_analysed() -> None:
    sweep = started("a", "b")
    assert analyses(finish(sweep, "a")) == []
    assert sweep.state is sw.SweepState.RUNNING and sweep.nodes["a"].finished
    out = finish(sweep, "b")
    assert analyses(out) == [sw.Analyse((("a", DIGEST), ("b", DIGEST)))]
    assert sweep.state is sw.SweepState.ANALYSING
    sweep.handle(sw.AnalysisDone("/r/s1.json", T0 + 2 * S, (sw.RankOn(3, "b"),), (LINK,)))
    assert sweep.state is sw.SweepState.ANALYSED and sweep.missing == []
    assert {rec.state for rec in sweep.nodes.values()} == {sw.NodeState.ANALYSED}
    assert sweep.report_path == "/r/s1.json" and sweep.final
    assert sweep.stragglers == [sw.RankOn(3, "b")] and sweep.slow_links == [LINK]
    assert sw.Sweep.from_dict(json.loads(json.dumps(sweep.to_dict()))) == sweep  # as the store keeps it


def test_an_analysed_node_keeps_no_detail_of_its_last_agent_state() -> None:
    # found by review: `capture --wait` ended on "analysed  dcgm paused" after "dcgm_resumed  dcgm
    # resumed", the DCGM_RESUMED state's detail (the pause's outcome) left on the analysed node
    sweep = started("a")
    sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADED, T0 + S, artifacts=(DIGEST,)))
    assert analyses(sweep.handle(sw.NodeReported("a", sw.NodeState.DCGM_RESUMED, T0 + S, detail="dcgm paused",
                                                 dcgm="resumed")))
    sweep.handle(sw.AnalysisDone("/r/s1.json", T0 + 2 * S))
    assert (sweep.nodes["a"].state, sweep.nodes["a"].detail, sweep.nodes["a"].dcgm) == (sw.NodeState.ANALYSED, "", "resumed")


def test_a_sweep_stored_before_stragglers_and_slow_links_were_kept_still_loads() -> None:
    sweep = started("a")
    data = json.loads(json.dumps(sweep.to_dict()))
    del data["stragglers"], data["slow_links"]
    assert sw.Sweep.from_dict(data).stragglers == [] and sw.Sweep.from_dict(data).slow_links == []


def test_uploaded_without_dcgm_resumed_is_not_finished() -> None:
    sweep = started("a")
    sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADED, T0, artifacts=(DIGEST,)))
    assert sweep.state is sw.SweepState.RUNNING and not sweep.nodes["a"].finished
    assert sweep.open_nodes() == ["a"]


def test_a_stale_earlier_state_does_not_move_a_node_back() -> None:
    sweep = started("a")
    sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADING, T0))
    sweep.handle(sw.NodeReported("a", sw.NodeState.CAPTURING, T0))
    assert sweep.nodes["a"].state is sw.NodeState.UPLOADING


def test_a_silent_node_times_out_and_the_sweep_is_partial_with_it_named() -> None:
    sweep = started("a", "b")
    finish(sweep, "a")
    sweep.handle(sw.NodeReported("b", sw.NodeState.CAPTURING, T0 + S))
    assert sweep.handle(sw.Tick(T0 + 29 * S)) == []
    out = sweep.handle(sw.Tick(T0 + 30 * S))
    assert sw.CancelNode("b", "no answer within 30s (last state: capturing)") in out
    assert analyses(out) == [sw.Analyse((("a", DIGEST),))]
    assert sweep.nodes["b"].state is sw.NodeState.TIMED_OUT
    assert sweep.missing == ["b"]
    sweep.handle(sw.AnalysisDone("/r/s1.json", T0 + 31 * S))
    assert sweep.state is sw.SweepState.PARTIAL
    assert sweep.nodes["a"].state is sw.NodeState.ANALYSED
    # Too late: a timed-out node stays missing from a report already made.
    assert sweep.handle(sw.NodeReported("b", sw.NodeState.UPLOADED, T0 + 32 * S, artifacts=(DIGEST,))) == []
    assert sweep.nodes["b"].state is sw.NodeState.TIMED_OUT


def test_export_time_is_not_counted_against_the_timeout_up_to_the_agents_bound() -> None:
    """8 ranks of large nsys exports outlast window + 120 s: a node exporting is not timed
    out while within the bound its agent gave, and the time it spent moves its deadline."""
    sweep = started("a", "b")  # 30 s timeout
    sweep.handle(sw.NodeReported("a", sw.NodeState.EXPORTING, T0 + 10 * S, export_timeout_s=100))
    sweep.handle(sw.NodeReported("b", sw.NodeState.EXPORTING, T0 + 10 * S, export_timeout_s=100))
    sweep.handle(sw.NodeReported("a", sw.NodeState.EXPORTING, T0 + 20 * S, export_timeout_s=100))  # a reconnect
    assert sweep.handle(sw.Tick(T0 + 60 * S)) == []
    sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADING, T0 + 70 * S))  # 60 s exporting
    assert sweep.handle(sw.Tick(T0 + 89 * S)) == []
    out = sweep.handle(sw.Tick(T0 + 90 * S))
    assert sw.CancelNode("a", "no answer within 30s and 60s exporting (last state: uploading)") in out
    assert sweep.nodes["b"].state is sw.NodeState.EXPORTING
    assert sweep.handle(sw.Tick(T0 + 129 * S)) == []
    out = sweep.handle(sw.Tick(T0 + 130 * S))  # past its agent's own bound on the export
    assert sw.CancelNode("b", "no answer within 30s and 100s exporting (last state: exporting)") in out
    # kept across a coordinator restart
    again = sw.Sweep.from_dict(sweep.to_dict())
    assert again.nodes["a"].export_credit_ns == 60 * S


def test_a_lost_agents_node_fails_at_once_naming_it_and_the_rest_go_on() -> None:
    """A killed agent says nothing: its node waited out the sweep's timeout. Judged lost (by
    the coordinator, on its silence), the node fails now with why, whatever its state (an
    export with an hour's bound too), and the sweep ends without it."""
    sweep = started("a", "b")
    sweep.handle(sw.NodeReported("b", sw.NodeState.EXPORTING, T0 + 2 * S, export_timeout_s=3600))
    finish(sweep, "a")
    out = sweep.handle(sw.AgentLost("b", "not heard from for 30s, its session ended", T0 + 5 * S))
    why = "agent of node b lost: not heard from for 30s, its session ended (last state: exporting)"
    assert sw.CancelNode("b", why) in out and analyses(out) == [sw.Analyse((("a", DIGEST),))]
    assert sweep.nodes["b"].state is sw.NodeState.FAILED and sweep.nodes["b"].reason == why
    assert sweep.nodes["b"].updated_ns == T0 + 5 * S
    sweep.handle(sw.AnalysisDone("/r/s1.json", T0 + 6 * S))
    assert sweep.state is sw.SweepState.PARTIAL and sweep.missing == ["b"]


def test_a_lost_agent_changes_nothing_of_nodes_ended_or_not_in_the_sweep() -> None:
    sweep = started("a", "b")
    sweep.handle(sw.NodeReported("a", sw.NodeState.FAILED, T0 + S, reason="nsys exited 1"))
    assert sweep.handle(sw.AgentLost("a", "not heard from for 30s, its session ended", T0 + 2 * S)) == []
    assert sweep.handle(sw.AgentLost("zz", "not heard from for 30s, its session ended", T0 + 2 * S)) == []
    assert sweep.nodes["a"].reason == "nsys exited 1" and sweep.nodes["b"].state is sw.NodeState.PENDING


def test_a_lost_agent_uploading_raw_exports_beside_its_stored_digest_ends_on_the_digest() -> None:
    sweep = started("a")
    sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADING, T0 + S, artifacts=(DIGEST,)))
    out = sweep.handle(sw.AgentLost("a", "not heard from for 30s, its session still open", T0 + 2 * S))
    assert analyses(out) == [sw.Analyse((("a", DIGEST),))] and sweep.nodes["a"].digest_only
    assert sweep.nodes["a"].notes == ["raw exports not all uploaded (agent of node a lost: not heard from for 30s, "
                                      "its session still open): the report stands on its digest"]


def test_an_agent_back_at_a_capture_its_node_ended_for_is_told_to_stop() -> None:
    """Judged lost, then restarted from its ledger: its capture goes on, DCGM paused, until its
    own deadline, unless told; a report of one ended or finished counts for nothing."""
    sweep = started("a", "b", "c")
    sweep.handle(sw.AgentLost("a", "not heard from for 30s, its session ended", T0 + S))
    finish(sweep, "c")
    assert sweep.handle(sw.NodeReported("c", sw.NodeState.UPLOADING, T0 + 2 * S)) == []  # a stale re-report
    why = sweep.nodes["a"].reason
    assert sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADING, T0 + 2 * S)) == [sw.CancelNode("a", why)]
    assert sweep.handle(sw.NodeReported("a", sw.NodeState.DCGM_RESUMED, T0 + 3 * S)) == []
    assert sweep.handle(sw.NodeReported("a", sw.NodeState.FAILED, T0 + 3 * S)) == []
    assert sweep.nodes["a"].state is sw.NodeState.FAILED and sweep.nodes["a"].reason == why
    finish(sweep, "b")
    assert sweep.handle(sw.NodeReported("b", sw.NodeState.UPLOADING, T0 + 4 * S)) == []  # not running now


def test_an_export_without_a_bound_counts_against_the_timeout() -> None:
    """An agent that predates the bound (0) is timed out as before."""
    sweep = started("a")
    sweep.handle(sw.NodeReported("a", sw.NodeState.EXPORTING, T0 + 10 * S))
    out = sweep.handle(sw.Tick(T0 + 30 * S))
    assert sw.CancelNode("a", "no answer within 30s (last state: exporting)") in out


def test_a_failed_node_is_missing_with_its_reason() -> None:
    sweep = started("a", "b")
    finish(sweep, "a")
    out = sweep.handle(sw.NodeReported("b", sw.NodeState.FAILED, T0 + S, reason="nsys exited 1"))
    assert analyses(out) == [sw.Analyse((("a", DIGEST),))]
    assert sweep.missing == ["b"] and sweep.nodes["b"].reason == "nsys exited 1"


def test_a_node_with_no_digest_is_missing() -> None:
    sweep = started("a", "b")
    finish(sweep, "a")
    raw = sw.ArtifactInfo("rank2.nsys-rep", "b" * 64, 10, "raw")
    out = finish(sweep, "b", artifacts=(raw,))
    assert analyses(out) == [sw.Analyse((("a", DIGEST),))] and sweep.missing == ["b"]


def test_no_node_finishing_fails_the_sweep_without_analysis() -> None:
    sweep = started("a", "b")
    sweep.handle(sw.NodeReported("a", sw.NodeState.FAILED, T0, reason="no GPUs"))
    out = sweep.handle(sw.Tick(T0 + 30 * S))
    assert analyses(out) == []
    assert sweep.state is sw.SweepState.FAILED and sweep.missing == ["a", "b"]
    assert "a: no GPUs" in sweep.error and "b: no answer within 30s" in sweep.error


def test_a_sweeps_nodes_and_those_missing_are_in_the_fleets_numbering() -> None:
    with pytest.raises(InputError, match="not connected: f2, f10$"):
        sw.Sweep.start(SPEC, ["f10", "f2"], T0, away=["f10", "f2"])
    sweep, _ = sw.Sweep.start(SPEC, ["f10", "f2", "f1"], T0, sweep_id="s1")
    assert list(sweep.nodes) == ["f1", "f2", "f10"]
    sweep.handle(sw.Tick(T0 + 30 * S))
    assert sweep.missing == ["f1", "f2", "f10"]


def test_failed_analysis_fails_the_sweep() -> None:
    sweep = started("a")
    finish(sweep, "a")
    sweep.handle(sw.AnalysisFailed("analysis failed: no collectives", T0 + 2 * S))
    assert sweep.state is sw.SweepState.FAILED and sweep.error == "analysis failed: no collectives"


def test_reports_from_nodes_outside_the_sweep_are_ignored() -> None:
    sweep = started("a")
    assert sweep.handle(sw.NodeReported("z", sw.NodeState.UPLOADED, T0)) == []
    assert list(sweep.nodes) == ["a"]


def test_restart_gives_agents_grace_and_redoes_a_lost_analysis() -> None:
    sweep = started("a", "b")
    sweep.handle(sw.Restarted(T0 + 25 * S, 20 * S))
    assert sweep.deadline_ns == T0 + 45 * S
    assert sweep.handle(sw.Tick(T0 + 35 * S)) == []
    finish(sweep, "a")
    finish(sweep, "b")
    assert sweep.state is sw.SweepState.ANALYSING
    assert analyses(sweep.handle(sw.Restarted(T0 + 50 * S, 20 * S))) == [sw.Analyse((("a", DIGEST), ("b", DIGEST)))]


def test_a_node_waited_for_is_marked_so_until_its_agent_connects_and_across_a_restart() -> None:
    """Named with its agent away, a node waits until the timeout: the mark, kept with the
    sweep, tells a restarted coordinator not to judge it on the restart's grace. Its agent's
    session ends it, before any report (the coordinator may go before one comes)."""
    sweep, _ = sw.Sweep.start(SPEC, ["a", "b", "c", "d"], T0, sweep_id="s1", waited=["b", "c", "d", "zz"])
    sweep.nodes["d"].detail = "agent not connected"
    assert {n: r.agent_away for n, r in sweep.nodes.items()} == {"a": False, "b": True, "c": True, "d": True}
    sweep.handle(sw.NodeReported("c", sw.NodeState.PENDING, T0 + S))  # its agent came and took the capture
    assert sweep.handle(sw.AgentConnected("d", T0 + S)) == [sw.Changed("d")]  # so did d's, and said nothing yet
    assert sweep.handle(sw.AgentConnected("d", T0 + 2 * S)) == sweep.handle(sw.AgentConnected("a", T0 + S)) == []
    again = sw.Sweep.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert {n: r.agent_away for n, r in again.nodes.items()} == {"a": False, "b": True, "c": False, "d": False}
    assert (again.nodes["d"].detail, again.nodes["d"].updated_ns) == ("", T0 + S)


def test_round_trips_through_json_mid_sweep() -> None:
    sweep = started("a", "b")
    finish(sweep, "a")
    sweep.handle(sw.NodeReported("b", sw.NodeState.EXPORTING, T0 + S, detail="1/2 ranks"))
    again = sw.Sweep.from_dict(json.loads(json.dumps(sweep.to_dict())))
    assert again == sweep
    finish(again, "b")
    assert again.state is sw.SweepState.ANALYSING


def test_a_sweep_needs_nodes() -> None:
    with pytest.raises(InputError):
        sw.Sweep.start(SPEC, [], T0)


def test_a_node_still_capturing_for_another_sweep_fails_at_once_and_the_rest_go_on() -> None:
    sweep, instructions = sw.Sweep.start(SPEC, ["a", "b"], T0, sweep_id="s2", busy={"a": "s1", "z": "s0"})
    assert [i for i in instructions if isinstance(i, sw.SendCapture)] == [sw.SendCapture("b")]
    assert (sweep.nodes["a"].state, sweep.nodes["a"].reason) == (sw.NodeState.FAILED, "busy: still capturing for sweep s1")
    assert sweep.open_nodes() == ["b"]  # a reconnecting a is not sent this capture either
    finish(sweep, "b")
    sweep.handle(sw.AnalysisDone("/r/s2.json", T0 + 2 * S, (), ()))
    assert sweep.state is sw.SweepState.PARTIAL and sweep.missing == ["a"]


def test_a_sweep_whose_every_node_is_busy_is_refused() -> None:
    with pytest.raises(InputError, match="^node a is still capturing for sweep s1$"):
        sw.Sweep.start(SPEC, ["a"], T0, busy={"a": "s1"})
    fleet = {f"n{i:03d}": f"s{i % 5}" for i in range(100)}
    with pytest.raises(InputError, match=r"^all 100 target nodes are still capturing for sweep\(s\) s0, s1, s2 and 2 more$"):
        sw.Sweep.start(SPEC, fleet, T0, busy=fleet)


def test_a_node_whose_digest_is_stored_but_raw_exports_run_late_is_analysed_at_the_deadline() -> None:
    # --upload-raw: multi-GB exports still uploading at the deadline failed the whole sweep,
    # though every digest, all the analysis needs, had arrived.
    sweep = started("a", "b")
    finish(sweep, "a")
    for state in (sw.NodeState.PENDING, sw.NodeState.CAPTURING, sw.NodeState.UPLOADING):
        sweep.handle(sw.NodeReported("b", state, T0 + S, dcgm="resumed"))
    other = sw.ArtifactInfo("b.parquet", "b" * 64, 10, "digest", "u-b", (2, 3))
    sweep.handle(sw.NodeReported("b", sw.NodeState.UPLOADING, T0 + 2 * S, artifacts=(other,)))
    out = sweep.handle(sw.Tick(T0 + 30 * S))
    reason = "raw exports not all uploaded within 30s: the report stands on its digest"
    assert sw.CancelNode("b", reason) in out
    assert analyses(out) == [sw.Analyse((("a", DIGEST), ("b", other)))]
    assert sweep.missing == [] and reason in sweep.nodes["b"].notes
    # a restarted coordinator holds the same
    assert sw.Sweep.from_dict(json.loads(json.dumps(sweep.to_dict()))).nodes["b"].finished


def test_a_cancelled_sweep_stops_its_open_nodes_and_analyses_what_finished() -> None:
    sweep = started("a", "b")
    finish(sweep, "a")
    sweep.handle(sw.NodeReported("b", sw.NodeState.CAPTURING, T0 + S))
    out = sweep.handle(sw.Cancelled("cancelled by the user", T0 + 2 * S))
    assert sw.CancelNode("b", "cancelled by the user") in out
    assert analyses(out) == [sw.Analyse((("a", DIGEST),))]
    assert sweep.nodes["b"].state is sw.NodeState.CANCELLED and sweep.missing == ["b"]
    assert sweep.handle(sw.Cancelled("again", T0 + 3 * S)) == []  # analysing: nothing left to stop


def test_a_cancelled_sweep_with_nothing_finished_fails_naming_the_reason() -> None:
    sweep = started("a")
    out = sweep.handle(sw.Cancelled("wrong duration", T0 + S))
    assert sw.CancelNode("a", "wrong duration") in out and not analyses(out)
    assert sweep.state is sw.SweepState.FAILED and "a: wrong duration" in sweep.error


def test_a_cancelled_sweep_keeps_the_digests_stored_while_raw_exports_upload() -> None:
    # The multi-GB raw-upload case is where a user reaches for cancel: it failed the sweep.
    sweep = started("a")
    for state in (sw.NodeState.PENDING, sw.NodeState.CAPTURING, sw.NodeState.UPLOADING):
        sweep.handle(sw.NodeReported("a", state, T0 + S, dcgm="resumed"))
    sweep.handle(sw.NodeReported("a", sw.NodeState.UPLOADING, T0 + S, artifacts=(DIGEST,)))
    out = sweep.handle(sw.Cancelled("cancelled by the user", T0 + 2 * S))
    assert analyses(out) == [sw.Analyse((("a", DIGEST),))] and sw.CancelNode("a", "cancelled by the user") in out
    assert sweep.nodes["a"].notes == ["raw exports not all uploaded (cancelled by the user): the report stands on its digest"]
    assert sweep.nodes["a"].digest_only
