"""Durable state on its own: the SQLite store across a reopen, the artifact store's rules, the config."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
import types
from pathlib import Path

import pytest

from rankscope.coordinator import artifacts as art
from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.config import CoordinatorConfig, resolve
from rankscope.coordinator.registry import AgentRecord, clock_sample
from rankscope.coordinator.store import Store
from rankscope.errors import ConfigError, InputError

T0 = 1_764_000_000_000_000_000


def test_store_keeps_agents_sweeps_uploads_and_reports_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    store = Store(path)
    agent = AgentRecord("agent-1", "node-a", "host-a", "tok", T0, labels={"pool": "x"}, clock_offset_ns=-42, rtt_ns=7)
    store.save_agent(agent)
    sweep, _ = sw.Sweep.start(sw.SweepSpec("sim", 5.0, 30.0, {"k": "v"}), ["node-a", "node-b"], T0, sweep_id="s1")
    sweep.handle(sw.NodeReported("node-a", sw.NodeState.CAPTURING, T0 + 1, detail="2 ranks"))
    store.save_sweep(sweep)
    header = art.UploadHeader("u1", "s1", "node-a", "d.parquet", 3, "c" * 64, "digest", (0, 1))
    store.record_upload(header, T0 + 2)
    store.save_report("s1", tmp_path / "s1.json", T0 + 3)
    store.close()

    again = Store(path)
    assert again.agents() == [agent]
    assert again.agent_by_token("tok") == agent
    assert again.sweep("s1") == sweep
    assert [s.sweep_id for s in again.sweeps(states=(sw.SweepState.RUNNING,))] == ["s1"]
    assert again.completed_upload("u1") == header and header.sha256 == "c" * 64
    assert again.uploads("s1") == [header] and again.uploads("s2") == []
    assert again.latest_upload("s1", "node-a", "d.parquet") == header
    assert again.latest_upload("s1", "node-b", "d.parquet") is None
    assert again.report_path("s1") == tmp_path / "s1.json"
    with pytest.raises(sw.UnknownSweep):
        again.sweep("s2")


def _foreign_tables(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE users (name TEXT)")


def _same_names_other_columns(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE sweeps (id INTEGER)")


@pytest.mark.parametrize("make, problem", [
    (_foreign_tables, r"not a rankscope coordinator state: its tables \(users\) are none of a rankscope coordinator's"),
    (_same_names_other_columns, "not a rankscope coordinator state: its table sweeps has no column created_ns, data, "
                                "state, sweep_id"),
    (lambda path: path.write_bytes(b"not a database" * 100), r"cannot open the coordinator state \(file is not a database\)"),
], ids=["foreign tables", "other columns", "not sqlite"])
def test_a_state_file_that_is_not_the_coordinators_is_refused_and_left_as_it_was(tmp_path: Path, make, problem) -> None:
    # found by a bad-input campaign: another program's SQLite file was switched to WAL and
    # given the coordinator's tables before the first query failed on it (exit 1)
    path = tmp_path / "state.sqlite"
    make(path)
    before = path.read_bytes()
    with pytest.raises(InputError, match=f"^{path}: {problem}") as caught:
        Store(path)
    assert caught.value.exit_code == 2
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["state.sqlite"]


def test_one_unreadable_sweep_record_is_left_out_and_the_rest_still_list(tmp_path: Path, caplog) -> None:
    """A record changed by hand (or cut short) costs its own sweep, not every listing and
    not the coordinator's start; asked for by id, it is a one-line error."""
    from rankscope.coordinator.store import UnreadableSweep

    store = Store(tmp_path / "state.sqlite")
    for n, sweep_id in enumerate(("s1", "s2", "s3")):
        store.save_sweep(sw.Sweep.start(sw.SweepSpec("sim", 5.0, 30.0), ["node-a"], T0 + n, sweep_id=sweep_id)[0])
    db = sqlite3.connect(tmp_path / "state.sqlite")
    db.execute("UPDATE sweeps SET data = '{\"cut' WHERE sweep_id = 's2'")
    db.execute("UPDATE nodes SET data = '[]' WHERE sweep_id = 's3'")
    db.commit()
    db.close()
    assert [s.sweep_id for s in store.sweeps()] == ["s1"]
    assert [s.sweep_id for s in store.sweeps(states=(sw.SweepState.RUNNING,))] == ["s1"]
    assert caplog.text.count("stored sweep s2 cannot be read (JSONDecodeError") == 1  # once, not per listing
    with pytest.raises(UnreadableSweep, match=r"state.sqlite: stored sweep s3 cannot be read \(TypeError"):
        store.sweep("s3")


