"""The user's side of the coordinator: start sweeps, watch them, list them, fetch reports and artifacts.

gRPC failures come back as rankscope errors with one-line messages, so the CLI
prints them like any other user-facing error.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rankscope import __version__
from rankscope.address import dial_problem
from rankscope.states import wire_name
from rankscope.tls import TlsFiles, channel, not_a_coordinator, refusal
from rankscope.errors import CallTimedOut, ConfigError, InputError, RankscopeError, TransportError
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 30.0
# How long a watch tries again on a coordinator gone unreachable (a restart) before it gives up.
RECONNECT_S = 120.0
# The largest reply the coordinator sends and this client takes: a report's JSON is ~1.5 kB
# per rank (400 kB at 256 ranks), past gRPC's default 4 MiB limit from ~2700 ranks.
MAX_REPLY_BYTES = 256 << 20
SWEEP_SERVICE = pb.DESCRIPTOR.services_by_name["SweepService"].full_name  # rankscope.v1.SweepService
_USER_MISTAKES = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
})
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# A download's deadline counts its file at this rate (the agents' uploads assume the same).
MIN_FETCH_BPS = 1 << 20
# Chunks a download reads ahead of its writer: its memory stays a few MiB, the file any size.
FETCH_AHEAD = 8
T = TypeVar("T")


def rpc_error(address: str, exc: grpc.RpcError, tls: TlsFiles | None = None) -> RankscopeError:
    """The rankscope error for a failed call, naming the coordinator (and, where it is up but
    refuses the client's TLS settings, what to change)."""
    code, details = exc.code(), exc.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = refusal(address, tls, "this client")
        if hint:
            return ConfigError(f"coordinator at {address} {hint}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return ConfigError(f"coordinator at {address} {not_a_coordinator(details)}")
    if code in _UNREACHABLE:
        kind = CallTimedOut if code == grpc.StatusCode.DEADLINE_EXCEEDED else TransportError
        return kind(f"coordinator at {address} unreachable ({code.name.lower()}: {details})")
    if code in _USER_MISTAKES:
        return InputError(f"coordinator at {address}: {details}")
    return RankscopeError(f"coordinator at {address}: {code.name}: {details}")


def state_name(state: int) -> str:
    return wire_name(pb.SweepState, state) or "unspecified"


def node_state_name(state: int) -> str:
    return wire_name(pb.NodeState, state) or "unspecified"


def node_progress(node: pb.NodeProgress) -> tuple[str, str]:
    """(state, what it says) of a node, as progress lines show them. Past its DCGM step, the
    step's outcome: the state is DCGM_RESUMED whatever it was, and "dcgm_resumed dcgm
    not_needed" (or "resume_failed") read as a resume that never happened."""
    if node.state == pb.NODE_STATE_DCGM_RESUMED and node.dcgm:
        outcome = wire_name(pb.DcgmOutcome, node.dcgm) or "unspecified"
        return "dcgm", outcome + (f": {node.dcgm_detail}" if node.dcgm_detail else "")
    return node_state_name(node.state), node.reason or node.detail


class SweepClient:
    def __init__(self, address: str, tls: TlsFiles | None = None) -> None:
        if problem := dial_problem(address):
            raise InputError(f"coordinator address {address!r} {problem}")
        self.address = address
        self.tls = tls
        self.channel = channel(address, tls, [("grpc.max_receive_message_length", MAX_REPLY_BYTES)])
        self.stub = pb_grpc.SweepServiceStub(self.channel)
        self.closed = False  # by `close`: a watch's call then ends CANCELLED by this client's doing

    def close(self) -> None:
        self.closed = True
        self.channel.close()

    def __enter__(self) -> SweepClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self, *, nodes: Sequence[str] = (), labels: Mapping[str, str] | None = None, everything: bool = False,
              duration_s: float, backend: str = "", timeout_s: float = 0.0, options: Mapping[str, str] | None = None,
              upload_raw: bool = False) -> pb.Sweep:
        request = pb.StartSweepRequest(
            targets=pb.Targets(nodes=list(nodes), labels=dict(labels or {}), all=everything),
            duration_s=duration_s, backend=backend, timeout_s=timeout_s, options=dict(options or {}),
            upload_raw=upload_raw,
        )
        return self._call(self.stub.StartSweep, request)

    def sweeps(self, limit: int = 0) -> list[pb.Sweep]:
        return list(self._call(self.stub.ListSweeps, pb.ListSweepsRequest(limit=limit)).sweeps)

    def nodes(self, labels: Mapping[str, str] | None = None) -> list[pb.NodeInfo]:
        """The agents the coordinator knows (with all of ``labels``), by node name."""
        return list(self._call(self.stub.ListNodes, pb.ListNodesRequest(labels=dict(labels or {}))).nodes)

    def cancel(self, sweep_id: str, reason: str = "") -> pb.Sweep:
        return self._call(self.stub.CancelSweep, pb.CancelSweepRequest(sweep_id=sweep_id, reason=reason))

    def report(self, sweep_id: str) -> pb.ReportReply:
        return self._call(self.stub.GetReport, pb.GetReportRequest(sweep_id=sweep_id))

    def artifacts(self, sweep_id: str, kinds: Sequence[int] = ()) -> pb.ListArtifactsReply:
        """The sweep's stored artifacts of ``kinds`` (ArtifactKind values; every kind where empty)."""
        return self._call(self.stub.ListArtifacts, pb.ListArtifactsRequest(sweep_id=sweep_id, kinds=list(kinds)))

    def fetch(self, sweep_id: str, node: str, artifact: pb.ArtifactRef, offset: int = 0) -> Iterator[bytes]:
        """One stored artifact's bytes in order from ``offset``, read a few chunks ahead of the
        caller (`_read_aside`)."""
        reading = _Reading()
        return _read_aside(self._chunks(sweep_id, node, artifact, offset, reading), reading,
                           f"fetch-{artifact.name}", FETCH_AHEAD)

    def _chunks(self, sweep_id: str, node: str, artifact: pb.ArtifactRef, offset: int,
                reading: _Reading) -> Iterator[bytes]:
        request = pb.FetchArtifactRequest(sweep_id=sweep_id, node=node, name=artifact.name, offset=offset)
        # gRPC sets no deadline by default: the bytes asked for at the slowest rate accepted, plus slack.
        call = self.stub.FetchArtifact(request, timeout=RPC_TIMEOUT_S + (artifact.size - offset) / MIN_FETCH_BPS)
        try:
            for chunk in reading.follow(call):
                if chunk.offset != offset:
                    raise TransportError(f"coordinator at {self.address} sent {node}/{artifact.name} out of order "
                                         f"(bytes at {chunk.offset}, expected {offset})")
                offset += len(chunk.data)
                yield chunk.data
        except grpc.RpcError as exc:
            if not reading.cancelled:
                raise rpc_error(self.address, exc, self.tls) from None

    def watch(self, sweep_id: str, *, reconnect_s: float | None = None,
              on_lost: Callable[[RankscopeError, float], None] | None = None) -> Iterator[pb.SweepEvent]:
        """Progress events until the sweep is final; rides out a coordinator restart of up to
        ``reconnect_s`` (default `RECONNECT_S`), calling ``on_lost(error, reconnect_s)`` as
        each outage begins. Read on a thread of its own (`_read_aside`)."""
        watch = _Reading()
        reconnect_s = RECONNECT_S if reconnect_s is None else reconnect_s
        return _read_aside(self._events(sweep_id, reconnect_s, watch, on_lost), watch, f"watch-{sweep_id}")

    def _events(self, sweep_id: str, reconnect_s: float, watch: _Reading,
                on_lost: Callable[[RankscopeError, float], None] | None = None) -> Iterator[pb.SweepEvent]:
        lost_since: float | None = None
        while not watch.cancelled:
            try:
                for event in watch.follow(self.stub.WatchSweep(pb.WatchSweepRequest(sweep_id=sweep_id))):
                    lost_since = None
                    yield event
                    if event.final:
                        return
                lost: RankscopeError = TransportError(f"coordinator at {self.address} ended the watch of {sweep_id} early")
            except grpc.RpcError as exc:
                if watch.cancelled or self.closed:
                    return
                lost = rpc_error(self.address, exc, self.tls)
                if exc.code() == grpc.StatusCode.CANCELLED:  # not by this client: the coordinator stopped mid-watch
                    lost = TransportError(f"coordinator at {self.address} ended the watch of {sweep_id} as it stopped")
                if not isinstance(lost, TransportError):  # only being unreachable may pass
                    raise lost from None
            if lost_since is None:
                lost_since = time.monotonic()
                if on_lost is not None:
                    on_lost(lost, reconnect_s)
            if time.monotonic() - lost_since > reconnect_s:
                raise lost
            log.info("%s; watching again", lost)
            time.sleep(1.0)

    def _call(self, method, request):
        try:
            return method(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED and self._serves_sweeps():
                call = type(request).__name__.removesuffix("Request")
                raise ConfigError(f"coordinator at {self.address} has no {call}: it runs a rankscope older than this "
                                  f"client's {__version__} (upgrade it, or use a client of its version)") from None
            raise rpc_error(self.address, exc, self.tls) from None

    def _serves_sweeps(self) -> bool:
        """Whether the server's health service knows the sweep service: a rankscope coordinator
        (then one without a call is an older one), not another gRPC server."""
        request = health_pb2.HealthCheckRequest(service=SWEEP_SERVICE)
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def _read_aside(items: Iterator[T], reading: _Reading, name: str, ahead: int = 0) -> Iterator[T]:
    """``items`` (a stream's) read on a thread of its own, at most ``ahead`` of the caller (0:
    no bound), the caller waiting on a queue: a Ctrl-C then lands in that wait, never inside
    gRPC's iterator, where it leaves the call unfinished and ``channel.close()`` waiting for it
    for ever (grpc/grpc#19973: seen here, a capture --wait hung on Ctrl-C). ``reading``'s call
    is cancelled when the caller stops reading."""
    box: queue.Queue[tuple[T | None, BaseException | None]] = queue.Queue(maxsize=ahead)

    def hand(entry: tuple[T | None, BaseException | None]) -> bool:
        while not reading.cancelled:  # a full box waits for the caller, unless it stopped reading
            try:
                box.put(entry, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not hand((item, None)):
                    return
            hand((None, None))
        except BaseException as exc:  # handed to the caller, raised there
            hand((None, exc))

    threading.Thread(target=pump, name=name, daemon=True).start()
    try:
        while True:
            item, error = box.get()
            if error is not None:
                raise error
            if item is None:
                return
            yield item
    finally:
        reading.cancel()


class _Reading:
    """The call a stream is read from, to cancel from the caller's thread."""

    def __init__(self) -> None:
        self.cancelled = False
        self._call: grpc.Call | None = None
        self._lock = threading.Lock()

    def follow(self, call: grpc.Call) -> grpc.Call:
        with self._lock:
            self._call = call
            if self.cancelled:
                call.cancel()
        return call

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            if self._call is not None:
                self._call.cancel()
