"""How the coordinator's sweep bookkeeping grows with the fleet. Not a test.

For each fleet size an in-process coordinator (SQLite state in a temporary folder) knows
that many agents and runs one sweep over all of them, with one user watching it as
`rankscope capture --wait` does. Every node then reports the states a capture goes through
(pending, pausing_dcgm, capturing, exporting, uploading), then fails (so no analysis runs):
six statuses per node, fed as the agents' session threads feed them, one after another.

Printed per size: the time to take all statuses, per status, and the bytes the watcher
received (serialized as on the wire). Aim: the time per status does not grow with the
fleet (a status changes one node), so the sweep's cost grows linearly, not quadratically.

    .venv/bin/python bench/sweep_scale.py [--sizes 64 512 2048]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from rankscope.coordinator import sweeps as sw
from rankscope.coordinator.config import CoordinatorConfig
from rankscope.coordinator.coordinator import Coordinator
from rankscope.coordinator.server import sweep_message
from rankscope.proto.v1 import rankscope_pb2 as pb

STATES = (sw.NodeState.PENDING, sw.NodeState.PAUSING_DCGM, sw.NodeState.CAPTURING, sw.NodeState.EXPORTING,
          sw.NodeState.UPLOADING, sw.NodeState.FAILED)


def run(size: int, folder: Path) -> dict:
    coordinator = Coordinator(CoordinatorConfig(data_dir=folder))
    try:
        nodes = [f"node-{i:05d}" for i in range(size)]
        for node in nodes:
            coordinator.register(node, node, {}, gpus=[], ranks=[], versions={}, backends=["sim"])
        sweep = coordinator.start_sweep(sw.SweepSpec("sim", 20.0, 3600.0), names=nodes, labels={}, everything=False)
        received = {"bytes": 0, "events": 0}
        watching = threading.Event()

        def watch() -> None:
            for snapshot, node in coordinator.watch(sweep.sweep_id, lambda: True):
                watching.set()
                event = pb.SweepEvent(sweep=sweep_message(snapshot), node=node, final=snapshot.final)
                received["bytes"] += event.ByteSize()
                received["events"] += 1

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        watching.wait()
        start = time.perf_counter()
        for state in STATES:
            for node in nodes:
                event = sw.NodeReported(node, state, coordinator.clock(), reason="bench" if state is sw.NodeState.FAILED else "")
                coordinator.node_reported(node, event, sweep.sweep_id)
        took = time.perf_counter() - start
        watcher.join(600)
        return {"seconds": took, "statuses": size * len(STATES), "watch_s": time.perf_counter() - start, **received}
    finally:
        coordinator.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512, 2048])
    args = parser.parse_args()
    print(f"{'nodes':>6} {'statuses':>9} {'took s':>8} {'ms/status':>10} {'watched s':>10} {'events':>7} {'watch MB':>9}")
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
            r = run(size, Path(tmp))
        print(f"{size:>6} {r['statuses']:>9} {r['seconds']:>8.2f} {1e3 * r['seconds'] / r['statuses']:>10.3f} "
              f"{r['watch_s']:>10.2f} {r['events']:>7} {r['bytes'] / 1e6:>9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
