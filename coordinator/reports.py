"""A sweep's report: the analysis of its uploaded digests, stored as JSON.

The file is the analysis' ``rankscope.report/1`` document with the sweep's facts
added under ``"sweep"`` (id, state, per-node outcome, missing nodes), and a warning
per missing node and per note of a node's capture (a rank that did not record), so a
partial report says what it lacks wherever it is read.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from rankscope import atomic
from rankscope.analysis import digest
from rankscope.coordinator.artifacts import storage_errors
from rankscope.coordinator.sweeps import AnalysisDone, RankOn, SlowLink, Sweep
from rankscope.errors import ExportError, InputError
from rankscope.node_name import items

Analyze = Callable[..., Any]  # (digests: pa.Table, *, clock_hints) -> Report


def default_analyze() -> Analyze:
    from rankscope.analysis.pipeline import analyze

    return analyze


def build(sweep: Sweep, digests_of: Sequence[tuple[Path, str, str]], clock_hints: Mapping[str, int], out: Path,
          at_ns: int, analyze: Analyze | None = None) -> AnalysisDone:
    """Analyse the digests (each with the node that uploaded it and its artifact name), write
    the report atomically to ``out``; the sweep's event, with the stragglers (by the node they
    ran on) and the slow links the report flags. A node whose digest cannot be read is left
    out, failed (in ``sweep``, the caller's copy, and in the event) and named as missing; where
    none can be read, the analysis fails. Digests that disagree (two jobs, a rank claimed
    twice) fail it too, naming the nodes that sent them: which one is wrong cannot be told."""
    read: list[tuple[pa.Table, str]] = []
    unreadable: dict[str, str] = {}
    for path, node, name in digests_of:
        try:
            table = digest.read(path)
        except ExportError as exc:  # that node's alone: the others are analysed, it is named as failed
            unreadable.setdefault(node, f"its digest {name} could not be read: {exc.args[0]}")
            continue
        # Messages name the node each row came from, beside the trace: the trace's own names
        # (its file on the node, its host or pod) are not the sweep's.
        exports = table.column("source_file").to_pylist()
        read.append((digest.named(table, [digest.digest_of(f"node {node}", export) for export in exports]), node))
    if unreadable and len(unreadable) == len({node for _, node, _ in digests_of}):
        raise InputError("; ".join(f"node {n}: {why}" for n, why in unreadable.items()))
    sweep.fail_unreadable(unreadable.items(), at_ns)  # as the report below says it
    read = [(table, node) for table, node in read if node not in unreadable]
    tables = [table for table, _ in read]
    # The agent's node name, not the trace's host name: in a pod the trace names the pod,
    # which a scheduled sweep next week will not find; the node it can.
    node_of = {rank: node for table, node in read for rank in table.column("rank").to_pylist()}
    digests = digest.concat(tables)
    digest.check_consistent(digests)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the report carries them in its own warnings list
        report = (analyze or default_analyze())(digests, clock_hints=dict(clock_hints))
    data = report.to_dict()
    data["warnings"] = [*data.get("warnings", []), *missing_notes(sweep), *node_notes(sweep)]
    data["sweep"] = sweep_facts(sweep, node_of)
    write_json(data, out)
    return AnalysisDone(
        str(out), at_ns,
        stragglers=tuple(RankOn(rank, node_of[rank]) for rank in report.stragglers),
        slow_links=tuple(SlowLink(c.comm_id, c.op, tuple(c.ranks), c.busbw_gbps, c.peers_busbw_gbps)
                         for c in report.slow_communicators),
        stragglers_not_judged=report.stragglers_not_judged or "",
        unreadable=tuple(unreadable.items()),
    )


def missing_notes(sweep: Sweep) -> list[str]:
    return [
        f"node {name} is missing from this report: {sweep.nodes[name].reason or sweep.nodes[name].state.value}"
        for name in sweep.missing
    ]


def node_notes(sweep: Sweep) -> list[str]:
    """What each node's capture went on without (a rank that did not record, GPU metrics)."""
    return [f"node {name}: {note}" for name, rec in items(sweep.nodes) for note in rec.notes]


def sweep_facts(sweep: Sweep, node_of: Mapping[int, str]) -> dict[str, Any]:
    """As they will stand once this report is stored: the nodes not missing are analysed;
    each with the ranks its digests held (``node_of``: rank -> node)."""
    missing = set(sweep.missing)
    ranks: dict[str, list[int]] = {}
    for rank, node in sorted(node_of.items()):
        ranks.setdefault(node, []).append(rank)
    return {
        "sweep_id": sweep.sweep_id,
        "state": "partial" if missing else "analysed",
        "backend": sweep.spec.backend,
        "duration_s": sweep.spec.duration_s,
        "nodes": {
            name: {"state": rec.state.value if name in missing else "analysed", "reason": rec.reason,
                   "dcgm": rec.dcgm, "dcgm_detail": rec.dcgm_detail, "digests": [a.sha256 for a in rec.digests],
                   "ranks": ranks.get(name, []), "notes": rec.notes}
            for name, rec in items(sweep.nodes)
        },
        "missing": list(sweep.missing),
    }


def write_json(data: dict[str, Any], out: Path) -> None:
    with storage_errors(out.parent, "the report"):
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out, json.dumps(data, indent=1, allow_nan=False))


def read_text(path: Path) -> str:
    """A stored report's JSON, checked to be one (the file is written whole, so a bad one was
    changed or cut short since): a client is sent a report or a reason, never broken text."""
    try:
        text = Path(path).read_text()
        if not isinstance(json.loads(text), dict):
            raise ValueError("not a JSON object")
    except OSError as exc:
        raise InputError(f"cannot read the report ({exc.strerror})", path=path) from None
    except ValueError as exc:
        raise InputError(f"the stored report is not a rankscope report ({exc}): the file was changed "
                         "after the coordinator wrote it", path=path) from None
    return text
