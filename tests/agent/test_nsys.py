"""nsys argv builders, feature detection, and the nsys backend against the nsys stand-in
with real `rankscope rank` processes."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import namedtuple
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
import standin_nsys  # noqa: E402

from rankscope.agent import nsys, window  # noqa: E402
from rankscope.agent.backend import CaptureRequest  # noqa: E402
from rankscope.agent.spool import local_ranks  # noqa: E402
from rankscope.analysis import simulate  # noqa: E402
from rankscope.analysis.sources import load_digests  # noqa: E402
from rankscope.errors import ConfigError, ToolError  # noqa: E402

pytestmark = pytest.mark.timeout(120)


# -- argv builders -----------------------------------------------------------------------------


def test_launch_command():
    assert nsys.launch_command("rankscope_77_r3_999", ["python", "train.py", "--lr", "1"]) == [
        "nsys", "launch", "--session-new=rankscope_77_r3_999", "--trace=cuda,nvtx", "--cuda-graph-trace=node",
        "--wait=primary", "python", "train.py", "--lr", "1"]
    with pytest.raises(ValueError):
        nsys.launch_command("s", [])


def test_start_command_asks_for_gpu_metrics_only_when_told():
    assert nsys.start_command("s", Path("/w/sw_rank0")) == [
        "nsys", "start", "--session=s", "--output=/w/sw_rank0", "--force-overwrite=true", "--sample=none",
        "--cpuctxsw=none"]
    assert nsys.start_command("s", Path("/w/x"), gpu_metrics=True, nsys="/opt/nsys")[-1] == "--gpu-metrics-devices=all"
    assert nsys.start_command("s", Path("/w/x"), gpu_metrics=True, nsys="/opt/nsys")[0] == "/opt/nsys"


def test_stop_sessions_export_help_commands():
    assert nsys.stop_command("s") == ["nsys", "stop", "--session=s"]
    assert nsys.sessions_list_command() == ["nsys", "sessions", "list"]
    assert nsys.export_command(Path("/w/r.nsys-rep"), Path("/w/r.sqlite")) == [
        "nsys", "export", "--type=sqlite", "--output=/w/r.sqlite", "--force-overwrite=true",
        "--include-blobs=true", "/w/r.nsys-rep"]
    assert nsys.help_command("launch") == ["nsys", "launch", "--help"]
    assert nsys.gpu_metrics_devices_command() == ["nsys", "profile", "--gpu-metrics-devices=help"]


def test_profile_command_one_shot():
    assert nsys.profile_command(["app"], Path("/s/r0"), duration_s=20) == [
        "nsys", "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--sample=none", "--cpuctxsw=none",
        "--output=/s/r0", "--force-overwrite=true", "--duration=20", "--kill=none", "app"]
    assert nsys.profile_command(["app", "-x"], Path("/s/r0"), capture_range="cudaProfilerApi", gpu_metrics=True) == [
        "nsys", "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--sample=none", "--cpuctxsw=none",
        "--output=/s/r0", "--force-overwrite=true", "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--kill=none", "--gpu-metrics-devices=all",
        "app", "-x"]
    with pytest.raises(ValueError):
        nsys.profile_command(["app"], Path("/s/r0"))
    # PyTorch's NVTX ranges use unregistered strings, which open no range unless nsys is told to look
    assert nsys.profile_command(["app"], Path("/s/r0"), capture_range="nvtx", nvtx_capture="step 3@*")[8:13] == [
        "--capture-range=nvtx", "--capture-range-end=stop", "--kill=none", "--nvtx-capture=step 3@*",
        "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0"]
    with pytest.raises(ValueError):
        nsys.profile_command(["app"], Path("/s/r0"), duration_s=1, capture_range="cudaProfilerApi")
    with pytest.raises(ValueError, match="nvtx-capture"):
        nsys.profile_command(["app"], Path("/s/r0"), capture_range="nvtx")


def test_trace_flag_nccl_modes():
    assert nsys.trace_flag(["cuda", "nvtx", "osrt"]) == "--trace=cuda,nvtx,osrt"
    assert nsys.trace_flag(["cuda", "nccl"], "legacy") == "--trace=cuda,nvtx"  # NVTX carries legacy NCCL
    assert nsys.trace_flag(["cuda", "nvtx"], "auto", nccl_supported=True) == "--trace=cuda,nvtx,nccl"
    assert nsys.trace_flag(["cuda", "nvtx"], "auto", nccl_supported=False) == "--trace=cuda,nvtx"
    assert nsys.trace_flag(["cuda", "nvtx"], "advanced", nccl_supported=True) == "--trace=cuda,nvtx,nccl"
    with pytest.raises(ToolError, match="advanced NCCL tracing"):
        nsys.trace_flag(["cuda"], "advanced", nccl_supported=False)
    with pytest.raises(ValueError):
        nsys.trace_flag(["cuda"], "sometimes")


def test_session_name_is_safe_and_unique_per_process():
    assert nsys.session_name("job 7/a", 3, 1234) == "rankscope_job_7_a_r3_1234"
    assert nsys.session_name("", 0, 1) == "rankscope_nojob_r0_1"


def test_feature_detection_reads_the_help(tmp_path, monkeypatch):
    state = tmp_path / "nsys"
    for key, value in standin_nsys.env(state).items():
        monkeypatch.setenv(key, value)
    assert nsys.supports_nccl_trace() is False
    standin_nsys.configure(state, nccl_trace=True)
    assert nsys.supports_nccl_trace() is True
    assert nsys.supports_nccl_trace(nsys=str(tmp_path / "missing")) is False


# -- the backend against the stand-in, with real `rankscope rank` processes --------------------

Node = namedtuple("Node", "state spool env spec procs")


@pytest.fixture
def node(tmp_path):
    """Two ranks (0 and 1, local ranks 0 and 1) of a simulated job, each under `rankscope rank`."""
    spec = simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, job_id="j77", seed=3)
    spec_path = simulate.write_truth(spec, tmp_path / "truth.json")
    state, spool = tmp_path / "nsys", tmp_path / "spool"
    # the node's DCGM engine as the ranks' nsys sees it (none until a test configures it)
    env = {**standin_nsys.env(state, spec_path), "RANKSCOPE_STANDIN_DCGM_STATE": str(tmp_path / "engine.json")}
    procs = []
    for rank in range(2):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "SLURM_JOB_ID": "77"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "rankscope", "rank", "--spool", str(spool), "--",
             sys.executable, "-c", "import time; time.sleep(120)"], env=rank_env))
    deadline = time.monotonic() + 60
    while len(local_ranks(spool)) < 2:
        assert time.monotonic() < deadline, "ranks never announced"
        assert all(p.poll() is None for p in procs), "a rank wrapper exited"
        time.sleep(0.1)
    yield Node(state, spool, env, spec, procs)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(30)


def request_for(node: Node, tmp_path: Path, **options) -> CaptureRequest:
    return CaptureRequest(sweep_id="sw1", duration_s=0.1, workdir=tmp_path / "work",
                          ranks=tuple(local_ranks(node.spool)), options=options)


def use_env(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_rank_wrapper_launches_each_rank_in_its_own_session(node):
    ranks = local_ranks(node.spool)
    assert [(r.rank, r.local_rank, r.world_size, r.job_id, r.backend) for r in ranks] == [
        (0, 0, 2, "77", "nsys"), (1, 1, 2, "77", "nsys")]
    launches = [standin_nsys.launched(argv) for argv in standin_nsys.calls(node.state) if argv[0] == "launch"]
    assert sorted(head for head, _, _ in launches) == sorted(
        ["launch", f"--session-new={r.session}", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--wait=primary"] for r in ranks)
    assert all(os.path.samefile(folder, os.getcwd()) and app == [sys.executable, "-c", "import time; time.sleep(120)"]
               for _, folder, app in launches)
    assert {r.session for r in ranks} == set(standin_nsys.sessions(node.state))


def test_capture_starts_stops_and_exports_every_rank(node, tmp_path, monkeypatch):
    use_env(monkeypatch, node.env)
    backend = nsys.NsysBackend(export_workers=1)  # one at a time: the exports come in rank order
    request = request_for(node, tmp_path)
    before = len(standin_nsys.calls(node.state))
    backend.start(request)
    reports = backend.stop(request)
    # stop exports nothing: DCGM is resumed between stop and export
    assert not any(argv[0] == "export" for argv in standin_nsys.calls(node.state))
    exports = backend.export(request, reports)
    ranks = local_ranks(node.spool)
    work = request.workdir
    starts = [["start", f"--session={r.session}", f"--output={work}/reports/sw1_{r.host}_rank{r.rank}_{r.pid}",
               "--force-overwrite=true", "--sample=none", "--cpuctxsw=none",
               *(["--gpu-metrics-devices=all"] if r.local_rank == 0 else [])] for r in ranks]
    stops = [["stop", f"--session={r.session}"] for r in ranks]
    exported = [["export", "--type=sqlite", f"--output={work}/reports/sw1_{r.host}_rank{r.rank}_{r.pid}.sqlite",
                 "--force-overwrite=true", "--include-blobs=true", f"{work}/reports/sw1_{r.host}_rank{r.rank}_{r.pid}.nsys-rep"]
                for r in ranks]
    calls = standin_nsys.calls(node.state)[before:]
    check = ["profile", "--gpu-metrics-devices=help"]  # counters free? (nobody holds them here)
    assert calls.count(check) == 1 and calls.index(check) < calls.index(starts[0])
    # the ranks' starts, then their stops, each all at once (in any order)
    calls.remove(check)
    assert sorted(calls[0:2]) == sorted(starts) and sorted(calls[2:4]) == sorted(stops) and calls[4:] == exported
    # Each session's own wrapper ran its check, start and stop: the process that launched it, as
    # its user and in its container, where an agent in another pod or of another user may not reach it.
    wrapper = {f"--session={r.session}": r.pid for r in ranks}
    ran = [(argv, ppid) for argv, ppid in standin_nsys.callers(node.state) if argv[0] in ("start", "stop", "profile")]
    assert len(ran) == 5 and all(ppid == wrapper.get(argv[1], ranks[0].pid) for argv, ppid in ran)
    assert [p.name for p in exports] == [f"sw1_{r.host}_rank{r.rank}_{r.pid}.sqlite" for r in ranks]
    assert not list(work.rglob("*.nsys-rep"))  # reports removed once exported
    # the ranks' sessions write their reports as the job's user, whoever the agent runs as
    assert stat.S_IMODE((work / "reports").stat().st_mode) == 0o777 | stat.S_ISVTX
    digests = load_digests(exports)
    assert sorted(digests.column("rank").to_pylist()) == [0, 1]
    assert set(digests.column("job_id").to_pylist()) == {"j77"}


@pytest.mark.parametrize("command", ["start", "stop"])
def test_the_ranks_sessions_start_and_stop_at_once(node, tmp_path, monkeypatch, command: str):
    """One after another, a node's last rank began (and ended) its window seconds after its
    first (each nsys call takes its time), and the collectives of those seconds, which miss a
    rank, were dropped as incomplete. The stand-in fails a call that runs alone."""
    use_env(monkeypatch, node.env)
    standin_nsys.configure(node.state, **{f"{command}_together": 2, f"{command}_wait_s": 10})
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    assert len(backend.stop(request)) == 2 and backend.notes == []


def test_one_rank_samples_gpu_metrics_on_a_node_two_jobs_share(node, tmp_path, monkeypatch):
    """A second job's local rank 0 on the node: each local rank 0 asked for the node's GPU
    metrics, two samplers contending for the counters (one per node, the User Guide says),
    and the two rank 0s wrote one report, each over the other's."""
    use_env(monkeypatch, node.env)
    other = subprocess.Popen(
        [sys.executable, "-m", "rankscope", "rank", "--spool", str(node.spool), "--", sys.executable, "-c",
         "import time; time.sleep(120)"],
        env={**node.env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "78"})
    try:
        deadline = time.monotonic() + 60
        while len(local_ranks(node.spool)) < 3:
            assert time.monotonic() < deadline and other.poll() is None, "the second job's rank never announced"
            time.sleep(0.1)
        ranks = tuple(reversed(local_ranks(node.spool)))  # job 78's rank listed first
        assert [(r.job_id, r.local_rank) for r in ranks].count(("78", 0)) == 1
        request = CaptureRequest(sweep_id="sw1", duration_s=0.1, workdir=tmp_path / "work", ranks=ranks, options={})
        backend = nsys.NsysBackend()
        assert backend.needs_gpu_counters(request)
        backend.start(request)
        assert backend.counters_held(request)  # the sampler records GPU metrics: DCGM stays paused
        reports = backend.stop(request)
    finally:
        other.terminate()
        other.wait(30)
    by_session = {r.session: r for r in ranks}
    calls = standin_nsys.calls(node.state)
    sampling = [by_session[argv[1].removeprefix("--session=")] for argv in calls
                if argv[0] == "start" and "--gpu-metrics-devices=all" in argv]
    assert [(r.job_id, r.rank) for r in sampling] == [("77", 0)]
    assert len([argv for argv in calls if argv[0] == "stop"]) == 3
    outputs = [argv[2] for argv in calls if argv[0] == "start"]
    assert len(set(outputs)) == 3 and len(set(reports)) == 3


