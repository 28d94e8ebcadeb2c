"""Kineto (PyTorch profiler) JSON traces to event columns, for ``kineto`` to make digests of.

Timestamps (reference/nccl-in-traces.md §4): ``ts``/``dur`` are µs with up to three decimals,
either absolute Unix-epoch µs or relative to ``baseTimeNanoseconds``. Absolute µs exceed
float64's ns precision, so the digits are parsed as text into int64 ns, never through float.

Parsing: the ``traceEvents`` text is cut into windows of 256 KiB between one event and the
next (found by searching the text, checked by the window decoding; a text of a few MB is one
window), and msgspec decodes one window at a time into structs holding only the fields read
(``ts``/``dur`` kept as their decimal text, converted to ns all at once, exactly; of
``args`` only the linking ids and the identity fields). Each window becomes columns (strings
as codes) before the next is decoded, and only the few events whose args carry a
collective's identity keep them: neither the per-event Python objects nor the mapped text
are held for the whole trace at once. Text that cannot be cut so is split by decoding it
into one undecoded text per event, then decoded a chunk of events at a time.
"""

from __future__ import annotations

import functools
import gzip
import mmap
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rankscope.analysis import ops
from rankscope.errors import ExportError

HOOK_KEY = "rankscope"  # top-level metadata written by rankscope's torch hook

_TOP_KEYS = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds", "host_name", "trace_id", HOOK_KEY)
GLOO = "gloo:"
C10D = "c10d::"
NCCL = "nccl:"
RPC = "record_param_comms"
_EMPTY = msgspec.Raw(b"")
# An integer arg that fits the digest's int64 columns; a larger one (a corrupt trace) is no id
# or size any profiler writes: for ids, the trace is refused; for other args, as if absent.
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
_Int64 = Annotated[int, msgspec.Meta(ge=I64_MIN, le=I64_MAX)]


@dataclass
class _Names:
    """Per distinct event name, the tests the reading makes (each name tested once, not
    once per event: the same names recur every step)."""

    text: np.ndarray  # object: the names
    comm: np.ndarray  # bool: an NCCL kernel's name
    op: np.ndarray  # object: canonical op of a c10d / gloo name, else None
    op_code: np.ndarray  # int64: a code per distinct op (the same for names of one op), -1 for None

    def where(self, test) -> np.ndarray:
        """``test`` (str -> bool) of each distinct name."""
        return np.fromiter(map(test, self.text), bool, len(self.text))


@dataclass
class Events:
    """The complete events as numpy columns, strings as codes into their distinct values.
    Subsets are arrays of row positions: nothing is copied per subset but what is read."""

    cat: np.ndarray  # int32 code into ``cats``
    name: np.ndarray  # int32 code into ``names``
    pid: np.ndarray  # int32 code into ``pids``
    thread: np.ndarray  # int64: one integer per (pid, tid), compared many times
    ts: np.ndarray  # int64 ns, absolute epoch
    dur: np.ndarray  # int64 ns
    corr: np.ndarray  # int64 CUDA correlation id of linked events (kernels, launches, calls), else -1
    ext: np.ndarray  # int64 External id of linked events, else -1
    cats: dict[str, int]
    names: _Names
    pids: list

    def of_cat(self, *cats: str) -> np.ndarray:
        """Mask of the events in any of the categories."""
        return equal_any(self.cat, [self.cats[c] for c in cats if c in self.cats])

    def named(self, flags: np.ndarray) -> np.ndarray:
        """Mask of the events whose name has the flag (one flag per distinct name)."""
        return flags[self.name]

    def prefixed(self, prefix: str | tuple[str, ...]) -> np.ndarray:
        """Mask of the events whose name starts with the prefix (or any of them)."""
        return self.named(self.names.where(lambda name: name.startswith(prefix)))

    def take(self, rows: np.ndarray) -> Events:
        """The events at ``rows``, their distinct values as they were."""
        return replace(self, **{key: getattr(self, key)[rows] for key in _COLUMNS})


_COLUMNS = ("cat", "name", "pid", "thread", "ts", "dur", "corr", "ext")


@dataclass
class Trace:
    top: dict
    events: Events
    args: callable  # rows (positions in events, -1 for none) -> list[Args]
    untimed: int = 0  # complete events without a ts: left out
    undated: int = 0  # complete events without a dur: instants


