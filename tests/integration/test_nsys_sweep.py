"""Whole sweeps with the nsys backend: real coordinator and agents on loopback, each rank a
real `rankscope rank` process under the nsys stand-in, each node with its own stand-in DCGM
host engine (fake bindings on one node, `dcgmi` on the other). Issue 4's "what it must show".

Each simulated node has its own nsys state folder, spool and DCGM engine, as separate
machines would. Every process is killed in teardown.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "standins"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_sweep: the cluster harness
import standin_dcgm  # noqa: E402
import standin_nsys  # noqa: E402
from test_sweep import START_S, Cluster, states, wait_for  # noqa: E402

from rankscope.agent.spool import local_ranks  # noqa: E402
from rankscope.analysis import simulate  # noqa: E402
from rankscope.coordinator.config import CoordinatorConfig  # noqa: E402
from rankscope.proto.v1 import rankscope_pb2 as pb  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

GPUS = 2
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class NsysCluster(Cluster):
    """Nodes whose ranks run under `rankscope rank` with the nsys stand-in."""

    def __init__(self, tmp_path: Path, nodes: int) -> None:
        super().__init__(tmp_path)
        spec = simulate.JobSpec(nodes=nodes, gpus_per_node=GPUS, tp=2, steps=4, job_id="j4", seed=11)
        self.spec = simulate.write_truth(spec, tmp_path / "truth.json")
        self.world = nodes * GPUS
        self.agent_args: dict[str, list[str]] = {}
        self.hosts: dict[str, str] = {}  # an agent's host, where it is not its own

    def host(self, name: str) -> str:
        return self.hosts.get(name, name)

    def nsys_state(self, name: str) -> Path:
        return self.tmp / f"nsys-{name}"

    def spool(self, name: str) -> Path:
        return self.tmp / f"spool-{name}"

    def engine(self, name: str) -> Path:
        return self.tmp / f"dcgm-{self.host(name)}.json"

    def ledger(self, name: str) -> Path:
        """The DCGM pause ledger of the agent's host: one per host, as one DCGM engine."""
        return self.tmp / f"ledger-{self.host(name)}"

    def node_env(self, name: str) -> dict[str, str]:
        env = standin_nsys.env(self.nsys_state(name), self.spec, base=self.env)
        return {**env, "RANKSCOPE_STANDIN_DCGM_STATE": str(self.engine(name))}

    def node(self, name: str, index: int, *, dcgm: str = "bindings", agent_env: dict[str, str] | None = None,
             host: str | None = None, **engine: object) -> None:
        """The node's DCGM engine (``host``'s, when the agent shares that host), its ranks under
        `rankscope rank`, then its agent."""
        if host is None:
            standin_dcgm.configure(self.engine(name), **engine)
        else:
            self.hosts[name] = host
        for local in range(GPUS):
            rank = index * GPUS + local
            env = {**self.node_env(name), "RANK": str(rank), "LOCAL_RANK": str(local),
                   "WORLD_SIZE": str(self.world), "SLURM_JOB_ID": "4"}
            self.spawn(f"{name}-rank{rank}", "rank", "--spool", str(self.spool(name)), "--", *SLEEPER, env=env)
        def announced() -> bool:
            for local in range(GPUS):
                self._check_alive(f"{name}-rank{index * GPUS + local}")
            return len(local_ranks(self.spool(name))) == GPUS

        wait_for(f"{name}'s ranks to announce", announced, START_S)
        dcgm_args = {"bindings": ["--dcgm", "bindings", "--dcgm-bindings", str(standin_dcgm.BINDINGS)],
                     "dcgmi": ["--dcgm", "dcgmi"], "none": ["--dcgm", "none"]}[dcgm]
        self.agent_args[name] = [
            "agent", "--coordinator", f"127.0.0.1:{self.port}", "--name", name, "--backend", "nsys",
            "--spool", str(self.spool(name)), "--work-dir", str(self.work_dir(name)), "--max-backoff", "1",
            "--dcgm-state", str(self.ledger(name)), *dcgm_args]
        self.start_agent(name, agent_env)

    def start_agent(self, name: str, agent_env: dict[str, str] | None = None) -> None:
        self.spawn(name, *self.agent_args[name], env={**self.node_env(name), **(agent_env or {})})

    def capture(self, nodes: list[str], *, duration_s: float, timeout_s: float = 120) -> str:
        return self.start_sweep(nodes, duration_s=duration_s, timeout_s=timeout_s, backend="nsys")

    def paused(self, name: str) -> bool:
        return standin_dcgm.read(self.engine(name))["paused"]

    def dcgm_calls(self, name: str) -> list[dict]:
        return [c for c in standin_dcgm.calls(self.engine(name)) if c["code"] == 0]

    def nsys_calls(self, name: str, command: str | None = None) -> list[dict]:
        log = self.nsys_state(name) / "calls.jsonl"
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        return [c for c in calls if command is None or c["argv"][0] == command]

    def report_json(self, sweep_id: str) -> dict:
        return json.loads(self.sweeps.GetReport(pb.GetReportRequest(sweep_id=sweep_id), timeout=10).report_json)


