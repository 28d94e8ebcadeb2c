"""Stand-in for DCGM's high-level ``pydcgm`` (tests only): DcgmHandle → profiling Pause/Resume."""

from __future__ import annotations

import dcgm_agent
import dcgm_structs


class _Profiling:
    def __init__(self, handle: int) -> None:
        self._handle = handle

    def Pause(self) -> None:
        dcgm_agent.dcgmProfPause(self._handle)

    def Resume(self) -> None:
        dcgm_agent.dcgmProfResume(self._handle)


class DcgmSystem:
    def __init__(self, handle: "DcgmHandle") -> None:
        self.profiling = _Profiling(handle.handle)


class DcgmHandle:
    def __init__(self, handle=None, ipAddress=None, opMode=dcgm_structs.DCGM_OPERATION_MODE_AUTO,
                 persistAfterDisconnect=False, unixSocketPath=None, timeoutMs=0) -> None:
        dcgm_structs._dcgmInit()
        dcgm_agent.dcgmInit()
        if ipAddress is None and unixSocketPath is None:
            self.handle = dcgm_agent.dcgmStartEmbedded(opMode)
            return
        params = dcgm_structs.c_dcgmConnectV2Params_v2()
        params.timeoutMs = timeoutMs
        params.addressIsUnixSocket = int(ipAddress is None)
        self.handle = dcgm_agent.dcgmConnect_v2(ipAddress or unixSocketPath, params)

    def GetSystem(self) -> DcgmSystem:
        return DcgmSystem(self)

    def Shutdown(self) -> None:
        dcgm_agent.dcgmDisconnect(self.handle)
