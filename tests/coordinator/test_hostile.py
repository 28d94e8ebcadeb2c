"""Hostile uploads are refused with a clear status, and nothing of them is stored."""

from __future__ import annotations

import hashlib
import os
import time

import grpc
import pytest

from rankscope.errors import quoted
from rankscope.proto.v1 import rankscope_pb2 as pb

DATA = os.urandom(300_000)


def refused(coordinator, messages) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.agents.Upload(iter(list(messages)), timeout=10)
    return caught.value


@pytest.fixture
def token(coordinator) -> str:
    return coordinator.register("node-a").session_token


@pytest.fixture
def sweep_id(coordinator, wire, token) -> str:
    """A running sweep of node-a's: the coordinator refuses uploads into one it never started."""
    return wire.sweep_on(coordinator, "node-a")


def test_first_chunk_at_a_wrong_offset(coordinator, wire, token, sweep_id) -> None:
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id)
    error = refused(coordinator, [pb.UploadChunk(header=head, offset=4096, data=DATA[4096:8192])])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "offset 4096, committed offset is 0" in error.details()
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []
    assert not coordinator.query("u1", token).known


def test_a_skipped_chunk_leaves_the_committed_offset_where_it_was(coordinator, wire, token, sweep_id) -> None:
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id)
    messages = list(wire.chunks(head, DATA, size=1000))
    del messages[3]  # the chunk at offset 2000 never arrives
    error = refused(coordinator, messages)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "offset 3000, committed offset is 2000" in error.details()
    status = coordinator.query("u1", token)
    assert status.committed_offset == 2000 and not status.complete
    assert [p.name for p in wire.stored_files(coordinator.data_dir)] == ["u1.json", "u1.part"]


def test_checksum_mismatch(coordinator, wire, token, sweep_id) -> None:
    wrong = hashlib.sha256(b"something else").hexdigest()
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, sha256=wrong)
    error = refused(coordinator, wire.chunks(head, DATA))
    assert error.code() == grpc.StatusCode.DATA_LOSS
    assert f"declared {wrong}" in error.details()
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []
    assert not coordinator.query("u1", token).known


@pytest.mark.parametrize("name", ["../escape.parquet", "a/b.parquet", "..", "/etc/passwd", "x..y", ""])
def test_unsafe_artifact_name(coordinator, wire, token, sweep_id, name: str) -> None:
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, name=name)
    error = refused(coordinator, wire.chunks(head, DATA))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a plain file name" in error.details()
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_unsafe_upload_id(coordinator, wire, token, sweep_id) -> None:
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, upload_id="../u")
    error = refused(coordinator, wire.chunks(head, DATA))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_an_upload_id_too_long_for_a_file_name_is_refused_and_unknown(coordinator, wire, token, sweep_id) -> None:
    long_id = "u" * 300  # its part file's name would be over the file system's 255 bytes
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, upload_id=long_id)
    error = refused(coordinator, wire.chunks(head, DATA))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "is 300 characters, over the limit of 200" in error.details()
    assert not coordinator.query(long_id, token).known
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_an_artifact_name_too_long_for_a_fetched_file_is_refused(coordinator, wire, token, sweep_id) -> None:
    """Seen with a hostile client: a 300-character name was stored, then `rankscope fetch` of
    its sweep failed on it ("File name too long")."""
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, name="r" * 300)
    error = refused(coordinator, wire.chunks(head, DATA))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "artifact name 'rrr" in error.details() and "is 300 characters, over the limit of 240" in error.details()
    assert wire.stored_files(coordinator.data_dir) == [] and not coordinator.query("u1", token).known


