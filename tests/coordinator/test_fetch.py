"""`rankscope fetch`: a sweep's stored artifacts back from the coordinator, byte for byte."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import threading
from pathlib import Path

import grpc
import pytest

from rankscope.agent.uploader import Uploader
from rankscope.cli import main
from rankscope.analysis.sources import discover
from rankscope.coordinator import commands
from rankscope.coordinator.client import SweepClient
from rankscope.coordinator.coordinator import Coordinator
from rankscope.errors import InputError
from rankscope.proto.v1 import rankscope_pb2 as pb

# One simulated node of two ranks: its digest and two raw exports of about 120 kB each.
SIM = {"sim.node_index": "0", "sim.nodes": "1", "sim.gpus_per_node": "2", "sim.tp": "2", "sim.steps": "8",
       "sim.seed": "5"}
CHUNK = 16 << 10  # the coordinator's chunk size here: every raw export takes several


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, hidden ones too (a temporary file left behind would show)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def small_chunks(tmp_path: Path, wire):
    running = wire.start(tmp_path / "data", chunk_bytes=CHUNK)
    yield running
    wire.stop(running)


def sweep_of(running, agent, *, upload_raw: bool) -> str:
    """A sweep started on the fake ``agent``'s node, its StartCapture taken."""
    sweep = running.sweeps.StartSweep(pb.StartSweepRequest(
        targets=pb.Targets(nodes=[agent.node]), duration_s=60, backend="sim", upload_raw=upload_raw), timeout=10)
    assert agent.next_command().start.sweep_id == sweep.sweep_id
    return sweep.sweep_id


def end(running, sweep_id: str) -> None:
    """The sweep stopped (cancelled), as one a user fetches once it is over: it takes no more uploads."""
    running.sweeps.CancelSweep(pb.CancelSweepRequest(sweep_id=sweep_id, reason="over"), timeout=10)


def upload(wire, running, agent, sweep_id: str, name: str, data: bytes, kind: int = pb.ARTIFACT_KIND_RAW) -> str:
    """``data`` stored as the node's artifact ``name`` in the sweep; its sha256."""
    head = wire.header(data, node=agent.node, token=agent.token, sweep_id=sweep_id, name=name,
                       upload_id=f"{sweep_id}.{name}")
    head.kind = kind
    reply = running.agents.Upload(wire.chunks(head, data), timeout=20)
    assert reply.complete
    return reply.sha256


def test_fetch_downloads_what_a_real_agent_uploaded(small_chunks, wire, tmp_path, monkeypatch, capsys) -> None:
    uploaded: dict[str, bytes] = {}
    upload_file = Uploader.upload

    def recording(self, artifact, **kwargs):  # the bytes as the agent sends them: it removes its copies after
        uploaded[artifact.name] = artifact.path.read_bytes()
        return upload_file(self, artifact, **kwargs)

    monkeypatch.setattr(Uploader, "upload", recording)
    agent = wire.real_agent(small_chunks.address, tmp_path)
    try:
        assert agent.registered.wait(20), "the agent never registered"
        options = [word for key, value in SIM.items() for word in ("--option", f"{key}={value}")]
        assert main(["capture", "--coordinator", small_chunks.address, "--nodes", "tls-node", "--backend", "sim",
                     "--duration", "200ms", "--upload-raw", "--wait", "--format", "json", *options]) == 0
        out, err = capsys.readouterr()
        sweep_id = json.loads(out)["sweep"]["sweep_id"]
    finally:
        agent.session.close()
    assert sorted(uploaded) == ["sim_rank00000.sqlite", "sim_rank00001.sqlite", "tls-node.digest.parquet"]
    assert all(len(data) > CHUNK for name, data in uploaded.items() if name.startswith("sim_rank"))
    # The report's path is the coordinator's, and the line after it says how to get the raw exports here.
    hint = f"rankscope fetch --coordinator {small_chunks.address} --kind raw {sweep_id}"
    assert f"raw exports: 2 on the coordinator; {hint} downloads them into ./{sweep_id}" in err.splitlines()
    assert any(line.startswith("report on the coordinator's host: /") for line in err.splitlines())

    folder = tmp_path / "fetched"
    assert main(["fetch", "--coordinator", small_chunks.address, sweep_id, "-o", str(folder)]) == 0
    assert tree(folder) == {f"tls-node/{name}": data for name, data in uploaded.items()}
    out = capsys.readouterr().out
    assert out.startswith("fetched 3 file(s) (0.") and out.endswith(f"MiB) of sweep {sweep_id} into {folder}\n")
    # Again: every file is there with its sha256 already, and kept; bytes of a broken fetch of
    # one of them, left from before it was fetched whole, go.
    (folder / "tls-node" / ".tls-node.digest.parquet.part").write_bytes(b"PAR1")
    assert main(["fetch", "--coordinator", small_chunks.address, sweep_id, "-o", str(folder)]) == 0
    assert capsys.readouterr().out == f"fetched 0 file(s) (0.0 MiB) of sweep {sweep_id} into {folder}; 3 already there\n"
    assert tree(folder) == {f"tls-node/{name}": data for name, data in uploaded.items()}
    # The hint runs as printed: the raw exports, into ./SWEEP.
    monkeypatch.chdir(tmp_path)
    assert main(shlex.split(hint)[1:]) == 0
    assert tree(tmp_path / sweep_id) == {f"tls-node/{name}": uploaded[name] for name in ("sim_rank00000.sqlite",
                                                                                           "sim_rank00001.sqlite")}


