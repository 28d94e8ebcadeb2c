"""Upload throughput over loopback: the coordinator's Upload RPC against a plain TCP socket.

One artifact (1 GiB by default) goes from this process to another process, three ways:

- ``grpc upload``: the agent's Uploader, its file's sha256 given (as when the agent hashed
  what it wrote), to a real ``rankscope coordinator`` process: QueryUpload, then one Upload
  RPC, header then 1 MiB chunks; the coordinator appends each to the part file, hashes it,
  and at the end fsyncs, verifies sha256 and stores it by hash;
- ``agent Uploader``: the same with the Uploader reading the file once more for its sha256;
- ``grpc transport only``: the same chunks as raw bytes through Python gRPC into a server
  that keeps nothing (no protobuf, no store): the ceiling of gRPC itself on this machine;
- ``tcp, recv only``: the same bytes through a plain socket into a receiver that keeps
  nothing, the transport's ceiling;
- ``tcp + disk + sha256``: the same socket with the receiver doing the coordinator's
  work (append to a file, hash, fsync), the fair comparison of protocol overhead;
- ``disk alone``: the bytes copied into the store's file system and fsynced, no network:
  what a durable upload is bounded by.

Both baselines write through the store's PartFile in its buffered mode (the disk's writeback
started every 32 MiB): in one thread that is faster than its direct writes, which wait for the
disk; the coordinator's own store writes directly, from a thread of its own.

Every gRPC process here, this one included, runs with the allocator setting the
coordinator and the agent use (``rankscope.memory.keep_chunk_memory``).

Prints MiB/s of each and the ratios. ``--store /dev/shm`` takes the disk out.

Usage: python bench/upload_throughput.py [--size-mib 1024] [--chunk-kib 1024] [--repeat 2] [--store DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing import Process, Queue
from pathlib import Path

import grpc

from rankscope.agent.uploader import Artifact, Uploader, sha256_of
from rankscope.coordinator.artifacts import PartFile
from rankscope.memory import keep_chunk_memory
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

MIB = 1 << 20


def make_artifact(path: Path, size: int) -> None:
    """Incompressible bytes: 64 MiB of random data, repeated, with each block tagged so no two match."""
    block = os.urandom(64 * MIB)
    with open(path, "wb") as out:
        written = 0
        while written < size:
            piece = block[: min(len(block), size - written)]
            out.write(written.to_bytes(8, "little") + piece[8:])
            written += len(piece)


# plain TCP --------------------------------------------------------------------------


def _receiver(port_q: Queue, size: int, chunk: int, sink: str | None) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_q.put(server.getsockname()[1])
        conn, _ = server.accept()
        with conn:
            buffer = bytearray(chunk)
            view = memoryview(buffer)
            hasher = hashlib.sha256() if sink else None
            out = PartFile(Path(sink), 0, direct=False) if sink else None
            received = 0
            while received < size:
                n = conn.recv_into(view, min(chunk, size - received))
                if n == 0:
                    break
                if out is not None:
                    out.write(view[:n])
                    hasher.update(view[:n])
                received += n
            if out is not None:
                out.close()
            conn.sendall(b"\x01" if received == size else b"\x00")


def tcp_upload(path: Path, size: int, chunk: int, sink: Path | None) -> float:
    """Seconds to send the file through a socket until the receiver confirms it has everything."""
    port_q: Queue = Queue()
    receiver = Process(target=_receiver, args=(port_q, size, chunk, str(sink) if sink else None))
    receiver.start()
    port = port_q.get(timeout=30)
    with socket.create_connection(("127.0.0.1", port)) as conn, open(path, "rb") as handle:
        started = time.perf_counter()
        while data := handle.read(chunk):
            conn.sendall(data)
        ok = conn.recv(1)
        elapsed = time.perf_counter() - started
    receiver.join(timeout=60)
    if ok != b"\x01":
        raise SystemExit("tcp receiver did not get every byte")
    if sink:
        sink.unlink()
    return elapsed


# gRPC -------------------------------------------------------------------------------

_RAW_OPTIONS = [("grpc.max_receive_message_length", 8 * MIB), ("grpc.max_send_message_length", 8 * MIB)]


def _raw_sink(port_q: Queue) -> None:
    from concurrent import futures

    def sink(chunks, _context) -> bytes:
        return sum(len(c) for c in chunks).to_bytes(8, "little")

    handler = grpc.method_handlers_generic_handler(
        "bench.Sink", {"Up": grpc.stream_unary_rpc_method_handler(sink)})
    server = grpc.server(futures.ThreadPoolExecutor(2), options=_RAW_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def grpc_raw(path: Path, size: int, chunk: int) -> float:
    """Seconds to stream the file as raw bytes messages to a gRPC server that keeps nothing."""
    port_q: Queue = Queue()
    server = Process(target=_raw_sink, args=(port_q,), daemon=True)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port_q.get(timeout=30)}", options=_RAW_OPTIONS) as channel:
            upload = channel.stream_unary("/bench.Sink/Up")
            with open(path, "rb") as handle:
                started = time.perf_counter()
                received = int.from_bytes(upload(iter(lambda: handle.read(chunk), b""), timeout=600), "little")
                elapsed = time.perf_counter() - started
    finally:
        server.terminate()
        server.join(timeout=30)
    if received != size:
        raise SystemExit("raw gRPC sink did not get every byte")
    return elapsed



def start_coordinator(data_dir: Path, max_bytes: int) -> tuple[subprocess.Popen, str]:
    port_file = data_dir.parent / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "coordinator", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
         "--max-upload-bytes", str(max_bytes), "--port-file", str(port_file)],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the coordinator did not start")
        time.sleep(0.1)
    return proc, f"127.0.0.1:{port_file.read_text().strip()}"


def uploader_upload(address: str, path: Path, chunk: int, sweep_id: str, digest: str | None) -> float:
    """Seconds for the agent's Uploader end to end: stored and verified; its own sha256 of the file unless given."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.AgentServiceStub(channel)
        token = stub.Register(pb.RegisterRequest(node="bench", hostname="bench"), timeout=30).session_token
        uploader = Uploader(channel, session_token=token, chunk_bytes=chunk, max_attempts=1)
        artifact = Artifact(path=path, sweep_id=sweep_id, node="bench", kind=pb.ARTIFACT_KIND_RAW)
        started = time.perf_counter()
        result = uploader.upload(artifact, sha256=digest)
        elapsed = time.perf_counter() - started
    if result.resumed_from != 0:
        raise SystemExit(f"unexpected upload result {result}")
    return elapsed