def test_a_sweep_stored_by_a_newer_rankscope_loads_without_its_new_fields() -> None:
    """A coordinator rolled back to an older release still reads what the newer one stored."""
    sweep, _ = sw.Sweep.start(sw.SweepSpec("sim", 5.0, 30.0), ["node-a"], T0, sweep_id="s1")
    sweep.handle(sw.NodeReported("node-a", sw.NodeState.UPLOADED, T0 + 1, artifacts=(
        sw.ArtifactInfo("d.parquet", "a" * 64, 10, "digest", "u1", (0,)),)))
    data = json.loads(json.dumps(sweep.to_dict()))
    data["later"] = 1
    data["spec"]["later"] = 2
    data["nodes"]["node-a"]["later"] = 3
    data["nodes"]["node-a"]["artifacts"][0]["later"] = 4
    assert sw.Sweep.from_dict(data) == sweep


def test_an_agent_stored_by_a_newer_rankscope_loads_without_its_new_fields(tmp_path: Path) -> None:
    """As sweeps do: a coordinator rolled back past a field its agents' records gained (capture
    options, once) still serves those nodes, where it raised a TypeError on each lookup."""
    store = Store(tmp_path / "state.sqlite")
    agent = AgentRecord("agent-1", "node-a", "host-a", "tok", T0, backends=["sim"])
    store.save_agent(agent)
    store.close()
    with sqlite3.connect(tmp_path / "state.sqlite") as db:
        data = json.loads(db.execute("SELECT data FROM agents").fetchone()[0])
        db.execute("UPDATE agents SET data = ?", (json.dumps({**data, "later": {"sim": ["sim.*"]}}),))
    db.close()
    again = Store(tmp_path / "state.sqlite")
    assert again.agents() == [agent]
    assert again.agent_by_node("node-a") == agent
    assert again.agent_by_token("tok") == agent


