"""The coordinator over real gRPC on loopback, driven by bare-stubs agents (no agent processes)."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import queue
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rankscope.analysis.report import Report
from rankscope.cli import main
from rankscope.coordinator import artifacts as art
from rankscope.coordinator import coordinator as coordinator_mod
from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.client import SweepClient
from rankscope.coordinator.registry import AgentRecord
from rankscope.coordinator.store import Store
from rankscope.errors import InputError
from rankscope.proto.v1 import rankscope_pb2 as pb

STRAGGLER = 1  # in the `digests` fixture's job


def started_capture(agent) -> pb.StartCapture:
    command = agent.next_command()
    assert command.HasField("start"), command
    return command.start


def final(client: SweepClient, sweep_id: str) -> pb.Sweep:
    events = list(client.watch(sweep_id))
    assert events[-1].final
    return events[-1].sweep


def test_health_service_answers_serving(coordinator) -> None:
    stub = health_pb2_grpc.HealthStub(coordinator.channel)
    for service in ("", "rankscope.v1.AgentService", "rankscope.v1.SweepService"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as caught:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_sweep_runs_to_a_stored_report_naming_the_straggler(coordinator, wire, digests, capsys) -> None:
    agents = [wire.FakeAgent(coordinator, name, pool="train") for name in digests]
    with SweepClient(coordinator.address) as client:
        sweep = client.start(labels={"pool": "train"}, duration_s=2.0, backend="sim", options={"sim.seed": "5"})
        assert sorted(n.node for n in sweep.nodes) == sorted(digests)
        for agent in agents:
            start = started_capture(agent)
            assert (start.sweep_id, start.backend, start.duration_s, dict(start.options)) == \
                (sweep.sweep_id, "sim", 2.0, {"sim.seed": "5"})
            agent.finish(sweep.sweep_id, digests[agent.node])
        done = final(client, sweep.sweep_id)
        assert done.state == pb.SWEEP_STATE_ANALYSED and not done.missing
        assert {n.state for n in done.nodes} == {pb.NODE_STATE_ANALYSED}
        reply = client.report(sweep.sweep_id)
    report = json.loads(reply.report_json)
    assert Report.from_dict(report).stragglers == [STRAGGLER]
    assert report["sweep"]["sweep_id"] == sweep.sweep_id and report["sweep"]["missing"] == []
    assert json.loads(Path(reply.path).read_text()) == report

    assert main(["report", sweep.sweep_id, "--coordinator", coordinator.address, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == report
    assert main(["sweeps", "--coordinator", coordinator.address]) == 0
    listing = capsys.readouterr().out
    assert sweep.sweep_id in listing and "analysed" in listing and "2/2" in listing
    for agent in agents:
        agent.close()


def test_what_a_node_went_on_without_is_in_its_report(coordinator, wire, digests) -> None:
    """A rank that did not record is named with its node's reason in the report's warnings
    and the node's facts, not only in the agent's log."""
    note = "did not start recording on rank 3: the rank exited"
    agents = {name: wire.FakeAgent(coordinator, name) for name in digests}
    with SweepClient(coordinator.address) as client:
        sweep = client.start(everything=True, duration_s=0.5, backend="sim")
        for name, agent in agents.items():
            agent.finish(started_capture(agent).sweep_id, digests[name], notes=(note,) if name == "node001" else ())
        assert final(client, sweep.sweep_id).state == pb.SWEEP_STATE_ANALYSED
        report = json.loads(client.report(sweep.sweep_id).report_json)
    assert f"node node001: {note}" in report["warnings"]
    assert {name: facts["notes"] for name, facts in report["sweep"]["nodes"].items()} == {"node000": [], "node001": [note]}
    for agent in agents.values():
        agent.close()


def test_a_stored_report_changed_on_disk_is_refused_with_a_reason_not_sent_broken(
        coordinator, wire, digests, capsys) -> None:
    agents = [wire.FakeAgent(coordinator, name) for name in digests]
    with SweepClient(coordinator.address) as client:
        sweep_id = client.start(everything=True, duration_s=0.5, backend="sim").sweep_id
        for agent in agents:
            agent.finish(started_capture(agent).sweep_id, digests[agent.node])
        final(client, sweep_id)
        path = Path(client.report(sweep_id).path)
        path.write_text(path.read_text()[:100])  # cut short, as a copy that ran out of room
        with pytest.raises(InputError, match=r": the stored report is not a rankscope report \(.*\): the file was "
                                             "changed after the coordinator wrote it$"):
            client.report(sweep_id)
    assert main(["report", sweep_id, "--coordinator", coordinator.address]) == 2
    assert "Traceback" not in capsys.readouterr().err
    for agent in agents:
        agent.close()


def test_a_report_this_client_cannot_read_is_one_line_not_a_traceback() -> None:
    from rankscope.coordinator.commands import _print_report

    for text in ('{"garbage', '{"schema": "rankscope.report/1"}'):
        with pytest.raises(InputError, match="^the report of sweep s1 cannot be read here .*; --format json prints it"):
            _print_report(pb.ReportReply(sweep_id="s1", report_json=text), argparse.Namespace(format="table", plot=None))


def test_a_silent_node_makes_the_sweep_partial_with_it_named(coordinator, wire, digests) -> None:
    talking, silent = (wire.FakeAgent(coordinator, name) for name in digests)
    with SweepClient(coordinator.address) as client:
        sweep = client.start(everything=True, duration_s=0.5, backend="sim", timeout_s=3.0)
        talking.finish(started_capture(talking).sweep_id, digests[talking.node])
        started_capture(silent)  # and never a word back
        done = final(client, sweep.sweep_id)
        report = json.loads(client.report(sweep.sweep_id).report_json)
    assert done.state == pb.SWEEP_STATE_PARTIAL and list(done.missing) == [silent.node]
    reasons = {n.node: (n.state, n.reason) for n in done.nodes}
    assert reasons[silent.node] == (pb.NODE_STATE_TIMED_OUT, "no answer within 3s (last state: pending)")
    assert reasons[talking.node][0] == pb.NODE_STATE_ANALYSED
    assert report["sweep"]["missing"] == [silent.node]
    assert any(silent.node in w and "missing" in w for w in report["warnings"])
    assert {r["host"] for r in report["ranks"]} == {talking.node}
    cancel = silent.next_command()
    assert cancel.HasField("cancel") and cancel.cancel.sweep_id == sweep.sweep_id
    talking.close()
    silent.close()


def test_a_node_still_working_on_an_ended_sweep_is_told_to_stop(coordinator, wire, digests) -> None:
    """A cancel sent while the agent was away is lost; its next status for that sweep (an
    agent re-reports on reconnecting) brings the cancel again: the node must not stay busy."""
    talking, away = (wire.FakeAgent(coordinator, name) for name in digests)
    with SweepClient(coordinator.address) as client:
        sweep = client.start(everything=True, duration_s=0.5, backend="sim", timeout_s=2.0)
        talking.finish(started_capture(talking).sweep_id, digests[talking.node])
        started_capture(away)
        final(client, sweep.sweep_id)
    assert away.next_command().HasField("cancel")  # the one it would have missed
    away.status(sweep.sweep_id, pb.NODE_STATE_UPLOADING)  # back, and still at it
    again = away.next_command()
    assert again.HasField("cancel") and again.cancel.sweep_id == sweep.sweep_id
    assert again.cancel.reason == f"sweep {sweep.sweep_id} has ended"
    away.status(sweep.sweep_id, pb.NODE_STATE_DCGM_RESUMED)  # done with it: nothing more to say
    with pytest.raises(queue.Empty):
        away.next_command(timeout=1.0)
    talking.close()
    away.close()


def _one_node_uploading_raw(client, wire, digests, talking, away):
    """A 3 s sweep over both agents: ``talking`` delivers its digest, ``away`` is to upload a
    raw export (the sweep, its header as upload raw-1, its bytes)."""
    data = os.urandom(300_000)
    sweep = client.start(everything=True, duration_s=0.5, backend="sim", timeout_s=3.0)
    talking.finish(started_capture(talking).sweep_id, digests[talking.node])
    started_capture(away)
    head = wire.header(data, node=away.node, token=away.token, sweep_id=sweep.sweep_id, upload_id="raw-1")
    return sweep, head, data


def test_an_upload_its_sweep_ended_before_is_removed(coordinator, wire, digests) -> None:
    """A raw export half-uploaded when its node timed out is never completed: its part file
    (gigabytes, for real exports) must not stay in the store for good."""
    talking, away = (wire.FakeAgent(coordinator, name) for name in digests)
    with SweepClient(coordinator.address) as client:
        sweep, head, data = _one_node_uploading_raw(client, wire, digests, talking, away)

        def cut_short():
            for i, message in enumerate(wire.chunks(head, data)):
                if i == 3:  # the header and two chunks stored, then the agent is gone
                    while coordinator.query("raw-1", away.token).committed_offset < 2 * (64 << 10):
                        time.sleep(0.01)
                    raise RuntimeError("agent gone")
                yield message

        with pytest.raises(grpc.RpcError):
            coordinator.agents.Upload(cut_short(), timeout=10)
        assert coordinator.query("raw-1", away.token).known
        final(client, sweep.sweep_id)
    assert not coordinator.query("raw-1", away.token).known
    assert list((coordinator.data_dir / "artifacts" / "partial").iterdir()) == []
    talking.close()
    away.close()


def test_an_upload_still_streaming_when_its_sweep_ends_is_removed_when_the_stream_stops(coordinator, wire,
                                                                                       digests) -> None:
    """The usual case of a timed-out node: its raw export is still streaming when the sweep ends,
    so the sweep's clean-up passes it by; the agent, cancelled, then ends the stream short."""
    talking, away = (wire.FakeAgent(coordinator, name) for name in digests)
    ended = threading.Event()
    with SweepClient(coordinator.address) as client:
        sweep, head, data = _one_node_uploading_raw(client, wire, digests, talking, away)

        def until_cancelled():
            for i, message in enumerate(wire.chunks(head, data)):
                if i == 3:  # the header and two chunks sent; the stream stays open until the sweep is over
                    ended.wait()
                    return  # half-closed, as the agent's uploader does once its capture is cancelled
                yield message

        with futures.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(coordinator.agents.Upload, until_cancelled(), timeout=20)
            while coordinator.query("raw-1", away.token).committed_offset < 2 * (64 << 10):
                time.sleep(0.01)
            assert final(client, sweep.sweep_id).state == pb.SWEEP_STATE_PARTIAL
            ended.set()
            assert not reply.result().complete
    assert not coordinator.query("raw-1", away.token).known
    assert list((coordinator.data_dir / "artifacts" / "partial").iterdir()) == []
    talking.close()
    away.close()


