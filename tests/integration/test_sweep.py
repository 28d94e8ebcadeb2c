"""Whole sweeps with real processes on loopback: one coordinator, several agents (sim backend).

Every process is `python -m rankscope ...`, started and killed here (SIGKILL, as a crash
would). Waits are bounded; every process is killed in teardown. What each test shows is
issue 3's "what it must show" 1-4.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from rankscope.analysis.report import Report
from rankscope.coordinator.store import Store
from rankscope.proto.v1 import rankscope_pb2 as pb
from rankscope.proto.v1 import rankscope_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

START_S = 60.0  # a cold `python -m rankscope` imports pyarrow, pandas and grpc: slow on a busy CI box
FINAL = {pb.SWEEP_STATE_ANALYSED, pb.SWEEP_STATE_PARTIAL, pb.SWEEP_STATE_FAILED}
LISTENING = re.compile(r"listening on \S*:(\d+)", re.IGNORECASE)


def sim_options(nodes: int, **extra: str) -> dict[str, str]:
    return {"sim.nodes": str(nodes), "sim.gpus_per_node": "2", "sim.tp": "2", "sim.steps": "8", "sim.seed": "5",
            **extra}


def wait_for(what: str, predicate: Callable[[], object], timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


class Cluster:
    """Processes of one test; each writes its output to a log file under tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}  # the latest process of each name
        self.starts: dict[str, int] = {}
        self.data_dir = tmp_path / "coordinator"
        self.port = 0
        self.channel: grpc.Channel | None = None
        self.tokens: dict[str, str] = {}  # node -> its agent's session token (kept across its restarts)
        # A killed agent restarted here is back within START_S, however busy the box: not judged lost.
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "RANKSCOPE_RESTART_GRACE_S": "20",
                    "RANKSCOPE_PING_INTERVAL_S": "1", "RANKSCOPE_HEARTBEAT_INTERVAL_S": "1",
                    "RANKSCOPE_AGENT_LOST_S": str(START_S)}

    # processes ----------------------------------------------------------------------

    def spawn(self, name: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        self.starts[name] = self.starts.get(name, -1) + 1
        log = self.tmp / f"{name}.{self.starts[name]}.log"
        self.logs[name] = log
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "rankscope", *argv], stdout=out, stderr=subprocess.STDOUT,
                                    env={**self.env, **(env or {})}, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")

    def coordinator(self, **env: str) -> str:
        """Start (or restart, on the same port) the coordinator; returns HOST:PORT once it serves."""
        listen = f"127.0.0.1:{self.port}"
        self.spawn("coordinator", "coordinator", "--listen", listen, "--data-dir", str(self.data_dir), env=env)

        def bound() -> int:
            self._check_alive("coordinator")
            match = LISTENING.search(self.log("coordinator"))
            return int(match.group(1)) if match else 0

        self.port = wait_for("the coordinator to listen", bound, START_S)
        if self.channel is None:
            self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        return f"127.0.0.1:{self.port}"

    def agent(self, name: str, index: int, *extra: str) -> subprocess.Popen:
        return self.spawn(
            name, "agent", "--coordinator", f"127.0.0.1:{self.port}", "--name", name, "--backend", "sim",
            "--labels", f"sim.node_index={index},test=sweep", "--spool", str(self.tmp / "spool"),
            "--work-dir", str(self.work_dir(name)), "--dcgm", "none", "--max-backoff", "1", *extra,
        )

    def work_dir(self, name: str) -> Path:
        return self.tmp / f"work-{name}"

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def _check_alive(self, name: str) -> None:
        if self.procs[name].poll() is not None:
            raise AssertionError(f"{name} exited with {self.procs[name].returncode}:\n{self.log(name)[-3000:]}")

    # the user's side of the wire ----------------------------------------------------------

    @property
    def sweeps(self) -> pb_grpc.SweepServiceStub:
        return pb_grpc.SweepServiceStub(self.channel)

    @property
    def agents(self) -> pb_grpc.AgentServiceStub:
        return pb_grpc.AgentServiceStub(self.channel)

    def query(self, name: str, uid: str) -> pb.UploadStatus:
        """QueryUpload as the agent of node ``name`` (registered), with its session token."""
        if name not in self.tokens:
            store = Store(self.data_dir / "state.sqlite")
            try:
                self.tokens[name] = store.agent_by_node(name).token
            finally:
                store.close()
        return self.agents.QueryUpload(pb.UploadQuery(upload_id=uid, session_token=self.tokens[name]), timeout=5)

    def start_sweep(self, nodes: list[str], *, duration_s: float, timeout_s: float, upload_raw: bool = False,
                    options: dict[str, str] | None = None, backend: str = "sim") -> str:
        request = pb.StartSweepRequest(targets=pb.Targets(nodes=nodes), duration_s=duration_s, backend=backend,
                                       timeout_s=timeout_s, options=options or {}, upload_raw=upload_raw)

        def started() -> str:
            for name in nodes:
                self._check_alive(name)
            try:
                return self.sweeps.StartSweep(request, timeout=10).sweep_id
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:  # not every agent has registered yet
                    return ""
                raise

        return wait_for(f"{nodes} to register", started, START_S, every=0.3)

    def sweep(self, sweep_id: str) -> pb.Sweep | None:
        try:
            reply = self.sweeps.ListSweeps(pb.ListSweepsRequest(), timeout=5)
        except grpc.RpcError:
            return None  # the coordinator is restarting
        return next((s for s in reply.sweeps if s.sweep_id == sweep_id), None)

    def node_state(self, sweep_id: str, node: str) -> int:
        sweep = self.sweep(sweep_id)
        return next((n.state for n in sweep.nodes if n.node == node), 0) if sweep else 0

    def wait_final(self, sweep_id: str, timeout: float) -> pb.Sweep:
        def final() -> pb.Sweep | None:
            sweep = self.sweep(sweep_id)
            return sweep if sweep is not None and sweep.state in FINAL else None

        return wait_for(f"sweep {sweep_id} to end", final, timeout, every=0.3)

    def report(self, sweep_id: str) -> Report:
        reply = self.sweeps.GetReport(pb.GetReportRequest(sweep_id=sweep_id), timeout=10)
        return Report.from_dict(json.loads(reply.report_json))

    def stored_objects(self) -> list[Path]:
        return sorted(p for p in (self.data_dir / "artifacts" / "objects").rglob("*") if p.is_file())

    def partials(self) -> list[Path]:
        folder = self.data_dir / "artifacts" / "partial"
        return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


