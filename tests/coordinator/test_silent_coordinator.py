"""A coordinator that goes silent (its node lost: no FIN, no RST, nothing) is noticed by
keepalive: `capture --wait`'s watch ends with an error instead of waiting for ever."""

from __future__ import annotations

import socket
import threading

import pytest

from rankscope import tls
from rankscope.coordinator.client import SweepClient
from rankscope.errors import TransportError
from rankscope.proto.v1 import rankscope_pb2 as pb


class Blackhole:
    """A TCP proxy to ``upstream`` that, once silenced, forwards nothing either way and closes
    nothing, as a lost host's connections look, and takes no new connections."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.silent = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:  # closed: silenced
                return
            if self.silent.is_set():
                near.close()
                return
            far = socket.create_connection(self.upstream)
            self.sockets += [near, far]
            for src, dst in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                return
            if self.silent.is_set():
                if not data:
                    return  # the other side closed: not passed on
                continue
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)

    def silence(self) -> None:
        self.silent.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept: close alone does not
        except OSError:  # silenced already
            pass
        self.listener.close()

    def close(self) -> None:
        self.silence()
        for sock in self.sockets:
            sock.close()


@pytest.mark.timeout(60)
def test_a_watch_on_a_coordinator_gone_silent_ends_with_an_error(coordinator, wire, monkeypatch) -> None:
    monkeypatch.setattr(tls, "KEEPALIVE", (("grpc.keepalive_time_ms", 500), ("grpc.keepalive_timeout_ms", 500),
                                           ("grpc.keepalive_permit_without_calls", 1),
                                           ("grpc.http2.max_pings_without_data", 0), ("grpc.http2.ping_timeout_ms", 500)))
    agent = wire.FakeAgent(coordinator, "node-a")
    proxy = Blackhole(("127.0.0.1", coordinator.port))
    client = SweepClient(f"127.0.0.1:{proxy.port}")
    outcome: list[BaseException | None] = []
    try:
        sweep_id = client.start(nodes=["node-a"], duration_s=600.0, backend="sim").sweep_id
        events = client.watch(sweep_id, reconnect_s=0.5)
        assert next(events).sweep.state == pb.SWEEP_STATE_RUNNING
        proxy.silence()

        def read_on() -> None:
            try:
                list(events)
                outcome.append(None)  # ended without an error: not what a lost coordinator does
            except Exception as exc:  # what it raised, for the assertion to show
                outcome.append(exc)

        reader = threading.Thread(target=read_on, daemon=True)
        reader.start()
        reader.join(30)
        assert outcome, "the watch still waits on a silent coordinator"
        assert isinstance(outcome[0], TransportError), outcome[0]
        assert str(outcome[0]).startswith(f"coordinator at 127.0.0.1:{proxy.port} unreachable")
    finally:
        proxy.close()
        client.close()
        agent.close()