def test_an_upload_by_a_node_not_in_the_sweep_or_after_it_ended_is_refused_and_not_listed(coordinator, wire,
                                                                                            digests) -> None:
    """Seen with a hostile client: both were stored and listed as the ended sweep's artifacts,
    though its listing is said to be whole once it has ended."""
    agents = [wire.FakeAgent(coordinator, name) for name in digests]
    outsider = wire.FakeAgent(coordinator, "outsider")
    data = os.urandom(5000)

    def upload(agent, sweep_id: str, upload_id: str) -> grpc.RpcError:
        head = wire.header(data, node=agent.node, token=agent.token, sweep_id=sweep_id, name="late.nsys-rep",
                           upload_id=upload_id)
        head.kind = pb.ARTIFACT_KIND_RAW
        with pytest.raises(grpc.RpcError) as caught:
            coordinator.agents.Upload(wire.chunks(head, data), timeout=10)
        return caught.value

    with SweepClient(coordinator.address) as client:
        sweep_id = client.start(nodes=list(digests), duration_s=1.0, backend="sim").sweep_id
        error = upload(outsider, sweep_id, "outsider-1")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"node 'outsider' is not in sweep {sweep_id}" in error.details()
        for agent in agents:
            assert started_capture(agent).sweep_id == sweep_id
            agent.finish(sweep_id, digests[agent.node])
        assert final(client, sweep_id).state == pb.SWEEP_STATE_ANALYSED
        error = upload(agents[0], sweep_id, "late-1")
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"sweep {sweep_id} has ended and takes no more uploads" in error.details()
        listed = client.stub.ListArtifacts(pb.ListArtifactsRequest(sweep_id=sweep_id), timeout=10).artifacts
    assert sorted(a.node for a in listed) == sorted(digests) and {a.artifact.kind for a in listed} == {
        pb.ARTIFACT_KIND_DIGEST}
    assert not coordinator.query("late-1", agents[0].token).known
    assert list((coordinator.data_dir / "artifacts" / "partial").iterdir()) == []
    for agent in (*agents, outsider):
        agent.close()


def test_unfinished_uploads_no_sweep_will_complete_are_removed_on_restart(tmp_path, wire, caplog) -> None:
    """Nothing would ever remove these after a restart: those of a sweep that ended as the
    coordinator was killed (between storing it as final and removing them), as no sweep that
    ended is resumed; and those under a sweep id never started here, which versions before
    such uploads were refused took (seen: kept on every restart, filling the disk). Those of
    a running sweep, or one whose stored record cannot be read, stay; so does every finished
    artifact, the unknown sweep's too."""
    import sqlite3

    data_dir = tmp_path / "data"
    ended, _ = sw.Sweep.start(sw.SweepSpec("sim", 5.0, 30.0), ["node-a"], 1, sweep_id="s-ended")
    ended.handle(sw.Cancelled("cancelled", 2))
    store = Store(data_dir / "state.sqlite")
    store.save_sweep(ended)
    for sweep_id in ("s-running", "s-cut"):
        store.save_sweep(sw.Sweep.start(sw.SweepSpec("sim", 5.0, 30.0), ["node-a"], time.time_ns(),
                                        sweep_id=sweep_id)[0])
    store.close()
    db = sqlite3.connect(data_dir / "state.sqlite")
    db.execute("UPDATE sweeps SET data = '{\"cut' WHERE sweep_id = 's-cut'")
    db.commit()
    db.close()
    artifacts = art.ArtifactStore(data_dir / "artifacts", max_bytes=1 << 20)
    data = os.urandom(10_000)
    uploads = {"raw-ended": "s-ended", "raw-running": "s-running", "raw-cut": "s-cut", "done-old": "s1",
               **{f"raw-old-{n}": "s1" for n in range(1, 8)}}
    for upload_id, sweep_id in uploads.items():
        body = data if upload_id.startswith("done") else data[::-1]  # the finished one's bytes are its own
        head = art.UploadHeader(upload_id, sweep_id, "node-a", f"{upload_id}.nsys-rep", len(body),
                                hashlib.sha256(body).hexdigest(), "raw")
        with artifacts.writer(head) as writer:
            writer.write(0, body if upload_id.startswith("done") else body[:4000])
    finished = artifacts.path_of(hashlib.sha256(data).hexdigest())
    assert finished.is_file()

    with caplog.at_level(logging.WARNING, logger=coordinator_mod.__name__):
        coordinator = wire.start(data_dir)
    try:
        token = coordinator.register("node-a").session_token
        known = {upload_id: coordinator.query(upload_id, token).known for upload_id in uploads if upload_id != "done-old"}
        assert known == {"raw-ended": False, "raw-running": True, "raw-cut": True,
                         **{f"raw-old-{n}": False for n in range(1, 8)}}
        assert sorted(p.name for p in (data_dir / "artifacts" / "partial").iterdir()) == [
            "raw-cut.json", "raw-cut.part", "raw-running.json", "raw-running.part"]
        assert finished.read_bytes() == data
        removed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("removed ")]
        assert removed == ["removed 1 unfinished upload(s) of sweep 's-ended', which has ended: raw-ended",
                           "removed 7 unfinished upload(s) of sweep 's1', which this coordinator never started: "
                           "raw-old-1, raw-old-2, raw-old-3, raw-old-4, raw-old-5 and 2 more"]
    finally:
        wire.stop(coordinator)


def _cut_by_a_restart(tmp_path, wire, digests, timeout_s: float) -> str:
    """A sweep of the two digests' nodes, the first finished, the second capturing, when its
    coordinator stops (and the agents go): its id."""
    first, second = sorted(digests)
    running = wire.start(tmp_path / "data")
    a, b = wire.FakeAgent(running, first), wire.FakeAgent(running, second)
    with SweepClient(running.address) as client:
        sweep_id = client.start(everything=True, duration_s=1.0, backend="sim", timeout_s=timeout_s).sweep_id
    a.finish(started_capture(a).sweep_id, digests[first])
    started_capture(b)
    b.status(sweep_id, pb.NODE_STATE_CAPTURING)
    b.close()
    a.close()
    wire.stop(running)
    return sweep_id


