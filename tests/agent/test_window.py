"""The window protocol's rank side (a Watcher with a window that only notes what it is told),
and the agent side's waits, in one process: the backends' tests run both with real ranks."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rankscope.agent import window
from rankscope.agent.spool import RankInfo

pytestmark = pytest.mark.timeout(60)


class Recorded:
    """A window that records nothing, and says what was done to it."""

    def __init__(self, options: dict) -> None:
        self.options = options
        self.notes = ["ready"]
        self.counters = bool(options.get("counters"))
        self.started_at: float | None = None
        self.closed_in: Path | None = None
        time.sleep(float(options.get("prepare_s", 0)))

    def start(self) -> None:
        self.started_at = time.time()
        self.notes.append("started")

    def close(self, folder: Path) -> None:
        self.closed_in, self.closed_at = folder, time.time()
        self.notes.append("closed")


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


@pytest.fixture
def rank(tmp_path: Path):
    """A Watcher for rank 0 of the spool ``tmp_path``, its windows in ``opened``."""
    opened: list[Recorded] = []
    info = RankInfo(rank=0, local_rank=0, world_size=1, pid=os.getpid(), host="h", token="k0", spool=str(tmp_path),
                    protocol=window.PROTOCOL)
    watcher = window.Watcher(tmp_path, info.key, lambda folder, options: opened.append(Recorded(dict(options)))
                             or opened[-1])
    watcher.start()
    yield info, watcher, opened
    watcher.close(10)


def test_a_window_opens_when_asked_and_closes_on_stop_with_the_notes_of_each_part(rank) -> None:
    info, _, opened = rank
    started = window.open_windows("sw1", [info], 60, 10, options={info.key: {"output": "/r"}})
    assert started.done == [(info, ["ready", "started"])] and opened[0].options == {"output": "/r"}
    stopped = window.end_windows("sw1", [info], 10)
    assert stopped.done == [(info, ["closed"])]  # only what is new since the start's reply
    assert opened[0].closed_in == window.folder_of("sw1", info)


def test_the_ranks_that_read_the_gpu_counters_say_so_and_an_older_wrappers_reply_counts_as_one(rank) -> None:
    """The agent keeps DCGM paused through the window only where a rank reads the counters:
    the sampler says so in its start reply; a wrapper from before the field is taken as one."""
    info, _, opened = rank
    assert window.open_windows("sw1", [info], 60, 10, options={info.key: {"counters": True}}).counters == [info]
    window.end_windows("sw1", [info], 10)
    assert window.open_windows("sw2", [info], 60, 10).counters == []
    window.end_windows("sw2", [info], 10)
    folder = window.folder_of("old", info)
    folder.mkdir(parents=True)
    window.reply_path(folder, info.key, window.STARTED).write_text(json.dumps({"notes": ["from before"]}))
    older = window.wait("old", [info], window.STARTED, 10)
    assert older.done == [(info, ["from before"])] and older.counters == [info]


def test_a_malformed_request_is_answered_and_the_next_one_served(rank) -> None:
    info, _, opened = rank
    folder = window.folder_of("bad", info)
    folder.mkdir(parents=True)
    (folder / window.START).write_text(json.dumps({"ranks": [info.key], "max_s": "soon"}))
    failed = window.wait("bad", [info], window.STARTED, 10)
    assert failed.failed == [("ValueError: could not convert string to float: 'soon'", info)] and not opened
    assert window.open_windows("good", [info], 60, 10).done == [(info, ["ready", "started"])]


def test_a_window_ends_by_its_deadline_when_no_stop_comes(rank) -> None:
    info, _, opened = rank
    window.open_windows("sw1", [info], 0.2, 10)
    assert window.wait("sw1", [info], window.STOPPED, 10).done == [(info, ["closed"])]


def test_the_rank_ending_closes_its_open_window(rank) -> None:
    info, watcher, opened = rank
    window.open_windows("sw1", [info], 60, 10)
    watcher.close(10)
    assert not watcher.thread.is_alive() and opened[0].closed_in is not None
    assert window.reply_path(window.folder_of("sw1", info), info.key, window.STOPPED).exists()


def test_a_request_from_before_the_rank_watched_is_not_its_own(tmp_path: Path) -> None:
    """A start.json left in the spool by an earlier capture (its agent gone) is not taken up
    by a rank that starts later."""
    info = RankInfo(rank=0, local_rank=0, world_size=1, pid=os.getpid(), host="h", token="k0", spool=str(tmp_path))
    window.ask("old", [info], 60)
    start = window.folder_of("old", info) / window.START
    os.utime(start, (time.time() - 60, time.time() - 60))
    opened: list = []
    watcher = window.Watcher(tmp_path, info.key, lambda folder, options: opened.append(folder) or Recorded({}))
    watcher.start()
    try:
        window.ask("new", [info], 60)
        _until("the new capture to start", lambda: len(opened) == 1)
        assert opened == [window.folder_of("new", info)]
    finally:
        watcher.close(10)


def test_ranks_that_take_long_to_be_ready_still_start_together_and_stop_together(tmp_path: Path) -> None:
    """One rank's first window takes seconds to make ready (torch.profiler's imports, the
    sampler's check of the counters): started as each was ready, it began seconds after the
    others and missed the window's first collectives. Stopped each at its next poll, they
    ended up to a poll apart."""
    infos = [RankInfo(rank=n, local_rank=n, world_size=3, pid=os.getpid(), host="h", token=f"k{n}",
                      spool=str(tmp_path), protocol=window.PROTOCOL) for n in range(3)]
    windows: list[Recorded] = []
    watchers = [window.Watcher(tmp_path, info.key, lambda folder, options: windows.append(Recorded(dict(options)))
                               or windows[-1]) for info in infos]
    for watcher in watchers:
        watcher.start()
    try:
        opened = window.open_windows("sw1", infos, 60, 10, options={"k1": {"prepare_s": 1.5}})
        assert [rank for rank, _ in opened.done] == infos and not opened.failed
        starts = [w.started_at for w in windows]
        assert max(starts) - min(starts) < 0.1, starts
        # each began after the slowest was ready, not as soon as it was
        assert min(starts) >= max(window.reply_path(window.folder_of("sw1", i), i.key, window.READY).stat().st_mtime
                                  for i in infos) - 0.01
        window.tell_stop("sw1", infos)
        at = json.loads((window.folder_of("sw1", infos[0]) / window.STOP).read_text())["at"]
        assert [rank for rank, _ in window.wait("sw1", infos, window.STOPPED, 10).done] == infos
        ends = [w.closed_at for w in windows]
        assert min(ends) >= at - 0.005 and max(ends) - min(ends) < 0.1, (at, ends)
    finally:
        for watcher in watchers:
            watcher.close(10)


def test_a_rank_that_cannot_be_ready_leaves_the_others_unstarted_where_all_or_none_is_asked(rank, tmp_path) -> None:
    info, _, opened = rank
    absent = RankInfo(rank=1, local_rank=1, world_size=2, pid=os.getpid(), host="h", token="k1", spool=str(tmp_path))
    replies = window.open_windows("sw1", [info, absent], 60, 0.5, all_or_none=True)
    assert replies.failed == [(None, absent)] and replies.done == []
    assert opened and opened[0].started_at is None
    assert not (window.folder_of("sw1", info) / window.GO).exists()


def test_a_cancel_ends_the_waits_and_tells_no_rank_to_go(rank, tmp_path) -> None:
    """DCGM is paused while the agent waits: a cancelled capture waited up to the whole
    bound for a rank that never made ready, or for the sweep's start, and then started."""
    info, _, opened = rank
    absent = RankInfo(rank=1, local_rank=1, world_size=2, pid=os.getpid(), host="h", token="k1", spool=str(tmp_path))
    for sweep, ranks, start_at in (("sw1", [info, absent], 0.0), ("sw2", [info], time.time() + 30)):
        cancelled = threading.Event()
        threading.Timer(0.3, cancelled.set).start()
        began = time.monotonic()
        replies = window.open_windows(sweep, ranks, 60, 30, all_or_none=True, start_at=start_at, cancelled=cancelled)
        assert time.monotonic() - began < 5, sweep
        assert replies.failed == [(window.CANCELLED, ranks[-1])] and replies.done == [], sweep
        assert not (window.folder_of(sweep, info) / window.GO).exists()
        window.forget(sweep, ranks)  # as the backend does once its start fails: the ready rank lets go
    assert all(o.started_at is None for o in opened)


def test_windows_begin_at_the_sweeps_start_where_ready_before_it(rank) -> None:
    """Every node of a sweep begins at one time (the coordinator's), not each when ready."""
    info, _, opened = rank
    start_at = time.time() + 1.0
    replies = window.open_windows("sw1", [info], 60, 10, start_at=start_at)
    assert replies.began == start_at and opened[0].started_at >= start_at - 0.005


@pytest.mark.parametrize("ahead_s", [-30.0, 3600.0])
def test_a_start_already_past_or_implausibly_far_ahead_begins_now(rank, ahead_s: float) -> None:
    """A node ready late starts as soon as it is; a start an hour ahead is a coordinator whose
    clock is off, not a plan to wait for."""
    info, _, opened = rank
    asked = time.time()
    replies = window.open_windows("sw1", [info], 60, 10, start_at=asked + ahead_s)
    assert asked < replies.began < asked + 2 and opened[0].started_at < asked + 2
