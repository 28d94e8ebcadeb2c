"""A capture window, asked of a rank through the spool: how the agent has its ranks record.

The agent never drives a rank's profiler itself. The rank's own side does, as the user
that started it and in its container: the torch hook inside the rank's Python process,
and for nsys the `rankscope rank` wrapper, which runs ``nsys start/stop`` on the session
its ``nsys launch`` opened, as the User Guide's interactive CLI has the launching user
do. That an agent could drive a session from outside is unverified (nsys-export.md §9),
and likely false where it runs in another pod (a pod's /tmp, where nsys keeps session
state, and its namespaces are its own) or as another user (root's fleet agent beside a
job). Both ends meet in the spool, which every container of the host shares.

One folder per capture, ``<spool>/captures/<sweep>/``, open to every user (the ranks
answer as theirs):

    start.json      {"ranks": [keys], "max_s": S, "options": {key: {...}}}: these ranks
                    make ready to record, for S seconds at most (a window whose stop never
                    comes, its agent lost, ends there), each with its own options
    <key>.ready     the rank's reply once ready: {"notes": [...], "counters": bool}
    go.json         {"at": T}: the ready ranks start recording at T (epoch seconds)
    <key>.started   the rank's reply once it records: {"notes": [...], "counters": bool}
                    (counters: it reads the GPU counters as it records, the node's GPU-metrics
                    sampler; absent, from older wrappers, taken as true)
    stop.json       {"at": T}: the ranks end the window at T
    <key>.stopped   the rank's reply once its recording has ended and its output is
                    written: {"notes": [...], "counters": bool}
    <key>.error     why this rank could not record (or stop)

Making ready is the slow, uneven part (torch.profiler's first start imports
torch._inductor, 1 to 2.5 s; the node's GPU-metrics sampler checks the counters first),
and a rank that began its window seconds after another missed the window's first
collectives, which were then dropped as incomplete. So the ranks start together, at one
time on the clock their node shares (the sweep's start, the same for every node, where
they are ready by then), and stop so too (not each at its next poll). Ranks are named by
their key, not their pid: containers sharing the spool have pids of their own (spool.py).
A rank records one window at a time: asked by a second capture meanwhile (two agents
reading one spool), it answers that one with an error.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rankscope import atomic, output
from rankscope.agent.spool import RankInfo, lives
from rankscope.errors import RankscopeError

log = logging.getLogger(__name__)

# What a wrapper announces it answers (`RankInfo.protocol`): 1, the files below. The agent's
# image and a job's (a pod's) are built apart, and a wrapper that does not answer would only
# be found out by a start that times out.
PROTOCOL = 1
START, GO, STOP = "start.json", "go.json", "stop.json"
READY, STARTED, STOPPED, ERROR = "ready", "started", "stopped", "error"
POLL_S = 0.05
CANCELLED = "the capture was cancelled"
# How far ahead of now go.json and stop.json set the time: past the poll by which every rank reads them.
LEAD_S = 0.25
MAX_WAIT_S = 2.0  # what a rank waits for such a time at most (a clock far off, a bad value)
# A sweep's start further ahead than this is a coordinator whose clock is off, not a plan.
MAX_AHEAD_S = 60.0
MAX_WINDOW_S = 3600.0  # the longest window, whatever start.json asks
# Beyond the capture's duration, when a rank ends its window by itself: the agent was lost.
GRACE_S = 60.0
EXITED = "the rank exited"


def captures_dir(spool: Path) -> Path:
    return Path(spool) / "captures"


def reply_path(folder: Path, key: str, kind: str) -> Path:
    return folder / f"{key}.{kind}"


# -- the rank's side -----------------------------------------------------------------------


class Window(Protocol):
    """One recording: made ready by its opener, recording from `start` until `close`."""

    notes: list[str]  # what the rank's replies say besides (it records without GPU metrics, ...)
    counters: bool  # it reads the GPU counters as it records (the node's GPU-metrics sampler)

    def start(self) -> None:
        """Begin recording (quick: the opener did the slow part); raise where it cannot."""

    def close(self, folder: Path) -> None:
        """End the recording and write its output; raise with the reason where it cannot."""


class NoWindow(Exception):
    """This rank records no window, for the reason given (said as it is, not as a crash)."""


# Makes a window ready for the capture in ``folder`` with the options start.json gives this rank.
Opener = Callable[[Path, Mapping[str, Any]], Window]


class Watcher:
    """The rank's side: makes a window ready where a capture asks for this rank, starts it
    on go.json, closes it on stop.json, on its deadline, when the capture's folder goes
    away, or at `close`. Runs on its one thread, from `start` (Kineto requires its windows
    started and ended on one)."""

    def __init__(self, spool: Path, key: str, opener: Opener) -> None:
        self.root = captures_dir(spool)
        self.key = key
        self.opener = opener
        self.seen: dict[str, tuple[int, int]] = {}  # capture -> its start.json (inode, mtime) as read
        self.installed = time.time()
        self.closing = threading.Event()
        self.window: Window | None = None  # the capture's, ready or recording
        self.recording = False
        self.folder = Path()
        self.said = 0  # of the window's notes, how many its replies gave
        self.max_s = 0.0
        self.deadline = 0.0  # of waiting for go.json, then of the recording
        self.thread = threading.Thread(target=self.watch, name="rankscope-window", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self, timeout_s: float) -> None:
        """The rank is ending: close an open window (its output is still written), then stop."""
        self.closing.set()
        self.thread.join(timeout_s)

    def watch(self) -> None:
        while not self.closing.wait(POLL_S):
            if self.window is not None:
                self._step()
            for folder, request in self._requests():
                if self.window is None:
                    self._prepare(folder, request)
                else:
                    _reply(folder, self.key, ERROR, f"already recording for capture {self.folder.name}")
        if self.recording:
            self._close()

    def _step(self) -> None:
        """Start the ready window on go.json, or give it up with its capture; close the
        recording one when asked, or past its deadline."""
        gone = not self.folder.is_dir() or (self.folder / STOP).exists()
        if self.recording:
            if gone or time.monotonic() > self.deadline:
                _sleep_until(self.folder / STOP)
                self._close()
        elif (self.folder / GO).exists():
            self._begin()
        elif gone or time.monotonic() > self.deadline:
            self.window = None  # ready, never started: nothing recorded, nothing to end

    def _requests(self) -> Iterator[tuple[Path, dict]]:
        """Captures newly asking for this rank (not ones asked before it started watching);
        a start.json written anew (the same capture asking again) is a new request."""
        for start in sorted(self.root.glob(f"*/{START}")):
            folder = start.parent
            try:
                written = start.stat()
                if self.seen.get(folder.name) == (written.st_ino, written.st_mtime_ns):
                    continue
                request = json.loads(start.read_text())
            except (OSError, ValueError):
                continue  # being written (or just removed): look again next turn
            self.seen[folder.name] = (written.st_ino, written.st_mtime_ns)
            if (isinstance(request, dict) and self.key in request.get("ranks", [])
                    and written.st_mtime >= self.installed - 1):
                yield folder, request

    def _prepare(self, folder: Path, request: dict) -> None:
        try:
            max_s = min(float(request.get("max_s", MAX_WINDOW_S)), MAX_WINDOW_S)
            window = self.opener(folder, request.get("options", {}).get(self.key, {}))
        except Exception as exc:  # said to the agent, never raised into the rank (nor ending this thread)
            _reply(folder, self.key, ERROR, _reason(exc))
            return
        self.window, self.recording, self.folder, self.said = window, False, folder, 0
        self.max_s, self.deadline = max_s, time.monotonic() + max_s
        self._say(READY)

    def _begin(self) -> None:
        try:
            _sleep_until(self.folder / GO)
            self.window.start()
        except Exception as exc:
            self.window = None
            _reply(self.folder, self.key, ERROR, _reason(exc))
            return
        self.recording, self.deadline = True, time.monotonic() + self.max_s
        if not self._say(STARTED):
            self._close()  # its capture is gone already

    def _close(self) -> None:
        window, self.window, self.recording = self.window, None, False
        try:
            window.close(self.folder)
        except Exception as exc:
            _reply(self.folder, self.key, ERROR, _reason(exc))
            return
        self._say(STOPPED, window)

    def _say(self, kind: str, window: Window | None = None) -> bool:
        """Reply ``kind``, with the window's notes not said before."""
        window = window or self.window
        said, self.said = self.said, len(window.notes)
        return _reply(self.folder, self.key, kind, json.dumps({"notes": window.notes[said:], "counters": window.counters}))


