"""`InOrder`: readers on threads and the caller take items in turn; results come in order."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from rankscope.analysis.inorder import InOrder


def _served(items: InOrder, read, threads: int) -> list[threading.Thread]:
    started = [threading.Thread(target=items.serve, args=(read,)) for _ in range(threads)]
    for thread in started:
        thread.start()
    return started


def test_a_readers_error_is_raised_in_its_items_turn_after_the_results_before_it() -> None:
    def read(item: int) -> int:
        if item == 3:
            raise ValueError("bad item 3")
        time.sleep(0.002)
        return item * 10

    items = InOrder(list(range(8)), ahead=4)
    threads = _served(items, read, 2)
    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for result in items.results(read):
            got.append(result)
    items.close()
    for thread in threads:
        thread.join(timeout=5)
    assert got == [0, 10, 20]
    assert not any(thread.is_alive() for thread in threads)


def test_closed_part_way_the_threads_waiting_for_room_stop() -> None:
    items = InOrder(list(range(100)), ahead=3)
    read_by_threads: list[int] = []

    def read(item: int) -> int:
        read_by_threads.append(item)
        return item

    threads = _served(items, read, 2)
    results = items.results(lambda item: item)
    assert [next(results) for _ in range(2)] == [0, 1]
    results.close()
    items.close()
    for thread in threads:
        thread.join(timeout=5)
    assert not any(thread.is_alive() for thread in threads)
    # Two given back, three ahead: no reader took item 5 or later.
    assert max(read_by_threads, default=0) <= 4, read_by_threads


def test_what_ends_a_thread_is_raised_in_its_turn_not_waited_for() -> None:
    def read(item: int) -> int:
        raise SystemExit(f"reader gave up on {item}")

    items = InOrder([0, 1], ahead=2)
    (thread,) = _served(items, read, 1)
    thread.join(timeout=5)  # took both items, each raising
    with pytest.raises(SystemExit, match="reader gave up on 0"):
        next(items.results(lambda item: item))


def test_closed_it_gives_no_more_and_does_not_wait_for_ever() -> None:
    items = InOrder([0, 1, 2], ahead=2)
    results = items.results(lambda item: item * 2)
    assert next(results) == 0
    items.close()
    assert list(results) == []


def test_an_error_given_back_leaves_nothing_read_ahead_held() -> None:
    # The error's traceback held the frame that held the error: with the collector off, as
    # while exports are read, every result read ahead stayed in memory.
    def read(item: int) -> object:
        if item == 0:
            time.sleep(0.05)
            raise ValueError("bad item 0")
        return Held()

    gc.disable()
    try:
        items = InOrder(list(range(6)), ahead=4)
        threads = _served(items, read, 2)
        with pytest.raises(ValueError):
            list(items.results(read))
        items.close()
        for thread in threads:
            thread.join(timeout=5)
        del items
        assert Held.alive == 0
    finally:
        gc.enable()


class Held:
    alive = 0

    def __init__(self) -> None:
        Held.alive += 1

    def __del__(self) -> None:
        Held.alive -= 1
