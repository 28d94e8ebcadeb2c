"""The coordinator's shell around its pure parts: it feeds sweep machines their events
and carries out what they return (persist, send commands, analyse, notify watchers).

No gRPC here: server.py translates between protobuf and these calls. Everything a
sweep needs after a restart is in the store and the artifact folder; ``start()``
picks unfinished sweeps up again.
"""

from __future__ import annotations

import copy
import logging
import math
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

from rankscope import __version__, node_name, output, sim_options
from rankscope.capture_options import check_flags
from rankscope.coordinator import reports
from rankscope.coordinator.artifacts import ArtifactStore, StorageFull, UploadHeader, UploadWriter
from rankscope.coordinator.config import CoordinatorConfig
from rankscope.coordinator.registry import (
    AWAY_KEEP_S,
    AgentRecord,
    Connection,
    Registry,
    SessionLimit,
    UnknownAgent,
    check_options_read,
    clock_sample,
    default_backend,
    has_labels,
    select_nodes,
)
from rankscope.coordinator.store import Store, UnreadableSweep
from rankscope.coordinator import sweeps as sw
from rankscope.errors import InputError, RankscopeError, TransportError, UploadRejected, quoted
from rankscope.lock import FolderLock
from rankscope.states import AGENT_DONE

log = logging.getLogger(__name__)

TICK_S = 0.25
# Why a sweep's unfinished uploads are removed on start, by where it stands (`_standing`).
_PARTIALS_DROPPED = {"ended": "which has ended", "unknown": "which this coordinator never started"}
# The most one tick counts towards an agent's silence: where the ticker ran late (the process
# stalled, its clock stepped), the time it did not listen is no agent's fault.
HEARD_TICK_NS = 10**9
# A connected agent's record is saved at least this often (pong), so that after a crash its
# last save says how long it has been away (`AWAY_KEEP_S`).
SEEN_SAVE_NS = 600 * 10**9
# Nodes refused at the session limit retry every few seconds each: log them once a minute.
REFUSALS_LOG_S = 60.0
# A sweep whose state could not be saved (full disk) is saved again this often.
SAVE_RETRY_S = 5.0
# The longest capture window a sweep may ask for. DCGM stays paused throughout, and a
# trace of one grows without bound: a mistyped 20h for 20s is refused, not run.
MAX_DURATION_S = 3600.0
# The longest timeout a sweep may ask for: its nodes are held (one capture at a time) until it
# ends, and the deadline is kept in nanoseconds (1e308s would overflow). Export time comes on
# top of it, up to the agents' own bounds.
MAX_TIMEOUT_S = 86_400.0
# What a user's request puts in every listing of its sweep (the backend in the sweep, a
# cancel's reason in each node's record): bounded, or a few 4 MiB requests would make
# ListSweeps' reply too large to send (256 MiB), for every user.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a backend's, an option key's
MAX_REASON_CHARS = 1000
# A sweep's options go to each of its nodes in StartCapture (and again on every reconnect):
# bounded, or they pass an agent's 4 MiB receive limit. Far above what a backend takes
# (nsys: gpu_metrics; sim: a dozen sim.* keys).
MAX_OPTIONS = 64
MAX_OPTION_CHARS = 4096


# What an agent says of its node (registration, the ranks of its heartbeats) goes out in every
# ListNodes reply: bounded per node likewise, or a few 4 MiB registrations would make that
# reply too large to send, for every user. Far above a real node's (a few dozen labels, 8 GPUs).
MAX_NODE_ITEMS = 1024  # labels, GPUs, ranks, backends, capture options: each
MAX_NODE_WORD_CHARS = 512  # each string in them, the host name and versions too (a Kubernetes label key: 317)


def _check_node_facts(node: str, *, hostname: str = "", labels: Mapping[str, str] | None = None,
                      gpus: Sequence[dict] = (), ranks: Sequence[dict] = (),
                      versions: Mapping[str, str] | None = None, backends: Sequence[str] = (),
                      capture_options: Mapping[str, Sequence[str]] | None = None) -> None:
    """Refuse what an agent says of its node past the bounds above."""
    labels, versions, capture_options = labels or {}, versions or {}, capture_options or {}
    options = [option for read in capture_options.values() for option in read]
    for what, items in (("labels", labels), ("GPUs", gpus), ("ranks", ranks), ("backends", backends),
                        ("backends with capture options", capture_options), ("capture options", options)):
        if len(items) > MAX_NODE_ITEMS:
            raise InputError(f"node {node}: {len(items)} {what}, over the limit of {MAX_NODE_ITEMS}")
    words = [hostname, *labels, *labels.values(), *versions.values(), *backends, *capture_options, *options,
             *(value for record in (*gpus, *ranks) for value in record.values() if isinstance(value, str))]
    longest = max(words, key=len)
    if len(longest) > MAX_NODE_WORD_CHARS:
        raise InputError(f"node {node}: {quoted(longest)} is {len(longest)} characters, over the limit of "
                         f"{MAX_NODE_WORD_CHARS} for what an agent says of its node")
    # `rankscope nodes` prints them: an escape sequence would act on the user's terminal.
    if (unprintable := next((word for word in words if not word.isprintable()), None)) is not None:
        raise InputError(f"node {node}: {quoted(unprintable)} holds a control character")


