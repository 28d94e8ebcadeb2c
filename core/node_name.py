"""Node names: what an agent is known by in the fleet, and what `--nodes a,b` targets."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TypeVar

# Host names, Kubernetes node names (DNS subdomains: 253 at most) and Slurm node names
# all fit; a comma (the --nodes separator), a slash or a space would not be targetable.
_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")
_DIGITS = re.compile(r"([0-9]+)")
V = TypeVar("V")


def problem(name: str) -> str | None:
    """Why ``name`` cannot name a node; None where it can."""
    if name and not name.strip("."):  # `fetch` files a node's artifacts under DIR/<node>/
        return "a node name of only dots ('.', '..') would name a folder, not a node"
    if _NODE_NAME.fullmatch(name):
        return None
    return "a node name is 1 to 253 letters, digits, '.', '_' or '-' (as host names are)"


def sort_key(name: str) -> tuple[str | tuple[int, str, str], ...]:
    """Order names as a fleet numbers them: runs of digits by value, so f2 comes before f10.
    The split alternates text and digits, so keys compare part by part; a run's own text
    breaks ties (f01, f1) so that the order stays total. A run's value is compared as its
    length and digits once leading zeros are gone, not by int(): a host name from a
    damaged export with a run past 4,300 digits made int() raise."""
    parts = _DIGITS.split(name)
    return tuple(_by_value(part) if i % 2 else part for i, part in enumerate(parts))


def _by_value(digits: str) -> tuple[int, str, str]:
    value = digits.lstrip("0")
    return len(value), value, digits


def natural(names: Iterable[str]) -> list[str]:
    """``names`` in `sort_key` order."""
    return sorted(names, key=sort_key)


def items(by_name: Mapping[str, V]) -> list[tuple[str, V]]:
    """``by_name``'s items in `sort_key` order of their names."""
    return [(name, by_name[name]) for name in natural(by_name)]
