"""DCGM pause/resume against the stand-in host engine (bindings and dcgmi), and the
PauseManager's lease, reference count and recovery, within one agent and across the agents
of one host (the shared pause ledger)."""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
import standin_dcgm  # noqa: E402

from rankscope.agent import dcgm  # noqa: E402
from rankscope.agent.dcgm import DcgmOutcome  # noqa: E402
from rankscope.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def engine(tmp_path, monkeypatch):
    """A running stand-in host engine on localhost, profiling not paused."""
    state = tmp_path / "engine.json"
    standin_dcgm.configure(state)
    for key, value in standin_dcgm.env(state).items():
        monkeypatch.setenv(key, value)
    return state


def ops(state: Path) -> list[str]:
    return [c["op"] for c in standin_dcgm.calls(state) if c["code"] == 0]


def paused(state: Path) -> bool:
    return standin_dcgm.read(state)["paused"]


def controls(kind: str, host: str = "localhost") -> dcgm.DcgmControl:
    if kind == "bindings":
        return dcgm.BindingsControl(standin_dcgm.BINDINGS, host, timeout_s=2)
    return dcgm.DcgmiControl(str(standin_dcgm.BIN / "dcgmi"), host, timeout_s=10)


def test_dcgmi_profile_command_matches_the_documented_flags():
    assert dcgm.profile_command("dcgmi", "pause", "nvidia-dcgm.gpu-operator.svc:5555") == [
        "dcgmi", "profile", "--pause", "--host", "nvidia-dcgm.gpu-operator.svc:5555"]
    assert dcgm.profile_command("/usr/bin/dcgmi", "resume", "unix:///run/nv-hostengine") == [
        "/usr/bin/dcgmi", "profile", "--resume", "--host", "unix:///run/nv-hostengine"]
    with pytest.raises(ValueError):
        dcgm.profile_command("dcgmi", "stop", "localhost")


@pytest.mark.parametrize("kind", ["bindings", "dcgmi"])
def test_pause_and_resume_flip_the_engines_one_global_flag(engine, kind):
    control = controls(kind)
    assert control.pause() is DcgmOutcome.PAUSED
    assert paused(engine)
    assert control.pause() is DcgmOutcome.PAUSED  # idempotent, like DCGM
    assert control.resume() is DcgmOutcome.RESUMED
    assert not paused(engine)
    assert [c["via"] for c in standin_dcgm.calls(engine)] == [kind] * 3


@pytest.mark.parametrize("kind", ["bindings", "dcgmi"])
def test_hopper_answers_not_supported(engine, kind):
    standin_dcgm.configure(engine, gpm=True)
    control = controls(kind)
    assert control.pause() is DcgmOutcome.NOT_SUPPORTED
    assert "Feature not supported" in control.error
    assert not paused(engine)


@pytest.mark.parametrize("kind", ["bindings", "dcgmi"])
def test_unreachable_engine_fails_with_the_reason(engine, kind):
    control = controls(kind, host="nvidia-dcgm.gpu-operator.svc:5555")
    assert control.pause() is DcgmOutcome.FAILED
    assert "connection invalid" in control.error.lower() or "unable to connect" in control.error.lower()
    assert "nvidia-dcgm.gpu-operator.svc:5555" in control.error
    standin_dcgm.configure(engine, up=False)
    assert controls(kind).resume() is DcgmOutcome.FAILED


def test_no_dcgm_library_or_no_dcgmi_means_nothing_to_pause(engine, tmp_path):
    standin_dcgm.configure(engine, library=False)
    bindings = controls("bindings")
    assert bindings.pause() is DcgmOutcome.NOT_PRESENT
    assert "Library not found" in bindings.error
    missing = dcgm.DcgmiControl(str(tmp_path / "no-dcgmi"), "localhost")
    assert missing.pause() is DcgmOutcome.NOT_PRESENT
    assert dcgm.NoDcgm().pause() is DcgmOutcome.NOT_PRESENT
    assert standin_dcgm.calls(engine) == []


