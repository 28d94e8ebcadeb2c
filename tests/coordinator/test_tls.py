"""The coordinator's port with TLS and client certificates (mTLS), certificates made by openssl."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from rankscope.coordinator.client import SweepClient
from rankscope.tls import TlsFiles, channel, refusal
from rankscope.errors import ConfigError, TransportError
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1, one for the name rankscope-coordinator alone,
    a client certificate, and node-a's (its CN, and gpu-a.cluster among its subject
    alternative names), all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=rankscope test CA", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    (d / "node.ext").write_text("subjectAltName=DNS:gpu-a.cluster\n")
    (d / "named.ext").write_text("subjectAltName=DNS:rankscope-coordinator\n")  # as in-cluster: its Service's name
    for name, cn in (("server", "server"), ("client", "client"), ("node", "node-a"), ("named", "rankscope-coordinator")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=d)
        extra = ["-extfile", f"{name}.ext"] if name != "client" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)
    return d


@pytest.fixture
def secure(tmp_path, wire, pki):
    running = wire.start(tmp_path / "data", tls_cert=pki / "server.pem", tls_key=pki / "server.key",
                         tls_client_ca=pki / "ca.pem")
    yield running
    wire.stop(running)


def test_a_client_with_a_certificate_from_the_ca_is_served(secure, pki) -> None:
    files = TlsFiles(cert=pki / "client.pem", key=pki / "client.key", ca=pki / "ca.pem")
    with SweepClient(secure.address, files) as client:
        assert client.sweeps() == []
    with channel(secure.address, files) as ch:
        reply = pb_grpc.AgentServiceStub(ch).Register(pb.RegisterRequest(node="node-a"), timeout=10)
    assert reply.agent_id and reply.session_token


def test_a_client_without_a_certificate_is_refused_and_told_what_to_pass(secure, pki) -> None:
    with SweepClient(secure.address, TlsFiles(ca=pki / "ca.pem")) as client:
        with pytest.raises(ConfigError, match="requires a client certificate: pass --tls-cert and --tls-key"):
            client.sweeps()


@pytest.fixture
def plaintext(tmp_path, wire):
    running = wire.start(tmp_path / "plain")
    yield running
    wire.stop(running)


@pytest.fixture
def server_tls_only(tmp_path, wire, pki):
    running = wire.start(tmp_path / "tls", tls_cert=pki / "server.pem", tls_key=pki / "server.key")
    yield running
    wire.stop(running)


def test_client_tls_settings_that_do_not_fit_the_port_are_named_with_the_fix(secure, plaintext, server_tls_only,
                                                                          pki, tmp_path) -> None:
    """gRPC says "Socket closed" or an OpenSSL code: the client's own handshake says which fix."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.pem", "-days", "2",
             "-subj", "/CN=another CA", cwd=tmp_path)
    ca = TlsFiles(ca=pki / "ca.pem")
    mine = TlsFiles(cert=pki / "client.pem", key=pki / "client.key", ca=pki / "ca.pem")
    cases = [
        (secure.address, None, "it serves TLS: pass --tls-ca"),
        (server_tls_only.address, TlsFiles(), "it serves TLS: pass --tls-ca"),
        (plaintext.address, ca, "it serves plaintext, not TLS: drop --tls-ca"),
        (server_tls_only.address, TlsFiles(ca=tmp_path / "other.pem"),
         f"its certificate does not verify against the CA in {tmp_path / 'other.pem'} (unable to get local issuer"),
        (secure.address, TlsFiles(cert=tmp_path / "other.pem", key=tmp_path / "other.key", ca=pki / "ca.pem"),
         f"it refused the client certificate {tmp_path / 'other.pem'}"),
    ]
    for address, files, fix in cases:
        with SweepClient(address, files) as client:
            with pytest.raises(ConfigError) as caught:
                client.sweeps()
        assert str(caught.value).startswith(f"coordinator at {address} refuses this client's TLS settings: {fix}")
    # Settings that fit, and a port nobody listens on, get no advice.
    assert [refusal(a, f, "this client") for a, f in ((secure.address, mine), (server_tls_only.address, ca),
                                                          (plaintext.address, None))] == [None, None, None]
    with SweepClient("127.0.0.1:1") as client:
        with pytest.raises(TransportError, match="unreachable"):
            client.sweeps()


