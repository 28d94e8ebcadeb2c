"""Where per-rank analysis work runs: in this process, or as Ray tasks.

The analysis maps per-rank work (reading an export into a digest) and reduces per
communicator and host. Only the map is distributed: its inputs are paths and its
outputs are compact digests, so nothing large crosses the object store
(deployment.md §3: pass paths, never whole exports). The same functions run under
either engine; `rankscope analyze --engine ray` selects Ray, which joins the
cluster at ``--ray-address`` (or starts a local one, the same code path).
"""

from __future__ import annotations

import socket
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from rankscope.address import host_port
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
            if address:
                check_reachable(address)
            try:
                ray.init(address=address, num_cpus=num_cpus, include_dashboard=False,
                         log_to_driver=False, configure_logging=False)
            except ConnectionError as exc:
                raise TransportError(f"cannot join the Ray cluster at {address} ({exc})") from None

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


def check_reachable(address: str) -> None:
    """Fail fast where nothing listens at a Ray ``HOST:PORT`` (or ``ray://HOST:PORT``);
    ``auto`` and other forms are left to Ray."""
    target = host_port(address.removeprefix("ray://"))
    if target is None:
        return
    try:
        socket.create_connection(target, timeout=_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise TransportError(f"no Ray cluster answers at {address} ({exc.strerror or exc})") from None


def create(name: str, *, address: str | None = None) -> Engine:
    if name == "local":
        if address:
            raise ConfigError("--ray-address is for --engine ray")
        return LocalEngine()
    if name == "ray":
        return RayEngine(address=address)
    raise ConfigError(f"unknown analysis engine {name!r} (expected local or ray)")


def with_progress(results: Iterable[R], total: int, label: str) -> Iterator[R]:
    """Yield results, drawing a one-line counter on stderr when it is a terminal."""
    show = total > 1 and sys.stderr.isatty()
    for done, result in enumerate(results, 1):
        if show:
            print(f"\r{label}: {done}/{total}", end="", file=sys.stderr, flush=True)
        yield result
    if show:
        print(file=sys.stderr)
