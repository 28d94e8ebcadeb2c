"""Tables in, report out: exports or digests of every rank, aligned on their collectives.

    >>> from rankscope.analysis import load_digests, analyze
    >>> report = analyze(load_digests(["exports/"]))
    >>> report.stragglers, report.to_json()

No network code and no knowledge of agents (ARCHITECTURE.md): the coordinator, the CLI
and a notebook all call these same functions.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> defining module. Imported on first use, so a user of one submodule (the
# agent and the coordinator import `rankscope.analysis.digest`) does not load the whole analysis.
_EXPORTS = {
    "load_digests": "rankscope.analysis.sources",
    "analyze": "rankscope.analysis.pipeline",
    "Report": "rankscope.analysis.report",
    "JobSpec": "rankscope.analysis.simulated_job",
    "Straggler": "rankscope.analysis.simulated_job",
    "DIGEST_SCHEMA": "rankscope.analysis.digest",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