class Args(msgspec.Struct, frozen=True, gc=False):
    """The args read: the two ids that link events (CUDA correlation, the profiler's
    External id) and those that carry a collective's identity and size (record_param_comms,
    c10d calls, NCCL kernels, gloo worker ops). Every other arg is skipped unread; input
    shapes stay text until a collective's size needs them."""

    correlation: _Int64 = -1
    external: _Int64 = msgspec.field(default=-1, name="External id")
    collective: Any = msgspec.field(default=None, name="Collective name")
    nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    dims: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input type")
    # record_shapes: the scalar arguments as text (c10d::send / c10d::recv_: the peer, third)
    concrete: msgspec.Raw = msgspec.field(default=_EMPTY, name="Concrete Inputs")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    seq: Any = msgspec.field(default=None, name="Seq")
    stream: Any = None


_NO_ARGS = Args()


class _Event(msgspec.Struct, gc=False):
    """One trace event, only the fields read. ``ts``/``dur`` stay as their exact decimal text."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = ""
    tid: int | str = ""
    ts: msgspec.Raw = _EMPTY
    dur: msgspec.Raw = _EMPTY
    args: Args = _NO_ARGS


class _Document(msgspec.Struct, gc=False):
    """The top-level keys read. Split by decoding, each event stays its undecoded text until
    its chunk is read; read by windows, the events' text is left out and the list is empty."""

    traceEvents: list[msgspec.Raw] | None = None
    schemaVersion: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None
    trace_id: Any = None
    hook: Any = msgspec.field(default=None, name=HOOK_KEY)


_DOCUMENT = msgspec.json.Decoder(_Document)
_EVENTS = msgspec.json.Decoder(list[_Event])
# Bytes of event text decoded at a time. A decoded event costs ~400 bytes of Python
# objects, ~1.5x its text, 10x its columns: windows bound that whatever the trace's size.
# Each window also costs ~0.15 ms of calls: 8 simulated 18 MB traces read with 13 MiB of
# growth in 256 KiB windows, 19 in 1 MiB ones, 6% faster. Texts up to _ONE_WINDOW are
# decoded whole: a few MB of objects at most, and the fewest calls.
_WINDOW = 256 << 10
_ONE_WINDOW = 4 << 20
# Events decoded at a time where the text is split by decoding (see _split).
_CHUNK = 4096
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPACES = re.compile(rb"[ \n\r\t]*")
_TRIES = 16  # cuts tried for a window before the text is split by decoding instead
# Events whose ids are read: kernels and their launches, and the host collective calls.
# Kernel launches: runtime API (cudaLaunchKernel) or driver API (cuLaunchKernelEx, NCCL >= 2.19).
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_LINKED_CATS = ("kernel", *LAUNCH_CATS)


_CUT_SHORT = "incomplete (was its capture or its copy cut short?)"


def load(path: Path) -> Trace:
    text = None
    try:
        text = _Text(path)
        columns = _Columns()
        document = _windows(text, columns)
        if document is None:  # no cuts found, or one was wrong: split the text by decoding it
            columns = _Columns()
            document = _split(text, columns)
    except EOFError:  # gzip's "Compressed file ended before the end-of-stream marker was reached"
        raise ExportError(f"Kineto trace ends early: its gzip stream is {_CUT_SHORT}", path=path) from None
    except (OSError, gzip.BadGzipFile, zlib.error) as exc:
        raise ExportError(f"cannot read Kineto trace ({exc})", path=path) from None
    except msgspec.DecodeError as exc:
        if "truncated" in str(exc):  # msgspec: "Input data was truncated"
            raise ExportError(f"Kineto trace ends early: its JSON is {_CUT_SHORT}", path=path) from None
        plain = path.suffix.lower() == ".gz" and text is not None and not text.gzipped
        raise ExportError(f"not a Kineto JSON trace ({'named .gz but not gzip data; ' if plain else ''}{exc})",
                          path=path) from None
    except RecursionError:  # msgspec's own, for values nested past its depth (thousands of [ in an arg)
        raise ExportError("not a Kineto JSON trace (values nested too deep to decode)", path=path) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ExportError(f"unreadable event time ({exc})", path=path) from None
    if document is None:
        raise ExportError("not a Kineto trace (no traceEvents list)", path=path)
    del text  # the trace's bytes go with the last view of them
    top = {key: value for key, value in zip(_TOP_KEYS, (
        document.schemaVersion, document.distributedInfo, document.baseTimeNanoseconds,
        document.host_name, document.trace_id, document.hook)) if value is not None}
    _check_top(path, top)
    try:
        events = columns.events(_base(path, top))
    except pa.ArrowInvalid as exc:
        raise ExportError(f"unreadable event time ({exc})", path=path) from None
    kept = columns.kept

    def args(rows) -> list[Args]:
        """Identity args of the given rows (-1: none)."""
        return [kept[row] if row >= 0 else _NO_ARGS for row in rows]

    return Trace(top, events, args, columns.untimed, columns.undated)