def test_discover_prefers_bindings_then_dcgmi_then_none(engine, tmp_path, monkeypatch):
    found = dcgm.discover(dcgm.DcgmConfig(bindings_path=standin_dcgm.BINDINGS, host="h:5555"))
    assert isinstance(found, dcgm.BindingsControl) and found.host == "h:5555"
    assert isinstance(dcgm.discover(dcgm.DcgmConfig(mode="none")), dcgm.NoDcgm)
    # Without importable bindings: dcgmi from PATH, then nothing.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "dcgm_bindings" not in p])
    for name in ("dcgm_structs", "dcgm_agent", "pydcgm"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(dcgm, "BINDINGS_DIRS", (tmp_path / "absent",))
    via_cli = dcgm.discover(dcgm.DcgmConfig(host="h:5555"))
    assert isinstance(via_cli, dcgm.DcgmiControl)
    assert via_cli.command("pause")[1:] == ["profile", "--pause", "--host", "h:5555"]
    none = dcgm.discover(dcgm.DcgmConfig(dcgmi="no-such-dcgmi"))
    assert isinstance(none, dcgm.NoDcgm) and "no-such-dcgmi" in none.error


def test_config_from_env_and_flags(monkeypatch):
    monkeypatch.setenv("RANKSCOPE_DCGM_HOST", "nvidia-dcgm:5555")
    monkeypatch.setenv("RANKSCOPE_DCGM", "dcgmi")
    import argparse
    parser = argparse.ArgumentParser()
    dcgm.add_arguments(parser)
    config = dcgm.config_from_args(parser.parse_args([]))
    assert (config.mode, config.host) == ("dcgmi", "nvidia-dcgm:5555")
    config = dcgm.config_from_args(parser.parse_args(["--dcgm", "none", "--dcgm-host", "unix:///s"]))
    assert (config.mode, config.host) == ("none", "unix:///s")


def test_a_dcgm_mode_from_the_environment_that_is_none_of_the_modes_is_refused(monkeypatch):
    # found by a bad-input campaign: RANKSCOPE_DCGM=bogus ran the agent, never pausing DCGM
    monkeypatch.setenv("RANKSCOPE_DCGM", "bogus")
    import argparse
    parser = argparse.ArgumentParser()
    dcgm.add_arguments(parser)
    with pytest.raises(ConfigError, match=r"^\$RANKSCOPE_DCGM 'bogus': not one of auto, bindings, dcgmi, none"):
        dcgm.config_from_args(parser.parse_args([]))
    assert dcgm.config_from_args(parser.parse_args(["--dcgm", "none"])).mode == "none"  # the flag wins


NO_DCGMI = "^--dcgmi '/nonexistent/dcgmi': not found, or not executable$"
NO_BINDINGS = "^--dcgm-bindings '/nonexistent/bindings': not found, or not a folder$"


@pytest.mark.parametrize("argv, missing", [
    (["--dcgm", "dcgmi", "--dcgmi", "/nonexistent/dcgmi"], NO_DCGMI),
    (["--dcgmi", "/nonexistent/dcgmi"], NO_DCGMI),  # auto: used where the bindings are not
    (["--dcgm", "bindings", "--dcgmi", "/nonexistent/dcgmi"], None),  # not used at all
    (["--dcgm", "none", "--dcgmi", "/nonexistent/dcgmi"], None),
    (["--dcgm", "dcgmi"], None),  # the default, dcgmi on PATH: the agent runs, not pausing DCGM
    (["--dcgm", "bindings", "--dcgm-bindings", "/nonexistent/bindings"], NO_BINDINGS),
    (["--dcgm-bindings", "/nonexistent/bindings"], NO_BINDINGS),  # auto: tried first
    (["--dcgm", "dcgmi", "--dcgm-bindings", "/nonexistent/bindings"], None),  # not used at all
    (["--dcgm", "none", "--dcgm-bindings", "/nonexistent/bindings"], None),
    (["--dcgm", "bindings"], None),  # the default, the install's folders: the agent runs, not pausing DCGM
], ids=["dcgmi", "dcgmi auto", "dcgmi unused", "dcgmi none", "dcgmi default",
        "bindings", "bindings auto", "bindings unused", "bindings none", "bindings default"])
def test_a_named_dcgm_must_be_there_the_default_may_be_missing(argv, missing, monkeypatch):
    import argparse
    monkeypatch.delenv("RANKSCOPE_DCGMI", raising=False)
    monkeypatch.delenv("RANKSCOPE_DCGM_BINDINGS", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    parser = argparse.ArgumentParser()
    dcgm.add_arguments(parser)
    if missing:
        with pytest.raises(ConfigError, match=missing):
            dcgm.config_from_args(parser.parse_args(argv))
    else:
        dcgm.config_from_args(parser.parse_args(argv))


def test_a_named_bindings_folder_without_the_bindings_is_refused(tmp_path, monkeypatch):
    """An empty folder (a mistyped or not yet mounted bindings path) only warned, then every
    capture ran without pausing DCGM."""
    monkeypatch.delenv("RANKSCOPE_DCGM_BINDINGS", raising=False)
    with pytest.raises(ConfigError, match=f"^--dcgm-bindings '{tmp_path}': holds no DCGM Python bindings "
                                          r"\(no dcgm_structs.py, dcgm_agent.py\)$"):
        dcgm._check_named(dcgm.DcgmConfig(bindings_path=tmp_path))
    dcgm._check_named(dcgm.DcgmConfig(bindings_path=standin_dcgm.BINDINGS))  # the real layout passes


@pytest.mark.parametrize("variable, option, value", [
    ("RANKSCOPE_DCGMI", "--dcgmi", "/nonexistent/dcgmi"),
    ("RANKSCOPE_DCGM_BINDINGS", "--dcgm-bindings", "/nonexistent/bindings"),
])
def test_a_missing_dcgm_is_named_by_the_variable_that_set_it(variable, option, value, monkeypatch):
    """Set through the environment (a DaemonSet's env, say), the error names the variable: the
    user never typed the flag. Typed over it, the flag is named."""
    import argparse
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv(variable, value)
    parser = argparse.ArgumentParser()
    dcgm.add_arguments(parser)
    with pytest.raises(ConfigError, match=f"^\\${variable} '{value}': not found"):
        dcgm.config_from_args(parser.parse_args([]))
    with pytest.raises(ConfigError, match=f"^{option} '{value}-typed': not found"):
        dcgm.config_from_args(parser.parse_args([option, f"{value}-typed"]))


# -- PauseManager ----------------------------------------------------------------------------


def manager(tmp_path: Path, kind: str = "bindings", **kw) -> dcgm.PauseManager:
    return dcgm.PauseManager(controls(kind), tmp_path / "ledger", retry_delay_s=0.05, **kw)


def journal(m: dcgm.PauseManager) -> dict:
    """What the manager's holder file in the host's ledger says."""
    return json.loads(m.ledger.path.read_text())


@pytest.mark.parametrize("kind", ["bindings", "dcgmi"])
def test_paused_for_the_capture_and_resumed_after(engine, tmp_path, kind):
    m = manager(tmp_path, kind)
    assert m.acquire("sweep-1", lease_s=60) is DcgmOutcome.PAUSED
    assert paused(engine) and m.holders() == ["sweep-1"]
    assert journal(m)["paused"] is True and "sweep-1" in journal(m)["leases"]
    assert m.release("sweep-1") is DcgmOutcome.RESUMED
    assert not paused(engine)
    assert journal(m)["paused"] is False and journal(m)["leases"] == {}
    assert ops(engine) == ["pause", "resume"]
    assert m.release("sweep-1") is DcgmOutcome.RESUMED  # a second release answers the same
    assert ops(engine) == ["pause", "resume"]  # ... and does nothing


def test_overlapping_captures_resume_once_after_the_last(engine, tmp_path):
    m = manager(tmp_path)
    assert m.acquire("a", 60) is DcgmOutcome.PAUSED
    assert m.acquire("b", 60) is DcgmOutcome.PAUSED
    assert m.release("a") is DcgmOutcome.PAUSED  # b still needs the counters
    assert paused(engine)
    assert ops(engine).count("resume") == 0
    assert m.release("b") is DcgmOutcome.RESUMED
    assert not paused(engine)
    assert ops(engine) == ["pause", "pause", "resume"]


def test_acquire_reasserts_a_pause_someone_else_resumed(engine, tmp_path):
    m = manager(tmp_path)
    m.acquire("a", 60)
    controls("dcgmi").resume()  # another client: DCGM's flag is not ours alone
    assert not paused(engine)
    m.acquire("b", 60)
    assert paused(engine)
    m.close()
    assert not paused(engine)


def test_a_held_pause_is_reasserted_after_someone_else_resumes(engine, tmp_path):
    m = manager(tmp_path, reassert_s=0.2)
    m.acquire("a", 60)
    controls("dcgmi").resume()  # e.g. an operator's `dcgmi profile --resume`
    deadline = time.monotonic() + 10
    while not paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert paused(engine)
    assert m.release("a") is DcgmOutcome.RESUMED and not paused(engine)


def test_no_pause_once_closed(engine, tmp_path):
    """A capture's acquire that comes after the agent's close() (its thread outlived the
    stop's wait): it reopened the ledger and paused DCGM, with no lease timer left to expire
    it, as the agent exited. It is refused, DCGM not paused."""
    m = manager(tmp_path)
    m.close()
    with pytest.raises(dcgm.PauseNotRecorded, match="stopping"):
        m.acquire("late", lease_s=60)
    assert not paused(engine) and ops(engine) == [] and m.holders() == []


def test_lease_expiry_resumes_without_anyone_releasing(engine, tmp_path):
    m = manager(tmp_path)
    assert m.acquire("lost-coordinator", lease_s=0.5) is DcgmOutcome.PAUSED
    assert paused(engine)
    deadline = time.monotonic() + 10
    while paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not paused(engine)
    assert m.holders() == [] and journal(m)["paused"] is False
    assert m.release("lost-coordinator") is DcgmOutcome.NOT_HELD


def test_a_lease_renewed_runs_from_the_renewal_and_an_expired_one_is_not_renewed(engine, tmp_path):
    now = [1000.0]
    m = manager(tmp_path, clock=lambda: now[0])
    assert m.acquire("a", lease_s=10) is DcgmOutcome.PAUSED
    now[0] += 8
    assert m.renew("a", 10) is True and journal(m)["leases"] == {"a": 1018.0}
    assert m.renew("never-paused", 10) is False
    assert m.release("a") is DcgmOutcome.RESUMED and m.renew("a", 10) is False
    m.close()


def test_failed_resume_is_retried_until_the_engine_answers(engine, tmp_path):
    m = manager(tmp_path, resume_retries=1)
    m.acquire("a", 60)
    standin_dcgm.configure(engine, up=False)
    assert m.release("a") is DcgmOutcome.FAILED
    assert "connection invalid" in m.error.lower()
    assert journal(m)["paused"] is True  # still owed: on disk for a restart too
    standin_dcgm.configure(engine, up=True)
    deadline = time.monotonic() + 10
    while paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not paused(engine)


def test_a_dcgmi_gone_since_it_paused_leaves_the_resume_owed_not_done(engine, tmp_path):
    # dcgmi removed under the agent (a package upgrade, a volume unmounted): its resume was
    # NOT_PRESENT, taken for done, the ledger cleared and the node left dark for good.
    dcgmi = tmp_path / "bin" / "dcgmi"
    dcgmi.parent.mkdir()
    dcgmi.symlink_to(standin_dcgm.BIN / "dcgmi")
    m = dcgm.PauseManager(dcgm.DcgmiControl(str(dcgmi), "localhost"), tmp_path / "ledger", retry_delay_s=0.05,
                          resume_retries=1)
    assert m.acquire("a", 60) is DcgmOutcome.PAUSED
    moved = dcgmi.rename(tmp_path / "dcgmi.moved")
    assert m.release("a") is DcgmOutcome.FAILED and "not found" in m.error
    assert paused(engine) and journal(m)["paused"] is True  # still owed, on disk too
    moved.rename(dcgmi)
    deadline = time.monotonic() + 10
    while paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not paused(engine)
    m.close()


def test_a_dcgmi_that_cannot_run_is_a_failure_with_its_reason_not_an_exception(engine, tmp_path):
    # PermissionError escaped the control: a traceback out of the agent's close, its ledger,
    # channel and work-dir lock not let go.
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text("#!/bin/sh\n")
    dcgmi.chmod(0o644)
    control = dcgm.DcgmiControl(str(dcgmi), "localhost")
    for call in (control.pause, control.resume):
        assert call() is DcgmOutcome.FAILED and control.error == f"{dcgmi} cannot run (Permission denied)"


@pytest.mark.parametrize("answer", ["exit 3", "exec sleep 5"])
def test_a_failed_dcgmi_is_named_by_a_command_line_that_runs_pasted(answer, tmp_path):
    # its argv was joined with spaces: a dcgmi under "dcgm tools" read as two words
    dcgmi = tmp_path / "dcgm tools" / "dcgmi"
    dcgmi.parent.mkdir()
    dcgmi.write_text(f"#!/bin/sh\necho refused; {answer}\n")
    dcgmi.chmod(0o755)
    control = dcgm.DcgmiControl(str(dcgmi), "host;engine", timeout_s=0.5)
    assert control.pause() is DcgmOutcome.FAILED
    said = {"exit 3": "exited 3: refused", "exec sleep 5": "did not answer within 0.5 s"}[answer]
    assert control.error.endswith(f"` {said}")
    assert shlex.split(control.error.split("`")[1]) == [str(dcgmi), "profile", "--pause", "--host", "host;engine"]


def test_a_pause_left_unanswered_is_resumed_as_it_may_have_taken_effect(engine, tmp_path):
    # A busy host engine paused but answered after the timeout: FAILED, the lease dropped,
    # and nothing ever resumed: the node's DCGM_FI_PROF_* series stayed dark for good.
    control = dcgm.DcgmiControl(str(standin_dcgm.BIN / "dcgmi"), "localhost", timeout_s=0.5)
    m = dcgm.PauseManager(control, tmp_path / "ledger", retry_delay_s=0.05)
    standin_dcgm.configure(engine, answer_after_s=2)
    assert m.acquire("a", 60) is DcgmOutcome.FAILED and "did not answer" in m.error
    assert paused(engine)
    standin_dcgm.configure(engine, answer_after_s=0)
    deadline = time.monotonic() + 10
    while paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not paused(engine)
    m.close()


def test_a_resume_that_fails_at_exit_is_left_for_the_next_agent(engine, tmp_path):
    m = manager(tmp_path, resume_retries=1)
    m.acquire("a", 60)
    standin_dcgm.configure(engine, up=False)  # the engine unreachable as the agent stops
    assert m.close() is DcgmOutcome.FAILED
    assert paused(engine)
    standin_dcgm.configure(engine, up=True)
    successor = manager(tmp_path)
    assert successor.recover() is DcgmOutcome.RESUMED  # the record stayed: the resume is owed
    assert not paused(engine)
    assert list((tmp_path / "ledger").glob("holder-*")) == [successor.ledger.path]  # and then went
    successor.close()


def full_disk_from(m: dcgm.PauseManager, fails) -> None:
    """The ledger's writes fail (a full disk) from when ``fails()`` says so."""
    real_write = m.ledger.write

    def write(*args) -> None:
        if fails():
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(*args)

    m.ledger.write = write


def test_a_pause_the_ledger_cannot_record_is_resumed_at_once(engine, tmp_path):
    # Before, the OSError came out of acquire with DCGM paused and the capture's lease held:
    # the node stayed dark until the lease ran out, the capture failed with a traceback.
    m = manager(tmp_path)
    full_disk_from(m, lambda: paused(engine))
    with pytest.raises(dcgm.PauseNotRecorded) as raised:
        m.acquire("a", 60)
    assert raised.value.undone is DcgmOutcome.RESUMED and not paused(engine)
    assert str(raised.value) == (f"DCGM paused, then resumed at once: the pause ledger {tmp_path / 'ledger'} "
                                 "cannot be written (No space left on device)")
    assert ops(engine) == ["pause", "resume"] and m.holders() == [] and not m.paused
    m.close()


def test_a_ledger_that_cannot_be_written_before_the_pause_leaves_dcgm_alone(engine, tmp_path):
    m = manager(tmp_path)
    m.open()
    full_disk_from(m, lambda: True)
    with pytest.raises(dcgm.PauseNotRecorded, match="^DCGM not paused: the pause ledger") as raised:
        m.acquire("a", 60)
    assert raised.value.undone is None and ops(engine) == [] and m.holders() == []
    m.close()


def test_a_pause_another_capture_holds_is_left_to_it_when_the_ledger_fails(engine, tmp_path):
    m = manager(tmp_path)
    assert m.acquire("a", 60) is DcgmOutcome.PAUSED
    first = iter([False])  # b's lease is written before its pause call, the pause not after it
    full_disk_from(m, lambda: next(first, True))
    with pytest.raises(dcgm.PauseNotRecorded, match="then left to the other captures") as raised:
        m.acquire("b", 60)
    assert raised.value.undone is DcgmOutcome.PAUSED and m.holders() == ["a"] and paused(engine)
    assert m.release("a") is DcgmOutcome.RESUMED and not paused(engine)  # the write after it fails too
    assert m.paused  # its record still claims b's lease: the resume stays owed
    m.close()


def test_a_record_left_claiming_a_lease_it_could_not_drop_keeps_its_agent_owing_the_resume(engine, tmp_path):
    # The ledger unwritable after a's pause was given back: a's record still shows its lease,
    # so the job agent, releasing its own capture, left the resume to the fleet agent, which
    # thought it owed nothing: DCGM stayed paused for good.
    fleet, job = manager(tmp_path), manager(tmp_path, "dcgmi")  # one folder: one host
    full_disk_from(fleet, lambda: "pause" in ops(engine))  # from a's pause on
    with pytest.raises(dcgm.PauseNotRecorded):
        fleet.acquire("a", 60)
    assert job.acquire("b", 60) is DcgmOutcome.PAUSED
    assert job.release("b") is DcgmOutcome.PAUSED  # fleet's record holds a lease: fleet resumes
    deadline = time.monotonic() + 10
    while paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not paused(engine)
    fleet.close(), job.close()


class Unanswering(dcgm.DcgmControl):
    """A host engine that answers nothing: every resume fails after its timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.resumes = 0

    def pause(self) -> DcgmOutcome:
        return DcgmOutcome.PAUSED

    def resume(self) -> DcgmOutcome:
        self.resumes += 1
        time.sleep(self.timeout_s)
        self.error, self.unanswered = f"did not answer within {self.timeout_s:g} s", True
        return DcgmOutcome.FAILED

    def describe(self) -> str:
        return "unanswering"


def test_an_agent_stopping_while_resumes_time_out_waits_only_for_the_one_under_way(tmp_path):
    # The timer began each retry as the last one ended, never letting go of its lock: close()
    # (and any capture) waited for as long as the engine did not answer, past any grace period.
    engine = Unanswering(timeout_s=0.3)
    m = dcgm.PauseManager(engine, tmp_path / "ledger", retry_delay_s=0.05)
    m.acquire("a", 60)
    assert m.release("a") is DcgmOutcome.FAILED and engine.resumes == 3  # the timer retries from now on
    while engine.resumes == 3:
        time.sleep(0.01)
    series = 3 * 0.3 + 0.05 + 0.1  # three calls, two delays between them
    started = time.monotonic()
    closing = threading.Thread(target=m.close, daemon=True)
    closing.start()
    closing.join(10 * series)
    assert not closing.is_alive(), "close() waited on the timer's retries"
    assert time.monotonic() - started < 3 * series  # the timer's series under way, then its own
    assert journal(m)["paused"] is True  # still owed: the next agent resumes it


@pytest.mark.parametrize("setting, outcome", [({"gpm": True}, DcgmOutcome.NOT_SUPPORTED),
                                              ({"library": False}, DcgmOutcome.NOT_PRESENT)])
def test_not_supported_and_no_dcgm_let_the_capture_proceed(engine, tmp_path, setting, outcome):
    standin_dcgm.configure(engine, **setting)
    m = manager(tmp_path)
    got = m.acquire("a", 60)
    assert got is outcome and m.error
    assert m.holders() == [] and journal(m)["leases"] == {}
    assert m.release("a") is outcome
    assert m.recover() is None  # nothing was left to resume


def test_no_dcgm_at_all(tmp_path):
    m = dcgm.PauseManager(dcgm.NoDcgm(), tmp_path / "ledger")
    assert m.acquire("a", 60) is DcgmOutcome.NOT_PRESENT
    assert m.release("a") is DcgmOutcome.NOT_PRESENT
    assert not (tmp_path / "ledger").exists()  # nothing to share, so no folder it could fail on


def test_a_torn_holder_file_is_treated_as_a_pause_left_behind(engine, tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "holder-gone-1-0.json").write_text('{"who": "agent x", "paus')  # crashed mid-write
    controls("dcgmi").pause()
    assert manager(tmp_path).recover() is DcgmOutcome.RESUMED
    assert not paused(engine)
    assert not (ledger / "holder-gone-1-0.json").exists()


class DiesInsidePause(dcgm.DcgmControl):
    """The stand-in engine, with the ledger as it stands on disk copied away the moment Pause
    took effect: what a next agent would find had this one been killed right there."""

    def __init__(self, ledger: Path, snapshot: Path) -> None:
        self.real, self.ledger, self.snapshot = controls("bindings"), ledger, snapshot

    def pause(self) -> DcgmOutcome:
        outcome = self.real.pause()
        shutil.copytree(self.ledger, self.snapshot)
        return outcome

    def resume(self) -> DcgmOutcome:
        return self.real.resume()

    def describe(self) -> str:
        return "dies inside pause"


def test_an_agent_killed_inside_its_first_pause_call_leaves_the_resume_on_record(engine, tmp_path):
    # The ledger is written before every Pause call: written only after, a kill inside the
    # call left a record holding nothing, which the next agent forgot, DCGM paused for good.
    m = dcgm.PauseManager(DiesInsidePause(tmp_path / "ledger", tmp_path / "found"), tmp_path / "ledger",
                          retry_delay_s=0.05)
    assert m.acquire("a", 60) is DcgmOutcome.PAUSED
    m.close()
    controls("bindings").pause()  # as the killed agent left it
    successor = dcgm.PauseManager(controls("bindings"), tmp_path / "found", retry_delay_s=0.05)
    assert successor.recover() is DcgmOutcome.RESUMED and not paused(engine)
    successor.close()


def test_a_failed_resume_is_retried_with_growing_delays(tmp_path):
    class Failing(Unanswering):
        def __init__(self) -> None:
            super().__init__(timeout_s=0)
            self.at: list[float] = []

        def resume(self) -> DcgmOutcome:
            self.at.append(time.monotonic())
            return super().resume()

    engine = Failing()
    m = dcgm.PauseManager(engine, tmp_path / "ledger", resume_retries=3, retry_delay_s=0.1)
    m.acquire("a", 60)
    assert m.release("a") is DcgmOutcome.FAILED
    first, second = engine.at[1] - engine.at[0], engine.at[2] - engine.at[1]
    assert first >= 0.1 and second >= 0.2  # retry_delay_s x 2^attempt between the three calls
    m.close()


def test_an_agent_whose_last_lease_another_agent_still_needs_owes_no_resume(engine, tmp_path):
    fleet, job = manager(tmp_path), manager(tmp_path, "dcgmi")  # one folder: one host
    fleet.acquire("sweep-1", 60)
    job.acquire("sweep-2", 60)
    assert fleet.release("sweep-1") is DcgmOutcome.PAUSED and not fleet.paused  # the resume is job's now
    assert journal(fleet)["paused"] is False
    assert job.release("sweep-2") is DcgmOutcome.RESUMED
    time.sleep(0.3)  # fleet's timer (retry looks every 0.2 s) finds nothing owed: no second resume
    assert ops(engine) == ["pause", "pause", "resume"]
    fleet.close(), job.close()


def test_two_agents_of_one_host_resume_only_after_both_released(engine, tmp_path):
    fleet, job = manager(tmp_path), manager(tmp_path, "dcgmi")  # one folder: one host
    assert fleet.acquire("sweep-1", 60) is DcgmOutcome.PAUSED
    assert job.acquire("sweep-2", 60) is DcgmOutcome.PAUSED
    assert fleet.release("sweep-1") is DcgmOutcome.PAUSED  # the other agent still captures
    assert paused(engine)
    assert job.release("sweep-2") is DcgmOutcome.RESUMED
    assert not paused(engine)
    assert ops(engine) == ["pause", "pause", "resume"]
    fleet.close(), job.close()
    assert list((tmp_path / "ledger").glob("holder-*")) == []


def test_closing_an_agent_leaves_another_agents_pause_alone(engine, tmp_path):
    fleet, job = manager(tmp_path), manager(tmp_path)
    fleet.acquire("sweep-1", 60)
    job.acquire("sweep-2", 60)
    assert fleet.close() is DcgmOutcome.PAUSED
    assert paused(engine)
    assert job.close() is DcgmOutcome.RESUMED and not paused(engine)


def test_ledger_folder_is_shared_by_users_and_refuses_what_it_cannot_use(tmp_path):
    m = manager(tmp_path)
    m.recover()
    assert (tmp_path / "ledger").stat().st_mode & 0o7777 == 0o1777  # like /tmp: all join, none deletes another's
    assert m.ledger.path.stat().st_mode & 0o777 == 0o644
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "ledger")
    for bad, problem in (("file", "cannot use the DCGM pause ledger (not a folder)"),
                         ("file/ledger", f"cannot use the DCGM pause ledger (cannot create the folder ({tmp_path / 'file'} "
                                         "is not a folder))"),
                         ("link", "must not be a symbolic link")):
        with pytest.raises(ConfigError, match=re.escape(problem)) as caught:
            dcgm.PauseManager(controls("dcgmi"), tmp_path / bad).recover()
        assert str(tmp_path / bad) in str(caught.value)


AGENT_SCRIPT = """
import sys, time
from pathlib import Path
from rankscope.agent import dcgm
m = dcgm.PauseManager(dcgm.BindingsControl(Path(sys.argv[1]), "localhost"), Path(sys.argv[2]))
if sys.argv[3] == "capture":
    print(m.acquire("sweep-7", lease_s=600).value, flush=True)
    time.sleep(600)
else:
    print(m.recover().value, flush=True)
    m.close()
"""


def capturing_agent(engine: Path, ledger: Path) -> subprocess.Popen:
    """Another agent process on this host, holding a pause for a long capture."""
    argv = [sys.executable, "-c", AGENT_SCRIPT, str(standin_dcgm.BINDINGS), str(ledger), "capture"]
    agent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=standin_dcgm.env(engine))
    assert agent.stdout.readline().strip() == "paused"
    assert paused(engine)
    return agent


def kill_9(agent: subprocess.Popen) -> None:
    os.kill(agent.pid, signal.SIGKILL)
    agent.wait()


def test_kill_9_mid_capture_then_restart_resumes_from_the_ledger(engine, tmp_path):
    ledger = tmp_path / "ledger"
    kill_9(capturing_agent(engine, ledger))
    time.sleep(0.3)
    assert paused(engine)  # DCGM does not resume by itself: the pause outlived its pauser
    restarted = time.time()
    argv = [sys.executable, "-c", AGENT_SCRIPT, str(standin_dcgm.BINDINGS), str(ledger), "recover"]
    done = subprocess.run(argv, capture_output=True, text=True, env=standin_dcgm.env(engine), timeout=30)
    assert done.stdout.strip() == "resumed", done.stderr
    assert not paused(engine)
    resumed_at = [c["t"] for c in standin_dcgm.calls(engine) if c["op"] == "resume"][-1]
    assert resumed_at - restarted < 5  # the bound: resumed within 5 s of the restart
    assert list(ledger.glob("holder-*")) == []  # the dead agent's record went with its pause


def test_a_starting_agent_leaves_a_live_agents_pause_alone(engine, tmp_path):
    other = capturing_agent(engine, tmp_path / "ledger")
    try:
        m = manager(tmp_path, reassert_s=0.1)
        assert m.recover() is None  # nothing was left behind: the pause is the other agent's
        time.sleep(0.5)  # idle looks at the ledger, too
        assert paused(engine) and ops(engine) == ["pause"]
    finally:
        kill_9(other)
    m.close()


def test_an_idle_agent_resumes_a_pause_another_agent_died_with(engine, tmp_path):
    m = manager(tmp_path, reassert_s=0.2)
    m.recover()
    other = capturing_agent(engine, tmp_path / "ledger")
    kill_9(other)  # e.g. a Slurm job's agent, killed with its job
    deadline = time.monotonic() + 10
    while paused(engine) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not paused(engine) and ops(engine) == ["pause", "resume"]
    m.close()


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGHUP"])  # SIGHUP: its terminal or ssh session closed
def test_an_agent_says_which_dcgm_it_drives_and_warns_when_the_one_asked_for_is_missing(tmp_path, signum, default_hangup):
    """Asked for dcgmi where PATH has none (a dcgmi named by path must be there: it is a
    usage error), the agent runs (tracing needs no counters) but says at start that its
    captures will not pause DCGM."""
    import signal
    import subprocess

    env = {**{k: v for k, v in os.environ.items() if k != "RANKSCOPE_DCGMI"}, "PATH": str(tmp_path)}
    agent = subprocess.Popen(
        default_hangup([sys.executable, "-m", "rankscope", "agent", "--coordinator", "127.0.0.1:1", "--name", "n1",
                        "--spool", str(tmp_path / "spool"), "--dcgm", "dcgmi"]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = agent.stdout.readline()
    finally:
        agent.send_signal(getattr(signal, signum))
        _, err = agent.communicate(timeout=30)
    assert agent.returncode == 0  # ended through its clean-up (Agent.close resumes DCGM), not by the signal
    assert first.startswith("rankscope agent n1 (pid ") and first.rstrip().endswith(
        "; DCGM: none (dcgmi not found, or not executable)")
    assert "--dcgm dcgmi, yet dcgmi not found, or not executable: captures will not pause DCGM profiling" in err
