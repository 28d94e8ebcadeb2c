"""The coordinator judging an agent lost on its silence, without gRPC or a ticker: the tests
hand `_judge_lost` the time each tick took, so no wait and no machine's speed decides them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.config import resolve
from rankscope.coordinator.coordinator import HEARD_TICK_NS, Coordinator

S = 1_000_000_000
TICK = S // 4
LOST_S = 2.0


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Coordinator]:
    config = resolve({"data_dir": str(tmp_path / "data"), "agent_lost_s": LOST_S, "heartbeat_interval_s": 1.0},
                     environ={})
    coordinator = Coordinator(config)  # not started: no ticker, these tests tick it
    yield coordinator
    coordinator.stop()


def tick(coordinator: Coordinator, seconds: float) -> None:
    with coordinator._lock:
        for _ in range(int(seconds * S) // TICK):
            coordinator._judge_lost(TICK)


def connect(coordinator: Coordinator, node: str):
    agent, _ = coordinator.register(node, node, {}, gpus=[], ranks=[], versions={}, backends=["sim"])
    return coordinator.connect(agent)


def capture(coordinator: Coordinator, *nodes: str) -> str:
    spec = sw.SweepSpec(backend="sim", duration_s=5.0, timeout_s=3600.0)
    return coordinator.start_sweep(spec, names=list(nodes), labels={}, everything=False).sweep_id


def node(coordinator: Coordinator, sweep_id: str, name: str) -> sw.NodeRecord:
    return coordinator.sweep(sweep_id).nodes[name]


def test_an_agent_whose_session_ended_fails_its_node_once_silent_for_the_interval(coordinator) -> None:
    a, b = connect(coordinator, "a"), connect(coordinator, "b")
    sweep_id = capture(coordinator, "a", "b")
    coordinator.node_reported("b", sw.NodeReported("b", sw.NodeState.CAPTURING, coordinator.clock()), sweep_id)
    coordinator.disconnect(b)  # killed: its TCP connection closed with it
    tick(coordinator, 1.0)
    coordinator.heard(a)  # a speaks up each second; b never again
    tick(coordinator, 0.75)
    coordinator.heard(a)
    assert node(coordinator, sweep_id, "b").state is sw.NodeState.CAPTURING
    tick(coordinator, 0.25)
    lost = node(coordinator, sweep_id, "b")
    assert lost.state is sw.NodeState.FAILED
    assert lost.reason == "agent of node b lost: not heard from for 2s, its session ended (last state: capturing)"
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.PENDING
    assert coordinator.sweep(sweep_id).state is sw.SweepState.RUNNING


def test_an_agent_back_within_the_interval_keeps_its_node(coordinator) -> None:
    """A killed agent restarted (systemd, a pod's restart) carries its capture on from its ledger."""
    first = connect(coordinator, "a")
    sweep_id = capture(coordinator, "a")
    coordinator.disconnect(first)
    tick(coordinator, 1.75)
    again = connect(coordinator, "a")
    assert again.outbox.get_nowait().sweep_id == sweep_id  # its capture again, for it to re-report
    tick(coordinator, 1.75)  # counted anew from its return
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.PENDING
    tick(coordinator, 0.25)
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.FAILED


def test_a_session_open_with_nothing_on_it_is_closed_and_its_node_fails(coordinator) -> None:
    """Its node down or cut off: TCP sees nothing for minutes (keepalive: 40 s at best), the
    heartbeats stop at once."""
    silent = connect(coordinator, "a")
    sweep_id = capture(coordinator, "a")
    tick(coordinator, 2.0)
    assert silent.closed.is_set()  # its stream ends; alive after all, the agent reconnects
    assert node(coordinator, sweep_id, "a").reason == ("agent of node a lost: not heard from for 2s, its session "
                                                         "still open (last state: pending)")


def test_the_coordinators_own_stall_is_no_agents_silence(coordinator) -> None:
    """A tick late by an hour (the process stopped, its clock stepped) counts as one tick's worth."""
    connect(coordinator, "a")
    sweep_id = capture(coordinator, "a")
    with coordinator._lock:
        coordinator._judge_lost(3600 * S)
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.PENDING
    tick(coordinator, LOST_S - HEARD_TICK_NS / S)
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.FAILED


def test_a_session_taken_over_speaks_not_for_the_node(coordinator) -> None:
    old = connect(coordinator, "a")
    new = connect(coordinator, "a")  # another agent under the same name; the old session lingers
    sweep_id = capture(coordinator, "a")
    new.outbox.get_nowait()
    tick(coordinator, 1.0)
    coordinator.heard(old)
    tick(coordinator, 1.0)
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.FAILED


def test_a_named_node_whose_agent_left_before_the_sweep_waits_for_it(coordinator) -> None:
    """Named, a node whose agent is away gets the capture if it connects in time, as before: not
    judged lost on a silence that began before its sweep, until it connects."""
    coordinator.disconnect(connect(coordinator, "a"))
    tick(coordinator, 1.0)
    sweep_id = capture(coordinator, "a")
    tick(coordinator, 10.0)
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.PENDING
    back = connect(coordinator, "a")
    back.outbox.get_nowait()
    tick(coordinator, 2.0)
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.FAILED
