"""The upload client against an in-process Upload/QueryUpload server that breaks on demand.

The server here is a minimal model of the coordinator's offset rules (the real one is
tested in tests/coordinator and end to end in tests/integration): it commits every
chunk it receives, refuses a chunk at the wrong offset, verifies the sha256 at the end.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from rankscope.agent.uploader import Artifact, Uploader, sha256_of, upload_id
from rankscope.errors import TransportError, UploadRejected
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc


class Store(pb_grpc.AgentServiceServicer):
    def __init__(self) -> None:
        self.data: dict[str, bytearray] = {}
        self.headers: dict[str, pb.UploadHeader] = {}
        self.complete: dict[str, str] = {}
        self.break_after: list[int] = []  # per Upload call: abort after this many data chunks
        self.first_offsets: list[int] = []
        self.busy = 0  # answer this many Upload calls with RESOURCE_EXHAUSTED
        self.calls = 0
        self.query_tokens: list[str] = []  # the session token of every QueryUpload, in order
        self.lock = threading.Lock()

    def QueryUpload(self, request, context):
        uid = request.upload_id
        self.query_tokens.append(request.session_token)
        with self.lock:
            if uid not in self.headers:
                return pb.UploadStatus(upload_id=uid, known=False)
            return pb.UploadStatus(upload_id=uid, known=True, committed_offset=len(self.data[uid]),
                                   complete=uid in self.complete, size=self.headers[uid].size,
                                   sha256=self.complete.get(uid, ""))

    def Upload(self, request_iterator, context):
        self.calls += 1
        if self.busy:
            self.busy -= 1
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many concurrent RPCs")
        limit = self.break_after.pop(0) if self.break_after else None
        first = next(request_iterator)
        header = first.header
        uid = header.upload_id
        with self.lock:
            self.headers.setdefault(uid, header)
            buf = self.data.setdefault(uid, bytearray())
            if first.offset != len(buf):
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "wrong first offset")
            self.first_offsets.append(first.offset)
        for n, chunk in enumerate(request_iterator):
            if limit is not None and n >= limit:
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection lost (test)")
            with self.lock:
                if chunk.offset != len(buf):
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "chunk at wrong offset")
                buf.extend(chunk.data)
        if len(buf) == header.size:
            digest = hashlib.sha256(buf).hexdigest()
            if digest != header.sha256:
                context.abort(grpc.StatusCode.DATA_LOSS, "sha256 mismatch")
            self.complete[uid] = digest
            return pb.UploadReply(upload_id=uid, committed_offset=len(buf), complete=True, sha256=digest)
        return pb.UploadReply(upload_id=uid, committed_offset=len(buf))


@pytest.fixture()
def server():
    store = Store()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_AgentServiceServicer_to_server(store, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield store, channel
    channel.close()
    srv.stop(0)


@pytest.fixture()
def blob(tmp_path: Path) -> Path:
    path = tmp_path / "r0.sqlite"
    path.write_bytes(os.urandom(5 * 65536 + 123))
    return path


def test_uploads_in_chunks_and_the_coordinator_verifies_the_sha(server, blob: Path) -> None:
    store, channel = server
    done = Uploader(channel, chunk_bytes=65536).upload(Artifact(blob, "sweep-1", "node-a", ranks=(0, 1)))
    assert store.data[done.upload_id] == blob.read_bytes()
    assert done.sha256 == hashlib.sha256(blob.read_bytes()).hexdigest() == store.complete[done.upload_id]
    assert done.resumed_from == 0 and done.ref().ranks == [0, 1]


def test_a_broken_stream_resumes_from_the_committed_offset(server, blob: Path) -> None:
    store, channel = server
    store.break_after = [2, 1]
    done = Uploader(channel, chunk_bytes=65536, backoff_s=0.01).upload(Artifact(blob, "s", "n"))
    assert store.first_offsets == [0, 2 * 65536, 3 * 65536]
    assert bytes(store.data[done.upload_id]) == blob.read_bytes()


def test_a_new_uploader_resumes_what_an_old_one_left(server, blob: Path) -> None:
    """What an agent restarted mid-upload does: query first, send only the rest."""
    store, channel = server
    store.break_after = [3]
    stop = threading.Event()
    first = Uploader(channel, chunk_bytes=65536, max_attempts=1, stop=stop)
    with pytest.raises(TransportError):
        first.upload(Artifact(blob, "s", "n"))
    done = Uploader(channel, chunk_bytes=65536).upload(Artifact(blob, "s", "n"))
    assert done.resumed_from == 3 * 65536
    assert bytes(store.data[done.upload_id]) == blob.read_bytes()


def test_every_query_carries_the_current_session_token(server, blob: Path) -> None:
    """The coordinator answers QueryUpload only to the agent of the upload's node; a retry
    after a re-registration asks with the token it issued then."""
    store, channel = server
    store.break_after = [2]
    tokens = iter(["tok-1", "tok-2"])
    Uploader(channel, session_token=lambda: next(tokens), chunk_bytes=65536, backoff_s=0.01).upload(
        Artifact(blob, "s", "n"))
    assert store.query_tokens == ["tok-1", "tok-2"]


def test_a_complete_upload_is_not_sent_again(server, blob: Path) -> None:
    store, channel = server
    art = Artifact(blob, "s", "n")
    Uploader(channel, chunk_bytes=65536).upload(art)
    calls = len(store.first_offsets)
    again = Uploader(channel, chunk_bytes=65536).upload(art)
    assert len(store.first_offsets) == calls and again.resumed_from == blob.stat().st_size


def test_a_complete_upload_stored_under_another_sha256_is_refused(server, blob: Path) -> None:
    """An upload id names only the first 16 hex digits of the file's sha256: a coordinator
    answering "complete" for it with another file's digest has not got this file."""
    store, channel = server
    art = Artifact(blob, "s", "n")
    first = Uploader(channel, chunk_bytes=65536).upload(art)
    store.complete[first.upload_id] = hashlib.sha256(b"another file").hexdigest()
    with pytest.raises(UploadRejected, match=f"coordinator stored upload {first.upload_id} with sha256 "
                                             f"{store.complete[first.upload_id]}, expected {first.sha256}"):
        Uploader(channel, chunk_bytes=65536).upload(art)