def test_gpu_metrics_nsys_cannot_collect_leave_the_trace_captured_and_say_why(node, tmp_path, monkeypatch):
    """The sampler's start refused for its GPU metrics (no permission to read the counters,
    ERR_NVGPUCTRPERM, which the check for a holder before the start does not see) failed
    the node's whole capture, the trace with it."""
    use_env(monkeypatch, node.env)
    standin_nsys.fail(node.state, "start --gpu-metrics-devices", "insufficient privilege to read GPU counters")
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    assert backend.needs_gpu_counters(request) and not backend.counters_held(request)  # DCGM may come back
    assert len(backend.stop(request)) == 2
    [sampler] = [r for r in request.ranks if r.local_rank == 0]
    [note] = backend.notes
    assert note.startswith("rank 0: captured without GPU metrics, which nsys could not collect (`")
    assert note.endswith("--gpu-metrics-devices=all` failed (exit 1): Error: insufficient privilege to read GPU counters)")
    starts = [argv for argv in standin_nsys.calls(node.state) if argv[0] == "start"]
    assert [argv[1] for argv in starts if "--gpu-metrics-devices=all" not in argv].count(f"--session={sampler.session}") == 1


@pytest.mark.parametrize("off", ["false", "off", "0", "No"])
def test_gpu_metrics_can_be_turned_off(node, tmp_path, monkeypatch, off: str):
    # "off" and "0" were read as on (anything but "false"): DCGM paused for counters nobody asked for
    use_env(monkeypatch, node.env)
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path, gpu_metrics=off)
    assert not backend.needs_gpu_counters(request)
    backend.start(request)
    backend.stop(request)
    assert not any("--gpu-metrics-devices=all" in argv for argv in standin_nsys.calls(node.state))
    assert ["profile", "--gpu-metrics-devices=help"] not in standin_nsys.calls(node.state)


