"""`rankscope rank`: identity from the launcher's environment, the nsys session it runs CMD
in, announcement and withdrawal, signals and exit codes, one-shot mode, the torch hand-off."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
import standin_nsys  # noqa: E402

import rankscope.agent as agent_package  # noqa: E402
from rankscope.agent import rank  # noqa: E402
from rankscope.agent.spool import local_ranks, ranks_dir  # noqa: E402
from rankscope.analysis import simulate  # noqa: E402
from rankscope.errors import InputError  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "run9",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, (5, 1, 8, "run9", "1")),
    ({"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16", "SLURM_JOB_ID": "4242",
      "CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, (9, 1, 16, "4242", "GPU-aaaa")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"},
     (3, 3, 4, "", "")),
    ({"PMI_RANK": "2", "MPI_LOCALRANKID": "0", "PMI_SIZE": "3"}, (2, 0, 3, "", "")),
    ({}, (0, 0, 1, "", "")),  # a lone process
    ({"RANKSCOPE_JOB_ID": "mine", "SLURM_JOB_ID": "4242", "RANK": "0"}, (0, 0, 1, "mine", "")),
    # torchrun without --rdzv-id: "none", the same for every job, is no job id
    ({"RANK": "0", "TORCHELASTIC_RUN_ID": "none"}, (0, 0, 1, "", "")),
    ({"RANK": "0", "TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}, (0, 0, 1, "77", "")),
])
def test_rank_identity_from_the_launcher_environment(env, expected):
    info = rank.rank_info(env, pid=77)
    assert (info.rank, info.local_rank, info.world_size, info.job_id, info.gpu) == expected
    assert info.pid == 77 and info.backend == "nsys" and info.host


def test_torchrun_wins_over_slurm_when_both_are_set():
    info = rank.rank_info({"RANK": "1", "SLURM_PROCID": "0", "WORLD_SIZE": "2", "SLURM_NTASKS": "1"}, pid=1)
    assert (info.rank, info.world_size) == (1, 2)


@pytest.mark.parametrize("mpi", [
    {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"},
    {"PMI_RANK": "3", "MPI_LOCALRANKID": "3", "PMI_SIZE": "4"},
])
def test_mpirun_in_a_slurm_batch_script_wins_over_the_inherited_batch_step(mpi):
    # Every rank mpirun starts inherits the batch step's SLURM_PROCID=0: read first, all were rank 0.
    batch_step = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "4242"}
    info = rank.rank_info({**batch_step, **mpi}, pid=1)
    assert (info.rank, info.local_rank, info.world_size, info.job_id) == (3, 3, 4, "4242")


@pytest.mark.parametrize("env, message", [
    ({"RANK": "x"}, "RANK='x' is not an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is outside a world of 4"),
    ({"RANK": "0", "WORLD_SIZE": "3000000000"}, "WORLD_SIZE='3000000000' is beyond any rank or world size"),
    ({"LOCAL_RANK": "3000000000"}, "LOCAL_RANK='3000000000' is beyond any rank or world size"),
])
def test_bad_rank_environment_is_an_input_error(env, message):
    with pytest.raises(InputError, match=message):
        rank.rank_info(env, pid=1)


def rankscope(*argv: str, env: dict[str, str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rankscope", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.fixture
def nsys_env(tmp_path):
    spec = simulate.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3, job_id="j1", seed=1)
    state = tmp_path / "nsys"
    env = standin_nsys.env(state, simulate.write_truth(spec, tmp_path / "truth.json"))
    return state, {**env, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "SLURM_JOB_ID": "55"}


def logged_command(err: str) -> list[str]:
    """The nsys command line `rankscope rank -v` logged, as a shell would split it pasted: it
    was joined with spaces, so `python -c "import sys; ..."` ran as two commands."""
    line, = (line for line in err.splitlines() if line.startswith("INFO rankscope.agent.rank: rank 1: "))
    return shlex.split(line.removeprefix("INFO rankscope.agent.rank: rank 1: "))


def test_exit_code_is_the_commands_and_the_rank_is_withdrawn(nsys_env, tmp_path):
    state, env = nsys_env
    spool = tmp_path / "spool"
    proc = rankscope("rank", "-v", "--spool", str(spool), "--", sys.executable, "-c", "import sys; sys.exit(7)", env=env)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, err
    assert not list(ranks_dir(spool).glob("*.json"))
    launch = [argv for argv in standin_nsys.calls(state) if argv[0] == "launch"]
    assert len(launch) == 1 and logged_command(err)[1:] == launch[0]
    session = launch[0][1].removeprefix("--session-new=")
    assert session == f"rankscope_55_r1_{proc.pid}"
    head, folder, app = standin_nsys.launched(launch[0])
    assert head == ["launch", f"--session-new={session}", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--wait=primary"]
    assert os.path.samefile(folder, os.getcwd()) and app == [sys.executable, "-c", "import sys; sys.exit(7)"]


def test_a_rank_never_captured_leaves_no_report_in_the_jobs_folder(nsys_env, tmp_path):
    """nsys writes a session whose application ended before any `start` as an empty
    report<N>.nsys-rep in its working folder (User Guide; the stand-in does too): that was the
    job's folder, one per uncaptured rank. The application still runs in the job's folder."""
    state, env = nsys_env
    job = tmp_path / "job"
    job.mkdir()
    spool = tmp_path / "spool"
    proc = rankscope("rank", "--spool", str(spool), "--", sys.executable, "-c", "import os; print(os.getcwd())",
                     env={**env, "PWD": str(job)}, cwd=job)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == str(job)
    assert sorted(p.name for p in job.iterdir()) == []
    assert list((spool / "launch").iterdir()) == []  # nsys's folder, and the empty report in it, removed


def test_signals_reach_the_command_and_the_announcement_lives_as_long_as_it(nsys_env, tmp_path):
    state, env = nsys_env
    spool = tmp_path / "spool"
    marker, ready = tmp_path / "got-term", tmp_path / "ready"
    script = ("import signal, sys, time, pathlib\n"
              f"signal.signal(signal.SIGTERM, lambda *a: (pathlib.Path({str(marker)!r}).write_text('x'), sys.exit(3)))\n"
              f"pathlib.Path({str(ready)!r}).touch()\n"
              "time.sleep(120)\n")
    proc = rankscope("rank", "--spool", str(spool), "--", sys.executable, "-c", script, env=env)
    deadline = time.monotonic() + 60
    # The command must have its handler before the signal comes (a loaded machine starts it late).
    while not (local_ranks(spool) and ready.exists()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.1)
    (info,) = local_ranks(spool)
    assert (info.rank, info.local_rank, info.pid, info.session) == (1, 1, proc.pid, f"rankscope_55_r1_{proc.pid}")
    assert info.key.startswith(f"{proc.pid}-") and info.locked  # unique to the wrapper, and held while it lives
    assert json.loads((ranks_dir(spool) / f"{info.key}.json").read_text())["session"] == info.session
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert marker.exists()  # the command itself got the SIGTERM
    assert proc.returncode == 3
    assert local_ranks(spool) == [] and not (ranks_dir(spool) / f"{info.key}.json").exists()


def test_the_commands_environment_is_the_wrappers(nsys_env, tmp_path):
    # The CLI's GRPC_VERBOSITY=ERROR (for rankscope's own gRPC) reached the training process,
    # silencing the gRPC warnings of a job that uses gRPC itself (Ray, JAX, TensorFlow).
    state, env = nsys_env
    env = {k: v for k, v in env.items() if k != "GRPC_VERBOSITY"}
    seen = tmp_path / "env.json"
    proc = rankscope("rank", "--spool", str(tmp_path / "spool"), "--", sys.executable, "-c",
                     f"import json, os; open({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(seen.read_text()) == env


def test_nsys_missing_fails_before_running_anything(tmp_path):
    env = {"PATH": str(tmp_path), "RANK": "0"}
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--spool", str(tmp_path / "s"), "--",
                           sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "rankscope: error: nsys not found" in proc.stderr
    assert not marker.exists()


def test_no_command_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--spool", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no command" in proc.stderr


@pytest.mark.parametrize("command, code", [("missing", 127), ("not executable", 126)])
def test_a_command_that_cannot_start_exits_as_a_shell_does(tmp_path, command, code):
    """127 for a command not found, 126 for one that cannot be executed; one line naming it,
    and the rank is not left announced."""
    program = tmp_path / "train"
    if command == "not executable":
        program.write_text("print('hi')\n")
    spool = tmp_path / "spool"
    proc = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--backend", "torch", "--spool", str(spool),
                           "--", str(program)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"rankscope: error: {program}: cannot run the command"), proc.stderr
    assert local_ranks(spool) == []


def test_a_spool_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    proc = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--backend", "torch", "--spool",
                           str(tmp_path / "file"), "--", sys.executable, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == f"rankscope: error: {tmp_path / 'file'}: not a folder"


def test_a_spool_whose_ranks_folder_cannot_be_written_fails_before_the_command_starts(nsys_env, tmp_path):
    # It failed only at the announcement, once CMD ran: a traceback, exit 1, and nsys killed
    # under a training process left running on its own.
    _, env = nsys_env
    spool, marker = tmp_path / "spool", tmp_path / "ran"
    spool.mkdir()
    (spool / "ranks").write_text("")
    proc = rankscope("rank", "--spool", str(spool), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and err.strip() == f"rankscope: error: {spool / 'ranks'}: not a folder"
    assert not marker.exists()


@pytest.mark.skipif(not shutil.which("setpriv"), reason="runs a second rank as another user (needs setpriv)")
def test_a_spool_the_wrapper_made_takes_other_users_ranks(nsys_env, other_user):
    # The first job's wrapper made the spool and its ranks folder 0755, its user's own: every
    # other user's rank on the node then failed at start (exit 2, cannot write in the folder).
    import pwd

    _, env = nsys_env
    other = pwd.getpwnam("nobody")
    shared, _ = other_user
    spool = shared / "spool"
    as_other = ["setpriv", f"--reuid={other.pw_uid}", f"--regid={other.pw_gid}", "--clear-groups"]
    for user, prefix in ((0, []), (other.pw_uid, as_other)):
        state = shared / f"nsys-{user}"
        state.mkdir()
        os.chown(state, user, -1)
        proc = subprocess.run([*prefix, sys.executable, "-m", "rankscope", "rank", "--spool", str(spool), "--",
                               "true"], capture_output=True, text=True, timeout=60,
                              env={**env, "RANKSCOPE_STANDIN_NSYS_DIR": str(state)})
        assert proc.returncode == 0, proc.stderr
        assert any(argv[0] == "launch" for argv in standin_nsys.calls(state))  # run, not refused
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o1777 for f in (spool, ranks_dir(spool)))


def test_advanced_nccl_tracing_where_this_nsys_has_it(nsys_env, tmp_path):
    state, env = nsys_env
    standin_nsys.configure(state, nccl_trace=True)
    proc = rankscope("rank", "--spool", str(tmp_path / "s"), "--nccl-trace", "auto", "--",
                     sys.executable, "-c", "pass", env=env)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    calls = standin_nsys.calls(state)
    assert calls[0] == ["launch", "--help"]
    assert [a for a in calls if a[0] == "launch" and a[1] != "--help"][0][2] == "--trace=cuda,nvtx,nccl"


def test_one_shot_profiles_and_exports_into_the_spool(nsys_env, tmp_path):
    state, env = nsys_env
    spool = tmp_path / "spool"
    proc = rankscope("rank", "-v", "--spool", str(spool), "--one-shot", "--duration", "5", "--",
                     sys.executable, "-c", "import sys; sys.exit(4)", env=env)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, err
    base = spool / "reports" / f"rankscope_55_r1_{proc.pid}"
    assert logged_command(err)[1:] == standin_nsys.calls(state)[0]
    assert standin_nsys.calls(state) == [
        ["profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--sample=none", "--cpuctxsw=none",
         f"--output={base}", "--force-overwrite=true", "--duration=5", "--kill=none", sys.executable, "-c",
         "import sys; sys.exit(4)"],
        ["export", "--type=sqlite", f"--output={base}.sqlite", "--force-overwrite=true", "--include-blobs=true",
         f"{base}.nsys-rep"],
    ]
    assert Path(f"{base}.sqlite").stat().st_size > 0


def test_one_shot_keeps_the_programs_exit_code_when_the_export_fails(nsys_env, tmp_path):
    # The export's failure became exit 1: a training run that succeeded looked failed to
    # Slurm or torchrun, and a failure's own code was lost.
    state, env = nsys_env
    standin_nsys.fail(state, "export", "disk full")
    for program_code in (0, 7):
        proc = rankscope("rank", "--spool", str(tmp_path / "spool"), "--one-shot", "--duration", "5", "--",
                         sys.executable, "-c", f"import sys; sys.exit({program_code})", env=env)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == program_code, err
        assert "was not exported" in err and "disk full" in err


def test_one_shot_on_local_rank_0_samples_no_gpu_metrics_where_dcgm_holds_the_counters(nsys_env, tmp_path):
    # No agent pauses DCGM in one-shot mode: sampling beside a profiling DCGM fights it for
    # the counters (dcgm.md §9.5), so rank 0 left them to it and said so.
    state, env = nsys_env
    engine = tmp_path / "engine.json"
    engine.write_text(json.dumps({"up": True, "paused": False, "gpm": False}))
    env = {**env, "LOCAL_RANK": "0", "RANKSCOPE_STANDIN_DCGM_STATE": str(engine)}
    proc = rankscope("rank", "--spool", str(tmp_path / "spool"), "--one-shot", "--duration", "5", "--",
                     sys.executable, "-c", "pass", env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "profiling without GPU metrics" in err
    asked, profile = [argv for argv in standin_nsys.calls(state) if argv[0] == "profile"]
    assert asked == ["profile", "--gpu-metrics-devices=help"]
    assert not any(a.startswith("--gpu-metrics-devices") for a in profile)


def test_one_shot_samples_gpu_metrics_on_one_local_rank_0_of_the_node(nsys_env, tmp_path):
    """Two jobs' local rank 0s on one node, started together: each asked for the node's GPU
    metrics (one sampler per node, nsys-export.md §10); the first to claim the role samples."""
    state, env = nsys_env
    env = {**env, "LOCAL_RANK": "0"}
    spool = tmp_path / "spool"
    procs = [rankscope("rank", "--spool", str(spool), "--one-shot", "--duration", "5", "--",
                       sys.executable, "-c", "import time; time.sleep(4)", env={**env, "SLURM_JOB_ID": job})
             for job in ("55", "56")]
    errors = [proc.communicate(timeout=120)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], errors
    profiles = [argv for argv in standin_nsys.calls(state) if argv[0] == "profile" and "--duration=5" in argv]
    assert len(profiles) == 2 and sum("--gpu-metrics-devices=all" in argv for argv in profiles) == 1
    assert sum("another rank samples this node's GPU metrics" in err for err in errors) == 1


def test_one_shot_needs_a_duration_or_a_capture_range(nsys_env, tmp_path):
    _, env = nsys_env
    proc = rankscope("rank", "--spool", str(tmp_path), "--one-shot", "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--one-shot needs exactly one of" in err


def test_torch_backend_is_handed_to_the_torch_hook(monkeypatch, tmp_path):
    seen = {}

    def fake_run(info, cmd, spool):
        seen.update(info=info, cmd=cmd, spool=spool)
        return 9

    hook = types.SimpleNamespace(run=fake_run)
    monkeypatch.setitem(sys.modules, "rankscope.agent.torch_hook", hook)
    monkeypatch.setattr(agent_package, "torch_hook", hook, raising=False)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    parser = argparse.ArgumentParser()
    rank.register(parser.add_subparsers())
    args = parser.parse_args(["rank", "--backend", "torch", "--spool", str(tmp_path), "--", "python", "t.py"])
    assert args.func(args) == 9
    assert seen["cmd"] == ["python", "t.py"] and seen["spool"] == tmp_path
    assert (seen["info"].rank, seen["info"].world_size, seen["info"].backend) == (2, 4, "torch")


@pytest.mark.parametrize("options, message", [
    (["--duration", "30s"], "--duration is for --one-shot"),
    (["--capture-range", "nvtx", "--nvtx-capture", "step@app"], "--capture-range is for --one-shot"),
    (["--backend", "torch", "--one-shot", "--duration", "5s"], "--one-shot is for --backend nsys"),
    (["--backend", "torch", "--trace", "cuda"], "--trace is for --backend nsys"),
    (["--backend", "torch", "--nccl-trace", "auto"], "--nccl-trace is for --backend nsys"),
])
def test_an_option_the_chosen_mode_would_ignore_is_refused_before_cmd_starts(options, message, tmp_path, capsys):
    from rankscope.cli import main

    # found by review: `rankscope rank --duration 30s -- CMD` ran CMD in an on-demand session,
    # never profiled unless an agent captured, and --backend torch dropped --one-shot unsaid
    marker = tmp_path / "ran"
    assert main(["rank", "--spool", str(tmp_path / "spool"), *options, "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rankscope: error: {message}") and len(err.splitlines()) == 1
    assert not marker.exists()


@pytest.mark.parametrize("options, message", [
    (["--one-shot", "--capture-range", "nvtx", "--nvtx-capture", "@"], "--nvtx-capture '@' is not RANGE or RANGE@DOMAIN"),
    (["--one-shot", "--capture-range", "nvtx", "--nvtx-capture", "step@ "], "--nvtx-capture 'step@ ' is not RANGE"),
    (["--trace", ",,"], "--trace ',,' names no trace kind (default: cuda,nvtx)"),
])
def test_an_nsys_option_with_nothing_in_it_is_refused_before_cmd_starts(options, message, tmp_path, capsys):
    from rankscope.cli import main

    # found by a bad-input campaign: `--trace ,,` went to nsys as --trace=,,,nvtx, and
    # `--nvtx-capture @` profiled a run that never opened its capture (no report, exit 0)
    marker = tmp_path / "ran"
    assert main(["rank", "--spool", str(tmp_path / "spool"), *options, "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rankscope: error: {message}") and len(err.splitlines()) == 1, err
    assert not marker.exists() and not (tmp_path / "spool").exists()


def test_an_nsys_path_with_a_newline_is_shown_quoted_in_its_one_line(tmp_path, capsys):
    from rankscope.cli import main

    # `rank --nsys $'/opt/no\nsuch/nsys'` said "nsys at /opt/no such/nsys does not exist": one
    # line, the newline made a space, naming another path
    missing = tmp_path / "no\nsuch" / "nsys"
    marker = tmp_path / "ran"
    assert main(["rank", "--spool", str(tmp_path / "spool"), "--nsys", str(missing), "--", "touch", str(marker)]) == 1
    assert capsys.readouterr().err == (f"rankscope: error: nsys at '{tmp_path}/no\\nsuch/nsys' does not exist: point "
                                       "RANKSCOPE_NSYS (or --nsys) at Nsight Systems' nsys\n")
    assert not marker.exists()


def test_one_shot_nvtx_capture_range_needs_its_range(nsys_env, tmp_path):
    _, env = nsys_env
    proc = rankscope("rank", "--spool", str(tmp_path), "--one-shot", "--capture-range", "nvtx", "--", "true", env=env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--nvtx-capture" in err


@pytest.mark.parametrize("launcher, shown", [
    (["torchrun", "--nproc-per-node", "8"], "torchrun"),
    (["/opt/venv/bin/torchrun"], "torchrun"),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "8"], "python -m torch.distributed.run"),
])
def test_torch_backend_around_a_launcher_says_where_the_wrapper_goes(tmp_path, launcher, shown):
    """The hook lives in the one process the wrapper runs, not in the ranks a launcher starts."""
    proc = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--backend", "torch", "--spool",
                           str(tmp_path / "spool"), "--", *launcher, "train.py"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"rankscope: error: --backend torch profiles the Python process it runs, and {shown} starts the ranks as its "
        "children: put the wrapper inside the launcher, e.g. `torchrun ... --no-python rankscope rank --backend "
        "torch -- python train.py`"]
    assert not (tmp_path / "spool").exists()  # nothing announced


@pytest.mark.slow
def test_the_wrapper_inside_torchrun_announces_each_rank(tmp_path):
    """What the advice above says to run: torchrun starts `rankscope rank` as each rank."""
    pytest.importorskip("torch")
    script, spool = tmp_path / "train.py", tmp_path / "spool"
    script.write_text("import sys, time\nfrom pathlib import Path\nPath(sys.argv[1]).mkdir(exist_ok=True)\n"
                      "while not Path(sys.argv[2]).exists():\n    time.sleep(0.05)\n")
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "2", "--no-python", sys.executable, "-m",
                             "rankscope", "rank", "--backend", "torch", "--spool", str(spool), "--", sys.executable,
                             str(script), str(tmp_path / "up"), str(tmp_path / "stop")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(local_ranks(spool)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted((r.rank, r.local_rank, r.world_size, r.backend) for r in local_ranks(spool)) == [
            (0, 0, 2, "torch"), (1, 1, 2, "torch")]
    finally:
        (tmp_path / "stop").touch()
        assert proc.wait(timeout=60) == 0


def _can_unshare_pids() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare_pids(), reason="needs `unshare --pid` (Linux, as root)")
def test_ranks_of_containers_with_pids_of_their_own_share_one_spool(tmp_path):
    """Kubernetes pods on one node share the hostPath spool, each in its own PID namespace
    (the DaemonSet has no hostPID): both ranks here are pid 1, which in the agent's
    namespace is some other process. Each must still be announced, and each seen to end."""
    spool = tmp_path / "spool"
    pods = [subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m", "rankscope", "rank", "--backend",
         "torch", "--spool", str(spool), "--", "sleep", "120"],
        env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"}) for r in range(2)]
    try:
        deadline = time.monotonic() + 60
        while len(local_ranks(spool)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        ranks = local_ranks(spool)
        assert sorted((r.rank, r.pid) for r in ranks) == [(0, 1), (1, 1)]
        pods[0].kill()  # the pod goes: --kill-child takes its namespace with it
        pods[0].wait(30)
        deadline = time.monotonic() + 30
        while [r.rank for r in local_ranks(spool)] != [1] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [r.rank for r in local_ranks(spool)] == [1]
    finally:
        for pod in pods:
            pod.kill()
            pod.wait(30)


def test_nsys_around_a_launcher_runs_but_says_one_wrapper_per_rank_is_expected(nsys_env, tmp_path):
    state, env = nsys_env
    proc = subprocess.run([sys.executable, "-m", "rankscope", "rank", "--spool", str(tmp_path / "spool"), "--",
                           "torchrun", "--version"], capture_output=True, text=True, timeout=60, env=env)
    assert "torchrun starts the ranks: they share this one nsys session" in proc.stderr
    assert any(argv[0] == "launch" for argv in standin_nsys.calls(state))  # it ran all the same


def test_announcements_of_another_rankscope_neither_stop_nor_fool_the_agent(tmp_path, caplog):
    """One from a newer wrapper (a field added since) is read without it; one that cannot be
    read is left out with a warning, once, and left in place: the agent must not end on it."""
    from dataclasses import asdict

    from rankscope.agent.spool import RankInfo

    folder = ranks_dir(tmp_path)
    folder.mkdir(parents=True)
    newer = {**asdict(RankInfo(rank=3, local_rank=0, world_size=4, pid=os.getpid(), host="h")), "numa_node": 1}
    (folder / "newer.json").write_text(json.dumps(newer))
    (folder / "torn.json").write_text('{"rank": 1, "local_')
    (folder / "odd.json").write_text(json.dumps({"rank": 2}))  # required fields missing
    for _ in range(2):
        assert [r.rank for r in local_ranks(tmp_path)] == [3]
    warned = [r.getMessage() for r in caplog.records if "unreadable rank announcement" in r.getMessage()]
    assert len(warned) == 2 and {"torn.json", "odd.json"} == {Path(m.split(":")[0]).name for m in warned}
    assert (folder / "torn.json").exists() and (folder / "odd.json").exists()


@pytest.mark.parametrize("duration", ["nan", "inf", "-3", "0", "soon"])
def test_a_one_shot_duration_that_is_not_a_positive_time_is_a_usage_error(duration, capsys):
    from rankscope.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["rank", "--one-shot", "--duration", duration, "--", "true"])
    assert exc.value.code == 2
    assert f"argument --duration: {duration!r} is not a positive duration" in capsys.readouterr().err
