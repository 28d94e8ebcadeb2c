"""Resumable chunked upload of one artifact to the coordinator.

Modelled on google.bytestream (deployment.md §4): ask the coordinator for the
committed offset first, stream 1 MiB chunks from there, and let the coordinator
verify the whole file's sha256 at the end. A broken stream, a deadline or a
coordinator restart costs only a retry from the new committed offset; a refusal
(bad name, checksum mismatch, too large) is final.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from rankscope import output
from rankscope.checksum import sha256_of
from rankscope.errors import TransportError, UploadRejected
from rankscope.memory import keep_chunk_memory
from rankscope.proto.v1 import chunks
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20  # well under gRPC's 4 MiB receive limit; Python overhead favours big chunks
# Under a rate limit a chunk is at most this long a burst at the limit (not under 64 KiB):
# a whole 1 MiB chunk at once overran a 0.2 MB/s limit by 5 s on every file.
PACED_BURST_S = 0.25
MIN_PACED_CHUNK = 64 << 10
# Statuses a retry cannot fix: the coordinator looked at the upload and said no.
FINAL = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
# RESOURCE_EXHAUSTED is both "over the size limit" (final) and "server busy" (retry):
# the agent checks the size limit itself first, so a few retries tell the two apart.
BUSY_RETRIES = 3
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")  # dots only join parts: no "..", no "/"


@dataclass(frozen=True)
class Artifact:
    """One file to upload, and how the coordinator will know it."""

    path: Path
    sweep_id: str
    node: str
    kind: int = pb.ARTIFACT_KIND_DIGEST
    ranks: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Uploaded:
    upload_id: str
    name: str
    size: int
    sha256: str
    kind: int
    ranks: tuple[int, ...]
    resumed_from: int  # committed offset found before the first byte this call sent

    def ref(self) -> pb.ArtifactRef:
        return pb.ArtifactRef(name=self.name, sha256=self.sha256, size=self.size, kind=self.kind,
                              upload_id=self.upload_id, ranks=list(self.ranks))


def upload_id(artifact: Artifact, sha256: str) -> str:
    """Stable across retries and agent restarts: the same bytes of the same capture."""
    parts = (artifact.sweep_id, artifact.node, artifact.name, sha256[:16])
    # Long node names (which the digest's name repeats) would pass the coordinator's limit.
    return output.bounded(".".join(_UNSAFE.sub("_", p).strip("_-") or "x" for p in parts), chunks.MAX_UPLOAD_ID)


class Uploader:
    """Upload artifacts over one channel, resuming each from the coordinator's committed offset."""

    def __init__(
        self,
        channel: grpc.Channel,
        *,
        session_token: str | Callable[[], str] = "",
        chunk_bytes: int = CHUNK_BYTES,
        max_attempts: int = 30,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        min_rate_bps: float = 1 << 20,
        rate_limit_bps: float | None = None,
        max_bytes: int = 0,
        stop: threading.Event | None = None,
        on_progress: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.stub = pb_grpc.AgentServiceStub(channel)
        # Upload without the stub's serializer: _chunks yields the encoded messages.
        self._send = channel.stream_unary(chunks.UPLOAD_METHOD, response_deserializer=pb.UploadReply.FromString)
        # A callable follows re-registrations: a coordinator restart may issue a new token.
        self.session_token = session_token if callable(session_token) else (lambda: session_token)
        self.chunk_bytes = chunk_bytes
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.min_rate_bps = min_rate_bps
        self.rate_limit_bps = rate_limit_bps  # keep uploads from starving the training job's network
        self._send_at = 0.0  # monotonic time the next chunk may go at the limit, over every file
        self.max_bytes = max_bytes  # the coordinator's limit (0: none known)
        self.stop = stop or threading.Event()
        self.on_progress = on_progress
        keep_chunk_memory()  # each chunk reuses freed pages instead of faulting in new ones

    def upload(self, artifact: Artifact, *, sha256: str | None = None) -> Uploaded:
        """Upload one file; ``sha256`` is its digest when the caller has it already (it saves a read of the file)."""
        size = artifact.path.stat().st_size
        digest = sha256 or sha256_of(artifact.path)
        uid = upload_id(artifact, digest)
        if self.max_bytes and size > self.max_bytes:
            raise UploadRejected(f"{size} bytes is over the coordinator's upload limit of {self.max_bytes}",
                                 path=artifact.path)
        first_offset: int | None = None
        busy = 0
        for attempt in range(self.max_attempts):
            header = pb.UploadHeader(
                upload_id=uid, sweep_id=artifact.sweep_id, node=artifact.node, name=artifact.name, size=size,
                sha256=digest, kind=artifact.kind, ranks=list(artifact.ranks), session_token=self.session_token(),
            )
            try:
                status = self.stub.QueryUpload(pb.UploadQuery(upload_id=uid, session_token=header.session_token),
                                                timeout=30)
                offset = status.committed_offset if status.known else 0
                if first_offset is None:
                    first_offset = offset
                if status.known and status.complete:
                    return self._done(uid, artifact, size, digest, status.sha256, first_offset)
                if offset:
                    log.warning("upload %s resumes at committed offset %d of %d", uid, offset, size)
                reply = self._send(self._chunks(artifact.path, header, offset, size),
                                         timeout=self._deadline(size - offset))
                if reply.complete:
                    return self._done(uid, artifact, size, digest, reply.sha256, first_offset)
                log.info("upload %s ended at %d of %d without completing; retrying", uid, reply.committed_offset, size)
            except grpc.RpcError as exc:
                code = exc.code()
                busy += code is grpc.StatusCode.RESOURCE_EXHAUSTED
                if code in FINAL or busy > BUSY_RETRIES:
                    refused = UploadRejected(f"coordinator refused upload {uid}: {code.name}: {exc.details()}",
                                             path=artifact.path)
                    # Said here too: the failed status it makes is dropped where the coordinator
                    # no longer waits for the node (its agent judged lost, say).
                    log.warning("%s", refused)
                    raise refused from None
                log.info("upload %s attempt %d: %s: %s", uid, attempt + 1, code.name, exc.details())
            if self.stop.wait(self._backoff(attempt)):
                break
        raise TransportError(f"upload {uid} did not complete after {self.max_attempts} attempts", path=artifact.path)

    def _done(self, uid: str, artifact: Artifact, size: int, digest: str, verified: str,
              first_offset: int | None) -> Uploaded:
        if verified and verified != digest:
            raise UploadRejected(f"coordinator stored upload {uid} with sha256 {verified}, expected {digest}",
                                 path=artifact.path)
        return Uploaded(uid, artifact.name, size, digest, artifact.kind, artifact.ranks, first_offset or 0)

    def _chunks(self, path: Path, header: pb.UploadHeader, offset: int, size: int) -> Iterator[bytes]:
        """The header first (at the committed offset), then the file from there, rate-limited.

        Messages go out already encoded (the Upload call has no serializer): a data chunk is
        encoded with one copy of its bytes, where building and serializing an UploadChunk
        copies them twice.
        """
        yield pb.UploadChunk(header=header, offset=offset).SerializeToString()
        rate = self.rate_limit_bps
        step = self.chunk_bytes if not rate else int(min(self.chunk_bytes, max(MIN_PACED_CHUNK, rate * PACED_BURST_S)))
        with open(path, "rb") as handle:
            handle.seek(offset)
            while offset < size and not self.stop.is_set():
                data = handle.read(min(step, size - offset))
                if not data:
                    break
                if rate:  # paced before it goes, and across files: a small file is no burst
                    now = time.monotonic()
                    if self._send_at > now and self.stop.wait(self._send_at - now):
                        break
                    self._send_at = max(now, self._send_at) + len(data) / rate
                yield chunks.encode(offset, data)
                offset += len(data)
                if self.on_progress:
                    self.on_progress(header.upload_id, offset, size)

    def _deadline(self, remaining: int) -> float:
        """gRPC sets no deadline by default: size at the slowest rate we accept, plus slack."""
        rate = min(self.min_rate_bps, self.rate_limit_bps or self.min_rate_bps)
        return 30.0 + remaining / rate

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)