def _check_options(options: Mapping[str, str]) -> None:
    if len(options) > MAX_OPTIONS:
        raise InputError(f"{len(options)} capture options, over the limit of {MAX_OPTIONS}")
    for key, value in options.items():
        if not _NAME.fullmatch(key) or len(value) > MAX_OPTION_CHARS:
            raise InputError(f"capture option {quoted(key)}: its key must be a name (up to "
                             f"64 letters, digits, '._-') and its value at most {MAX_OPTION_CHARS} characters")


class NotAuthenticated(RankscopeError):
    """A session or upload without a valid token from registration."""


class NotPermitted(RankscopeError):
    """An agent acting for a node other than its own."""


class NotForSweep(UploadRejected):
    """An upload for a sweep that has ended or is unknown, or by a node the sweep does not capture
    or whose capture there has ended without its data."""


class UnknownArtifact(InputError):
    """A sweep has no stored artifact of that node and name."""


@dataclass(frozen=True)
class CaptureOrder:
    """StartCapture for one node (sent again after reconnects and restarts)."""

    sweep_id: str
    spec: sw.SweepSpec
    start_at_ns: int  # when every node's window begins (its ranks ready by then)


@dataclass(frozen=True)
class CancelOrder:
    sweep_id: str
    reason: str


@dataclass(frozen=True)
class UploadState:
    upload_id: str
    known: bool
    committed: int = 0
    complete: bool = False
    size: int = 0
    sha256: str = ""


def _returning(agents: list[AgentRecord]) -> set[str]:
    """The nodes whose agents were connected as the previous run stopped: seen within
    `SEEN_SAVE_NS` of the last one seen (a connected agent is saved at least that often)."""
    latest = max((a.last_seen_ns for a in agents), default=0)
    return {a.node for a in agents if a.last_seen_ns >= latest - SEEN_SAVE_NS}


@dataclass(frozen=True)
class NodeView:
    """An agent the coordinator knows, as `rankscope nodes` lists it."""

    agent: AgentRecord
    connected: bool
    sweep_id: str  # the running sweep whose capture holds the node; "" none


def _claim(artifact: sw.ArtifactInfo | UploadHeader) -> tuple:
    """What a status's artifact must share with one of its node's uploads (its upload id
    aside: the agent's own, which an older one may not send)."""
    return artifact.name, artifact.sha256, artifact.size, artifact.kind, tuple(artifact.ranks)