def test_an_unknown_sweep_is_one_line_and_writes_nothing(coordinator, tmp_path, monkeypatch, capsys) -> None:
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["fetch", "--coordinator", coordinator.address, "no-such-sweep"]) == 2
    assert capsys.readouterr().err == f"rankscope: error: coordinator at {coordinator.address}: no sweep 'no-such-sweep'\n"
    assert list(here.iterdir()) == []  # no ./no-such-sweep made
    with pytest.raises(grpc.RpcError) as listed:
        coordinator.sweeps.ListArtifacts(pb.ListArtifactsRequest(sweep_id="no-such-sweep"), timeout=10)
    with pytest.raises(grpc.RpcError) as fetched:
        list(coordinator.sweeps.FetchArtifact(pb.FetchArtifactRequest(sweep_id="no-such-sweep", node="n", name="x"),
                                              timeout=10))
    for caught in (listed, fetched):
        assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.NOT_FOUND, "no sweep 'no-such-sweep'")


def test_a_file_with_other_bytes_in_the_folder_is_not_replaced_and_nothing_is_fetched(coordinator, wire, tmp_path,
                                                                                        capsys) -> None:
    """Two sweeps of one job name their files alike: the second fetched into the first's
    folder would replace its files, unseen."""
    agent = wire.FakeAgent(coordinator, "node000")
    sweeps = []
    for data in (b"first sweep's export", b"second sweep's export"):
        sweeps.append(sweep_of(coordinator, agent, upload_raw=True))
        upload(wire, coordinator, agent, sweeps[-1], "rank0.sqlite", data)
        upload(wire, coordinator, agent, sweeps[-1], f"{sweeps[-1]}.json", b"{}")  # a file the other has not
        end(coordinator, sweeps[-1])
        assert agent.next_command().cancel.sweep_id == sweeps[-1]
    agent.close()
    folder = tmp_path / "out"
    assert main(["fetch", "--coordinator", coordinator.address, sweeps[0], "-o", str(folder)]) == 0
    before = tree(folder)
    capsys.readouterr()
    assert main(["fetch", "--coordinator", coordinator.address, sweeps[1], "-o", str(folder)]) == 2
    assert capsys.readouterr().err == (f"rankscope: error: {folder}/node000/rank0.sqlite: 1 file(s) there hold other "
                                       f"bytes than sweep {sweeps[1]}'s (another sweep's?), and fetch replaces none: "
                                       "fetch into another folder (-o DIR) or remove them\n")
    assert tree(folder) == before  # not even the file it lacked
    assert main(["fetch", "--coordinator", coordinator.address, sweeps[1], "-o", str(tmp_path / "other")]) == 0
    assert tree(tmp_path / "other")["node000/rank0.sqlite"] == b"second sweep's export"


