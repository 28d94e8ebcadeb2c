# from rankscope.proto, sha256 6d35ae9f0bec41806aaebb9359033e55d71185048a3c98ad5b124b94db6cafa8
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_PENDING: _ClassVar[NodeState]
    NODE_STATE_PAUSING_DCGM: _ClassVar[NodeState]
    NODE_STATE_CAPTURING: _ClassVar[NodeState]
    NODE_STATE_EXPORTING: _ClassVar[NodeState]
    NODE_STATE_UPLOADING: _ClassVar[NodeState]
    NODE_STATE_UPLOADED: _ClassVar[NodeState]
    NODE_STATE_DCGM_RESUMED: _ClassVar[NodeState]
    NODE_STATE_FAILED: _ClassVar[NodeState]
    NODE_STATE_ANALYSED: _ClassVar[NodeState]
    NODE_STATE_TIMED_OUT: _ClassVar[NodeState]
    NODE_STATE_CANCELLED: _ClassVar[NodeState]

class DcgmOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DCGM_OUTCOME_UNSPECIFIED: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_NOT_NEEDED: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_NOT_PRESENT: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_NOT_WATCHING: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_RESUMED: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_RESUME_FAILED: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_PAUSE_FAILED: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_NOT_SUPPORTED: _ClassVar[DcgmOutcome]
    DCGM_OUTCOME_PAUSED: _ClassVar[DcgmOutcome]

class ArtifactKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARTIFACT_KIND_UNSPECIFIED: _ClassVar[ArtifactKind]
    ARTIFACT_KIND_DIGEST: _ClassVar[ArtifactKind]
    ARTIFACT_KIND_RAW: _ClassVar[ArtifactKind]

class SweepState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SWEEP_STATE_UNSPECIFIED: _ClassVar[SweepState]
    SWEEP_STATE_RUNNING: _ClassVar[SweepState]
    SWEEP_STATE_ANALYSING: _ClassVar[SweepState]
    SWEEP_STATE_ANALYSED: _ClassVar[SweepState]
    SWEEP_STATE_PARTIAL: _ClassVar[SweepState]
    SWEEP_STATE_FAILED: _ClassVar[SweepState]
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_PENDING: NodeState
NODE_STATE_PAUSING_DCGM: NodeState
NODE_STATE_CAPTURING: NodeState
NODE_STATE_EXPORTING: NodeState
NODE_STATE_UPLOADING: NodeState
NODE_STATE_UPLOADED: NodeState
NODE_STATE_DCGM_RESUMED: NodeState
NODE_STATE_FAILED: NodeState
NODE_STATE_ANALYSED: NodeState
NODE_STATE_TIMED_OUT: NodeState
NODE_STATE_CANCELLED: NodeState
DCGM_OUTCOME_UNSPECIFIED: DcgmOutcome
DCGM_OUTCOME_NOT_NEEDED: DcgmOutcome
DCGM_OUTCOME_NOT_PRESENT: DcgmOutcome
DCGM_OUTCOME_NOT_WATCHING: DcgmOutcome
DCGM_OUTCOME_RESUMED: DcgmOutcome
DCGM_OUTCOME_RESUME_FAILED: DcgmOutcome
DCGM_OUTCOME_PAUSE_FAILED: DcgmOutcome
DCGM_OUTCOME_NOT_SUPPORTED: DcgmOutcome
DCGM_OUTCOME_PAUSED: DcgmOutcome
ARTIFACT_KIND_UNSPECIFIED: ArtifactKind
ARTIFACT_KIND_DIGEST: ArtifactKind
ARTIFACT_KIND_RAW: ArtifactKind
SWEEP_STATE_UNSPECIFIED: SweepState
SWEEP_STATE_RUNNING: SweepState
SWEEP_STATE_ANALYSING: SweepState
SWEEP_STATE_ANALYSED: SweepState
SWEEP_STATE_PARTIAL: SweepState
SWEEP_STATE_FAILED: SweepState

class Gpu(_message.Message):
    __slots__ = ("uuid", "name", "index")
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    name: str
    index: int
    def __init__(self, uuid: _Optional[str] = ..., name: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class LocalRank(_message.Message):
    __slots__ = ("rank", "local_rank", "pid", "gpu", "backend", "world_size", "job_id")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    pid: int
    gpu: str
    backend: str
    world_size: int
    job_id: str
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., pid: _Optional[int] = ..., gpu: _Optional[str] = ..., backend: _Optional[str] = ..., world_size: _Optional[int] = ..., job_id: _Optional[str] = ...) -> None: ...

