"""A real coordinator on 127.0.0.1:0 and a bare-stubs agent to drive it."""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow.compute as pc
import pytest

from rankscope.analysis import digest
from rankscope.analysis.testing import SyntheticJob, host_name, synthetic_job
from rankscope.coordinator.server import CoordinatorServer, create_server
from rankscope.coordinator.store import Store
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

    def query(self, upload_id: str, token: str) -> pb.UploadStatus:
        """QueryUpload as the agent whose session token is ``token``."""
        return self.agents.QueryUpload(pb.UploadQuery(upload_id=upload_id, session_token=token), timeout=10)


def start(data_dir: Path, listen: str = "127.0.0.1:0", **settings) -> Running:
    server, port = create_server(listen, data_dir, **settings)
    server.start()
    return Running(server, port, data_dir, grpc.insecure_channel(f"127.0.0.1:{port}"))


def stop(running: Running) -> None:
    running.channel.close()
    running.server.stop(grace=0)


@pytest.fixture(scope="module")
def digests(tmp_path_factory) -> dict[str, bytes]:
    """Per node, the Parquet digest of its ranks in one synthetic 2-node job whose rank 1 is
    the straggler (rank 1 on node000)."""
    table, truth = synthetic_job(SyntheticJob(nodes=2, gpus_per_node=2, steps=20, stragglers={1: 400_000}))
    assert truth.stragglers == [1]
    out = {}
    for node in range(2):
        path = tmp_path_factory.mktemp("digests") / f"{host_name(node)}.parquet"
        digest.write(table.filter(pc.equal(table.column("host"), host_name(node))), path)
        out[host_name(node)] = path.read_bytes()
    return out


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[Running]:
    running = start(tmp_path / "data", max_upload_bytes=1 << 20)
    yield running
    stop(running)


def sweep_on(running: Running, *nodes: str) -> str:
    """A running sweep naming ``nodes`` (registered; named, a node whose agent is away is
    waited for), for uploads to go into: the coordinator refuses those of a sweep it never started."""
    reply = running.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=nodes), duration_s=60,
                                                           backend="sim"), timeout=10)
    return reply.sweep_id


def header(data: bytes, *, node: str, token: str, sweep_id: str, name: str = "rank0.digest.parquet",
           upload_id: str = "u1", sha256: str | None = None, size: int | None = None,
           ranks: tuple[int, ...] = ()) -> pb.UploadHeader:
    return pb.UploadHeader(
        upload_id=upload_id, sweep_id=sweep_id, node=node, name=name,
        size=len(data) if size is None else size,
        sha256=hashlib.sha256(data).hexdigest() if sha256 is None else sha256,
        kind=pb.ARTIFACT_KIND_DIGEST, ranks=ranks, session_token=token,
    )


def chunks(head: pb.UploadHeader, data: bytes, start: int = 0, size: int = 64 << 10) -> Iterator[pb.UploadChunk]:
    """The header at ``start``, then ``data[start:]`` in chunks of ``size``."""
    yield pb.UploadChunk(header=head, offset=start)
    for offset in range(start, len(data), size):
        yield pb.UploadChunk(offset=offset, data=data[offset:offset + size])


def stored_files(data_dir: Path) -> list[Path]:
    """Every file under the artifact store (objects and partial uploads)."""
    return sorted(p for p in (data_dir / "artifacts").rglob("*") if p.is_file())


def recorded_uploads(data_dir: Path) -> list[tuple[str, str, str, str]]:
    """Completed uploads in the coordinator's state."""
    store = Store(data_dir / "state.sqlite")
    try:
        return store.uploads()
    finally:
        store.close()