def test_upload_over_the_size_limit(coordinator, wire, token, sweep_id) -> None:
    big = os.urandom((1 << 20) + 1)  # the fixture's limit is 1 MiB
    error = refused(coordinator, wire.chunks(wire.header(big, node="node-a", token=token, sweep_id=sweep_id), big))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "over the limit of 1048576 bytes" in error.details()
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_more_bytes_than_declared(coordinator, wire, token, sweep_id) -> None:
    head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, size=1000,
                       sha256=hashlib.sha256(DATA[:1000]).hexdigest())
    error = refused(coordinator, [pb.UploadChunk(header=head, offset=0), pb.UploadChunk(offset=0, data=DATA[:4096])])
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "past the declared size 1000" in error.details()
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_upload_without_a_valid_token_or_for_another_node(coordinator, wire, token, sweep_id) -> None:
    error = refused(coordinator, wire.chunks(wire.header(DATA, node="node-a", token="forged", sweep_id=sweep_id), DATA))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    coordinator.register("node-b")
    error = refused(coordinator, wire.chunks(wire.header(DATA, node="node-b", token=token, sweep_id=sweep_id), DATA))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_an_upload_under_another_nodes_upload_id_is_refused_naming_nothing_of_it(coordinator, wire, token,
                                                                              sweep_id) -> None:
    partial = wire.header(DATA[:200_000], node="node-a", token=token, sweep_id=sweep_id, name="secret.parquet")
    assert not coordinator.agents.Upload(iter(list(wire.chunks(partial, DATA[:200_000]))[:3]), timeout=10).complete
    other = coordinator.register("node-b").session_token
    error = refused(coordinator, wire.chunks(wire.header(DATA, node="node-b", token=other, sweep_id=sweep_id), DATA))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error.details() == "upload u1: not an upload of node 'node-b'"
    assert coordinator.query("u1", token).committed_offset == 2 * (64 << 10)  # node-a's upload is untouched


@pytest.mark.parametrize("unknown", ["20261207-140000-beef", "", "x" * 300])
def test_an_upload_into_a_sweep_the_coordinator_never_started_is_refused(coordinator, wire, token, unknown) -> None:
    """Seen with a bare-stubs client: a registered agent's upload under a made-up sweep id was
    stored and recorded; no sweep lists it or removes it, so uploads so could fill the disk."""
    error = refused(coordinator, wire.chunks(wire.header(DATA, node="node-a", token=token, sweep_id=unknown), DATA))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # final for the agent's uploader
    assert error.details() == f"upload u1: this coordinator has no sweep {quoted(unknown)}"
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []
    assert not coordinator.query("u1", token).known


def test_first_message_without_a_header(coordinator, wire) -> None:
    error = refused(coordinator, [pb.UploadChunk(offset=0, data=DATA[:10])])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_a_header_after_the_first_message_is_refused_not_passed_over(coordinator, wire, token, sweep_id) -> None:
    # Its bytes were written into the first message's upload, whatever upload it named.
    first, second = (wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id, upload_id=u)
                     for u in ("u1", "u2"))
    error = refused(coordinator, [pb.UploadChunk(header=first, offset=0, data=DATA[:64 << 10]),
                                  pb.UploadChunk(header=second, offset=64 << 10, data=DATA[64 << 10:128 << 10])])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "upload u1: only the first message carries a header"
    assert coordinator.query("u1", token).committed_offset == 64 << 10  # what came before stays, to resume from
    assert coordinator.query("u2", token).committed_offset == 0


# QueryUpload: an upload's offset, size and sha256 are for the agent of its node only.

def query_refused(coordinator, upload_id: str, token: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.query(upload_id, token)
    return caught.value


def test_a_query_without_a_valid_token_is_refused(coordinator, wire, token, sweep_id) -> None:
    partial = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id)
    assert not coordinator.agents.Upload(iter(list(wire.chunks(partial, DATA))[:3]), timeout=10).complete
    for upload_id in ("u1", "never"):  # alike whether the upload exists or not
        for forged in ("", "forged"):
            error = query_refused(coordinator, upload_id, forged)
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
            assert error.details() == f"upload {upload_id}: unknown session token: register first"


def test_a_query_for_another_nodes_upload_is_refused_naming_nothing_of_it(coordinator, wire, token, sweep_id) -> None:
    done = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id)
    assert coordinator.agents.Upload(wire.chunks(done, DATA), timeout=10).complete
    partial = wire.header(DATA[:200_000], node="node-a", token=token, sweep_id=sweep_id, upload_id="u2")
    assert not coordinator.agents.Upload(iter(list(wire.chunks(partial, DATA[:200_000]))[:3]), timeout=10).complete
    other = coordinator.register("node-b").session_token
    for head in (done, partial):
        error = query_refused(coordinator, head.upload_id, other)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error.details() == f"upload {head.upload_id}: not an upload of node 'node-b'"
    assert not coordinator.query("never", other).known
    mine = coordinator.query("u1", token), coordinator.query("u2", token)
    assert [(s.complete, s.committed_offset, s.size, s.sha256) for s in mine] == [
        (True, len(DATA), len(DATA), done.sha256), (False, 2 * (64 << 10), 200_000, partial.sha256)]


