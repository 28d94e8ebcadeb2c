"""rankscope vs HolisticTraceAnalysis (HTA) on the same multi-rank Kineto traces, in one run.

For each trace set (the real matched pairs in ../shared/samples/kineto, and larger jobs
the simulator writes as Kineto JSON with a known straggler) both tools run in a fresh
process each: load every rank's trace and find stragglers (rankscope: digests + analyze;
HTA: TraceAnalysis + get_potential_stragglers). Printed per set: wall time of
load+analysis (imports excluded), peak RSS of the process and its growth over the
post-import baseline, the ratios, and whom each named against the truth where known.

HTA is not a rankscope dependency: install it in a separate environment and point
``--hta-python`` at that interpreter, e.g.
    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install holistictraceanalysis
    .venv/bin/python bench/vs_hta.py --hta-python /tmp/hta-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples" / "kineto"

# Each child prints one JSON line: seconds, peak and baseline RSS (MiB), stragglers.
_MEASURE = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
{imports}
base = rss_mib()
t0 = time.perf_counter()
{load}
t1 = time.perf_counter()
try:
{analyse}
    error = None
except Exception as exc:  # e.g. HTA finding no communication kernels
    stragglers, error = None, f"{{type(exc).__name__}}: {{exc}}"[:160]
t2 = time.perf_counter()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"load_s": t1 - t0, "analysis_s": t2 - t1, "seconds": t2 - t0, "peak_mib": peak,
                  "growth_mib": peak - base, "stragglers": stragglers, "analysis_error": error}}))
"""

RANKSCOPE = _MEASURE.format(
    imports="from rankscope.analysis.sources import load_digests\nfrom rankscope.analysis.pipeline import analyze",
    load="digests = load_digests([sys.argv[1]])",
    analyse="    stragglers = [int(r) for r in analyze(digests).stragglers]",
)
HTA = _MEASURE.format(
    imports="import logging\nlogging.disable(logging.WARNING)\nfrom hta.trace_analysis import TraceAnalysis",
    load="analysis = TraceAnalysis(trace_dir=sys.argv[1])",
    analyse="    stragglers = [int(r) for r in analysis.get_potential_stragglers(num_candidates=1)]",
)


def measure(python: str, script: str, folder: Path) -> dict:
    done = subprocess.run([python, "-c", script, str(folder)], capture_output=True, text=True, timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:160]}
    return json.loads(lines[-1])


def real_sets(workdir: Path) -> list[tuple[str, Path, list[int] | None]]:
    """The matched multi-rank pairs among the samples (copied: HTA reads a whole folder)."""
    sets = []
    pairs = {
        "real: HTA trace_filter, 2 ranks (NCCL, sampled)": ["hta/trace_filter/sampled_rank-0.json.gz",
                                                           "hta/trace_filter/sampled_rank-1.json.gz"],
        "real: torch 2.13 gloo, 2 ranks (CPU)": ["gloo_cpu_torch2.13/rank0.json", "gloo_cpu_torch2.13/rank1.json"],
    }
    for label, files in pairs.items():
        if not all((SAMPLES / f).exists() for f in files):
            print(f"skipping {label}: samples not found under {SAMPLES}", file=sys.stderr)
            continue
        folder = workdir / f"real{len(sets)}"
        folder.mkdir()
        for f in files:
            shutil.copy(SAMPLES / f, folder / Path(f).name)
        sets.append((label, folder, None))
    return sets


def simulated_sets(workdir: Path, sizes: list[tuple[int, int, int]]) -> list[tuple[str, Path, list[int]]]:
    from rankscope.analysis.simulate import JobSpec, Straggler, simulate, truth

    sets = []
    for nodes, gpus, steps in sizes:
        world = nodes * gpus
        spec = JobSpec(nodes=nodes, gpus_per_node=gpus, tp=min(gpus, 4), steps=steps, seed=7,
                       stragglers=[Straggler(rank=world // 2 + 1, kind="compute", extra_ns=3_000_000)])
        folder = workdir / f"sim{world}x{steps}"
        simulate(spec, folder, fmt="kineto")
        raw_mib = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        sets.append((f"simulated: {world} ranks x {steps} steps ({raw_mib:.0f} MiB JSON)", folder,
                     truth(spec)["stragglers"]))
    return sets


def verdict(result: dict, truth: list[int] | None) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    if result.get("analysis_error"):
        return f"straggler analysis failed: {result['analysis_error']}"
    named = result["stragglers"]
    if truth is None:
        return f"named {named} (no ground truth)"
    return f"named {named}: {'correct' if sorted(named) == sorted(truth) else 'WRONG'} (truth {truth})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", default="/tmp/hta-venv/bin/python",
                        help="a Python with holistictraceanalysis installed")
    parser.add_argument("--sizes", default="2x4x20,4x8x20", metavar="NODESxGPUSxSTEPS,...",
                        help="simulated jobs (default: %(default)s)")
    parser.add_argument("--keep", type=Path, default=None, help="write the traces here and keep them")
    args = parser.parse_args()
    if not Path(args.hta_python).exists():
        print(f"no HTA interpreter at {args.hta_python}: see this file's docstring", file=sys.stderr)
        return 2
    hta_version = subprocess.run([args.hta_python, "-c", "import importlib.metadata as m; "
                                  "print(m.version('holistictraceanalysis'))"], capture_output=True, text=True)
    print(f"HTA {hta_version.stdout.strip() or '?'} ({args.hta_python}) vs rankscope ({sys.executable})")
    sizes = [tuple(int(x) for x in item.split("x")) for item in args.sizes.split(",") if item]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="rankscope-vs-hta-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        for label, folder, truth in real_sets(workdir) + simulated_sets(workdir, sizes):
            ours = measure(sys.executable, RANKSCOPE, folder)
            theirs = measure(args.hta_python, HTA, folder)
            print(f"\n{label}")
            for name, result in (("rankscope", ours), ("HTA", theirs)):
                if "error" not in result:
                    print(f"  {name:<9} load {result['load_s']:6.2f} s + analysis {result['analysis_s']:6.2f} s"
                          f" = {result['seconds']:6.2f} s   peak {result['peak_mib']:5.0f} MiB"
                          f" (growth {result['growth_mib']:5.0f})   {verdict(result, truth)}")
                else:
                    print(f"  {name:<9} {verdict(result, truth)}")
            if "error" not in ours and "error" not in theirs:
                print(f"  ratio     HTA/rankscope time {theirs['seconds'] / ours['seconds']:.1f}x "
                      f"(load {theirs['load_s'] / ours['load_s']:.1f}x)   rankscope/HTA peak "
                      f"{ours['peak_mib'] / theirs['peak_mib']:.2f}, growth "
                      f"{ours['growth_mib'] / max(theirs['growth_mib'], 1e-9):.2f}")
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
