"""Node states: the one enum both machines use matches the wire's, value for value."""

from __future__ import annotations

from rankscope import states
from rankscope.proto.v1 import rankscope_pb2 as pb


def test_every_wire_state_has_a_node_state_and_back() -> None:
    wire = [v for v in pb.NodeState.values() if v != pb.NODE_STATE_UNSPECIFIED]
    assert sorted(states.to_wire(s) for s in states.NodeState) == sorted(wire)
    for value in wire:
        assert states.to_wire(states.from_wire(value)) == value


def test_unspecified_is_no_state() -> None:
    assert states.from_wire(pb.NODE_STATE_UNSPECIFIED) is None
