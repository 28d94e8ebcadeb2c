"""A sweep (one fleet-wide capture) as a pure state machine.

Each targeted node moves through the states its agent reports (pending, pausing
DCGM, capturing, exporting, uploading, uploaded, DCGM resumed), and the sweep ends
when every node has finished, failed or run past the sweep's deadline: then the
digests of the finished nodes are analysed and the sweep is ANALYSED, or PARTIAL
with the others named. The machine does no I/O: the coordinator feeds it events
and carries out the instructions it returns, and it round-trips through plain
dicts so a restarted coordinator picks it up where it was.
"""

from __future__ import annotations

import enum
import re
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace

from rankscope.errors import InputError
from rankscope.node_name import natural
from rankscope.records import known_fields
from rankscope.states import AGENT_DONE, NodeState


class SweepState(str, enum.Enum):
    RUNNING = "running"
    ANALYSING = "analysing"
    ANALYSED = "analysed"
    PARTIAL = "partial"
    FAILED = "failed"


# The agent's states in the order it moves through them; a re-sent earlier state is stale.
_PROGRESS = [
    NodeState.PENDING,
    NodeState.PAUSING_DCGM,
    NodeState.CAPTURING,
    NodeState.EXPORTING,
    NodeState.UPLOADING,
    NodeState.UPLOADED,
    NodeState.DCGM_RESUMED,
]
_ORDER = {state: i for i, state in enumerate(_PROGRESS)}
FINAL_SWEEP = frozenset({SweepState.ANALYSED, SweepState.PARTIAL, SweepState.FAILED})
# Why a node chosen by label or all, whose agent was not connected, is not in the capture.
AWAY = "agent not connected when the sweep started"
_SWEEP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class UnknownSweep(InputError):
    """No sweep with that id."""


@dataclass(frozen=True)
class ArtifactInfo:
    name: str
    sha256: str
    size: int
    kind: str  # "digest" | "raw"
    upload_id: str = ""
    ranks: tuple[int, ...] = ()


# The most export time an agent's bound may add to a node's deadline: the bound comes off the
# wire (an agent may send inf or 1e300), and the deadline is stored as int64 nanoseconds.
MAX_EXPORT_ALLOWANCE_S = 86_400.0


def _export_allowance_ns(allowance_s: float) -> int:
    return int(min(allowance_s, MAX_EXPORT_ALLOWANCE_S) * 1e9)