def without_repeats(trace: Trace, notes: list[str]) -> Trace:
    """The trace with each event that appears more than once (every column alike) counted
    once, and a note, where among them are events that cannot repeat: device activity (one
    stream runs one thing at a time), launches and collective calls (their ids are
    unique). A trace joined with copies of itself had every kernel and call counted as
    many times. Host ops alone may repeat: a nested op of its parent's name and times."""
    events = trace.events
    once = events.of_cat(*DEVICE_CATS, *LAUNCH_CATS) | events.named(events.names.where(_is_identity))
    if not _repeats(events, np.flatnonzero(once))[0].any():
        return trace
    rows = np.arange(len(events.ts))
    repeat, firsts, copies = _repeats(events, rows)
    kernels = int(events.of_cat("kernel")[firsts].sum())
    joined = "a copy" if copies.max() == 2 else "copies"
    notes.append(f"{len(firsts)} event(s) appear {_times(copies)}, every field alike ({kernels} kernel(s) among "
                 f"them): each counted once (was the trace joined with {joined} of itself?)")
    kept = rows[~repeat]

    def args(at: list[int]) -> list[Args]:
        at = np.asarray(at, np.int64)
        return trace.args(np.where(at >= 0, kept[at], -1).tolist())

    return replace(trace, events=events.take(kept), args=args)


def _times(copies: np.ndarray) -> str:
    """How many times events appear, given each one's count (2 or more)."""
    least, most = int(copies.min()), int(copies.max())
    if least == most:
        return "twice" if most == 2 else f"{most} times"
    return f"{least} to {most} times"


