"""Slow links: communicators whose bus bandwidth falls well below that of like communicators.

A degraded NIC, cable or switch port slows every collective of the communicators whose
traffic crosses it, and only theirs: in a job with 8 DP groups over the same nodes, the
group on the bad rail moves its bytes at a fraction of its siblings' bandwidth while its
ranks are no later than anyone else (reference §7: compare bytes/busBW to flag slow
links). Communicators are compared only with like ones — same op, kind (tp/dp/other),
member count, hosts spanned and message size class — since NVLink and the network, or a
small and a large message, have different bandwidths by design.

A communicator is slow when its median bus bandwidth lies below the median of its class
by ``stragglers.Z_MIN`` robust sigmas *and* below ``SLOW_SHARE`` of it; a class needs 3
communicators with a bandwidth to judge, so no fixed number is ever named.
"""

from __future__ import annotations

import math

import numpy as np

from rankscope.analysis.report import CommunicatorRow, SlowCommunicator
from rankscope.analysis.stragglers import stands_out

SLOW_SHARE = 0.8  # flagged only below this share of the class median: a 20% shortfall at least


def slow_communicators(rows: list[CommunicatorRow]) -> list[SlowCommunicator]:
    """The (communicator, op) pairs whose bus bandwidth stands out low among like ones."""
    classes: dict[tuple, list[tuple[CommunicatorRow, float]]] = {}
    for row in rows:
        for op in row.ops:
            if op.busbw_gbps is None or not math.isfinite(op.busbw_gbps) or not op.bytes_median:
                continue
            key = (op.op, row.kind, len(row.ranks), row.hosts, int(math.log2(op.bytes_median)))
            classes.setdefault(key, []).append((row, op.busbw_gbps))
    slow = []
    for (op, *_), members in classes.items():
        if len(members) < 3:  # too few to judge (stands_out would say so, after a median)
            continue
        bandwidth = np.array([b for _, b in members])
        median = float(np.median(bandwidth))
        # low bandwidth as a high value: what stands_out looks for
        flagged, _ = stands_out(np.arange(len(members)), -bandwidth, (1 - SLOW_SHARE) * median)
        slow += [SlowCommunicator(comm_id=members[i][0].comm_id, op=op, ranks=members[i][0].ranks,
                                  busbw_gbps=float(bandwidth[i]), peers_busbw_gbps=median, peers=len(members))
                 for i in flagged]
    return sorted(slow, key=lambda s: s.busbw_gbps / s.peers_busbw_gbps)
