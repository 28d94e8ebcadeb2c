"""The artifact store: uploaded files in a local folder, addressed by their sha256.

An upload in progress lives in ``partial/<upload_id>.part`` next to a small
``<upload_id>.json`` holding its header; the committed offset is the part file's
size, so it survives a coordinator restart without a separate journal. When the
last byte lands the whole file's sha256 is checked and the file is renamed to
``objects/<sha[:2]>/<sha>``. The same bytes uploaded twice are stored once.

Anything refused (a chunk at the wrong offset, a checksum mismatch, a bad name, a
file over the size limit) raises an :class:`UploadRejected` subclass, and leaves
nothing new on disk.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import mmap
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from rankscope import atomic, output
from rankscope.errors import RankscopeError, UploadRejected, quoted, shown
from rankscope.proto.v1 import chunks
from rankscope.records import known_fields

log = logging.getLogger(__name__)

KINDS = ("digest", "raw")
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# `rankscope fetch` writes an artifact as DIR/<node>/<name> by way of ".<name>.part": within a
# file name's 255 bytes (a longer one was stored, then failed every fetch of its sweep). An
# agent's names are a node's name bounded to 200 characters and a suffix.
MAX_NAME = 240
_HASH_BLOCK = 8 << 20
FULL_LOG_S = 60.0  # a full disk is logged at most this often, per message
_full_logged: dict[str, float] = {}
_full_lock = threading.Lock()
_PIPELINE_DEPTH = 8  # chunks in flight per stage: bounds an upload's memory to a few MiB
# Buffered writes start the disk's writeback every this many bytes, so the final fsync finds
# little left to write (1 GiB on a VM disk: 0.4 s of fsync at the end without it, 0.02 s with it).
WRITEBACK_BYTES = 32 << 20
ALIGN = 4096  # direct writes: offsets and lengths in whole blocks (4 KiB covers 512-byte devices too)
_DIRECT_BUFFER = (1 << 20) + ALIGN  # a 1 MiB chunk after a partial block


class BadUpload(UploadRejected):
    """The header is malformed: unsafe name, bad checksum format, unknown kind."""


class WrongOffset(UploadRejected):
    """A chunk does not start at the committed offset (or runs past the declared size)."""

    def __init__(self, message: str, *, committed: int) -> None:
        self.committed = committed
        super().__init__(message)


class ChecksumMismatch(UploadRejected):
    """All bytes arrived but their sha256 is not the declared one; the upload is discarded."""


class TooLarge(UploadRejected):
    """The declared size is over the configured limit."""


class UploadBusy(RankscopeError):
    """Another stream is writing this upload right now; retry shortly."""


_FULL = (errno.ENOSPC, errno.EDQUOT)


class StorageFull(RankscopeError):
    """The coordinator's disk or quota is full: uploads (and state writes) fail until space
    is freed. A state of the machine, not a bug: one logged line, no traceback."""


def storage_full(reason: str, root: Path) -> StorageFull:
    """The error for a full disk under ``root``, logged for the operator as it is raised:
    once a minute at most, as every upload retry, status and save meanwhile fails alike."""
    error = StorageFull(f"coordinator storage is full ({reason}): free space under {shown(root)}")
    now = time.monotonic()
    with _full_lock:
        last = _full_logged.get(str(error), -FULL_LOG_S)
        if now - last >= FULL_LOG_S:
            _full_logged[str(error)] = now
            log.error("%s", error)
    return error


@contextlib.contextmanager
def storage_errors(root: Path, what: str = "the upload") -> Iterator[None]:
    """The one place an OSError storing ``what`` under ``root`` gets its meaning: a full disk
    is StorageFull, any other a failure to store; both logged for the operator, neither a
    traceback."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in _FULL:
            raise storage_full(reason, root) from None
        log.error("cannot store %s under %s (%s)", what, shown(root), reason)
        raise RankscopeError(f"cannot store {what} ({reason})") from None


@dataclass(frozen=True)
class UploadHeader:
    upload_id: str
    sweep_id: str
    node: str
    name: str
    size: int
    sha256: str
    kind: str  # "digest" | "raw"
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class UploadResult:
    upload_id: str
    committed: int
    complete: bool
    sha256: str = ""  # verified, when complete
    deduplicated: bool = False


