"""A one-line counter of long work on stderr, where stderr is a terminal (a log gets none)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _count(done: int, total: int) -> str:
    return f"{done}/{total}"


class Progress:
    """``label: text(done, total)``, drawn over itself at most every ``redraw_s`` (and at the
    whole); as a context manager it ends the line, so an error's message starts on its own.
    ``show`` False, or stderr no terminal: nothing is drawn."""

    def __init__(self, label: str, total: int, *, show: bool = True, redraw_s: float = 0.0,
                 text: Callable[[int, int], str] = _count) -> None:
        self.label, self.total, self.redraw_s, self.text = label, total, redraw_s, text
        self.show = show and sys.stderr.isatty()
        self.done, self.drawn = 0, None

    def add(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self.show and (self.drawn is None or now - self.drawn >= self.redraw_s or self.done == self.total):
            self.drawn = now
            print(f"\r{self.label}: {self.text(self.done, self.total)}", end="", file=sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.drawn is not None:
            print(file=sys.stderr)


def counted(items: Iterable[T], total: int, label: str) -> Iterator[T]:
    """``items``, counted as each arrives (drawn where there are several)."""
    with Progress(label, total, show=total > 1) as progress:
        for item in items:
            progress.add()
            yield item