@pytest.fixture()
def make_cluster(tmp_path: Path):
    made = []

    def make(nodes: int) -> NsysCluster:
        made.append(NsysCluster(tmp_path, nodes))
        return made[-1]

    yield make
    for c in made:
        c.close()


def capture_folder(cluster: NsysCluster, name: str, sweep_id: str) -> Path:
    return cluster.work_dir(name) / "captures" / sweep_id


def test_a_sweep_over_two_nsys_agents(make_cluster) -> None:
    cluster = make_cluster(2)
    cluster.coordinator()
    cluster.node("n0", 0, dcgm="bindings")
    cluster.node("n1", 1, dcgm="dcgmi")
    sweep_id = cluster.capture(["n0", "n1"], duration_s=0.5)
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep), [n.reason for n in sweep.nodes])
    assert sorted(r.rank for r in cluster.report(sweep_id).ranks) == [0, 1, 2, 3]
    report = cluster.report_json(sweep_id)
    for index, name in enumerate(["n0", "n1"]):
        ranks = local_ranks(cluster.spool(name))
        assert [r.rank for r in ranks] == [index * GPUS, index * GPUS + 1]
        folder = capture_folder(cluster, name, sweep_id)
        base = [f"{folder}/reports/{sweep_id}_{r.host}_rank{r.rank}_{r.pid}" for r in ranks]
        # Each rank's session: launched by its wrapper, started and stopped by it as the agent asks,
        # then exported by the agent.
        launches = [standin_nsys.launched(c["argv"]) for c in cluster.nsys_calls(name, "launch")]
        assert sorted(head for head, _, _ in launches) == sorted(
            ["launch", f"--session-new={r.session}", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "--wait=primary"] for r in ranks)
        assert all(app == SLEEPER for _, _, app in launches)
        window_calls = [c for c in cluster.nsys_calls(name) if c["argv"][0] in ("start", "stop", "export")]
        # the ranks' starts, then their stops, each all at once (in any order)
        assert sorted(c["argv"] for c in window_calls[:2]) == sorted([
            ["start", f"--session={ranks[0].session}", f"--output={base[0]}", "--force-overwrite=true",
             "--sample=none", "--cpuctxsw=none", "--gpu-metrics-devices=all"],
            ["start", f"--session={ranks[1].session}", f"--output={base[1]}", "--force-overwrite=true",
             "--sample=none", "--cpuctxsw=none"]])
        assert sorted(c["argv"] for c in window_calls[2:4]) == sorted(
            ["stop", f"--session={r.session}"] for r in ranks)
        assert sorted(c["argv"] for c in window_calls[4:]) == [  # exported at once, in any order
            ["export", "--type=sqlite", f"--output={b}.sqlite", "--force-overwrite=true", "--include-blobs=true",
             f"{b}.nsys-rep"] for b in sorted(base)]
        # DCGM paused before the counters are checked and the first start, resumed after the
        # last stop and before the first export, exactly once each.
        (check,) = cluster.nsys_calls(name, "profile")
        (sampler,) = [c for c in window_calls if "--gpu-metrics-devices=all" in c["argv"]]
        assert check["argv"] == ["profile", "--gpu-metrics-devices=help"] and check["t"] < sampler["t"]
        dcgm_calls = cluster.dcgm_calls(name)
        assert [c["op"] for c in dcgm_calls] == ["pause", "resume"]
        assert dcgm_calls[0]["t"] < check["t"]
        assert dcgm_calls[0]["via"] == ("bindings" if name == "n0" else "dcgmi")
        assert dcgm_calls[0]["t"] < window_calls[0]["t"]
        assert window_calls[3]["t"] < dcgm_calls[1]["t"] < window_calls[4]["t"]  # resumed before exporting
        assert not cluster.paused(name)
        assert report["sweep"]["nodes"][name]["dcgm"] == "resumed"
        # The node keeps nothing it uploaded.
        assert not list(folder.rglob("*.sqlite")) and not list(folder.rglob("*.nsys-rep"))
    assert {n.dcgm for n in sweep.nodes} == {pb.DCGM_OUTCOME_RESUMED}
    # Both nodes' windows begin at the sweep's start (its creation + window_lead_s), not each
    # node's as soon as it is ready, and end together a duration later.
    begin = sweep.created_ns / 1e9 + CoordinatorConfig().window_lead_s
    starts = [c["t"] for name in ("n0", "n1") for c in cluster.nsys_calls(name, "start")]
    stops = [c["t"] for name in ("n0", "n1") for c in cluster.nsys_calls(name, "stop")]
    assert begin <= min(starts) and max(starts) < begin + 1.0, (begin, starts)
    assert begin + 0.5 <= min(stops) and max(stops) < begin + 1.5, (begin, stops)


