"""How analysis time and memory grow with ranks (issue 2, "must show" 4). Not a test.

For each size, a simulated job (8 GPUs per node, TP=8) is written as nsys exports, then
two fresh subprocesses time, on the same files:
  analysis  rankscope.analysis.sources.load_digests + pipeline.analyze (shown split)
  floor     sqlite3 alone reading the rows the ingest needs (kernels with names, copies,
            runtime calls, NVTX events with names and payloads), fetched into Python
and report their ratio (aim: <= 1.5; also shown for pipeline.analyze alone, the part after
ingest) and peak RSS (aim: linear in ranks).

    .venv/bin/python bench/analyze_scale.py [--sizes 8 16 32 64 128 256 512] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR_QUERIES = (
    'SELECT k.start, k."end", k.globalPid, k.deviceId, k.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL AS k '
    "LEFT JOIN StringIds AS s ON s.id = k.shortName",
    'SELECT start, "end", globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMCPY',
    'SELECT start, "end", globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMSET',
    'SELECT correlationId, globalTid, start, "end", nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME',
    'SELECT n.globalTid, n.start, n."end", n.eventType, n.domainId, s.value, n.binaryData FROM NVTX_EVENTS AS n '
    "LEFT JOIN StringIds AS s ON s.id = n.textId",
)


def floor(paths: list[Path]) -> int:
    rows = 0
    for path in paths:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for query in FLOOR_QUERIES:
            table = query.split(" FROM ")[1].split()[0]
            if table in tables:
                rows += len(db.execute(query).fetchall())
        db.close()
    return rows


def analysis(paths: list[Path]) -> dict:
    from rankscope.analysis.pipeline import analyze
    from rankscope.analysis.sources import load_digests

    start = time.perf_counter()
    digests = load_digests(paths)
    loaded = time.perf_counter()
    report = analyze(digests)
    return {"load_s": loaded - start, "analyze_s": time.perf_counter() - loaded, "count": len(report.ranks)}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(mode: str, folder: str) -> None:
    """Runs in a fresh process: import first, then time and measure the work alone."""
    import warnings

    warnings.simplefilter("ignore")
    if mode == "analysis":
        import rankscope.analysis.pipeline  # noqa: F401
        import rankscope.analysis.sources  # noqa: F401
    paths = sorted(Path(folder).glob("*.sqlite"))
    baseline = _rss_mb()
    start = time.perf_counter()
    result = analysis(paths) if mode == "analysis" else {"count": floor(paths)}
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak_mb": _rss_mb(), "baseline_mb": baseline, **result}))


def measure(mode: str, folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(folder)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    from rankscope.analysis import simulate as sim

    print(f"{'ranks':>6} {'MB files':>9} {'analysis s':>11} {'(load':>7} {'analyze)':>9} {'floor s':>8} {'ratio':>6} {'analyze/floor':>13} "
          f"{'peak MB':>8} {'+MB':>7} {'+MB/rank':>9} {'floor peak MB':>14}")
    for size in args.sizes:
        spec = sim.JobSpec(nodes=max(1, size // 8), gpus_per_node=min(8, size), tp=min(8, size), steps=args.steps,
                           stragglers=(sim.Straggler(min(3, size - 1), "compute", 2 * sim.MS),), seed=1)
        with tempfile.TemporaryDirectory(prefix="rankscope-bench-") as tmp:
            folder = Path(tmp)
            sim.simulate(spec, folder)
            megabytes = sum(p.stat().st_size for p in folder.glob("*.sqlite")) / 2**20
            measure("floor", folder)  # warm the page cache so both read from memory
            fl = measure("floor", folder)
            an = measure("analysis", folder)
        grown = an["peak_mb"] - an["baseline_mb"]
        print(f"{spec.world_size:>6} {megabytes:>9.1f} {an['seconds']:>11.2f} {an['load_s']:>7.2f} {an['analyze_s']:>9.2f} "
              f"{fl['seconds']:>8.2f} "
              f"{an['seconds'] / fl['seconds']:>6.2f} {an['analyze_s'] / fl['seconds']:>13.2f} {an['peak_mb']:>8.0f} {grown:>7.0f} {grown / spec.world_size:>9.2f} "
              f"{fl['peak_mb']:>14.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
