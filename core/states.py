"""The states of one node in a sweep: the agent's capture machine moves through them and
reports each, the coordinator's sweep machine records them; on the wire they are
``rankscope.v1.NodeState``, so the names here are the proto's without the prefix.

`wire_name` and `wire_value` do that for any of the proto's enums: ``SWEEP_STATE_PARTIAL``
is ``partial`` on this side, and the UNSPECIFIED zero is ``""``."""

from __future__ import annotations

import enum
import functools
import re

from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from rankscope.errors import InputError
from rankscope.proto.v1 import rankscope_pb2 as pb


class NodeState(str, enum.Enum):
    PENDING = "pending"
    PAUSING_DCGM = "pausing_dcgm"
    CAPTURING = "capturing"
    EXPORTING = "exporting"
    UPLOADING = "uploading"
    UPLOADED = "uploaded"
    DCGM_RESUMED = "dcgm_resumed"
    FAILED = "failed"
    # Set by the coordinator only.
    ANALYSED = "analysed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


# The agent's last states of a capture: past them it holds nothing (DCGM resumed, files sent or given up).
AGENT_DONE = frozenset({NodeState.DCGM_RESUMED, NodeState.FAILED})


class UnknownWireValue(InputError):
    """A proto enum value this side has no name for: a newer peer's, or a broken one's
    (proto3 enums are open: any int32 parses)."""


def to_wire(state: NodeState) -> int:
    return wire_value(pb.NodeState, state.value)


def from_wire(value: int) -> NodeState | None:
    """The state a wire value names; None for NODE_STATE_UNSPECIFIED."""
    return NodeState(wire_name(pb.NodeState, value)) if value else None


@functools.cache  # a handful of enums, looked up on every node status
def _prefix(enum_type: EnumTypeWrapper) -> str:
    """The prefix of an enum's value names, by the proto style guide: ``SweepState`` → ``SWEEP_STATE_``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum_type.DESCRIPTOR.name).upper() + "_"


def wire_name(enum_type: EnumTypeWrapper, value: int) -> str:
    """A proto enum value's name, lower case and without the enum's prefix; "" for 0 (UNSPECIFIED)."""
    if not value:
        return ""
    if value not in enum_type.DESCRIPTOR.values_by_number:
        known = ", ".join(wire_name(enum_type, v) for v in sorted(enum_type.DESCRIPTOR.values_by_number) if v)
        raise UnknownWireValue(f"{enum_type.DESCRIPTOR.name} {value} is none this rankscope knows ({known})")
    return enum_type.Name(value).removeprefix(_prefix(enum_type)).lower()


def wire_value(enum_type: EnumTypeWrapper, name: str) -> int:
    """The inverse of `wire_name`: the enum's value of ``name``; 0 (UNSPECIFIED) for ""."""
    return enum_type.Value(_prefix(enum_type) + name.upper()) if name else 0
