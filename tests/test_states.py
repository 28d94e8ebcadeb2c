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


def test_every_wire_enum_names_its_values_without_the_prefix_and_back() -> None:
    names = set(pb.DESCRIPTOR.enum_types_by_name)
    assert names >= {"NodeState", "SweepState", "DcgmOutcome", "ArtifactKind"}
    for enum_name in sorted(names):
        enum_type = getattr(pb, enum_name)
        for value in enum_type.values():
            name = states.wire_name(enum_type, value)
            assert states.wire_value(enum_type, name) == value
            assert (name == "") == (value == 0) and enum_type.Name(value).lower().endswith("_" + name if name else "")
    assert states.wire_name(pb.SweepState, pb.SWEEP_STATE_PARTIAL) == "partial"
    assert states.wire_name(pb.DcgmOutcome, pb.DCGM_OUTCOME_NOT_NEEDED) == "not_needed"
    assert states.wire_value(pb.ArtifactKind, "raw") == pb.ARTIFACT_KIND_RAW
    assert states.wire_name(pb.ArtifactKind, 0) == "" and states.wire_value(pb.ArtifactKind, "") == 0