class FakeAgent:
    """An agent speaking the wire with bare stubs: the test decides every event it sends."""

    def __init__(self, running: Running, node: str, *, clock_skew_ns: int = 0, **labels: str) -> None:
        reply = running.register(node, **labels)
        self.running, self.node, self.skew = running, node, clock_skew_ns
        self.token, self.agent_id = reply.session_token, reply.agent_id
        self.events: queue.Queue = queue.Queue()
        self.commands: queue.Queue = queue.Queue()
        self.events.put(pb.AgentEvent(hello=pb.Hello(agent_id=self.agent_id, session_token=self.token)))
        self.call = running.agents.Session(self._drain())
        self.connected = threading.Event()  # the coordinator pings as soon as the session is live
        self.silent = threading.Event()  # set: pings go unanswered, the stream open (its node cut off)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        assert self.connected.wait(20), f"{node}: no session"

    def _drain(self) -> Iterator[pb.AgentEvent]:
        while (event := self.events.get()) is not None:
            yield event

    def _read(self) -> None:
        try:
            for command in self.call:
                if command.HasField("ping"):
                    self.connected.set()
                    if self.silent.is_set():
                        continue
                    self.events.put(pb.AgentEvent(pong=pb.Pong(
                        ping_id=command.ping.ping_id, coordinator_time_ns=command.ping.coordinator_time_ns,
                        agent_time_ns=time.time_ns() + self.skew)))
                else:
                    self.commands.put(command)
        except grpc.RpcError:
            pass

    def next_command(self, timeout: float = 20.0) -> pb.CoordinatorCommand:
        return self.commands.get(timeout=timeout)

    def status(self, sweep_id: str, state: int, **fields) -> None:
        self.events.put(pb.AgentEvent(status=pb.NodeStatus(sweep_id=sweep_id, state=state, **fields)))

    def upload(self, sweep_id: str, name: str, data: bytes, ranks: tuple[int, ...] = ()) -> pb.ArtifactRef:
        """``ranks``: those the upload says it holds, in its header and in the reference to it (as the agent)."""
        head = header(data, node=self.node, token=self.token, sweep_id=sweep_id, name=name,
                      upload_id=f"{sweep_id}.{self.node}.{name}", ranks=ranks)
        reply = self.running.agents.Upload(chunks(head, data), timeout=20)
        assert reply.complete
        return pb.ArtifactRef(name=name, sha256=reply.sha256, size=len(data), kind=pb.ARTIFACT_KIND_DIGEST,
                              upload_id=head.upload_id, ranks=ranks)

    def finish(self, sweep_id: str, digest: bytes | pb.ArtifactRef, notes: tuple[str, ...] = (),
               ranks: tuple[int, ...] = ()) -> pb.ArtifactRef:
        """The states of a whole capture, with the digest uploaded between them (a reference
        given: reported uploaded, nothing sent); ``notes``, what the capture went on without,
        sent from the export on (as the agent does); ``ranks``, those its upload names. The
        reference reported."""
        for state in (pb.NODE_STATE_PENDING, pb.NODE_STATE_PAUSING_DCGM, pb.NODE_STATE_CAPTURING):
            self.status(sweep_id, state)
        for state in (pb.NODE_STATE_EXPORTING, pb.NODE_STATE_UPLOADING):
            self.status(sweep_id, state, notes=notes)
        ref = digest if isinstance(digest, pb.ArtifactRef) else self.upload(
            sweep_id, f"{self.node}.digest.parquet", digest, ranks)
        self.status(sweep_id, pb.NODE_STATE_UPLOADED, artifacts=[ref], notes=notes)
        self.status(sweep_id, pb.NODE_STATE_DCGM_RESUMED, dcgm=pb.DCGM_OUTCOME_NOT_NEEDED, notes=notes)
        return ref

    def close(self) -> None:
        """Half-close, so every queued event reaches the coordinator before the session ends."""
        self.events.put(None)
        self.reader.join(timeout=10)
        self.call.cancel()


@pytest.fixture
def wire():
    """The helpers above, for test modules (importlib mode cannot import conftest)."""
    import types

    return types.SimpleNamespace(header=header, sweep_on=sweep_on, chunks=chunks, start=start, stop=stop,
                                 stored_files=stored_files, recorded_uploads=recorded_uploads,
                                 FakeAgent=FakeAgent, real_agent=real_agent)


def real_agent(address: str, tmp_path: Path, files=None):
    """A real node agent (sim backend, no DCGM) dialling ``address`` on a thread of its own."""
    from rankscope.agent.agent import Agent, AgentConfig
    from rankscope.agent.dcgm import DcgmConfig

    config = AgentConfig(coordinator=address, name="tls-node", spool=tmp_path / "spool", work_dir=tmp_path / "work",
                         backends=("sim",), dcgm=DcgmConfig(mode="none"), max_backoff_s=0.2, tls=files)
    agent = Agent(config)
    threading.Thread(target=agent.run, daemon=True).start()
    return agent