# Enum values this coordinator has no name for (proto3 enums are open: any int32 parses).

def test_an_upload_of_an_unknown_kind_is_refused_with_the_kinds_known(coordinator, wire, token, sweep_id) -> None:
    for kind in (99, -1):
        head = wire.header(DATA, node="node-a", token=token, sweep_id=sweep_id)
        head.kind = kind
        error = refused(coordinator, wire.chunks(head, DATA))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == f"ArtifactKind {kind} is none this rankscope knows (digest, raw)"
    assert wire.stored_files(coordinator.data_dir) == []
    assert wire.recorded_uploads(coordinator.data_dir) == []


def test_listing_artifacts_of_an_unknown_kind_is_refused(coordinator) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.sweeps.ListArtifacts(pb.ListArtifactsRequest(sweep_id="s1", kinds=[99]), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ArtifactKind 99 is none this rankscope knows" in caught.value.details()


@pytest.mark.parametrize("fields", [
    {"state": 99},
    {"state": pb.NODE_STATE_PAUSING_DCGM, "dcgm": 99},
    {"state": pb.NODE_STATE_UPLOADING, "artifacts": [pb.ArtifactRef(name="a", sha256="0" * 64, size=1, kind=-1)]},
], ids=["state", "dcgm", "artifact-kind"])
def test_a_status_with_an_unknown_enum_value_is_ignored_and_the_session_goes_on(coordinator, wire, digests,
                                                                                  fields, caplog) -> None:
    agent = wire.FakeAgent(coordinator, "node000")
    sweep = coordinator.sweeps.StartSweep(pb.StartSweepRequest(
        targets=pb.Targets(nodes=["node000"]), duration_s=0.5, backend="sim"), timeout=10)
    assert agent.next_command().start.sweep_id == sweep.sweep_id
    agent.status(sweep.sweep_id, **fields)
    agent.finish(sweep.sweep_id, digests["node000"])  # on the same session
    events = list(coordinator.sweeps.WatchSweep(pb.WatchSweepRequest(sweep_id=sweep.sweep_id), timeout=30))
    assert events[-1].final and events[-1].sweep.state == pb.SWEEP_STATE_ANALYSED
    assert "is none this rankscope knows" in caplog.text and "Traceback" not in caplog.text
    agent.close()


# StartSweep's numbers come off the wire too.

_OVER_LIMIT = "is over the limit of 86400s (a node is in one capture at a time: the sweep's nodes are held until it ends)"
# found by review: any timeout <= 0 was read as unset, so -1 ran with the default deadline
_NEGATIVE = ": it must be positive (or unset, for the capture window plus the coordinator's node timeout)"


@pytest.mark.parametrize("timeout, problem", [
    *((t, f"s {_OVER_LIMIT}") for t in (86_400.5, 1e10, 1e308, 1.7976931348623157e308)),
    *((t, f"s{_NEGATIVE}") for t in (-1.0, -0.5, -86_400.0, -1e308)),
])
def test_a_sweep_timeout_over_the_limit_or_negative_is_refused(coordinator, wire, timeout: float, problem: str) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["node-a"]), duration_s=1,
                                                           backend="sim", timeout_s=timeout), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == f"timeout {timeout:g}{problem}"
    assert not coordinator.sweeps.ListSweeps(pb.ListSweepsRequest(), timeout=10).sweeps
    agent.close()


def test_a_node_timeout_of_a_day_gives_a_sweep_without_a_timeout_the_longest_there_is(tmp_path, wire) -> None:
    # a day is as long as a node timeout may be: the window on top of it made every sweep
    # without a timeout of its own refused ("timeout 86401s is over the limit of 86400s")
    running = wire.start(tmp_path / "data", node_timeout_s=86_400.0)
    try:
        agent = wire.FakeAgent(running, "node-a")
        sweep = running.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["node-a"]), duration_s=1,
                                                               backend="sim"), timeout=10)
        assert sweep.timeout_s == 86_400
        agent.close()
    finally:
        wire.stop(running)


# A refusal's message must reach the client: over 16 KiB of trailer, gRPC drops it.