def test_a_sweep_interrupted_by_a_restart_finishes_afterwards(tmp_path, wire, digests) -> None:
    first, second = sorted(digests)
    sweep_id = _cut_by_a_restart(tmp_path, wire, digests, timeout_s=20.0)

    running = wire.start(tmp_path / "data")
    try:
        with SweepClient(running.address) as client:
            assert [s.state for s in client.sweeps()] == [pb.SWEEP_STATE_RUNNING]
            b = wire.FakeAgent(running, second)  # reconnects: gets the capture again
            assert started_capture(b).sweep_id == sweep_id
            b.finish(sweep_id, digests[second])
            done = final(client, sweep_id)
        assert done.state == pb.SWEEP_STATE_ANALYSED and not done.missing
        uploads = Store(tmp_path / "data" / "state.sqlite").uploads(sweep_id)
        assert sorted(upload.node for upload in uploads) == [first, second]
        b.close()
    finally:
        wire.stop(running)


def test_an_agent_that_dies_while_the_coordinator_is_down_is_judged_lost_after_the_restart_grace(
        tmp_path, wire, digests) -> None:
    """Its agent never comes back after the restart: the sweep waited for the node until its
    timeout (an hour here), the restart grace only extending it. Past the grace, it is lost."""
    first, second = sorted(digests)
    sweep_id = _cut_by_a_restart(tmp_path, wire, digests, timeout_s=3600)

    _judged_lost_after_a_restart(tmp_path, wire, sweep_id, second, "capturing")


def test_a_named_node_whose_agent_connected_before_the_restart_is_judged_after_its_grace(tmp_path, wire,
                                                                                         digests) -> None:
    """Named while its agent was away, a node is waited for until the timeout (an hour here);
    its agent connected and took the capture, but the coordinator stopped before it reported
    and it never came back: it waited out the hour still. Past the restart's grace, it is lost."""
    first, second = sorted(digests)
    running = wire.start(tmp_path / "data")
    a = wire.FakeAgent(running, first)
    running.register(second)  # registered, not connected
    with SweepClient(running.address) as client:
        sweep_id = client.start(nodes=[first, second], duration_s=1.0, backend="sim", timeout_s=3600).sweep_id
    a.finish(started_capture(a).sweep_id, digests[first])
    b = wire.FakeAgent(running, second)
    assert started_capture(b).sweep_id == sweep_id  # and says nothing before the coordinator goes
    b.close()
    a.close()
    wire.stop(running)

    _judged_lost_after_a_restart(tmp_path, wire, sweep_id, second, "pending")


def _judged_lost_after_a_restart(tmp_path, wire, sweep_id: str, node: str, last_state: str) -> None:
    """Restarted with a 1 s grace, the sweep ends PARTIAL, ``node`` judged lost, not back: not
    waited for until its timeout (an hour in the callers)."""
    running = wire.start(tmp_path / "data", restart_grace_s=1.0)
    try:
        with SweepClient(running.address) as client:
            deadline = time.monotonic() + 60  # generous: the sweep ends on the judgement or in an hour
            while client.sweeps()[0].state == pb.SWEEP_STATE_RUNNING:
                assert time.monotonic() < deadline, "the sweep waited on an agent not back after the restart"
                time.sleep(0.2)
            done = final(client, sweep_id)
        assert done.state == pb.SWEEP_STATE_PARTIAL and list(done.missing) == [node]
        (lost,) = [n for n in done.nodes if n.node == node]
        assert (lost.state, lost.reason) == (pb.NODE_STATE_FAILED, f"agent of node {node} lost: not back within 1s "
                                                                   f"of the coordinator's restart (last state: {last_state})")
    finally:
        wire.stop(running)


def test_agents_killed_or_cut_off_mid_sweep_are_judged_lost_and_the_sweep_goes_on(tmp_path, wire, digests) -> None:
    """A killed agent (its stream gone, mid-export with an hour's bound) and one whose node is
    cut off (its stream open, nothing on it) held the sweep until its timeout (an hour here).
    Silent for `agent_lost_s`, each is judged lost: its node fails, named, and the sweep ends."""
    running = wire.start(tmp_path / "data", agent_lost_s=3.0, heartbeat_interval_s=1.0, ping_interval_s=0.2)
    try:
        talking, dying, cut_off = (wire.FakeAgent(running, name) for name in (*sorted(digests), "node002"))
        with SweepClient(running.address) as client:
            sweep_id = client.start(everything=True, duration_s=0.5, backend="sim", timeout_s=3600).sweep_id
            talking.finish(started_capture(talking).sweep_id, digests[talking.node])
            started_capture(dying)
            dying.status(sweep_id, pb.NODE_STATE_EXPORTING, export_timeout_s=3600)
            started_capture(cut_off)
            cut_off.status(sweep_id, pb.NODE_STATE_CAPTURING)
            time.sleep(0.5)  # the statuses are in before the agents go
            dying.call.cancel()  # as its process's death closes its connection, no word said
            cut_off.silent.set()
            deadline = time.monotonic() + 60  # generous: the sweep ends on the judgement or in an hour
            while (done := client.sweeps()[0]).state == pb.SWEEP_STATE_RUNNING:
                assert time.monotonic() < deadline, "the sweep waited on its lost agents"
                time.sleep(0.2)
            done = final(client, sweep_id)
        assert done.state == pb.SWEEP_STATE_PARTIAL and list(done.missing) == ["node001", "node002"]
        reasons = {n.node: (pb.NodeState.Name(n.state), n.reason) for n in done.nodes if n.node != talking.node}
        assert reasons == {
            "node001": ("NODE_STATE_FAILED", "agent of node node001 lost: not heard from for 3s, its session ended "
                                             "(last state: exporting)"),
            "node002": ("NODE_STATE_FAILED", "agent of node node002 lost: not heard from for 3s, its session still "
                                             "open (last state: capturing)"),
        }
        cut_off.reader.join(10)  # the coordinator ended the cut-off agent's stream
        assert not cut_off.reader.is_alive()
        talking.close()
    finally:
        wire.stop(running)


def test_an_agent_back_after_it_was_judged_lost_is_refused_its_upload_for_good(tmp_path, wire, digests,
                                                                              caplog) -> None:
    """Seen on loopback: node001's agent, judged lost, came back and uploaded its digest to the
    sweep, still running on node000: stored, listed as the sweep's, never analysed. It is
    refused at its start, saying why, as final: the agent's uploader does not retry it, logs
    it, and nothing of it is stored."""
    from rankscope.agent.uploader import Artifact, Uploader, upload_id
    from rankscope.errors import UploadRejected

    running = wire.start(tmp_path / "data", agent_lost_s=3.0, heartbeat_interval_s=1.0, ping_interval_s=0.2)
    try:
        first, second = sorted(digests)
        capturing, dying = wire.FakeAgent(running, first), wire.FakeAgent(running, second)
        with SweepClient(running.address) as client:
            sweep_id = client.start(everything=True, duration_s=0.5, backend="sim", timeout_s=3600).sweep_id
            for agent in (capturing, dying):
                started_capture(agent)
                agent.status(sweep_id, pb.NODE_STATE_CAPTURING)
            time.sleep(0.5)  # the statuses are in before the agent goes
            dying.call.cancel()
            deadline = time.monotonic() + 60
            while (node := running.server.coordinator.sweep(sweep_id).nodes[second]).state is not sw.NodeState.FAILED:
                assert time.monotonic() < deadline, "the agent was not judged lost"
                time.sleep(0.2)
            back = wire.FakeAgent(running, second)
            (tmp_path / f"{second}.digest.parquet").write_bytes(digests[second])
            artifact = Artifact(tmp_path / f"{second}.digest.parquet", sweep_id, second, ranks=(2, 3))
            uid = upload_id(artifact, hashlib.sha256(digests[second]).hexdigest())
            uploader = Uploader(running.channel, session_token=back.token, max_attempts=3, backoff_s=0.01)
            with pytest.raises(UploadRejected) as caught:  # not TransportError: not retried
                uploader.upload(artifact)
            assert caught.value.args[0] == (
                f"coordinator refused upload {uid}: INVALID_ARGUMENT: upload {uid}: sweep {sweep_id} no longer waits "
                f"for node {second} (failed: {node.reason}); its capture is not used")
            said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "rankscope.agent.uploader"]
            assert said == [(logging.WARNING, str(caught.value))]  # on the agent's log at its default level
            assert node.reason == (f"agent of node {second} lost: not heard from for 3s, its session ended "
                                   "(last state: capturing)")
            listed = client.stub.ListArtifacts(pb.ListArtifactsRequest(sweep_id=sweep_id), timeout=10).artifacts
            assert list(listed) == [] and client.sweeps()[0].state == pb.SWEEP_STATE_RUNNING
        assert wire.stored_files(running.data_dir) == []
        for agent in (capturing, back):
            agent.close()
    finally:
        wire.stop(running)