@dataclass
class NodeRecord:
    node: str
    state: NodeState = NodeState.PENDING
    detail: str = ""
    reason: str = ""
    dcgm: str = ""  # DCGM outcome as the agent reported it
    dcgm_detail: str = ""
    uploaded: bool = False
    dcgm_resumed: bool = False
    artifacts: list[ArtifactInfo] = field(default_factory=list)
    updated_ns: int = 0
    notes: list[str] = field(default_factory=list)  # what its capture went on without
    # Export time is not counted against the sweep's timeout, up to the agent's own bound on
    # it: nsys exports grow with ranks and trace size, not with the capture window.
    exporting_since_ns: int = 0  # while it exports: since when
    export_allowance_ns: int = 0  # while it exports: the agent's bound on it
    export_credit_ns: int = 0  # time spent exporting, added to its deadline
    export_cut: str = ""  # why its running export counts only for a grace: how its agent went away
    digest_only: bool = False  # ended on its stored digest, its raw exports cut short (`_on_its_digest`)
    # Named while its agent was away: waited for until the timeout, as it may connect in time,
    # a coordinator restart's grace notwithstanding, until its agent connects (`AgentConnected`).
    agent_away: bool = False

    def deadline_ns(self, sweep_deadline_ns: int, now_ns: int) -> int:
        """When this node times out: the sweep's deadline, pushed back by its export time."""
        exporting = min(now_ns - self.exporting_since_ns, self.export_allowance_ns) if self.exporting_since_ns else 0
        return sweep_deadline_ns + self.export_credit_ns + exporting

    def note_export(self, state: NodeState, at_ns: int, allowance_s: float) -> None:
        """Start or stop the clock that is not counted against the timeout; a repeated
        EXPORTING (after a reconnect) keeps it running, with the agent's bound again."""
        self.export_cut = ""
        if self.exporting_since_ns and state is NodeState.EXPORTING:
            if allowance_s > 0:
                self.export_allowance_ns = _export_allowance_ns(allowance_s)
            return
        if self.exporting_since_ns:
            self.export_credit_ns += min(at_ns - self.exporting_since_ns, self.export_allowance_ns)
            self.exporting_since_ns = self.export_allowance_ns = 0
        if state is NodeState.EXPORTING and allowance_s > 0:
            self.exporting_since_ns, self.export_allowance_ns = at_ns, _export_allowance_ns(allowance_s)

    def cut_export(self, until_ns: int, why: str) -> bool:
        """Count a running export only until ``until_ns`` (its agent went away, ``why``: the
        time it has to come back, not the bound it gave); True where that shortened it."""
        allowance = until_ns - self.exporting_since_ns
        if not self.exporting_since_ns or allowance >= self.export_allowance_ns:
            return False
        self.export_allowance_ns, self.export_cut = max(0, allowance), why
        return True

    @property
    def finished(self) -> bool:
        """Its data is in and its DCGM is back: it can be analysed."""
        return self.uploaded and self.dcgm_resumed and self.state is not NodeState.FAILED

    @property
    def terminal(self) -> bool:
        return self.finished or self.state in (NodeState.FAILED, NodeState.TIMED_OUT, NodeState.CANCELLED,
                                               NodeState.ANALYSED)

    @property
    def digests(self) -> list[ArtifactInfo]:
        return [a for a in self.artifacts if a.kind == "digest"]


@dataclass(frozen=True)
class SweepSpec:
    backend: str
    duration_s: float
    timeout_s: float  # from the sweep's start; nodes not finished by then are timed out
    options: Mapping[str, str] = field(default_factory=dict)
    upload_raw: bool = False
    targets: str = ""  # how the user chose the nodes, for display


# Events: what happened. ------------------------------------------------------------


@dataclass(frozen=True)
class NodeReported:
    node: str
    state: NodeState
    at_ns: int
    detail: str = ""
    reason: str = ""
    dcgm: str = ""
    dcgm_detail: str = ""
    artifacts: tuple[ArtifactInfo, ...] = ()
    notes: tuple[str, ...] = ()
    export_timeout_s: float = 0.0  # with EXPORTING: the agent's bound on its exports


@dataclass(frozen=True)
class AgentLost:
    """A node's agent is judged lost (killed, its node down or cut off): its open node fails
    now, named, rather than hold the sweep until its timeout."""

    node: str
    why: str  # on what: "not heard from for 30s, its session ended", "not back within 60s of ..."
    at_ns: int


@dataclass(frozen=True)
class AgentConnected:
    """A node's agent opened a session: a node named while it was away is so no longer, and is
    judged as any other (on its silence, on its return after a restart) even before it reports."""

    node: str
    at_ns: int


@dataclass(frozen=True)
class Tick:
    now_ns: int


@dataclass(frozen=True)
class RankOn:
    """A rank and the node it ran on, by the name of the agent that uploaded its digest (a
    straggler in a sweep's report)."""

    rank: int
    node: str


@dataclass(frozen=True)
class SlowLink:
    """A communicator whose bus bandwidth stood out low in a sweep's report (analysis/links.py)."""

    comm_id: str
    op: str
    ranks: tuple[int, ...]
    busbw_gbps: float
    peers_busbw_gbps: float  # median of the like communicators


@dataclass(frozen=True)
class AnalysisDone:
    report_path: str
    at_ns: int
    stragglers: tuple[RankOn, ...] = ()
    slow_links: tuple[SlowLink, ...] = ()
    stragglers_not_judged: str = ""  # the report's reason, where no straggler is named and it could not tell
    unusable: tuple[tuple[str, str], ...] = ()  # (node, why): its digests unsound on their own; left out, failed


