"""The agent's connection to the coordinator: register, then one long-lived session stream.

The agent dials out (deployment.md §4), so it works behind NAT, in pods and on Slurm
compute nodes. The stream carries events up (Hello first, heartbeats, pongs, node
statuses) and commands down (start, cancel, ping). When it breaks, the session
registers again and reopens it after an exponential backoff with jitter, forever,
until the agent stops; the agent re-reports what the coordinator may have missed.
Only one end is final: another agent taking over this node's name (ALREADY_EXISTS),
where reconnecting would take it back, and so on without end.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc

from rankscope.errors import ConfigError
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc
from rankscope.tls import not_a_coordinator

log = logging.getLogger(__name__)

# Reconnect attempts of the channel itself capped low, because our own loop already backs
# off (keepalive: `rankscope.tls.KEEPALIVE`, on every channel).
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)
REGISTER_TIMEOUT_S = 15.0  # a coordinator that takes the connection but does not answer
DEFAULT_HEARTBEAT_S = 10.0  # where the coordinator names no interval
# Heartbeats at least this often, whatever the coordinator asks: more often than asked is
# harmless, a wait past threading.TIMEOUT_MAX overflows (the heartbeat thread died on it).
MAX_HEARTBEAT_S = 3600.0
_CLOSE = object()


@dataclass(frozen=True)
class Registration:
    """What the coordinator told this agent when it registered."""

    agent_id: str
    session_token: str
    heartbeat_interval_s: float
    max_upload_bytes: int
    chunk_bytes: int
    clock_offset_ns: int  # coordinator minus agent clock, from the register round trip
    round_trip_ns: int  # that round trip: the offset is known within half of it
    # How long the coordinator waits for this agent while its session is down before judging
    # it lost (`backoff_cap`); 0: not said.
    reconnect_within_s: float = 0.0

    @classmethod
    def from_reply(cls, reply: pb.RegisterReply, sent_ns: int, received_ns: int) -> Registration:
        midpoint = (sent_ns + received_ns) // 2
        # 0 names none; below it, every wait for the next beat returned at once: a heartbeat flood
        heartbeat_s = reply.heartbeat_interval_ms / 1000 if reply.heartbeat_interval_ms > 0 else DEFAULT_HEARTBEAT_S
        return cls(
            agent_id=reply.agent_id,
            session_token=reply.session_token,
            heartbeat_interval_s=min(heartbeat_s, MAX_HEARTBEAT_S),
            max_upload_bytes=reply.max_upload_bytes,
            chunk_bytes=reply.chunk_bytes,
            clock_offset_ns=reply.coordinator_time_ns - midpoint if reply.coordinator_time_ns else 0,
            round_trip_ns=received_ns - sent_ns,
            reconnect_within_s=max(0, reply.reconnect_within_ms) / 1000,
        )


# Past any cap: 2**attempt grows without bound over a long outage (a float overflows past 1023).
_MAX_DOUBLINGS = 64


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Exponential with full jitter, so a fleet reconnecting after a coordinator restart spreads out."""
    return random.uniform(0.0, min(cap_s, base_s * 2.0 ** min(attempt, _MAX_DOUBLINGS)))


def backoff_cap(max_backoff_s: float, reconnect_within_s: float) -> float:
    """The longest wait between reconnect attempts: the agent's own ceiling, but under half the
    time the coordinator waits for it (where said), so that two tries fall within that time and
    a longer --max-backoff does not get the agent judged lost between them."""
    return min(max_backoff_s, reconnect_within_s / 2) if reconnect_within_s > 0 else max_backoff_s


