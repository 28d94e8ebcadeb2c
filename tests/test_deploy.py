"""Every rankscope command line in deploy/ parses with today's CLI.

Deployment material drifts silently when a flag is renamed; these tests read the
Slurm scripts, the systemd unit and the Kubernetes manifests and run each
`rankscope ...` invocation through the real argument parser.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from rankscope.cli import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
CODE = [Path(__file__).resolve().parent.parent / d for d in ("core", "agent", "analysis", "coordinator")]


def _substitute(text: str) -> str:
    """Shell and Kubernetes variables become plain words the parser accepts."""
    text = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)
    text = re.sub(r"\$\{[A-Z_]+[^}]*\}|\$[A-Z_]+|\$\([A-Z_]+\)", "x", text)
    return re.sub(r"\$\(date[^)]*\)", "now", text)


def _shell_invocations(path: Path) -> list[list[str]]:
    joined = path.read_text().replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line.startswith("#") or "rankscope " not in line:
            continue
        found += _invocations(shlex.split(_substitute(line)))
    return found


def _invocations(words: list[str]) -> list[list[str]]:
    """The rankscope command line among shell words, also inside a `bash -c '...'` word."""
    start = next((i for i, w in enumerate(words) if w == "rankscope" or w.endswith("/rankscope")), None)
    if start is None:
        inner = next((w for w in words if "rankscope " in w), None)
        return [] if inner is None else _invocations(shlex.split(inner))
    end = next((i for i, w in enumerate(words) if w in {">", "&", "|", "&&"} and i > start), len(words))
    return [words[start + 1 : end]]


def _manifest_invocations(path: Path) -> list[list[str]]:
    found = []
    for doc in yaml.safe_load_all(path.read_text()):
        for container in _containers(doc):
            command, args = container.get("command", []), container.get("args", [])
            if command:
                found += _invocations([_substitute(a) for a in command + args])
            elif container.get("image", "").startswith("rankscope:"):
                found.append([_substitute(a) for a in args])
    return found


def _containers(node: object) -> list[dict]:
    if isinstance(node, dict):
        own = node.get("containers", []) if isinstance(node.get("containers"), list) else []
        return own + [c for v in node.values() for c in _containers(v)]
    if isinstance(node, list):
        return [c for v in node for c in _containers(v)]
    return []


SHELL = sorted([*DEPLOY.glob("slurm/*"), *DEPLOY.glob("systemd/*.service")])
MANIFESTS = sorted(DEPLOY.glob("kubernetes/*.yaml"))


@pytest.mark.parametrize("path", SHELL + MANIFESTS, ids=lambda p: p.name)
def test_each_rankscope_command_line_parses(path: Path) -> None:
    invocations = _manifest_invocations(path) if path.suffix == ".yaml" else _shell_invocations(path)
    assert invocations, f"{path} names no rankscope command"
    parser = build_parser()
    for argv in invocations:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{path.name}: `rankscope {' '.join(argv)}` does not parse")


def test_environment_variables_named_in_deploy_are_read_by_the_code() -> None:
    code = "\n".join(p.read_text() for d in CODE for p in d.rglob("*.py"))
    named = {v for p in DEPLOY.rglob("*") if p.is_file() for v in re.findall(r"RANKSCOPE_[A-Z_]+", p.read_text())}
    unread = {v for v in named if v not in code}
    assert not unread, f"deploy/ sets variables no code reads: {sorted(unread)}"



def test_the_fleet_agents_spool_is_where_ranks_announce_by_default_and_open_to_every_user() -> None:
    """`rankscope rank -- ...` in a job names no spool: the unit's agent must read the default
    one, made before it starts sticky and writable by all (a job's user writes its ranks there)."""
    from rankscope.agent.spool import DEFAULT_SPOOL, ranks_dir

    unit = DEPLOY / "systemd" / "rankscope-agent.service"
    (agent,) = _shell_invocations(unit)
    args = build_parser().parse_args(agent)
    assert args.spool == DEFAULT_SPOOL
    made = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStartPre="))
    words = shlex.split(made.partition("=")[2])
    assert words[:4] == ["/usr/bin/install", "-d", "-m", "1777"]
    assert {str(args.spool), str(ranks_dir(args.spool))} <= set(words[4:])


def test_the_hosts_shared_folders_in_tmp_are_kept_out_of_its_clean_up() -> None:
    """systemd-tmpfiles ages /tmp out (RHEL: after 10 days): a rank announced when its job began would
    vanish from a long job's spool, and the DCGM pause ledger from the host."""
    from rankscope.agent.pause_ledger import DEFAULT_FOLDER
    from rankscope.agent.spool import DEFAULT_SPOOL

    rules = [line.split() for line in (DEPLOY / "systemd" / "rankscope.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert sorted(rules) == sorted([["x", str(DEFAULT_SPOOL)], ["x", str(DEFAULT_FOLDER)]])


def test_the_kubernetes_fleet_talks_mtls() -> None:
    """deployment.md §2: agents reach the coordinator over gRPC with mTLS; so does the sweep."""
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            for container in _containers(doc):
                args = container.get("args", [])
                env = {e["name"] for e in container.get("env", [])}
                if args[:1] == ["coordinator"]:
                    assert {"--tls-cert", "--tls-key", "--tls-client-ca"} <= set(args), path.name
                elif any(a.startswith("--coordinator") for a in args):
                    assert {"RANKSCOPE_TLS_CA", "RANKSCOPE_TLS_CERT", "RANKSCOPE_TLS_KEY"} <= env, path.name


@pytest.mark.parametrize(("exit_code", "prints", "kept"),
                         [(0, True, True), (4, True, True), (5, True, True), (1, False, False), (2, False, False)])
def test_the_health_sweep_job_keeps_a_whole_report_and_fails_only_as_the_capture_does(
        tmp_path: Path, exit_code: int, prints: bool, kept: bool) -> None:
    """The script runs as written, with a stand-in `rankscope` that answers as capture --wait
    does: a report and exit 0, 4 (findings) or 5 (not judged), or nothing and exit 1 (a failed
    sweep) or 2 (refused); the job's log names the report file it keeps."""
    import os
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "rankscope"
    fake.write_text(f"#!/bin/sh\n{'echo {}' if prints else ':'}\nexit {exit_code}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RANKSCOPE_COORDINATOR": "c:1",
           "SLURM_JOB_ID": "4711"}
    done = subprocess.run(["bash", str(DEPLOY / "slurm" / "health-sweep.sbatch")], cwd=tmp_path, env=env,
                          stderr=subprocess.PIPE, text=True)
    assert done.returncode == exit_code
    reports = sorted(p.name for p in tmp_path.glob("health-*"))
    # the job's id in the name: two started in one second keep both
    assert len(reports) == (1 if kept else 0) and all(name.endswith("-4711.json") for name in reports)
    assert done.stderr == "".join(f"report written to {tmp_path / name}\n" for name in reports)


def test_an_agent_the_unit_restarts_does_not_restart_on_a_mistake() -> None:
    # Two agents under one name took it from each other every few seconds, for ever.
    unit = (DEPLOY / "systemd" / "rankscope-agent.service").read_text().splitlines()
    assert "Restart=always" in unit and "RestartPreventExitStatus=2" in unit


def _systemd_seconds(span: str) -> float:
    """A systemd time span ("180", "180s", "3min", "2min 30s") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    return sum(float(number) * units[unit] for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span))


def _unit_stop_timeout_s() -> float:
    lines = (DEPLOY / "systemd" / "rankscope-agent.service").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return _systemd_seconds(settings.get("TimeoutStopSec", "90"))  # systemd's DefaultTimeoutStopSec


def _pod_grace_s() -> float:
    return _pod_spec(DEPLOY / "kubernetes" / "agent-daemonset.yaml").get("terminationGracePeriodSeconds", 30)


def _job_stop_lead_s() -> float:
    """How long before its time limit the job's script is told to stop the agents (--signal)."""
    found = re.search(r"^#SBATCH --signal=B:USR1@(\d+)$", (DEPLOY / "slurm" / "train.sbatch").read_text(), re.M)
    return float(found.group(1)) if found else 0.0  # none: Slurm's KillWait at the limit itself


@pytest.mark.parametrize("grace", [_unit_stop_timeout_s, _pod_grace_s, _job_stop_lead_s],
                         ids=["systemd", "kubernetes", "slurm"])
def test_the_agent_gets_its_worst_stop_before_it_is_killed(grace) -> None:
    """On SIGTERM the agent gives captures CLOSE_WAIT_S to stop their ranks' recording, then
    resumes DCGM: STOP_BUDGET_S at worst. A supervisor that kills it sooner leaves the node's
    DCGM paused until another agent starts there (Kubernetes' default 30 s once did; the 90 s
    that followed counted one resume after CLOSE_WAIT_S, the worst case takes more)."""
    from rankscope.agent.agent import STOP_BUDGET_S

    assert grace() > STOP_BUDGET_S


# srun as srun(1) treats the signals it gets: SIGTERM kills its tasks at once ("forcing job
# termination"); a single SIGINT only prints the step's status, unless --disable-status has it
# forward the SIGINT. The agents' step takes a second to stop; the training runs TRAIN_S.
FAKE_SRUN = """#!{python}
import os, signal, sys, time
def note(line):
    with open(os.environ["SRUN_LOG"], "a") as log:
        log.write(line + "\\n")
if "--overlap" not in sys.argv:
    note("training started")
    time.sleep(float(os.environ["TRAIN_S"]))
    note("training ended")
    sys.exit(int(os.environ["TRAIN_EXIT"]))
def on_signal(signum, frame):
    if signum != signal.SIGINT:
        note("agents killed")
        sys.exit(128 + signum)
    if "--disable-status" not in sys.argv:
        note("srun printed the step's status")
        return
    note("agents got SIGINT")
    time.sleep(1)
    note("agents stopped")
    sys.exit(0)
for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(signum, on_signal)
note("agents started")
time.sleep(60)
"""


@pytest.mark.parametrize(("train_exit", "time_limit_nears"), [(0, False), (3, False), (0, True)],
                         ids=["training-ends", "training-fails", "time-limit-nears"])
def test_the_job_script_lets_its_agents_stop_and_keeps_the_trainings_exit_status(
        tmp_path: Path, train_exit: int, time_limit_nears: bool) -> None:
    """`kill` of the agents' srun made srun SIGKILL them, and under set -e a failed training
    ended the script with the agents still running, left to the job's end (KillWait): either
    way their DCGM resume was cut short. Near the time limit (--signal's USR1) they stop while
    the training goes on."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "srun").chmod(0o755)
    log = tmp_path / "srun.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RANKSCOPE_COORDINATOR": "c:1",
           "SLURM_JOB_ID": "7", "SLURM_NNODES": "1", "SRUN_LOG": str(log),
           "TRAIN_S": "4" if time_limit_nears else "0.5", "TRAIN_EXIT": str(train_exit)}
    job = subprocess.Popen(["bash", str(DEPLOY / "slurm" / "train.sbatch")], cwd=tmp_path, env=env,
                           start_new_session=True)
    try:
        if time_limit_nears:
            while not (log.exists() and {"agents started", "training started"} <= set(log.read_text().splitlines())):
                time.sleep(0.05)
            job.send_signal(signal.SIGUSR1)
        assert job.wait(timeout=30) == train_exit
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever the script left running
            os.killpg(job.pid, signal.SIGKILL)
    lines = log.read_text().splitlines()
    assert "agents killed" not in lines and "agents stopped" in lines, lines
    if time_limit_nears:
        assert lines.index("agents stopped") < lines.index("training ended"), lines


def test_a_health_sweep_job_that_hangs_ends_before_the_next_one_is_due() -> None:
    """The CronJob forbids overlapping Jobs, so one `capture --wait` left waiting on a coordinator
    gone silently would stop every later sweep: its Job needs a deadline, one past what the
    sweep itself may take (window, the coordinator's node timeout, the watch's reconnect)."""
    from rankscope.coordinator.client import RECONNECT_S
    from rankscope.coordinator.config import CoordinatorConfig

    (cron,) = yaml.safe_load_all((DEPLOY / "kubernetes" / "health-sweep-cronjob.yaml").read_text())
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    deadline = cron["spec"]["jobTemplate"]["spec"].get("activeDeadlineSeconds")
    assert deadline is not None, "the sweep's Job has no activeDeadlineSeconds"
    (argv,) = _manifest_invocations(DEPLOY / "kubernetes" / "health-sweep-cronjob.yaml")
    sweep = build_parser().parse_args(argv)
    hours = int(cron["spec"]["schedule"].split()[1].removeprefix("*/"))
    reconnect_s = RECONNECT_S  # how long capture --wait's watch tries an unreachable coordinator again
    assert sweep.duration + CoordinatorConfig().node_timeout_s + reconnect_s < deadline < hours * 3600


def test_the_pytorchjob_example_runs_one_wrapper_per_gpu() -> None:
    """A pod is a node of 8 GPUs: one `python train.py` under one wrapper would be one rank
    where the job has eight; torchrun in the pod starts each rank under its own wrapper.
    The training operator sets MASTER_ADDR, WORLD_SIZE and RANK only in a job with a Master
    replica (kubeflow/training-operator, pytorch/envvar.go): a Worker-only job's torchrun
    got empty flags, and every pod failed."""
    (doc,) = yaml.safe_load_all((DEPLOY / "kubernetes" / "pytorchjob-example.yaml").read_text())
    replicas = doc["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and set(replicas) <= {"Master", "Worker"}
    container, *others = _containers(doc)
    assert all(other == container for other in others)  # every node runs the same
    words = shlex.split(" ".join(container["command"][2:]))
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert container["command"][:2] == ["sh", "-c"] and words[:2] == ["exec", "torchrun"]
    assert f"--nproc-per-node={gpus}" in words
    assert words[words.index("--no-python") + 1 : words.index("--no-python") + 3] == ["rankscope", "rank"]
    assert {"--nnodes=$WORLD_SIZE", "--node-rank=$RANK", "--master-addr=$MASTER_ADDR", "--master-port=$MASTER_PORT"} <= set(words)


ROOT = DEPLOY.parent
DOCKERFILE = DEPLOY / "container" / "Dockerfile"


def _pyproject() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _dockerfile_instructions() -> list[tuple[str, list[str]]]:
    """(INSTRUCTION, words) per instruction, continuation lines joined, comments left out."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [(line.split()[0].upper(), line.split()[1:]) for line in joined.splitlines() if line.strip()]


def _images(node: object) -> list[str]:
    """Every image named in a manifest, init containers' too."""
    if isinstance(node, dict):
        own = [node["image"]] if isinstance(node.get("image"), str) else []
        return own + [i for v in node.values() for i in _images(v)]
    if isinstance(node, list):
        return [i for v in node for i in _images(v)]
    return []


def _pod_spec(path: Path) -> dict:
    """The pod template's spec of a DaemonSet, StatefulSet, CronJob or PyTorchJob."""
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d["kind"] not in ("Service", "PriorityClass")]
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        return spec["jobTemplate"]["spec"]["template"]["spec"]
    if doc["kind"] == "PyTorchJob":
        return spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    return spec["template"]["spec"]


def test_the_manifests_run_the_image_make_image_builds() -> None:
    """One version, pyproject.toml's: `make image` tags the image with it, and every manifest
    that runs rankscope names that tag (and `rankscope --version` says it)."""
    import subprocess

    import rankscope

    version = _pyproject()["project"]["version"]
    assert rankscope.__version__ == version
    built = subprocess.run(["make", "-s", "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    words = shlex.split(built)
    assert words[:2] == ["docker", "build"] and words[words.index("-f") + 1] == str(DOCKERFILE.relative_to(ROOT))
    tag = words[words.index("-t") + 1]
    assert tag == f"rankscope:{version}" and words[-1] == "."  # the repository root is the context
    running = {path.name: {i for d in yaml.safe_load_all(path.read_text()) for i in _images(d) if i.startswith("rankscope")}
               for path in MANIFESTS}
    assert {name for name, images in running.items() if images} == {
        "agent-daemonset.yaml", "coordinator.yaml", "health-sweep-cronjob.yaml"}
    for name, images in running.items():
        assert images <= {tag}, f"{name} runs {sorted(images)}, `make image` builds {tag}"


def test_the_dockerfile_copies_files_that_exist_and_every_package() -> None:
    """A COPY whose source is gone (or kept out of the context by .dockerignore) fails the
    build; a package folder pyproject.toml gained and the image did not copy fails its install."""
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = set()
    for instruction, words in _dockerfile_instructions():
        if instruction not in {"COPY", "ADD"} or any(w.startswith("--from=") for w in words):
            continue
        for source in [w for w in words if not w.startswith("--")][:-1]:
            assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
            assert Path(source).parts[0] not in ignored, f"the Dockerfile copies {source}, which .dockerignore leaves out"
            copied.add(Path(source).parts[0])
    needed = {"pyproject.toml", *_pyproject()["tool"]["setuptools"]["package-dir"].values()}
    assert needed <= copied, f"the Dockerfile does not copy {sorted(needed - copied)}"


def test_the_image_runs_as_a_user_and_only_the_agent_as_root() -> None:
    """The image's user is a numeric uid, not root (Kubernetes' runAsNonRoot can check only a
    number); the coordinator's volume gets its group, so that user can write its state there.
    The agent alone runs as root, for the node's folders it shares with the ranks."""
    (user,) = [words[0] for instruction, words in _dockerfile_instructions() if instruction == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0 and int(gid) != 0
    coordinator = _pod_spec(DEPLOY / "kubernetes" / "coordinator.yaml")["securityContext"]
    assert coordinator["runAsNonRoot"] is True and coordinator["fsGroup"] == int(gid)
    assert _pod_spec(DEPLOY / "kubernetes" / "health-sweep-cronjob.yaml")["securityContext"]["runAsNonRoot"] is True
    assert _pod_spec(DEPLOY / "kubernetes" / "agent-daemonset.yaml")["securityContext"]["runAsUser"] == 0


def _mounts(spec: dict, container: dict) -> dict[str, tuple[str, bool]]:
    """mountPath -> (the node's path, read-only) for a container's hostPath volumes."""
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return {m["mountPath"]: (host[m["name"]], m.get("readOnly", False))
            for m in container["volumeMounts"] if m["name"] in host}


def test_the_agent_and_the_ranks_pods_share_the_spool_its_work_dir_and_nsys() -> None:
    """The agent reads the ranks' announcements in the spool, and the ranks' `nsys launch`
    writes each report where the agent's `nsys start --output` says, in the agent's work dir:
    both must be one node folder at one path in both pods. The agent starts and stops the
    ranks' sessions with the nsys they run under, the node's (read-only), named the same way."""
    from rankscope.agent.commands import config_from_args

    agent_spec = _pod_spec(DEPLOY / "kubernetes" / "agent-daemonset.yaml")
    rank_spec = _pod_spec(DEPLOY / "kubernetes" / "pytorchjob-example.yaml")
    (agent,), (ranks,) = agent_spec["containers"], rank_spec["containers"]
    agent_mounts, rank_mounts = _mounts(agent_spec, agent), _mounts(rank_spec, ranks)
    assert len(agent_mounts) == 2, f"the agent mounts node folders it does not use: {agent_mounts}"

    config = config_from_args(build_parser().parse_args(_substitute(a) for a in agent["args"]))
    rank_words = shlex.split(ranks["command"][2])
    rank_spool = rank_words[rank_words.index("--spool") + 1]
    assert agent_mounts[str(config.spool)] == rank_mounts[rank_spool] == ("/var/lib/rankscope", False)
    assert str(config.spool) == rank_spool and config.work_dir.is_relative_to(config.spool)

    nsys = {c["name"]: next(e["value"] for e in c["env"] if e["name"] == "RANKSCOPE_NSYS") for c in (agent, ranks)}
    assert nsys[agent["name"]] == nsys[ranks["name"]]
    (mount,) = [m for m in agent_mounts if Path(nsys[agent["name"]]).is_relative_to(m)]
    assert agent_mounts[mount] == rank_mounts[mount] and agent_mounts[mount][1], "nsys: the same node install, read-only"


def test_the_kubernetes_agents_spool_is_open_to_every_user() -> None:
    """As the systemd unit's: the kubelet makes the hostPath root's, 0755, where ranks of any
    user must announce themselves; made sticky and writable by all before the agent starts."""
    from rankscope.agent.spool import ranks_dir

    spec = _pod_spec(DEPLOY / "kubernetes" / "agent-daemonset.yaml")
    (agent,) = spec["containers"]
    spool = Path(build_parser().parse_args(_substitute(a) for a in agent["args"]).spool)
    (init,) = spec["initContainers"]
    assert init["command"][:4] == ["install", "-d", "-m", "1777"]
    assert {str(spool), str(ranks_dir(spool))} <= set(init["command"][4:])
    assert _mounts(spec, init) == {str(spool): _mounts(spec, agent)[str(spool)]}



@pytest.mark.parametrize("manifest", ["agent-daemonset.yaml", "health-sweep-cronjob.yaml"])
def test_the_agent_and_the_sweep_outrank_the_training_pods_without_preempting_them(manifest: str) -> None:
    """Killed mid-capture (preempted, or evicted as BestEffort under memory pressure) the agent
    leaves its node's DCGM paused until the lease runs out, and the sweep's Job fails while its
    sweep goes on; placing either must evict no job."""
    docs = [d for p in MANIFESTS for d in yaml.safe_load_all(p.read_text())]
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}
    spec = _pod_spec(DEPLOY / "kubernetes" / manifest)
    priority = classes[spec["priorityClassName"]]
    training = _pod_spec(DEPLOY / "kubernetes" / "pytorchjob-example.yaml")
    assert priority["value"] > classes.get(training.get("priorityClassName"), {}).get("value", 0)
    assert priority["preemptionPolicy"] == "Never" and not priority["globalDefault"]
    (container,) = spec["containers"]
    assert container["resources"]["requests"]["memory"] and "limits" not in container["resources"]


def test_the_coordinator_is_not_besteffort() -> None:
    """It analyses each sweep in its own process (0.5 GB at 512 ranks): as BestEffort it was
    the first pod evicted under memory pressure, mid-analysis."""
    (container,) = _pod_spec(DEPLOY / "kubernetes" / "coordinator.yaml")["containers"]
    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"] and "limits" not in container["resources"]