def test_upload_raw_sends_each_ranks_report_beside_its_export(make_cluster, tmp_path: Path) -> None:
    # The .nsys-rep is what the Nsight Systems GUI opens: the SQLite export alone was sent.
    from rankscope.cli import main

    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0, dcgm="none")
    sweep_id = cluster.start_sweep(["n0"], duration_s=0.5, timeout_s=120, upload_raw=True, backend="nsys")
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep), [n.reason for n in sweep.nodes])
    assert main(["fetch", "--coordinator", f"127.0.0.1:{cluster.port}", "--kind", "raw", "-o", str(tmp_path / "got"),
                 sweep_id]) == 0
    bases = [f"{sweep_id}_{r.host}_rank{r.rank}_{r.pid}" for r in local_ranks(cluster.spool("n0"))]
    assert sorted(p.name for p in (tmp_path / "got" / "n0").iterdir()) == sorted(
        f"{b}{suffix}" for b in bases for suffix in (".nsys-rep", ".sqlite"))
    folder = capture_folder(cluster, "n0", sweep_id)  # uploaded, so not kept on the node
    assert not list(folder.rglob("*.sqlite")) and not list(folder.rglob("*.nsys-rep"))


def test_not_supported_and_no_dcgm_let_the_capture_proceed_and_the_report_says_which(make_cluster) -> None:
    cluster = make_cluster(2)
    cluster.coordinator()
    cluster.node("n0", 0, dcgm="bindings", gpm=True)  # Hopper: DCGM_ST_NOT_SUPPORTED
    cluster.node("n1", 1, dcgm="none")
    sweep_id = cluster.capture(["n0", "n1"], duration_s=0.3)
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep), [n.reason for n in sweep.nodes])
    assert {n.node: n.dcgm for n in sweep.nodes} == {"n0": pb.DCGM_OUTCOME_NOT_SUPPORTED,
                                                     "n1": pb.DCGM_OUTCOME_NOT_PRESENT}
    nodes = cluster.report_json(sweep_id)["sweep"]["nodes"]
    assert (nodes["n0"]["dcgm"], nodes["n1"]["dcgm"]) == ("not_supported", "not_present")
    assert sorted(r.rank for r in cluster.report(sweep_id).ranks) == [0, 1, 2, 3]
    assert standin_dcgm.calls(cluster.engine("n0"))[0]["code"] == -6 and not cluster.paused("n0")


def test_a_capture_that_samples_no_gpu_metrics_leaves_dcgm_alone(make_cluster) -> None:
    # `--option gpu_metrics=false` paused DCGM all the same: its DCGM_FI_PROF_* series went
    # dark, and alerting on them fired, for a capture that read no counters (dcgm.md §9.2).
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    sweep_id = cluster.start_sweep(["n0"], duration_s=0.3, timeout_s=120, backend="nsys",
                                   options={"gpu_metrics": "false"})
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep), [n.reason for n in sweep.nodes])
    assert cluster.dcgm_calls("n0") == [] and sweep.nodes[0].dcgm == pb.DCGM_OUTCOME_NOT_NEEDED
    assert not any("--gpu-metrics-devices" in " ".join(argv) for argv in standin_nsys.calls(cluster.nsys_state("n0")))


