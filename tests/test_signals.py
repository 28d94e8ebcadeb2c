"""The signals that end the agent and the coordinator through their own clean-up."""

from __future__ import annotations

import os
import signal

import pytest

from rankscope import signals


@pytest.fixture
def restored():
    before = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_hangup_stops_the_process_as_a_term_does(restored) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a terminal leaves it (under nohup the suite ignores it)
    seen = []
    signals.on_stop(lambda signum, frame: seen.append(signum))
    os.kill(os.getpid(), signal.SIGHUP)
    os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGHUP, signal.SIGTERM]


def test_a_hangup_ignored_by_the_launcher_stays_ignored(restored) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup leaves it
    signals.on_stop(lambda signum, frame: None)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