def check_header(header: UploadHeader, max_bytes: int) -> None:
    """Refuse a header before any byte of its upload is accepted."""
    for label, value, limit in (("upload id", header.upload_id, chunks.MAX_UPLOAD_ID),
                                ("artifact name", header.name, MAX_NAME)):
        if not _SAFE_NAME.fullmatch(value) or ".." in value:
            raise BadUpload(f"{label} {quoted(value)} is not a plain file name (letters, digits, '._+-'; no '/' or '..')")
        if len(value) > limit:
            raise BadUpload(f"{label} {quoted(value)} is {len(value)} characters, over the limit of {limit}")
    if not _SHA256.fullmatch(header.sha256):
        raise BadUpload(f"upload {header.upload_id}: sha256 {header.sha256!r} is not 64 lower-case hex digits")
    if header.kind not in KINDS:
        raise BadUpload(f"upload {header.upload_id}: kind {header.kind!r} is not one of {', '.join(KINDS)}")
    if header.size < 0:
        raise BadUpload(f"upload {header.upload_id}: negative size {header.size}")
    if header.size > max_bytes:
        raise TooLarge(f"upload {header.upload_id}: {header.size} bytes is over the limit of {max_bytes} bytes")


def _is_upload_id(value: str) -> bool:
    return _SAFE_NAME.fullmatch(value) is not None and ".." not in value and len(value) <= chunks.MAX_UPLOAD_ID


class _Partial:
    """One upload in progress; its lock admits one writing stream at a time."""

    def __init__(self, header: UploadHeader, part: Path) -> None:
        self.header = header
        self.part = part
        self.lock = threading.Lock()
        self.hasher = hashlib.sha256()
        self.hashed = 0  # bytes of the part file the hasher has seen

    @property
    def committed(self) -> int:
        try:
            return self.part.stat().st_size
        except FileNotFoundError:
            return 0

    def catch_up_hash(self) -> None:
        """After a restart the in-memory hash is gone: hash the committed prefix once."""
        committed = self.committed
        if self.hashed == committed:
            return
        self.hasher, self.hashed = hashlib.sha256(), 0
        with open(self.part, "rb") as handle:
            while self.hashed < committed:
                block = handle.read(min(_HASH_BLOCK, committed - self.hashed))
                if not block:
                    break
                self.hasher.update(block)
                self.hashed += len(block)