@pytest.fixture()
def cluster(tmp_path: Path):
    c = Cluster(tmp_path)
    yield c
    c.close()


def states(sweep: pb.Sweep) -> dict[str, str]:
    return {n.node: pb.NodeState.Name(n.state) for n in sweep.nodes}


def assert_stored_once_and_verified(cluster: Cluster, sweep: pb.Sweep, per_node: int) -> None:
    """Every node's artifacts arrived exactly once, addressed by a sha256 that matches the bytes."""
    objects = cluster.stored_objects()
    for path in objects:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    assert len(objects) == per_node * len(sweep.nodes)
    assert all(n.artifacts == per_node for n in sweep.nodes), states(sweep)
    assert cluster.partials() == []


def test_a_sweep_over_four_agents_names_the_straggler(cluster: Cluster) -> None:
    cluster.coordinator()
    names = [f"n{i}" for i in range(4)]
    for i, name in enumerate(names):
        cluster.agent(name, i)
    sweep_id = cluster.start_sweep(names, duration_s=0.5, timeout_s=90,
                                   options=sim_options(4, **{"sim.stragglers": "5:compute:3000"}))
    sweep = cluster.wait_final(sweep_id, 100)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep))
    assert set(states(sweep).values()) == {"NODE_STATE_ANALYSED"} and list(sweep.missing) == []
    assert all(n.dcgm == pb.DCGM_OUTCOME_NOT_NEEDED for n in sweep.nodes)
    assert_stored_once_and_verified(cluster, sweep, per_node=1)
    report = cluster.report(sweep_id)
    assert report.stragglers == [5]
    assert sorted(r.rank for r in report.ranks) == list(range(8))
    host = next(r.host for r in report.ranks if r.rank == 5)
    # The sweep itself says who, by the name of the agent that uploaded it (node index 2):
    # the name a scheduled sweep can target again, where the trace's host may be a pod's.
    assert host != "n2" and [(s.rank, s.node) for s in sweep.stragglers] == [(5, "n2")]


