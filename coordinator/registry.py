"""Agents the coordinator knows: their records, their live sessions, their clocks.

An :class:`AgentRecord` is what registration tells us (persisted in the store); a
:class:`Connection` is one live session stream with its outbox of commands; the
:class:`Registry` holds the connections and picks a sweep's nodes. The coarse clock
offset of each agent comes from round-trip-timed pings (the sample with the
smallest round trip wins, as in NTP's clock filter); it is only a hint for the
analysis, which aligns on collectives.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from rankscope import capture_options
from rankscope.errors import ConfigError, InputError, RankscopeError, quoted
from rankscope.node_name import items, natural

CLOCK_SAMPLES = 16
# What an agent that registered no backends runs: the agent's own default.
DEFAULT_BACKEND = "nsys"


class UnknownAgent(InputError):
    """No agent registered under that name, id or token."""


class SessionLimit(RankscopeError):
    """The coordinator holds as many agent sessions as it serves; this one must wait."""


class NodeTakenOver(ConfigError):
    """A newer session for the same node replaced this live one: two agents run under one
    node name (a restarted agent replaces its own stale session and never sees this)."""


@dataclass
class AgentRecord:
    agent_id: str
    node: str
    hostname: str
    token: str
    registered_ns: int
    labels: dict[str, str] = field(default_factory=dict)
    gpus: list[dict] = field(default_factory=list)
    ranks: list[dict] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    backends: list[str] = field(default_factory=list)
    # Backend -> the capture options it reads, as the agent said; a backend left out (an agent
    # older than this, a record saved before it): not said, the agent judges on its own.
    capture_options: dict[str, list[str]] = field(default_factory=dict)
    last_seen_ns: int = 0
    clock_offset_ns: int | None = None  # agent clock minus coordinator clock
    rtt_ns: int | None = None  # round trip of the sample the offset comes from


@dataclass(frozen=True)
class ClockSample:
    offset_ns: int
    rtt_ns: int


def clock_sample(sent_ns: int, agent_ns: int, received_ns: int) -> ClockSample:
    """Offset assuming the reply was stamped half way through the round trip."""
    rtt = max(0, received_ns - sent_ns)
    return ClockSample(offset_ns=agent_ns - (sent_ns + rtt // 2), rtt_ns=rtt)


class Connection:
    """One agent's live session: commands queued here are sent down its stream."""

    def __init__(self, agent: AgentRecord) -> None:
        self.agent = agent
        self.taken_over_by: str | None = None  # gRPC's name of the newer session's peer, e.g. ipv4:10.0.0.7:51234
        self.outbox: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        self.samples: deque[ClockSample] = deque(maxlen=CLOCK_SAMPLES)
        self.pings: dict[int, int] = {}  # ping id -> coordinator send time
        self.next_ping = 1

    @property
    def node(self) -> str:
        return self.agent.node

    def send(self, command: object) -> None:
        self.outbox.put(command)

    def close(self) -> None:
        self.closed.set()
        self.outbox.put(None)  # wakes the stream's writer

    def add_sample(self, sample: ClockSample) -> ClockSample:
        """Record one ping's sample; return the current best (smallest round trip)."""
        self.samples.append(sample)
        return min(self.samples, key=lambda s: s.rtt_ns)