class Coordinator:
    def __init__(self, config: CoordinatorConfig, *, analyze: reports.Analyze | None = None,
                 clock: Callable[[], int] = time.time_ns) -> None:
        # Report paths go to users on other hosts: absolute, so they mean something there.
        self.config = config = replace(config, data_dir=config.data_dir.absolute())
        self.clock = clock
        self.analyze = analyze
        # Each folder checked before the lock and the state file are made: a file in the way, or a
        # folder that cannot be written in, left them (and the folders made before it) behind.
        for folder in (*ArtifactStore.folders(config.artifacts_dir), config.reports_dir):
            output.check_folder(folder)
        self._hold = FolderLock(config.data_dir, "coordinator").acquire()
        try:
            self.store = Store(config.state_db)
            self.artifacts = ArtifactStore(config.artifacts_dir, max_bytes=config.max_upload_bytes)
            output.make_folder(config.reports_dir)  # now: a file there failed only each sweep's analysis
        except BaseException:
            self._hold.release()
            raise
        self.registry = Registry()
        self._active: dict[str, sw.Sweep] = {}
        self._lock = threading.RLock()
        self._watchers: dict[str, list[queue.Queue]] = {}
        self._analysis = ThreadPoolExecutor(max_workers=1, thread_name_prefix="analysis")
        self._stop = threading.Event()
        self._closed = False  # its store closed: stopped
        self._ticker = threading.Thread(target=self._tick_loop, name="sweep-ticker", daemon=True)
        self._refused: set[str] = set()  # nodes refused a session since the last such log line
        self._refused_logged = -REFUSALS_LOG_S
        self._unsaved: set[str] = set()  # sweeps whose last save failed: kept active, saved whole later
        self._save_retry_at = 0.0
        # The nodes whose agents were connected as the previous run stopped, on their way back
        # (their back-off: under half of `min(agent_lost_s, restart_grace_s)`, as Register tells
        # them), and until when a sweep waits for them (`start`).
        self._returning: set[str] = set()
        self._returning_until_ns = 0
        # When each agent connected this run was last heard from (`heard`), on a clock of the
        # time the ticker listened (`_listened_ns`): one silent for `agent_lost_s` is lost.
        self._heard: dict[str, int] = {}
        self._listened_ns = 0
        # The agents the last run had (on their way back, or at a capture of a sweep resumed
        # here) not connected since this run's start: lost where not back `restart_grace_s`
        # after it, at `_awaited_until_ns` on the `_listened_ns` clock (`_judge_lost`).
        self._awaited: set[str] = set()
        self._awaited_until_ns = 0

    # lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Resume what a previous run left unfinished, then watch deadlines."""
        now = self.clock()
        grace = int(self.config.restart_grace_s * 1e9)
        with self._lock:
            self._returning, self._returning_until_ns = _returning(self.store.agents()), now + grace
            awaited, unheard = set(self._returning), set()
            for sweep in self.store.sweeps(states=(sw.SweepState.RUNNING, sw.SweepState.ANALYSING)):
                log.info("resuming sweep %s (%s)", sweep.sweep_id, sweep.state.value)
                self._active[sweep.sweep_id] = sweep
                self._apply(sweep, sweep.handle(sw.Restarted(now, grace)))
                for name in sweep.open_nodes():  # a node waited for since its sweep began waits on
                    (unheard if sweep.nodes[name].agent_away else awaited).add(name)
            self._awaited, self._awaited_until_ns = awaited - unheard, self._listened_ns + grace
            # Unfinished uploads nothing will complete or remove: of sweeps that ended as the last
            # run stopped (killed before their clean-up), and of sweeps never started here (taken
            # by versions that stored uploads under any sweep id). Raw exports run to gigabytes.
            for sweep_id in sorted(self.artifacts.partial_sweeps()):
                why = _PARTIALS_DROPPED.get(self._standing(sweep_id))
                if why is None:
                    continue
                if dropped := self.artifacts.drop_partials(sweep_id):
                    listed = ", ".join(dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5 else "")
                    log.warning("removed %d unfinished upload(s) of sweep %s, %s: %s", len(dropped), quoted(sweep_id),
                                why, listed)
        self._ticker.start()

    def closing(self) -> None:
        """End session and watch streams now, so a stopping server need not wait out its grace."""
        self._stop.set()
        self.registry.close_all()

    def stop(self) -> None:
        self.closing()
        if self._ticker.is_alive():
            self._ticker.join()
        self._analysis.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._closed = True
            self.store.close()
        self._hold.release()

    # agents -------------------------------------------------------------------------

    def register(self, node: str, hostname: str, labels: Mapping[str, str], *, gpus: list[dict],
                 ranks: list[dict], versions: Mapping[str, str], backends: list[str],
                 capture_options: Mapping[str, list[str]] | None = None) -> tuple[AgentRecord, list[str]]:
        """Record the node; the same node keeps its id and token across agent restarts.
        ``capture_options``: what each backend reads, by backend, where the agent says."""
        if not node:
            raise InputError("registration without a node name or hostname")
        if (wrong := node_name.problem(node)) is not None:
            raise InputError(f"node name {node!r}: {wrong}")
        capture_options = capture_options or {}
        _check_node_facts(node, hostname=hostname, labels=labels, gpus=gpus, ranks=ranks, versions=versions,
                          backends=backends, capture_options=capture_options)
        previous = self.store.agent_by_node(node)
        now = self.clock()
        agent = AgentRecord(
            agent_id=previous.agent_id if previous else f"agent-{secrets.token_hex(6)}",
            node=node,
            hostname=hostname or node,
            # Uploads in flight carry the token, so re-registering must not invalidate it.
            token=previous.token if previous else secrets.token_urlsafe(24),
            registered_ns=now,
            labels=dict(labels),
            gpus=gpus,
            ranks=ranks,
            versions=dict(versions),
            backends=list(backends),
            capture_options={backend: list(options) for backend, options in capture_options.items()},
            last_seen_ns=now,
            clock_offset_ns=previous.clock_offset_ns if previous else None,
            rtt_ns=previous.rtt_ns if previous else None,
        )
        self.store.save_agent(agent)
        warnings = []
        theirs = versions.get("rankscope", "")
        if theirs and theirs != __version__:
            warnings.append(f"agent runs rankscope {theirs}, coordinator {__version__}")
            log.warning("node %s: %s", node, warnings[-1])
        return agent, warnings

    def authenticate(self, agent_id: str, token: str) -> AgentRecord:
        try:
            agent = self.store.agent_by_token(token)
        except UnknownAgent:
            raise NotAuthenticated("unknown session token: register first") from None
        if agent.agent_id != agent_id:
            raise NotAuthenticated(f"session token does not belong to agent {agent_id!r}")
        return agent

    def connect(self, agent: AgentRecord, peer: str = "") -> Connection:
        """A live session: it gets StartCapture for every running sweep still waiting on its node."""
        try:
            connection = self.registry.connect(agent, peer, limit=self.config.max_sessions)
        except SessionLimit as exc:
            self._log_refusal(agent.node, exc)
            raise
        with self._lock:
            self._heard[agent.node] = self._listened_ns
            self._awaited.discard(agent.node)
            for sweep in list(self._active.values()):
                if agent.node in sweep.open_nodes():
                    connection.send(self._order(sweep))
                    self._apply(sweep, sweep.handle(sw.AgentConnected(agent.node, self.clock())))
        log.info("agent %s (%s) connected", agent.node, agent.agent_id)
        return connection

    def heard(self, connection: Connection) -> None:
        """Something came from the agent on its session: it is alive."""
        with self._lock:  # not between a judgement's look and its verdict
            if self.registry.get(connection.node) is connection:  # a session taken over says nothing of the node
                self._heard[connection.node] = self._listened_ns

    def _log_refusal(self, node: str, exc: SessionLimit) -> None:
        with self._lock:
            self._refused.add(node)
            now = time.monotonic()
            if now - self._refused_logged < REFUSALS_LOG_S:
                return
            nodes, self._refused, self._refused_logged = node_name.natural(self._refused), set(), now
        who = f"node {nodes[0]}" if len(nodes) == 1 else f"{len(nodes)} nodes ({', '.join(nodes[:3])}, ...)"
        log.warning("%s refused: %s", who, exc)

    def disconnect(self, connection: Connection) -> None:
        """An agent's session ended. Its silence goes on counting (`_judge_lost`): a killed
        agent's restart is back in time, a dead one's node fails."""
        self.registry.disconnect(connection)
        log.info("agent %s disconnected", connection.node)
        with self._lock:
            if self.registry.get(connection.node) is not None or self._closed:
                # back already, on a session whose record is the newer; or a session gRPC ended
                # only after the stop, its state closed (it was recorded until the stop)
                return
            self._seen(connection.agent)

    def _judge_lost(self, elapsed_ns: int) -> None:
        """Count a tick's ``elapsed_ns`` (`HEARD_TICK_NS` at most) as silence, and fail in the
        running sweeps the nodes of the agents silent for `agent_lost_s`, and of those the last
        run had that are not back `restart_grace_s` after this one's start (dead meanwhile, they
        have no session here to be silent on). Called with the lock held."""
        self._listened_ns += min(elapsed_ns, HEARD_TICK_NS)
        lost_s = self.config.agent_lost_s
        silent = [node for node, heard in self._heard.items() if self._listened_ns - heard >= lost_s * 1e9]
        for node in silent:
            del self._heard[node]  # judged once; heard again (reconnected), counted anew
            connection = self.registry.get(node)
            open_ = connection is not None and not connection.closed.is_set()
            if open_:  # nothing on it: its node down or cut off, and TCP none the wiser (yet)
                log.warning("agent %s lost: nothing on its session for %gs; closing it", node, lost_s)
                connection.close()
            how = "its session still open" if open_ else "its session ended"
            self._feed(sw.AgentLost(node, f"not heard from for {lost_s:g}s, {how}", self.clock()))
        if self._awaited and self._listened_ns >= self._awaited_until_ns:
            grace_s, awaited, self._awaited = self.config.restart_grace_s, node_name.natural(self._awaited), set()
            log.warning("agent(s) not back within %gs of the restart: %s", grace_s, ", ".join(awaited))
            for node in awaited:
                self._feed(sw.AgentLost(node, f"not back within {grace_s:g}s of the coordinator's restart",
                                        self.clock()))

    def _feed(self, event: sw.Event) -> None:
        """Hand every running sweep the event; called with the lock held."""
        for sweep in list(self._active.values()):
            try:
                self._apply(sweep, sweep.handle(event))
            except Exception:  # one sweep's bug must not stop every sweep's deadlines
                log.exception("sweep %s: %s failed", sweep.sweep_id, type(event).__name__)

    def ping(self, connection: Connection) -> tuple[int, int]:
        """A new ping's id and send time, remembered for its pong."""
        ping_id, now = connection.next_ping, self.clock()
        connection.next_ping += 1
        connection.pings[ping_id] = now
        return ping_id, now

    def pong(self, connection: Connection, ping_id: int, agent_ns: int) -> None:
        sent = connection.pings.pop(ping_id, None)
        if sent is None:
            return
        best = connection.add_sample(clock_sample(sent, agent_ns, self.clock()))
        agent = connection.agent
        # Saved with a better sample, and now and then regardless: after a crash, when no
        # disconnect was recorded, the last save tells how long a node has been away.
        if ((agent.clock_offset_ns, agent.rtt_ns) != (best.offset_ns, best.rtt_ns)
                or self.clock() - agent.last_seen_ns > SEEN_SAVE_NS):
            connection.agent = self._seen(replace(agent, clock_offset_ns=best.offset_ns, rtt_ns=best.rtt_ns))

    def ranks_announced(self, connection: Connection, ranks: list[dict]) -> None:
        """The ranks an agent's heartbeat says its node's spool holds now: kept where they changed."""
        _check_node_facts(connection.node, ranks=ranks)
        if ranks != connection.agent.ranks:
            connection.agent = self._seen(replace(connection.agent, ranks=ranks))

    def _seen(self, agent: AgentRecord) -> AgentRecord:
        """``agent`` recorded as connected until now (`select_nodes` leaves out the long gone)."""
        agent = replace(agent, last_seen_ns=self.clock())
        try:
            self.store.save_agent(agent)
        except StorageFull:  # logged as raised; a later save records it
            pass
        return agent

    def clock_hints(self) -> dict[str, int]:
        """Host (and node name) -> agent clock minus coordinator clock, where pinged."""
        hints: dict[str, int] = {}
        for agent in self.store.agents():
            if agent.clock_offset_ns is not None:
                hints[agent.node] = agent.clock_offset_ns
                hints[agent.hostname] = agent.clock_offset_ns
        return hints

    def node_reported(self, node: str, event: sw.NodeReported, sweep_id: str) -> None:
        """An agent's status for one sweep; artifacts it claims must be its node's uploads for
        that sweep, still stored. A stored sha256 alone is not enough: it may be another node's
        file, or this node's of another sweep (byte-identical uploads are stored once, so each
        node's own upload record is what counts), and the claim must name the file as its
        upload did: the analysis takes a digest's ranks, and fetch its name, from the claim."""
        if event.artifacts:
            uploaded = {_claim(u) for u in self.store.uploads_of(sweep_id, node)}
            foreign = [a for a in event.artifacts if _claim(a) not in uploaded]
            absent = [a for a in event.artifacts if a not in foreign and not self.artifacts.has(a.sha256)]
            if event.state is not sw.NodeState.UPLOADED:  # uploading: those done so far, kept only where sound
                event = replace(event, artifacts=tuple(a for a in event.artifacts if a not in foreign + absent))
            elif foreign or absent:
                problems = [f"not an upload of node {node} for this sweep: "
                            + ", ".join(f"{a.name} (sha256 {a.sha256[:12]}...)" for a in foreign)] if foreign else []
                problems += [f"not stored here: {', '.join(a.name for a in absent)}"] if absent else []
                event = replace(event, state=sw.NodeState.FAILED, reason=f"reported uploaded, but {'; '.join(problems)}")
        with self._lock:
            sweep = self._active.get(sweep_id)
            if sweep is None:
                log.info("node %s reports on sweep %s, which is not running", node, sweep_id)
                if event.state not in AGENT_DONE:  # a cancel it missed while away: its node is not to stay busy
                    self.registry.send(node, CancelOrder(sweep_id, f"sweep {sweep_id} has ended"))
                return
            self._apply(sweep, sweep.handle(event))

    # uploads ------------------------------------------------------------------------

    def query_upload(self, upload_id: str, token: str) -> UploadState:
        """Where an upload stands, for the agent of its node only: its size and sha256 are that node's."""
        return self._owned(upload_id, self._uploader(upload_id, token))

    def _owned(self, upload_id: str, agent: AgentRecord) -> UploadState:
        """Where an upload stands, refused where it is another node's (its size, sha256 and
        name are that node's): the refusal names nothing of it, not even its node."""
        state, node = self._upload_state(upload_id)
        if state.known and node != agent.node:
            raise NotPermitted(f"upload {upload_id}: not an upload of node {agent.node!r}")
        return state

    def _upload_state(self, upload_id: str) -> tuple[UploadState, str]:
        """Where an upload stands, and the node it is of ("" where unknown)."""
        done = self.store.completed_upload(upload_id)
        if done is not None:
            return UploadState(upload_id, True, done.size, True, done.size, done.sha256), done.node
        partial = self.artifacts.committed(upload_id)
        if partial is not None:
            header, committed = partial
            return UploadState(upload_id, True, committed, False, header.size, header.sha256), header.node
        return UploadState(upload_id, False), ""

    def _uploader(self, upload_id: str, token: str) -> AgentRecord:
        """The agent a session token on an Upload or QueryUpload belongs to."""
        try:
            return self.store.agent_by_token(token)
        except UnknownAgent:
            raise NotAuthenticated(f"upload {upload_id}: unknown session token: register first") from None

    @contextmanager
    def upload(self, header: UploadHeader, token: str) -> Iterator[UploadWriter]:
        """One upload stream's writer; a completed upload is recorded when the stream ends."""
        agent = self._uploader(header.upload_id, token)
        if agent.node != header.node:
            raise NotPermitted(f"upload {header.upload_id}: agent of node {agent.node!r} cannot upload for {header.node!r}")
        self._owned(header.upload_id, agent)  # else a differing header's refusal would describe the other's
        with self._lock:
            self._check_uploader(header)
        try:
            with self.artifacts.writer(header) as writer:
                yield writer
        finally:
            # A sweep that ended while this stream held its upload passed it by (drop_partials).
            with self._lock:
                ended = self._ended(header.sweep_id)
            if ended:
                self.artifacts.drop_partials(header.sweep_id)
        if writer.result is not None:
            self.store.record_upload(header, self.clock())

    def _check_uploader(self, header: UploadHeader) -> None:
        """Refuse an upload no sweep will use: one for a sweep that has ended (its listing is
        then whole) or was never started here (no sweep would list or remove it: the disk
        fills), or by a node its sweep does not capture (stored, it would be listed as the
        sweep's) or no longer waits for (its news is not taken: `Sweep._open`). Every sweep
        that takes uploads is active (`start` resumes them before the server serves). Called
        with the lock held."""
        sweep = self._active.get(header.sweep_id)
        if sweep is None and self._ended(header.sweep_id):
            raise NotForSweep(f"upload {header.upload_id}: sweep {header.sweep_id} has ended and takes no more uploads")
        if sweep is None:
            raise NotForSweep(f"upload {header.upload_id}: this coordinator has no sweep {quoted(header.sweep_id)}")
        if header.node not in sweep.nodes:
            raise NotForSweep(f"upload {header.upload_id}: node {header.node!r} is not in sweep {header.sweep_id}")
        record = sweep.nodes[header.node]
        if record.terminal and not record.finished:
            # Its node ended without its data (its agent judged lost, timed out, cancelled): nothing
            # it sends now is analysed. Refused as final (the agent retries no INVALID_ARGUMENT).
            raise NotForSweep(f"upload {header.upload_id}: sweep {header.sweep_id} no longer waits for node "
                              f"{header.node} ({record.state.value}: {record.reason}); its capture is not used")

    def stored_artifacts(self, sweep_id: str, kinds: Collection[str] = ()) -> list[UploadHeader]:
        """A sweep's stored artifacts of ``kinds`` (every kind where empty), by node and name:
        each node's file once, its latest upload. An unknown sweep is UnknownSweep."""
        uploads = self.store.uploads(sw.check_sweep_id(sweep_id))
        if not uploads:
            self.sweep(sweep_id)  # none stored, or no such sweep: say which
        latest = {(u.node, u.name): u for u in uploads}  # in the order they completed: the last stays
        order = sorted(latest, key=lambda key: tuple(map(node_name.sort_key, key)))  # rank2's file before rank10's too
        return [latest[key] for key in order if not kinds or latest[key].kind in kinds]

    def read_artifact(self, sweep_id: str, node: str, name: str, offset: int = 0) -> Iterator[bytes]:
        """The bytes of a sweep's stored artifact from ``offset``, in chunks of the configured
        chunk size."""
        upload = self.store.latest_upload(sw.check_sweep_id(sweep_id), node, name)
        if upload is None:
            self.sweep(sweep_id)  # an unknown sweep says so
            raise UnknownArtifact(f"sweep {sweep_id} has no stored artifact {name!r} of node {node!r}")
        if not 0 <= offset <= upload.size:
            raise InputError(f"offset {offset} is outside artifact {name!r} of node {node!r} ({upload.size} bytes)")
        return self.artifacts.read(upload.sha256, self.config.chunk_bytes, offset)

    def _ended(self, sweep_id: str) -> bool:
        """Known to have ended: no longer active, and stored as final (under the lock)."""
        return self._standing(sweep_id) == "ended"

    def _standing(self, sweep_id: str) -> str:
        """Where a sweep stands, under the lock: "active"; stored as "ended" (final) or "stored"
        (not final, or a record that does not parse: not known to have ended); or "unknown"."""
        if sweep_id in self._active:
            return "active"
        try:
            return "ended" if self.store.sweep(sweep_id).final else "stored"
        except sw.UnknownSweep:
            return "unknown"
        except UnreadableSweep:
            return "stored"

    # sweeps -------------------------------------------------------------------------

    def start_sweep(self, spec: sw.SweepSpec, *, names: list[str], labels: Mapping[str, str],
                    everything: bool) -> sw.Sweep:
        if spec.backend and not _NAME.fullmatch(spec.backend):
            raise InputError(f"capture backend {quoted(spec.backend)} is not a "
                             "backend's name (up to 64 letters, digits, '._-': sim, nsys, torch)")
        _check_options(spec.options)
        if not 0 < spec.duration_s <= MAX_DURATION_S:
            raise InputError(f"capture window {spec.duration_s:g}s: it must be positive and at most "
                             f"{MAX_DURATION_S:g}s (DCGM stays paused throughout; capture more often instead)")
        if spec.timeout_s == 0:  # unset (proto3's default): the window plus the node timeout, within the limit
            spec = replace(spec, timeout_s=min(spec.duration_s + self.config.node_timeout_s, MAX_TIMEOUT_S))
        elif not math.isfinite(spec.timeout_s):  # a gRPC client's NaN or inf: no deadline could be set
            raise InputError(f"timeout {spec.timeout_s}s is not a finite number of seconds")
        elif spec.timeout_s < 0:  # a client's mistake, not a request for the default
            raise InputError(f"timeout {spec.timeout_s:g}s: it must be positive (or unset, for the capture "
                             "window plus the coordinator's node timeout)")
        elif spec.timeout_s <= spec.duration_s:  # every node would time out, each one's capture wasted
            raise InputError(f"timeout {spec.timeout_s:g}s ends before the {spec.duration_s:g}s capture window "
                             "does: nodes need time after it to export and upload")
        if spec.timeout_s > MAX_TIMEOUT_S:
            raise InputError(f"timeout {spec.timeout_s:g}s is over the limit of {MAX_TIMEOUT_S:g}s (a node is in one "
                             "capture at a time: the sweep's nodes are held until it ends)")
        with self._lock:
            agents = self.store.agents()
            connected = self.registry.connected()
            # Agents connected when this coordinator last stopped, within the restart grace: on
            # their way back, counted as connected by a sweep by label or all (which waits for them).
            returning = self._returning if self.clock() < self._returning_until_ns else set()
            nodes = select_nodes(agents, connected | returning, names=names, labels=labels, everything=everything,
                                 since_ns=self.clock() - int(AWAY_KEEP_S * 1e9))
            # By label or all, a node whose agent is away fails at once (below): what it offers
            # must not refuse the sweep of the rest, as a down node would a health sweep.
            judged = set(nodes) if names else set(nodes) & (connected | returning)
            if not spec.backend:
                spec = replace(spec, backend=default_backend(a for a in agents if a.node in judged))
            lacking = [a for a in agents if a.node in judged and a.backends and spec.backend not in a.backends]
            lacking.sort(key=lambda a: node_name.sort_key(a.node))
            if lacking:
                raise InputError("; ".join(
                    f"node {a.node} offers capture backends {', '.join(a.backends)}, not {spec.backend!r}" for a in lacking
                ))
            check_options_read((a for a in agents if a.node in judged), spec.backend, spec.options)
            check_flags(spec.options)
            if spec.backend == sim_options.BACKEND:  # read as its agents will: a bad value would fail every node
                sim_options.check(spec.options)
            busy = self._busy()
            away = [name for name in nodes if name not in connected]
            # Chosen by label or all, a node whose agent is away fails at once, named: a health
            # sweep must not pass without it unseen, nor wait out its timeout. Named, it waits;
            # so does one whose agent is on its way back after this coordinator's restart.
            waited = away if names else [name for name in away if name in returning]
            # Not on its way back: it waits until the timeout, across restarts too (`_awaited`).
            unheard = [name for name in waited if name not in returning]
            sweep, instructions = sw.Sweep.start(spec, nodes, self.clock(), busy=busy,
                                                 away=[name for name in away if name not in waited], waited=unheard)
            self._awaited.difference_update(unheard)
            for name in waited:  # say so rather than an unexplained wait
                self._heard.pop(name, None)  # nor judged lost while it waits: once it connects
                sweep.nodes[name].detail = ("agent reconnecting after the coordinator's restart" if name in returning else
                                            "agent not connected") + ": it gets the capture if it connects in time"
            self.store.save_sweep(sweep)  # a full disk refuses a new sweep rather than run it unsaved
            self._active[sweep.sweep_id] = sweep
            self._apply(sweep, instructions)
            log.info("sweep %s started on %s", sweep.sweep_id, ", ".join(nodes))
            return copy.deepcopy(sweep)

    def _busy(self) -> dict[str, str]:
        """Node -> the running sweep whose capture holds it (under the lock)."""
        return {name: sweep.sweep_id for sweep in self._active.values() for name in sweep.open_nodes()}

    def nodes(self, labels: Mapping[str, str] | None = None) -> list[NodeView]:
        """The agents known (with all of ``labels``), by node name: connected or not, and the
        sweep capturing there."""
        with self._lock:
            agents, connected, busy = self.store.agents(), self.registry.connected(), self._busy()
        chosen = [a for a in agents if has_labels(a, labels or {})]
        chosen.sort(key=lambda a: node_name.sort_key(a.node))
        return [NodeView(a, a.node in connected, busy.get(a.node, "")) for a in chosen]

    def cancel_sweep(self, sweep_id: str, reason: str) -> sw.Sweep:
        """Stop a running sweep: its open nodes' captures end (DCGM back), what finished is analysed."""
        sw.check_sweep_id(sweep_id)
        if len(reason) > MAX_REASON_CHARS:
            raise InputError(f"a cancel's reason is {len(reason)} characters, over the limit of {MAX_REASON_CHARS} "
                             "(it is every stopped node's reason)")
        with self._lock:
            sweep = self._active.get(sweep_id)
            if sweep is None or sweep.state is not sw.SweepState.RUNNING:
                state = (sweep or self.store.sweep(sweep_id)).state.value
                raise InputError(f"sweep {sweep_id} is {state}: only a running sweep can be cancelled")
            self._apply(sweep, sweep.handle(sw.Cancelled(reason, self.clock())))
            log.info("sweep %s cancelled: %s", sweep_id, reason)
            return copy.deepcopy(sweep)

    def sweep(self, sweep_id: str) -> sw.Sweep:
        sw.check_sweep_id(sweep_id)
        with self._lock:
            active = self._active.get(sweep_id)
            return copy.deepcopy(active) if active else self.store.sweep(sweep_id)

    def sweeps(self, limit: int = 0) -> list[sw.Sweep]:
        """Newest first, as stored; a sweep in flight as it is now (its last save may have failed)."""
        stored = self.store.sweeps(limit=limit)
        with self._lock:
            return [copy.deepcopy(self._active[s.sweep_id]) if s.sweep_id in self._active else s for s in stored]

    def watch(self, sweep_id: str, active: Callable[[], bool]) -> Iterator[tuple[sw.Sweep, str]]:
        """The sweep now, then after each change, until it is final or ``active()`` turns false.
        A node's change comes with that node's record only; the first, the sweep-level and the
        final snapshots have every node's."""
        changes: queue.Queue = queue.Queue()
        with self._lock:
            current = self.sweep(sweep_id)
            self._watchers.setdefault(sweep_id, []).append(changes)
        try:
            yield current, ""
            while not current.final and active():
                if self._stop.is_set():
                    raise TransportError("the coordinator is shutting down; watch again once it is back")
                try:
                    current, node = changes.get(timeout=0.5)
                except queue.Empty:
                    continue
                yield current, node
        finally:
            with self._lock:
                self._watchers[sweep_id].remove(changes)
                if not self._watchers[sweep_id]:
                    del self._watchers[sweep_id]

    def report(self, sweep_id: str) -> tuple[sw.Sweep, str, str]:
        """The sweep, its report JSON and the report's path ("" while there is none)."""
        sweep = self.sweep(sweep_id)
        path = self.store.report_path(sweep_id)
        if path is None:
            return sweep, "", ""
        return sweep, reports.read_text(path), str(path)

    # the shell ----------------------------------------------------------------------

    def _order(self, sweep: sw.Sweep) -> CaptureOrder:
        """The sweep's StartCapture: the same for every node, and again after reconnects."""
        return CaptureOrder(sweep.sweep_id, sweep.spec, sweep.created_ns + int(self.config.window_lead_s * 1e9))

    def _apply(self, sweep: sw.Sweep, instructions: list[sw.Instruction]) -> None:
        """Carry out a machine's instructions; called with the lock held."""
        changed: list[str] = []
        for instruction in instructions:
            if isinstance(instruction, sw.Changed):
                changed.append(instruction.node)
            elif isinstance(instruction, sw.SendCapture):
                self.registry.send(instruction.node, self._order(sweep))
            elif isinstance(instruction, sw.CancelNode):
                self.registry.send(instruction.node, CancelOrder(sweep.sweep_id, instruction.reason))
            elif isinstance(instruction, sw.Analyse):
                self._analysis.submit(self._run_analysis, copy.deepcopy(sweep), instruction.digests)
        if not changed:
            return
        self._save(sweep, None if "" in changed else sorted(set(changed)))
        watchers = self._watchers.get(sweep.sweep_id, [])
        if not watchers:
            return
        # Every node's state in the first event of a watch, on sweep-level changes and at the
        # end; otherwise only the node that changed: a fleet's statuses cost linear, not square.
        whole = copy.deepcopy(sweep) if sweep.final or "" in changed else None
        for node in changed:
            snapshot = whole or copy.deepcopy(sweep.only([node]))
            for watcher in watchers:
                watcher.put((snapshot, node))

    def _save(self, sweep: sw.Sweep, nodes: list[str] | None = None) -> None:
        """Store the sweep (the given nodes' records), and retire it once final and stored.
        On a full disk it stays active in memory, so watchers, deadlines and the analysis go
        on; the ticker saves it whole once there is room. Called with the lock held."""
        unsaved = sweep.sweep_id in self._unsaved
        try:
            self.store.save_sweep(sweep, None if unsaved else nodes)
        except StorageFull as exc:
            if not unsaved:
                log.error("sweep %s: state kept in memory until it can be saved: %s", sweep.sweep_id, exc)
                self._unsaved.add(sweep.sweep_id)
            return
        if unsaved:
            self._unsaved.discard(sweep.sweep_id)
            log.warning("sweep %s: state saved again", sweep.sweep_id)
        if sweep.final:
            self._active.pop(sweep.sweep_id, None)
            log.info("sweep %s %s%s", sweep.sweep_id, sweep.state.value,
                     f" (missing: {', '.join(sweep.missing)})" if sweep.missing else "")
            if dropped := self.artifacts.drop_partials(sweep.sweep_id):
                log.info("sweep %s: removed %d upload(s) it ended before", sweep.sweep_id, len(dropped))

    def _run_analysis(self, sweep: sw.Sweep, digests: tuple[tuple[str, sw.ArtifactInfo], ...]) -> None:
        out = self.config.reports_dir / f"{sweep.sweep_id}.json"
        try:
            paths, lost = [], []
            for node, artifact in digests:
                if self.artifacts.has(artifact.sha256):  # with the ranks its node said it holds (as in its header)
                    paths.append((self.artifacts.path_of(artifact.sha256), node, artifact.name, artifact.ranks))
                else:  # removed since it was stored (by hand, a restored disk): that node's loss alone
                    lost.append((node, f"its digest {artifact.name} ({artifact.sha256[:12]}) is no longer in the "
                                       "coordinator's artifact store"))
            event: sw.Event = reports.build(sweep, paths, self.clock_hints(), out, self.clock(), self.analyze, lost=lost)
            self.store.save_report(sweep.sweep_id, out, self.clock())
        except RankscopeError as exc:
            notes = reports.node_notes(sweep)  # often why: a rank that never recorded
            event = sw.AnalysisFailed(f"analysis failed: {exc}" + "".join(f"; {note}" for note in notes), self.clock())
        except Exception as exc:  # a bug in the analysis must not leave the sweep analysing forever
            log.exception("analysis of sweep %s crashed", sweep.sweep_id)
            event = sw.AnalysisFailed(f"analysis crashed: {type(exc).__name__}: {exc}", self.clock())
        with self._lock:
            live = self._active.get(sweep.sweep_id)
            if live is not None:
                self._apply(live, live.handle(event))

    def _tick_loop(self) -> None:
        last = time.monotonic_ns()
        while not self._stop.wait(TICK_S):
            now = self.clock()
            with self._lock:
                tick = time.monotonic_ns()
                self._judge_lost(tick - last)
                last = tick
                self._feed(sw.Tick(now))
                if self._unsaved and time.monotonic() >= self._save_retry_at:
                    self._save_retry_at = time.monotonic() + SAVE_RETRY_S
                    for sweep_id in list(self._unsaved):
                        self._save(self._active[sweep_id])