def _clear_objects(data_dir: Path) -> None:
    """So each run stores the bytes afresh instead of deduplicating them."""
    for old in (data_dir / "artifacts" / "objects").rglob("*"):
        if old.is_file():
            old.unlink()


def disk_alone(path: Path, sink: Path, chunk: int) -> float:
    """Seconds to copy the (cached) file into the store's file system and fsync: the storage ceiling."""
    started = time.perf_counter()
    out = PartFile(sink, 0, direct=False)
    with open(path, "rb") as source:
        while data := source.read(chunk):
            out.write(data)
    out.close()
    elapsed = time.perf_counter() - started
    sink.unlink()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--chunk-kib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2, help="best of N runs per method")
    parser.add_argument("--store", type=Path, default=None,
                        help="folder for the coordinator's data and the socket's sink file (default: the temp dir; "
                             "/dev/shm takes the disk out of the comparison)")
    args = parser.parse_args()
    tuned = keep_chunk_memory()
    size, chunk = args.size_mib * MIB, args.chunk_kib * 1024

    with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp, \
            tempfile.TemporaryDirectory(prefix="rankscope-bench-store-", dir=args.store) as store:
        artifact = Path(tmp) / "artifact.bin"
        make_artifact(artifact, size)
        data_dir, sink = Path(store) / "coordinator", Path(store) / "sink.bin"
        proc, address = start_coordinator(data_dir, 2 * size)
        try:
            digest = sha256_of(artifact)
            times: dict[str, list[float]] = {name: [] for name in (
                "grpc upload", "agent Uploader", "grpc transport only", "tcp, recv only", "tcp + disk + sha256",
                "disk alone")}
            for attempt in range(args.repeat):
                _clear_objects(data_dir)
                times["grpc upload"].append(uploader_upload(address, artifact, chunk, f"grpc{attempt}", digest))
                _clear_objects(data_dir)
                times["agent Uploader"].append(uploader_upload(address, artifact, chunk, f"agent{attempt}", None))
                _clear_objects(data_dir)
                times["grpc transport only"].append(grpc_raw(artifact, size, chunk))
                times["tcp, recv only"].append(tcp_upload(artifact, size, chunk, None))
                times["tcp + disk + sha256"].append(tcp_upload(artifact, size, chunk, sink))
                times["disk alone"].append(disk_alone(artifact, sink, chunk))
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    rate = {name: size / MIB / min(values) for name, values in times.items()}
    print(f"artifact {args.size_mib} MiB, chunks {args.chunk_kib} KiB, best of {args.repeat}, loopback, "
          f"{os.cpu_count()} CPUs, store in {args.store or tempfile.gettempdir()}, "
          f"allocator {'tuned' if tuned else 'default'}, load average {os.getloadavg()[0]:.1f} (1 min)")
    notes = {
        "agent Uploader": "incl. the agent's sha256 of the file before sending",
        "grpc transport only": "raw bytes, no protobuf, nothing stored: Python gRPC's own ceiling",
        "tcp + disk + sha256": "receiver appends (buffered, early writeback), hashes, fsyncs, in one thread",
        "disk alone": "copy the cached file into the store (buffered, early writeback) + fsync",
    }
    for name, value in rate.items():
        print(f"  {name:<20} {value:7.0f} MiB/s  ({min(times[name]):5.2f} s)  {notes.get(name, '')}".rstrip())
    print(f"  ratio grpc upload / tcp recv only       {rate['grpc upload'] / rate['tcp, recv only']:.2f}  (aim >= 0.5)")
    print(f"  ratio grpc transport only / tcp recv only {rate['grpc transport only'] / rate['tcp, recv only']:.2f}"
          "  (what any Python gRPC upload can reach here)")
    print(f"  ratio grpc upload / tcp + disk + sha256 {rate['grpc upload'] / rate['tcp + disk + sha256']:.2f}")
    print(f"  ratio grpc upload / disk alone          {rate['grpc upload'] / rate['disk alone']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
