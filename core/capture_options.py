"""Which capture options (`rankscope capture --option K=V`) a backend reads.

A backend names the options it reads, ``prefix.*`` for a family (sim's ``sim.*``). The agent
refuses a capture asking for another; the coordinator, told at registration what each of a
node's backends reads, refuses the sweep before it starts. Both judge by `unread` here, so
they cannot disagree on what a name admits.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable


def unread(names: Iterable[str], reads: Collection[str]) -> list[str]:
    """Those of ``names`` that a backend reading ``reads`` does not read, sorted."""
    prefixes = tuple(option[:-1] for option in reads if option.endswith("*"))
    return sorted(name for name in set(names) - set(reads) if not name.startswith(prefixes))
