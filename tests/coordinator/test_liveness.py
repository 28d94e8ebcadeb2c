"""The coordinator judging an agent lost on its silence, without gRPC or a ticker: the tests
hand `_judge_lost` the time each tick took, so no wait and no machine's speed decides them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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


def tick(coordinator: Coordinator, seconds: float, *alive) -> None:
    """``seconds`` of ticks, the sessions ``alive`` heard from at each."""
    for _ in range(int(seconds * S) // TICK):
        with coordinator._lock:
            coordinator._judge_lost(TICK)
        for connection in alive:
            coordinator.heard(connection)


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


@pytest.mark.parametrize("end", ["lost", "timed out"])
def test_an_upload_of_a_node_its_sweep_no_longer_waits_for_is_refused_before_any_byte(coordinator, end) -> None:
    """Its agent back after its node was judged lost, or timed out: nothing it sends is analysed
    (the sweep takes no more news of the node), so its upload is refused, not stored unused."""
    from rankscope.coordinator.artifacts import UploadHeader
    from rankscope.coordinator.coordinator import NotForSweep

    a, b = connect(coordinator, "a"), connect(coordinator, "b")
    sweep_id = capture(coordinator, "a", "b")
    if end == "lost":
        coordinator.disconnect(b)
        tick(coordinator, LOST_S, a)
        reason = "agent of node b lost: not heard from for 2s, its session ended (last state: pending)"
        state = "failed"
    else:  # a exports (its time not counted): the sweep runs on without b
        coordinator.node_reported("a", sw.NodeReported("a", sw.NodeState.EXPORTING, coordinator.clock(),
                                                       export_timeout_s=7200.0), sweep_id)
        with coordinator._lock:
            coordinator._feed(sw.Tick(coordinator.clock() + 3601 * S))
        reason, state = "no answer within 3600s (last state: pending)", "timed_out"
    assert node(coordinator, sweep_id, "b").reason == reason
    header = UploadHeader("u-b", sweep_id, "b", "b.digest.parquet", 3, "0" * 64, "digest")
    with pytest.raises(NotForSweep) as caught:
        with coordinator.upload(header, b.agent.token):
            raise AssertionError("a writer was opened")
    assert str(caught.value) == (f"upload u-b: sweep {sweep_id} no longer waits for node b ({state}: {reason}); its "
                                 "capture is not used")
    assert list((coordinator.config.artifacts_dir / "partial").iterdir()) == []


# After a restart: the agents the last run had get `restart_grace_s` to come back. -------

GRACE_S = 60.0


@pytest.fixture
def restart(tmp_path: Path, coordinator: Coordinator, monkeypatch) -> Iterator[Callable[..., Coordinator]]:
    """Stop ``coordinator`` and start another on its data dir (as after a crash or an upgrade),
    its ticker idle: the tests tick it."""
    monkeypatch.setattr(Coordinator, "_tick_loop", lambda self: None)
    started: list[Coordinator] = []

    def again(clock: Callable[[], int] = time.time_ns) -> Coordinator:
        (started[-1] if started else coordinator).stop()
        config = resolve({"data_dir": str(tmp_path / "data"), "agent_lost_s": LOST_S, "heartbeat_interval_s": 1.0,
                          "restart_grace_s": GRACE_S}, environ={})
        started.append(Coordinator(config, clock=clock))
        started[-1].start()
        return started[-1]

    yield again
    if started:
        started[-1].stop()


def test_an_agent_not_back_within_the_restart_grace_fails_its_node(coordinator, restart) -> None:
    """An agent that died while the coordinator was down said nothing and never connects: its
    node waited out the sweep's timeout (an hour here). The restart grace past, it is lost."""
    for name in ("a", "b"):
        connect(coordinator, name)
    sweep_id = capture(coordinator, "a", "b")
    for name in ("a", "b"):
        coordinator.node_reported(name, sw.NodeReported(name, sw.NodeState.CAPTURING, coordinator.clock()), sweep_id)
    coordinator = restart()
    a = connect(coordinator, "a")  # back: it gets its capture again
    assert a.outbox.get_nowait().sweep_id == sweep_id
    tick(coordinator, GRACE_S - 1, a)
    assert node(coordinator, sweep_id, "b").state is sw.NodeState.CAPTURING
    tick(coordinator, 1.0, a)
    lost = node(coordinator, sweep_id, "b")
    assert lost.state is sw.NodeState.FAILED
    assert lost.reason == "agent of node b lost: not back within 60s of the coordinator's restart (last state: capturing)"
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.CAPTURING
    assert coordinator.sweep(sweep_id).state is sw.SweepState.RUNNING


