"""Shared fixtures: where the real samples are, and skipping clearly when they are not."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples"
NOBODY = 65534


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT as a terminal gives it. A suite started in the background by a shell without job
    control (`make test &` in a script; some CI runners) inherits it ignored, as POSIX shells
    leave their asynchronous commands, and so would every command it starts (an ignored
    signal stays ignored across fork and exec): the tests of what a Ctrl-C does saw nothing
    happen. Handled here, it is at its default again in what the suite starts."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def samples() -> Path:
    """../shared/samples, or a skip saying where it was looked for."""
    if not SAMPLES.is_dir():
        pytest.skip(f"real sample traces not found at {SAMPLES} (the shared/ folder beside the checkout)")
    return SAMPLES


@pytest.fixture(autouse=True)
def dcgm_ledger(tmp_path, monkeypatch) -> Path:
    """A DCGM pause ledger of each test's own: the host's (/tmp/rankscope-dcgm) would join
    its agents with those of tests running beside it, as agents of one host."""
    folder = tmp_path / "dcgm-ledger"
    monkeypatch.setenv("RANKSCOPE_DCGM_STATE", str(folder))
    return folder


@pytest.fixture(autouse=True)
def stop_signals_restored():
    """SIGINT and SIGTERM as they were before each test: `rankscope agent` and `coordinator`,
    run in-process, take them for good (`signals.on_stop`), as their own processes should,
    and a later test's Ctrl-C would then stop an agent long gone instead of raising."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


# A command's own SIGHUP at its default before it starts (see `default_hangup`).
_HANGUP_DEFAULT = "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"


@pytest.fixture
def default_hangup() -> Callable[[list[str]], list[str]]:
    """``argv`` -> a command line that runs it with SIGHUP at its default. Under `nohup make
    test` the suite ignores SIGHUP, and so does every process it starts (an ignored signal
    stays ignored across fork and exec): `signals.on_stop` then rightly leaves it ignored, and
    a test of what a hang-up does to a command would see nothing happen."""
    return lambda argv: [sys.executable, "-c", _HANGUP_DEFAULT, *argv]


@pytest.fixture
def other_user():
    """(a folder that another user can reach, and ``run(action)``, which calls ``action`` in a
    forked process as the user nobody and returns what it returned, an int below 100, as that
    process's exit code; 100 where it raised). Root only: none else can become another user."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another user")
    folder = Path(tempfile.mkdtemp(prefix="rankscope-other-user-"))  # tmp_path is root's alone
    folder.chmod(0o755)

    def run(action: Callable[[], int]) -> int:
        pid = os.fork()
        if pid == 0:
            code = 100
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                code = action()
            finally:
                os._exit(code)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    yield folder, run
    shutil.rmtree(folder)
