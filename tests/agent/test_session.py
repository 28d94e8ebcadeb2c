"""The agent's coordinator session: backoff over long outages, and a stop while registering."""

from __future__ import annotations

import logging
import threading
import time

import grpc

from rankscope.agent import session as session_mod
from rankscope.agent.session import Registration, Session, backoff_cap, backoff_delay
from rankscope.coordinator.server import create_server
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


def test_a_max_backoff_longer_than_the_coordinator_waits_is_cut_under_half_of_it(tmp_path, monkeypatch,
                                                                                 caplog) -> None:
    """--max-backoff 600 s against a coordinator that judges an agent lost after 4 s away: over
    an outage (the coordinator restarting) the waits between tries grew past the 4 s, and the
    agent was judged lost between two. Now they stay under half of what the coordinator says
    at registration, and the agent says so once."""
    caps: list[float] = []

    def spy(attempt: int, base_s: float, cap_s: float) -> float:
        caps.append(cap_s)
        return 0.05  # the test does not wait them out

    monkeypatch.setattr(session_mod, "backoff_delay", spy)
    server, port = create_server("127.0.0.1:0", tmp_path / "data", agent_lost_s=4.0, heartbeat_interval_s=1.0)
    server.start()
    connected = threading.Event()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        session = Session(channel, lambda: pb.RegisterRequest(node="n1", hostname="n1"), lambda command: None,
                          lambda registration: connected.set(), max_backoff_s=600.0)
        runner = threading.Thread(target=session.run)
        runner.start()
        try:
            assert connected.wait(20)
            server.stop(grace=0)  # the outage: every try fails from here
            deadline = time.monotonic() + 20
            while len(caps) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            session.close()
            runner.join(10)
    assert caps[:3] == [2.0, 2.0, 2.0]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "max-backoff" in r.getMessage()]
    assert said == ["--max-backoff 600s is longer than the 4s the coordinator waits for an agent away before judging "
                    "it lost: reconnecting every 2s at most"]


def test_the_backoff_is_the_agents_own_under_half_the_coordinators_wait_or_where_it_says_none() -> None:
    assert backoff_cap(30.0, 60.0) == 30.0 and backoff_cap(30.0, 30.0) == 15.0
    assert backoff_cap(600.0, 0.0) == 600.0  # a coordinator older than the announcement
    assert Registration.from_reply(pb.RegisterReply(), 0, 0).reconnect_within_s == 0.0