@dataclass(frozen=True)
class AnalysisFailed:
    error: str
    at_ns: int


@dataclass(frozen=True)
class Restarted:
    """The coordinator came back: give agents time to reconnect, redo lost analysis."""

    now_ns: int
    grace_ns: int


@dataclass(frozen=True)
class Cancelled:
    """A user stopped the sweep: its open nodes stop, what finished is analysed."""

    reason: str
    at_ns: int


Event = NodeReported | AgentLost | AgentConnected | Tick | AnalysisDone | AnalysisFailed | Restarted | Cancelled


# Instructions: what the coordinator must do next. ----------------------------------


@dataclass(frozen=True)
class SendCapture:
    node: str


@dataclass(frozen=True)
class CancelNode:
    node: str
    reason: str


@dataclass(frozen=True)
class Analyse:
    digests: tuple[tuple[str, ArtifactInfo], ...]  # (node, digest): two nodes may send one file


@dataclass(frozen=True)
class Changed:
    node: str = ""  # empty: a sweep-level change


Instruction = SendCapture | CancelNode | Analyse | Changed


@dataclass
class Sweep:
    sweep_id: str
    spec: SweepSpec
    created_ns: int
    deadline_ns: int  # no node times out before: the timeout's end, or a coordinator restart's grace
    nodes: dict[str, NodeRecord]
    state: SweepState = SweepState.RUNNING
    finished_ns: int = 0
    missing: list[str] = field(default_factory=list)
    report_path: str = ""
    error: str = ""
    stragglers: list[RankOn] = field(default_factory=list)  # once analysed: who the report flags
    slow_links: list[SlowLink] = field(default_factory=list)  # once analysed: the links it flags
    stragglers_not_judged: str = ""  # once analysed: why the report could not tell, where it could not

    @classmethod
    def start(cls, spec: SweepSpec, nodes: Iterable[str], now_ns: int, sweep_id: str | None = None,
              busy: Mapping[str, str] | None = None, away: Iterable[str] = (),
              waited: Iterable[str] = ()) -> tuple[Sweep, list[Instruction]]:
        """A new sweep over ``nodes``, and its captures to send; those in ``busy`` (node -> the
        sweep still capturing there: a node's ranks are in one capture at a time) fail at once,
        with that reason, as do those ``away`` (their agents not connected). Those ``waited``
        (named, their agents away) are marked `agent_away`. The caller stores the new sweep (no
        Changed: nobody watches it yet)."""
        names = natural(set(nodes))
        if not names:
            raise InputError("a sweep needs at least one node")
        busy = {n: busy[n] for n in names if n in busy} if busy else {}
        away = natural(set(away).intersection(names) - set(busy))
        if len(busy) + len(away) == len(names):
            raise InputError("; ".join([*([_busy_message(busy)] if busy else []),
                                        *([f"not connected: {', '.join(away)}"] if away else [])]))
        sweep = cls(
            sweep_id=sweep_id or new_sweep_id(now_ns),
            spec=spec,
            created_ns=now_ns,
            deadline_ns=now_ns + int(spec.timeout_s * 1e9),
            nodes={n: NodeRecord(n, updated_ns=now_ns) for n in names},
        )
        for name, other in busy.items():
            sweep.nodes[name].state = NodeState.FAILED
            sweep.nodes[name].reason = f"busy: still capturing for sweep {other}"
        for name in away:
            sweep.nodes[name].state = NodeState.FAILED
            sweep.nodes[name].reason = AWAY
        for name in set(waited).intersection(names):
            sweep.nodes[name].agent_away = True
        return sweep, [SendCapture(n) for n in names if n not in busy and n not in away]

    @property
    def final(self) -> bool:
        return self.state in FINAL_SWEEP

    def open_nodes(self) -> list[str]:
        """Nodes still expected to report: a (re)connecting agent gets StartCapture for these."""
        if self.state is not SweepState.RUNNING:
            return []
        return [n for n, rec in self.nodes.items() if not rec.terminal]

    def handle(self, event: Event) -> list[Instruction]:
        if isinstance(event, NodeReported):
            return self._reported(event)
        if isinstance(event, AgentLost):
            return self._agent_lost(event)
        if isinstance(event, AgentConnected):
            return self._agent_connected(event)
        if isinstance(event, Tick):
            return self._tick(event.now_ns)
        if isinstance(event, AnalysisDone):
            return self._analysed(event)
        if isinstance(event, AnalysisFailed):
            return self._analysis_failed(event)
        if isinstance(event, Restarted):
            return self._restarted(event)
        if isinstance(event, Cancelled):
            return self._cancelled(event)
        raise TypeError(f"not a sweep event: {event!r}")

    # transitions --------------------------------------------------------------------

    def _open(self, node: str) -> NodeRecord | None:
        """The node's record while news of it counts: None where the node is not in this
        sweep, or too late (a timed-out node stays named as missing)."""
        record = self.nodes.get(node)
        if record is None or record.terminal or self.state is not SweepState.RUNNING:
            return None
        return record

    def _reported(self, event: NodeReported) -> list[Instruction]:
        record = self._open(event.node)
        if record is None:
            return self._stop_ended(event)
        record.note_export(event.state, event.at_ns, event.export_timeout_s)
        record.agent_away = False
        if event.state is NodeState.FAILED:
            record.state, record.reason = NodeState.FAILED, event.reason or event.detail or "agent reported failure"
        elif event.state in _ORDER:
            if _ORDER[event.state] >= _ORDER.get(record.state, 0):
                record.state = event.state
            if event.state is NodeState.UPLOADED:
                record.uploaded = True
                record.artifacts = list(event.artifacts)
            elif event.state is NodeState.UPLOADING and event.artifacts:  # its digest, stored before its raw exports
                record.artifacts = list(event.artifacts)
            if event.state is NodeState.DCGM_RESUMED:
                record.dcgm_resumed = True
        else:
            return []  # ANALYSED / TIMED_OUT / CANCELLED are the coordinator's to set
        record.detail = event.detail
        if event.notes:
            record.notes = list(event.notes)
        if event.dcgm:
            record.dcgm, record.dcgm_detail = event.dcgm, event.dcgm_detail
        record.updated_ns = event.at_ns
        return [Changed(event.node), *self._maybe_analyse(event.at_ns)]

    def _agent_lost(self, event: AgentLost) -> list[Instruction]:
        if self._open(event.node) is None:
            return []
        why = f"agent of node {event.node} lost: {event.why}"
        return self._end([event.node], f"raw exports not all uploaded ({why})", NodeState.FAILED,
                         lambda record: f"{why} (last state: {record.state.value})", event.at_ns)

    def _agent_connected(self, event: AgentConnected) -> list[Instruction]:
        record = self._open(event.node)
        if record is None or not record.agent_away:
            return []
        # Its detail said "agent not connected"; stored, the cleared mark holds across a restart.
        record.agent_away, record.detail, record.updated_ns = False, "", event.at_ns
        return [Changed(event.node)]

    def _stop_ended(self, event: NodeReported) -> list[Instruction]:
        """An agent still at a capture that this running sweep has ended for its node (its agent
        judged lost, then back; timed out while away) is told to stop, as a cancel it missed:
        its ranks' recording ends and DCGM comes back now, not at its own deadline."""
        record = self.nodes.get(event.node)
        if record is None or record.finished or self.state is not SweepState.RUNNING or event.state in AGENT_DONE:
            return []
        return [CancelNode(event.node, record.reason)]

    def _tick(self, now_ns: int) -> list[Instruction]:
        if self.state is not SweepState.RUNNING or now_ns < self.deadline_ns:
            return []
        # Export time and a restart's grace both go uncounted; where they overlap, once.
        timeout_ns = self.created_ns + int(self.spec.timeout_s * 1e9)
        due = [name for name, record in self.nodes.items()
               if now_ns >= max(self.deadline_ns, record.deadline_ns(timeout_ns, now_ns))]

        def reason(record: NodeRecord) -> str:
            spent = record.deadline_ns(timeout_ns, now_ns) - timeout_ns
            exporting = f" and {spent / 1e9:g}s exporting" if spent else ""
            gone = f", its agent not back since {record.export_cut} mid-export" if record.export_cut else ""
            return f"no answer within {self.spec.timeout_s:g}s{exporting}{gone} (last state: {record.state.value})"

        return self._end(due, f"raw exports not all uploaded within {self.spec.timeout_s:g}s",
                         NodeState.TIMED_OUT, reason, now_ns)

    def _cancelled(self, event: Cancelled) -> list[Instruction]:
        if self.state is not SweepState.RUNNING:
            return []
        return self._end(list(self.nodes), f"raw exports not all uploaded ({event.reason})",
                         NodeState.CANCELLED, lambda record: event.reason, event.at_ns, told=event.reason)

    def _end(self, names: list[str], digest_why: str, state: NodeState, reason: Callable[[NodeRecord], str],
             at_ns: int, told: str | None = None) -> list[Instruction]:
        """End these nodes, each told to stop (why: ``told``, else what its record now says):
        one still uploading raw exports beside its stored digest finishes on the digest
        (`_on_its_digest`), any other unfinished one takes ``state`` and its ``reason``.
        Then analyse, where all have ended."""
        out: list[Instruction] = []
        for name in names:
            record = self.nodes[name]
            if _on_its_digest(record, digest_why, at_ns):
                out += [Changed(name), CancelNode(name, told or record.detail)]
            elif not record.terminal:
                record.state, record.reason, record.updated_ns = state, reason(record), at_ns
                out += [Changed(name), CancelNode(name, told or record.reason)]
        return out + self._maybe_analyse(at_ns)

    def _maybe_analyse(self, now_ns: int) -> list[Instruction]:
        if not all(rec.terminal for rec in self.nodes.values()):
            return []
        done = {n for n, rec in self.nodes.items() if rec.finished and rec.digests}
        self.missing = natural(set(self.nodes) - done)
        if not done:
            self.state, self.finished_ns = SweepState.FAILED, now_ns
            self.error = "no node delivered a digest: " + "; ".join(
                f"{n}: {self.nodes[n].reason or self.nodes[n].state.value}" for n in self.missing
            )
            return [Changed()]
        self.state = SweepState.ANALYSING
        return [Changed(), Analyse(self.digests())]

    def digests(self) -> tuple[tuple[str, ArtifactInfo], ...]:
        """Each finished node's digests, with the node."""
        return tuple((name, a) for name, rec in self.nodes.items() if rec.finished for a in rec.digests)

    def fail_unusable(self, unusable: Iterable[tuple[str, str]], at_ns: int) -> None:
        """Nodes whose digests the analysis could not use (unreadable, or wrong on their own):
        failed with why, named as missing."""
        for name, why in unusable:
            record = self.nodes[name]
            record.state, record.reason, record.detail, record.updated_ns = NodeState.FAILED, why, "", at_ns
            self.missing = natural({*self.missing, name})

    def _analysed(self, event: AnalysisDone) -> list[Instruction]:
        if self.state is not SweepState.ANALYSING:
            return []
        self.fail_unusable(event.unusable, event.at_ns)
        for name, record in self.nodes.items():
            if name not in self.missing:
                # The detail was the agent's for its last state ("dcgm paused", the pause's outcome,
                # on DCGM_RESUMED): under ANALYSED it read as DCGM paused again.
                record.state, record.detail, record.updated_ns = NodeState.ANALYSED, "", event.at_ns
        self.report_path = event.report_path
        self.stragglers = list(event.stragglers)
        self.slow_links = list(event.slow_links)
        self.stragglers_not_judged = event.stragglers_not_judged
        self.state = SweepState.PARTIAL if self.missing else SweepState.ANALYSED
        self.finished_ns = event.at_ns
        return [Changed()]

    def _analysis_failed(self, event: AnalysisFailed) -> list[Instruction]:
        if self.state is not SweepState.ANALYSING:
            return []
        self.state, self.error, self.finished_ns = SweepState.FAILED, event.error, event.at_ns
        return [Changed()]

    def _restarted(self, event: Restarted) -> list[Instruction]:
        if self.state is SweepState.RUNNING:
            self.deadline_ns = max(self.deadline_ns, event.now_ns + event.grace_ns)
            for record in self.nodes.values():  # every agent is away: exports count on for the grace
                if not record.terminal:
                    record.cut_export(event.now_ns + event.grace_ns, "the coordinator restarted")
            return [Changed()]
        if self.state is SweepState.ANALYSING:
            return [Analyse(self.digests())]
        return []

    # persistence --------------------------------------------------------------------

    def only(self, nodes: Iterable[str]) -> Sweep:
        """This sweep with only the named nodes' records (the same objects, not copies): what
        one node's change touches, so storing or showing it costs that node, not the fleet."""
        return replace(self, nodes={name: self.nodes[name] for name in nodes})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Sweep:
        spec = SweepSpec(**known_fields(SweepSpec, data["spec"]))
        nodes = {
            name: NodeRecord(**known_fields(NodeRecord, {
                **rec,
                "state": NodeState(rec["state"]),
                "artifacts": [ArtifactInfo(**known_fields(ArtifactInfo, {**a, "ranks": tuple(a["ranks"])}))
                              for a in rec["artifacts"]],
            }))
            for name, rec in data["nodes"].items()
        }
        # stragglers and slow links are absent in sweeps stored before they were kept; their
        # node was once stored as "host" (the trace's host name)
        stragglers = [RankOn(s["rank"], s.get("node", s.get("host", ""))) for s in data.get("stragglers", ())]
        slow_links = [SlowLink(**known_fields(SlowLink, {**link, "ranks": tuple(link["ranks"])}))
                      for link in data.get("slow_links", ())]
        return cls(**known_fields(cls, {**data, "spec": spec, "nodes": nodes, "state": SweepState(data["state"]),
                                  "stragglers": stragglers, "slow_links": slow_links}))


