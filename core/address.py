"""HOST:PORT network addresses, as the coordinator listens on and agents and Ray dial."""

from __future__ import annotations


def host_port(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (an IPv6 host in brackets) as (host, port); None where it is not one."""
    host, sep, port = address.rpartition(":")
    if not (host and sep and port.isdigit()):
        return None
    return host.removeprefix("[").removesuffix("]"), int(port)
