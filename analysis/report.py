"""The report: what `rankscope analyze` prints and the coordinator stores.

``Report.to_dict()`` is the JSON contract ``rankscope.report/1`` (issue 2, "CLI and
report contract"); ``Report.from_dict`` reads it back; ``render_table()`` is the
terminal view. Analysis code builds it (pipeline.py); nothing here computes metrics.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from rankscope.errors import InputError

SCHEMA = "rankscope.report/1"
# Rows of the rank and communicator tables a terminal shows at most; JSON has them all.
TABLE_ROWS = 64
_T = TypeVar("_T")


@dataclass
class RankRow:
    rank: int
    host: str
    clock_offset_ns: float
    clock_uncertainty_ns: float
    late_mean_ns: float | None
    late_p50_ns: float | None
    late_p99_ns: float | None
    late_max_ns: float | None
    last_arrival_share: float | None
    blame_ns: int
    nccl_kernel_ns: int
    nccl_wait_ns: int
    nccl_transfer_ns: int
    gpu_busy_pct: float | None
    collectives: int = 0
    matched: int = 0
    nccl_unmatched_ns: int = 0  # NCCL time in collectives matched to no instance: not split into wait and transfer
    own_delay_ns: float | None = None  # mean excess gap before arrival vs peers (straggler signal)
    straggler_score: float | None = None  # robust z-score of own_delay_ns, its scale floored; None: none taken
    late_cause: str | None = None  # stragglers: "compute" (busy until arrival) or "launch/host" (idle)
    # gpu_busy_pct split (alignment-and-metrics.md §7), % of the window: compute kernels alone,
    # NCCL kernels alone, both at once; idle is what the device did nothing in.
    gpu_compute_only_pct: float | None = None
    gpu_comm_only_pct: float | None = None
    gpu_overlap_pct: float | None = None
    gpu_idle_pct: float | None = None
    top_kernels: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class OpSpread:
    op: str
    calls: int
    instances: int
    bytes_median: float | None
    duration_mean_ns: float | None
    imbalance_cv: float | None  # CV across ranks of total NCCL time on this op
    transfer_mean_ns: float | None
    network_cv: float | None  # CV over time of transfer within a size class
    skew_mean_ns: float | None  # arrival skew: last minus first start
    skew_p99_ns: float | None
    busbw_gbps: float | None = None  # nccl-tests bus bandwidth of the transfer, GB/s (ops.bus_factor)


@dataclass
class CommunicatorRow:
    comm_id: str
    name: str | None
    kind: str  # tp, dp or other
    ranks: list[int]
    hosts: int
    ops: list[OpSpread]


@dataclass
class SlowCommunicator:
    """A (communicator, op) whose bus bandwidth stands out low among like ones (links.py)."""

    comm_id: str
    op: str
    ranks: list[int]
    busbw_gbps: float
    peers_busbw_gbps: float  # median of its class: same op, kind, member count, hosts, size class
    peers: int  # communicators in the class, itself included


@dataclass
class TpOverhead:
    comm_id: str
    name: str | None
    ranks: list[int]
    time_base: str  # "steps" or "window"
    step_time_ns: float | None
    exposed_ns: float | None
    exposed_wait_ns: float | None
    exposed_transfer_ns: float | None
    exposed_frac: float | None
    exposed_wait_frac: float | None
    exposed_transfer_frac: float | None  # the TP overhead


@dataclass
class HostClockRow:
    host: str
    offset_ns: float
    drift_ppm: float
    uncertainty_ns: float
    anchors: int
    method: str
    nonlinear_ns: float = 0.0  # largest windowed correction beyond the line (0: linear clock)


@dataclass
class Alignment:
    method: str
    matching: str
    t0_ns: int
    hosts: list[HostClockRow]
    collectives: int  # rows seen across ranks
    matched_collectives: int  # instances matched across ranks
    dropped_incomplete: int
    dropped_inconsistent: int
    anchors: int
    happens_before_checked: int
    happens_before_violations: int
    happens_before_violation_rate: float


@dataclass
class Report:
    job_id: str | None
    ranks: list[RankRow]
    stragglers: list[int]
    late_ranks: list[int]  # arrived late beyond clock uncertainty, root cause or propagated
    communicators: list[CommunicatorRow]
    tp_overhead: list[TpOverhead]
    alignment: Alignment
    top_kernels: list[dict[str, Any]]
    warnings: list[str]
    slow_communicators: list[SlowCommunicator] = field(default_factory=list)
    world_size: int | None = None  # where the traces say it
    missing_ranks: list[int] = field(default_factory=list)  # of that world, not in the input
    # why the traces could not tell whether any rank is a straggler (stragglers then []); None: judged
    stragglers_not_judged: str | None = None
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return _clean(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        if data.get("schema") != SCHEMA:
            raise InputError(f"not a {SCHEMA} report (schema {data.get('schema')!r})")
        try:
            alignment = dict(data["alignment"])
            alignment["hosts"] = [HostClockRow(**h) for h in alignment["hosts"]]
            return cls(
                job_id=data.get("job_id"),
                ranks=[RankRow(**r) for r in data["ranks"]],
                stragglers=list(data["stragglers"]),
                late_ranks=list(data.get("late_ranks", [])),
                communicators=[
                    CommunicatorRow(**{**c, "ops": [OpSpread(**o) for o in c["ops"]]}) for c in data["communicators"]
                ],
                tp_overhead=[TpOverhead(**t) for t in data["tp_overhead"]],
                alignment=Alignment(**alignment),
                top_kernels=list(data.get("top_kernels", [])),
                warnings=list(data.get("warnings", [])),
                slow_communicators=[SlowCommunicator(**c) for c in data.get("slow_communicators", [])],
                world_size=data.get("world_size"),
                missing_ranks=list(data.get("missing_ranks", [])),
                stragglers_not_judged=data.get("stragglers_not_judged"),
                schema=data["schema"],
            )
        except (KeyError, TypeError) as exc:
            raise InputError(f"malformed {SCHEMA} report: {exc}") from None

    def render_table(self) -> str:
        return "\n".join(_render(self))


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf become null, numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def fmt_ns(ns: float | None) -> str:
    """A duration with a unit a person reads at a glance (ns, µs, ms, s)."""
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return "-"
    size = abs(ns)
    if size < 1e3:
        return f"{ns:.0f} ns"
    if size < 1e6:
        return f"{ns / 1e3:.1f} µs"
    if size < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def _shown(value: float | None, spec: str, unit: str = "") -> str:
    """``value`` formatted by ``spec``, then ``unit``; "-" where it is unknown."""
    return "-" if value is None or not math.isfinite(value) else format(value, spec) + unit


def _pct(value: float | None) -> str:
    return _shown(value, ".1%")


def _num(value: float | None) -> str:
    return _shown(value, ".2f")


_RATES = ((1.0, "GB/s"), (1e-3, "MB/s"), (1e-6, "KB/s"))  # in GB/s, largest first


def fmt_gbps(value: float | None) -> str:
    """A bandwidth given in GB/s, shown in the unit that keeps it readable: a 4-byte
    flag's AllReduce runs at KB/s, where GB/s reads "1.97e-06"."""
    if value is None or not math.isfinite(value):
        return "-"
    scale, unit = next(((scale, unit) for scale, unit in _RATES if abs(value) >= scale), _RATES[-1])
    return f"{value / scale:.3g} {unit}"


