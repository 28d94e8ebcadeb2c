"""A real coordinator on 127.0.0.1:0 and a bare-stubs agent to drive it."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from rankscope.coordinator.server import CoordinatorServer, create_server
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc


@dataclass
class Running:
    server: CoordinatorServer
    port: int
    data_dir: Path
    channel: grpc.Channel

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def agents(self) -> pb_grpc.AgentServiceStub:
        return pb_grpc.AgentServiceStub(self.channel)

    @property
    def sweeps(self) -> pb_grpc.SweepServiceStub:
        return pb_grpc.SweepServiceStub(self.channel)

    def register(self, node: str, **labels: str) -> pb.RegisterReply:
        return self.agents.Register(pb.RegisterRequest(node=node, hostname=node, labels=labels), timeout=10)


def start(data_dir: Path, **settings) -> Running:
    server, port = create_server("127.0.0.1:0", data_dir, **settings)
    server.start()
    return Running(server, port, data_dir, grpc.insecure_channel(f"127.0.0.1:{port}"))


def stop(running: Running) -> None:
    running.channel.close()
    running.server.stop(grace=0)


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Running]:
    running = start(tmp_path / "data", max_upload_bytes=1 << 20)
    yield running
    stop(running)


def header(data: bytes, *, node: str, token: str, name: str = "rank0.digest.parquet", upload_id: str = "u1",
           sha256: str | None = None, size: int | None = None) -> pb.UploadHeader:
    return pb.UploadHeader(
        upload_id=upload_id, sweep_id="s1", node=node, name=name,
        size=len(data) if size is None else size,
        sha256=hashlib.sha256(data).hexdigest() if sha256 is None else sha256,
        kind=pb.ARTIFACT_KIND_DIGEST, session_token=token,
    )


def chunks(head: pb.UploadHeader, data: bytes, start: int = 0, size: int = 64 << 10) -> Iterator[pb.UploadChunk]:
    """The header at ``start``, then ``data[start:]`` in chunks of ``size``."""
    yield pb.UploadChunk(header=head, offset=start)
    for offset in range(start, len(data), size):
        yield pb.UploadChunk(offset=offset, data=data[offset:offset + size])


def stored_files(data_dir: Path) -> list[Path]:
    """Every file under the artifact store (objects and partial uploads)."""
    return sorted(p for p in (data_dir / "artifacts").rglob("*") if p.is_file())


@pytest.fixture
def wire():
    """The helpers above, for test modules (importlib mode cannot import conftest)."""
    import types

    return types.SimpleNamespace(header=header, chunks=chunks, start=start, stop=stop, stored_files=stored_files)
