"""TLS for the coordinator's port: server and channel credentials from PEM files, and the
client flags every command that dials the coordinator takes (agents and users alike).

With a client CA the server requires client certificates (mTLS, deployment.md §4):
agents and users then prove who they are with a certificate the fleet's CA signed.
"""

from __future__ import annotations

import argparse
import os
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from rankscope.address import host_port
from rankscope.cli import parse_path
from rankscope.errors import ConfigError, shown

PROBE_TIMEOUT_S = 2.0
# Every channel to the coordinator pings it while idle (deployment.md §4: 60 s, 20 s to
# answer; the coordinator permits pings every 10 s): a coordinator whose node is lost sends
# no FIN, and a stream read from it (an agent's session, a `capture --wait`) would otherwise
# wait for ever. 0: no cap on pings while no data flows (gRPC's default 2 stops at two).
KEEPALIVE = (
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", 20_000),  # any ping's answer, not 60 s: keepalive's may wait on another's
)
# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 §3.4): a plaintext
# gRPC server answers with its own SETTINGS frame (frame type 4 in the header's 4th byte).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_H2_SETTINGS = 4
_NAME_MISMATCH = (62, 64)  # OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for one side: its certificate and key, and the CA it trusts for the other
    side; for a client, the name the server's certificate must carry where it is not the
    dialled host (a port forwarded to localhost)."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    server_name: str | None = None

    @property
    def enabled(self) -> bool:
        return any((self.cert, self.key, self.ca, self.server_name))


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} ({exc.strerror})", path=path) from None


