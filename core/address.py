"""HOST:PORT network addresses, as the coordinator listens on and agents and Ray dial."""

from __future__ import annotations

import socket


MAX_PORT = 65535


def host_port(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (an IPv6 host in brackets) as (host, port); None where it is not one,
    as where the port is beyond `MAX_PORT` (the socket layer would take it modulo 65536:
    :99999 listened on 34463), or where the host holds a slash or a space (a URL's
    ``http://``, a pasted blank), which only fails later as a name no resolver knows. So
    does an IPv6 host without its brackets (gRPC reads ``::1:7443`` as the address
    ::1:7443, port 443, and fails to bind it after the coordinator opened its state), and
    a name the resolver cannot encode (a label over 63 characters: Python's resolver
    raises UnicodeError there, not socket.gaierror)."""
    host, sep, port = address.rpartition(":")
    if not (host and sep and port.isdigit()) or int(port) > MAX_PORT:
        return None
    if "/" in host or any(c.isspace() for c in host):
        return None
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed:
        return None
    host = host[1:-1] if bracketed else host
    try:
        host.encode("idna")
    except UnicodeError:
        return None
    return host, int(port)


def dial_problem(address: str) -> str | None:
    """What is wrong with ``address`` as a coordinator to dial; None where it is HOST:PORT
    or one of gRPC's ``unix:`` targets."""
    if host_port(address) is None and not address.startswith("unix:"):
        return f"must be HOST:PORT, the port at most {MAX_PORT}"
    return None


def bind_problem(address: str) -> str | None:
    """Why no TCP listener can bind ``address`` (HOST:PORT) now, in the system's words
    (address in use, not a local address, unknown host); None where one can. gRPC only
    logs that reason and raises a bare "Failed to bind". Like gRPC, one bindable address
    of those the host resolves to is enough."""
    parsed = host_port(address)
    if parsed is None:
        return "not HOST:PORT"
    host, port = parsed
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host} ({exc.strerror})"
    problem = "the host resolves to no address"
    for family, kind, proto, _, sockaddr in resolved:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                problem = (exc.strerror or str(exc)).lower()
                continue
        return None
    return problem