def test_pings_estimate_the_agent_clock_offset(coordinator, wire) -> None:
    agent = wire.FakeAgent(coordinator, "skewed", clock_skew_ns=5_000_000_000)
    store = Store(coordinator.data_dir / "state.sqlite")
    record = None
    for _ in range(200):
        record = store.agent_by_node("skewed")
        if record.clock_offset_ns is not None:
            break
        agent.reader.join(0.05)
    assert record.clock_offset_ns is not None and record.rtt_ns >= 0
    assert abs(record.clock_offset_ns - 5_000_000_000) <= record.rtt_ns // 2 + 50_000_000
    # A capture's command carries the node's clock as the pings measured it: the agent moves
    # the sweep's start onto its own clock by it.
    with SweepClient(coordinator.address) as client:
        client.start(nodes=["skewed"], duration_s=1.0, backend="sim")
    clock = started_capture(agent).node_clock
    assert abs(clock.offset_ns - 5_000_000_000) <= clock.rtt_ns // 2 + 50_000_000 and clock.rtt_ns >= 0
    agent.close()


def test_unknown_targets_are_refused_by_name(coordinator, wire) -> None:
    wire.FakeAgent(coordinator, "node-a", pool="a").close()
    with SweepClient(coordinator.address) as client:
        with pytest.raises(InputError, match="no agent registered as node-z"):
            client.start(nodes=["node-z"], duration_s=1.0, backend="sim")
        with pytest.raises(InputError, match="no connected agent has labels pool=b"):
            client.start(labels={"pool": "b"}, duration_s=1.0, backend="sim")
        with pytest.raises(InputError, match="no sweep 'nope'"):
            client.report("nope")
        coordinator.agents.Register(pb.RegisterRequest(node="gpu-1", backends=["nsys", "sim"]), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:  # --nodes a,b could never target it
            coordinator.agents.Register(pb.RegisterRequest(node="gpu-1,gpu-2"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "node name 'gpu-1,gpu-2': a node name is 1 to 253 letters, digits, '.', '_' or '-' (as host names are)"
        with pytest.raises(InputError, match="node gpu-1 offers capture backends nsys, sim, not 'torch'"):
            client.start(nodes=["gpu-1"], duration_s=1.0, backend="torch")
        with pytest.raises(InputError, match="timeout 60s ends before the 120s capture window does: nodes need "
                                             "time after it to export and upload"):
            client.start(nodes=["gpu-1"], duration_s=120.0, backend="sim", timeout_s=60.0)
        for timeout in (float("nan"), float("inf")):  # not a ValueError in the servicer, status UNKNOWN
            with pytest.raises(InputError, match=rf"timeout {timeout}s is not a finite number of seconds"):
                client.start(nodes=["gpu-1"], duration_s=1.0, backend="sim", timeout_s=timeout)
        for window in (0.0, -1.0, 3600.5, 72000.0):  # 72000: a mistyped 20h for 20s
            with pytest.raises(InputError, match=rf"capture window {window:g}s: it must be positive and at most 3600s"):
                client.start(nodes=["gpu-1"], duration_s=window, backend="sim")
        assert client.sweeps() == []


def test_a_sweep_naming_no_backend_takes_the_nodes_default(coordinator, wire) -> None:
    """The first backend each agent offers is its default: a torch-only fleet needs no
    --backend torch on every capture; nodes whose defaults differ are refused by name."""
    for node, backends in (("t-1", ["torch", "sim"]), ("t-2", ["torch"]), ("n-1", ["nsys"])):
        coordinator.agents.Register(pb.RegisterRequest(node=node, backends=backends), timeout=10)
    with SweepClient(coordinator.address) as client:
        assert client.start(nodes=["t-1", "t-2"], duration_s=1.0).backend == "torch"
        with pytest.raises(InputError, match=r"the nodes' default capture backends differ \(n-1: nsys, t-1: torch\): "
                                             "name one for the sweep"):
            client.start(nodes=["t-1", "n-1"], duration_s=1.0)
        assert [s.backend for s in client.sweeps()] == ["torch"]


def test_nodes_refused_for_their_backends_are_named_in_the_fleets_numbering(coordinator, wire) -> None:
    for node in ("g10", "g2"):
        coordinator.agents.Register(pb.RegisterRequest(node=node, backends=["nsys"]), timeout=10)
    with SweepClient(coordinator.address) as client:
        with pytest.raises(InputError, match="node g2 offers capture backends nsys, not 'torch'; node g10 offers"):
            client.start(nodes=["g10", "g2"], duration_s=1.0, backend="torch")


def test_a_capture_option_a_nodes_backend_does_not_read_is_refused_before_the_sweep_starts(coordinator) -> None:
    """`--option zz=1` started the sweep, and only each agent then refused it: an agent says at
    registration what its backends read, and the sweep is refused naming the nodes, as the
    agents would; an agent that said nothing (older) is left to refuse it itself."""
    said = [pb.BackendOptions(backend="sim", options=["sim.*"]), pb.BackendOptions(backend="nsys", options=["gpu_metrics"])]
    for node in ("g10", "g2"):
        coordinator.agents.Register(pb.RegisterRequest(node=node, backends=["sim", "nsys"], backend_options=said),
                                    timeout=10)
    coordinator.agents.Register(pb.RegisterRequest(node="old", backends=["sim"]), timeout=10)
    with SweepClient(coordinator.address) as client:
        with pytest.raises(InputError, match=r": unknown capture option 'zz' for the sim backend on g2, g10 "
                                             r"\(it reads: sim\.\*\)$"):
            client.start(nodes=["g10", "g2", "old"], duration_s=1.0, backend="sim", options={"zz": "1", "sim.nodes": "2"})
        with pytest.raises(InputError, match=r": unknown capture option 'sim.nodes' for the nsys backend on g2 "
                                             r"\(it reads: gpu_metrics\)$"):
            client.start(nodes=["g2"], duration_s=1.0, backend="nsys", options={"sim.nodes": "2"})
        assert client.sweeps() == []
        assert client.start(nodes=["old"], duration_s=1.0, backend="sim", options={"zz": "1"}).nodes
        assert client.start(nodes=["g10", "g2"], duration_s=1.0, backend="sim", options={"sim.nodes": "2"}).nodes
        assert len(client.sweeps()) == 2


@pytest.mark.parametrize("word", ["maybe", ""])
def test_a_capture_option_neither_yes_nor_no_is_refused_before_the_sweep_starts(coordinator, word: str) -> None:
    """`--option gpu_metrics=off` was read as on (any word but "false"), and DCGM paused on
    every node for counters nobody asked for: the agents and the coordinator read it alike
    (`capture_options.flag`), and a word that is neither is refused before any node starts."""
    said = [pb.BackendOptions(backend="nsys", options=["gpu_metrics"])]
    coordinator.agents.Register(pb.RegisterRequest(node="g1", backends=["nsys"], backend_options=said), timeout=10)
    with SweepClient(coordinator.address) as client:
        with pytest.raises(InputError, match=rf": capture option gpu_metrics='{word}': expected true or false "
                                             r"\(yes/no, on/off, 1/0\)$"):
            client.start(nodes=["g1"], duration_s=1.0, backend="nsys", options={"gpu_metrics": word})
        assert client.sweeps() == []
        assert client.start(nodes=["g1"], duration_s=1.0, backend="nsys", options={"gpu_metrics": "Off"}).nodes


def test_a_node_is_in_one_capture_at_a_time(coordinator, wire) -> None:
    """Its ranks' nsys sessions (or profilers) take one capture at a time: an overlapping
    sweep, e.g. a scheduled health sweep over a node someone is investigating, skips it."""
    a, b = wire.FakeAgent(coordinator, "node-a"), wire.FakeAgent(coordinator, "node-b")
    with SweepClient(coordinator.address) as client:
        first = client.start(nodes=["node-a"], duration_s=30.0, backend="sim").sweep_id
        with pytest.raises(InputError, match=f"^coordinator at .*: node node-a is still capturing for sweep {first}$"):
            client.start(nodes=["node-a"], duration_s=1.0, backend="sim")
        health = client.start(everything=True, duration_s=1.0, backend="sim")
    nodes = {n.node: (n.state, n.reason) for n in health.nodes}
    assert nodes == {"node-a": (pb.NODE_STATE_FAILED, f"busy: still capturing for sweep {first}"),
                     "node-b": (pb.NODE_STATE_PENDING, "")}
    assert a.next_command().start.sweep_id == first
    assert b.next_command().start.sweep_id == health.sweep_id
    with pytest.raises(queue.Empty):  # node-a is sent nothing of the health sweep
        a.next_command(timeout=0.5)
    a.close()
    b.close()


def test_watching_rides_out_a_coordinator_restart(tmp_path, wire, digests) -> None:
    (name, data), = list(digests.items())[:1]
    running = wire.start(tmp_path / "data")
    agent = wire.FakeAgent(running, name)
    client = SweepClient(running.address)
    sweep_id = client.start(nodes=[name], duration_s=1.0, backend="sim", timeout_s=30.0).sweep_id
    started_capture(agent)
    events = client.watch(sweep_id)
    assert next(events).sweep.state == pb.SWEEP_STATE_RUNNING
    agent.close()
    wire.stop(running)

    running = wire.start(tmp_path / "data", listen=f"127.0.0.1:{running.port}")
    try:
        agent = wire.FakeAgent(running, name)
        agent.finish(started_capture(agent).sweep_id, data)
        last = list(events)[-1]
        assert last.final and last.sweep.state == pb.SWEEP_STATE_ANALYSED
        agent.close()
    finally:
        client.close()
        wire.stop(running)


def test_an_unreadable_digest_fails_the_sweep_with_the_reason(coordinator, wire) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    with SweepClient(coordinator.address) as client:
        sweep_id = client.start(nodes=["node-a"], duration_s=1.0, backend="sim").sweep_id
        agent.finish(started_capture(agent).sweep_id, b"not parquet at all", notes=("no trace from rank 1: the rank exited",))
        done = final(client, sweep_id)
        reply = client.report(sweep_id)
        with pytest.raises(InputError, match="no sweep 'nope'"):
            list(client.watch("nope"))
    assert done.state == pb.SWEEP_STATE_FAILED
    assert done.error.startswith("analysis failed: node node-a: its digest node-a.digest.parquet could not be read: "
                                 "not a readable Parquet digest (") and str(coordinator.data_dir) not in done.error
    assert done.error.endswith("; node node-a: no trace from rank 1: the rank exited")  # often the why
    assert reply.report_json == "" and not any((coordinator.data_dir / "reports").iterdir())
    agent.close()


def test_nodes_whose_digest_cannot_be_read_fail_with_why_and_the_others_are_analysed(coordinator, wire, digests,
                                                                                      tmp_path) -> None:
    """Seen with a hostile client: one node's bytes that were no digest failed the whole
    sweep, the good nodes unanalysed, the error naming a store path, not the node."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "table.parquet")
    payloads = {**digests, "junk": b"not parquet at all", "table": (tmp_path / "table.parquet").read_bytes()}
    done, report = _swept(coordinator, wire, payloads)
    assert done.state == pb.SWEEP_STATE_PARTIAL and list(done.missing) == ["junk", "table"]
    nodes = {n.node: n for n in done.nodes}
    assert {name: nodes[name].state for name in digests} == {name: pb.NODE_STATE_ANALYSED for name in digests}
    assert nodes["junk"].state == nodes["table"].state == pb.NODE_STATE_FAILED
    assert nodes["junk"].reason.startswith("its digest junk.digest.parquet could not be read: not a readable Parquet "
                                           "digest (Could not open Parquet input source: Parquet magic bytes")
    assert nodes["table"].reason.startswith("its digest table.digest.parquet could not be read: not a rankscope digest")
    # It quoted pyarrow's text, which named the store object's path: of no use to the sweep's user.
    assert not any(str(coordinator.data_dir) in text for text in (*report["warnings"], nodes["junk"].reason))
    assert [s.rank for s in done.stragglers] == [STRAGGLER]
    assert report["sweep"]["missing"] == ["junk", "table"] and report["sweep"]["nodes"]["junk"]["state"] == "failed"
    assert any(w.startswith("node table is missing from this report: its digest table.digest.parquet could not "
                            "be read") for w in report["warnings"])


def _swept(coordinator, wire, payloads: dict[str, bytes],
           ranks: dict[str, tuple[int, ...]] | None = None) -> tuple[pb.Sweep, dict]:
    """A sweep of one agent per payload, each finishing on its payload as its digest (its
    upload naming its ``ranks``, where given): the final sweep and its report."""
    agents = [wire.FakeAgent(coordinator, name) for name in payloads]
    try:
        with SweepClient(coordinator.address) as client:
            sweep_id = client.start(nodes=list(payloads), duration_s=1.0, backend="sim").sweep_id
            for agent in agents:
                assert started_capture(agent).sweep_id == sweep_id
                agent.finish(sweep_id, payloads[agent.node], ranks=(ranks or {}).get(agent.node, ()))
            return final(client, sweep_id), json.loads(client.report(sweep_id).report_json)
    finally:
        for agent in agents:
            agent.close()


@pytest.mark.parametrize("rank", [9, -1], ids=["past the world", "negative"])
def test_a_node_whose_digest_holds_a_rank_outside_the_world_fails_and_the_others_are_analysed(
        coordinator, wire, digests, tmp_path, rank: int) -> None:
    """Seen on loopback: one node's digest holding rank 9 of a world of 4 (a misconfigured
    node, a damaged digest) failed the whole sweep, the sound nodes unanalysed. Its digest
    alone says it is wrong: that node fails, naming the problem, and the rest is analysed."""
    import pyarrow as pa

    from rankscope.analysis import digest

    (tmp_path / "sound.parquet").write_bytes(next(iter(digests.values())))
    table = digest.read(tmp_path / "sound.parquet").slice(0, 1)
    table = table.set_column(table.schema.get_field_index("rank"), table.schema.field("rank"), pa.array([rank], pa.int32()))
    digest.write(table, tmp_path / "bad.parquet")
    payloads = {**digests, "bad": (tmp_path / "bad.parquet").read_bytes()}
    done, report = _swept(coordinator, wire, payloads)
    assert done.state == pb.SWEEP_STATE_PARTIAL, done.error
    assert list(done.missing) == ["bad"]
    nodes = {n.node: n for n in done.nodes}
    assert {name: nodes[name].state for name in digests} == {name: pb.NODE_STATE_ANALYSED for name in digests}
    assert nodes["bad"].state == pb.NODE_STATE_FAILED
    assert nodes["bad"].reason == (f"its digest bad.digest.parquet (digest of synthetic/rank0): rank {rank} is "
                                   "outside its world of 4 ranks")
    assert [s.rank for s in done.stragglers] == [STRAGGLER]
    assert report["sweep"]["missing"] == ["bad"] and report["sweep"]["nodes"]["bad"]["ranks"] == []
    assert f"node bad is missing from this report: {nodes['bad'].reason}" in report["warnings"]


def test_a_node_whose_digest_holds_other_ranks_than_its_upload_named_fails_alone(coordinator, wire, digests) -> None:
    """Seen on loopback: node001's upload named its ranks 2-3, its digest held node000's 0-1
    (one node's file under another's name). The ranks were taken as node001's, and as node000
    claimed them too the whole sweep failed, neither node told to be the wrong one. Its own
    upload says which: node001 fails alone, naming both sets of ranks; node000 is analysed."""
    first, second = sorted(digests)
    done, report = _swept(coordinator, wire, {first: digests[first], second: digests[first]},
                          ranks={first: (0, 1), second: (2, 3)})
    assert done.state == pb.SWEEP_STATE_PARTIAL, done.error
    nodes = {n.node: n for n in done.nodes}
    assert list(done.missing) == [second] and nodes[first].state == pb.NODE_STATE_ANALYSED
    assert (nodes[second].state, nodes[second].reason) == (
        pb.NODE_STATE_FAILED, f"its digest {second}.digest.parquet holds ranks 0,1, not the ranks 2,3 its upload named")
    assert report["sweep"]["nodes"][first]["ranks"] == [0, 1] and report["sweep"]["nodes"][second]["ranks"] == []
    assert f"node {second} is missing from this report: {nodes[second].reason}" in report["warnings"]


# A claim of one's own upload of the sweep, altered: as `rankscope fetch` names the file, as the analysis takes its ranks.
_ALTERED = {"its own under another name": dict(name="node000.digest.parquet"), "its own as other ranks": dict(ranks=[0, 1])}


@pytest.mark.parametrize("whose", ["another node's", "its own of an earlier sweep", *_ALTERED])
def test_a_node_reporting_a_file_not_as_it_uploaded_it_for_the_sweep_fails_alone(coordinator, wire, digests,
                                                                                   whose: str) -> None:
    """Seen on loopback: a node's report of a file as uploaded was taken wherever its sha256
    was stored. node001 reporting node000's digest as its own had node000's ranks claimed
    twice, and the whole sweep failed; reporting its own digest of an earlier sweep, it was
    analysed on a file it never sent for this one. Then, checked by sha256 alone, its own
    upload could be reported under another name or as other ranks. Each claim fails that
    node alone, named."""
    first, second = sorted(digests)
    agents = {name: wire.FakeAgent(coordinator, name) for name in digests}
    try:
        with SweepClient(coordinator.address) as client:
            claim = None
            if whose == "its own of an earlier sweep":
                earlier = client.start(nodes=[second], duration_s=1.0, backend="sim").sweep_id
                assert started_capture(agents[second]).sweep_id == earlier
                claim = agents[second].finish(earlier, digests[second])
                assert final(client, earlier).state == pb.SWEEP_STATE_ANALYSED
            sweep_id = client.start(nodes=list(digests), duration_s=1.0, backend="sim").sweep_id
            for agent in agents.values():
                assert started_capture(agent).sweep_id == sweep_id
            theirs = agents[first].finish(sweep_id, digests[first], ranks=(0, 1))
            if whose in _ALTERED:
                claim = agents[second].upload(sweep_id, f"{second}.digest.parquet", digests[second], ranks=(2, 3))
                for field in _ALTERED[whose]:  # a repeated field merges by appending
                    claim.ClearField(field)
                claim.MergeFrom(pb.ArtifactRef(**_ALTERED[whose]))
            claim = agents[second].finish(sweep_id, claim or theirs)
            done = final(client, sweep_id)
    finally:
        for agent in agents.values():
            agent.close()
    assert done.state == pb.SWEEP_STATE_PARTIAL, done.error
    nodes = {n.node: n for n in done.nodes}
    assert list(done.missing) == [second] and nodes[first].state == pb.NODE_STATE_ANALYSED
    assert (nodes[second].state, nodes[second].reason) == (
        pb.NODE_STATE_FAILED, f"reported uploaded, but not an upload of node {second} for this sweep: "
                              f"{claim.name} (sha256 {claim.sha256[:12]}...)")


def test_a_digest_gone_from_the_store_before_the_analysis_fails_its_node_alone(coordinator, wire, digests) -> None:
    """Seen on loopback: one node's stored digest removed (by hand, a restored disk) between
    its upload and the analysis failed the whole sweep, "digest ... is not in the artifact
    store", the other nodes unanalysed: it is that node's digest alone that is lost."""
    gone, kept = sorted(digests)
    agents = {name: wire.FakeAgent(coordinator, name) for name in digests}
    with SweepClient(coordinator.address) as client:
        sweep_id = client.start(nodes=list(digests), duration_s=1.0, backend="sim").sweep_id
        for agent in agents.values():
            assert started_capture(agent).sweep_id == sweep_id
        agents[gone].finish(sweep_id, digests[gone])
        sha256 = hashlib.sha256(digests[gone]).hexdigest()
        stored = coordinator.data_dir / "artifacts" / "objects" / sha256[:2] / sha256
        deadline = time.monotonic() + 20
        while coordinator.server.coordinator.sweep(sweep_id).nodes[gone].state is not sw.NodeState.DCGM_RESUMED:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        stored.unlink()
        agents[kept].finish(sweep_id, digests[kept])
        done = final(client, sweep_id)
    assert done.state == pb.SWEEP_STATE_PARTIAL, done.error
    nodes = {n.node: n for n in done.nodes}
    assert list(done.missing) == [gone] and nodes[kept].state == pb.NODE_STATE_ANALYSED
    assert nodes[gone].state == pb.NODE_STATE_FAILED
    assert nodes[gone].reason == (f"its digest {gone}.digest.parquet ({sha256[:12]}) is no longer in the coordinator's "
                                  "artifact store")
    for agent in agents.values():
        agent.close()


def test_one_digest_sent_by_two_nodes_fails_the_sweep_naming_both(coordinator, wire, digests) -> None:
    """One file (one sha256) from two nodes, as two agents reading one spool send: the error
    named the trace's file twice, and, the store keeping the file once, one node for both."""
    payload = next(iter(digests.values()))
    agents = [wire.FakeAgent(coordinator, name) for name in ("gpu-a", "gpu-b")]
    with SweepClient(coordinator.address) as client:
        sweep_id = client.start(nodes=["gpu-a", "gpu-b"], duration_s=1.0, backend="sim").sweep_id
        for agent in agents:
            assert started_capture(agent).sweep_id == sweep_id
            agent.finish(sweep_id, payload)
        done = final(client, sweep_id)
    assert done.state == pb.SWEEP_STATE_FAILED
    assert done.error.startswith("analysis failed: node gpu-b (digest of synthetic/rank0): rank 0 is also claimed "
                                 "by node gpu-a (digest of synthetic/rank0)"), done.error
    for agent in agents:
        agent.close()


def test_a_second_agent_under_one_node_name_takes_over_and_the_first_is_told(coordinator, wire, digests) -> None:
    node = next(iter(digests))
    first = wire.FakeAgent(coordinator, node)
    second = wire.FakeAgent(coordinator, node)
    first.reader.join(20)
    assert first.call.code() == grpc.StatusCode.ALREADY_EXISTS
    assert first.call.details().startswith(f"node {node}: a newer agent session from ipv4:127.0.0.1:")
    assert first.call.details().endswith("took over; give each agent its own --name")
    # the newer session is the node's: it gets the captures
    with SweepClient(coordinator.address) as client:
        sweep = client.start(nodes=[node], duration_s=1.0, backend="sim")
    assert started_capture(second).sweep_id == sweep.sweep_id
    second.close()


def test_agent_sessions_take_at_most_half_the_workers_so_commands_and_uploads_get_through(tmp_path, wire,
                                                                                          caplog) -> None:
    running = wire.start(tmp_path / "data", max_workers=6)  # three sessions at most
    try:
        agents = [wire.FakeAgent(running, f"node-{i}") for i in range(3)]
        reply = running.register("node-3")
        refused = running.agents.Session(iter([pb.AgentEvent(hello=pb.Hello(agent_id=reply.agent_id,
                                                                            session_token=reply.session_token))]))
        with pytest.raises(grpc.RpcError) as caught:
            next(refused)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.details() == ("coordinator at its limit of 3 agent sessions (half its RPC workers): "
                                          "its operator can raise RANKSCOPE_MAX_WORKERS")
        assert "node node-3 refused: coordinator at its limit of 3 agent sessions" in caplog.text
        # Refused nodes retry every few seconds each: the log names them once a minute, not per try.
        for name in ("node-3", "node-4", "node-5", "node-6"):
            again = running.register(name)
            with pytest.raises(grpc.RpcError):
                next(running.agents.Session(iter([pb.AgentEvent(hello=pb.Hello(
                    agent_id=again.agent_id, session_token=again.session_token))])))
        refusals = [r.getMessage() for r in caplog.records if "refused: coordinator at its limit" in r.getMessage()]
        assert len(refusals) == 1
        running.server.coordinator._refused_logged -= coordinator_mod.REFUSALS_LOG_S  # a minute on
        with pytest.raises(grpc.RpcError):
            next(running.agents.Session(iter([pb.AgentEvent(hello=pb.Hello(agent_id=reply.agent_id,
                                                                            session_token=reply.session_token))])))
        refusals = [r.getMessage() for r in caplog.records if "refused: coordinator at its limit" in r.getMessage()]
        assert refusals[1].startswith("4 nodes (node-3, node-4, node-5, ...) refused: coordinator at its limit")
        with SweepClient(running.address) as client:  # a user's command still finds a worker
            assert client.sweeps() == []
        again = wire.FakeAgent(running, "node-0")  # a known node reconnecting replaces its session
        agents[0].reader.join(20)
        for agent in [again, *agents[1:]]:
            agent.close()
    finally:
        wire.stop(running)


def test_the_report_of_a_job_of_thousands_of_ranks_comes_over_the_wire(coordinator, wire, digests) -> None:
    agents = [wire.FakeAgent(coordinator, name) for name in digests]
    with SweepClient(coordinator.address) as client:
        sweep = client.start(everything=True, duration_s=0.5, backend="sim")
        for agent in agents:
            started_capture(agent)
            agent.finish(sweep.sweep_id, digests[agent.node])
        assert final(client, sweep.sweep_id).state == pb.SWEEP_STATE_ANALYSED
        stored = Path(client.report(sweep.sweep_id).path)
        report = json.loads(stored.read_text())
        report["ranks"] = report["ranks"] * 2000  # 4000 ranks' worth: past gRPC's default 4 MiB
        stored.write_text(json.dumps(report, indent=1))
        assert stored.stat().st_size > 4 << 20
        assert client.report(sweep.sweep_id).report_json == stored.read_text()
    for agent in agents:
        agent.close()


def test_a_watch_sends_every_node_first_and_last_and_between_only_the_one_that_changed(coordinator, wire,
                                                                                        digests) -> None:
    # With every node in every event, a fleet's sweep cost the square of its size (1024 nodes:
    # 400 s of coordinator time; bench/sweep_scale.py).
    agents = [wire.FakeAgent(coordinator, name) for name in digests]
    with SweepClient(coordinator.address) as client:
        sweep = client.start(everything=True, duration_s=0.5, backend="sim")
        events = client.watch(sweep.sweep_id)
        first = next(events)
        for agent in agents:
            started_capture(agent)
            agent.finish(sweep.sweep_id, digests[agent.node])
        rest = list(events)
    assert sorted(n.node for n in first.sweep.nodes) == sorted(digests)
    states = [first.sweep.state] + [e.sweep.state for e in rest]
    # a node's change alone: that node; one that moved the sweep on (to analysing): all
    alone = [e for e, before in zip(rest, states) if e.node and e.sweep.state == before]
    assert len(alone) >= 2 * 6 and all([n.node for n in e.sweep.nodes] == [e.node] for e in alone)
    assert rest[-1].final and sorted(n.node for n in rest[-1].sweep.nodes) == sorted(digests)
    assert {n.state for n in rest[-1].sweep.nodes} == {pb.NODE_STATE_ANALYSED}
    for agent in agents:
        agent.close()


def test_a_named_node_whose_agent_is_away_is_said_to_be_so(coordinator, wire, digests) -> None:
    away, here = list(digests)
    gone = wire.FakeAgent(coordinator, away)
    gone.close()
    present = wire.FakeAgent(coordinator, here)
    deadline = time.monotonic() + 20
    while away in coordinator.server.coordinator.registry.connected() and time.monotonic() < deadline:
        time.sleep(0.05)
    with SweepClient(coordinator.address) as client:
        sweep = client.start(nodes=[away, here], duration_s=1.0, backend="sim")
    detail = {n.node: n.detail for n in sweep.nodes}
    assert detail == {away: "agent not connected: it gets the capture if it connects in time", here: ""}
    present.close()



def test_a_clock_sample_the_full_disk_cannot_store_leaves_the_session_up(coordinator, wire, monkeypatch) -> None:
    from rankscope.coordinator.artifacts import StorageFull

    coord = coordinator.server.coordinator
    saved, pongs = coord.store.save_agent, []

    def full_for_samples(agent):  # registering still works; the pong's clock sample finds no room
        if agent.clock_offset_ns is None:
            return saved(agent)
        pongs.append(agent.node)
        raise StorageFull("coordinator storage is full (No space left on device): free space under /data")

    monkeypatch.setattr(coord.store, "save_agent", full_for_samples)
    agent = wire.FakeAgent(coordinator, "node-a")
    deadline = time.monotonic() + 20
    while not pongs and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pongs == ["node-a"]
    with SweepClient(coordinator.address) as client:
        sweep = client.start(nodes=["node-a"], duration_s=1.0, backend="sim")
    assert agent.next_command(timeout=10).start.sweep_id == sweep.sweep_id  # the same session, still up
    agent.close()

def test_a_report_the_full_disk_cannot_hold_fails_the_sweep_in_one_line(coordinator, wire, digests, monkeypatch,
                                                                          caplog) -> None:
    """Not 'analysis crashed: OSError' with a traceback: the disk is full, which the operator mends."""
    import errno

    from rankscope.coordinator import reports

    reports_dir = coordinator.server.coordinator.config.reports_dir
    write_text = reports.atomic.write_text

    def full(path, text):  # the report alone: the uploads before it are stored
        if Path(path).parent == reports_dir:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write_text(path, text)

    monkeypatch.setattr(reports.atomic, "write_text", full)
    name = next(iter(digests))
    agent = wire.FakeAgent(coordinator, name)
    with SweepClient(coordinator.address) as client:
        sweep_id = client.start(nodes=[name], duration_s=1.0, backend="sim").sweep_id
        agent.finish(started_capture(agent).sweep_id, digests[name])
        done = final(client, sweep_id)
    assert done.state == pb.SWEEP_STATE_FAILED
    assert done.error == (f"analysis failed: coordinator storage is full (No space left on device): "
                          f"free space under {reports_dir}")
    assert not any(r.exc_info for r in caplog.records)
    agent.close()


@pytest.mark.timeout(60)  # without the ticker the watch would wait for ever
def test_a_full_disk_mid_sweep_keeps_it_going_in_memory_and_saves_it_once_there_is_room(
        coordinator, wire, digests, monkeypatch, caplog) -> None:
    """Statuses, deadlines and watchers go on while state writes fail; the ticker (which a
    failed write used to kill, and with it every sweep's deadline) saves the sweep later."""
    from rankscope.coordinator.artifacts import StorageFull

    coord = coordinator.server.coordinator
    monkeypatch.setattr(coordinator_mod, "SAVE_RETRY_S", 0.1)
    talking, silent = (wire.FakeAgent(coordinator, name) for name in digests)
    with SweepClient(coordinator.address) as client:
        sweep = client.start(everything=True, duration_s=0.5, backend="sim", timeout_s=2.0)
        started_capture(silent)
        sweep_id = started_capture(talking).sweep_id
        saved = coord.store.save_sweep

        def full(*args, **kwargs):
            raise StorageFull("coordinator storage is full (No space left on device): free space under /data")

        monkeypatch.setattr(coord.store, "save_sweep", full)
        talking.finish(sweep_id, digests[talking.node])
        done = final(client, sweep.sweep_id)  # the silent node timed out: the ticker is alive
        assert done.state == pb.SWEEP_STATE_PARTIAL and list(done.missing) == [silent.node]
        assert client.sweeps()[0].state == pb.SWEEP_STATE_PARTIAL  # the listing shows it as it is
        assert coord.store.sweeps()[0].state.value == "running"  # while the store is behind
        monkeypatch.setattr(coord.store, "save_sweep", saved)  # room again
        deadline = time.monotonic() + 10
        while coord._unsaved and time.monotonic() < deadline:
            time.sleep(0.05)
        assert coord.store.sweeps()[0].state.value == "partial"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"sweep {sweep_id}: state kept in memory until it can be saved: coordinator storage is full "
                      "(No space left on device): free space under /data"]
    assert f"sweep {sweep_id}: state saved again" in caplog.text
    assert sweep_id not in coord._active and not coord._unsaved
    talking.close()
    silent.close()


def _until_disconnected(coordinator, node: str) -> None:
    deadline = time.monotonic() + 20
    while node in coordinator.server.coordinator.registry.connected() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert node not in coordinator.server.coordinator.registry.connected()


def test_a_labelled_node_whose_agent_is_down_is_named_missing_not_left_out(coordinator, wire, digests) -> None:
    """A scheduled health sweep by label over a fleet where one agent is down: that node is
    in the sweep, failed at once and named in the report, not left out unseen, so the sweep
    does not pass as if the fleet were whole."""
    down, up = list(digests)
    gone = wire.FakeAgent(coordinator, down, pool="train")
    gone.close()
    present = wire.FakeAgent(coordinator, up, pool="train")
    wire.FakeAgent(coordinator, "elsewhere", pool="inference").close()
    _until_disconnected(coordinator, down)
    _until_disconnected(coordinator, "elsewhere")
    with SweepClient(coordinator.address) as client:
        for targets in ({"labels": {"pool": "train"}}, {"everything": True}):
            sweep = client.start(**targets, duration_s=0.5, backend="sim")
            nodes = {n.node: (n.state, n.reason) for n in sweep.nodes}
            reason = "agent not connected when the sweep started"
            expected = {down: (pb.NODE_STATE_FAILED, reason), up: (pb.NODE_STATE_PENDING, "")}
            if "everything" in targets:
                expected["elsewhere"] = (pb.NODE_STATE_FAILED, reason)
            assert nodes == expected
            present.finish(started_capture(present).sweep_id, digests[up])
            done = final(client, sweep.sweep_id)
            assert done.state == pb.SWEEP_STATE_PARTIAL
            assert sorted(done.missing) == sorted(n for n in expected if n != up)
            report = json.loads(client.report(sweep.sweep_id).report_json)
            assert f"node {down} is missing from this report: {reason}" in report["warnings"]
        present.close()
        _until_disconnected(coordinator, up)
        with pytest.raises(InputError, match=rf"no connected agent has labels pool=train \(not connected: "
                                             rf"{down}, {up}\)$"):
            client.start(labels={"pool": "train"}, duration_s=1.0, backend="sim")


def test_a_sweep_by_label_right_after_a_restart_waits_for_the_agents_on_their_way_back(tmp_path, wire,
                                                                                       digests) -> None:
    """After a coordinator restart its agents come back within their back-off (up to 30 s): a
    scheduled sweep by label started meanwhile failed them at once, as if down, and its report
    went out without them. One down before the restart still fails at once."""
    back, late = sorted(digests)
    running = wire.start(tmp_path / "data")
    for agent in [wire.FakeAgent(running, node, pool="train") for node in (back, late)]:
        agent.close()
    wire.stop(running)
    store = Store(tmp_path / "data" / "state.sqlite")
    hour_ago = time.time_ns() - 3600 * 10**9
    store.save_agent(AgentRecord("agent-gone", "gone", "gone", "tok", hour_ago, labels={"pool": "train"},
                                 last_seen_ns=hour_ago))
    store.close()

    running = wire.start(tmp_path / "data")
    try:
        first = wire.FakeAgent(running, back, pool="train")
        with SweepClient(running.address) as client:
            sweep = client.start(labels={"pool": "train"}, duration_s=0.5, backend="sim")
            nodes = {n.node: (n.state, n.detail or n.reason) for n in sweep.nodes}
            assert nodes == {
                back: (pb.NODE_STATE_PENDING, ""),
                late: (pb.NODE_STATE_PENDING, "agent reconnecting after the coordinator's restart: it gets the capture "
                                              "if it connects in time"),
                "gone": (pb.NODE_STATE_FAILED, "agent not connected when the sweep started"),
            }
            second = wire.FakeAgent(running, late, pool="train")
            for agent in (first, second):
                agent.finish(started_capture(agent).sweep_id, digests[agent.node])
            assert list(final(client, sweep.sweep_id).missing) == ["gone"]
        for agent in (first, second):
            agent.close()
    finally:
        wire.stop(running)


def test_a_sweep_by_label_or_all_before_any_agent_is_back_from_a_restart_waits_for_them(tmp_path, wire,
                                                                                        digests) -> None:
    # found in session 28: with none back yet, a scheduled sweep was refused outright ("no
    # connected agent has labels pool=train") though every agent was on its way back
    nodes = sorted(digests)
    running = wire.start(tmp_path / "data")
    for agent in [wire.FakeAgent(running, node, pool="train") for node in nodes]:
        agent.close()
    wire.stop(running)

    running = wire.start(tmp_path / "data")
    try:
        with SweepClient(running.address) as client:
            for targets in ({"labels": {"pool": "train"}}, {"everything": True}):
                sweep = client.start(**targets, duration_s=0.5, backend="sim")
                assert {n.node: (n.state, n.detail) for n in sweep.nodes} == {node: (
                    pb.NODE_STATE_PENDING, "agent reconnecting after the coordinator's restart: it gets the capture "
                                           "if it connects in time") for node in nodes}
                agents = [wire.FakeAgent(running, node, pool="train") for node in nodes]
                for agent in agents:
                    agent.finish(started_capture(agent).sweep_id, digests[agent.node])
                done = final(client, sweep.sweep_id)
                assert (done.state, list(done.missing)) == (pb.SWEEP_STATE_ANALYSED, [])
                for agent in agents:
                    agent.close()
    finally:
        wire.stop(running)


def test_a_node_whose_agent_is_away_does_not_choose_or_refuse_the_backend_by_label_or_all(coordinator, wire,
                                                                                          digests) -> None:
    # found by review: `capture --all` naming no backend was refused ("the nodes' default
    # capture backends differ") for a node whose agent was down, which fails at once anyway
    down, up = list(digests)
    coordinator.agents.Register(pb.RegisterRequest(node=down, labels={"pool": "train"}, backends=["torch"]), timeout=10)
    present = wire.FakeAgent(coordinator, up, pool="train")
    with SweepClient(coordinator.address) as client:
        for targets, backend in (({"everything": True}, ""), ({"labels": {"pool": "train"}}, "sim")):
            sweep = client.start(**targets, duration_s=0.5, backend=backend)
            assert sweep.backend == (backend or "nsys")
            assert {n.node: n.state for n in sweep.nodes} == {down: pb.NODE_STATE_FAILED, up: pb.NODE_STATE_PENDING}
            present.finish(started_capture(present).sweep_id, digests[up])
            assert final(client, sweep.sweep_id).state == pb.SWEEP_STATE_PARTIAL
        with pytest.raises(InputError, match=r"default capture backends differ"):  # named, it may still come
            client.start(nodes=[down, up], duration_s=0.5)
    present.close()


def test_a_labelled_node_away_past_the_keep_is_taken_as_gone_from_the_fleet(coordinator, wire, digests,
                                                                             monkeypatch) -> None:
    """A node decommissioned, or replaced under a new name as autoscaled ones are, must not
    make every later health sweep partial: away longer than AWAY_KEEP_S, it is left out (by
    name it is still chosen). How long it has been away counts from its disconnect."""
    down, up = list(digests)
    gone = wire.FakeAgent(coordinator, down, pool="train")
    present = wire.FakeAgent(coordinator, up, pool="train")
    running = coordinator.server.coordinator
    before = running.clock()
    gone.close()
    _until_disconnected(coordinator, down)
    assert running.store.agent_by_node(down).last_seen_ns >= before  # its disconnect, not its registration
    monkeypatch.setattr(coordinator_mod, "AWAY_KEEP_S", 0.3)
    time.sleep(0.4)
    with SweepClient(coordinator.address) as client:
        sweep = client.start(labels={"pool": "train"}, duration_s=0.5, backend="sim")
        assert [n.node for n in sweep.nodes] == [up]
        present.finish(started_capture(present).sweep_id, digests[up])
        assert final(client, sweep.sweep_id).state == pb.SWEEP_STATE_ANALYSED
        named = client.start(nodes=[down, up], duration_s=0.5, backend="sim")
        assert sorted(n.node for n in named.nodes) == sorted([down, up])
    present.close()


def test_a_stop_with_streams_left_open_waits_out_its_grace_and_no_handler_outlives_the_state(
        tmp_path, wire, monkeypatch, caplog) -> None:
    """Streams the coordinator cannot end itself (a session that never says Hello, an upload
    whose agent went quiet) hold a stop for its grace, no longer. gRPC's stop then returns
    once it has cancelled the calls, not once their handlers have returned: the upload's ran
    on into the closed store ('Cannot operate on a closed database', a traceback in the log)."""
    running = wire.start(tmp_path / "data", grace_s=1.0)
    coordinator = running.server.coordinator
    token = running.register("node-a").session_token
    quiet = threading.Event()

    def held(*messages):
        yield from messages
        quiet.wait()

    data = os.urandom(200_000)
    head = wire.header(data, node="node-a", token=token, sweep_id=wire.sweep_on(running, "node-a"))
    upload = running.agents.Upload.future(held(*wire.chunks(head, data[:100_000])))
    session = running.agents.Session(held())
    while not running.query("u1", token).committed_offset:  # the upload is under way
        time.sleep(0.01)
    ended, on_a_closed_state = coordinator._ended, []

    def slow_ended(sweep_id: str) -> bool:  # the upload's way out, slowed: the stop closes nothing under it
        time.sleep(0.3)
        on_a_closed_state.append(coordinator._closed)
        return ended(sweep_id)

    monkeypatch.setattr(coordinator, "_ended", slow_ended)
    began = time.monotonic()
    running.server.stop()
    assert time.monotonic() - began < 10
    quiet.set()
    running.channel.close()
    assert upload.exception(timeout=10) is not None and session.code() is not None
    deadline = time.monotonic() + 10
    while not on_a_closed_state and time.monotonic() < deadline:
        time.sleep(0.01)
    assert on_a_closed_state == [False]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