def test_gpu_metrics_neither_on_nor_off_refuse_the_capture_before_it_starts(node, tmp_path, monkeypatch):
    use_env(monkeypatch, node.env)
    backend = nsys.NsysBackend()
    with pytest.raises(ConfigError, match=r"^capture option gpu_metrics='maybe': expected true or false "
                                          r"\(yes/no, on/off, 1/0\)$"):
        backend.check(request_for(node, tmp_path, gpu_metrics="maybe"))
    assert not [argv for argv in standin_nsys.calls(node.state) if argv[0] in ("start", "profile")]
    assert backend.needs_gpu_counters(request_for(node, tmp_path, gpu_metrics=" YES "))


def test_gpu_metrics_are_dropped_when_an_unpaused_dcgm_holds_the_counters(node, tmp_path, monkeypatch):
    import standin_dcgm

    use_env(monkeypatch, node.env)
    engine = tmp_path / "engine.json"
    standin_dcgm.configure(engine)  # profiling, not paused, pre-Hopper
    assert nsys.gpu_metrics_held() is True
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    starts = [argv for argv in standin_nsys.calls(node.state) if argv[0] == "start"]
    assert len(starts) == 2 and not any("--gpu-metrics-devices=all" in argv for argv in starts)
    assert backend.notes == ["rank 0: GPU counters are held by another tool (DCGM not paused?): captured without GPU metrics"]
    assert not backend.counters_held(request)
    assert len(backend.stop(request)) == 2  # the trace itself is complete
    standin_dcgm.configure(engine, paused=True)
    assert nsys.gpu_metrics_held() is False