def test_dcgm_comes_back_as_the_window_begins_where_the_sampler_cannot_collect_gpu_metrics(make_cluster) -> None:
    """The sampler's `nsys start` refused its GPU metrics (ERR_NVGPUCTRPERM): it traced on
    without them, reading no counters, while DCGM stayed paused through the window, its
    DCGM_FI_PROF_* series dark for nothing (dcgm.md §9.2)."""
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    standin_nsys.fail(cluster.nsys_state("n0"), "start --gpu-metrics-devices", "ERR_NVGPUCTRPERM")
    sweep_id = cluster.capture(["n0"], duration_s=4)
    wait_for("both ranks' windows to open",
             lambda: [s["state"] for s in standin_nsys.sessions(cluster.nsys_state("n0")).values()] == ["collecting"] * 2,
             START_S, 0.05)
    wait_for("DCGM to resume while the ranks record", lambda: not cluster.paused("n0"), 2, 0.05)
    assert {s["state"] for s in standin_nsys.sessions(cluster.nsys_state("n0")).values()} == {"collecting"}
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep), [n.reason for n in sweep.nodes])
    (node,) = sweep.nodes
    assert node.dcgm == pb.DCGM_OUTCOME_RESUMED
    assert node.dcgm_detail == "resumed as the window began: no rank reads the GPU counters"
    assert [c["op"] for c in cluster.dcgm_calls("n0")].count("resume") == 1
    notes = cluster.report_json(sweep_id)["sweep"]["nodes"]["n0"]["notes"]
    assert any("captured without GPU metrics, which nsys could not collect" in note for note in notes), notes


def test_a_failed_pause_traces_on_without_gpu_metrics_and_says_why(make_cluster) -> None:
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0, up=False)  # the host engine does not answer: DCGM_ST_CONNECTION_NOT_VALID
    sweep_id = cluster.capture(["n0"], duration_s=0.3)
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep), [n.reason for n in sweep.nodes])
    (node,) = sweep.nodes
    assert node.dcgm == pb.DCGM_OUTCOME_PAUSE_FAILED
    assert "capturing without GPU metrics" in node.dcgm_detail
    assert sorted(r.rank for r in cluster.report(sweep_id).ranks) == [0, 1]
    starts = [c["argv"] for c in cluster.nsys_calls("n0", "start")]
    assert len(starts) == GPUS and not any(a.startswith("--gpu-metrics-devices") for argv in starts for a in argv)
    assert not [c for c in standin_dcgm.calls(cluster.engine("n0")) if c["op"] == "resume"]  # nothing was paused
    reported = cluster.report_json(sweep_id)["sweep"]["nodes"]["n0"]
    assert reported["dcgm"] == "pause_failed" and reported["dcgm_detail"] == node.dcgm_detail


def test_nsys_missing_or_an_export_failing_fails_that_node_with_the_reason(make_cluster) -> None:
    cluster = make_cluster(3)
    cluster.coordinator()
    cluster.node("n0", 0)
    standin_nsys.fail(cluster.nsys_state("n0"), "export", "No space left on device")
    cluster.node("n1", 1, agent_env={"RANKSCOPE_NSYS": str(cluster.tmp / "no" / "nsys")})
    cluster.node("n2", 2)
    sweep_id = cluster.capture(["n0", "n1", "n2"], duration_s=0.3)
    sweep = cluster.wait_final(sweep_id, 150)
    assert sweep.state == pb.SWEEP_STATE_PARTIAL, (sweep.error, states(sweep))
    nodes = {n.node: n for n in sweep.nodes}
    assert nodes["n0"].state == pb.NODE_STATE_FAILED and "No space left on device" in nodes["n0"].reason
    assert "nsys export" in nodes["n0"].reason
    assert nodes["n1"].state == pb.NODE_STATE_FAILED
    assert nodes["n1"].reason.startswith(f"nsys at {cluster.tmp / 'no' / 'nsys'} does not exist: point RANKSCOPE_NSYS")
    assert nodes["n2"].state == pb.NODE_STATE_ANALYSED
    assert sorted(sweep.missing) == ["n0", "n1"]
    assert sorted(r.rank for r in cluster.report(sweep_id).ranks) == [4, 5]
    for name in ("n0", "n1", "n2"):  # every node's DCGM is back, failed or not
        wait_for(f"{name}'s DCGM to resume", lambda: not cluster.paused(name), 30)


