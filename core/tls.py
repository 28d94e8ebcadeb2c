"""TLS for the coordinator's port: server and channel credentials from PEM files, and the
client flags every command that dials the coordinator takes (agents and users alike).

With a client CA the server requires client certificates (mTLS, deployment.md §4):
agents and users then prove who they are with a certificate the fleet's CA signed.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from rankscope.errors import ConfigError


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for one side: its certificate and key, and the CA it trusts for the other side."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    @property
    def enabled(self) -> bool:
        return any((self.cert, self.key, self.ca))


def _read(path: Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} ({exc.strerror})", path=path) from None


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    if files.cert is None or files.key is None:
        raise ConfigError("TLS needs both a certificate and its private key (--tls-cert and --tls-key)")
    pair = (_read(files.key, "TLS private key"), _read(files.cert, "TLS certificate"))
    client_ca = _read(files.ca, "client CA certificate")
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    if (files.cert is None) != (files.key is None):
        raise ConfigError("a client certificate needs its private key and the other way round (--tls-cert, --tls-key)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(files.ca, "CA certificate"),
        private_key=_read(files.key, "TLS private key"),
        certificate_chain=_read(files.cert, "TLS certificate"),
    )


def channel(address: str, files: TlsFiles | None, options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """A secure channel where TLS files are given, else a plaintext one."""
    if files is not None and files.enabled:
        return grpc.secure_channel(address, channel_credentials(files), options=options)
    return grpc.insecure_channel(address, options=options)


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls-ca/--tls-cert/--tls-key, each defaulting to its $RANKSCOPE_TLS_* variable."""
    group = parser.add_argument_group("TLS (default: plaintext; each also from $RANKSCOPE_TLS_CA/_CERT/_KEY)")
    group.add_argument("--tls-ca", type=Path, default=_env_path("RANKSCOPE_TLS_CA"), metavar="PEM",
                       help="CA that signed the coordinator's certificate")
    group.add_argument("--tls-cert", type=Path, default=_env_path("RANKSCOPE_TLS_CERT"), metavar="PEM",
                       help="this client's certificate, where the coordinator requires one")
    group.add_argument("--tls-key", type=Path, default=_env_path("RANKSCOPE_TLS_KEY"), metavar="PEM",
                       help="this client's private key")


def client_files(args: argparse.Namespace) -> TlsFiles:
    return TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