def test_a_sweep_without_raw_exports_says_so(coordinator, wire, digests, tmp_path, capsys) -> None:
    agent = wire.FakeAgent(coordinator, "node000")
    sweep_id = sweep_of(coordinator, agent, upload_raw=False)
    upload(wire, coordinator, agent, sweep_id, "node000.digest.parquet", digests["node000"], pb.ARTIFACT_KIND_DIGEST)
    agent.close()
    end(coordinator, sweep_id)
    folder = tmp_path / "out"
    assert main(["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(folder), "--kind", "raw"]) == 2
    assert capsys.readouterr().err == (f"rankscope: error: sweep {sweep_id} has no raw exports: it was captured "
                                       "without --upload-raw\n")
    assert not folder.exists()
    # Without --kind it fetches what there is, and says what is not.
    assert main(["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(folder)]) == 0
    assert tree(folder) == {"node000/node000.digest.parquet": digests["node000"]}
    assert capsys.readouterr().err == (f"rankscope: sweep {sweep_id} has no raw exports: it was captured without "
                                       "--upload-raw; fetched its digests\n")


def test_a_sweep_still_running_says_it_is_not_finished_yet(coordinator, wire, digests, tmp_path, capsys) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep_id = sweep_of(coordinator, agent, upload_raw=True)
    fetch = ["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(tmp_path / "o")]
    assert main(fetch) == 2
    assert capsys.readouterr().err == (f"rankscope: error: sweep {sweep_id} is not finished yet: none of its nodes "
                                       "has uploaded artifacts so far; run fetch again once it ends\n")
    assert main([*fetch, "--kind", "raw"]) == 2
    assert capsys.readouterr().err == (f"rankscope: error: sweep {sweep_id} has no raw exports: it is not finished "
                                       "yet, and none has been uploaded so far\n")
    # What is there comes, and the rest is said to be still to come.
    upload(wire, coordinator, agent, sweep_id, "rank0.sqlite", b"raw")
    assert main(fetch) == 0
    assert capsys.readouterr().err == (f"rankscope: sweep {sweep_id} is not finished yet: these are the files its "
                                       "nodes had uploaded; run fetch again once it ends for the rest\n")
    agent.close()


def test_a_nodes_files_are_listed_as_its_ranks_are_numbered(coordinator, wire) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep_id = sweep_of(coordinator, agent, upload_raw=True)
    for name in ("rank10.sqlite", "rank2.sqlite", "rank1.sqlite"):
        upload(wire, coordinator, agent, sweep_id, name, name.encode())
    agent.close()
    with SweepClient(coordinator.address) as client:
        listing = client.artifacts(sweep_id)
    assert [s.artifact.name for s in listing.artifacts] == ["rank1.sqlite", "rank2.sqlite", "rank10.sqlite"]


def test_a_sweep_that_asked_for_raw_exports_but_has_none_says_so(coordinator, wire, tmp_path, capsys) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep_id = sweep_of(coordinator, agent, upload_raw=True)
    agent.close()
    end(coordinator, sweep_id)
    assert main(["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(tmp_path / "o"), "--kind", "raw"]) == 2
    assert capsys.readouterr().err == (f"rankscope: error: sweep {sweep_id} has no raw exports: none has been uploaded "
                                       "(the report's warnings name any that could not be)\n")
    assert main(["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (f"rankscope: error: sweep {sweep_id} has no artifacts stored: none of its "
                                       "nodes has uploaded one\n")


def test_a_file_larger_than_a_chunk_streams_in_chunks(small_chunks, wire, tmp_path, capsys) -> None:
    agent = wire.FakeAgent(small_chunks, "node-a")
    sweep_id = sweep_of(small_chunks, agent, upload_raw=True)
    data = os.urandom(5 * CHUNK + 3)
    upload(wire, small_chunks, agent, sweep_id, "rank0.nsys-rep", data)
    agent.close()
    got = list(small_chunks.sweeps.FetchArtifact(pb.FetchArtifactRequest(sweep_id=sweep_id, node="node-a",
                                                                          name="rank0.nsys-rep"), timeout=10))
    assert [len(c.data) for c in got] == [CHUNK] * 5 + [3]
    assert [c.offset for c in got] == [i * CHUNK for i in range(6)]
    assert b"".join(c.data for c in got) == data
    assert main(["fetch", "--coordinator", small_chunks.address, sweep_id, "-o", str(tmp_path / "out")]) == 0
    assert tree(tmp_path / "out") == {"node-a/rank0.nsys-rep": data}


def test_a_big_download_shows_its_progress_on_a_terminal(small_chunks, wire, tmp_path, monkeypatch, capsys) -> None:
    agent = wire.FakeAgent(small_chunks, "node-a")
    sweep_id = sweep_of(small_chunks, agent, upload_raw=True)
    upload(wire, small_chunks, agent, sweep_id, "rank0.nsys-rep", os.urandom(3 << 20))
    agent.close()
    end(small_chunks, sweep_id)
    monkeypatch.setattr(commands, "PROGRESS_FROM_BYTES", 1 << 20)
    monkeypatch.setattr(commands.sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["fetch", "--coordinator", small_chunks.address, sweep_id, "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    # One line, drawn over (at most ten times a second), ending in the whole, and a newline after it.
    assert err.startswith(f"\rfetching sweep {sweep_id}: ") and err.count("\n") == 1
    assert err.endswith(f"\rfetching sweep {sweep_id}: 3.0 of 3.0 MiB\n")


@pytest.mark.parametrize("damage", ["a byte changed", "cut short"])
def test_bytes_that_are_not_the_recorded_ones_are_not_written(coordinator, wire, tmp_path, damage, capsys) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep_id = sweep_of(coordinator, agent, upload_raw=True)
    data = os.urandom(200_000)
    sha = upload(wire, coordinator, agent, sweep_id, "rank0.sqlite", data)
    agent.close()
    stored = coordinator.data_dir / "artifacts" / "objects" / sha[:2] / sha
    stored.write_bytes(data[:1000] + bytes([data[1000] ^ 1]) + data[1001:] if damage == "a byte changed" else data[:-7])
    folder = tmp_path / "out"
    assert main(["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(folder)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    size = len(data) if damage == "a byte changed" else len(data) - 7
    assert line.startswith(f"rankscope: error: {folder / 'node-a' / 'rank0.sqlite'}: the {size} bytes received have "
                           "sha256 ")
    assert line.endswith(f", the coordinator recorded {sha} ({len(data)} bytes): not written (its stored copy may be "
                         "damaged)")
    assert tree(folder) == {}  # no partial file either


def test_a_fetch_starts_at_the_offset_asked_for_and_refuses_one_outside_the_file(small_chunks, wire) -> None:
    agent = wire.FakeAgent(small_chunks, "node-a")
    sweep_id = sweep_of(small_chunks, agent, upload_raw=True)
    data = os.urandom(3 * CHUNK + 3)
    upload(wire, small_chunks, agent, sweep_id, "rank0.nsys-rep", data)
    agent.close()

    def fetched(offset: int) -> list[pb.ArtifactChunk]:
        request = pb.FetchArtifactRequest(sweep_id=sweep_id, node="node-a", name="rank0.nsys-rep", offset=offset)
        return list(small_chunks.sweeps.FetchArtifact(request, timeout=10))

    got = fetched(CHUNK + 5)  # read from there in whole chunks: the store seeks, it does not skip chunk by chunk
    assert [(c.offset, len(c.data)) for c in got] == [(CHUNK + 5, CHUNK), (2 * CHUNK + 5, CHUNK - 2)]
    assert b"".join(c.data for c in got) == data[CHUNK + 5:]
    assert fetched(len(data)) == []  # nothing left to send
    for offset in (-1, len(data) + 1):
        with pytest.raises(grpc.RpcError) as refused:
            fetched(offset)
        assert (refused.value.code(), refused.value.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"offset {offset} is outside artifact 'rank0.nsys-rep' of node 'node-a' ({len(data)} bytes)")


class Cut:
    """A TCP relay to a coordinator that drops its one connection once ``limit`` bytes have come
    back through it: a download's connection lost midway."""

    def __init__(self, port: int, limit: int) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._relay, args=(port, limit), daemon=True).start()

    def _relay(self, port: int, limit: int) -> None:
        with self.listener:  # then closed: the port refuses the client's probe of what went wrong
            near, _ = self.listener.accept()
        with near, socket.create_connection(("127.0.0.1", port)) as far:
            threading.Thread(target=self._pump, args=(near, far, None), daemon=True).start()
            self._pump(far, near, limit)
            for sock in (near, far):  # wakes the other pump's recv, and is seen at once: close alone is neither
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        passed = 0
        with contextlib.suppress(OSError):
            while (data := src.recv(1 << 14)) and (limit is None or passed + len(data) <= limit):
                dst.sendall(data)
                passed += len(data)


def interrupt_after(monkeypatch, count: int) -> None:
    """A Ctrl-C once a fetch has taken ``count`` chunks."""
    fetch = SweepClient.fetch

    def interrupted(self, *args):
        for taken, data in enumerate(fetch(self, *args), 1):
            yield data
            if taken == count:
                signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(SweepClient, "fetch", interrupted)


def offsets_asked(monkeypatch) -> list[int]:
    """The offsets the coordinator is asked to read artifacts from, from now on."""
    asked: list[int] = []
    read = Coordinator.read_artifact

    def recording(self, sweep_id: str, node: str, name: str, offset: int = 0):
        asked.append(offset)
        return read(self, sweep_id, node, name, offset)

    monkeypatch.setattr(Coordinator, "read_artifact", recording)
    return asked


@pytest.mark.parametrize("broken, code", [(KeyboardInterrupt, 130), (commands.TransportError("coordinator gone"), 1)],
                         ids=["ctrl-c", "lost"])
def test_a_download_broken_before_its_first_byte_leaves_no_file(coordinator, wire, tmp_path, monkeypatch, broken,
                                                                code: int) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep_id = sweep_of(coordinator, agent, upload_raw=True)
    upload(wire, coordinator, agent, sweep_id, "rank0.sqlite", b"raw")
    agent.close()

    def nothing(*args):
        raise broken
        yield

    monkeypatch.setattr(SweepClient, "fetch", nothing)
    assert main(["fetch", "--coordinator", coordinator.address, sweep_id, "-o", str(tmp_path / "out")]) == code
    assert tree(tmp_path / "out") == {}  # was an empty .rank0.sqlite.part


@pytest.mark.parametrize("broken", ["ctrl-c", "connection lost"])
def test_a_broken_download_keeps_its_bytes_and_the_next_fetch_resumes_after_them(
        small_chunks, wire, tmp_path, monkeypatch, capsys, broken) -> None:
    agent = wire.FakeAgent(small_chunks, "node-a")
    sweep_id = sweep_of(small_chunks, agent, upload_raw=True)
    data = os.urandom(3 << 20)
    upload(wire, small_chunks, agent, sweep_id, "rank0.nsys-rep", data)
    agent.close()
    end(small_chunks, sweep_id)
    folder = tmp_path / "out"
    fetch = ["fetch", sweep_id, "-o", str(folder)]
    with monkeypatch.context() as patched:
        if broken == "ctrl-c":
            interrupt_after(patched, 10)
            assert main([*fetch, "--coordinator", small_chunks.address]) == 130
            assert capsys.readouterr().err == "rankscope: interrupted\n"
        else:
            cut = Cut(small_chunks.port, limit=20 * CHUNK)
            assert main([*fetch, "--coordinator", cut.address]) == 1
            (line,) = capsys.readouterr().err.splitlines()
            assert line.startswith(f"rankscope: error: coordinator at {cut.address} unreachable (unavailable: ")
            assert re.search(r"; the \d+ bytes of node-a/rank0.nsys-rep received are kept: run fetch again to "
                             r"resume$", line)
    part = folder / "node-a" / ".rank0.nsys-rep.part"
    kept = part.read_bytes()
    assert tree(folder) == {"node-a/.rank0.nsys-rep.part": kept}  # no file at the final name
    assert kept == data[:len(kept)] and len(kept) % CHUNK == 0
    assert len(kept) == 10 * CHUNK if broken == "ctrl-c" else 0 < len(kept) < 20 * CHUNK
    with pytest.raises(InputError, match="^no exports or digests found in "):
        discover([folder])  # analyze passes the partial by, without a word (warnings are errors here)

    asked = offsets_asked(monkeypatch)
    monkeypatch.setattr(commands, "PROGRESS_FROM_BYTES", 1 << 20)
    monkeypatch.setattr(commands.sys.stderr, "isatty", lambda: True, raising=False)
    assert main([*fetch, "--coordinator", small_chunks.address]) == 0
    assert asked == [len(kept)]
    assert tree(folder) == {"node-a/rank0.nsys-rep": data}  # its sha256 checked, and the partial gone
    out, err = capsys.readouterr()
    assert out == (f"fetched 1 file(s) (3.0 MiB) of sweep {sweep_id} into {folder}; {len(kept)} bytes resumed from "
                   "an interrupted fetch\n")
    # The kept bytes count as done from the start.
    assert err.startswith(f"\rfetching sweep {sweep_id}: {len(kept) / (1 << 20):.1f} of 3.0 MiB\r")
    assert err.endswith(f"\rfetching sweep {sweep_id}: 3.0 of 3.0 MiB\n")


@pytest.mark.parametrize("kept", ["other bytes", "longer than the file", "of an older upload"])
def test_kept_bytes_that_do_not_start_the_file_are_removed_and_the_next_fetch_starts_from_zero(
        small_chunks, wire, tmp_path, monkeypatch, capsys, kept) -> None:
    agent = wire.FakeAgent(small_chunks, "node-a")
    sweep_id = sweep_of(small_chunks, agent, upload_raw=True)
    folder = tmp_path / "out"
    fetch = ["fetch", "--coordinator", small_chunks.address, sweep_id, "-o", str(folder)]
    part = folder / "node-a" / ".rank0.sqlite.part"
    data = os.urandom(5 * CHUNK)
    if kept == "of an older upload":  # a fetch of it broken, then the node uploaded the file anew
        upload(wire, small_chunks, agent, sweep_id, "rank0.sqlite", os.urandom(5 * CHUNK))
        with monkeypatch.context() as patched:
            interrupt_after(patched, 2)
            assert main(fetch) == 130
    else:
        part.parent.mkdir(parents=True)
        part.write_bytes(os.urandom(CHUNK + 7) if kept == "other bytes" else data + b"\0")
    sha = upload(wire, small_chunks, agent, sweep_id, "rank0.sqlite", data)
    agent.close()
    resumed = part.stat().st_size
    capsys.readouterr()
    assert main(fetch) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"rankscope: error: {folder / 'node-a' / 'rank0.sqlite'}: the {max(resumed, len(data))} "
                           f"bytes ({resumed} of them from an interrupted fetch) have sha256 ")
    assert line.endswith(f", the coordinator recorded {sha} ({len(data)} bytes): not written (those kept bytes are "
                         "removed: run fetch again to download it whole)")
    assert tree(folder) == {}  # neither the file nor the kept bytes
    assert main(fetch) == 0
    assert tree(folder) == {"node-a/rank0.sqlite": data}
    assert capsys.readouterr().out == f"fetched 1 file(s) (0.1 MiB) of sweep {sweep_id} into {folder}\n"


def test_a_second_fetch_of_a_file_another_is_downloading_leaves_its_bytes_alone(
        small_chunks, wire, tmp_path, capsys) -> None:
    import fcntl

    agent = wire.FakeAgent(small_chunks, "node-a")
    sweep_id = sweep_of(small_chunks, agent, upload_raw=True)
    data = os.urandom(4 * CHUNK)
    upload(wire, small_chunks, agent, sweep_id, "rank0.nsys-rep", data)
    agent.close()
    folder = tmp_path / "out"
    part = folder / "node-a" / ".rank0.nsys-rep.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[:CHUNK])
    fetch = ["fetch", sweep_id, "-o", str(folder), "--coordinator", small_chunks.address]
    with open(part, "ab") as other:  # as the fetch under way holds it
        fcntl.flock(other.fileno(), fcntl.LOCK_EX)
        assert main(fetch) == 2
        assert capsys.readouterr().err == (f"rankscope: error: {folder / 'node-a' / 'rank0.nsys-rep'}: another fetch "
                                           "is downloading this file now; let it finish\n")
        assert tree(folder) == {"node-a/.rank0.nsys-rep.part": data[:CHUNK]}
    assert main(fetch) == 0
    assert tree(folder) == {"node-a/rank0.nsys-rep": data}
