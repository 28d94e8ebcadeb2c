"""Node names: what an agent is known by in the fleet, and what `--nodes a,b` targets."""

from __future__ import annotations

import re

# Host names, Kubernetes node names (DNS subdomains: 253 at most) and Slurm node names
# all fit; a comma (the --nodes separator), a slash or a space would not be targetable.
_NODE_NAME = re.compile(r"[A-Za-z0-9._-]{1,253}")


def problem(name: str) -> str | None:
    """Why ``name`` cannot name a node; None where it can."""
    if _NODE_NAME.fullmatch(name):
        return None
    return "a node name is 1 to 253 letters, digits, '.', '_' or '-' (as host names are)"