def test_the_ranks_reports_are_exported_at_once_each_by_its_own_nsys_export(node, tmp_path, monkeypatch):
    """On an 8-GPU node the exports, one process per report, must not queue behind each other."""
    use_env(monkeypatch, node.env)
    standin_nsys.configure(node.state, export_together=2)  # each export waits for a second one to run
    backend = nsys.NsysBackend(export_workers=2)
    request = request_for(node, tmp_path)
    backend.start(request)
    exports = backend.export(request, backend.stop(request))
    assert sorted(load_digests(exports).column("rank").to_pylist()) == [0, 1] and backend.notes == []
    # the bound told to the coordinator: one wave of exports here, two one at a time
    assert backend.export_timeout_s(exports) == backend.report_wait_s + nsys.EXPORT_TIMEOUT_S
    assert nsys.NsysBackend(export_workers=1).export_timeout_s(exports) == 2 * (
        backend.report_wait_s + nsys.EXPORT_TIMEOUT_S)


def test_exports_one_at_a_time_are_what_the_stand_in_catches(node, tmp_path, monkeypatch):
    """The check above is real: one at a time, the first export waits in vain for a second."""
    use_env(monkeypatch, node.env)
    standin_nsys.configure(node.state, export_together=2, export_wait_s=1)
    backend = nsys.NsysBackend(export_workers=1)
    request = request_for(node, tmp_path)
    backend.start(request)
    exports = backend.export(request, backend.stop(request))
    assert len(exports) == 1 and "sw1_" in backend.notes[0] and "ran alone" in backend.notes[0]