def test_two_agents_of_one_host_keep_dcgm_paused_until_both_captures_end(make_cluster) -> None:
    """A fleet agent and a Slurm job's agent on one host: the job's short capture ending must
    not hand the counters back to DCGM under the fleet's longer one."""
    cluster = make_cluster(2)
    cluster.coordinator()
    cluster.node("n0", 0, dcgm="bindings")
    cluster.node("n0-job", 1, dcgm="dcgmi", host="n0")
    fleet = cluster.capture(["n0"], duration_s=6)
    wait_for("n0 to capture", lambda: cluster.node_state(fleet, "n0") == pb.NODE_STATE_CAPTURING, START_S, 0.05)
    job = cluster.wait_final(cluster.capture(["n0-job"], duration_s=0.3), 60)
    assert job.state == pb.SWEEP_STATE_ANALYSED, (job.error, states(job), [n.reason for n in job.nodes])
    assert cluster.node_state(fleet, "n0") == pb.NODE_STATE_CAPTURING
    assert cluster.paused("n0"), "the job agent's resume took the counters from the fleet agent's capture"
    assert job.nodes[0].dcgm == pb.DCGM_OUTCOME_RESUMED
    assert "another capture on this host" in job.nodes[0].dcgm_detail
    assert cluster.wait_final(fleet, 120).state == pb.SWEEP_STATE_ANALYSED
    assert not cluster.paused("n0")
    assert [(c["op"], c["via"]) for c in cluster.dcgm_calls("n0")] == [
        ("pause", "bindings"), ("pause", "dcgmi"), ("resume", "bindings")]


def _sessions(cluster, node: str) -> list[dict]:
    return list(standin_nsys.sessions(cluster.nsys_state(node)).values())


def _windows_open(cluster, node: str) -> None:
    wait_for("both ranks' windows to open",
             lambda: [s["state"] for s in _sessions(cluster, node)] == ["collecting"] * 2, START_S, 0.05)


def _stopped_by_sigterm(cluster, node: str) -> bool:
    """SIGTERM to the node's agent, watched until it exits (0): whether DCGM was resumed
    meanwhile while a rank still recorded."""
    agent = cluster.procs[node]
    agent.send_signal(signal.SIGTERM)
    overlap = False
    while agent.poll() is None:
        overlap |= not cluster.paused(node) and any(s["state"] == "collecting" for s in _sessions(cluster, node))
        time.sleep(0.05)
    assert agent.returncode == 0
    return overlap


def test_an_agent_stopped_mid_capture_resumes_dcgm_only_after_the_ranks_stop_recording(make_cluster) -> None:
    """SIGTERM in the window, with `nsys stop` taking seconds (it writes the report): the agent
    resumed DCGM after 5 s while a session still sampled GPU metrics, and exited with the
    other rank's session never stopped. Then it told the coordinator nothing: the sweep waited
    out its timeout."""
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    standin_nsys.configure(cluster.nsys_state("n0"), stop_s=4)
    sweep_id = cluster.capture(["n0"], duration_s=60, timeout_s=600)

    _windows_open(cluster, "n0")
    overlap = _stopped_by_sigterm(cluster, "n0")
    assert not overlap, "DCGM resumed while a rank still recorded"
    assert not cluster.paused("n0") and {s["state"] for s in _sessions(cluster, "n0")} == {"launched"}
    (node,) = cluster.wait_final(sweep_id, 30).nodes
    assert node.state == pb.NODE_STATE_FAILED and node.reason == "agent stopped by SIGTERM while capturing"
    assert node.dcgm == pb.DCGM_OUTCOME_RESUMED


def test_an_agent_killed_mid_capture_resumes_dcgm_when_restarted(make_cluster) -> None:
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    sweep_id = cluster.capture(["n0"], duration_s=60, timeout_s=90)
    wait_for("n0 to capture", lambda: cluster.node_state(sweep_id, "n0") == pb.NODE_STATE_CAPTURING, START_S, 0.05)

    def session_states() -> list[str]:
        return [s["state"] for s in standin_nsys.sessions(cluster.nsys_state("n0")).values()]

    wait_for("both ranks' windows to open", lambda: session_states() == ["collecting"] * 2, START_S, 0.05)
    assert cluster.paused("n0")
    cluster.kill("n0")
    time.sleep(1.0)
    assert cluster.paused("n0")  # DCGM never resumes by itself
    restarted = time.time()
    cluster.start_agent("n0")
    wait_for("the restarted agent to resume DCGM", lambda: not cluster.paused("n0"), START_S, 0.05)
    resumed = [c for c in cluster.dcgm_calls("n0") if c["op"] == "resume"]
    assert len(resumed) == 1
    assert resumed[0]["t"] - restarted < 5, "DCGM resumed more than 5 s after the agent restarted"
    # It stops the collection the dead agent left open too: not left to run until the rank ends.
    wait_for("the restarted agent to stop the windows left open", lambda: set(session_states()) == {"launched"}, START_S, 0.05)
    # The collection the dead agent left open does not block the next capture.
    first = cluster.wait_final(sweep_id, 60)
    assert first.state in (pb.SWEEP_STATE_FAILED, pb.SWEEP_STATE_PARTIAL), states(first)
    again = cluster.wait_final(cluster.capture(["n0"], duration_s=0.3), 120)
    assert again.state == pb.SWEEP_STATE_ANALYSED, (again.error, states(again), [n.reason for n in again.nodes])
    assert [c["op"] for c in cluster.dcgm_calls("n0")] == ["pause", "resume", "pause", "resume"]