class Versions(_message.Message):
    __slots__ = ("rankscope", "nsys", "driver", "dcgm", "nccl")
    RANKSCOPE_FIELD_NUMBER: _ClassVar[int]
    NSYS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    DCGM_FIELD_NUMBER: _ClassVar[int]
    NCCL_FIELD_NUMBER: _ClassVar[int]
    rankscope: str
    nsys: str
    driver: str
    dcgm: str
    nccl: str
    def __init__(self, rankscope: _Optional[str] = ..., nsys: _Optional[str] = ..., driver: _Optional[str] = ..., dcgm: _Optional[str] = ..., nccl: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("node", "hostname", "labels", "gpus", "ranks", "versions", "backends", "agent_time_ns", "backend_options")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    node: str
    hostname: str
    labels: _containers.ScalarMap[str, str]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    ranks: _containers.RepeatedCompositeFieldContainer[LocalRank]
    versions: Versions
    backends: _containers.RepeatedScalarFieldContainer[str]
    agent_time_ns: int
    backend_options: _containers.RepeatedCompositeFieldContainer[BackendOptions]
    def __init__(self, node: _Optional[str] = ..., hostname: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., ranks: _Optional[_Iterable[_Union[LocalRank, _Mapping]]] = ..., versions: _Optional[_Union[Versions, _Mapping]] = ..., backends: _Optional[_Iterable[str]] = ..., agent_time_ns: _Optional[int] = ..., backend_options: _Optional[_Iterable[_Union[BackendOptions, _Mapping]]] = ...) -> None: ...

class BackendOptions(_message.Message):
    __slots__ = ("backend", "options")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, backend: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterReply(_message.Message):
    __slots__ = ("agent_id", "session_token", "coordinator_time_ns", "heartbeat_interval_ms", "max_upload_bytes", "chunk_bytes", "warnings", "reconnect_within_ms")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_UPLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_WITHIN_MS_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_token: str
    coordinator_time_ns: int
    heartbeat_interval_ms: int
    max_upload_bytes: int
    chunk_bytes: int
    warnings: _containers.RepeatedScalarFieldContainer[str]
    reconnect_within_ms: int
    def __init__(self, agent_id: _Optional[str] = ..., session_token: _Optional[str] = ..., coordinator_time_ns: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., max_upload_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., warnings: _Optional[_Iterable[str]] = ..., reconnect_within_ms: _Optional[int] = ...) -> None: ...

class ArtifactRef(_message.Message):
    __slots__ = ("name", "sha256", "size", "kind", "upload_id", "ranks")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    name: str
    sha256: str
    size: int
    kind: ArtifactKind
    upload_id: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., sha256: _Optional[str] = ..., size: _Optional[int] = ..., kind: _Optional[_Union[ArtifactKind, str]] = ..., upload_id: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("agent_id", "session_token")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    session_token: str
    def __init__(self, agent_id: _Optional[str] = ..., session_token: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("agent_time_ns", "ranks")
    AGENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    agent_time_ns: int
    ranks: LocalRanks
    def __init__(self, agent_time_ns: _Optional[int] = ..., ranks: _Optional[_Union[LocalRanks, _Mapping]] = ...) -> None: ...

class LocalRanks(_message.Message):
    __slots__ = ("ranks",)
    RANKS_FIELD_NUMBER: _ClassVar[int]
    ranks: _containers.RepeatedCompositeFieldContainer[LocalRank]
    def __init__(self, ranks: _Optional[_Iterable[_Union[LocalRank, _Mapping]]] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("ping_id", "coordinator_time_ns", "agent_time_ns")
    PING_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    ping_id: int
    coordinator_time_ns: int
    agent_time_ns: int
    def __init__(self, ping_id: _Optional[int] = ..., coordinator_time_ns: _Optional[int] = ..., agent_time_ns: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("sweep_id", "state", "detail", "reason", "dcgm", "dcgm_detail", "artifacts", "agent_time_ns", "notes", "export_timeout_s")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DCGM_FIELD_NUMBER: _ClassVar[int]
    DCGM_DETAIL_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    AGENT_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    EXPORT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    state: NodeState
    detail: str
    reason: str
    dcgm: DcgmOutcome
    dcgm_detail: str
    artifacts: _containers.RepeatedCompositeFieldContainer[ArtifactRef]
    agent_time_ns: int
    notes: _containers.RepeatedScalarFieldContainer[str]
    export_timeout_s: float
    def __init__(self, sweep_id: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., detail: _Optional[str] = ..., reason: _Optional[str] = ..., dcgm: _Optional[_Union[DcgmOutcome, str]] = ..., dcgm_detail: _Optional[str] = ..., artifacts: _Optional[_Iterable[_Union[ArtifactRef, _Mapping]]] = ..., agent_time_ns: _Optional[int] = ..., notes: _Optional[_Iterable[str]] = ..., export_timeout_s: _Optional[float] = ...) -> None: ...

class AgentEvent(_message.Message):
    __slots__ = ("hello", "heartbeat", "pong", "status")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    pong: Pong
    status: NodeStatus
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., status: _Optional[_Union[NodeStatus, _Mapping]] = ...) -> None: ...

class StartCapture(_message.Message):
    __slots__ = ("sweep_id", "backend", "duration_s", "options", "upload_raw", "timeout_s", "start_at_ns", "node_clock")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_RAW_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    START_AT_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_CLOCK_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    backend: str
    duration_s: float
    options: _containers.ScalarMap[str, str]
    upload_raw: bool
    timeout_s: float
    start_at_ns: int
    node_clock: ClockEstimate
    def __init__(self, sweep_id: _Optional[str] = ..., backend: _Optional[str] = ..., duration_s: _Optional[float] = ..., options: _Optional[_Mapping[str, str]] = ..., upload_raw: _Optional[bool] = ..., timeout_s: _Optional[float] = ..., start_at_ns: _Optional[int] = ..., node_clock: _Optional[_Union[ClockEstimate, _Mapping]] = ...) -> None: ...

class ClockEstimate(_message.Message):
    __slots__ = ("offset_ns", "rtt_ns")
    OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    RTT_NS_FIELD_NUMBER: _ClassVar[int]
    offset_ns: int
    rtt_ns: int
    def __init__(self, offset_ns: _Optional[int] = ..., rtt_ns: _Optional[int] = ...) -> None: ...

class CancelCapture(_message.Message):
    __slots__ = ("sweep_id", "reason")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    reason: str
    def __init__(self, sweep_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("ping_id", "coordinator_time_ns")
    PING_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_TIME_NS_FIELD_NUMBER: _ClassVar[int]
    ping_id: int
    coordinator_time_ns: int
    def __init__(self, ping_id: _Optional[int] = ..., coordinator_time_ns: _Optional[int] = ...) -> None: ...

class CoordinatorCommand(_message.Message):
    __slots__ = ("start", "cancel", "ping")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    start: StartCapture
    cancel: CancelCapture
    ping: Ping
    def __init__(self, start: _Optional[_Union[StartCapture, _Mapping]] = ..., cancel: _Optional[_Union[CancelCapture, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ...) -> None: ...

class UploadHeader(_message.Message):
    __slots__ = ("upload_id", "sweep_id", "node", "name", "size", "sha256", "kind", "ranks", "session_token")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    sweep_id: str
    node: str
    name: str
    size: int
    sha256: str
    kind: ArtifactKind
    ranks: _containers.RepeatedScalarFieldContainer[int]
    session_token: str
    def __init__(self, upload_id: _Optional[str] = ..., sweep_id: _Optional[str] = ..., node: _Optional[str] = ..., name: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., kind: _Optional[_Union[ArtifactKind, str]] = ..., ranks: _Optional[_Iterable[int]] = ..., session_token: _Optional[str] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("header", "offset", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: UploadHeader
    offset: int
    data: bytes
    def __init__(self, header: _Optional[_Union[UploadHeader, _Mapping]] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadReply(_message.Message):
    __slots__ = ("upload_id", "committed_offset", "complete", "sha256", "deduplicated")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    committed_offset: int
    complete: bool
    sha256: str
    deduplicated: bool
    def __init__(self, upload_id: _Optional[str] = ..., committed_offset: _Optional[int] = ..., complete: _Optional[bool] = ..., sha256: _Optional[str] = ..., deduplicated: _Optional[bool] = ...) -> None: ...

class UploadQuery(_message.Message):
    __slots__ = ("upload_id", "session_token")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    session_token: str
    def __init__(self, upload_id: _Optional[str] = ..., session_token: _Optional[str] = ...) -> None: ...

class UploadStatus(_message.Message):
    __slots__ = ("upload_id", "committed_offset", "complete", "size", "sha256", "known")
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    upload_id: str
    committed_offset: int
    complete: bool
    size: int
    sha256: str
    known: bool
    def __init__(self, upload_id: _Optional[str] = ..., committed_offset: _Optional[int] = ..., complete: _Optional[bool] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ..., known: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ("labels",)
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("node", "hostname", "labels", "connected", "last_seen_ns", "registered_ns", "gpus", "ranks", "backends", "versions", "clock_known", "clock_offset_ns", "clock_rtt_ns", "sweep_id", "backend_options")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_NS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_NS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    BACKENDS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_KNOWN_FIELD_NUMBER: _ClassVar[int]
    CLOCK_OFFSET_NS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_RTT_NS_FIELD_NUMBER: _ClassVar[int]
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    BACKEND_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    node: str
    hostname: str
    labels: _containers.ScalarMap[str, str]
    connected: bool
    last_seen_ns: int
    registered_ns: int
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    ranks: _containers.RepeatedCompositeFieldContainer[LocalRank]
    backends: _containers.RepeatedScalarFieldContainer[str]
    versions: Versions
    clock_known: bool
    clock_offset_ns: int
    clock_rtt_ns: int
    sweep_id: str
    backend_options: _containers.RepeatedCompositeFieldContainer[BackendOptions]
    def __init__(self, node: _Optional[str] = ..., hostname: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., connected: _Optional[bool] = ..., last_seen_ns: _Optional[int] = ..., registered_ns: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., ranks: _Optional[_Iterable[_Union[LocalRank, _Mapping]]] = ..., backends: _Optional[_Iterable[str]] = ..., versions: _Optional[_Union[Versions, _Mapping]] = ..., clock_known: _Optional[bool] = ..., clock_offset_ns: _Optional[int] = ..., clock_rtt_ns: _Optional[int] = ..., sweep_id: _Optional[str] = ..., backend_options: _Optional[_Iterable[_Union[BackendOptions, _Mapping]]] = ...) -> None: ...

class ListNodesReply(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeInfo]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeInfo, _Mapping]]] = ...) -> None: ...

class ListArtifactsRequest(_message.Message):
    __slots__ = ("sweep_id", "kinds")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    kinds: _containers.RepeatedScalarFieldContainer[ArtifactKind]
    def __init__(self, sweep_id: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[ArtifactKind, str]]] = ...) -> None: ...

class StoredArtifact(_message.Message):
    __slots__ = ("node", "artifact")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    node: str
    artifact: ArtifactRef
    def __init__(self, node: _Optional[str] = ..., artifact: _Optional[_Union[ArtifactRef, _Mapping]] = ...) -> None: ...

class ListArtifactsReply(_message.Message):
    __slots__ = ("sweep_id", "artifacts", "upload_raw", "state")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_RAW_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    artifacts: _containers.RepeatedCompositeFieldContainer[StoredArtifact]
    upload_raw: bool
    state: SweepState
    def __init__(self, sweep_id: _Optional[str] = ..., artifacts: _Optional[_Iterable[_Union[StoredArtifact, _Mapping]]] = ..., upload_raw: _Optional[bool] = ..., state: _Optional[_Union[SweepState, str]] = ...) -> None: ...

class FetchArtifactRequest(_message.Message):
    __slots__ = ("sweep_id", "node", "name", "offset")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    node: str
    name: str
    offset: int
    def __init__(self, sweep_id: _Optional[str] = ..., node: _Optional[str] = ..., name: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class ArtifactChunk(_message.Message):
    __slots__ = ("offset", "data")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CancelSweepRequest(_message.Message):
    __slots__ = ("sweep_id", "reason")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    reason: str
    def __init__(self, sweep_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Targets(_message.Message):
    __slots__ = ("nodes", "labels", "all")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    labels: _containers.ScalarMap[str, str]
    all: bool
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., all: _Optional[bool] = ...) -> None: ...

class StartSweepRequest(_message.Message):
    __slots__ = ("targets", "duration_s", "backend", "timeout_s", "options", "upload_raw")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_RAW_FIELD_NUMBER: _ClassVar[int]
    targets: Targets
    duration_s: float
    backend: str
    timeout_s: float
    options: _containers.ScalarMap[str, str]
    upload_raw: bool
    def __init__(self, targets: _Optional[_Union[Targets, _Mapping]] = ..., duration_s: _Optional[float] = ..., backend: _Optional[str] = ..., timeout_s: _Optional[float] = ..., options: _Optional[_Mapping[str, str]] = ..., upload_raw: _Optional[bool] = ...) -> None: ...

class NodeProgress(_message.Message):
    __slots__ = ("node", "state", "detail", "reason", "dcgm", "artifacts", "updated_ns", "dcgm_detail", "digest_only")
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DCGM_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_NS_FIELD_NUMBER: _ClassVar[int]
    DCGM_DETAIL_FIELD_NUMBER: _ClassVar[int]
    DIGEST_ONLY_FIELD_NUMBER: _ClassVar[int]
    node: str
    state: NodeState
    detail: str
    reason: str
    dcgm: DcgmOutcome
    artifacts: int
    updated_ns: int
    dcgm_detail: str
    digest_only: bool
    def __init__(self, node: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., detail: _Optional[str] = ..., reason: _Optional[str] = ..., dcgm: _Optional[_Union[DcgmOutcome, str]] = ..., artifacts: _Optional[int] = ..., updated_ns: _Optional[int] = ..., dcgm_detail: _Optional[str] = ..., digest_only: _Optional[bool] = ...) -> None: ...

class Sweep(_message.Message):
    __slots__ = ("sweep_id", "state", "backend", "duration_s", "timeout_s", "created_ns", "finished_ns", "nodes", "missing", "report_path", "error", "stragglers", "slow_links", "stragglers_not_judged")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_NS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    REPORT_PATH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_FIELD_NUMBER: _ClassVar[int]
    SLOW_LINKS_FIELD_NUMBER: _ClassVar[int]
    STRAGGLERS_NOT_JUDGED_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    state: SweepState
    backend: str
    duration_s: float
    timeout_s: float
    created_ns: int
    finished_ns: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeProgress]
    missing: _containers.RepeatedScalarFieldContainer[str]
    report_path: str
    error: str
    stragglers: _containers.RepeatedCompositeFieldContainer[RankRef]
    slow_links: _containers.RepeatedCompositeFieldContainer[SlowLink]
    stragglers_not_judged: str
    def __init__(self, sweep_id: _Optional[str] = ..., state: _Optional[_Union[SweepState, str]] = ..., backend: _Optional[str] = ..., duration_s: _Optional[float] = ..., timeout_s: _Optional[float] = ..., created_ns: _Optional[int] = ..., finished_ns: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeProgress, _Mapping]]] = ..., missing: _Optional[_Iterable[str]] = ..., report_path: _Optional[str] = ..., error: _Optional[str] = ..., stragglers: _Optional[_Iterable[_Union[RankRef, _Mapping]]] = ..., slow_links: _Optional[_Iterable[_Union[SlowLink, _Mapping]]] = ..., stragglers_not_judged: _Optional[str] = ...) -> None: ...

class RankRef(_message.Message):
    __slots__ = ("rank", "node")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class SlowLink(_message.Message):
    __slots__ = ("comm_id", "op", "ranks", "busbw_gbps", "peers_busbw_gbps")
    COMM_ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    BUSBW_GBPS_FIELD_NUMBER: _ClassVar[int]
    PEERS_BUSBW_GBPS_FIELD_NUMBER: _ClassVar[int]
    comm_id: str
    op: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    busbw_gbps: float
    peers_busbw_gbps: float
    def __init__(self, comm_id: _Optional[str] = ..., op: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., busbw_gbps: _Optional[float] = ..., peers_busbw_gbps: _Optional[float] = ...) -> None: ...

class ListSweepsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ListSweepsReply(_message.Message):
    __slots__ = ("sweeps",)
    SWEEPS_FIELD_NUMBER: _ClassVar[int]
    sweeps: _containers.RepeatedCompositeFieldContainer[Sweep]
    def __init__(self, sweeps: _Optional[_Iterable[_Union[Sweep, _Mapping]]] = ...) -> None: ...

class WatchSweepRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class SweepEvent(_message.Message):
    __slots__ = ("sweep", "node", "final")
    SWEEP_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    sweep: Sweep
    node: str
    final: bool
    def __init__(self, sweep: _Optional[_Union[Sweep, _Mapping]] = ..., node: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class GetReportRequest(_message.Message):
    __slots__ = ("sweep_id",)
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    def __init__(self, sweep_id: _Optional[str] = ...) -> None: ...

class ReportReply(_message.Message):
    __slots__ = ("sweep_id", "state", "report_json", "path", "missing", "error", "raw_exports", "cancelled")
    SWEEP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RAW_EXPORTS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    sweep_id: str
    state: SweepState
    report_json: str
    path: str
    missing: _containers.RepeatedScalarFieldContainer[str]
    error: str
    raw_exports: int
    cancelled: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, sweep_id: _Optional[str] = ..., state: _Optional[_Union[SweepState, str]] = ..., report_json: _Optional[str] = ..., path: _Optional[str] = ..., missing: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ..., raw_exports: _Optional[int] = ..., cancelled: _Optional[_Iterable[str]] = ...) -> None: ...
