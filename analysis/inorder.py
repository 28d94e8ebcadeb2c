"""Items read by several readers at once, each taking the next item not yet taken, the
results given back in the items' order (`InOrder`).

Not a pool of futures: there the caller only waits for the threads, here it reads too
(with a reader of its own: `nsys._read_files` has the threads read with a driver that
runs without the GIL, while it reads with the sqlite3 module), and no reader takes an
item more than ``ahead`` past the one given back, which bounds what is held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class InOrder(Generic[Item, Result]):
    """``items`` handed out in turn to readers (`serve` on threads, `results` for the
    caller), their results in order. A reader's exception is raised by `results` where
    its item comes in order; `close` stops the threads taking more."""

    def __init__(self, items: Sequence[Item], ahead: int) -> None:
        self._items = items
        self._ahead = max(1, ahead)
        self._taken = 0  # items handed to a reader
        self._given = 0  # results given back
        self._done: dict[int, tuple[Result | None, BaseException | None]] = {}
        self._closed = False
        self._changed = threading.Condition()

    def serve(self, read: Callable[[Item], Result]) -> None:
        """Read items until none is left or `close` (a thread's target)."""
        while (index := self._next(wait=True)) is not None:
            # Anything a thread meets is the caller's to raise (were one to end the thread, the
            # caller waited for its item for ever).
            self._put(index, read, BaseException)

    def results(self, read: Callable[[Item], Result]) -> Iterator[Result]:
        """Every item's result, in order, this thread reading the next item (with ``read``)
        while the one due is still being read elsewhere."""
        while self._given < len(self._items):
            index = self._next(wait=False)
            if index is not None:
                self._put(index, read, Exception)  # a KeyboardInterrupt goes up at once
                continue
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._given in self._done)
                if self._closed:
                    return
                result, error = self._done.pop(self._given)
                self._given += 1
                self._changed.notify_all()
            if error is not None:
                try:
                    raise error
                finally:  # else the traceback's frame, holding the error, keeps all read ahead (a cycle)
                    del error
            yield result  # type: ignore[misc]

    def close(self) -> None:
        """Stop: the threads take no more items, what they read ahead is let go, and
        `results` gives no more."""
        with self._changed:
            self._closed = True
            self._done.clear()
            self._changed.notify_all()

    def _next(self, *, wait: bool) -> int | None:
        """The next item's index for a reader; None where none is left to take (for the
        caller: also where the one due is in, or it would run too far ahead; a thread
        waits for room)."""
        with self._changed:
            if wait:
                self._changed.wait_for(lambda: self._closed or self._taken >= len(self._items) or self._room())
            elif self._given in self._done:
                return None
            if self._closed or not self._room():
                return None
            self._taken += 1
            return self._taken - 1

    def _room(self) -> bool:
        return self._taken < min(len(self._items), self._given + self._ahead)

    def _put(self, index: int, read: Callable[[Item], Result], caught: type[BaseException]) -> None:
        try:
            outcome: tuple[Result | None, BaseException | None] = (read(self._items[index]), None)
        except caught as exc:  # given back in its turn
            outcome = (None, exc)
        with self._changed:
            if not self._closed:
                self._done[index] = outcome
            self._changed.notify_all()
