"""rankscope vs HolisticTraceAnalysis (HTA) on the same multi-rank Kineto traces, in one run.

Trace sets: the real matched pairs in ../shared/samples/kineto, and larger jobs the simulator
writes as Kineto JSON with one known straggler. For each set each tool runs in a fresh
process of its own: load every rank's trace and find the stragglers (rankscope:
``load_digests`` + ``analyze``, with pyarrow kept from pandas as the ``rankscope`` command
keeps it; HTA: ``TraceAnalysis`` + ``get_potential_stragglers``).

Measured per run, imports excluded:
- wall time of load + analysis, and CPU time (the process and any workers it forks: HTA
  parses ranks in a multiprocessing pool, rankscope in one process);
- peak memory of the whole process tree: the resident set (RSS) of the tool's process plus
  the private memory of every process it forks (their pages shared with it are counted once,
  in its RSS), sampled every 20 ms, and its growth over the process's RSS after imports.
  Not PSS: PSS splits a shared library's pages among every process on the machine that
  maps it, so other programs run from the same environment would lower one tool's number.
Printed: both tools' numbers, the ratios HTA/rankscope for time and rankscope/HTA for
memory, and whom each named against the truth where it is known; and the RSS of a Python
that imports numpy and pyarrow alone, the least any tool built on them can peak at, with
the sets where a third of HTA's peak is below it marked. Other load on the
machine slows both; the CPU-time ratio is the steadier one. ``--repeat N`` runs each tool
N times per set, alternating, and keeps each tool's least wall time, CPU time and peak
(each over its N runs; a fresh process every run, so every run is a cold one).

HTA is not a rankscope dependency: install it in a separate environment and point
``--hta-python`` at that interpreter, e.g.
    python3 -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install holistictraceanalysis
    .venv/bin/python bench/vs_hta.py --hta-python /tmp/hta-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT.parent / "shared" / "samples" / "kineto"

# A child's lines setting ``rss``: its resident set in MiB, as the peak is measured.
_RSS = """
with open("/proc/self/smaps_rollup") as f:
    rss = next(int(line.split()[1]) for line in f if line.startswith("Rss:")) / 1024
"""
# Each child prints one JSON line: times, its memory after imports, stragglers named.
_MEASURE = """
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
{imports}
""" + _RSS + """base = rss
def cpu():
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
c0, t0 = cpu(), time.perf_counter()
{load}
t1 = time.perf_counter()
try:
{analyse}
    error = None
except Exception as exc:  # e.g. HTA finding no communication kernels
    stragglers, error = None, f"{{type(exc).__name__}}: {{exc}}"[:160]
t2 = time.perf_counter()
print(json.dumps({{"load_s": t1 - t0, "analysis_s": t2 - t1, "seconds": t2 - t0, "cpu_s": cpu() - c0,
                  "base_mib": base, "stragglers": stragglers, "analysis_error": error}}))
"""

RANKSCOPE = _MEASURE.format(
    # numpy.ma (~20 ms) is imported by pyarrow's first numpy conversion: an import, excluded as HTA's are
    imports="from rankscope.cli import arrow_without_pandas\narrow_without_pandas()  # as `rankscope analyze` runs\n"
            "import numpy.ma\n"
            "from rankscope.analysis import kineto\nfrom rankscope.analysis.sources import load_digests\n"
            "from rankscope.analysis.pipeline import analyze",
    load="digests = load_digests([sys.argv[1]])",
    analyse="    stragglers = [int(r) for r in analyze(digests).stragglers]",
)
HTA = _MEASURE.format(
    imports="import logging\nlogging.disable(logging.WARNING)\nfrom hta.trace_analysis import TraceAnalysis",
    load="analysis = TraceAnalysis(trace_dir=sys.argv[1])",
    analyse="    stragglers = [int(r) for r in analysis.get_potential_stragglers(num_candidates=1)]",
)


def _tree(pid: int) -> list[int]:
    """The process and all its descendants (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return found


def _tree_mib(pids: list[int]) -> float:
    """RSS of the first process plus the private memory of the others (``_tree`` order)."""
    total = 0
    for p in pids:
        keys = ("Rss:",) if p == pids[0] else ("Private_Clean:", "Private_Dirty:")
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith(keys))
        except OSError:
            continue
    return total / 1024