def test_a_plaintext_client_is_refused(secure) -> None:
    with grpc.insecure_channel(secure.address) as ch:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.SweepServiceStub(ch).ListSweeps(pb.ListSweepsRequest(), timeout=5)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_tls_settings_must_come_in_pairs(tmp_path, wire, pki) -> None:
    with pytest.raises(ConfigError, match="both a certificate and its private key"):
        wire.start(tmp_path / "data", tls_cert=pki / "server.pem")
    with pytest.raises(ConfigError, match="cannot read the TLS private key"):
        wire.start(tmp_path / "data", tls_cert=pki / "server.pem", tls_key=tmp_path / "missing.key")


def test_files_that_are_not_pem_or_not_a_pair_are_named_before_any_handshake(tmp_path, wire, pki) -> None:
    """gRPC takes such bytes as they are, then logs C-core lines at the first handshake."""
    (tmp_path / "notes.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'notes.pem'}: not a PEM CA certificate"):
        channel("127.0.0.1:1", TlsFiles(ca=tmp_path / "notes.pem"))
    with pytest.raises(ConfigError, match=rf"^{pki / 'client.pem'}: not a PEM certificate with its private key "
                                          rf"{pki / 'server.key'} \(KEY_VALUES_MISMATCH\)$"):
        channel("127.0.0.1:1", TlsFiles(ca=pki / "ca.pem", cert=pki / "client.pem", key=pki / "server.key"))
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'notes.pem'}: not a PEM certificate with its private key"):
        wire.start(tmp_path / "data", tls_cert=tmp_path / "notes.pem", tls_key=pki / "server.key")


def test_a_key_named_with_a_newline_is_shown_quoted_in_the_coordinators_one_line(tmp_path, pki, capsys) -> None:
    from rankscope.cli import main

    # `coordinator --tls-key $'other\n.key'`, the key of another certificate, named the key
    # "other .key" (the newline made a space): another file
    key = tmp_path / "other\n.key"
    shutil.copy(pki / "client.key", key)
    assert main(["coordinator", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data"),
                 "--tls-cert", str(pki / "server.pem"), "--tls-key", str(key)]) == 2
    assert capsys.readouterr().err == (f"rankscope: error: {pki / 'server.pem'}: not a PEM certificate with its private "
                                       f"key '{tmp_path}/other\\n.key' (KEY_VALUES_MISMATCH)\n")


@pytest.mark.parametrize("content", [b"", bytes(range(256))], ids=["empty", "binary"])
def test_a_ca_file_empty_or_not_text_is_named_not_a_traceback_or_the_systems_cas(tmp_path, wire, pki, content) -> None:
    # An empty one passed the check (and was then read as no CA); a binary one raised TypeError.
    ca = tmp_path / "ca.pem"
    ca.write_bytes(content)
    with pytest.raises(ConfigError, match=f"^{ca}: not a PEM CA certificate"):
        channel("127.0.0.1:1", TlsFiles(ca=ca))
    with pytest.raises(ConfigError, match=f"^{ca}: not a PEM CA certificate"):
        wire.start(tmp_path / "data", tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=ca)
    assert not (tmp_path / "data").exists()


def test_an_agent_dials_a_mtls_coordinator_with_its_certificate(secure, pki, tmp_path, wire) -> None:
    agent = wire.real_agent(secure.address, tmp_path, TlsFiles(cert=pki / "client.pem", key=pki / "client.key", ca=pki / "ca.pem"))
    try:
        assert agent.registered.wait(20), "the agent never registered over mTLS"
    finally:
        agent.session.close()


def test_an_agent_without_a_certificate_is_not_let_in_and_says_why(secure, pki, tmp_path, caplog, wire) -> None:
    agent = wire.real_agent(secure.address, tmp_path, TlsFiles(ca=pki / "ca.pem"))
    try:
        assert not agent.registered.wait(3)
    finally:
        agent.session.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "rankscope.agent.session" and r.levelname == "WARNING"]
    assert warned == ["coordinator session: UNAVAILABLE: the coordinator refuses this agent's TLS settings: "
                      "it requires a client certificate: pass --tls-cert and --tls-key"]