class ArtifactStore:
    def __init__(self, root: Path, *, max_bytes: int) -> None:
        self.root = Path(root)
        self.objects, self.partial = self.folders(self.root)
        output.make_folder(self.objects)  # one line naming what is in the way, not a traceback
        output.make_folder(self.partial)
        # An upload's header written as the coordinator was killed: the data dir is this one's alone now.
        atomic.remove_left_behind(self.partial)
        self._remove_strays()
        self.max_bytes = max_bytes
        self._partials: dict[str, _Partial] = {}
        self._guard = threading.Lock()

    @staticmethod
    def folders(root: Path) -> tuple[Path, Path]:
        """The folders a store under ``root`` writes in: its objects, its partial uploads."""
        return root / "objects", root / "partial"

    # queries ---------------------------------------------------------------------

    def path_of(self, sha256: str) -> Path:
        if not _SHA256.fullmatch(sha256):
            raise BadUpload(f"sha256 {sha256!r} is not 64 lower-case hex digits")
        return self.objects / sha256[:2] / sha256

    def has(self, sha256: str) -> bool:
        return _SHA256.fullmatch(sha256) is not None and self.path_of(sha256).is_file()

    def read(self, sha256: str, chunk_bytes: int, offset: int = 0) -> Iterator[bytes]:
        """A stored object's bytes in order from ``offset``, ``chunk_bytes`` at a time, as they
        are sent on: an export of GiBs is never whole in memory. One that cannot be read is a
        RankscopeError."""
        try:
            with open(self.path_of(sha256), "rb") as handle:
                handle.seek(offset)
                while data := handle.read(chunk_bytes):
                    yield data
        except OSError as exc:
            error = RankscopeError(f"stored artifact {sha256[:12]}... cannot be read ({exc.strerror or exc})")
            log.error("%s under %s", error, shown(self.objects))
            raise error from None

    def committed(self, upload_id: str) -> tuple[UploadHeader, int] | None:
        """The header and committed offset of an upload in progress, or None."""
        partial = self._lookup(upload_id)
        return None if partial is None else (partial.header, partial.committed)

    # writing ---------------------------------------------------------------------

    def writer(self, header: UploadHeader, *, wait_s: float = 5.0) -> UploadWriter:
        """Open one stream's writer; use as a context manager (it holds the upload's lock)."""
        check_header(header, self.max_bytes)
        with self._guard:
            partial = self._lookup(header.upload_id)
            if partial is None or (partial.header != header and not self._begun(partial)):
                partial = _Partial(header, self.partial / f"{header.upload_id}.part")
                self._partials[header.upload_id] = partial
        if partial.header != header:
            raise WrongOffset(
                f"upload {header.upload_id} was started with a different header "
                f"({partial.header.name}, {partial.header.size} bytes, sha256 {partial.header.sha256[:12]}...)",
                committed=partial.committed,
            )
        return UploadWriter(self, partial, wait_s)

    def drop_partials(self, sweep_id: str) -> list[str]:
        """Remove the unfinished uploads of a sweep that ended before they did (an agent cancelled
        or gone mid-upload), or that was never started here: nothing will complete them, and raw
        exports run to gigabytes. One a stream is writing stays. Returns the upload ids removed."""
        dropped = []
        for partial in self._stored_partials():
            if partial.header.sweep_id != sweep_id or not partial.lock.acquire(blocking=False):
                continue
            try:
                self._discard(partial)
            finally:
                partial.lock.release()
            dropped.append(partial.header.upload_id)
        return dropped

    def partial_sweeps(self) -> set[str]:
        """The sweeps with an upload in progress (begun: at least one byte stored)."""
        return {partial.header.sweep_id for partial in self._stored_partials()}

    def _stored_partials(self) -> Iterator[_Partial]:
        """The uploads in progress on disk. One whose header cannot be read is removed, part file
        and all: nothing says what it is, so no stream can resume it and no sweep's end removes it."""
        for meta in sorted(self.partial.glob("*.json")):
            try:
                partial = self._lookup(meta.stem)
            except RankscopeError as exc:
                log.warning("removed unfinished upload %s: %s", quoted(meta.stem), exc)
                (self.partial / f"{meta.stem}.part").unlink(missing_ok=True)
                meta.unlink(missing_ok=True)
                continue
            if partial is not None:
                yield partial

    def _remove_strays(self) -> None:
        """Remove, each logged, the files in partial/ no upload owns, which no sweep's end would
        remove: a header whose file name is no upload id (no stream can name it), and a part
        file without a header (nothing says whose sweep, size or hash it is). Called before any
        stream runs; a live upload's header is written before its part file, removed after it."""
        files = sorted(path for path in self.partial.iterdir() if path.is_file())
        for meta in files:
            if meta.suffix == ".json" and not _is_upload_id(meta.stem):
                log.warning("removed unfinished upload %s: its file name is not an upload id", shown(meta))
                meta.unlink()
        for part in files:  # the part files of the headers just removed too
            if part.suffix == ".part" and not (self.partial / f"{part.stem}.json").is_file():
                log.warning("removed unfinished upload %s: it has no header", shown(part))
                part.unlink()

    def _lookup(self, upload_id: str) -> _Partial | None:
        partial = self._partials.get(upload_id)
        if partial is not None:
            return partial
        if not _is_upload_id(upload_id):
            return None
        meta = self.partial / f"{upload_id}.json"
        try:
            data = json.loads(meta.read_text())
            # A newer rankscope's header loads without what was added since (a rolled-back coordinator).
            header = UploadHeader(**known_fields(UploadHeader, {**data, "ranks": tuple(data.get("ranks", ()))}))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:  # not JSON; not an object, or fields missing
            raise RankscopeError(f"corrupt upload header ({exc})", path=meta) from None
        # A query reads without the guard: one read back meanwhile (a stream's) is the one kept,
        # so every stream of the upload shares its lock.
        return self._partials.setdefault(upload_id, _Partial(header, self.partial / f"{upload_id}.part"))

    def _begun(self, partial: _Partial) -> bool:
        return (self.partial / f"{partial.header.upload_id}.json").exists()

    def _forget_unbegun(self, partial: _Partial) -> None:
        """A stream that stored no byte leaves no trace, not even in memory."""
        with self._guard:
            if not self._begun(partial) and self._partials.get(partial.header.upload_id) is partial:
                del self._partials[partial.header.upload_id]

    def _begin(self, partial: _Partial) -> None:
        """Persist the header before the first byte, atomically."""
        meta = self.partial / f"{partial.header.upload_id}.json"
        if meta.exists():
            return
        atomic.write_text(meta, json.dumps(asdict(partial.header)))

    def _discard(self, partial: _Partial) -> None:
        with self._guard:
            self._partials.pop(partial.header.upload_id, None)
        partial.part.unlink(missing_ok=True)
        (self.partial / f"{partial.header.upload_id}.json").unlink(missing_ok=True)

    def _commit(self, partial: _Partial) -> bool:
        """Move a verified part file to its object path; False if the bytes were already stored."""
        target = self.path_of(partial.header.sha256)
        target.parent.mkdir(exist_ok=True)
        deduplicated = target.exists()
        if deduplicated:
            partial.part.unlink(missing_ok=True)
        else:
            partial.part.replace(target)
        self._discard(partial)
        return not deduplicated


