"""load_digests with the Ray engine: the same digests as the local engine (one Ray start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analysis import engine, sources

ray = pytest.importorskip("ray")

DSL = "nsys/dsl_2node_2rank_allreduce"


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_ray_engine_gives_the_local_digest_table(samples: Path, monkeypatch) -> None:
    paths = sorted((samples / DSL).glob("*.sqlite"))
    local = sources.load_digests(paths)
    monkeypatch.setattr(sources, "TASK_CHUNK", 1)  # one task per file: the chunks really split
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = sources.load_digests(paths, map_engine=engine.create("ray"))
    finally:
        ray.shutdown()
    assert remote.column("rank").to_pylist() == [0, 1]
    assert remote.equals(local)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "ray://127.0.0.1:{port}"])
def test_a_ray_address_nobody_answers_fails_at_once(address: str) -> None:
    """Ray would retry for a minute or more; the engine says so in one line first."""
    from rankscope.errors import TransportError

    address = address.format(port=_closed_port())
    with pytest.raises(TransportError, match=f"no Ray cluster answers at {address}"):
        engine.create("ray", address=address)
    assert not ray.is_initialized()


def test_a_ray_address_without_the_ray_engine_is_a_usage_error() -> None:
    from rankscope.errors import ConfigError

    with pytest.raises(ConfigError, match="--ray-address is for --engine ray"):
        engine.create("local", address="127.0.0.1:6379")


@pytest.mark.parametrize("address", ["garbage", "localhost", "localhost:63x", "127.0.0.1:99999"])
def test_a_ray_address_of_the_wrong_form_is_refused_in_one_line(address: str, monkeypatch) -> None:
    # Ray's own parse failed with a traceback (ValueError), or retried for minutes (:99999).
    from rankscope.errors import ConfigError

    with pytest.raises(ConfigError, match=f"Ray address {address!r}: expected HOST:PORT"):
        engine.create("ray", address=address)
    monkeypatch.setenv("RAY_ADDRESS", address)  # the one Ray would read for itself
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        engine.create("ray")
    assert not ray.is_initialized()


@pytest.fixture()
def listening():
    """HOST:PORT of a socket that accepts connections, as a Ray head's port would."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield f"127.0.0.1:{listener.getsockname()[1]}"


def test_something_else_on_the_port_is_given_up_on_not_waited_for(monkeypatch, listening) -> None:
    # An HTTP server on the port: TCP answers, ray.init then retried for 8 minutes and more.
    from rankscope.errors import TransportError

    hung = []
    monkeypatch.setattr(engine, "JOIN_TIMEOUT_S", 0.2)
    monkeypatch.setattr(ray, "init", lambda **kwargs: hung.append(kwargs) or __import__("time").sleep(5))
    with pytest.raises(TransportError, match=f"no Ray cluster answered at {listening} within 0.2s"):
        engine.create("ray", address=listening)
    assert hung and hung[0]["address"] == listening


def test_files_given_by_relative_path_are_read_where_a_task_runs_elsewhere(samples: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    # A Ray worker of a cluster runs in its own folder: `job/rank0.sqlite` was not found there.
    import os

    class Elsewhere(engine.Engine):
        def map(self, fn, items):
            for item in items:
                here = os.getcwd()
                os.chdir(tmp_path)
                try:
                    yield fn(item)
                finally:
                    os.chdir(here)

    monkeypatch.chdir(samples / DSL)
    names = sorted(p.name for p in Path(".").glob("*.sqlite"))
    remote = sources.load_digests(names, map_engine=Elsewhere())
    assert remote.equals(sources.load_digests(names))
    assert remote.column("source_file").to_pylist() == names


def _add_one(x: int) -> int:
    return x + 1


@pytest.mark.ray
@pytest.mark.timeout(180)
def test_a_local_cluster_runs_its_tasks_and_ray_says_nothing(monkeypatch, capfd) -> None:
    # Started on a thread of its own, the cluster ran no task: 60 s, then Ray ended the process.
    # Ray printed its token-authentication and SIGTERM-handler warnings into the report's terminal.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_engine = engine.create("ray")
    try:
        assert list(ray_engine.map(_add_one, [1, 2])) == [2, 3]
    finally:
        ray_engine.shutdown()
    err = capfd.readouterr().err
    assert "Token authentication" not in err and "SIGTERM" not in err


def test_a_local_cluster_is_started_on_the_calling_thread(monkeypatch) -> None:
    import threading

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    threads = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: threads.append(threading.current_thread()))
    engine.create("ray")
    assert threads == [threading.current_thread()]


def _refusing_init(**kwargs) -> None:
    """ray.init joining a token-authenticated cluster with the wrong token, as Ray 2.60
    fails: the GCS's AuthenticationError only as text, in a RuntimeError, in a ConnectionError."""
    import traceback

    try:
        raise ray.exceptions.AuthenticationError("RPC error: InvalidAuthToken: Authentication token is missing or incorrect")
    except ray.exceptions.AuthenticationError:
        last = traceback.format_exc()
    try:
        raise RuntimeError(f"Failed to connect to GCS. Last connection error: {last}")
    except RuntimeError as gcs:
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}") from gcs


@pytest.mark.skipif(not hasattr(ray.exceptions, "AuthenticationError"), reason="Ray without token authentication")
def test_a_token_the_cluster_refuses_is_said_so_not_as_a_connection_failure(monkeypatch, listening) -> None:
    from rankscope.errors import ConfigError

    monkeypatch.setattr(ray, "init", _refusing_init)
    with pytest.raises(ConfigError, match=f"the Ray cluster at {listening} refused this client's authentication "
                                          "token: run with RAY_AUTH_MODE=token"):
        engine.create("ray", address=listening)


def test_a_cluster_that_fails_otherwise_is_still_a_failure_to_join(monkeypatch, listening) -> None:
    from rankscope.errors import TransportError

    def away(**kwargs) -> None:
        raise ConnectionError(f"Failed to connect to Ray cluster at {kwargs['address']}") from RuntimeError("GCS gone")

    monkeypatch.setattr(ray, "init", away)
    with pytest.raises(TransportError, match=f"cannot join the Ray cluster at {listening}"):
        engine.create("ray", address=listening)
