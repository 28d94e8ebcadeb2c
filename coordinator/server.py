"""The coordinator's gRPC edge: servicers that translate protobuf to Coordinator calls.

``_STATUS`` is the one place where rankscope errors become gRPC status codes.
``create_server`` binds (port 0 picks a free one, as tests do) and serves the
agent and sweep services plus the standard grpc.health.v1 service.
"""

from __future__ import annotations

import functools
import inspect
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rankscope import node_name, output, states
from rankscope.states import UnknownWireValue, wire_name, wire_value
from rankscope.address import bind_problem
from rankscope.coordinator import artifacts as art
from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.client import MAX_REPLY_BYTES
from rankscope.coordinator.config import CoordinatorConfig, resolve
from rankscope.coordinator.coordinator import (
    MAX_REASON_CHARS,
    CancelOrder,
    CaptureOrder,
    Coordinator,
    NodeView,
    NotAuthenticated,
    NotPermitted,
    UnknownArtifact,
)
from rankscope.coordinator.registry import (
    AgentRecord,
    Connection,
    NodeTakenOver,
    SessionLimit,
    UnknownAgent,
    labels_text,
)
from rankscope.coordinator.reports import Analyze
from rankscope.errors import (
    ConfigError,
    InputError,
    RankscopeError,
    ToolError,
    TransportError,
    UploadRejected,
)
from rankscope.memory import keep_chunk_memory
from rankscope.records import scalars
from rankscope.proto.v1 import chunks
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc
from rankscope.tls import TlsFiles, server_credentials

log = logging.getLogger(__name__)

SERVICES = ("rankscope.v1.AgentService", "rankscope.v1.SweepService")
MAX_RECEIVE_BYTES = 4 << 20  # gRPC's default; upload chunks stay at 1 MiB, well below it