def _upload_ids(cluster: Cluster, name: str, sweep_id: str) -> list[str]:
    record = cluster.work_dir(name) / "captures" / sweep_id / "capture.json"
    try:
        return list(json.loads(record.read_text()).get("uploads", {}))
    except (OSError, ValueError):
        return []


def partly_committed(cluster: Cluster, names: list[str], sweep_id: str) -> tuple[str, str, int] | None:
    """(node, upload id, committed offset) of an upload the coordinator holds only part of."""
    for name in names:
        for uid in _upload_ids(cluster, name, sweep_id):
            status = cluster.query(name, uid)
            if status.known and 0 < status.committed_offset < status.size:
                return name, uid, status.committed_offset
    return None


def resumed_offsets(cluster: Cluster, name: str, uid: str) -> list[int]:
    return [int(m) for m in re.findall(rf"upload {re.escape(uid)} resumes at committed offset (\d+)", cluster.log(name))]


def test_an_agent_killed_mid_upload_resumes_from_the_committed_offset(cluster: Cluster) -> None:
    cluster.coordinator(RANKSCOPE_CHUNK_BYTES="16384")
    cluster.agent("n0", 0)
    # 30 kB/s in 16 KiB chunks: the digest (about 16 kB) and the raw exports (about 120 kB per rank)
    # take seconds to upload, so the kill lands part-way through one of them.
    cluster.agent("n1", 1, "--upload-limit", "0.03")
    sweep_id = cluster.start_sweep(["n0", "n1"], duration_s=0.2, timeout_s=90, upload_raw=True, options=sim_options(2))
    _, uid, committed = wait_for("n1 to be part-way through an upload",
                                 lambda: partly_committed(cluster, ["n1"], sweep_id), START_S, 0.05)
    cluster.kill("n1")
    # What the coordinator holds now is where the restarted agent must resume.
    at_kill = cluster.query("n1", uid).committed_offset
    assert at_kill >= committed > 0
    cluster.agent("n1", 1)
    sweep = cluster.wait_final(sweep_id, 100)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep))
    assert resumed_offsets(cluster, "n1", uid)[:1] == [at_kill]
    status = cluster.query("n1", uid)
    assert status.complete and status.committed_offset == status.size
    stored = cluster.data_dir / "artifacts" / "objects" / status.sha256[:2] / status.sha256
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == status.sha256
    # One digest and two raw exports per node, each stored once.
    assert_stored_once_and_verified(cluster, sweep, per_node=3)


def test_a_raw_export_the_coordinator_refuses_leaves_the_digest_analysed(cluster: Cluster) -> None:
    """--upload-raw is extra: a raw export over the coordinator's upload limit is a note,
    not a failed node, when the digest (about 16 kB here) is stored."""
    cluster.coordinator(RANKSCOPE_MAX_UPLOAD_BYTES="60000")  # the raw exports are about 120 kB per rank
    cluster.agent("n0", 0)
    sweep_id = cluster.start_sweep(["n0"], duration_s=0.2, timeout_s=60, upload_raw=True, options=sim_options(1))
    sweep = cluster.wait_final(sweep_id, 70)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep))
    assert [n.artifacts for n in sweep.nodes] == [1]  # the digest
    reply = cluster.sweeps.GetReport(pb.GetReportRequest(sweep_id=sweep_id), timeout=10)
    notes = json.loads(reply.report_json)["sweep"]["nodes"]["n0"]["notes"]
    assert notes and all(n.startswith("raw export sim_rank") and "not uploaded" in n and "upload limit" in n
                         for n in notes), notes


