"""The signals that end a long-running rankscope process (agent, coordinator) cleanly."""

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