def _on_its_digest(record: NodeRecord, why: str, now_ns: int) -> bool:
    """Finish a node still uploading whose digest, all the analysis needs, is stored (only raw
    exports were on their way), with a note saying why; False for any other node. Its DCGM
    came back before the export, as the agent orders it."""
    if record.terminal or record.state is not NodeState.UPLOADING or not record.digests:
        return False
    note = f"{why}: the report stands on its digest"
    record.state, record.uploaded, record.dcgm_resumed, record.digest_only = NodeState.UPLOADED, True, True, True
    record.detail, record.notes, record.updated_ns = note, [*record.notes, note], now_ns
    return True


def _busy_message(busy: Mapping[str, str]) -> str:
    """Every target is still in another sweep's capture: which, briefly at fleet scale."""
    if len(busy) <= 3:
        return "; ".join(f"node {n} is still capturing for sweep {other}" for n, other in busy.items())
    others = sorted(set(busy.values()))
    return (f"all {len(busy)} target nodes are still capturing for sweep(s) {', '.join(others[:3])}"
            + (f" and {len(others) - 3} more" if len(others) > 3 else ""))


def new_sweep_id(now_ns: int | None = None) -> str:
    """Sortable by time, unique without coordination: 20261129T110512Z-3f9a1c."""
    now_s = (time.time_ns() if now_ns is None else now_ns) / 1e9
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s)) + "-" + secrets.token_hex(3)


def check_sweep_id(sweep_id: str) -> str:
    if not _SWEEP_ID.fullmatch(sweep_id):
        raise UnknownSweep(f"no sweep {sweep_id!r}")
    return sweep_id