def test_a_refusal_is_final(server, blob: Path, monkeypatch) -> None:
    store, channel = server
    art = Artifact(blob, "s", "n")
    # The coordinator computes a different checksum than the header claims.
    monkeypatch.setattr("rankscope.agent.uploader.sha256_of", lambda p: "0" * 64)
    with pytest.raises(UploadRejected, match="DATA_LOSS"):
        Uploader(channel, chunk_bytes=65536).upload(art)
    assert len(store.first_offsets) == 1


def test_upload_ids_are_stable_and_safe(blob: Path) -> None:
    art = Artifact(blob, "sweep/../x", "node a", ranks=())
    uid = upload_id(art, sha256_of(blob))
    assert uid == upload_id(Artifact(blob, "sweep/../x", "node a"), sha256_of(blob))
    assert set(uid) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    assert "/" not in uid and ".." not in uid and uid.startswith("sweep_x.node_a.r0_sqlite.")


def test_upload_ids_of_long_node_names_stay_within_the_coordinators_limit(tmp_path: Path) -> None:
    """A node name may run to 253 characters, and the digest is named after the node too: a
    120-character one made an id of 294, which the coordinator refuses."""
    from rankscope.coordinator.artifacts import UploadHeader, check_header

    ids = []
    for node in ("n" * 119 + "a", "n" * 119 + "b"):
        path = tmp_path / f"{node}.digest.parquet"
        path.write_bytes(b"same bytes")
        sha = sha256_of(path)
        uid = upload_id(Artifact(path, "20261201-120000-abcd", node), sha)
        assert uid == upload_id(Artifact(path, "20261201-120000-abcd", node), sha)
        check_header(UploadHeader(uid, "20261201-120000-abcd", node, path.name, 10, sha, "digest"), 1 << 20)
        ids.append(uid)
    assert ids[0] != ids[1]


