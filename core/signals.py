"""The signals that end a long-running rankscope process (agent, coordinator) cleanly, and
a Ctrl-C told apart from the errors it causes."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def on_stop(handler: Callable[[int, Any], None]) -> None:
    """Run ``handler`` on SIGTERM, SIGINT and SIGHUP, so the process ends through its own
    clean-up (the agent resumes DCGM on the way out): SIGHUP's default, on a closed terminal
    or ssh session, ends it with none. A SIGHUP its launcher ignores (nohup) stays ignored."""
    for signum in STOP_SIGNALS:
        if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
            continue
        signal.signal(signum, handler)


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: a KeyboardInterrupt, or an error raised while one was
    handled. Landing in threading's Condition.wait (Thread.start and queue waits use it)
    between its lock's release and the code that takes the lock back, the KeyboardInterrupt
    leaves it released, and the ``with`` around it fails with RuntimeError 'release unlocked
    lock' (seen: `capture --wait` on a Ctrl-C as it started its watch, a traceback, exit 1)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__context__
    return False