# Most specific first: the first matching class decides the status.
_STATUS: tuple[tuple[type[RankscopeError], grpc.StatusCode], ...] = (
    (art.WrongOffset, grpc.StatusCode.FAILED_PRECONDITION),
    (art.ChecksumMismatch, grpc.StatusCode.DATA_LOSS),
    (art.TooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (art.UploadBusy, grpc.StatusCode.ABORTED),
    (art.StorageFull, grpc.StatusCode.RESOURCE_EXHAUSTED),  # gRPC's own words: "the entire file system is out of space"
    (UploadRejected, grpc.StatusCode.INVALID_ARGUMENT),
    (NotAuthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (NotPermitted, grpc.StatusCode.PERMISSION_DENIED),
    (sw.UnknownSweep, grpc.StatusCode.NOT_FOUND),
    (UnknownArtifact, grpc.StatusCode.NOT_FOUND),
    (UnknownAgent, grpc.StatusCode.NOT_FOUND),
    (NodeTakenOver, grpc.StatusCode.ALREADY_EXISTS),
    (SessionLimit, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InputError, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (TransportError, grpc.StatusCode.UNAVAILABLE),
    (ToolError, grpc.StatusCode.INTERNAL),
    (RankscopeError, grpc.StatusCode.INTERNAL),
)


def status_of(error: RankscopeError) -> grpc.StatusCode:
    return next(code for kind, code in _STATUS if isinstance(error, kind))


# A status's message travels percent-encoded in the grpc-message trailer, and a client drops
# trailers past its metadata limits (as RESOURCE_EXHAUSTED "Stream removed", the message lost):
# all of them past 16 KiB, a growing share of them past the soft limit of 8 KiB, which the
# trailer's other headers count towards too. One that echoes a request's value (a 100 kB node
# name) is cut to fit well under the soft limit.
MAX_DETAILS_BYTES = 4 << 10


def details(error: RankscopeError) -> str:
    """The error's message as its status carries it: cut, saying so, where its encoding
    would pass `MAX_DETAILS_BYTES`."""
    message = str(error)
    size = 0
    for i, char in enumerate(message):
        size += 1 if " " <= char <= "~" and char != "%" else 3 * len(char.encode("utf-8", "replace"))
        if size > MAX_DETAILS_BYTES - 100:
            return f"{message[:i]}... ({len(message)} characters, cut)"
    return message


def _mapped(method: Callable) -> Callable:
    """Abort the RPC with the error's status and one-line message (unary and streaming methods)."""
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def streaming(self, request, context):
            try:
                yield from method(self, request, context)
            except RankscopeError as exc:
                context.abort(status_of(exc), details(exc))

        return streaming

    @functools.wraps(method)
    def unary(self, request, context):
        try:
            return method(self, request, context)
        except RankscopeError as exc:
            context.abort(status_of(exc), details(exc))

    return unary


# protobuf <-> domain ------------------------------------------------------------------


def _stored(upload: art.UploadHeader) -> pb.StoredArtifact:
    return pb.StoredArtifact(node=upload.node, artifact=pb.ArtifactRef(
        name=upload.name, sha256=upload.sha256, size=upload.size, kind=wire_value(pb.ArtifactKind, upload.kind),
        upload_id=upload.upload_id, ranks=upload.ranks))


def _header(message: pb.UploadHeader) -> art.UploadHeader:
    return art.UploadHeader(
        upload_id=message.upload_id, sweep_id=message.sweep_id, node=message.node, name=message.name,
        size=message.size, sha256=message.sha256, kind=wire_name(pb.ArtifactKind, message.kind),
        ranks=tuple(message.ranks),
    )


class _UploadChunks(grpc.ServerInterceptor):
    """Serves Upload with :func:`chunks.decode` as its request deserializer."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method != chunks.UPLOAD_METHOD:
            return handler
        return grpc.stream_unary_rpc_method_handler(handler.stream_unary, request_deserializer=chunks.decode,
                                                    response_serializer=handler.response_serializer)


def _artifact(message: pb.ArtifactRef) -> sw.ArtifactInfo:
    return sw.ArtifactInfo(name=message.name, sha256=message.sha256, size=message.size,
                           kind=wire_name(pb.ArtifactKind, message.kind), upload_id=message.upload_id,
                           ranks=tuple(message.ranks))


def sweep_message(sweep: sw.Sweep) -> pb.Sweep:
    return pb.Sweep(
        sweep_id=sweep.sweep_id,
        state=wire_value(pb.SweepState, sweep.state.value),
        backend=sweep.spec.backend,
        duration_s=sweep.spec.duration_s,
        timeout_s=sweep.spec.timeout_s,
        created_ns=sweep.created_ns,
        finished_ns=sweep.finished_ns,
        nodes=[
            pb.NodeProgress(
                node=name,
                state=states.to_wire(rec.state),
                detail=rec.detail,
                reason=rec.reason,
                dcgm=wire_value(pb.DcgmOutcome, rec.dcgm),
                dcgm_detail=rec.dcgm_detail,
                artifacts=len(rec.artifacts),
                updated_ns=rec.updated_ns,
                digest_only=rec.digest_only,
            )
            for name, rec in node_name.items(sweep.nodes)
        ],
        missing=sweep.missing,
        report_path=sweep.report_path,
        error=sweep.error,
        stragglers=[pb.RankRef(rank=s.rank, node=s.node) for s in sweep.stragglers],
        slow_links=[pb.SlowLink(comm_id=link.comm_id, op=link.op, ranks=link.ranks, busbw_gbps=link.busbw_gbps,
                                peers_busbw_gbps=link.peers_busbw_gbps) for link in sweep.slow_links],
        stragglers_not_judged=sweep.stragglers_not_judged,
    )


def _node_message(view: NodeView) -> pb.NodeInfo:
    agent = view.agent
    return pb.NodeInfo(
        node=agent.node, hostname=agent.hostname, labels=agent.labels, connected=view.connected,
        last_seen_ns=agent.last_seen_ns, registered_ns=agent.registered_ns,
        gpus=[pb.Gpu(**gpu) for gpu in agent.gpus], ranks=[pb.LocalRank(**rank) for rank in agent.ranks],
        backends=agent.backends, versions=pb.Versions(**agent.versions),
        clock_known=agent.clock_offset_ns is not None, clock_offset_ns=agent.clock_offset_ns or 0,
        clock_rtt_ns=agent.rtt_ns or 0, sweep_id=view.sweep_id,
        backend_options=[pb.BackendOptions(backend=backend, options=options)
                         for backend, options in agent.capture_options.items()],
    )


def _check_certified(node: str, auth: Mapping[str, Iterable[bytes]]) -> None:
    """With node certificates, an agent registers only under its certificate's CN or one of
    its subject alternative names (gRPC's peer identities)."""
    names = {name.decode("utf-8", "replace") for key in ("x509_common_name", "x509_subject_alternative_name")
             for name in auth.get(key, ())}
    if node not in names:
        raise NotPermitted(f"node {node!r} is none of the names in this agent's certificate "
                           f"({', '.join(sorted(names)) or 'none'}): with node certificates an agent registers under "
                           "its certificate's CN or a subject alternative name (set its --name to one)")


def _command(order: object, agent: AgentRecord) -> pb.CoordinatorCommand:
    """An order as the command sent to ``agent``'s node (a capture's with that node's clock as pinged)."""
    if isinstance(order, CaptureOrder):
        spec = order.spec
        start = pb.StartCapture(
            sweep_id=order.sweep_id, backend=spec.backend, duration_s=spec.duration_s, options=dict(spec.options),
            upload_raw=spec.upload_raw, timeout_s=spec.timeout_s, start_at_ns=order.start_at_ns,
        )
        if agent.clock_offset_ns is not None:
            start.node_clock.CopyFrom(pb.ClockEstimate(offset_ns=agent.clock_offset_ns, rtt_ns=agent.rtt_ns or 0))
        return pb.CoordinatorCommand(start=start)
    if isinstance(order, CancelOrder):
        return pb.CoordinatorCommand(cancel=pb.CancelCapture(sweep_id=order.sweep_id, reason=order.reason))
    raise TypeError(f"not a command: {order!r}")


# servicers ----------------------------------------------------------------------------


# An agent's words on its node (detail, reason, notes) are stored and go out in every listing
# of the sweep: cut, not refused (they may say why a capture failed), or a few 4 MiB statuses
# would make ListSweeps' reply too large to send, as a user's cancel reason would.
MAX_NOTES = 32


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


class AgentServicer(pb_grpc.AgentServiceServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.config = coordinator.config

    @_mapped
    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterReply:
        node = request.node or request.hostname
        if self.config.node_certs:
            _check_certified(node, context.auth_context())
        agent, warnings = self.coordinator.register(
            node,
            request.hostname,
            dict(request.labels),
            gpus=[scalars(g) for g in request.gpus],
            ranks=[scalars(r) for r in request.ranks],
            versions=scalars(request.versions),
            backends=list(request.backends),
            capture_options={said.backend: list(said.options) for said in request.backend_options},
        )
        away_ms = int(min(self.config.agent_lost_s, self.config.restart_grace_s) * 1000)
        return pb.RegisterReply(
            agent_id=agent.agent_id,
            session_token=agent.token,
            coordinator_time_ns=self.coordinator.clock(),
            heartbeat_interval_ms=int(self.config.heartbeat_interval_s * 1000),
            reconnect_within_ms=away_ms,  # as heartbeat_interval_ms, within int64: the config bounds both (a day)
            max_upload_bytes=self.config.max_upload_bytes,
            chunk_bytes=self.config.chunk_bytes,
            warnings=warnings,
        )

    @_mapped
    def Session(self, request_iterator: Iterator[pb.AgentEvent], context: grpc.ServicerContext) -> Iterator[pb.CoordinatorCommand]:
        first = next(request_iterator, None)
        if first is None:
            return
        if first.WhichOneof("event") != "hello":
            raise NotAuthenticated("a session must open with Hello (agent id and session token)")
        agent = self.coordinator.authenticate(first.hello.agent_id, first.hello.session_token)
        connection = self.coordinator.connect(agent, context.peer())
        context.add_callback(connection.close)
        reader = threading.Thread(target=self._read_events, args=(request_iterator, connection),
                                  name=f"session-{agent.node}", daemon=True)
        reader.start()
        try:
            yield self._ping(connection)  # an early clock sample
            while not connection.closed.is_set():
                try:
                    order = connection.outbox.get(timeout=self.config.ping_interval_s)
                except queue.Empty:
                    yield self._ping(connection)
                    continue
                if order is None:
                    break
                yield _command(order, connection.agent)
            if connection.taken_over_by is not None:
                raise NodeTakenOver(f"node {agent.node}: a newer agent session from {connection.taken_over_by} took "
                                    "over; give each agent its own --name")
        finally:
            self.coordinator.disconnect(connection)

    def _ping(self, connection: Connection) -> pb.CoordinatorCommand:
        ping_id, sent = self.coordinator.ping(connection)
        return pb.CoordinatorCommand(ping=pb.Ping(ping_id=ping_id, coordinator_time_ns=sent))

    def _read_events(self, events: Iterator[pb.AgentEvent], connection: Connection) -> None:
        """Agent events up the stream; the session ends when they stop."""
        try:
            for event in events:
                self.coordinator.heard(connection)
                kind = event.WhichOneof("event")
                if kind == "pong":
                    self.coordinator.pong(connection, event.pong.ping_id, event.pong.agent_time_ns)
                elif kind == "status":
                    self._status(connection, event.status)
                elif kind == "heartbeat" and event.heartbeat.HasField("ranks"):
                    self.coordinator.ranks_announced(connection, [scalars(r) for r in event.heartbeat.ranks.ranks])
                # Heartbeats also keep the stream busy through proxies; pings measure the agent.
        except grpc.RpcError:
            pass  # the agent went away; back within `agent_lost_s`, or judged lost
        except RankscopeError as exc:
            log.warning("session of %s: %s", connection.node, exc)
        finally:
            connection.close()

    def _status(self, connection: Connection, status: pb.NodeStatus) -> None:
        try:
            state = states.from_wire(status.state)
            dcgm = wire_name(pb.DcgmOutcome, status.dcgm)
            artifacts = tuple(_artifact(a) for a in status.artifacts)
        except UnknownWireValue as exc:  # its news cannot be judged; the session and its later statuses go on
            log.warning("node %s: status for sweep %s ignored: %s", connection.node, status.sweep_id[:80], exc)
            return
        if state is None:
            log.warning("node %s sent a status without a state for sweep %s", connection.node, status.sweep_id)
            return
        event = sw.NodeReported(
            node=connection.node, state=state, at_ns=self.coordinator.clock(), detail=_cut(status.detail),
            reason=_cut(status.reason), dcgm=dcgm, dcgm_detail=_cut(status.dcgm_detail), artifacts=artifacts,
            notes=tuple(map(_cut, status.notes[:MAX_NOTES])), export_timeout_s=status.export_timeout_s,
        )
        self.coordinator.node_reported(connection.node, event, status.sweep_id)

    @_mapped
    def Upload(self, request_iterator: Iterator[pb.UploadChunk | chunks.DataChunk],
               context: grpc.ServicerContext) -> pb.UploadReply:
        first = next(request_iterator, None)
        if not isinstance(first, pb.UploadChunk) or not first.HasField("header"):
            raise art.BadUpload("the first upload message must carry the header")
        header = _header(first.header)
        with self.coordinator.upload(header, first.header.session_token) as writer:
            result = writer.write(first.offset, first.data)
            if result is None:
                for chunk in request_iterator:
                    # A second header would name another upload (or the same one anew) with
                    # its bytes taken as this one's: refused, not passed over.
                    if type(chunk) is not chunks.DataChunk and chunk.HasField("header"):
                        raise art.BadUpload(f"upload {header.upload_id}: only the first message carries a header")
                    result = writer.write(chunk.offset, chunk.data)
                    if result is not None:
                        break
        if result is None:
            return pb.UploadReply(upload_id=header.upload_id, committed_offset=writer.committed)
        return pb.UploadReply(upload_id=header.upload_id, committed_offset=result.committed, complete=True,
                              sha256=result.sha256, deduplicated=result.deduplicated)

    @_mapped
    def QueryUpload(self, request: pb.UploadQuery, context: grpc.ServicerContext) -> pb.UploadStatus:
        state = self.coordinator.query_upload(request.upload_id, request.session_token)
        return pb.UploadStatus(upload_id=state.upload_id, committed_offset=state.committed, complete=state.complete,
                               size=state.size, sha256=state.sha256, known=state.known)


class SweepServicer(pb_grpc.SweepServiceServicer):
    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    @_mapped
    def StartSweep(self, request: pb.StartSweepRequest, context: grpc.ServicerContext) -> pb.Sweep:
        targets = request.targets
        spec = sw.SweepSpec(
            backend=request.backend, duration_s=request.duration_s, timeout_s=request.timeout_s,
            options=dict(request.options), upload_raw=request.upload_raw, targets=_describe(targets),
        )
        sweep = self.coordinator.start_sweep(spec, names=list(targets.nodes), labels=dict(targets.labels),
                                             everything=targets.all)
        return sweep_message(sweep)

    @_mapped
    def ListSweeps(self, request: pb.ListSweepsRequest, context: grpc.ServicerContext) -> pb.ListSweepsReply:
        return pb.ListSweepsReply(sweeps=[sweep_message(s) for s in self.coordinator.sweeps(request.limit)])

    @_mapped
    def WatchSweep(self, request: pb.WatchSweepRequest, context: grpc.ServicerContext) -> Iterator[pb.SweepEvent]:
        for sweep, node in self.coordinator.watch(request.sweep_id, context.is_active):
            yield pb.SweepEvent(sweep=sweep_message(sweep), node=node, final=sweep.final)

    @_mapped
    def CancelSweep(self, request: pb.CancelSweepRequest, context: grpc.ServicerContext) -> pb.Sweep:
        return sweep_message(self.coordinator.cancel_sweep(request.sweep_id, request.reason or "cancelled"))

    @_mapped
    def GetReport(self, request: pb.GetReportRequest, context: grpc.ServicerContext) -> pb.ReportReply:
        sweep, text, path = self.coordinator.report(request.sweep_id)
        raw = self.coordinator.stored_artifacts(request.sweep_id, kinds=("raw",))
        cancelled = [name for name in sweep.missing if sweep.nodes[name].state is states.NodeState.CANCELLED]
        return pb.ReportReply(sweep_id=sweep.sweep_id, state=sweep_message(sweep).state, report_json=text, path=path,
                              missing=sweep.missing, error=sweep.error, raw_exports=len(raw), cancelled=cancelled)

    @_mapped
    def ListArtifacts(self, request: pb.ListArtifactsRequest, context: grpc.ServicerContext) -> pb.ListArtifactsReply:
        kinds = {wire_name(pb.ArtifactKind, k) for k in request.kinds}
        # The state first: a sweep ended then takes no more uploads, so the listing is its whole.
        sweep = self.coordinator.sweep(request.sweep_id)
        stored = self.coordinator.stored_artifacts(request.sweep_id, kinds=kinds)
        return pb.ListArtifactsReply(sweep_id=sweep.sweep_id, artifacts=[_stored(u) for u in stored],
                                     upload_raw=sweep.spec.upload_raw, state=wire_value(pb.SweepState, sweep.state.value))

    @_mapped
    def ListNodes(self, request: pb.ListNodesRequest, context: grpc.ServicerContext) -> pb.ListNodesReply:
        return pb.ListNodesReply(nodes=[_node_message(view) for view in self.coordinator.nodes(dict(request.labels))])

    @_mapped
    def FetchArtifact(self, request: pb.FetchArtifactRequest, context: grpc.ServicerContext) -> Iterator[pb.ArtifactChunk]:
        offset = request.offset
        for data in self.coordinator.read_artifact(request.sweep_id, request.node, request.name, offset):
            yield pb.ArtifactChunk(offset=offset, data=data)
            offset += len(data)


def _describe(targets: pb.Targets) -> str:
    if targets.nodes:
        return "nodes " + ",".join(targets.nodes)
    if targets.labels:
        return "labels " + labels_text(targets.labels)
    return "all"


# the server ---------------------------------------------------------------------------


class CoordinatorServer:
    """The gRPC server and the coordinator behind it, started and stopped together."""

    def __init__(self, server: grpc.Server, workers: futures.ThreadPoolExecutor, coordinator: Coordinator,
                 health_servicer: health.HealthServicer, port: int) -> None:
        self.server = server
        self.workers = workers  # the server's handler threads
        self.coordinator = coordinator
        self.health = health_servicer
        self.port = port

    def start(self) -> None:
        self.coordinator.start()
        self.server.start()
        for service in ("", *SERVICES):
            self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float | None = None) -> None:
        self.health.enter_graceful_shutdown()
        self.coordinator.closing()
        self.server.stop(self.coordinator.config.grace_s if grace is None else grace).wait()
        # gRPC's stop ends with the calls, not with their handlers: one cancelled at the grace's
        # end (an upload whose agent went quiet) still runs, and must not find the state closed.
        # Cancelled, each returns promptly; the process would wait for them on its way out anyway.
        self.workers.shutdown(wait=True)
        self.coordinator.stop()

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self.server.wait_for_termination(timeout)


def create_server(listen: str | None = None, data_dir: str | Path | None = None, *,
                  config: CoordinatorConfig | None = None, analyze: Analyze | None = None,
                  **settings: object) -> tuple[CoordinatorServer, int]:
    """A coordinator bound to ``listen`` (``127.0.0.1:0`` picks a port), not yet started."""
    config = config or resolve({"listen": listen, "data_dir": data_dir, **settings}, environ={})
    problem = bind_problem(config.listen)  # before any state is opened
    if problem is not None:
        raise ConfigError(f"cannot listen on {config.listen}: {problem}")
    credentials = None  # as the port: files that cannot serve TLS leave no state behind either
    if config.tls_cert is not None:
        credentials = server_credentials(TlsFiles(cert=config.tls_cert, key=config.tls_key, ca=config.tls_client_ca))
    output.make_folder(Path(config.data_dir))
    coordinator = Coordinator(config, analyze=analyze)
    keep_chunk_memory()  # upload chunks reuse freed pages instead of faulting in new ones
    workers = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="grpc")
    server = grpc.server(
        workers,
        maximum_concurrent_rpcs=config.max_workers,
        interceptors=[_UploadChunks()],
        options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.max_send_message_length", MAX_REPLY_BYTES),
            # Agents keep their session open for days: find dead peers, and accept the agents'
            # own keepalive pings (deployment.md §4: server minimum interval <= 30 s).
            ("grpc.keepalive_time_ms", 30_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # gRPC sets SO_REUSEPORT by default: a second coordinator on the same port would
            # bind too, and the kernel would share the agents' connections between the two.
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_AgentServiceServicer_to_server(AgentServicer(coordinator), server)
    pb_grpc.add_SweepServiceServicer_to_server(SweepServicer(coordinator), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in ("", *SERVICES):
        health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        if credentials is not None:
            port = server.add_secure_port(config.listen, credentials)
        else:
            port = server.add_insecure_port(config.listen)
    except RuntimeError as exc:
        coordinator.stop()
        raise ConfigError(f"cannot listen on {config.listen} ({exc})") from None
    if port == 0:
        coordinator.stop()
        raise ConfigError(f"cannot listen on {config.listen} (address in use or not local)")
    return CoordinatorServer(server, workers, coordinator, health_servicer, port), port
