"""The `sim` capture backend: this node's ranks, simulated, so a whole sweep runs on one CPU.

Every agent of a simulated sweep gets the same job spec in the capture options
(`rankscope.sim_options` reads them) and writes the nsys exports of its own node only;
the simulator is deterministic from the seed, so the nodes' exports add up to one
consistent job (one clock per node, the injected stragglers, the usual NCCL trace
layout), and everything after the capture (digest, upload, analysis) is the production path.
"""

from __future__ import annotations

from pathlib import Path

from rankscope.agent.backend import CaptureBackend, CaptureRequest
from rankscope.sim_options import BACKEND, PREFIX, job_spec, node_index


class SimBackend(CaptureBackend):
    """Simulated nsys exports for this node's ranks; reads no GPU counters."""

    name = BACKEND
    options = frozenset({PREFIX + "*"})  # each checked by job_spec

    def start(self, request: CaptureRequest) -> None:
        # Validate now, so a bad spec fails the node before the window, not after it.
        node_index(request.options, job_spec(request.options).nodes)

    def stop(self, request: CaptureRequest) -> list[Path]:
        from rankscope.analysis.simulate import simulate

        spec = job_spec(request.options)
        index = node_index(request.options, spec.nodes)
        outdir = request.workdir / "exports"
        outdir.mkdir(parents=True, exist_ok=True)
        return [Path(p) for p in simulate(spec, outdir, nodes=[index])]