class _Stage:
    """One background step applied to a stream's chunks in order (append to disk, or hash).

    The disk write and the sha256 both release the GIL, so with a stage each they run
    alongside the receipt of the next chunk instead of after it.
    """

    def __init__(self, name: str, work: Callable[[bytes | memoryview], object]) -> None:
        self.work = work
        self.queue: queue.Queue = queue.Queue(maxsize=_PIPELINE_DEPTH)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def put(self, data: bytes | memoryview) -> None:
        self._raise()
        self.queue.put(data)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        self._raise()

    def _run(self) -> None:
        while (data := self.queue.get()) is not None:
            if self.error is None:
                try:
                    self.work(data)
                except BaseException as exc:  # handed to the receiving thread
                    self.error = exc

    def _raise(self) -> None:
        if isinstance(self.error, OSError):
            raise self.error  # the writer says what it means (storage_errors)
        if self.error is not None:
            raise RankscopeError(f"cannot store the upload ({self.error})") from self.error


class PartFile:
    """Appends an upload's bytes to its part file, and makes them durable on close.

    Where the file system allows it, the bytes bypass the page cache (O_DIRECT): each chunk is
    copied once into an aligned buffer and written from there, where a buffered write has the
    kernel copy it into freshly allocated cache pages and write those back later. On a 2-core VM
    that saved 0.1-0.6 CPU-s per GiB uploaded (median 0.45 of about 2.9, client and coordinator
    together).
    Direct writes need aligned file offsets and lengths, so the bytes up to the first aligned
    offset and the last partial block go through an ordinary buffered handle; the committed
    offset (the file's size) lags the bytes accepted by less than one block until close.
    Elsewhere (tmpfs, macOS) every write is buffered, and the disk's writeback is started every
    WRITEBACK_BYTES so the final fsync finds little left to write.
    """

    def __init__(self, path: Path, offset: int, *, direct: bool = True) -> None:
        self.handle: BinaryIO = open(path, "ab")
        self.end = offset  # bytes in the file
        self.flushed = offset  # of those, how many the disk was told to write back (buffered mode)
        self._fd = _open_direct(path) if direct else None
        self._buffer: mmap.mmap | None = None  # page-aligned, for direct writes
        self._staged = 0  # bytes in the buffer's head waiting for the rest of their block

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        if self._fd is not None and self._staged == 0 and self.end % ALIGN:
            head = min(len(view), -self.end % ALIGN)
            self._buffered(view[:head])
            view = view[head:]
        if self._fd is None:
            self._buffered(view)
        elif view:
            self._direct(view)

    def close(self) -> None:
        """Write what is staged, fsync, close; the file then holds every byte written."""
        try:
            if self._staged:
                self._buffered(memoryview(self._buffer)[: self._staged])
                self._staged = 0
            self.handle.flush()
            os.fsync(self.handle.fileno())
        finally:
            self.release()

    def release(self) -> None:
        """Close without writing what is staged (after an error)."""
        self.handle.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None

    def _buffered(self, view: memoryview) -> None:
        self.handle.write(view)
        self.end += len(view)
        if self._fd is None and self.end - self.flushed >= WRITEBACK_BYTES and hasattr(os, "posix_fadvise"):
            # On dirty pages DONTNEED starts their writeback without waiting for it (and drops
            # them from the cache once clean: an upload is not read back soon).
            self.handle.flush()
            os.posix_fadvise(self.handle.fileno(), self.flushed, self.end - self.flushed, os.POSIX_FADV_DONTNEED)
            self.flushed = self.end
        elif self._fd is not None:
            self.handle.flush()  # before any direct write lands after these bytes

    def _direct(self, view: memoryview) -> None:
        total = self._staged + len(view)
        if self._buffer is None or len(self._buffer) < total:
            grown = mmap.mmap(-1, max(total, _DIRECT_BUFFER))
            if self._buffer is not None:
                grown[: self._staged] = self._buffer[: self._staged]
                self._buffer.close()
            self._buffer = grown
        buffer = self._buffer
        buffer[self._staged : total] = view
        aligned = total - total % ALIGN
        written = 0
        try:
            while written < aligned:
                written += os.pwrite(self._fd, memoryview(buffer)[written:aligned], self.end + written)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # The file system took the O_DIRECT open but not the write: buffered from here on.
            os.close(self._fd)
            self._fd = None
            self.end += written
            self._staged = 0
            self._buffered(memoryview(buffer)[written:total])
            return
        self.end += aligned
        self._staged = total - aligned
        if self._staged and aligned:
            buffer[: self._staged] = buffer[aligned:total]


