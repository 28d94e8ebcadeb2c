"""Resumable uploads through the real Upload RPC: resume at the committed offset, stored once."""

from __future__ import annotations

import errno
import hashlib
import os
import time
from collections.abc import Iterator

import grpc
import pytest

from rankscope.coordinator import artifacts as art
from rankscope.proto.v1 import rankscope_pb2 as pb

DATA = os.urandom(700_000)


def broken_after(messages: Iterator[pb.UploadChunk], count: int, running, token: str,
                 upload_id: str = "u1") -> Iterator[pb.UploadChunk]:
    """The first ``count`` messages, then (once the coordinator has all of them) the client dies mid-stream."""
    sent = 0
    for i, message in enumerate(messages):
        if i == count:
            while running.query(upload_id, token).committed_offset < sent:
                time.sleep(0.01)
            raise RuntimeError("agent killed")
        sent = message.offset + len(message.data)
        yield message


def test_upload_resumes_from_the_committed_offset_and_is_stored_once(coordinator, wire) -> None:
    token = coordinator.register("node-a").session_token
    sweep_id = wire.sweep_on(coordinator, "node-a")
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id)
    with pytest.raises(grpc.RpcError):
        coordinator.agents.Upload(broken_after(wire.chunks(head, DATA), 4, coordinator, token), timeout=10)  # header + 3 chunks

    status = coordinator.query("u1", token)
    assert status.known and not status.complete
    assert status.committed_offset == 3 * (64 << 10)

    reply = coordinator.agents.Upload(wire.chunks(head, DATA, start=status.committed_offset), timeout=10)
    assert reply.complete and reply.sha256 == hashlib.sha256(DATA).hexdigest()
    assert not reply.deduplicated
    objects = wire.stored_files(coordinator.data_dir)
    assert [p.name for p in objects] == [reply.sha256]
    assert objects[0].read_bytes() == DATA

    second = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, upload_id="u2")
    again = coordinator.agents.Upload(wire.chunks(second, DATA), timeout=10)
    assert again.complete and again.deduplicated
    assert wire.stored_files(coordinator.data_dir) == objects
    done = coordinator.query("u1", token)
    assert done.complete and done.committed_offset == len(DATA)


def test_upload_resumes_after_a_coordinator_restart(tmp_path, wire) -> None:
    running = wire.start(tmp_path / "data")
    token = running.register("node-a").session_token
    head = wire.header(DATA, node="node-a", token=token, sweep_id=wire.sweep_on(running, "node-a"))
    with pytest.raises(grpc.RpcError):
        running.agents.Upload(broken_after(wire.chunks(head, DATA), 6, running, token), timeout=10)
    wire.stop(running)

    running = wire.start(tmp_path / "data")
    try:
        status = running.query("u1", token)
        assert status.committed_offset == 5 * (64 << 10)
        reply = running.agents.Upload(wire.chunks(head, DATA, start=status.committed_offset), timeout=10)
        assert reply.complete and reply.sha256 == hashlib.sha256(DATA).hexdigest()
        assert [p.read_bytes() for p in wire.stored_files(running.data_dir)] == [DATA]
    finally:
        wire.stop(running)


def test_unknown_upload_starts_at_zero(coordinator) -> None:
    token = coordinator.register("node-a").session_token
    status = coordinator.query("never", token)
    assert not status.known and status.committed_offset == 0


@pytest.mark.parametrize("direct", [True, False])
def test_an_upload_resumed_past_several_writes_is_stored_whole(tmp_path, wire, monkeypatch, direct: bool) -> None:
    """Direct writes, or buffered ones that start the disk's writeback every few chunks: nothing is lost."""
    monkeypatch.setattr("rankscope.coordinator.artifacts.WRITEBACK_BYTES", 100_000)
    if not direct:
        monkeypatch.setattr("rankscope.coordinator.artifacts._open_direct", lambda path: None)
    running = wire.start(tmp_path / "data")
    try:
        token = running.register("node-a").session_token
        head = wire.header(DATA, node="node-a", token=token, sweep_id=wire.sweep_on(running, "node-a"))
        with pytest.raises(grpc.RpcError):
            running.agents.Upload(broken_after(wire.chunks(head, DATA), 4, running, token), timeout=10)
        status = running.query("u1", token)
        assert status.committed_offset == 3 * (64 << 10)
        reply = running.agents.Upload(wire.chunks(head, DATA, start=status.committed_offset), timeout=10)
        assert reply.complete and reply.sha256 == hashlib.sha256(DATA).hexdigest()
        assert [p.read_bytes() for p in wire.stored_files(running.data_dir)] == [DATA]
    finally:
        wire.stop(running)


