"""rankscope: multi-rank profiling, aligned on collectives."""

from rankscope.errors import RankscopeError, RankscopeWarning

__version__ = "0.1.0"
__all__ = ["RankscopeError", "RankscopeWarning", "__version__"]