def test_raw_exports_still_uploading_at_the_deadline_leave_the_digest_analysed(cluster: Cluster) -> None:
    """A raw upload throttled past the sweep's deadline failed the whole sweep, though the
    digest, all the analysis needs, was stored seconds before."""
    cluster.coordinator()
    cluster.agent("n0", 0, "--upload-limit", "0.02")  # 20 kB/s: the raw exports, ~240 kB, take ~12 s
    sweep_id = cluster.start_sweep(["n0"], duration_s=0.2, timeout_s=6, upload_raw=True, options=sim_options(1))
    sweep = cluster.wait_final(sweep_id, 40)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep))
    reply = cluster.sweeps.GetReport(pb.GetReportRequest(sweep_id=sweep_id), timeout=10)
    notes = json.loads(reply.report_json)["sweep"]["nodes"]["n0"]["notes"]
    assert "raw exports not all uploaded within 6s: the report stands on its digest" in notes


def test_the_coordinator_killed_mid_sweep_finishes_it_after_restart(cluster: Cluster) -> None:
    cluster.coordinator(RANKSCOPE_CHUNK_BYTES="16384")
    names = ["n0", "n1", "n2", "n3"]
    for i, name in enumerate(names):
        cluster.agent(name, i, "--upload-limit", "0.05")
    sweep_id = cluster.start_sweep(names, duration_s=0.5, timeout_s=90, upload_raw=True,
                                   options=sim_options(4, **{"sim.stragglers": "2:compute:3000"}))
    node, uid, committed = wait_for("an upload to be part-way", lambda: partly_committed(cluster, names, sweep_id),
                                    START_S, 0.05)
    cluster.kill("coordinator")
    cluster.coordinator(RANKSCOPE_CHUNK_BYTES="16384")
    sweep = cluster.wait_final(sweep_id, 100)
    assert sweep.state == pb.SWEEP_STATE_ANALYSED, (sweep.error, states(sweep))
    # The interrupted upload went on from what the coordinator had committed, not from 0 ...
    assert resumed_offsets(cluster, node, uid) and min(resumed_offsets(cluster, node, uid)) >= committed
    # ... and nothing is lost or stored twice: 4 nodes x (1 digest + 2 raw exports), no partial left.
    assert_stored_once_and_verified(cluster, sweep, per_node=3)
    assert cluster.report(sweep_id).stragglers == [2]


def test_an_agent_that_never_comes_back_makes_the_sweep_partial(cluster: Cluster) -> None:
    cluster.coordinator()
    names = ["n0", "n1", "n2", "n3"]
    for i, name in enumerate(names):
        cluster.agent(name, i)
    timeout_s = 12.0
    sweep_id = cluster.start_sweep(names, duration_s=2.0, timeout_s=timeout_s, options=sim_options(4))
    wait_for("n3 to capture", lambda: cluster.node_state(sweep_id, "n3") == pb.NODE_STATE_CAPTURING, START_S, 0.05)
    cluster.kill("n3")
    sweep = cluster.wait_final(sweep_id, timeout_s + 30)
    assert sweep.state == pb.SWEEP_STATE_PARTIAL, (sweep.error, states(sweep))
    assert list(sweep.missing) == ["n3"]
    assert states(sweep)["n3"] == "NODE_STATE_TIMED_OUT"
    assert {states(sweep)[n] for n in names[:3]} == {"NODE_STATE_ANALYSED"}
    assert sorted(r.rank for r in cluster.report(sweep_id).ranks) == [0, 1, 2, 3, 4, 5]