def measure(python: str, script: str, folder: Path, timeout_s: float) -> dict:
    """Run one tool on one trace set in a fresh process; its JSON line plus the tree's peak memory."""
    child = subprocess.Popen([python, "-c", script, str(folder)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    peak, done = [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_mib(_tree(child.pid)))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for p in reversed(_tree(child.pid)):
            try:
                os.kill(p, 9)
            except OSError:
                pass
        child.communicate()
        return {"error": f"did not finish within {timeout_s:.0f} s (killed)"}
    finally:
        done.set()
        sampler.join()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        return {"error": tail[0][:160]}
    result = json.loads(lines[-1])
    result["peak_mib"] = peak[0]
    result["growth_mib"] = peak[0] - result["base_mib"]
    return result


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
        size = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        sets.append((f"{label}, {size:.1f} MiB", folder, None))
    return sets


def simulated_sets(workdir: Path, sizes: list[tuple[int, ...]], old_names: bool) -> list[tuple[str, Path, list[int]]]:
    """Jobs with one compute straggler. Traces grow by kernels per step, not by steps: a
    profiling window holds a few steps, and HTA's per-event step lookup scans every step
    (many-step windows would measure that quadratic term, not parsing).

    ``old_names``: NCCL kernels renamed to the pre-2.19 spelling (``ncclKernel_...``), the
    only one HTA 0.5.0's straggler analysis recognises (it finds no communication kernels
    in ``ncclDevKernel_...``); rankscope reads both."""
    from rankscope.analysis.simulate import JobSpec, Straggler, simulate, truth

    sets = []
    for nodes, gpus, steps, kernels in sizes:
        world = nodes * gpus
        spec = JobSpec(nodes=nodes, gpus_per_node=gpus, tp=min(gpus, 4), steps=steps, kernels_per_phase=kernels,
                       seed=7, stragglers=[Straggler(rank=world // 2 + 1, kind="compute", extra_ns=3_000_000)])
        folder = workdir / f"sim{world}x{steps}x{kernels}"
        files = simulate(spec, folder, fmt="kineto")
        for path in files if old_names else ():
            path.write_bytes(path.read_bytes().replace(b'"ncclDevKernel_', b'"ncclKernel_'))
        total = sum(p.stat().st_size for p in files) / 2**20
        sets.append((f"simulated: {world} ranks x {steps} steps x {kernels} kernels per collective, {total:.0f} MiB JSON "
                     f"({total / len(files):.1f} MiB per rank)", folder, truth(spec)["stragglers"]))
    return sets


def best(runs: list[dict]) -> dict:
    """One tool's runs on one set as one result: the least of each time and of the peak
    (the last run's error where any run failed; stragglers as every run named them)."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[-1]
    result = dict(min(runs, key=lambda run: run["seconds"]))
    for key in ("cpu_s", "peak_mib", "growth_mib"):
        result[key] = min(run[key] for run in runs)
    named = {json.dumps(run["stragglers"]) for run in runs}
    if len(named) > 1:
        result["disagree"] = f"runs disagree: named {' / '.join(sorted(named))}"
    return result


def verdict(result: dict, truth: list[int] | None) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    if result.get("analysis_error"):
        return f"straggler analysis failed: {result['analysis_error']}"
    if result.get("disagree"):
        return result["disagree"]
    named = result["stragglers"]
    if truth is None:
        return f"named {named} (no ground truth)"
    return f"named {named}: {'correct' if sorted(named) == sorted(truth) else 'WRONG'} (truth {truth})"


# numpy and pyarrow imported, nothing else: the least RSS any Arrow-based tool can peak at.
_LIBRARIES = "import numpy, pyarrow" + _RSS + "print(rss)"


def libraries_mib(runs: int = 3) -> float:
    """RSS of a Python that imports numpy and pyarrow alone (least of ``runs``: a library's
    resident pages depend on what else has it in the page cache)."""
    return min(float(subprocess.run([sys.executable, "-c", _LIBRARIES], capture_output=True, text=True,
                                    check=True).stdout) for _ in range(runs))


def report(label: str, ours: dict, theirs: dict, truth: list[int] | None, libraries: float) -> str | None:
    """Print one set's block; return its one-line summary (``*`` where a third of HTA's peak
    is below ``libraries``, numpy and pyarrow's own MiB)."""
    print(f"\n{label}")
    for name, result in (("rankscope", ours), ("HTA", theirs)):
        if "error" in result:
            print(f"  {name:<9} {verdict(result, truth)}")
            continue
        print(f"  {name:<9} load {result['load_s']:7.2f} s + analysis {result['analysis_s']:6.2f} s"
              f" = {result['seconds']:7.2f} s (CPU {result['cpu_s']:7.2f} s)   peak {result['peak_mib']:6.0f} MiB"
              f" (growth {result['growth_mib']:6.0f})   {verdict(result, truth)}")
    if "error" in ours or "error" in theirs:
        return None
    time_ratio = theirs["seconds"] / ours["seconds"]
    cpu_ratio = theirs["cpu_s"] / ours["cpu_s"]
    peak_ratio = ours["peak_mib"] / theirs["peak_mib"]
    growth_ratio = ours["growth_mib"] / max(theirs["growth_mib"], 1e-9)
    print(f"  ratio     HTA/rankscope time {time_ratio:.1f}x (CPU {cpu_ratio:.1f}x, load "
          f"{theirs['load_s'] / ours['load_s']:.1f}x)   rankscope/HTA peak {peak_ratio:.2f}, growth {growth_ratio:.2f}")
    below = theirs["peak_mib"] / 3 < libraries
    if below:
        print(f"  a third of HTA's peak, {theirs['peak_mib'] / 3:.0f} MiB, is less than numpy and pyarrow alone take "
              f"({libraries:.0f} MiB)")
    return (f"{time_ratio:6.1f}x {cpu_ratio:6.1f}x {peak_ratio:6.2f}{'*' if below else ' '} {growth_ratio:7.2f}  "
            f"{label.split(',')[0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", default="/tmp/hta-venv/bin/python",
                        help="a Python with holistictraceanalysis installed")
    parser.add_argument("--sizes", default="2x4x40x300,8x4x40x300", metavar="NODESxGPUSxSTEPSxKERNELS,...",
                        help="simulated jobs, KERNELS compute kernels before each of a step's 3 "
                             "collectives (default: %(default)s)")
    parser.add_argument("--nccl-names", choices=("old", "new"), default="old",
                        help="NCCL kernel names in simulated traces: old (ncclKernel_*, which HTA's straggler "
                             "analysis needs) or new (ncclDevKernel_*, NCCL >= 2.19) (default: %(default)s)")
    # More than one: on shared cores a single run of a 10 ms analysis can take 30 (either tool's).
    parser.add_argument("--repeat", type=int, default=3, metavar="N",
                        help="runs of each tool per set, alternating; the least times and peak are kept "
                             "(default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per tool run (default: %(default)s)")
    parser.add_argument("--keep", type=Path, default=None, help="write the traces here and keep them")
    args = parser.parse_args()
    if not Path(args.hta_python).exists():
        print(f"no HTA interpreter at {args.hta_python}: see this file's docstring", file=sys.stderr)
        return 2
    hta_version = subprocess.run([args.hta_python, "-c", "import importlib.metadata as m; "
                                  "print(m.version('holistictraceanalysis'))"], capture_output=True, text=True)
    print(f"HTA {hta_version.stdout.strip() or '?'} ({args.hta_python}) vs rankscope ({sys.executable}); "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; best of {max(args.repeat, 1)} run(s) each")
    sizes = [tuple(int(x) for x in item.split("x")) for item in args.sizes.split(",") if item]
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="rankscope-vs-hta-"))
    workdir.mkdir(parents=True, exist_ok=True)
    libraries = libraries_mib()
    print(f"numpy and pyarrow alone: {libraries:.0f} MiB RSS (rankscope's digests are Arrow)")
    summary = []
    try:
        for label, folder, truth in real_sets(workdir) + simulated_sets(workdir, sizes, args.nccl_names == "old"):
            runs: dict[str, list[dict]] = {"ours": [], "theirs": []}
            for _ in range(max(args.repeat, 1)):
                runs["ours"].append(measure(sys.executable, RANKSCOPE, folder, args.timeout))
                runs["theirs"].append(measure(args.hta_python, HTA, folder, args.timeout))
            ours, theirs = best(runs["ours"]), best(runs["theirs"])
            line = report(label, ours, theirs, truth, libraries)
            if line:
                summary.append(line)
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\nHTA/rankscope time (wall, CPU), rankscope/HTA memory (peak, growth); aim: time >= 10x, memory <= 0.33")
    print("\n".join(summary))
    if any("*" in line for line in summary):
        print(f"* a third of HTA's peak is less than numpy and pyarrow alone take ({libraries:.0f} MiB): "
              "no tool built on them meets the peak aim on that set")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