def test_a_refusal_echoing_a_huge_value_is_cut_to_reach_the_client(coordinator, token) -> None:
    coordinator.register("node-b")
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["x" * 100_000]), duration_s=1),
                                      timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details().startswith("no agent registered as xxxx")
    # under the client's 8 KiB soft limit on all metadata, with room for the trailer's other
    # headers: at 8 KiB itself, a share of such statuses were dropped (seen in a full run)
    assert caught.value.details().endswith(" characters, cut)") and len(caught.value.details()) < (8 << 10) - 1024
    error = query_refused(coordinator, "\u00fc" * 100_000, "forged")  # percent-encoded: 6 bytes each
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error.details().startswith("upload \u00fc\u00fc") and error.details().endswith(" characters, cut)")


def test_an_unknown_target_in_a_large_fleet_names_a_few_known_nodes(coordinator) -> None:
    for i in range(1500):  # the whole fleet's names would be over 16 KiB
        coordinator.agents.Register(pb.RegisterRequest(node=f"gpu-node-{i:05d}"), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["gpu-node-x"]), duration_s=1),
                                      timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == ("no agent registered as gpu-node-x (known: gpu-node-00000, gpu-node-00001, "
                                      "gpu-node-00002, gpu-node-00003, gpu-node-00004 and 1495 more)")


def test_a_backend_that_is_no_name_is_refused(coordinator, wire) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")  # registered no backends: it would take any
    for backend, shown in (("b" * 1_000_000, "'" + "b" * 64 + "'..."), ("../../x", "'../../x'"), ("\x00", "'\\x00'")):
        with pytest.raises(grpc.RpcError) as caught:
            coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["node-a"]), duration_s=1,
                                                               backend=backend), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == (f"capture backend {shown} is not a backend's name (up to 64 letters, "
                                          "digits, '._-': sim, nsys, torch)")
    assert not coordinator.sweeps.ListSweeps(pb.ListSweepsRequest(), timeout=10).sweeps
    agent.close()


def test_a_cancel_reason_over_the_limit_is_refused_and_the_sweep_runs_on(coordinator, wire) -> None:
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep = coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["node-a"]), duration_s=1,
                                                               backend="sim"), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:  # each node's record would hold it
        coordinator.sweeps.CancelSweep(pb.CancelSweepRequest(sweep_id=sweep.sweep_id, reason="r" * 1001), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == ("a cancel's reason is 1001 characters, over the limit of 1000 (it is every "
                                      "stopped node's reason)")
    [listed] = coordinator.sweeps.ListSweeps(pb.ListSweepsRequest(), timeout=10).sweeps
    assert listed.state == pb.SWEEP_STATE_RUNNING
    stopped = coordinator.sweeps.CancelSweep(pb.CancelSweepRequest(sweep_id=sweep.sweep_id, reason="r" * 1000),
                                             timeout=10)
    assert stopped.nodes[0].reason == "r" * 1000
    agent.close()


@pytest.mark.parametrize("name", [".", "..", "..."])
def test_a_node_name_of_only_dots_is_refused_at_registration(coordinator, name: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:  # `fetch` would refuse to file its artifacts under DIR/<node>/
        coordinator.register(name)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == f"node name {name!r}: a node name of only dots ('.', '..') would name a folder, not a node"


def test_an_agents_long_words_on_its_node_are_cut_not_stored_whole(coordinator, wire) -> None:
    """Detail, reason, DCGM detail and notes of any length (4 MiB a status) were stored and
    sent in every listing of the sweep; a few such statuses would make ListSweeps too large."""
    agent = wire.FakeAgent(coordinator, "node-a")
    sweep = coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["node-a"]), duration_s=1,
                                                               backend="sim"), timeout=10)
    agent.next_command()
    agent.status(sweep.sweep_id, pb.NODE_STATE_FAILED, detail="d" * 100_000, reason="r" * 100_000,
                 dcgm=pb.DCGM_OUTCOME_RESUMED, dcgm_detail="g" * 100_000, notes=["n" * 2000] * 100)
    for _ in range(100):
        [listed] = coordinator.sweeps.ListSweeps(pb.ListSweepsRequest(), timeout=10).sweeps
        if listed.nodes[0].state == pb.NODE_STATE_FAILED:
            break
        time.sleep(0.05)
    node = listed.nodes[0]
    assert node.state == pb.NODE_STATE_FAILED
    assert node.reason == "r" * 999 + "…" and len(node.dcgm_detail) == 1000
    [stored] = coordinator.server.coordinator.store.sweeps()
    notes = stored.nodes["node-a"].notes
    assert len(notes) == 32 and all(len(n) == 1000 for n in notes)
    agent.close()