def test_an_agent_back_after_a_restart_and_gone_again_is_judged_on_its_silence(coordinator, restart) -> None:
    connect(coordinator, "a")
    sweep_id = capture(coordinator, "a")
    coordinator = restart()
    coordinator.disconnect(connect(coordinator, "a"))
    tick(coordinator, LOST_S)
    assert node(coordinator, sweep_id, "a").reason == ("agent of node a lost: not heard from for 2s, its session "
                                                         "ended (last state: pending)")


def test_a_sweep_started_in_the_grace_waits_for_a_returning_agent_only_as_long(coordinator, restart) -> None:
    """Chosen while its agent is on its way back (connected as the last run stopped), a node is
    in the sweep as connected; not back by the grace's end, it is lost like the rest."""
    for name in ("a", "b"):
        connect(coordinator, name)
    coordinator = restart()
    a = connect(coordinator, "a")
    sweep_id = coordinator.start_sweep(sw.SweepSpec(backend="sim", duration_s=5.0, timeout_s=3600.0), names=[],
                                       labels={}, everything=True).sweep_id
    assert node(coordinator, sweep_id, "b").state is sw.NodeState.PENDING
    tick(coordinator, GRACE_S, a)
    assert node(coordinator, sweep_id, "b").reason == ("agent of node b lost: not back within 60s of the "
                                                         "coordinator's restart (last state: pending)")
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.PENDING


def test_a_named_node_whose_agent_was_away_when_its_sweep_started_still_waits_after_a_restart(
        coordinator, restart) -> None:
    """Its agent away (here registered and never connected, so seen as recently as the rest),
    a named node is waited for until the sweep's timeout, as without the restart; one whose
    agent reported for the sweep is the restart's to judge."""
    coordinator.register("b", "b", {}, gpus=[], ranks=[], versions={}, backends=["sim"])
    coordinator.register("c", "c", {}, gpus=[], ranks=[], versions={}, backends=["sim"])
    connect(coordinator, "a")
    sweep_id = capture(coordinator, "a", "b", "c")
    connect(coordinator, "c")  # connects in time, takes the capture, then the coordinator goes
    coordinator.node_reported("c", sw.NodeReported("c", sw.NodeState.PENDING, coordinator.clock()), sweep_id)
    coordinator = restart()
    a = connect(coordinator, "a")
    tick(coordinator, GRACE_S + 10, a)
    waiting = node(coordinator, sweep_id, "b")
    assert waiting.state is sw.NodeState.PENDING
    assert waiting.detail == "agent not connected: it gets the capture if it connects in time"
    assert node(coordinator, sweep_id, "c").state is sw.NodeState.FAILED
    coordinator = restart()  # and again: it still waits
    a = connect(coordinator, "a")
    tick(coordinator, GRACE_S + 10, a)
    assert node(coordinator, sweep_id, "b").state is sw.NodeState.PENDING
    b = connect(coordinator, "b")  # once it connects, its silence counts
    assert b.outbox.get_nowait().sweep_id == sweep_id
    tick(coordinator, LOST_S, a)
    assert node(coordinator, sweep_id, "b").state is sw.NodeState.FAILED


def test_a_node_named_once_the_grace_is_over_by_the_clock_is_waited_for_as_any_named_node(
        coordinator, restart) -> None:
    """A sweep's start reads the grace's end on the clock, which may come before its end on the
    time the ticker listened: a node named then, its agent away, waits as any named node does."""
    for name in ("a", "b"):
        connect(coordinator, name)
    now = [time.time_ns()]
    coordinator = restart(lambda: now[0])
    a = connect(coordinator, "a")
    now[0] += int((GRACE_S + 1) * S)  # the ticker stalled (the host busy): it listened for none of it
    sweep_id = capture(coordinator, "a", "b")
    tick(coordinator, GRACE_S + 10, a)
    waiting = node(coordinator, sweep_id, "b")
    assert (waiting.state, waiting.detail) == (sw.NodeState.PENDING, "agent not connected: it gets the capture if "
                                                                      "it connects in time")


def test_a_named_node_whose_agent_connected_but_never_reported_is_the_restarts_to_judge(
        coordinator, restart) -> None:
    """Named while its agent was away, a node is waited for until the sweep's timeout; once its
    agent connects (it took the capture, the coordinator went before it reported), it is away
    no longer: not back within the restart's grace, it is lost like the rest."""
    coordinator.register("b", "b", {}, gpus=[], ranks=[], versions={}, backends=["sim"])
    connect(coordinator, "a")
    sweep_id = capture(coordinator, "a", "b")
    assert connect(coordinator, "b").outbox.get_nowait().sweep_id == sweep_id
    assert node(coordinator, sweep_id, "b").detail == ""  # no longer "agent not connected"
    coordinator = restart()
    a = connect(coordinator, "a")
    tick(coordinator, GRACE_S, a)
    assert node(coordinator, sweep_id, "b").reason == ("agent of node b lost: not back within 60s of the "
                                                         "coordinator's restart (last state: pending)")
    assert node(coordinator, sweep_id, "a").state is sw.NodeState.PENDING