def test_nsys_missing_is_a_tool_error(node, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for step in (nsys.NsysBackend().check, nsys.NsysBackend().start):  # check: before DCGM is paused
        with pytest.raises(ToolError, match="nsys not found"):
            step(request_for(node, tmp_path))


def test_export_failure_names_the_rank_and_nsys_words(node, tmp_path, monkeypatch):
    use_env(monkeypatch, node.env)
    standin_nsys.fail(node.state, "export", "No space left on device")
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    reports = backend.stop(request)
    with pytest.raises(ToolError, match=r"sw1_.*_rank0_\d+.nsys-rep: `.*nsys export .*` failed \(exit 1\): "
                                        r"Error: No space left on device"):
        backend.export(request, reports)


def test_a_rank_that_died_mid_window_is_exported_as_far_as_it_lived_and_the_others_go_on(
        node, tmp_path, monkeypatch, caplog):
    """A crashed rank is what one investigates: it must not cost the node its other ranks."""
    use_env(monkeypatch, node.env)
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    dead = request.ranks[1]
    app = standin_nsys.sessions(node.state)[dead.session]["app_pid"]
    os.kill(app, signal.SIGKILL)
    node.procs[1].wait(30)
    after = request_for(node, tmp_path)  # the spool as the agent reads it now: rank 1 is gone
    assert [r.rank for r in after.ranks] == [0]
    exports = backend.export(after, backend.stop(after))  # the ranks it started, dead or alive
    assert ["stop", f"--session={request.ranks[0].session}"] in standin_nsys.calls(node.state)
    assert standin_nsys.sessions(node.state)[request.ranks[0].session]["state"] == "launched"
    assert sorted(load_digests(exports).column("rank").to_pylist()) == [0, 1]
    assert backend.notes == ["rank 1: ended during the window: exported what nsys recorded until then"]
    assert backend.notes[0] in caplog.text


def test_a_window_whose_agent_is_lost_ends_by_itself_soon_after_its_duration(node, tmp_path, monkeypatch):
    """No stop ever comes (the agent died for good): each wrapper stops its session at the
    capture's duration plus a grace, rather than record until the job ends."""
    use_env(monkeypatch, node.env)
    monkeypatch.setattr(window, "GRACE_S", 0.5)
    request = request_for(node, tmp_path)
    nsys.NsysBackend().start(request)  # and nothing more from this agent
    deadline = time.monotonic() + 30
    while {s["state"] for s in standin_nsys.sessions(node.state).values()} != {"launched"}:
        assert time.monotonic() < deadline, "a window was still open 30 s after its 0.6 s"
        time.sleep(0.1)
    assert all(Path(f"{nsys.report_base(request, r)}{nsys.REPORT_SUFFIX}").exists() for r in request.ranks)
    assert all(p.poll() is None for p in node.procs)  # the job runs on


def test_ranks_that_fail_to_export_are_left_out_while_one_exports(node, tmp_path, monkeypatch, caplog):
    use_env(monkeypatch, node.env)
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    lost = Path(f"{nsys.report_base(request, request.ranks[1])}{nsys.REPORT_SUFFIX}")
    monkeypatch.setattr(backend, "report_wait_s", 0.5)
    real_wait = backend._wait_for_report

    def lose_rank_1(report, cancelled):  # e.g. nsys could not write that report
        if report == lost:
            report.unlink()
        return real_wait(report, cancelled)

    monkeypatch.setattr(backend, "_wait_for_report", lose_rank_1)
    exports = backend.export(request, backend.stop(request))
    assert [p.name for p in exports] == [f"sw1_{request.ranks[0].host}_rank0_{request.ranks[0].pid}.sqlite"]
    assert len(backend.notes) == 1 and backend.notes[0].startswith(
        f"went on without {lost.name}: nsys stopped the session but wrote no report")
    assert backend.notes[0] in caplog.text


def test_a_rank_that_cannot_be_made_ready_keeps_every_rank_from_starting(node, tmp_path, monkeypatch):
    use_env(monkeypatch, node.env)
    request = request_for(node, tmp_path)
    second = request.ranks[1].session
    os.kill(standin_nsys.sessions(node.state)[second]["app_pid"], signal.SIGKILL)
    node.procs[1].wait(30)
    with pytest.raises(ToolError, match="^not every rank started recording: rank 1: the rank exited$"):
        nsys.NsysBackend().start(request)
    assert not any(argv[0] in ("start", "stop") for argv in standin_nsys.calls(node.state))
    assert not window.captures_dir(node.spool).joinpath("sw1").exists()


def test_a_start_that_fails_ends_the_windows_already_started(node, tmp_path, monkeypatch):
    """Ready together, started together: where one rank's `nsys start` fails, the others
    recording are told to stop, none left collecting for a capture that failed."""
    use_env(monkeypatch, node.env)
    request = request_for(node, tmp_path)
    first, second = request.ranks
    subprocess.run(nsys.start_command(second.session, tmp_path / "orphan"), check=True, env=node.env)
    standin_nsys.fail(node.state, "stop", "cannot stop it")  # the collection left open stays open
    with pytest.raises(ToolError, match=rf"^not every rank started recording: rank 1: `.*nsys start "
                                        rf"--session={second.session} .*` failed \(exit 1\): Error: session"):
        nsys.NsysBackend().start(request)
    calls = standin_nsys.calls(node.state)
    began = calls.index(nsys.start_command(first.session, nsys.report_base(request, first), gpu_metrics=True)[1:])
    assert ["stop", f"--session={first.session}"] in calls[began:]


def test_disk_full_is_said_before_exporting(node, tmp_path, monkeypatch):
    use_env(monkeypatch, node.env)
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(nsys.shutil, "disk_usage", lambda path: usage._replace(free=1 << 20))
    reports = backend.stop(request)
    with pytest.raises(ToolError, match="disk full: 1 MiB free"):
        backend.export(request, reports)


def test_a_hung_nsys_times_out(tmp_path):
    hung = tmp_path / "nsys"
    hung.write_text("#!/bin/sh\nsleep 30\n")
    hung.chmod(0o755)
    with pytest.raises(ToolError, match="did not finish within 0.5 s"):
        nsys.run(nsys.stop_command("s", nsys=str(hung)), timeout_s=0.5)


def _alive(pid: int) -> bool:
    try:  # a zombie (dead, not yet reaped by whoever adopted it) counts as gone
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_a_cancel_kills_a_running_nsys_command_and_what_it_started(tmp_path):
    hung, child = tmp_path / "nsys", tmp_path / "child.pid"
    hung.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {child}\nwait\n")
    hung.chmod(0o755)
    cancelled = threading.Event()
    threading.Timer(0.5, cancelled.set).start()
    began = time.monotonic()
    with pytest.raises(ToolError, match="was stopped: the capture was cancelled"):
        nsys.run(nsys.stop_command("s", nsys=str(hung)), timeout_s=60, cancelled=cancelled)
    assert time.monotonic() - began < 10
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


def test_a_command_queued_behind_a_cancel_is_not_started(tmp_path):
    marker = tmp_path / "started"
    tool = tmp_path / "nsys"
    tool.write_text(f"#!/bin/sh\ntouch {marker}\n")
    tool.chmod(0o755)
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(ToolError, match="was not started: the capture was cancelled"):
        nsys.run(nsys.stop_command("s", nsys=str(tool)), timeout_s=60, cancelled=cancelled)
    assert not marker.exists()


def test_a_cancelled_capture_stops_its_exports_and_keeps_no_half_export(node, tmp_path, monkeypatch):
    """A cancel mid-export ends it within a poll, not after every report is exported."""
    use_env(monkeypatch, node.env)
    standin_nsys.configure(node.state, export_together=3, export_wait_s=60)  # two ranks: both exports hang
    backend = nsys.NsysBackend(export_workers=2)
    request = request_for(node, tmp_path)
    backend.start(request)
    reports = backend.stop(request)
    threading.Timer(0.5, request.cancelled.set).start()
    began = time.monotonic()
    with pytest.raises(ToolError, match="sweep sw1: exports stopped, the capture was cancelled"):
        backend.export(request, reports)
    assert time.monotonic() - began < 10
    assert not list(request.workdir.rglob("*.sqlite*")) and all(Path(r).exists() for r in reports)


def test_an_export_an_agent_killed_mid_export_left_running_is_stopped_before_exporting_again(
        node, tmp_path, monkeypatch):
    """`run` starts each export in its own session, so one outlives an agent killed mid-export;
    the restarted agent's export of the same report must not run beside it."""
    use_env(monkeypatch, node.env)
    standin_nsys.configure(node.state, export_together=3, export_wait_s=60)  # an export hangs
    backend = nsys.NsysBackend()
    request = request_for(node, tmp_path)
    backend.start(request)
    reports = backend.stop(request)
    leftover = subprocess.Popen(nsys.export_command(reports[0], nsys.export_path(reports[0])),
                                start_new_session=True, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (node.state / "running-export" / reports[0].name).exists():  # it has begun, and waits
        assert leftover.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    standin_nsys.configure(node.state)  # the restarted agent's exports run straight through
    try:
        exports = backend.export(request, reports)
        assert leftover.wait(timeout=5) == -signal.SIGKILL
    finally:
        leftover.kill()
        leftover.wait()
    assert exports == [nsys.export_path(r) for r in reports]
    assert sorted(load_digests(exports).column("rank").to_pylist()) == [0, 1]


def test_a_leftover_export_stopped_is_logged_as_a_command_line_that_runs_pasted(tmp_path, caplog):
    # its argv was joined with spaces: a report in "my reports" read as two words
    report = tmp_path / "my reports" / "rank 0.nsys-rep"
    command = nsys.export_command(report, nsys.export_path(report))
    argv = [sys.executable, "-c", "import time; print(flush=True); time.sleep(60)", *command[1:]]  # ends as the export's
    leftover = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
    try:
        leftover.stdout.readline()  # it runs: its argv is in /proc (not always so just after exec)
        with caplog.at_level("WARNING", logger=nsys.__name__):
            nsys.stop_leftover_exports([command])
        assert leftover.wait(timeout=5) == -signal.SIGKILL
    finally:
        leftover.kill()
        leftover.wait()
        leftover.stdout.close()
    logged, = (r.getMessage() for r in caplog.records if "left running by an earlier agent" in r.getMessage())
    assert shlex.split(logged.split("`")[1]) == argv


def test_no_ranks_under_nsys_is_an_error(tmp_path):
    request = CaptureRequest(sweep_id="s", duration_s=1, workdir=tmp_path, ranks=())
    for step in (nsys.NsysBackend(nsys=sys.executable).check, nsys.NsysBackend(nsys=sys.executable).start):
        with pytest.raises(ToolError, match="no rank on this node"):
            step(request)


def test_ranks_under_an_older_wrapper_are_refused_at_once(tmp_path):
    """A wrapper that does not answer through the spool (a job's image built before the
    agent's) is named before DCGM is paused, not found out by a start that times out."""
    from rankscope.agent.spool import RankInfo

    ranks = tuple(RankInfo(rank=n, local_rank=n, world_size=4, pid=os.getpid(), host="h", session=f"s{n}",
                           spool=str(tmp_path), protocol=int(n == 0)) for n in range(3))
    request = CaptureRequest(sweep_id="s", duration_s=1, workdir=tmp_path, ranks=ranks)
    with pytest.raises(ToolError, match=r"^ranks 1, 2 run under a `rankscope rank` older than this agent"):
        nsys.NsysBackend(nsys=sys.executable).check(request)
    with pytest.raises(ToolError, match=r"^rank 2 runs under"):
        nsys.NsysBackend(nsys=sys.executable).check(replace(request, ranks=ranks[:1] + ranks[2:]))
    assert not (tmp_path / "captures").exists()


def test_a_collection_left_open_in_a_session_is_stopped_before_starting(node, tmp_path, monkeypatch):
    """A collection nobody stops (an `nsys stop` that timed out, an older agent that died in
    its window) keeps the session from starting again: the wrapper stops it first."""
    use_env(monkeypatch, node.env)
    first = local_ranks(node.spool)[0]
    orphan = tmp_path / "orphan"
    subprocess.run(nsys.start_command(first.session, orphan), check=True, env=node.env)
    request = request_for(node, tmp_path)
    before = len(standin_nsys.calls(node.state))
    backend = nsys.NsysBackend()
    backend.start(request)
    start = nsys.start_command(first.session, nsys.report_base(request, first), gpu_metrics=True)[1:]
    its = [argv for argv in standin_nsys.calls(node.state)[before:] if f"--session={first.session}" in argv]
    assert its[:3] == [start, ["stop", f"--session={first.session}"], start]
    assert Path(f"{orphan}{nsys.REPORT_SUFFIX}").exists()  # what it had recorded is not lost
    assert backend.notes == [] and len(backend.stop(request)) == 2


def test_a_stop_that_fails_cancels_the_collection_it_would_leave_open(node, tmp_path, monkeypatch):
    """An `nsys stop` past its bound is killed, but the session's collection goes on: still
    recording, the sampler's would hold the GPU counters once the agent resumed DCGM."""
    use_env(monkeypatch, node.env)
    first = local_ranks(node.spool)[0]
    sampler = nsys.SessionWindow(first.session, {"output": str(tmp_path / "r0"), "gpu_metrics": True, "timeout_s": 1},
                                 ended=lambda: False)
    sampler.start()
    standin_nsys.configure(node.state, stop_s=5)  # writing a large report
    with pytest.raises(ToolError, match=r"^`.*nsys stop --session=.*` did not finish within 1 s; its collection was "
                                        r"cancelled \(nsys cancel\): no report$"):
        sampler.close(tmp_path)
    assert standin_nsys.calls(node.state)[-1] == ["cancel", f"--session={first.session}"]
    assert standin_nsys.sessions(node.state)[first.session]["state"] == "launched"  # counters let go
    # Where the cancel fails too, both are said.
    sampler.start()
    standin_nsys.fail(node.state, "cancel", "no such collection")
    with pytest.raises(ToolError, match=r"; cancelling the collection failed too \(`.*nsys cancel --session=.*` failed "
                                        r"\(exit 1\): Error: no such collection\)$"):
        sampler.close(tmp_path)


def test_an_nsys_that_cannot_run_is_named_for_what_is_wrong(tmp_path: Path, monkeypatch) -> None:
    """A name is looked up on PATH; a path given (RANKSCOPE_NSYS, --nsys) is not 'not on PATH'."""
    plain = tmp_path / "nsys"
    plain.write_text("#!/bin/sh\n")  # there, but not executable
    with pytest.raises(ToolError, match=f"^nsys at {plain} is not executable: point RANKSCOPE_NSYS"):
        nsys.find_nsys(str(plain))
    with pytest.raises(ToolError, match=f"^nsys at {tmp_path / 'gone'} does not exist: point RANKSCOPE_NSYS"):
        nsys.find_nsys(str(tmp_path / "gone"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ToolError, match=r"^nsys not found \('nsys' is not on PATH\): install Nsight Systems"):
        nsys.find_nsys("nsys")


def test_two_captures_on_one_host_do_not_stop_each_others_sessions(node, tmp_path, monkeypatch):
    """A fleet agent and a job's own agent reading one spool: the second must not take the
    first's windows over (nor stop them); its ranks say they are busy."""
    use_env(monkeypatch, node.env)
    first, second = nsys.NsysBackend(), nsys.NsysBackend()
    request = request_for(node, tmp_path)
    other = CaptureRequest(sweep_id="sw2", duration_s=0.1, workdir=tmp_path / "work2", ranks=request.ranks)
    first.start(request)
    with pytest.raises(ToolError, match=r"^not every rank started recording: ranks 0, 1: already recording for capture sw1$"):
        second.start(other)
    sessions = standin_nsys.sessions(node.state)
    assert [sessions[r.session]["state"] for r in request.ranks] == ["collecting", "collecting"]
    assert sessions[request.ranks[0].session]["report"] == f"{nsys.report_base(request, request.ranks[0])}.nsys-rep"
    assert not any(argv[0] == "stop" for argv in standin_nsys.calls(node.state))
    exports = first.export(request, first.stop(request))
    assert sorted(load_digests(exports).column("rank").to_pylist()) == [0, 1]
    second.start(other)  # the window closed: the sessions are free again
    assert len(second.stop(other)) == 2


def test_agents_of_two_users_ask_the_ranks_of_one_spool(other_user) -> None:
    """Root's fleet agent and a job's own agent read one spool: the first to ask made
    `captures/` 0755, and the other could ask no rank to record at all."""
    from rankscope import output
    from rankscope.agent.spool import RankInfo

    folder, as_nobody = other_user
    spool = output.make_folder(folder / "spool", shared=True)
    ranks = [RankInfo(rank=n, local_rank=n, world_size=2, pid=100 + n, host="h", spool=str(spool), token=f"t{n}")
             for n in range(2)]
    window.ask("sw1", ranks, 10)  # root's agent

    def ask() -> int:  # the job's agent
        window.ask("sw2", ranks, 10)
        return 0

    assert as_nobody(ask) == 0
    assert sorted(p.name for p in window.captures_dir(spool).iterdir()) == ["sw1", "sw2"]
    assert window.asked("sw2", ranks) == ranks