@pytest.mark.parametrize("options, said", [
    ({f"k{i}": "v" for i in range(65)}, "65 capture options, over the limit of 64"),
    ({"k" * 100_000: "v"}, "capture option '" + "k" * 64 + "'...: its key must be a name"),
    ({"sim.nodes": "1" * 4097}, "capture option 'sim.nodes': its key must be a name"),
    ({"a b": "v"}, "capture option 'a b': its key must be a name"),
], ids=["many", "long key", "long value", "no name"])
def test_capture_options_past_what_a_node_can_take_are_refused(coordinator, wire, options, said: str) -> None:
    """They went to every node in StartCapture (again on each reconnect): a 1 MB key or 50,000
    keys were taken, past an agent's 4 MiB receive limit."""
    agent = wire.FakeAgent(coordinator, "node-a")
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.sweeps.StartSweep(pb.StartSweepRequest(targets=pb.Targets(nodes=["node-a"]), duration_s=1,
                                                           backend="sim", options=options), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(said)
    assert not coordinator.sweeps.ListSweeps(pb.ListSweepsRequest(), timeout=10).sweeps
    agent.close()


@pytest.mark.parametrize("request_fields, said", [
    ({"hostname": "h" * 3_000_000}, "'hhhh"),
    ({"labels": {f"k{i}": "v" for i in range(2000)}}, "2000 labels, over the limit of 1024"),
    ({"labels": {"pool": "v" * 600}}, "is 600 characters, over the limit of 512"),
    ({"ranks": [pb.LocalRank(rank=i) for i in range(20_000)]}, "20000 ranks, over the limit of 1024"),
    ({"gpus": [pb.Gpu(uuid="u" * 1000)]}, "is 1000 characters"),
    ({"versions": pb.Versions(rankscope="9" * 100_000)}, "is 100000 characters"),
    ({"backends": ["b" * 1000] * 3}, "is 1000 characters"),
    ({"labels": {"pool": "a\x1b[2J"}}, "'a\\x1b[2J' holds a control character"),
    ({"hostname": "h\nFAKE LINE"}, "holds a control character"),
    ({"backend_options": [pb.BackendOptions(backend="sim", options=[f"o{i}" for i in range(2000)])]},
     "2000 capture options, over the limit of 1024"),
    ({"backend_options": [pb.BackendOptions(backend=f"b{i}") for i in range(2000)]},
     "2000 backends with capture options, over the limit of 1024"),
    ({"backend_options": [pb.BackendOptions(backend="sim", options=["o" * 1000])]}, "is 1000 characters"),
    ({"backend_options": [pb.BackendOptions(backend="sim\x1b[2J")]}, "holds a control character"),
    ({"backend_options": [pb.BackendOptions(backend="sim", options=["sim.\x1b[2J"])]}, "holds a control character"),
])
def test_what_an_agent_says_of_its_node_past_the_bounds_is_refused(coordinator, request_fields, said: str) -> None:
    """Seen with a hostile client: such registrations were stored whole, and two of them made
    ListNodes' reply (8 MB) too large for a client at gRPC's default 4 MiB; a 100 kB version
    string went whole into the log and the reply's warnings; a label's escape sequence went
    to the terminal of whoever ran `rankscope nodes`."""
    with pytest.raises(grpc.RpcError) as caught:
        coordinator.agents.Register(pb.RegisterRequest(node="node-b", **request_fields), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("node node-b: ") and said in caught.value.details()
    assert len(caught.value.details()) < 300
    assert [n.node for n in coordinator.sweeps.ListNodes(pb.ListNodesRequest(), timeout=10).nodes] == []


def test_a_heartbeat_announcing_ranks_past_the_bound_is_not_stored(coordinator, wire, caplog) -> None:
    agent = wire.FakeAgent(coordinator, "node-b")
    agent.events.put(pb.AgentEvent(heartbeat=pb.Heartbeat(ranks=pb.LocalRanks(
        ranks=[pb.LocalRank(rank=i) for i in range(2000)]))))
    agent.reader.join(timeout=10)  # the session is ended, with a line in the log
    nodes = coordinator.sweeps.ListNodes(pb.ListNodesRequest(), timeout=10).nodes
    assert [(n.node, len(n.ranks)) for n in nodes] == [("node-b", 0)]
    assert "node node-b: 2000 ranks, over the limit of 1024" in caplog.text
    agent.close()
