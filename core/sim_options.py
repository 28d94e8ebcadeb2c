"""The `sim` capture backend's options, read into the simulated job they ask for.

The agent's sim backend simulates from them; the coordinator reads them with the same code
when it is asked for a sim sweep, so a bad value is refused before the sweep starts rather
than fail every node of it.

Options (all strings, as they travel in StartCapture.options):
  sim.<field>        any scalar field of ``JobSpec`` (nodes, gpus_per_node, tp, steps, seed, ...)
  sim.stragglers     ``RANK[:compute|launch[:EXTRA_US[:EVERY]]]`` separated by commas, e.g. ``5:compute:3000``
  sim.slow_links     ranks whose network link is slow, separated by commas, e.g. ``19``
  sim.node_index     this node's index in the job; or ``sim.node_index.<node>`` per node
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rankscope.capture_options import yes_or_no
from rankscope.errors import ConfigError

if TYPE_CHECKING:
    from rankscope.analysis.simulate import JobSpec, Straggler

BACKEND = "sim"
PREFIX = "sim."
NODE_OPTION = "node"  # set by the agent: its node name
_NODE_INDEX = PREFIX + "node_index"


def check(options: Mapping[str, str]) -> None:
    """A ConfigError where ``options`` ask for a job no node could simulate, or give a node
    an index outside it (a node's own index may come from its agent's labels instead)."""
    nodes = job_spec(options).nodes
    for key, raw in options.items():
        if key == _NODE_INDEX or key.startswith(_NODE_INDEX + "."):
            _index(raw, key[len(_NODE_INDEX) + 1:], nodes)


def parse_stragglers(text: str) -> tuple[Straggler, ...]:
    """``RANK[:compute|launch[:EXTRA_US[:EVERY]]]`` items, comma-separated (the simulate command's syntax)."""
    import argparse

    from rankscope.analysis.simulate import parse_straggler

    try:
        return tuple(parse_straggler(item.strip()) for item in text.split(",") if item.strip())
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"sim.stragglers: {exc}") from None


def job_spec(options: Mapping[str, str]) -> JobSpec:
    """The simulator's JobSpec from capture options; unset fields keep the simulator's defaults."""
    from rankscope.analysis.simulate import JobSpec

    values: dict = {}
    known = {f.name: f for f in dataclasses.fields(JobSpec)}
    for key, raw in options.items():
        if not key.startswith(PREFIX) or key.startswith(_NODE_INDEX):
            continue
        name = key[len(PREFIX):]
        if name == "stragglers":
            values[name] = parse_stragglers(raw)
        elif name == "slow_links":
            values[name] = _ranks(key, raw)
        elif name in known:
            values[name] = _cast(name, raw, _default(known[name]))
        else:
            settable = ["stragglers", "slow_links", *(f.name for f in known.values()
                                                       if isinstance(_default(f), (bool, int, float, str)))]
            raise ConfigError(f"{key}: the simulator's job spec has no field {name!r} "
                              f"(it has: {', '.join(sorted(settable))})")
    return JobSpec(**values)


def _ranks(key: str, text: str) -> tuple[int, ...]:
    try:
        return tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise ConfigError(f"{key}: {text!r} is not a comma-separated list of ranks") from None


def node_index(options: Mapping[str, str], nodes: int | None = None) -> int:
    """This node's index in the simulated job; checked against the job's ``nodes`` where given."""
    node = options.get(NODE_OPTION, "")
    raw = options.get(f"{_NODE_INDEX}.{node}", options.get(_NODE_INDEX))
    if raw is None:
        raise ConfigError(f"sim capture on node {node!r}: no sim.node_index (set it per node, "
                          f"or start the agent with --labels sim.node_index=N)")
    return _index(raw, node, nodes)


def _index(raw: str, node: str, nodes: int | None) -> int:
    """``raw`` as the index of ``node`` ("": any node) in a job of ``nodes``."""
    try:
        index = int(raw)
    except ValueError:
        raise ConfigError(f"sim.node_index {raw!r} is not an integer") from None
    if nodes is not None and not 0 <= index < nodes:
        where = f"sim capture on node {node!r}: " if node else ""
        raise ConfigError(f"{where}sim.node_index {index} is outside the simulated job's nodes 0..{nodes - 1} "
                          "(set sim.nodes to the number of nodes in the sweep)")
    return index


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _whole(raw: str) -> int:
    """``raw`` as an int; ``3e6`` is one too, ``2.5`` is not (it would run a job other than asked)."""
    try:
        return int(raw)
    except ValueError:
        value = float(raw)
        if not value.is_integer():
            raise ValueError(raw)
        return int(value)


def _cast(name: str, raw: str, default):
    try:
        if isinstance(default, bool):
            return yes_or_no(raw)
        if isinstance(default, int):
            return _whole(raw)
        if isinstance(default, float):
            return float(raw)
    except (ValueError, OverflowError):  # int(float("inf")) overflows
        kind = "yes or no" if isinstance(default, bool) else "a whole number" if isinstance(default, int) else "a number"
        raise ConfigError(f"sim.{name}: {raw!r} is not {kind}") from None
    if not isinstance(default, str):
        raise ConfigError(f"sim.{name} cannot be set from a capture option")
    return raw