def _most(items: list[_T], first: Callable[[_T], tuple]) -> list[_T]:
    """All of ``items``, or the `TABLE_ROWS` of them that sort first by ``first``, in
    their own order: what a person looks at first in a job too large to read whole."""
    if len(items) <= TABLE_ROWS:
        return items
    chosen = sorted(range(len(items)), key=lambda i: first(items[i]))[:TABLE_ROWS]
    return [items[i] for i in sorted(chosen)]


def _not_shown(shown: int, total: int, which: str) -> list[str]:
    return [] if shown == total else [f"({total - shown} more not shown: those shown are {which}; "
                                      f"--format json lists all {total})"]


def _table(header: list[str], rows: list[list[str]], *, text_last: bool = False) -> list[str]:
    """Aligned columns, the first (the row's label) left, the others right; with
    ``text_last`` the label is the last column instead, as long as it is (a name of any
    length, whole: no column after it to push)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    label = len(header) - 1 if text_last else 0
    if text_last:
        widths[label] = len(header[label])

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if i != label else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(padded[:-1] + [cells[-1]] if text_last else padded)

    return [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]


def _render(report: Report) -> list[str]:
    """The table's sections, in the order a reader looks: who is late and why, each rank,
    each communicator, then the details."""
    by_rank = {r.rank: r for r in report.ranks}
    return [
        *_headline(report), "",
        *_straggler_lines(report, by_rank), "",
        *_rank_table(report), "",
        *_communicator_table(report),
        *_section("SLOW LINKS (bus bandwidth far below like communicators': same op, kind, size and hosts)",
                  _slow_link_lines(report)),
        *_section("TP OVERHEAD (exposed NCCL time, not overlapped by compute, per rank of the group;\n"
                  "             share = exposed / time, split into wait and transfer)",
                  _tp_table(report)),
        *_section("TOP KERNELS (all ranks)", _kernel_table(report)),
        *_section("WARNINGS", [f"  - {w}" for w in report.warnings]),
    ]


def _section(title: str, lines: list[str]) -> list[str]:
    """A titled section after a blank line; nothing where it has no lines."""
    return ["", title, *lines] if lines else []


def _headline(report: Report) -> list[str]:
    a = report.alignment
    hosts = len({r.host for r in report.ranks})
    return [
        f"rankscope report — {f'job {report.job_id}: ' if report.job_id else ''}{len(report.ranks)}"
        + (f" of {report.world_size}" if report.missing_ranks else "")
        + f" ranks on {hosts} host(s)" + (f" (missing: {ranks_text(report.missing_ranks)})" if report.missing_ranks else ""),
        f"alignment: {a.method}; matched {a.matched_collectives} collective instances ({a.matching}), "
        f"dropped {a.dropped_incomplete} incomplete + {a.dropped_inconsistent} inconsistent; "
        + (f"happens-before violations {a.happens_before_violations}/{a.happens_before_checked} "
         f"({_pct(a.happens_before_violation_rate)})" if a.happens_before_checked else
         "happens-before not checked (no N-to-N instance matched)"),
    ]


def _straggler_lines(report: Report, by_rank: dict[int, RankRow]) -> list[str]:
    """The stragglers (or why none), then the other ranks that arrived late."""
    if report.stragglers:
        out = ["STRAGGLERS (root cause: own delay before arriving, vs. peers)"]
        for rank in report.stragglers:
            r = by_rank[rank]
            out.append(
                f"  rank {rank} on {r.host}: {r.late_cause or 'cause unknown'}, own delay {fmt_ns(r.own_delay_ns)} per collective, "
                f"late {fmt_ns(r.late_mean_ns)} mean / {fmt_ns(r.late_max_ns)} max, "
                f"last in {_pct(r.last_arrival_share)}, blame {fmt_ns(r.blame_ns)}"
            )
    elif report.stragglers_not_judged:
        out = [f"STRAGGLERS: not judged ({report.stragglers_not_judged})"]
    else:
        out = ["STRAGGLERS: none (no rank's own delay stands out from its peers)"]
    others = [r for r in report.late_ranks if r not in report.stragglers]
    if others:
        shown = ", ".join(f"{r} ({fmt_ns(by_rank[r].late_mean_ns)})" for r in others[:12])
        more = f" and {len(others) - 12} more" if len(others) > 12 else ""
        behind_links = {r for c in report.slow_communicators for r in c.ranks}
        cause = (" (delayed by the stragglers or their own)" if report.stragglers else
                 " (members of the slow links below)" if set(others) <= behind_links else "")
        out.append(f"LATE ARRIVALS, mean lateness{cause}: rank {shown}{more}")
    return out


def _rank_table(report: Report) -> list[str]:
    flagged = set(report.stragglers)
    shown = _most(sorted(report.ranks, key=lambda r: r.rank), lambda r: (r.rank not in flagged, -(r.blame_ns or 0)))
    rows = [
        [
            str(r.rank), r.host, fmt_ns(r.clock_offset_ns), fmt_ns(r.clock_uncertainty_ns),
            fmt_ns(r.late_mean_ns), fmt_ns(r.late_p99_ns), fmt_ns(r.late_max_ns), _pct(r.last_arrival_share),
            fmt_ns(r.blame_ns), fmt_ns(r.nccl_kernel_ns), fmt_ns(r.nccl_wait_ns), fmt_ns(r.nccl_transfer_ns),
            "-" if r.gpu_busy_pct is None else f"{r.gpu_busy_pct:.1f}%", "*" if r.rank in flagged else "",
        ]
        for r in shown
    ]
    return _table(
        ["rank", "host", "clock off", "±σ", "late mean", "late p99", "late max", "last", "blame",
         "nccl", "wait", "transfer", "busy", "!"],
        rows,
    ) + _not_shown(len(shown), len(report.ranks), "the stragglers and the most blamed ranks") + _unsplit_line(report)


def _unsplit_line(report: Report) -> list[str]:
    """Where nccl is more than wait + transfer: the calls matched to no instance, per rank."""
    unsplit = [r for r in sorted(report.ranks, key=lambda r: r.rank) if r.nccl_unmatched_ns]
    if not unsplit:
        return []
    listed = some_of([f"rank {r.rank}: {fmt_ns(r.nccl_unmatched_ns)}" for r in unsplit], 4)
    return [f"nccl also counts calls matched to no instance, not split into wait and transfer ({listed})"]


def _communicator_table(report: Report) -> list[str]:
    pairs = [(c, o) for c in report.communicators for o in c.ops]
    slow = {(c.comm_id, c.op) for c in report.slow_communicators}
    listed = _most(pairs, lambda pair: ((pair[0].comm_id, pair[1].op) not in slow, -(pair[1].skew_mean_ns or 0.0)))
    label = _comm_labels(report)
    rows = [
        [label[c.comm_id], c.kind, ranks_text(c.ranks), o.op, str(o.instances), fmt_ns(o.duration_mean_ns),
         fmt_ns(o.transfer_mean_ns), fmt_gbps(o.busbw_gbps), fmt_ns(o.skew_mean_ns), _num(o.imbalance_cv),
         _num(o.network_cv)]
        for c, o in listed
    ]
    return [
        "COMMUNICATORS (busbw = bus bandwidth as nccl-tests counts it, over the transfer once all arrived;",
        "               imbal = CV of per-rank NCCL time; network = CV of transfer over time)",
        *_table(["comm", "kind", "ranks", "op", "inst", "dur mean", "transfer", "busbw", "skew mean", "imbal", "network"],
                rows),
        *_not_shown(len(listed), len(pairs), "the slow links and those of the largest skew"),
    ]


def _slow_link_lines(report: Report) -> list[str]:
    kind = {c.comm_id: f" {c.kind}" for c in report.communicators}
    label = _comm_labels(report)
    return [f"  {label[c.comm_id]}{kind.get(c.comm_id, '')} (ranks {ranks_text(c.ranks)}) {c.op}: "
            f"{fmt_gbps(c.busbw_gbps)}, like ones {fmt_gbps(c.peers_busbw_gbps)} (median of {c.peers})"
            for c in report.slow_communicators]


def _tp_table(report: Report) -> list[str]:
    if not report.tp_overhead:
        return []
    groups = _most(report.tp_overhead, lambda t: (-(t.exposed_frac or 0.0),))
    label = _comm_labels(report)
    rows = [
        [label[t.comm_id], ranks_text(t.ranks), t.time_base, fmt_ns(t.step_time_ns), fmt_ns(t.exposed_ns),
         _pct(t.exposed_frac), _pct(t.exposed_wait_frac), _pct(t.exposed_transfer_frac)]
        for t in groups
    ]
    return (_table(["comm", "ranks", "time base", "time", "exposed", "share", "wait", "transfer"], rows)
            + _not_shown(len(groups), len(report.tp_overhead), "the groups of the largest exposed share"))


def _kernel_table(report: Report) -> list[str]:
    if not report.top_kernels:
        return []
    # The name last, its template arguments whole: they tell kernels apart, which a cut to
    # a column's width (60 characters of ``void at::native::elementwise_kernel<``) hid.
    labels = kernel_labels([k["name"] for k in report.top_kernels])
    return _table(
        ["calls", "total", "comm", "kernel"],
        [[str(k["count"]), fmt_ns(k["total_ns"]), "yes" if k["is_comm"] else "", label]
         for k, label in zip(report.top_kernels, labels)],
        text_last=True,
    )


def kernel_labels(names: Sequence[str]) -> list[str]:
    """Kernel names as the table shows them: a demangled name's parameter list as ``(…)``.
    It repeats what the template arguments already say, and runs to thousands of characters
    (fbgemm's kernels take 30 tensor accessors), a screenful a row; the JSON keeps it. Names
    that would then read alike (overloads) are shown whole."""
    return _distinct(names, _without_parameters)


def _comm_labels(report: Report) -> dict[str, str]:
    """The report's communicator names as its tables show them: cut in the middle to a
    column's width, keeping both ends (``inferred:<op>:<ranks>`` names differ in either);
    names that would then read alike are shown whole."""
    names = sorted({c.comm_id for c in report.communicators} | {t.comm_id for t in report.tp_overhead}
                   | {c.comm_id for c in report.slow_communicators})
    return dict(zip(names, _distinct(names, _short)))


def _distinct(names: Sequence[str], shorten: Callable[[str], str]) -> list[str]:
    """Each name shortened, but where two would read alike: then whole."""
    short = [shorten(name) for name in names]
    seen = Counter(short)
    return [label if seen[label] == 1 else name for label, name in zip(short, names)]


def _without_parameters(name: str) -> str:
    """``f<T>(int, float)`` as ``f<T>(…)``; other text (``Memcpy HtoD (Pageable -> Device)``,
    whose parenthesis follows a space, ``gloo:all_reduce``) as it is."""
    if not name.endswith(")"):
        return name
    depth = 0
    for at in range(len(name) - 1, -1, -1):  # back to the "(" that the last ")" closes
        if name[at] == ")":
            depth += 1
        elif name[at] == "(":
            depth -= 1
            if depth == 0:
                break
    else:
        return name  # unbalanced: not a parameter list
    opens_list = at > 0 and (name[at - 1].isalnum() or name[at - 1] in "_>")
    return name[: at + 1] + "…)" if opens_list and at + 2 < len(name) else name


def _short(text: str, width: int = 28) -> str:
    head = (width - 1) // 2
    return text if len(text) <= width else text[:head] + "…" + text[head + 1 - width :]


# A name's characters a message shows at most: an inferred communicator's name lists its
# members where they are no range (`lines._members`), ~500 characters for 128 of them.
NAME_IN_MESSAGE = 64


def some_of(names: Sequence[str], shown: int = 3) -> str:
    """The first few of many names, for a one-line warning: 'a, b, c ...'; each cut in the
    middle to NAME_IN_MESSAGE characters, keeping both ends (`_short`), so that what the
    warning says after them still fits the line the CLI shows (cli.LONGEST_MESSAGE)."""
    return ", ".join(_short(name, NAME_IN_MESSAGE) for name in names[:shown]) + (" ..." if len(names) > shown else "")


def ranks_text(ranks: Sequence[int]) -> str:
    """Compact rank sets: 0-7, or 0,8,16,... for strided groups."""
    if not ranks:
        return "-"
    ranks = list(ranks)
    # consecutive: ascending steps of one (not compared with a range: rank numbers may be huge)
    if len(ranks) > 2 and ranks[-1] - ranks[0] == len(ranks) - 1 and all(b - a == 1 for a, b in zip(ranks, ranks[1:])):
        return f"{ranks[0]}-{ranks[-1]}"
    text = ",".join(map(str, ranks[:6]))
    return text + (",…" if len(ranks) > 6 else "")


def field_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