def test_dcgm_is_resumed_with_the_coordinator_unreachable(make_cluster) -> None:
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    sweep_id = cluster.capture(["n0"], duration_s=3)
    wait_for("n0 to capture", lambda: cluster.node_state(sweep_id, "n0") == pb.NODE_STATE_CAPTURING, START_S, 0.05)
    assert cluster.paused("n0")
    cluster.kill("coordinator")
    wait_for("n0 to resume DCGM on its own", lambda: not cluster.paused("n0"), 60)
    assert [c["op"] for c in cluster.dcgm_calls("n0")] == ["pause", "resume"]
    # The ledger is written just after the engine resumes: give it that moment.
    [record] = cluster.ledger("n0").glob("holder-*.json")
    wait_for("the DCGM ledger to drop the lease", lambda: json.loads(record.read_text())["leases"] == {}, 10)


def test_an_agent_killed_mid_capture_resumes_dcgm_on_restart_only_after_the_windows_it_left_stop(make_cluster) -> None:
    """kill -9 in the window, `nsys stop` taking seconds: the restarted agent resumed DCGM at
    once, then stopped the windows the dead one left recording, the two holding the counters
    together meanwhile (DCGM may read 0 until restarted after that, dcgm.md §7)."""
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    cluster.capture(["n0"], duration_s=60, timeout_s=90)

    _windows_open(cluster, "n0")
    cluster.kill("n0")
    standin_nsys.configure(cluster.nsys_state("n0"), stop_s=2)
    cluster.start_agent("n0")
    overlap = False

    def settled() -> bool:
        nonlocal overlap
        states = {s["state"] for s in _sessions(cluster, "n0")}
        overlap |= not cluster.paused("n0") and "collecting" in states
        return not cluster.paused("n0") and states == {"launched"}

    wait_for("the restarted agent to stop the windows and resume DCGM", settled, START_S, 0.05)
    assert not overlap, "DCGM resumed while a window the dead agent left still recorded"
    assert [c["op"] for c in cluster.dcgm_calls("n0")] == ["pause", "resume"]


def test_an_agent_stopped_while_it_stops_the_windows_a_killed_one_left_resumes_dcgm_only_after_they_stop(
        make_cluster) -> None:
    """kill -9 in the window, then SIGTERM to the restarted agent while it waits for the
    windows the dead one left recording (`nsys stop` taking seconds): the signal ended that wait
    and the startup recovery resumed DCGM at once, while the ranks still sampled the counters."""
    cluster = make_cluster(1)
    cluster.coordinator()
    cluster.node("n0", 0)
    sweep_id = cluster.capture(["n0"], duration_s=60, timeout_s=600)

    _windows_open(cluster, "n0")
    cluster.kill("n0")
    standin_nsys.configure(cluster.nsys_state("n0"), stop_s=5)
    cluster.start_agent("n0")
    wait_for("the restarted agent to stop the windows left open", lambda: cluster.nsys_calls("n0", "stop"),
             START_S, 0.02)
    overlap = _stopped_by_sigterm(cluster, "n0")
    assert not overlap, "DCGM resumed while a window the dead agent left still recorded"
    assert not cluster.paused("n0") and {s["state"] for s in _sessions(cluster, "n0")} == {"launched"}
    assert [c["op"] for c in cluster.dcgm_calls("n0")] == ["pause", "resume"]
    (node,) = cluster.wait_final(sweep_id, 30).nodes
    assert node.state == pb.NODE_STATE_FAILED and node.reason == "agent restarted while capturing"
    # Said once the window stopped and DCGM came back: the coordinator keeps a node's first FAILED.
    assert node.dcgm == pb.DCGM_OUTCOME_RESUMED, pb.DcgmOutcome.Name(node.dcgm)