def _check_pem(files: TlsFiles) -> None:
    """Files gRPC would take as they are and refuse at the first handshake, with C-core
    log lines and no name: a CA that holds no PEM certificate, a key not of its certificate."""
    if files.ca is not None:
        # From the file, as OpenSSL reads a PEM bundle: the file's text as `cadata` passed an
        # empty file (no cadata: the system's CAs) and raised TypeError on non-ASCII bytes.
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=files.ca)
        except ssl.SSLError as exc:
            raise ConfigError(f"not a PEM CA certificate ({exc.reason or exc})", path=files.ca) from None
    if files.cert is not None and files.key is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(files.cert, files.key)
        except ssl.SSLError as exc:
            raise ConfigError(f"not a PEM certificate with its private key {shown(files.key)} ({exc.reason or exc})",
                              path=files.cert) from None


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    if files.cert is None or files.key is None:
        raise ConfigError("TLS needs both a certificate and its private key (--tls-cert and --tls-key)")
    pair = (_read(files.key, "TLS private key"), _read(files.cert, "TLS certificate"))
    client_ca = _read(files.ca, "client CA certificate")
    _check_pem(files)
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    if (files.cert is None) != (files.key is None):
        raise ConfigError("a client certificate needs its private key and the other way round (--tls-cert, --tls-key)")
    ca, key = _read(files.ca, "CA certificate"), _read(files.key, "TLS private key")
    cert = _read(files.cert, "TLS certificate")  # each unreadable file said before any parsing
    _check_pem(files)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def channel(address: str, files: TlsFiles | None, options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """A secure channel where TLS files are given, else a plaintext one; with `KEEPALIVE`."""
    options = [*KEEPALIVE, *options]
    if files is not None and files.enabled:
        if files.server_name:
            options.append(("grpc.ssl_target_name_override", files.server_name))
        return grpc.secure_channel(address, channel_credentials(files), options=options)
    return grpc.insecure_channel(address, options=options)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls-ca/--tls-cert/--tls-key/--tls-server-name, each defaulting to its $RANKSCOPE_TLS_* variable."""
    group = parser.add_argument_group("TLS (default: plaintext; each also from $RANKSCOPE_TLS_CA/_CERT/_KEY/_SERVER_NAME)")
    group.add_argument("--tls-ca", type=parse_path, default=_env_path("RANKSCOPE_TLS_CA"), metavar="PEM",
                       help="CA that signed the coordinator's certificate")
    group.add_argument("--tls-cert", type=parse_path, default=_env_path("RANKSCOPE_TLS_CERT"), metavar="PEM",
                       help="this client's certificate, where the coordinator requires one")
    group.add_argument("--tls-key", type=parse_path, default=_env_path("RANKSCOPE_TLS_KEY"), metavar="PEM",
                       help="this client's private key")
    group.add_argument("--tls-server-name", default=os.environ.get("RANKSCOPE_TLS_SERVER_NAME") or None, metavar="NAME",
                       help="the name the coordinator's certificate carries, where HOST is another (a port "
                            "forwarded to localhost: kubectl port-forward)")


def client_files(args: argparse.Namespace) -> TlsFiles:
    return TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca, server_name=args.tls_server_name)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def refusal(address: str, files: TlsFiles | None, who: str) -> str | None:
    """Why the port at ``address`` refuses ``who`` ("this client", "this agent"), found by
    speaking to it, as what follows "coordinator at ADDRESS": TLS settings that do not fit
    it (gRPC says only "Socket closed" to a plaintext client of a TLS port, or an OpenSSL
    code), or no gRPC server there at all (an HTTP/1 server, say: gRPC calls it unreachable,
    with an HTTP/2 parsing error). None where nothing answers, or the settings fit it."""
    target = host_port(address)
    if target is None:
        return None
    tls = files is not None and files.enabled
    plaintext = _speaks_plaintext_h2(*target)
    if plaintext is None:  # nothing takes the connection: gRPC's message says so
        return None
    if plaintext:
        return f"refuses {who}'s TLS settings: it serves plaintext, not TLS: drop --tls-ca, --tls-cert and --tls-key" \
            if tls else None
    if not _speaks_tls(*target):
        return "answers, but neither in HTTP/2 nor in TLS: no gRPC server listens there (check the port)"
    if tls:
        hint = _refused_tls(*target, files)
        return f"refuses {who}'s TLS settings: {hint}" if hint else None
    return (f"refuses {who}'s TLS settings: it serves TLS: pass --tls-ca with the CA that signed its certificate, "
            "and --tls-cert and --tls-key where it requires client certificates")


def not_a_coordinator(details: str) -> str:
    """What follows "coordinator at ADDRESS" where a server there answers gRPC (or HTTP/2)
    but has no rankscope service: another service's port, or a proxy in front of none."""
    return f"is no rankscope coordinator: it answered {details!r} (check the port)"


def _connect(host: str, port: int) -> socket.socket | None:
    try:
        return socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except OSError:
        return None


def _speaks_plaintext_h2(host: str, port: int) -> bool | None:
    """Whether the port answers HTTP/2 in the clear; None where nothing accepts the connection."""
    sock = _connect(host, port)
    if sock is None:
        return None
    with sock:
        try:
            sock.sendall(_H2_PREFACE)
            header = sock.recv(9)
        except OSError:
            return False
    return len(header) >= 4 and header[3] == _H2_SETTINGS


def _speaks_tls(host: str, port: int) -> bool:
    """Whether the port completes a TLS handshake (its certificate unchecked: any will do here)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    sock = _connect(host, port)
    if sock is None:
        return False
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return True
    except OSError:  # ssl.SSLError included
        return False
    finally:
        sock.close()


def _refused_tls(host: str, port: int, files: TlsFiles) -> str | None:
    """A TLS port that refuses this client: its certificate does not verify against ours, or
    it wants a client certificate we lack or it does not trust."""
    context = ssl.create_default_context(cafile=str(files.ca) if files.ca else None)  # checked: _check_pem
    if files.cert and files.key:
        context.load_cert_chain(files.cert, files.key)
    context.set_alpn_protocols(["h2"])  # gRPC drops a TLS connection that does not offer HTTP/2
    sock = _connect(host, port)
    if sock is None:
        return None
    try:
        with context.wrap_socket(sock, server_hostname=files.server_name or host) as tls:
            tls.settimeout(0.5)
            closed = tls.recv(1) == b""  # TLS 1.3 refuses a client certificate after the handshake
    except ssl.SSLCertVerificationError as exc:
        if exc.verify_code in _NAME_MISMATCH:
            return (f"its certificate is not for the name {files.server_name or host!r} ({exc.verify_message}): dial "
                    "a name it carries, or pass that name with --tls-server-name")
        trusted = f"the CA in {shown(files.ca)}" if files.ca else "the system's CAs"
        return f"its certificate does not verify against {trusted} ({exc.verify_message})"
    except ssl.SSLError:
        closed = True
    except OSError:  # a timeout: it waits for the HTTP/2 preface, as a port that takes us does
        closed = False
    finally:
        sock.close()
    if not closed:
        return None
    if files.cert is None:
        return "it requires a client certificate: pass --tls-cert and --tls-key"
    return f"it refused the client certificate {shown(files.cert)} (not signed by a CA it trusts?)"