class Registry:
    def __init__(self) -> None:
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()

    def connect(self, agent: AgentRecord, peer: str = "", *, limit: int | None = None) -> Connection:
        """A new session for this node replaces (and closes) an older one: a restarted
        agent's, or that of another agent under the same name, which is told so. A new
        node beyond ``limit`` sessions is refused."""
        connection = Connection(agent)
        with self._lock:
            previous = self._connections.get(agent.node)
            if previous is None and limit is not None and len(self._connections) >= limit:
                raise SessionLimit(f"coordinator at its limit of {limit} agent sessions (half its RPC workers): "
                                   "its operator can raise RANKSCOPE_MAX_WORKERS")
            self._connections[agent.node] = connection
            if previous is not None:
                previous.taken_over_by = peer
        if previous is not None:
            previous.close()
        return connection

    def disconnect(self, connection: Connection) -> None:
        with self._lock:
            if self._connections.get(connection.node) is connection:
                del self._connections[connection.node]
        connection.close()

    def get(self, node: str) -> Connection | None:
        with self._lock:
            return self._connections.get(node)

    def send(self, node: str, command: object) -> bool:
        connection = self.get(node)
        if connection is None:
            return False
        connection.send(command)
        return True

    def connected(self) -> set[str]:
        with self._lock:
            return set(self._connections)

    def close_all(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for connection in connections:
            connection.close()


# A node chosen by label or all whose agent has been away longer is taken as gone from the
# fleet (decommissioned, or replaced under a new name, as autoscaled nodes are): left out,
# where one away for less is in the sweep, named missing.
AWAY_KEEP_S = 86400.0


def select_nodes(
    agents: Iterable[AgentRecord],
    connected: set[str],
    *,
    names: Iterable[str] = (),
    labels: Mapping[str, str] | None = None,
    everything: bool = False,
    since_ns: int | None = None,
) -> list[str]:
    """The nodes a sweep targets: named ones, else those with the labels, or all; known ones,
    connected or not (the caller says which are away: a health sweep by label must name a node
    whose agent is down, not pass without it), less, by label or all, those not seen since
    ``since_ns`` (decommissioned, renamed: gone from the fleet). By label or all, at least one
    is connected (``connected``: the caller counts agents on their way back after its restart)."""
    known = {a.node: a for a in agents}
    names = list(names)
    if names:
        unknown = natural(set(names) - set(known))
        if unknown:
            raise UnknownAgent(f"no agent registered as {_some(unknown)} (known: {_some(natural(known)) or 'none'})")
        return natural(set(names))
    if since_ns is not None:
        known = {node: a for node, a in known.items() if node in connected or a.last_seen_ns >= since_ns}
    if labels:
        chosen = natural(a.node for a in known.values() if has_labels(a, labels))
        if not connected.intersection(chosen):
            raise UnknownAgent(f"no connected agent has labels {labels_text(labels)}" + _away(chosen))
        return chosen
    if not everything:
        raise InputError("choose the sweep's nodes: by name, by label, or all")
    if not connected.intersection(known):
        raise UnknownAgent("no agent is connected" + _away(natural(known)))
    return natural(known)


def has_labels(agent: AgentRecord, labels: Mapping[str, str]) -> bool:
    """Whether the agent carries every one of ``labels`` (any agent, for none)."""
    return all(agent.labels.get(k) == v for k, v in labels.items())


def labels_text(labels: Mapping[str, str]) -> str:
    """Labels as `--labels` takes them: K=V,... (sorted)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _away(nodes: list[str], shown: int = 5) -> str:
    """" (not connected: a, b, ...)" where registered nodes are away, briefly at fleet scale."""
    if not nodes:
        return ""
    return f" (not connected: {_some(nodes, shown)})"


def _some(nodes: list[str], shown: int = 5) -> str:
    """"a, b, c and 7 more": the first names of a list, briefly at fleet scale."""
    more = f" and {len(nodes) - shown} more" if len(nodes) > shown else ""
    return ", ".join(nodes[:shown]) + more


def check_options_read(agents: Iterable[AgentRecord], backend: str, options: Collection[str]) -> None:
    """Refuse a sweep's ``options`` that a node's ``backend`` does not read, as its agent said:
    named before the sweep starts, not as each node's capture fails. A node whose agent said
    nothing of ``backend`` is not judged here (its agent refuses them itself)."""
    refused: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for agent in agents:
        reads = agent.capture_options.get(backend)
        if reads is not None:
            for option in capture_options.unread(options, reads):
                refused.setdefault((option, tuple(sorted(reads))), []).append(agent.node)
    if refused:
        raise InputError("; ".join(
            f"unknown capture option {quoted(option)} for the {backend} backend on {_some(natural(nodes))} "
            f"(it reads: {', '.join(reads) or 'none'})" for (option, reads), nodes in sorted(refused.items())
        ))


def default_backend(agents: Iterable[AgentRecord]) -> str:
    """The capture backend of a sweep that names none: the default (first offered) of
    every chosen node, where they agree."""
    defaults = {a.node: (a.backends or [DEFAULT_BACKEND])[0] for a in agents}
    chosen = set(defaults.values())
    if len(chosen) > 1:
        differ = ", ".join(f"{node}: {backend}" for node, backend in items(defaults))
        raise InputError(f"the nodes' default capture backends differ ({differ}): name one for the sweep")
    return chosen.pop() if chosen else DEFAULT_BACKEND