def _open_direct(path: Path) -> int | None:
    """A write descriptor on ``path`` that bypasses the page cache, or None where there is none."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # tmpfs and others refuse O_DIRECT
            return None
        raise


class UploadWriter:
    """Accepts one stream's chunks for an upload, strictly in offset order."""

    def __init__(self, store: ArtifactStore, partial: _Partial, wait_s: float) -> None:
        self.store = store
        self.partial = partial
        self.wait_s = wait_s
        self._part: PartFile | None = None
        self._stages: list[_Stage] = []
        self._offset = 0
        self.result: UploadResult | None = None

    def __enter__(self) -> UploadWriter:
        if not self.partial.lock.acquire(timeout=self.wait_s):
            raise UploadBusy(f"upload {self.partial.header.upload_id} is being written by another stream")
        header = self.partial.header
        self._offset = self.partial.committed
        if self.store.has(header.sha256):
            # Stored before, under this or another upload id: nothing to receive.
            self.store._discard(self.partial)
            self.result = UploadResult(header.upload_id, header.size, True, header.sha256, deduplicated=True)
        elif header.size == 0:
            self._finish()
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        try:
            if exc_type is None:
                with storage_errors(self.store.root):
                    self._drain()
            else:
                # Keep what was accepted, so a retry resumes after it; the error that ended the
                # stream is the one told, not a repeat of it from the stages.
                with contextlib.suppress(RankscopeError, OSError):
                    self._drain()
        finally:
            self.store._forget_unbegun(self.partial)
            self.partial.lock.release()

    @property
    def committed(self) -> int:
        return self._offset

    def write(self, offset: int, data: bytes | memoryview) -> UploadResult | None:
        """Append ``data`` at ``offset`` (which must be the committed offset); the result once complete."""
        with storage_errors(self.store.root):
            return self._write(offset, data)

    def _write(self, offset: int, data: bytes | memoryview) -> UploadResult | None:
        header = self.partial.header
        if self.result is not None:
            if data:
                raise WrongOffset(f"upload {header.upload_id} is already complete", committed=self._offset)
            return self.result
        if offset != self._offset:
            raise WrongOffset(
                f"upload {header.upload_id}: chunk at offset {offset}, committed offset is {self._offset}",
                committed=self._offset,
            )
        if offset + len(data) > header.size:
            raise WrongOffset(
                f"upload {header.upload_id}: chunk ends at {offset + len(data)}, past the declared size {header.size}",
                committed=self._offset,
            )
        if data:
            if self._part is None:
                self._open()
            for stage in self._stages:
                stage.put(data)
            self._offset += len(data)
        if self._offset == header.size:
            self._finish()
        return self.result

    def _open(self) -> None:
        self.store._begin(self.partial)
        self.partial.catch_up_hash()
        self._part = PartFile(self.partial.part, self._offset)
        upload_id = self.partial.header.upload_id
        self._stages = [_Stage(f"disk-{upload_id}", self._part.write),
                        _Stage(f"sha256-{upload_id}", self.partial.hasher.update)]

    def _drain(self) -> None:
        """Wait for the stages; make what they wrote durable."""
        if self._part is None:
            return
        part, stages = self._part, self._stages
        self._part, self._stages = None, []
        try:
            try:
                for stage in stages:
                    stage.close()
            except BaseException:
                part.release()
                raise
            part.close()
        except BaseException:
            # The hasher saw bytes the file may not hold: the next stream hashes the file again.
            self.partial.hasher, self.partial.hashed = hashlib.sha256(), 0
            raise
        self.partial.hashed = self._offset

    def _finish(self) -> None:
        header = self.partial.header
        self._drain()
        self.partial.catch_up_hash()
        actual = self.partial.hasher.hexdigest() if header.size else hashlib.sha256().hexdigest()
        if actual != header.sha256:
            self.store._discard(self.partial)
            self._offset = 0
            raise ChecksumMismatch(
                f"upload {header.upload_id} ({header.name}): sha256 of the {header.size} bytes received is "
                f"{actual}, declared {header.sha256}; discarded"
            )
        if header.size == 0:
            self.store._begin(self.partial)
            self.partial.part.touch()
        stored = self.store._commit(self.partial)
        self.result = UploadResult(header.upload_id, header.size, True, actual, deduplicated=not stored)