def _repeats(events: Events, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Among ``rows``: a mask over all events of the second and later copies of an event,
    and the first copy of each event that repeats, with how many copies it has."""
    columns = [getattr(events, key)[rows] for key in _COLUMNS]
    order = np.lexsort(columns[::-1])
    alike = np.ones(max(len(rows) - 1, 0), bool)
    for column in columns:
        ordered = column[order]
        alike &= ordered[1:] == ordered[:-1]
    repeat = np.zeros(len(events.ts), bool)
    repeat[rows[order[1:][alike]]] = True
    # each run of alike events in sorted order is one event's copies
    starts = np.flatnonzero(np.concatenate(([True], ~alike)))
    copies = np.diff(np.append(starts, len(rows)))
    repeated = copies > 1
    return repeat, rows[order[starts[repeated]]], copies[repeated]


def _is_identity(name: str) -> bool:
    """A name whose events carry a collective's identity in their args."""
    return name.startswith((C10D, NCCL, GLOO)) or name == RPC


def _windows(text: _Text, columns: _Columns) -> _Document | None:
    """Read the events a window of text at a time, cut where one event ends and the next
    begins (``}``, ``,``, ``{``), found by searching the text: no pass over the whole text
    before the events are decoded, and only a window of it in memory. A cut inside a string
    or a nested value, or past the list, leaves something open or closed twice, so its
    window does not decode and the cut before it is tried: a window that decodes is whole
    events, and the text after the last one closes the list. The document's other keys are
    decoded from the text around the events. None where the text has no events list to cut
    or no window decodes within a few tries (the caller splits it by decoding, which also
    reports malformed JSON)."""
    data = text.data
    key = _EVENTS_KEY.search(data)
    if key is None or data[key.start() - 1 : key.start()] == b"\\":
        return None
    view = memoryview(data)
    start = _skip_space(data, key.end())
    opening = key.end() - 1  # the list's "[", until a window is cut from it
    end = start  # the list's closing bracket
    try:
        if data[start : start + 1] != b"]":
            while len(data) > _ONE_WINDOW and (window := _next_window(data, view, start)) is not None:
                columns.add(window[0])
                text.release()
                start, opening = window[1], None
            end = _last_window(data, view, start, opening, columns)
            text.release()
        document = _DOCUMENT.decode(b"".join((view[: key.end()], view[end:])))
    except msgspec.DecodeError:
        return None
    return document if document.traceEvents == [] else None


def _next_window(data, view: memoryview, start: int) -> tuple[list[_Event], int] | None:
    """The events of the window from ``start`` and where the next window starts: the first
    cut whose window decodes, trying the last before ``start + _WINDOW``, then earlier
    ones, then (an event longer than a window) later ones. None where no cut is left (the
    last window); the error where ``_TRIES`` cuts failed."""
    failed = 0
    for cut, after in _cuts(data, start, start + _WINDOW):
        try:
            return _EVENTS.decode(b"".join((b"[", view[start : cut + 1], b"]"))), after
        except msgspec.DecodeError:
            failed += 1
            if failed == _TRIES:
                raise
    return None


def _cuts(data, start: int, stop: int) -> Iterator[tuple[int, int]]:
    """``(window end, next start)`` of each ``}`` followed by ``,`` and ``{`` (spaces
    between) after ``start``: backwards from ``stop``, then forwards from it."""
    cut = data.rfind(b"}", start, stop)
    while cut > start:
        if (found := _cut_at(data, cut)) is not None:
            yield found
        cut = data.rfind(b"}", start, cut)
    cut = data.find(b"}", stop)
    while cut >= 0:
        if (found := _cut_at(data, cut)) is not None:
            yield found
        cut = data.find(b"}", cut + 1)


def _cut_at(data, cut: int) -> tuple[int, int] | None:
    """``(cut, next start)`` where the ``}`` at ``cut`` is followed by ``,`` and ``{``."""
    after = _skip_space(data, cut + 1)
    if data[after : after + 1] == b",":
        after = _skip_space(data, after + 1)
        if data[after : after + 1] == b"{":
            return cut, after
    return None


def _last_window(data, view: memoryview, start: int, opening: int | None, columns: _Columns) -> int:
    """Decode the last window, from ``start`` to the ``}`` followed by ``]`` (the list's
    end) nearest the end of the text whose text decodes; the position of that ``]``.
    ``opening``: the list's ``[`` where the window is the whole list, decoded where it lies
    rather than copied between brackets (a fresh copy of a few MB costs ~1 ms of page
    faults)."""
    cut, failed = len(data), 0
    while (cut := data.rfind(b"}", start, cut)) >= 0:
        after = _skip_space(data, cut + 1)
        if data[after : after + 1] != b"]":
            continue
        window = view[opening : after + 1] if opening is not None else b"".join((b"[", view[start : cut + 1], b"]"))
        try:
            events = _EVENTS.decode(window)
        except msgspec.DecodeError:
            failed += 1
            if failed == _TRIES:
                raise
            continue
        columns.add(events)
        return after
    raise msgspec.DecodeError("no end to the events list")


def _skip_space(data, at: int) -> int:
    """The first position from ``at`` that is not JSON whitespace (a regular expression's
    scan: a loop in Python took ~180 ns a byte, 33 s for the 300 MB of spaces of a 300 KB
    gzipped trace, where a whole trace reads at ~10 ns a byte)."""
    return _SPACES.match(data, at).end()


def _split(text: _Text, columns: _Columns) -> _Document | None:
    """Read the events by splitting the text into one undecoded text per event, then
    decoding those a chunk at a time; the document's other keys with them."""
    document = _DOCUMENT.decode(text.data)
    items = document.traceEvents
    if items is None:
        return None
    document.traceEvents = []
    for first in range(0, len(items), _CHUNK):
        text.release()
        try:
            events = _EVENTS.decode(b"[" + b",".join(items[first : first + _CHUNK]) + b"]")
        except msgspec.ValidationError as exc:  # its path counts in the chunk: say the event's place in the trace
            raise msgspec.ValidationError(_AT_EVENT.sub(lambda m: f"`$.traceEvents[{first + int(m[1])}]", str(exc)))
        columns.add(events)
    return document


_AT_EVENT = re.compile(r"`\$\[(\d+)\]")


class _Text:
    """A trace's bytes. A plain file is mapped, not read, and its pages are dropped from the
    process after each window (they stay in the page cache): the text costs the process
    about a window, not the file's size. A small gzipped file is decompressed in memory; a
    large one into an unnamed temporary file, mapped like a plain one."""

    def __init__(self, path: Path) -> None:
        self.mapped: mmap.mmap | None = None
        self.data: bytes | mmap.mmap = b""
        with path.open("rb") as handle:
            self.gzipped = handle.read(2) == b"\x1f\x8b"
            if not self.gzipped:
                self._map(handle)
                return
            if os.fstat(handle.fileno()).st_size > _GZIP_IN_MEMORY:
                try:
                    with tempfile.TemporaryFile() as plain:
                        handle.seek(0)
                        with gzip.GzipFile(fileobj=handle) as text:
                            shutil.copyfileobj(text, plain, 1 << 20)
                        plain.flush()
                        self._map(plain)
                    return
                except OSError:  # no room for the temporary file (or a bad gzip, refused again below)
                    pass
            handle.seek(0)
            self.data = gzip.decompress(handle.read())

    def _map(self, handle) -> None:
        try:
            self.mapped = self.data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            pass

    def release(self) -> None:
        if self.mapped is not None and _DROP is not None:
            self.mapped.madvise(_DROP)


_DROP = getattr(mmap, "MADV_DONTNEED", None)  # absent where the OS has no madvise: pages stay
# Gzipped traces up to this size are decompressed in memory (~10 MB of text at most;
# through a temporary file ~1 ms slower). Larger ones go through a temporary file: an 18 MB
# trace (1.3 MB gzipped) read with 26 MiB of growth instead of 57, in the same time.
_GZIP_IN_MEMORY = 1 << 20


class _Columns:
    """The complete events' columns, built a chunk of decoded events at a time: strings as
    codes into their distinct values (the same names recur every step), times as int64 ns,
    ids as int64, and the args of only the events whose args carry a collective's identity."""

    def __init__(self) -> None:
        self.distinct: dict[str, _Codes] = {"cat": _Codes(), "name": _Codes(), "pid": _Codes(), "tid": _Codes()}
        self.codes: dict[str, list[np.ndarray]] = {key: [] for key in self.distinct}
        self.numbers: dict[str, list[np.ndarray]] = {key: [] for key in ("ts_ns", "dur_ns", "corr", "ext")}
        self.identity_name = np.zeros(0, bool)  # per distinct name: its events carry identity args
        self.comm_name = np.zeros(0, bool)  # per distinct name: an NCCL kernel's name
        self.kept: dict[int, Args] = {}
        self.rows = 0
        self.untimed = self.undated = 0

    def add(self, decoded: list[_Event]) -> None:
        """The complete (ph X) events of a chunk decoded; those without a ts left out,
        counted (`untimed`), as are those without a dur (`undated`: instants)."""
        events = [e for e in decoded if e.ph == "X"]
        ts = list(map(attrgetter("ts"), events))
        if untimed := ts.count(_EMPTY):
            events = [e for e in events if e.ts]
            ts = list(map(attrgetter("ts"), events))
            self.untimed += untimed
        dur = list(map(attrgetter("dur"), events))
        self.undated += dur.count(_EMPTY)
        n = len(events)
        for key, distinct in self.distinct.items():
            self.codes[key].append(np.fromiter(map(distinct.__getitem__, map(attrgetter(key), events)), np.int32, n))
        # ts and dur in one conversion: each costs ~0.1 ms however few the events
        times = _ns(chain(ts, dur), 2 * n)
        self.numbers["ts_ns"].append(times[:n])
        self.numbers["dur_ns"].append(times[n:])
        self.numbers["corr"].append(np.fromiter(map(attrgetter("args.correlation"), events), np.int64, n))
        self.numbers["ext"].append(np.fromiter(map(attrgetter("args.external"), events), np.int64, n))
        self._classify_new_names()
        name, cat = self.codes["name"][-1], self.codes["cat"][-1]
        kernel = cat == self.distinct["cat"].get("kernel", -1)
        rows = np.flatnonzero(self.identity_name[name] | (kernel & self.comm_name[name])).tolist()
        self.kept.update(zip([self.rows + r for r in rows], [_detached(events[r].args) for r in rows]))
        self.rows += n

    def _classify_new_names(self) -> None:
        """Identity tests once per distinct name, as names first appear."""
        names = list(self.distinct["name"])[len(self.identity_name):]
        if not names:
            return
        by_name = list(map(_is_identity, names))
        self.identity_name = np.concatenate([self.identity_name, np.array(by_name, bool)])
        self.comm_name = np.concatenate([self.comm_name, ops.is_comm_kernel(names)])

    def events(self, base: int) -> Events:
        codes = {key: np.concatenate(parts) if parts else np.zeros(0, np.int32) for key, parts in self.codes.items()}
        numbers = {key: np.concatenate(parts) if parts else np.zeros(0, np.int64)
                   for key, parts in self.numbers.items()}
        text = np.array(list(self.distinct["name"]), dtype=object)
        # Ops of the host calls' and gloo workers' names only: canonical is a regex, and a
        # trace has hundreds of distinct kernel names.
        op = np.array([canonical(n) if n.startswith((C10D, GLOO)) else None for n in text], dtype=object)
        distinct_ops = _Codes()
        op_code = np.array([-1 if o is None else distinct_ops[o] for o in op], np.int64)
        names = _Names(text, self.comm_name, op, op_code)
        cats = dict(self.distinct["cat"])
        cat = codes["cat"]
        # Ids of the events that are linked; any others an event carries are not read.
        linked = equal_any(cat, [cats[c] for c in _LINKED_CATS if c in cats])
        linked |= names.where(lambda n: n.startswith(C10D) or n == RPC)[codes["name"]]
        return Events(
            cat=cat,
            name=codes["name"],
            pid=codes["pid"],
            thread=codes["pid"].astype(np.int64) * (len(self.distinct["tid"]) + 1) + codes["tid"],
            ts=_epoch_ns(numbers["ts_ns"], numbers["dur_ns"], base),
            dur=numbers["dur_ns"],
            corr=np.where(linked, numbers["corr"], -1),
            ext=np.where(linked, numbers["ext"], -1),
            cats=cats,
            names=names,
            pids=list(self.distinct["pid"]),
        )


def _epoch_ns(ts: np.ndarray, dur: np.ndarray, base: int) -> np.ndarray:
    """``ts + base``, refusing starts and ends that leave int64 ns (numpy wraps them round
    silently: a corrupt ts became a time before 1970, and the rank's busy time vanished)."""
    if len(ts) and not I64_MIN <= int(ts.min()) + base <= int(ts.max()) + base <= I64_MAX:
        raise pa.ArrowInvalid(f"an event's ts is past int64 ns once baseTimeNanoseconds {base} is added")
    ts = ts + base
    if len(ts) and int(ts.max()) + max(int(dur.max()), 0) > I64_MAX and (ts > I64_MAX - np.maximum(dur, 0)).any():
        raise pa.ArrowInvalid("an event ends past int64 ns (its ts + dur)")
    return ts


def equal_any(values: np.ndarray, wanted: list) -> np.ndarray:
    """Mask of the values equal to any of a few wanted ones: one comparison each (np.isin
    costs 70-600 µs on a large trace's column, this 10-20)."""
    mask = np.zeros(len(values), bool)
    for value in wanted:
        mask |= values == value
    return mask


def present(values: np.ndarray) -> np.ndarray:
    """Mask of the non-null values of an object column."""
    return np.not_equal(values, None)


class _Codes(dict):
    """Value -> code, first seen first. Events are looked up by C iteration; Python runs
    only for a value not seen before."""

    def __missing__(self, value) -> int:
        code = self[value] = len(self)
        return code


def _detached(args: Args) -> Args:
    """Args kept past their chunk: input shapes copied, so they do not pin the chunk's text."""
    if args.dims or args.types or args.concrete:
        return msgspec.structs.replace(args, dims=args.dims.copy(), types=args.types.copy(),
                                       concrete=args.concrete.copy())
    return args


# µs with up to 18 decimals and 20 integer digits; rounding to 3 decimals gives whole ns.
_MICROS = pa.decimal128(38, 18)
_NANOS_AS_MICROS = pa.decimal128(38, 3)
_COMMA, _POINT, _MINUS, _ZERO, _E, _CAPITAL_E = b",.-0eE"
_MAX_WHOLE_DIGITS = 20  # past int64 ns (19 digits) as µs, with leading zeros to spare
_POWERS = 10 ** np.arange(19, dtype=np.uint64)
_INT64_MAX = np.iinfo(np.int64).max


def _ns(numbers: Iterable[msgspec.Raw], count: int) -> np.ndarray:
    """``count`` JSON numbers of µs (their exact decimal text; empty: 0) -> int64 ns, rounded
    half away from zero, all at once: the texts, each ended by a comma (which no number
    holds), read digit by digit where they are plain decimals with at most 3 decimals (as
    Kineto writes them), else cast to decimal in Arrow. Never through float64."""
    if not count:
        return np.zeros(0, np.int64)
    joined = np.frombuffer(b",".join(numbers) + b",", np.uint8)
    comma = joined == _COMMA
    ends = np.flatnonzero(comma)
    if len(ends) != count:
        raise pa.ArrowInvalid("an event time is not a JSON number")
    plain = _plain_ns(joined, ends)
    return plain if plain is not None else _decimal_ns(joined, comma, ends)


def _plain_ns(joined: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """ns of JSON numbers each ended by a comma (valid, as decoded: at most one point, a
    minus only first) as the sum of their digits' place values, in uint64. None where a
    number has an exponent, more than 3 decimals or 16 characters before its point, or is
    2**63 ns or more: the Arrow cast reads (or refuses) those. As fast as the cast, without
    its set-up, ~0.7 ms the first time in a process."""
    digit = joined - _ZERO  # the other bytes wrap past 9
    is_digit = digit < 10
    points = np.flatnonzero(joined == _POINT)
    minus = np.flatnonzero(joined == _MINUS)
    if np.count_nonzero(is_digit) + len(ends) + len(points) + len(minus) != len(joined):
        return None  # an exponent, or not a number
    starts = _starts(ends)
    point = ends.copy()  # without a point, the number's end
    point[np.searchsorted(ends, points)] = points
    if (ends - point > 4).any() or (point - starts > 16).any():
        return None
    # A digit at i, p its number's point, is 10**(p - i - 1) µs before the point and
    # 10**(p - i) after: 10**(p - i + 2) or 10**(p - i + 3) ns (0 to 18). Computed in place,
    # in int32 (the texts of a window's times: far from 2**31 bytes): fresh temporaries of a
    # few MB cost more in page faults than in arithmetic.
    place = np.repeat(point.astype(np.int32), ends - starts + 1)
    place -= np.arange(len(joined), dtype=np.int32)
    place += 2
    place += place < 2
    values = _POWERS.take(place, mode="clip")
    digit *= is_digit
    values *= digit
    # Sums per number from its first byte (an empty number's is its comma: 0); each is exact.
    ns = np.add.reduceat(values, starts)
    if (ns > _INT64_MAX).any():
        return None
    ns = ns.astype(np.int64)
    ns[np.searchsorted(ends, minus)] *= -1
    return ns


def _starts(ends: np.ndarray) -> np.ndarray:
    """Where each number begins, in the texts each ended by a comma at ``ends``."""
    return np.concatenate(([0], ends[:-1] + 1))


def _decimal_ns(joined: np.ndarray, comma: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """ns of JSON numbers each ended by a comma through Arrow's decimal cast: the texts as
    one string array, cast to decimal, and the decimal's unscaled integer at 3 decimals is
    the ns."""
    count, starts = len(ends), _starts(ends)
    marks = np.flatnonzero(comma | (joined == _POINT) | (joined == _E) | (joined == _CAPITAL_E))
    whole = marks[np.searchsorted(marks, starts)] - starts - (joined[starts] == _MINUS)
    if (whole > _MAX_WHOLE_DIGITS).any():  # the cast wraps them (Arrow 26: 2**128 + 320 reads as 320)
        raise pa.ArrowInvalid(f"an event time has more than {_MAX_WHOLE_DIGITS} digits before its point: beyond int64 ns")
    offsets = np.zeros(count + 1, np.int64)
    offsets[1:] = ends - np.arange(count)
    empty = offsets[1:] == offsets[:-1]
    valid = pa.py_buffer(np.packbits(~empty, bitorder="little")) if empty.any() else None
    strings = pa.Array.from_buffers(pa.large_string(), count, [valid, pa.py_buffer(offsets),
                                                               pa.py_buffer(joined[~comma])])
    try:
        micros = strings.cast(_NANOS_AS_MICROS)  # Kineto writes at most 3 decimals: exact
    except pa.ArrowInvalid:  # more decimals: round them to whole ns
        micros = pc.round(strings.cast(_MICROS), 3, round_mode="half_towards_infinity").cast(_NANOS_AS_MICROS)
    nanos = pa.Array.from_buffers(pa.decimal128(38, 0), count, micros.buffers()).cast(pa.int64())
    return (nanos.fill_null(0) if valid is not None else nanos).to_numpy()


def instants(events: Events, notes: list[str]) -> None:
    """A negative ``dur`` (a profiler's broken event) is taken as an instant: its start
    stands, its time counts nowhere, where it had cut busy time and could end the window
    before it began."""
    negative = events.dur < 0
    if negative.any():
        events.dur[negative] = 0
        notes.append(f"{int(negative.sum())} event(s) with a negative duration: taken as instants (dur 0)")


def _base(path: Path, top: dict) -> int:
    base = top.get("baseTimeNanoseconds")
    try:
        value = int(base) if base is not None else 0
    except (TypeError, ValueError, OverflowError):  # int() of inf overflows
        raise ExportError(f"baseTimeNanoseconds {base!r} is not an integer", path=path) from None
    if not I64_MIN <= value <= I64_MAX:
        raise ExportError(f"baseTimeNanoseconds {base!r} is beyond int64 ns", path=path)
    return value


# The hook's Flight Recorder columns the reading looks up by name.
_FR_COLUMNS = ("pg_name", "seq", "profiling_name", "time_created_ns")


def _check_top(path: Path, top: dict) -> None:
    """The metadata objects the reading walks into are objects, and the hook's Flight
    Recorder has the columns it reads: else one error naming the file, not a traceback."""
    for key in ("distributedInfo", HOOK_KEY):
        if key in top and not isinstance(top[key], dict):
            raise ExportError(f"malformed trace: {key} is a {type(top[key]).__name__}, not an object", path=path)
    groups = top.get("distributedInfo", {}).get("pg_config")
    if groups is not None and not isinstance(groups, list):
        raise ExportError(f"malformed trace: distributedInfo.pg_config is a {type(groups).__name__}, not a list",
                          path=path)
    recorder = top.get(HOOK_KEY, {}).get("flight_recorder")
    if recorder is None:
        return
    columns = recorder.get("columns") if isinstance(recorder, dict) else None
    if not isinstance(columns, list) or not isinstance(recorder.get("rows"), list) or \
            not set(_FR_COLUMNS) <= set(columns):
        raise ExportError(f"malformed trace: {HOOK_KEY}.flight_recorder lacks columns and rows with "
                          f"{', '.join(_FR_COLUMNS)}", path=path)
    numbers = [columns.index(name) for name in ("seq", "time_created_ns")]
    for row in recorder["rows"]:  # each read by position, its seq and time as int64
        if not isinstance(row, list) or len(row) != len(columns) or any(as_int64(row[i]) is None for i in numbers):
            raise ExportError(f"malformed trace: a {HOOK_KEY}.flight_recorder row is not {len(columns)} values "
                              f"with an integer seq and time_created_ns: {str(row)[:80]}", path=path)


def as_int64(value) -> int | None:
    """An integer arg (an int or its text) as an int; anything else, or beyond int64, None."""
    try:
        number = None if value is None else int(value)
    except (TypeError, ValueError, OverflowError):  # int() of inf overflows
        return None
    return number if number is None or I64_MIN <= number <= I64_MAX else None


def canonical(name) -> str | None:
    """ops.canonical of a name; None for an arg that is no string (a list, an object: the
    cache could not even hash them)."""
    return _canonical_text(name) if isinstance(name, str) else None


@functools.lru_cache(maxsize=4096)
def _canonical_text(name: str) -> str | None:
    """ops.canonical, once per distinct spelling (the same names recur every step)."""
    return ops.canonical(name)