def test_a_certificate_the_client_does_not_trust_is_one_line_from_the_command(secure, pki, tmp_path) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.pem", "-days", "2",
             "-subj", "/CN=another CA", cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run([sys.executable, "-m", "rankscope", "sweeps", "--coordinator", secure.address,
                           "--tls-ca", str(tmp_path / "other.pem")], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # gRPC's own log of the failed handshake is not shown
    assert line == (f"rankscope: error: coordinator at {secure.address} refuses this client's TLS settings: its "
                    f"certificate does not verify against the CA in {tmp_path / 'other.pem'} (unable to get local "
                    "issuer certificate)")


@pytest.fixture
def node_certs(tmp_path, wire, pki):
    running = wire.start(tmp_path / "nodes", tls_cert=pki / "server.pem", tls_key=pki / "server.key",
                         tls_client_ca=pki / "ca.pem", node_certs=True)
    yield running
    wire.stop(running)


def _register(address: str, pki: Path, cert: str, node: str) -> pb.RegisterReply:
    with channel(address, TlsFiles(cert=pki / f"{cert}.pem", key=pki / f"{cert}.key", ca=pki / "ca.pem")) as ch:
        return pb_grpc.AgentServiceStub(ch).Register(pb.RegisterRequest(node=node), timeout=10)


def test_with_node_certificates_an_agent_registers_only_under_a_name_its_certificate_carries(node_certs, secure,
                                                                                             pki) -> None:
    """Any certificate the CA signed, a user's included, registered as any node: its session
    token then took that node's captures and uploaded digests in its name."""
    assert _register(node_certs.address, pki, "node", "node-a").session_token  # its CN
    assert _register(node_certs.address, pki, "node", "gpu-a.cluster").session_token  # a subject alternative name
    for cert, node, names in (("node", "node-b", "gpu-a.cluster, node-a"), ("client", "node-a", "client")):
        with pytest.raises(grpc.RpcError) as refused:
            _register(node_certs.address, pki, cert, node)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details().startswith(f"node {node!r} is none of the names in this agent's certificate "
                                                  f"({names}): with node certificates")
    assert _register(secure.address, pki, "client", "node-b").session_token  # without: one certificate serves the fleet


def test_an_agent_registering_under_another_nodes_name_stops_with_one_line(node_certs, pki, tmp_path) -> None:
    # A refusal no retry mends: the agent reconnected with backoff for ever, saying so once.
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run([sys.executable, "-m", "rankscope", "agent", "--coordinator", node_certs.address,
                           "--name", "node-b", "--spool", str(tmp_path / "spool"), "--backend", "sim",
                           "--tls-cert", str(pki / "node.pem"), "--tls-key", str(pki / "node.key"),
                           "--tls-ca", str(pki / "ca.pem"), "--dcgm", "none"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "rankscope: error: coordinator: node 'node-b' is none of the names in this agent's certificate (gpu-a.cluster, "
        "node-a)")


def test_node_certificates_need_client_certificates(tmp_path, wire, pki) -> None:
    with pytest.raises(ConfigError, match="--node-certs needs --tls-client-ca"):
        wire.start(tmp_path / "data", tls_cert=pki / "server.pem", tls_key=pki / "server.key", node_certs=True)


def test_a_coordinator_dialled_under_another_name_than_its_certificates_is_reached_with_tls_server_name(
        tmp_path, wire, pki) -> None:
    """kubectl port-forward puts the in-cluster coordinator at localhost, a name its
    certificate does not carry: the handshake failed, with no way to say which name to check."""
    running = wire.start(tmp_path / "data", tls_cert=pki / "named.pem", tls_key=pki / "named.key")
    try:
        with SweepClient(running.address, TlsFiles(ca=pki / "ca.pem")) as client:
            with pytest.raises(ConfigError) as caught:
                client.sweeps()
        assert str(caught.value).startswith(
            f"coordinator at {running.address} refuses this client's TLS settings: its certificate is not for the "
            "name '127.0.0.1' (IP address mismatch")
        assert str(caught.value).endswith("dial a name it carries, or pass that name with --tls-server-name")
        with SweepClient(running.address, TlsFiles(ca=pki / "ca.pem", server_name="rankscope-coordinator")) as client:
            assert client.sweeps() == []
        env = {**{k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"},
               "RANKSCOPE_TLS_SERVER_NAME": "rankscope-coordinator"}
        done = subprocess.run([sys.executable, "-m", "rankscope", "sweeps", "--coordinator", running.address,
                               "--tls-ca", str(pki / "ca.pem")], capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        wire.stop(running)