class Session:
    """Keeps one agent registered and its session stream open."""

    def __init__(
        self,
        channel: grpc.Channel,
        hello: Callable[[], pb.RegisterRequest],
        on_command: Callable[[pb.CoordinatorCommand], None],
        on_connect: Callable[[Registration], None],
        *,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        stop: threading.Event | None = None,
        explain: Callable[[], str | None] = lambda: None,
        beat: Callable[[], pb.Heartbeat] = lambda: pb.Heartbeat(agent_time_ns=time.time_ns()),
    ) -> None:
        self.stub = pb_grpc.AgentServiceStub(channel)
        self.beat = beat  # each heartbeat, made as it is sent
        self.explain = explain  # why an UNAVAILABLE coordinator refuses us (`tls.refusal`), where that can be told
        self.hello = hello
        self.on_command = on_command
        self.on_connect = on_connect
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.stop = stop or threading.Event()
        self.registration: Registration | None = None
        self._outbox: queue.Queue | None = None
        self._lock = threading.Lock()
        self._call = None
        self._heard = False  # the coordinator sent something on the current session

    def send(self, event: pb.AgentEvent) -> bool:
        """Queue an event on the open stream; False while disconnected (re-reported on connect)."""
        with self._lock:
            if self._outbox is None:
                return False
            self._outbox.put(event)
            return True

    def run(self) -> None:
        """Connect, serve, reconnect; returns when ``stop`` is set."""
        failures = 0  # attempts since the coordinator last spoke on a session
        while not self.stop.is_set():
            # Only a session the coordinator spoke on ends an outage: registering is not
            # enough (a coordinator at its session limit takes the one, refuses the other).
            self._heard = False
            try:
                self._serve(self._register())
            except grpc.RpcError as exc:
                # Another agent holds the node; the node is not this agent's certificate's: no retry mends either.
                if exc.code() in (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.PERMISSION_DENIED):
                    raise ConfigError(f"coordinator: {exc.details()}") from None
                # Loud once per outage, quiet while it lasts; our own close cancels the call.
                quiet = (failures and not self._heard) or self.stop.is_set()
                hint = None if quiet or exc.code() != grpc.StatusCode.UNAVAILABLE else self.explain()
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    hint = f"the server there {not_a_coordinator(exc.details() or '')}"
                elif hint:
                    hint = f"the coordinator {hint}"
                log.log(logging.INFO if quiet else logging.WARNING, "coordinator session: %s: %s",
                        exc.code().name, hint or exc.details())
            finally:
                self._close_outbox()
            if self.stop.is_set():
                break
            failures = 1 if self._heard else failures + 1
            within = self.registration.reconnect_within_s if self.registration else 0.0
            self.stop.wait(backoff_delay(failures, self.backoff_s, backoff_cap(self.max_backoff_s, within)))

    def close(self, linger_s: float = 0.0) -> None:
        """Stop, ending the session stream at once; given ``linger_s``, once the events queued
        have gone out and the coordinator has read them (it ends the stream then), that long
        at most: a stopping agent's last statuses."""
        self.stop.set()
        self._close_outbox()  # what was queued goes first, then the stream half-closes
        with self._lock:  # after stop is set: `_serve` either saw it or has its call here to cancel
            call = self._call
        if call is None:
            return
        if linger_s > 0:
            ended = threading.Event()
            call.add_done_callback(lambda _call: ended.set())  # at once where it ended already
            ended.wait(linger_s)
        call.cancel()

    def _register(self) -> Registration:
        request = self.hello()
        sent = time.time_ns()
        reply = self.stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        registration = Registration.from_reply(reply, sent, time.time_ns())
        within, said = registration.reconnect_within_s, self.registration and self.registration.reconnect_within_s
        if self.max_backoff_s > within > 0 and within != said:  # once, not at every reconnect
            log.warning("--max-backoff %gs is longer than the %gs the coordinator waits for an agent away before "
                        "judging it lost: reconnecting every %gs at most", self.max_backoff_s, within,
                        backoff_cap(self.max_backoff_s, within))
        self.registration = registration
        for warning in reply.warnings:
            log.warning("coordinator: %s", warning)
        return registration

    def _serve(self, registration: Registration) -> None:
        outbox: queue.Queue = queue.Queue()
        outbox.put(pb.AgentEvent(hello=pb.Hello(agent_id=registration.agent_id,
                                                session_token=registration.session_token)))
        with self._lock:
            if self.stop.is_set():  # told to stop while registering: open no session
                return
            self._call = self.stub.Session(self._drain(outbox))
            self._outbox = outbox
        beat = threading.Thread(target=self._heartbeat, args=(outbox, registration.heartbeat_interval_s),
                                name="heartbeat", daemon=True)
        beat.start()
        log.info("connected to the coordinator as %s", registration.agent_id)
        self.on_connect(registration)
        for command in self._call:
            self._heard = True
            if command.HasField("ping"):
                self.send(pb.AgentEvent(pong=pb.Pong(ping_id=command.ping.ping_id,
                                                     coordinator_time_ns=command.ping.coordinator_time_ns,
                                                     agent_time_ns=time.time_ns())))
            else:
                self.on_command(command)
        if not self.stop.is_set():  # stopping, we half-closed it: the coordinator ends it once it has read all
            log.warning("coordinator closed the session stream")

    def _heartbeat(self, outbox: queue.Queue, interval_s: float) -> None:
        while not self.stop.wait(interval_s):
            with self._lock:
                if self._outbox is not outbox:
                    return
                outbox.put(pb.AgentEvent(heartbeat=self.beat()))

    def _close_outbox(self) -> None:
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(_CLOSE)
            self._outbox = None

    @staticmethod
    def _drain(outbox: queue.Queue) -> Iterator[pb.AgentEvent]:
        while True:
            event = outbox.get()
            if event is _CLOSE:
                return
            yield event