def test_a_node_re_registering_under_a_new_id_replaces_its_old_record(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.sqlite")
    store.save_agent(AgentRecord("agent-1", "node-a", "host-a", "tok1", T0))
    store.save_agent(AgentRecord("agent-2", "node-a", "host-a", "tok2", T0 + 1))
    assert [a.agent_id for a in store.agents()] == ["agent-2"]


def _header(data: bytes, **fields) -> art.UploadHeader:
    values = dict(upload_id="u1", sweep_id="s", node="n", name="a.bin", size=len(data),
                  sha256=hashlib.sha256(data).hexdigest(), kind="raw")
    return art.UploadHeader(**{**values, **fields})


def test_artifact_store_accepts_an_empty_file_and_stores_it_by_hash(tmp_path: Path) -> None:
    store = art.ArtifactStore(tmp_path, max_bytes=10)
    with store.writer(_header(b"")) as writer:
        assert writer.result is not None and writer.result.complete
    assert store.path_of(hashlib.sha256(b"").hexdigest()).read_bytes() == b""


def test_a_second_stream_on_the_same_upload_is_refused_while_the_first_writes(tmp_path: Path) -> None:
    store = art.ArtifactStore(tmp_path, max_bytes=100)
    data = b"x" * 50
    with store.writer(_header(data)) as first:
        first.write(0, data[:10])
        errors = []
        thread = threading.Thread(target=lambda: errors.append(_try_open(store, _header(data))))
        thread.start()
        thread.join()
        assert isinstance(errors[0], art.UploadBusy)
    with store.writer(_header(data), wait_s=0) as second:
        assert second.committed == 10
        assert second.write(10, data[10:]).complete


def _try_open(store: art.ArtifactStore, header: art.UploadHeader) -> Exception | None:
    try:
        with store.writer(header, wait_s=0.05):
            return None
    except art.UploadBusy as exc:
        return exc


def test_a_query_racing_the_first_stream_after_a_restart_does_not_split_the_upload(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """After a restart an upload is read back from its header file by whichever call comes first;
    a query does so without the store's guard. Two reads at once made two in-memory uploads, with
    a lock each: two streams could then append to one part file together."""
    data = b"z" * 40
    with art.ArtifactStore(tmp_path, max_bytes=100).writer(_header(data)) as writer:
        writer.write(0, data[:20])
    restarted = art.ArtifactStore(tmp_path, max_bytes=100)
    streams: list = []

    def loads(text):  # the query has read the header; a stream opens the upload before it is kept
        if not streams:
            streams.append(None)
            streams[0] = restarted.writer(_header(data))
        return json.loads(text)

    monkeypatch.setattr(art, "json", types.SimpleNamespace(loads=loads, dumps=json.dumps))
    assert restarted.committed("u1")[1] == 20
    with streams[0]:
        with pytest.raises(art.UploadBusy):
            restarted.writer(_header(data), wait_s=0).__enter__()


def test_a_resumed_upload_must_keep_its_header(tmp_path: Path) -> None:
    store = art.ArtifactStore(tmp_path, max_bytes=100)
    data = b"y" * 40
    with store.writer(_header(data)) as writer:
        writer.write(0, data[:20])
    with pytest.raises(art.WrongOffset, match="different header"):
        store.writer(_header(data, name="other.bin"))


@pytest.mark.parametrize("name, raw", [
    ("HEARTBEAT_INTERVAL_S", "1e16"), ("PING_INTERVAL_S", "1e10"), ("NODE_TIMEOUT_S", "86401"),
    ("RESTART_GRACE_S", "1e20"), ("AGENT_LOST_S", "1e20"), ("GRACE_S", "1e10"),
])
def test_a_coordinator_setting_of_more_than_a_day_is_refused_at_start(name: str, raw: str) -> None:
    # found by review: heartbeat_interval_s 1e16 (agent_lost_s 1e17 to match) served, then every
    # agent's Register failed (its milliseconds past the reply's int64: "Value out of range");
    # ping_interval_s 1e10 failed every session after its first ping (past a thread's longest
    # wait: OverflowError); node_timeout_s past a day refused every sweep without a timeout
    environ = {"RANKSCOPE_AGENT_LOST_S": "86400", f"RANKSCOPE_{name}": raw}
    with pytest.raises(ConfigError, match="^" + re.escape(f"{name.lower()} must be a positive number of seconds "
                                                          f"up to 86400, got {float(raw)}") + "$") as caught:
        resolve(environ=environ)
    assert caught.value.exit_code == 2  # one line at the CLI's edge, before anything is made
    longest = 43_200 if name == "HEARTBEAT_INTERVAL_S" else 86_400  # two heartbeats within agent_lost_s
    assert getattr(resolve(environ={**environ, f"RANKSCOPE_{name}": str(longest)}), name.lower()) == longest


def test_clock_sample_assumes_the_reply_half_way() -> None:
    sample = clock_sample(sent_ns=1_000, agent_ns=5_000_600, received_ns=2_000)
    assert sample.rtt_ns == 1_000 and sample.offset_ns == 5_000_600 - 1_500


def test_config_from_defaults_environment_and_flags() -> None:
    assert resolve(environ={}) == CoordinatorConfig()
    config = resolve({"listen": "127.0.0.1:0", "node_timeout_s": None},
                     environ={"RANKSCOPE_NODE_TIMEOUT_S": "7.5", "RANKSCOPE_LISTEN": "0.0.0.0:1"})
    assert config.listen == "127.0.0.1:0" and config.node_timeout_s == 7.5
    with pytest.raises(ConfigError, match=r"^\$RANKSCOPE_MAX_UPLOAD_BYTES: 'lots' is not a size: bytes, or with K, M"):
        resolve(environ={"RANKSCOPE_MAX_UPLOAD_BYTES": "lots"})
    # Sizes as the help gives its default (8 GiB): K, M, G and T are 1024s.
    for raw, size in (("4096", 4096), ("1G", 1 << 30), ("8GiB", 8 << 30), ("512 MB", 512 << 20), ("1.5g", 3 << 29)):
        assert resolve({"max_upload_bytes": raw}, environ={}).max_upload_bytes == size, raw
    # found by a bad-input campaign: 99999999999T passed, then every agent's Register failed on the int64 field
    for raw in ("0", "8388608T"):
        with pytest.raises(ConfigError, match="^--max-upload-bytes must be positive and under 8388608T, got "):
            resolve({"max_upload_bytes": raw}, environ={})
    assert resolve({"max_upload_bytes": "8388607T"}, environ={}).max_upload_bytes == 8388607 << 40
    with pytest.raises(ConfigError, match="HOST:PORT"):
        resolve({"listen": "7443"}, environ={})
    for name, raw in (("NODE_TIMEOUT_S", "nan"), ("RESTART_GRACE_S", "inf"), ("AGENT_LOST_S", "0"), ("GRACE_S", "-1")):
        with pytest.raises(ConfigError, match=f"{name.lower()} must be a positive number of seconds up to 86400, got {raw}"):
            resolve(environ={f"RANKSCOPE_{name}": raw})
    # an agent is judged lost on missed heartbeats: one late beat must not be enough
    with pytest.raises(ConfigError, match=r"^agent_lost_s \(15s\) must be at least two heartbeat intervals "
                                          r"\(heartbeat_interval_s: 10s\)$"):
        resolve(environ={"RANKSCOPE_AGENT_LOST_S": "15"})
    assert resolve(environ={"RANKSCOPE_AGENT_LOST_S": "2", "RANKSCOPE_HEARTBEAT_INTERVAL_S": "1"}).agent_lost_s == 2
    with pytest.raises(ConfigError, match="max_workers must be at least 2, got 0"):  # not a ValueError from the pool
        resolve(environ={"RANKSCOPE_MAX_WORKERS": "0"})
    # A switch from the environment, as systemd's EnvironmentFile and a pod's env give it.
    tls = {"RANKSCOPE_TLS_CERT": "s.pem", "RANKSCOPE_TLS_KEY": "s.key", "RANKSCOPE_TLS_CLIENT_CA": "ca.pem"}
    for raw, on in (("1", True), ("Yes", True), ("on", True), ("0", False), ("false", False), ("", False)):
        assert resolve(environ={**tls, "RANKSCOPE_NODE_CERTS": raw}).node_certs is on, raw
    with pytest.raises(ConfigError, match=r"^\$RANKSCOPE_NODE_CERTS: 'maybe' is not a yes/no \(1/0, true/false, on/off\) "
                                          "for node_certs"):
        resolve(environ={**tls, "RANKSCOPE_NODE_CERTS": "maybe"})


def test_a_full_disk_under_a_data_dir_with_a_newline_names_it_quoted(tmp_path: Path, caplog) -> None:
    # `coordinator --data-dir $'data\nold'` on a full disk said "free space under .../data",
    # then "old" on a line of its own, in the error and in the operator's log line
    error = art.storage_full("No space left on device", tmp_path / "data\nold")
    assert str(error).endswith(f"free space under '{tmp_path}/data\\nold'")
    assert caplog.messages == [str(error)]


def test_a_full_disk_is_a_storage_error_and_the_store_writes_again_once_there_is_room(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.sqlite")
    store._db.execute(f"PRAGMA max_page_count = {store._db.execute('PRAGMA page_count').fetchone()[0]}")
    big = AgentRecord("agent-1", "node-a", "host-a", "tok", T0, labels={"blob": "x" * 100_000})
    with pytest.raises(art.StorageFull, match=rf"^coordinator storage is full \(database or disk is full\): "
                                              rf"free space under {tmp_path}$"):
        store.save_agent(big)
    assert not store._db.in_transaction
    store._db.execute("PRAGMA max_page_count = 1000000")  # room again
    store.save_agent(big)
    assert store.agents() == [big]


def test_an_upload_header_left_half_written_by_a_killed_coordinator_is_removed_on_restart(tmp_path: Path) -> None:
    # SIGKILL between writing an upload's header to its temporary file and the rename left the
    # temporary file in partial/ for good (seen once in tests/integration/test_sweep.py).
    data = b"y" * 30
    with art.ArtifactStore(tmp_path, max_bytes=100).writer(_header(data)) as writer:
        writer.write(0, data[:10])
    partial = tmp_path / "partial"
    kept = sorted(p.name for p in partial.iterdir())
    (partial / ".u1.json.4242.139912345.tmp").write_text('{"upload_id": "u1", "si')
    restarted = art.ArtifactStore(tmp_path, max_bytes=100)
    assert sorted(p.name for p in partial.iterdir()) == kept
    assert restarted.committed("u1")[1] == 10


@pytest.mark.parametrize("text", ['{"upload_id": "u2", "si', '{"upload_id": "u2"}', '["u2"]'])
def test_an_upload_whose_header_cannot_be_read_is_removed_with_its_part_file(tmp_path: Path, caplog,
                                                                               text: str) -> None:
    # found by review: a header not JSON was skipped at every listing, so its part file outlived
    # every restart; one missing fields (or not an object) raised TypeError: the coordinator did
    # not start. Nothing says whose it is: no stream can resume it, no sweep's end removes it.
    store = art.ArtifactStore(tmp_path, max_bytes=100)
    done, data = b"d" * 30, b"y" * 30
    with store.writer(_header(done, upload_id="u-done")) as writer:
        writer.write(0, done)
    for upload_id in ("u1", "u2"):
        with store.writer(_header(data, upload_id=upload_id, sweep_id=f"s-{upload_id}")) as writer:
            writer.write(0, data[:10])
    partial = tmp_path / "partial"
    (partial / "u2.json").write_text(text)
    restarted = art.ArtifactStore(tmp_path, max_bytes=100)
    assert restarted.partial_sweeps() == {"s-u1"}
    assert sorted(p.name for p in partial.iterdir()) == ["u1.json", "u1.part"]
    assert restarted.path_of(hashlib.sha256(done).hexdigest()).read_bytes() == done  # finished: kept
    assert [r.getMessage().partition(":")[0] for r in caplog.records] == ["removed unfinished upload 'u2'"]
    assert str(partial / "u2.json") in caplog.text
    assert restarted.committed("u2") is None  # a stream starts it afresh


def test_part_files_without_a_header_and_headers_named_as_no_upload_are_removed_on_start(tmp_path: Path,
                                                                                       caplog) -> None:
    # found by review: the listing of unfinished uploads reads headers only, and only those
    # named as an upload id: a part file whose header is gone (a hand's clean-up, an old
    # version's crash) and a header named as no upload (and its part file) outlived every
    # restart. Nothing says whose they are: no stream resumes them, no sweep's end removes them.
    store = art.ArtifactStore(tmp_path, max_bytes=100)
    data = b"y" * 30
    for upload_id in ("u-live", "u-orphan", "u-misnamed"):
        with store.writer(_header(data, upload_id=upload_id, sweep_id="s")) as writer:
            writer.write(0, data[:10])
    partial = tmp_path / "partial"
    (partial / "u-orphan.json").unlink()
    for name in ("u-misnamed.json", "u-misnamed.part"):
        (partial / name).rename(partial / name.replace("u-misnamed", "-u misnamed"))
    (partial / "notes.txt").write_text("not the store's to judge")
    (partial / "folder.part").mkdir()
    restarted = art.ArtifactStore(tmp_path, max_bytes=100)
    assert sorted(p.name for p in partial.iterdir()) == ["folder.part", "notes.txt", "u-live.json", "u-live.part"]
    assert restarted.committed("u-live")[1] == 10 and restarted.partial_sweeps() == {"s"}
    assert [r.getMessage() for r in caplog.records] == [
        f"removed unfinished upload {partial / '-u misnamed.json'}: its file name is not an upload id",
        f"removed unfinished upload {partial / '-u misnamed.part'}: it has no header",
        f"removed unfinished upload {partial / 'u-orphan.part'}: it has no header"]
    with restarted.writer(_header(data, upload_id="u-orphan", sweep_id="s")) as writer:  # starts afresh, at 0
        assert writer.committed == 0 and writer.write(0, data).complete


def test_an_unfinished_upload_a_newer_rankscope_began_resumes_without_its_new_fields(tmp_path: Path) -> None:
    # a rolled-back coordinator: a header field added since is dropped, not the upload (as agent records)
    data = b"y" * 30
    with art.ArtifactStore(tmp_path, max_bytes=100).writer(_header(data, sweep_id="s-new")) as writer:
        writer.write(0, data[:10])
    meta = tmp_path / "partial" / "u1.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "from": "a later version"}))
    restarted = art.ArtifactStore(tmp_path, max_bytes=100)
    assert restarted.partial_sweeps() == {"s-new"}
    assert restarted.committed("u1")[1] == 10
