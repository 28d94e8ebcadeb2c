"""The report as a picture: who arrives late, who waits, who is busy, which links are slow.

Rendering only; it reads a finished :class:`Report` and computes nothing new, so the
analysis stays free of plotting (style.md §4.4). Needs matplotlib
(``pip install 'rankscope[plot]'``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rankscope import output
from rankscope.analysis.report import Report, ranks_text
from rankscope.errors import ConfigError, InputError

STRAGGLER = "#c0392b"
PEER = "#7f8c8d"
WAIT = "#e67e22"
TRANSFER = "#2980b9"
UNMATCHED = "#bdc3c7"
FORMATS = ("png", "svg", "pdf")
MAX_WIDTH_IN = 40.0
MAX_TICKS = 128


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'rankscope[plot]'") from None
    return plt


def check(path: Path) -> None:
    """Fail before any work where ``path`` cannot take the plot: no matplotlib, a suffix
    naming no format it draws, or a place that cannot be written."""
    _pyplot()
    output.check_writable(path)
    # the formats matplotlib draws with no other program (.pgf and .ps need TeX or Ghostscript)
    if path.suffix.lower().lstrip(".") not in FORMATS:
        raise InputError(f"a plot's suffix names its format: .png, .svg or .pdf (not {path.suffix or 'none'})", path=path)


def save(report: Report, path: str | Path) -> Path:
    """Write the per-rank panels, and one of bus bandwidth per communicator where the report
    has one (PNG, SVG or PDF by suffix), atomically."""
    plt = _pyplot()
    path = Path(path)
    ranks = sorted(report.ranks, key=lambda r: r.rank)
    x = np.arange(len(ranks))
    labels = [str(r.rank) for r in ranks]
    flagged = set(report.stragglers)
    colors = [STRAGGLER if r.rank in flagged else PEER for r in ranks]

    # Like communicators side by side (kind, op, then ranks), as slow links are judged among them.
    links = sorted(((c, o) for c in report.communicators for o in c.ops if o.busbw_gbps is not None),
                   key=lambda link: (link[0].kind, link[1].op, link[0].ranks))
    # a quarter inch a bar, up to MAX_WIDTH_IN: 8192 ranks drew a 225,610 px wide PNG in 70 s and 2.8 GB
    width = min(MAX_WIDTH_IN, max(6.0, 0.25 * max(len(ranks), len(links)) + 3))
    fig, axes = plt.subplots(4 if links else 3, 1, figsize=(width, 10.5 if links else 8))
    late, nccl, busy = axes[:3]
    for above in (late, nccl):
        above.sharex(busy)
        above.tick_params(labelbottom=False)
    title = "rankscope: " + (f"stragglers {sorted(flagged)}" if flagged else "no straggler flagged")
    if report.slow_communicators:
        title += f"; {len(report.slow_communicators)} slow link(s)"
    fig.suptitle(title)

    late.bar(x, [_us(r.late_mean_ns) for r in ranks], color=colors)
    late.set_ylabel("mean lateness (µs)")
    late.set_title("arrival lateness per collective (aligned clocks)", fontsize=9, loc="left")

    wait = np.array([r.nccl_wait_ns for r in ranks], dtype=float) / 1e6
    transfer = np.array([r.nccl_transfer_ns for r in ranks], dtype=float) / 1e6
    unmatched = np.array([r.nccl_unmatched_ns for r in ranks], dtype=float) / 1e6
    nccl.bar(x, wait, color=WAIT, label="waiting for peers")
    nccl.bar(x, transfer, bottom=wait, color=TRANSFER, label="transfer")
    if unmatched.any():  # a rank's NCCL time in calls matched to no peer's: not split, still drawn
        nccl.bar(x, unmatched, bottom=wait + transfer, color=UNMATCHED, label="matched to no peer")
    nccl.set_ylabel("collective time (ms)")
    nccl.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=3, frameon=False)  # above: bars fill the panel

    busy.bar(x, [r.gpu_busy_pct or 0.0 for r in ranks], color=colors)
    busy.set_ylabel("busy %")
    busy.set_ylim(0, 100)
    busy.set_xlabel("rank")
    every = max(1, -(-len(ranks) // MAX_TICKS))  # a label each `every` ranks: at most MAX_TICKS
    busy.set_xticks(x[::every], labels[::every], fontsize=7 if len(ranks) > 32 else 9)
    if links:
        _bandwidth(axes[3], report, links)

    fig.tight_layout()
    try:
        with output.replacing(path) as tmp:
            fig.savefig(tmp, dpi=110)
    finally:
        plt.close(fig)
    return path


def _bandwidth(axis, report: Report, links: list) -> None:
    """Bus bandwidth per (communicator, op), the slow links in the straggler colour."""
    slow = {(c.comm_id, c.op) for c in report.slow_communicators}
    x = np.arange(len(links))
    axis.bar(x, [o.busbw_gbps for _, o in links],
             color=[STRAGGLER if (c.comm_id, o.op) in slow else TRANSFER for c, o in links])
    axis.set_ylabel("bus bandwidth (GB/s)")
    axis.set_title("bus bandwidth per communicator" + (" (slow links in red)" if slow else ""), fontsize=9, loc="left")
    every = max(1, -(-len(links) // MAX_TICKS))
    axis.set_xticks(x[::every], [f"{c.kind} {ranks_text(c.ranks)} {o.op}" for c, o in links][::every], rotation=90,
                    fontsize=6 if len(links) > 32 else 8)


def _us(value: float | None) -> float:
    # Lateness hidden below the clock uncertainty is reported as None: draw it as 0.
    return 0.0 if value is None else value / 1e3