def test_a_full_disk_refuses_the_upload_as_resource_exhausted_and_a_retry_resumes(coordinator, wire, monkeypatch,
                                                                                  caplog) -> None:
    token = coordinator.register("node-a").session_token
    head = wire.header(DATA, node="node-a", token=token, sweep_id=wire.sweep_on(coordinator, "node-a"))
    written = art.PartFile.write
    room = {"bytes": 200_000}

    def write(part, data):  # the disk fills after 200 kB
        if len(data) > room["bytes"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        room["bytes"] -= len(data)
        return written(part, data)

    monkeypatch.setattr(art.PartFile, "write", write)
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.agents.Upload(wire.chunks(head, DATA), timeout=10)
    full = f"coordinator storage is full (No space left on device): free space under {coordinator.data_dir / 'artifacts'}"
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and caught.value.details() == full
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [full]  # a line, no traceback
    committed = coordinator.query("u1", token).committed_offset
    assert 0 < committed <= 200_000

    monkeypatch.setattr(art.PartFile, "write", written)  # space freed
    reply = coordinator.agents.Upload(wire.chunks(head, DATA, start=committed), timeout=10)
    assert reply.complete and reply.sha256 == hashlib.sha256(DATA).hexdigest()


def test_another_storage_error_fails_the_upload_with_its_reason_and_no_traceback(coordinator, wire, monkeypatch,
                                                                                 caplog) -> None:
    token = coordinator.register("node-a").session_token

    def broken(part, data):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(art.PartFile, "write", broken)
    head = wire.header(DATA, node="node-a", token=token, sweep_id=wire.sweep_on(coordinator, "node-a"))
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.agents.Upload(wire.chunks(head, DATA), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == "cannot store the upload (Input/output error)"
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        f"cannot store the upload under {coordinator.data_dir / 'artifacts'} (Input/output error)"]


def test_a_full_disk_is_logged_once_a_minute_not_on_every_failed_write(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(art, "_full_logged", {})
    for _ in range(5):  # upload retries, statuses, saves: all failing alike
        art.storage_full("No space left on device", tmp_path)
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 1
    monkeypatch.setattr(art, "FULL_LOG_S", 0.0)  # a minute on
    art.storage_full("No space left on device", tmp_path)
    assert len([r for r in caplog.records if r.levelname == "ERROR"]) == 2


def test_a_retry_after_a_full_disk_stored_nothing_still_completes(coordinator, wire, monkeypatch) -> None:
    """A stream the full disk refused from its first byte still hashed what it was sent: the
    next one must not count those bytes as stored (it was refused as a checksum mismatch, and
    the whole upload discarded)."""
    token = coordinator.register("node-a").session_token
    head = wire.header(DATA, node="node-a", token=token, sweep_id=wire.sweep_on(coordinator, "node-a"))
    with pytest.raises(grpc.RpcError):
        coordinator.agents.Upload(broken_after(wire.chunks(head, DATA), 4, coordinator, token), timeout=10)
    committed = coordinator.query("u1", token).committed_offset
    assert committed == 3 * (64 << 10)

    written = art.PartFile.write

    def full(part, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(art.PartFile, "write", full)
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.agents.Upload(wire.chunks(head, DATA, start=committed), timeout=10)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert coordinator.query("u1", token).committed_offset == committed

    monkeypatch.setattr(art.PartFile, "write", written)  # space freed
    reply = coordinator.agents.Upload(wire.chunks(head, DATA, start=committed), timeout=10)
    assert reply.complete and reply.sha256 == hashlib.sha256(DATA).hexdigest()
    assert [p.read_bytes() for p in wire.stored_files(coordinator.data_dir)] == [DATA]
