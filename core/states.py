"""The states of one node in a sweep: the agent's capture machine moves through them and
reports each, the coordinator's sweep machine records them; on the wire they are
``rankscope.v1.NodeState``, so the names here are the proto's without the prefix."""

from __future__ import annotations

import enum

from rankscope.proto.v1 import rankscope_pb2 as pb

_PREFIX = "NODE_STATE_"


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


# The agent's last states of a capture: past them it holds nothing (DCGM resumed, files sent or given up).
AGENT_DONE = frozenset({NodeState.DCGM_RESUMED, NodeState.FAILED})


def to_wire(state: NodeState) -> int:
    return pb.NodeState.Value(_PREFIX + state.name)


def from_wire(value: int) -> NodeState | None:
    """The state a wire value names; None for NODE_STATE_UNSPECIFIED."""
    name = pb.NodeState.Name(value).removeprefix(_PREFIX)
    return None if value == pb.NODE_STATE_UNSPECIFIED else NodeState[name]
