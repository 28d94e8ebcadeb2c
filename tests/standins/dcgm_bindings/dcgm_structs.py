"""Stand-in for DCGM's ``dcgm_structs`` (tests only): the names rankscope uses."""

from __future__ import annotations

import _fake_engine

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2

_MESSAGES = {
    DCGM_ST_BADPARAM: "A bad parameter was passed to a function",
    DCGM_ST_NOT_SUPPORTED: "Feature not supported",
    DCGM_ST_UNINITIALIZED: "Uninitialized",
    DCGM_ST_CONNECTION_NOT_VALID: "Host engine connection invalid/disconnected",
    DCGM_ST_LIBRARY_NOT_FOUND: "Library not found",
}


class DCGMError(Exception):
    """Raised by every wrapper on a non-OK return; ``value`` is the dcgmReturn_t."""

    _classes: dict[int, type] = {}

    def __new__(cls, value: int):
        sub = cls._classes.get(value, cls)
        return Exception.__new__(sub)

    def __init__(self, value: int) -> None:
        self.value = value
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown error {self.value}")


def dcgmExceptionClass(value: int) -> type:
    if value not in DCGMError._classes:
        DCGMError._classes[value] = type(f"DCGMError_{abs(value)}", (DCGMError,), {})
    return DCGMError._classes[value]


for _code in _MESSAGES:
    dcgmExceptionClass(_code)


class c_dcgmConnectV2Params_v2:
    def __init__(self) -> None:
        self.version = 0
        self.persistAfterDisconnect = 0
        self.timeoutMs = 0
        self.addressIsUnixSocket = 0


c_dcgmConnectV2Params_version = 0x2000018


def _dcgmInit() -> None:
    """Loads libdcgm in the real bindings."""
    if not _fake_engine.library_present():
        raise DCGMError(DCGM_ST_LIBRARY_NOT_FOUND)