def _sleep_until(path: Path) -> None:
    """Until the time ``path`` (go.json, stop.json) names, if it names one (bounded)."""
    try:
        at = float(json.loads(path.read_text())["at"])
    except (OSError, ValueError, TypeError, KeyError):
        return
    time.sleep(min(max(0.0, at - time.time()), MAX_WAIT_S))


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, (NoWindow, RankscopeError)) else f"{type(exc).__name__}: {exc}"


def _reply(folder: Path, key: str, kind: str, text: str) -> bool:
    """Whether the reply was written: not where the capture's folder went away (no agent
    waits for the answer)."""
    try:
        atomic.write_text(reply_path(folder, key, kind), text)
    except OSError:
        return False
    return True


# -- the agent's side ----------------------------------------------------------------------


def folder_of(sweep_id: str, rank: RankInfo) -> Path:
    """The capture's folder in the spool the agent found the rank in (its own mount of it)."""
    return captures_dir(Path(rank.spool)) / sweep_id


def by_folder(sweep_id: str, ranks: Sequence[RankInfo]) -> dict[Path, list[RankInfo]]:
    folders: dict[Path, list[RankInfo]] = {}
    for rank in ranks:
        folders.setdefault(folder_of(sweep_id, rank), []).append(rank)
    return folders


def ask(sweep_id: str, ranks: Sequence[RankInfo], max_s: float,
        options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Ask ``ranks`` to record (``options``: by rank key, what each one needs)."""
    for folder, group in by_folder(sweep_id, ranks).items():
        output.make_folder(folder.parent, shared=True)
        output.make_folder(folder, shared=True)
        keys = [r.key for r in group]
        for path in [folder / GO, folder / STOP,
                     *(reply_path(folder, key, kind) for key in keys for kind in (READY, STARTED, STOPPED, ERROR))]:
            path.unlink(missing_ok=True)  # a capture asking again: not the answers to its last ask
        atomic.write_text(folder / START, json.dumps({
            "ranks": keys, "max_s": max_s, "options": {key: dict((options or {}).get(key, {})) for key in keys}}))


def asked(sweep_id: str, ranks: Sequence[RankInfo]) -> list[RankInfo]:
    """The ranks this capture asked to record (an agent restarted mid-window knows them so)."""
    named: set[str] = set()
    for folder in by_folder(sweep_id, ranks):
        try:
            named.update(json.loads((folder / START).read_text()).get("ranks", []))
        except (OSError, ValueError):
            continue
    return [r for r in ranks if r.key in named]


def open_windows(sweep_id: str, ranks: Sequence[RankInfo], max_s: float, timeout_s: float, *,
                 options: Mapping[str, Mapping[str, Any]] | None = None, all_or_none: bool = False,
                 start_at: float = 0.0, cancelled: threading.Event | None = None) -> Replies:
    """Ask ``ranks`` to record, and start the ready ones together, at ``start_at`` (epoch
    seconds: the sweep's time for every node) where they are ready before it; how each
    answered (``done``: started, with the notes of both its replies). ``all_or_none``:
    where one cannot be ready, none starts. ``cancelled`` ends the waits before the ranks
    are told to go: those not ready yet fail with `CANCELLED`, and none goes (DCGM is paused
    meanwhile: a wait for ready ranks runs up to ``timeout_s``)."""
    cancelled = cancelled or threading.Event()
    ask(sweep_id, ranks, max_s, options)
    ready = wait(sweep_id, ranks, READY, timeout_s, cancelled)
    replies = Replies(failed=ready.failed, exited=ready.exited)
    if not ready.done or (all_or_none and (ready.failed or ready.exited)):
        return replies
    ahead = start_at - time.time()
    if ahead > MAX_AHEAD_S:
        log.warning("capture %s: its start is %.0f s ahead of this node's clock: starting now", sweep_id, ahead)
    elif ahead > LEAD_S + POLL_S:  # a poll early: a wait that wakes late must not move the start
        cancelled.wait(ahead - LEAD_S - POLL_S)
    if cancelled.is_set():
        replies.failed += [(CANCELLED, rank) for rank, _ in ready.done]
        return _in_order(replies, ranks)
    replies.began = go(sweep_id, [rank for rank, _ in ready.done], at=start_at if ahead <= MAX_AHEAD_S else 0.0)
    # Not cancelled: told to go, a rank records until it is told to stop, which needs it started.
    started = wait(sweep_id, [rank for rank, _ in ready.done], STARTED, timeout_s)
    said = {id(rank): notes for rank, notes in ready.done}
    replies.done = [(rank, said[id(rank)] + notes) for rank, notes in started.done]
    replies.failed += started.failed
    replies.exited += started.exited
    replies.counters = started.counters
    return _in_order(replies, ranks)


def go(sweep_id: str, ranks: Sequence[RankInfo], at: float = 0.0) -> float:
    """The ready ranks start recording, together, at ``at`` or `LEAD_S` from now, whichever
    is later; that time."""
    return _at(GO, sweep_id, ranks, at)


def tell_stop(sweep_id: str, ranks: Sequence[RankInfo], at: float = 0.0) -> float:
    """The ranks stop recording, together, at ``at`` or `LEAD_S` from now, whichever is later."""
    return _at(STOP, sweep_id, ranks, at)


def _at(name: str, sweep_id: str, ranks: Sequence[RankInfo], at: float) -> float:
    at = max(at, time.time() + LEAD_S)  # every rank reads it before then
    for folder in by_folder(sweep_id, ranks):
        if folder.is_dir():
            atomic.write_text(folder / name, json.dumps({"at": at}))
    return at


def end_windows(sweep_id: str, ranks: Sequence[RankInfo], timeout_s: float) -> Replies:
    """``ranks`` end their windows together (`tell_stop`); how each answered (bounded):
    ``done`` once its output is written."""
    tell_stop(sweep_id, ranks)
    return wait(sweep_id, ranks, STOPPED, timeout_s)


def recording(sweep_id: str, ranks: Sequence[RankInfo]) -> list[RankInfo]:
    """The ranks that said they began recording for this capture."""
    return [rank for rank in ranks if reply_path(folder_of(sweep_id, rank), rank.key, STARTED).exists()]


def forget(sweep_id: str, ranks: Sequence[RankInfo]) -> None:
    """Remove the capture's folders: a rank still recording in one ends its window."""
    for folder in by_folder(sweep_id, ranks):
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Replies:
    """How the ranks answered: in time, with their notes; with an error (None: no answer
    in time); or not at all, their wrapper gone."""

    done: list[tuple[RankInfo, list[str]]] = field(default_factory=list)
    failed: list[tuple[str | None, RankInfo]] = field(default_factory=list)
    exited: list[RankInfo] = field(default_factory=list)
    began: float = 0.0  # `open_windows`: when the windows began (epoch seconds), 0 where none did
    counters: list[RankInfo] = field(default_factory=list)  # of ``done``, those that read the GPU counters

    def failures(self) -> list[tuple[str | None, RankInfo]]:
        """The ranks that did not answer as asked, with why: their error, None (no answer in
        time), or that the rank exited."""
        return self.failed + [(EXITED, rank) for rank in self.exited]


def wait(sweep_id: str, ranks: Sequence[RankInfo], kind: str, timeout_s: float,
         cancelled: threading.Event | None = None) -> Replies:
    """Wait (bounded, and until ``cancelled``) for each rank's ``kind`` reply, its error, or
    its end; each list in the order of ``ranks``."""
    cancelled = cancelled or threading.Event()
    deadline = time.monotonic() + timeout_s
    pending = list(ranks)
    replies = Replies()
    while pending:
        for rank in list(pending):
            folder = folder_of(sweep_id, rank)
            if reply_path(folder, rank.key, kind).exists():
                said = _said(reply_path(folder, rank.key, kind))
                replies.done.append((rank, [str(note) for note in said.get("notes", [])]))
                if said.get("counters", True) is not False:  # an older wrapper's: as it was, read
                    replies.counters.append(rank)
            elif reply_path(folder, rank.key, ERROR).exists():
                replies.failed.append((_read(reply_path(folder, rank.key, ERROR)), rank))
            elif not lives(rank):
                replies.exited.append(rank)
            else:
                continue
            pending.remove(rank)
        if pending and time.monotonic() > deadline:
            replies.failed.extend((None, r) for r in pending)
            break
        if pending and cancelled.wait(POLL_S):
            replies.failed.extend((CANCELLED, r) for r in pending)
            break
    return _in_order(replies, ranks)


def _in_order(replies: Replies, ranks: Sequence[RankInfo]) -> Replies:
    """Each list in the order of ``ranks`` (as asked, not as answered)."""
    order = {id(rank): at for at, rank in enumerate(ranks)}
    replies.done.sort(key=lambda reply: order[id(reply[0])])
    replies.failed.sort(key=lambda reply: order[id(reply[1])])
    replies.exited.sort(key=lambda rank: order[id(rank)])
    return replies


def _said(path: Path) -> dict:
    """A reply's JSON; {} where it cannot be read as one."""
    try:
        said = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return said if isinstance(said, dict) else {}


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        return f"its error could not be read ({exc.strerror or exc})"


def within(failed: Sequence[tuple[str | None, RankInfo]], timeout_s: float) -> str:
    """" within N s" where some rank gave no answer in time; nothing where each said why."""
    return f" within {timeout_s:g} s" if any(error is None for error, _ in failed) else ""


def reasons(failed: Sequence[tuple[str | None, RankInfo]], no_answer: str) -> list[str]:
    """Each reason once, with the ranks that gave it (a node's 8 ranks often fail alike)."""
    ranks: dict[str, list[int]] = {}
    for error, rank in failed:
        ranks.setdefault(error or no_answer, []).append(rank.rank)
    return [f"rank{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}: {error}"
            for error, numbers in ranks.items()]
