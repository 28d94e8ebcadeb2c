"""Where per-rank analysis work runs: in this process, or as Ray tasks.

The analysis maps per-rank work (reading an export into a digest) and reduces per
communicator and host. Only the map is distributed: its inputs are paths and its
outputs are compact digests, so nothing large crosses the object store
(deployment.md §3: pass paths, never whole exports). The same functions run under
either engine; `rankscope analyze --engine ray` selects Ray, which joins the
cluster at ``--ray-address`` (or starts a local one, the same code path).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, TypeVar

from rankscope.address import MAX_PORT, host_port
from rankscope.errors import ConfigError, TransportError

T = TypeVar("T")
R = TypeVar("R")


class Engine(ABC):
    """Maps a function over items, yielding results in input order."""

    @abstractmethod
    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]: ...


class LocalEngine(Engine):
    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        return (fn(item) for item in items)


class RayEngine(Engine):
    """One Ray task per item; errors raised in a task surface unchanged."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("the Ray engine needs Ray: pip install 'rankscope[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            joining = address or os.environ.get("RAY_ADDRESS")  # Ray reads the environment's itself
            # Ray's "ray" logger at ERROR (ray.init's documented logging_level): its warnings
            # (token authentication on, no SIGTERM handler) are no part of a report.
            init = partial(ray.init, address=address, num_cpus=num_cpus, include_dashboard=False,
                           log_to_driver=False, logging_level=logging.ERROR)
            if joining:
                check_reachable(joining)
                _join_within(init, joining, JOIN_TIMEOUT_S)
            else:
                init()  # here: a local cluster started on a thread that then ends never ran a task (Ray 2.60)

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        ray = self._ray
        task = ray.remote(_call)
        refs = [task.remote(fn, item) for item in items]
        for ref in refs:
            status, value = ray.get(ref)
            if status == "error":
                raise value
            yield value

    def shutdown(self) -> None:
        self._ray.shutdown()


def _call(fn: Callable[[Any], Any], item: Any) -> tuple[str, Any]:
    # Ray wraps task exceptions in RayTaskError; return them instead so typed
    # RankscopeErrors reach the CLI edge as the same one-line message.
    try:
        return "ok", fn(item)
    except Exception as exc:  # noqa: BLE001 - re-raised in the driver
        return "error", exc


# A cluster's head answers at once; Ray itself retries an unreachable one for a minute or more.
_CONNECT_TIMEOUT_S = 5.0
# Joining a cluster takes seconds; something else on the port (or a GCS that never answers)
# kept ray.init retrying for 8 minutes and more.
JOIN_TIMEOUT_S = 60.0


def check_reachable(address: str) -> None:
    """Fail fast where ``address`` is no Ray address (``HOST:PORT``, ``ray://HOST:PORT``,
    ``auto``, ``local``) or nothing listens at its ``HOST:PORT``."""
    if address in ("auto", "local"):
        return
    target = host_port(address.removeprefix("ray://"))
    if target is None:
        raise ConfigError(f"Ray address {address!r}: expected HOST:PORT (the port at most {MAX_PORT}), "
                          "ray://HOST:PORT or auto")
    try:
        socket.create_connection(target, timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise TransportError(f"no Ray cluster answers at {address} ({exc.strerror or exc})") from None


def _join_within(init: Callable[[], object], address: str, timeout_s: float) -> None:
    """Run ``ray.init`` joining ``address`` on a thread of its own and give up after ``timeout_s``."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            init()
        except BaseException as exc:  # handed to the caller, raised there
            failure.append(exc)

    thread = threading.Thread(target=run, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TransportError(f"no Ray cluster answered at {address} within {timeout_s:g}s "
                             "(is it a Ray head's port?)")
    if failure:
        exc = failure[0]
        if _token_refused(exc):
            raise ConfigError(f"the Ray cluster at {address} refused this client's authentication token: run with "
                              "RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH "
                              "or ~/.ray/auth_token") from None
        if isinstance(exc, (ConnectionError, ValueError)):  # ValueError: an address Ray cannot parse
            raise TransportError(f"cannot join the Ray cluster at {address} ({exc})") from None
        raise exc


def _token_refused(exc: BaseException | None) -> bool:
    """Whether the cluster refused the token. Ray's join keeps the GCS's AuthenticationError
    only as text (node.py's "last connection error", in the RuntimeError a ConnectionError
    wraps): its qualified name in the chain is all that tells this from a cluster away."""
    import ray.exceptions

    refused = getattr(ray.exceptions, "AuthenticationError", None)  # Ray before 2.52 has no token auth
    if refused is None:
        return False
    name = f"{refused.__module__}.{refused.__qualname__}"
    while exc is not None:
        if isinstance(exc, refused) or name in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def create(name: str, *, address: str | None = None) -> Engine:
    if name == "local":
        if address:
            raise ConfigError("--ray-address is for --engine ray")
        return LocalEngine()
    if name == "ray":
        return RayEngine(address=address)
    raise ConfigError(f"unknown analysis engine {name!r} (expected local or ray)")
