"""The agent's coordinator session: backoff over long outages, and a stop while registering."""

from __future__ import annotations

import threading

import grpc

from rankscope.agent.session import Registration, Session, backoff_delay
from rankscope.proto.v1 import rankscope_pb2 as pb


def test_backoff_stays_under_its_cap_however_long_the_outage() -> None:
    # ~15 s a try at the default cap: attempt 1024 is about four hours of outage
    for attempt in (0, 10, 1023, 1024, 10**6):
        assert 0.0 <= backoff_delay(attempt, 0.5, 30.0) <= 30.0


class _StubStoppedWhileRegistering:
    """Register returns as the agent is told to stop (a SIGTERM during a slow Register)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.sessions_opened = 0

    def Register(self, request, timeout=None):  # noqa: N802 - the gRPC method's name
        threading.Thread(target=self.session.close).start()
        self.session.stop.wait(5)
        return pb.RegisterReply(agent_id="a", session_token="t", heartbeat_interval_ms=1000)

    def Session(self, requests):  # noqa: N802
        self.sessions_opened += 1
        raise AssertionError("a session opened after the agent was told to stop")


def test_a_stop_during_registration_opens_no_session() -> None:
    connected = []
    with grpc.insecure_channel("127.0.0.1:1") as channel:
        session = Session(channel, pb.RegisterRequest, lambda command: None, connected.append)
        stub = session.stub = _StubStoppedWhileRegistering(session)
        runner = threading.Thread(target=session.run)
        runner.start()
        runner.join(10)
    assert not runner.is_alive()
    assert stub.sessions_opened == 0 and connected == []


def test_a_heartbeat_interval_no_wait_can_take_is_not_taken_from_the_wire() -> None:
    # A negative interval made every wait return at once (a heartbeat flood on the session),
    # a huge one overflowed the heartbeat thread's wait (no heartbeats at all).
    def heartbeat_s(interval_ms: int) -> float:
        return Registration.from_reply(pb.RegisterReply(heartbeat_interval_ms=interval_ms), 0, 0).heartbeat_interval_s

    assert heartbeat_s(1500) == 1.5 and heartbeat_s(0) == heartbeat_s(-5) == 10.0
    assert heartbeat_s(2**62) == 3600.0
