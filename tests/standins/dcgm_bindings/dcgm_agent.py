"""Stand-in for DCGM's ``dcgm_agent`` (tests only): init, connect, profiling pause/resume."""

from __future__ import annotations

import itertools

import _fake_engine
import dcgm_structs

_initialized = False
_handles: dict[int, str] = {}  # handle -> address ("" = embedded engine)
_next = itertools.count(1)
_embedded_paused = False  # an embedded engine's pause dies with its process (dcgm.md §5)


def dcgmInit() -> None:
    global _initialized
    _initialized = True


def dcgmShutdown() -> None:
    global _initialized
    _initialized = False
    _handles.clear()


def _check_init() -> None:
    if not _initialized:
        raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_UNINITIALIZED)


def dcgmConnect_v2(address: str, params, version=None) -> int:
    _check_init()
    if not _fake_engine.reachable(address):
        raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
    handle = next(_next)
    _handles[handle] = address
    return handle


def dcgmStartEmbedded(opMode: int) -> int:
    _check_init()
    handle = next(_next)
    _handles[handle] = ""
    return handle


def dcgmDisconnect(handle: int) -> None:
    _handles.pop(handle, None)


dcgmStopEmbedded = dcgmDisconnect


def _set(handle: int, paused: bool) -> None:
    global _embedded_paused
    _check_init()
    if handle not in _handles:
        raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_BADPARAM)
    address = _handles[handle]
    if address == "":
        _embedded_paused = paused
        return
    code = _fake_engine.set_paused(address, paused, via="bindings")
    if code != dcgm_structs.DCGM_ST_OK:
        raise dcgm_structs.DCGMError(code)


def dcgmProfPause(handle: int) -> None:
    _set(handle, True)


def dcgmProfResume(handle: int) -> None:
    _set(handle, False)