def test_unreachable_coordinator_gives_up_with_a_transport_error(blob: Path) -> None:
    channel = grpc.insecure_channel("127.0.0.1:1")
    with pytest.raises(TransportError, match="did not complete after 2 attempts"):
        Uploader(channel, max_attempts=2, backoff_s=0.01).upload(Artifact(blob, "s", "n"))


def test_over_the_coordinators_limit_is_refused_before_sending(server, blob: Path) -> None:
    store, channel = server
    with pytest.raises(UploadRejected, match="over the coordinator's upload limit"):
        Uploader(channel, max_bytes=1000).upload(Artifact(blob, "s", "n"))
    assert store.calls == 0


def test_a_busy_coordinator_is_retried_but_not_forever(server, blob: Path) -> None:
    store, channel = server
    store.busy = 2
    done = Uploader(channel, chunk_bytes=65536, backoff_s=0.01).upload(Artifact(blob, "s", "n"))
    assert store.calls == 3 and bytes(store.data[done.upload_id]) == blob.read_bytes()
    store.busy = 100
    with pytest.raises(UploadRejected, match="RESOURCE_EXHAUSTED"):
        Uploader(channel, backoff_s=0.01).upload(Artifact(blob, "s2", "n"))
    assert store.calls == 3 + 4


def test_a_known_sha256_is_not_computed_again(server, blob: Path, monkeypatch) -> None:
    store, channel = server
    digest = sha256_of(blob)
    monkeypatch.setattr("rankscope.agent.uploader.sha256_of", lambda p: pytest.fail("hashed the file again"))
    done = Uploader(channel, chunk_bytes=65536).upload(Artifact(blob, "s", "n"), sha256=digest)
    assert done.sha256 == digest == store.complete[done.upload_id]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc >= 2.33 only")
def test_an_uploader_keeps_chunk_sized_buffers_in_the_heap(server) -> None:
    """Not mmapped and unmapped per chunk, which costs page faults on every chunk."""
    _, channel = server
    Uploader(channel)
    mallinfo2 = ctypes.CDLL(None).mallinfo2
    mallinfo2.restype = _Mallinfo2
    before = mallinfo2().hblks
    chunks = [os.urandom(1 << 20) for _ in range(4)]
    assert mallinfo2().hblks == before and len(chunks) == 4


def test_the_rate_limit_paces_every_chunk_before_it_goes_across_files(server, blob: Path, tmp_path: Path,
                                                                      monkeypatch) -> None:
    # The pause came after a chunk: a file of one chunk (a digest), and each file's first
    # chunk, went out at line speed whatever the limit. On a clock that moves only as the
    # uploader waits, the waits add up to every byte sent before the last chunk, at the
    # limit: the second file's one chunk waits for the first file's bytes.
    import rankscope.agent.uploader as uploader_mod

    clock = [1000.0]

    class Waits(threading.Event):
        def wait(self, timeout=None) -> bool:
            clock[0] += timeout
            return False

    monkeypatch.setattr(uploader_mod.time, "monotonic", lambda: clock[0])
    other = tmp_path / "r1.sqlite"
    other.write_bytes(os.urandom(40_000))  # one chunk
    rate = 100_000.0
    up = Uploader(server[1], chunk_bytes=1 << 20, rate_limit_bps=rate, stop=Waits())
    up.upload(Artifact(blob, "s", "n"))
    up.upload(Artifact(other, "s", "n"))
    assert clock[0] - 1000.0 == pytest.approx(blob.stat().st_size / rate)
