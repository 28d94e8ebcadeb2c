"""A sweep's report: the analysis of its uploaded digests, stored as JSON.

The file is the analysis' ``rankscope.report/1`` document with the sweep's facts
added under ``"sweep"`` (id, state, per-node outcome, missing nodes), and a warning
per missing node and per note of a node's capture (a rank that did not record), so a
partial report says what it lacks wherever it is read.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rankscope import atomic
from rankscope.analysis import digest
from rankscope.analysis.report import ranks_text
from rankscope.coordinator.artifacts import storage_errors
from rankscope.coordinator.sweeps import AnalysisDone, RankOn, SlowLink, Sweep
from rankscope.errors import ConsistencyError, ExportError, InputError
from rankscope.node_name import items

Analyze = Callable[..., Any]  # (digests: pa.Table, *, clock_hints) -> Report


def default_analyze() -> Analyze:
    from rankscope.analysis.pipeline import analyze

    return analyze


def build(sweep: Sweep, digests_of: Sequence[tuple[Path, str, str, Sequence[int]]], clock_hints: Mapping[str, int],
          out: Path, at_ns: int, analyze: Analyze | None = None, lost: Iterable[tuple[str, str]] = ()) -> AnalysisDone:
    """Analyse the digests (each with the node that uploaded it, its artifact name and the
    ranks its upload named, empty where it named none), write the report atomically to
    ``out``; the sweep's event, with the stragglers (by the node they ran on) and the slow
    links the report flags. A node whose digests are unsound on their own (one cannot be
    read, or is gone: ``lost``, (node, why); a rank outside its world, or twice among them;
    ranks other than its upload named) is left out, failed (in ``sweep``, the caller's copy,
    and in the event) and named as missing; where no node's are sound, the analysis fails.
    Digests of two nodes that disagree (two jobs, a rank claimed by both) fail it too, naming
    the nodes that sent them: which one is wrong cannot be told."""
    own: dict[str, list[tuple[pa.Table, str]]] = {}  # node -> its digests, each with its artifact name
    unusable = dict(lost)
    for path, node, name, named in digests_of:
        try:
            table = digest.read(path)
        except ExportError as exc:  # that node's alone: the others are analysed, it is named as failed
            unusable.setdefault(node, f"its digest {name} could not be read: {exc.args[0]}")
            continue
        own.setdefault(node, []).append((table, name))
        # Its ranks are put under this node's name (`node_of`): where they are not the ones its
        # upload named, the digest is not what the node said it sent.
        if (unnamed := _unnamed_ranks(table, name, named)) is not None:
            unusable.setdefault(node, unnamed)
    for node, tables in own.items():
        if node in unusable:
            continue
        try:
            digest.check_consistent(digest.concat(_named(table, name) for table, name in tables))
        except ConsistencyError as exc:  # its own digests say it is wrong: it alone fails
            unusable[node] = f"its digest {exc}"
    if unusable and len(unusable) == len(own.keys() | unusable.keys()):
        raise InputError("; ".join(f"node {n}: {why}" for n, why in unusable.items()))
    sweep.fail_unusable(unusable.items(), at_ns)  # as the report below says it
    # Messages name the node each row came from, beside the trace: the trace's own names
    # (its file on the node, its host or pod) are not the sweep's.
    read = [(_named(table, f"node {node}"), node) for node, tables in own.items() if node not in unusable
            for table, _ in tables]
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
        unusable=tuple(unusable.items()),
    )


def _unnamed_ranks(table: pa.Table, name: str, named: Sequence[int]) -> str | None:
    """Why digest ``name`` does not hold the ranks its upload ``named``; None where it does, or
    where the upload named none (the field is "where known")."""
    held, said = np.unique(table.column("rank").to_numpy()).tolist(), sorted(set(named))
    if not said or held == said:
        return None
    return f"its digest {name} holds ranks {ranks_text(held)}, not the ranks {ranks_text(said)} its upload named"


def _named(table: pa.Table, where: str) -> pa.Table:
    """``table`` with each row named as of the export it was built from, in ``where``."""
    return digest.named(table, [digest.digest_of(where, export) for export in table.column("source_file").to_pylist()])


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
