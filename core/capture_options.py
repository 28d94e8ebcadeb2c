"""Which capture options (`rankscope capture --option K=V`) a backend reads.

A backend names the options it reads, ``prefix.*`` for a family (sim's ``sim.*``). The agent
refuses a capture asking for another; the coordinator, told at registration what each of a
node's backends reads, refuses the sweep before it starts. Both judge by `unread` here, so
they cannot disagree on what a name admits; and read the options that say yes or no by
`flag`, so a word neither admits (`check_flags`) is refused before the sweep starts.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from rankscope.errors import ConfigError, quoted

# The options read as yes or no, by any backend that reads them (nsys: gpu_metrics).
FLAGS = frozenset({"gpu_metrics"})
_YES, _NO = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


def unread(names: Iterable[str], reads: Collection[str]) -> list[str]:
    """Those of ``names`` that a backend reading ``reads`` does not read, sorted."""
    prefixes = tuple(option[:-1] for option in reads if option.endswith("*"))
    return sorted(name for name in set(names) - set(reads) if not name.startswith(prefixes))


def flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    """``options[name]`` as yes or no (true/false, yes/no, on/off, 1/0, in any case);
    ``default`` where unset. Another word is a ConfigError: read as yes ("anything but
    false"), `gpu_metrics=off` paused DCGM for counters nobody asked for."""
    raw = options.get(name)
    if raw is None:
        return default
    try:
        return yes_or_no(raw)
    except ValueError:
        raise ConfigError(f"capture option {name}={quoted(raw)}: expected true or false (yes/no, on/off, 1/0)") from None


def yes_or_no(raw: str) -> bool:
    """An option's word as yes or no (true/false, yes/no, on/off, 1/0, in any case, spaces
    aside); a ValueError for another."""
    word = raw.strip().lower()
    if word not in _YES | _NO:
        raise ValueError(raw)
    return word in _YES


def check_flags(options: Mapping[str, str]) -> None:
    """A ConfigError for an option of `FLAGS` given as neither yes nor no."""
    for name in sorted(FLAGS & set(options)):
        flag(options, name, False)
