"""The export clock at the coordinator: a coordinator restart mid-export must not leave an
exporting node's allowance wrong (an agent gone mid-export is judged lost: test_liveness.py)."""

from __future__ import annotations

from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.config import resolve
from rankscope.coordinator.coordinator import Coordinator

S = 1_000_000_000
T0 = 1_764_000_000 * S


def _coordinator(tmp_path):
    config = resolve({"data_dir": str(tmp_path / "data"), "restart_grace_s": 60.0}, environ={})
    coordinator = Coordinator(config)
    coordinator.start()
    return coordinator


def test_a_node_exporting_when_the_coordinator_restarts_has_the_grace_not_its_whole_bound() -> None:
    """An agent that never comes back after a coordinator restart (it died meanwhile) must
    not hold the sweep for its hour-long export bound: the restart's grace extends only the sweep
    deadline."""
    sweep, _ = sw.Sweep.start(sw.SweepSpec(backend="sim", duration_s=5.0, timeout_s=30.0), ["a"], T0, sweep_id="s1")
    sweep.handle(sw.NodeReported("a", sw.NodeState.EXPORTING, T0 + 10 * S, export_timeout_s=3600))
    restored = sw.Sweep.from_dict(sweep.to_dict())  # the coordinator restarts at T0 + 40 s
    restored.handle(sw.Restarted(T0 + 40 * S, 60 * S))
    # as for a disconnect at T0+40: 30 s timeout + export credited until the grace ends (90 s)
    assert restored.handle(sw.Tick(T0 + 119 * S)) == []
    out = restored.handle(sw.Tick(T0 + 120 * S))
    assert sw.CancelNode("a", "no answer within 30s and 90s exporting, its agent not back since the "
                         "coordinator restarted mid-export (last state: exporting)") in out


def test_an_unbounded_export_bound_from_the_wire_is_capped_not_a_crash() -> None:
    """An agent may send an infinite bound (or 1e300): the coordinator credits at most a day
    of export time, and the sweep survives a round trip through its stored state."""
    sweep, _ = sw.Sweep.start(sw.SweepSpec(backend="sim", duration_s=5.0, timeout_s=30.0), ["a"], T0, sweep_id="s1")
    sweep.handle(sw.NodeReported("a", sw.NodeState.EXPORTING, T0 + 10 * S, export_timeout_s=float("inf")))
    sweep.handle(sw.NodeReported("a", sw.NodeState.EXPORTING, T0 + 11 * S, export_timeout_s=1e300))
    assert sweep.nodes["a"].export_allowance_ns == int(sw.MAX_EXPORT_ALLOWANCE_S) * S
    restored = sw.Sweep.from_dict(sweep.to_dict())
    assert restored.nodes["a"].deadline_ns(T0 + 30 * S, T0 + 40 * S) == T0 + 60 * S


def test_a_session_that_gRPC_ends_after_the_stop_does_not_write_to_the_closed_state(tmp_path) -> None:
    """gRPC may close a session's stream only after the server stopped (its generator is
    finalised late): its disconnect wrote the node's last sighting into the closed SQLite
    store: 'Cannot operate on a closed database', an ignored exception in the generator."""
    coordinator = _coordinator(tmp_path)
    agent, _ = coordinator.register("a", "a", {}, gpus=[], ranks=[], versions={}, backends=["sim"])
    session = coordinator.connect(agent)
    coordinator.stop()
    coordinator.disconnect(session)
