"""The signals that end the agent and the coordinator through their own clean-up."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from rankscope import cli, signals


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


def _ctrl_c_in_a_condition_wait() -> RuntimeError:
    """The error a Ctrl-C raises where it lands in Condition.wait just after its lock was let go
    (`_release_save`): the ``with`` around the wait then lets go of it again."""
    lock = threading.Lock()
    try:
        with lock:
            lock.release()
            raise KeyboardInterrupt
    except RuntimeError as exc:
        return exc
    raise AssertionError("the lock was let go twice without an error")


def test_a_ctrl_c_is_told_by_itself_and_by_the_errors_raised_in_its_handling() -> None:
    broken = _ctrl_c_in_a_condition_wait()
    assert str(broken) == "release unlocked lock"
    assert signals.interrupted(broken)
    assert signals.interrupted(KeyboardInterrupt())
    assert not signals.interrupted(RuntimeError("release unlocked lock"))
    try:
        raise ValueError("unrelated")
    except ValueError as exc:
        assert not signals.interrupted(exc)


def test_the_command_says_interrupted_where_a_ctrl_c_broke_a_lock(monkeypatch, capsys) -> None:
    from rankscope.analysis import commands

    def interrupted_in_a_wait(args) -> int:
        raise _ctrl_c_in_a_condition_wait()

    monkeypatch.setattr(commands, "run_analyze", interrupted_in_a_wait)
    assert cli.main(["analyze", "nothing.sqlite"]) == 130
    assert capsys.readouterr().err == "rankscope: interrupted\n"


def test_an_error_of_the_command_itself_is_not_taken_for_a_ctrl_c(monkeypatch) -> None:
    from rankscope.analysis import commands

    def failing(args) -> int:
        raise RuntimeError("release unlocked lock")

    monkeypatch.setattr(commands, "run_analyze", failing)
    with pytest.raises(RuntimeError):
        cli.main(["analyze", "nothing.sqlite"])
