"""A coordinator address whose port is something else: an HTTP/1 server, or a gRPC server
with no rankscope service. gRPC calls the first unreachable (with an HTTP/2 parsing error)
and answers the second UNIMPLEMENTED; the command and the agent say what is there."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rankscope.cli import main


@pytest.fixture
def http1_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@contextmanager
def _grpc_port(*add: Callable[[grpc.Server], None]) -> Iterator[str]:
    """A gRPC server on loopback with what ``add`` puts on it; its address."""
    server = grpc.server(futures.ThreadPoolExecutor(2))
    for put in add:
        put(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=0)


@pytest.fixture
def other_grpc_port():
    with _grpc_port(lambda server: health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)) as address:
        yield address


def test_an_http1_port_is_named_as_no_grpc_server(http1_port, capsys) -> None:
    assert main(["sweeps", "--coordinator", http1_port]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rankscope: error: coordinator at {http1_port} answers, but neither in HTTP/2 nor in TLS: "
        "no gRPC server listens there (check the port)")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_an_http1_port_is_no_grpc_server_to_a_tls_client_too(http1_port, tmp_path, capsys) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                    "-days", "1", "-subj", "/CN=test CA"], cwd=tmp_path, check=True, capture_output=True)
    assert main(["sweeps", "--coordinator", http1_port, "--tls-ca", str(tmp_path / "ca.pem")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rankscope: error: coordinator at {http1_port} answers, but neither in HTTP/2 nor in TLS: "
        "no gRPC server listens there (check the port)")


def test_another_grpc_service_is_named_as_no_coordinator(other_grpc_port, capsys) -> None:
    assert main(["sweeps", "--coordinator", other_grpc_port]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rankscope: error: coordinator at {other_grpc_port} is no rankscope coordinator: it answered "
        "'Method not found!' (check the port)")


@pytest.mark.parametrize("port, said", [
    ("http1_port", "UNAVAILABLE: the coordinator answers, but neither in HTTP/2 nor in TLS: no gRPC server listens "
                   "there (check the port)"),
    ("other_grpc_port", "UNIMPLEMENTED: the server there is no rankscope coordinator: it answered "
                        "'Method not found!' (check the port)"),
])
def test_the_agent_says_once_what_answers_at_its_coordinator_address(port, said, request, wire, tmp_path, caplog) -> None:
    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "rankscope.agent.session" and r.levelname == "WARNING"]

    agent = wire.real_agent(request.getfixturevalue(port), tmp_path)
    try:
        deadline = time.monotonic() + 20
        while not warned() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not agent.registered.wait(1)  # and it keeps trying, quietly
    finally:
        agent.session.close()
    assert warned() == [f"coordinator session: {said}"]


@pytest.fixture
def older_coordinator_port():
    """A coordinator of an older rankscope: its sweep service serving, without the calls added since."""
    from rankscope.proto.v1 import rankscope_pb2 as pb
    from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

    class Older(pb_grpc.SweepServiceServicer):
        def ListSweeps(self, request, context):
            return pb.ListSweepsReply()

    checks = health.HealthServicer()
    checks.set("rankscope.v1.SweepService", health_pb2.HealthCheckResponse.SERVING)
    with _grpc_port(lambda server: health_pb2_grpc.add_HealthServicer_to_server(checks, server),
                    lambda server: pb_grpc.add_SweepServiceServicer_to_server(Older(), server)) as address:
        yield address


def test_a_call_an_older_coordinator_lacks_is_named_as_version_skew(older_coordinator_port, capsys) -> None:
    # It said "is no rankscope coordinator ... (check the port)" of the right port.
    from rankscope import __version__

    assert main(["sweeps", "--coordinator", older_coordinator_port]) == 0
    assert main(["nodes", "--coordinator", older_coordinator_port]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rankscope: error: coordinator at {older_coordinator_port} has no ListNodes: it runs a rankscope older than "
        f"this client's {__version__} (upgrade it, or use a client of its version)")