def _n2_capturing(cluster: Cluster) -> str:
    """A sweep of three sim agents n0..n2 (started here), once n2 captures: its id."""
    for i, name in enumerate(("n0", "n1", "n2")):
        cluster.agent(name, i)
    sweep_id = cluster.start_sweep(["n0", "n1", "n2"], duration_s=3.0, timeout_s=600, options=sim_options(3))
    wait_for("n2 to capture", lambda: cluster.node_state(sweep_id, "n2") == pb.NODE_STATE_CAPTURING, START_S, 0.05)
    return sweep_id


def _n2_failed_the_rest_analysed(cluster: Cluster, sweep_id: str, reason: str, wait_s: float) -> None:
    """The sweep ends partial within ``wait_s``: n2 failed for ``reason``, n0 and n1 analysed."""
    sweep = cluster.wait_final(sweep_id, wait_s)
    assert sweep.state == pb.SWEEP_STATE_PARTIAL, (sweep.error, states(sweep))
    failed = next(n for n in sweep.nodes if n.node == "n2")
    assert (failed.state, failed.reason) == (pb.NODE_STATE_FAILED, reason), states(sweep)
    assert list(sweep.missing) == ["n2"] and {states(sweep)[n] for n in ("n0", "n1")} == {"NODE_STATE_ANALYSED"}
    assert sorted(r.rank for r in cluster.report(sweep_id).ranks) == [0, 1, 2, 3]


def test_an_agent_stopped_mid_capture_ends_its_node_at_once_saying_why(cluster: Cluster) -> None:
    """SIGTERM mid-capture (a pod deleted, a job ended, a service stopped): the agent left
    without a word, and the sweep waited out its timeout for the node (last state: capturing).
    The timeout here is far past the wait below: the sweep ends on the agent's word, or not at all."""
    cluster.coordinator()
    sweep_id = _n2_capturing(cluster)
    cluster.procs["n2"].send_signal(signal.SIGTERM)
    assert cluster.procs["n2"].wait(START_S) == 0
    _n2_failed_the_rest_analysed(cluster, sweep_id, "agent stopped by SIGTERM while capturing", 90)


def test_an_agent_killed_mid_capture_is_judged_lost_and_the_sweep_goes_on_without_it(cluster: Cluster) -> None:
    """SIGKILL mid-capture: the agent says nothing, and the sweep waited out its whole timeout
    for the node. Not heard from for $RANKSCOPE_AGENT_LOST_S (15 s here, heartbeats every 1 s),
    its agent is judged lost: its node fails, named, and the rest are analysed. The timeout is
    far past the wait below: the sweep ends on the judgement, or not at all."""
    cluster.coordinator(RANKSCOPE_AGENT_LOST_S="15")
    sweep_id = _n2_capturing(cluster)
    cluster.kill("n2")
    _n2_failed_the_rest_analysed(
        cluster, sweep_id, "agent of node n2 lost: not heard from for 15s, its session ended (last state: capturing)", 90)


def test_an_agent_killed_while_the_coordinator_is_down_is_judged_lost_after_the_restart_grace(
        cluster: Cluster) -> None:
    """n2's agent dies while the coordinator is down: it never reconnects, and the sweep waited
    for its node until the timeout (10 min here), the restart grace only extending it. Not back
    within $RANKSCOPE_RESTART_GRACE_S (20 s here), it is judged lost; the rest, back, finish."""
    cluster.coordinator()
    sweep_id = _n2_capturing(cluster)
    cluster.kill("coordinator")
    cluster.kill("n2")
    cluster.coordinator()
    _n2_failed_the_rest_analysed(cluster, sweep_id, "agent of node n2 lost: not back within 20s of the coordinator's "
                                                    "restart (last state: capturing)", 120)
