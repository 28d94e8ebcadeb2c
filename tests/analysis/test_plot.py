"""The per-rank picture is drawn from a real analysis and written whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankscope.analysis.pipeline import analyze
from rankscope.analysis.report import Report
from rankscope.analysis.testing import SyntheticJob, synthetic_job
from rankscope.cli import main
from rankscope.errors import RankscopeWarning

pytest.importorskip("matplotlib", reason="plots need the [plot] extra")
from rankscope.analysis import plot  # noqa: E402

# `rankscope analyze` run here prints its warnings on stderr, as a user sees them (raised as
# errors, as the suite takes them elsewhere, they would end the command): the tests read them there.
AS_THE_CLI_SHOWS = pytest.mark.filterwarnings("default::rankscope.errors.RankscopeWarning")
INFERRED = ("rankscope: warning: 1 communicator(s) without member lists (inferred:allreduce): members inferred from "
            "the ranks that use them")


def test_plot_is_a_png_titled_with_the_stragglers(tmp_path: Path) -> None:
    digests, truth = synthetic_job(SyntheticJob(stragglers={5: 300_000}))
    report = analyze(digests)
    out = plot.save(report, tmp_path / "ranks.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.stragglers == truth.stragglers == [5]
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def _png_height(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[20:24], "big")  # IHDR: width, then height


def test_a_report_with_bus_bandwidths_gets_their_panel(tmp_path: Path) -> None:
    from rankscope.analysis import simulate as sm
    from rankscope.analysis.sources import load_digests

    sm.simulate(sm.JobSpec(nodes=4, gpus_per_node=8, tp=8, steps=5, slow_links=(19,)), tmp_path / "job")
    report = analyze(load_digests([tmp_path / "job"]))
    assert report.slow_communicators and all(o.busbw_gbps for c in report.communicators for o in c.ops)
    older = report.to_dict()  # as stored before reports had bandwidths
    del older["slow_communicators"]
    for comm in older["communicators"]:
        for op in comm["ops"]:
            del op["busbw_gbps"]
    plain = Report.from_dict(older)
    with_links, without = plot.save(report, tmp_path / "links.png"), plot.save(plain, tmp_path / "plain.png")
    assert _png_height(with_links) > _png_height(without)


@AS_THE_CLI_SHOWS
def test_analyze_plot_flag_writes_the_figure(tmp_path: Path, samples: Path, capsys) -> None:
    dsl = samples / "nsys" / "dsl_2node_2rank_allreduce"
    assert main(["analyze", str(dsl), "--plot", str(tmp_path / "ranks.svg"), "-o", str(tmp_path / "r.txt")]) == 0
    assert "<svg" in (tmp_path / "ranks.svg").read_text()
    assert capsys.readouterr().err.splitlines() == [INFERRED]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
@AS_THE_CLI_SHOWS
def test_a_report_and_its_plot_are_written_both_or_neither(tmp_path: Path, samples: Path, capsys) -> None:
    # Found by fuzzing: a plot that could not be written (its disk full) failed the run, exit 2,
    # with the report written beside it.
    dsl = samples / "nsys" / "dsl_2node_2rank_allreduce"
    (tmp_path / "full.png").symlink_to("/dev/full")
    assert main(["analyze", str(dsl), "-o", str(tmp_path / "r.json"), "--plot", str(tmp_path / "full.png")]) == 2
    warned, failed = capsys.readouterr().err.splitlines()
    assert warned == INFERRED and "full.png: cannot write the output (No space left on device)" in failed
    assert main(["analyze", str(dsl), "-o", "/dev/full", "--plot", str(tmp_path / "ranks.png")]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.png"]


@pytest.mark.parametrize("dangling", ["-o", "--plot"])
def test_a_report_or_plot_named_by_a_dangling_link_is_refused_before_any_work(tmp_path: Path, samples: Path, capsys,
                                                                               dangling: str) -> None:
    # Found by fuzzing the outputs: the link was replaced by a file.
    dsl = samples / "nsys" / "dsl_2node_2rank_allreduce"
    link = tmp_path / "latest.png"
    link.symlink_to("runs/ranks.png")
    other = {"-o": ["--plot", str(tmp_path / "ranks.png")], "--plot": ["-o", str(tmp_path / "r.txt")]}[dangling]
    assert main(["analyze", str(dsl), dangling, str(link), *other]) == 2
    assert f"{link}: a dangling link (to {tmp_path}/runs/ranks.png)" in capsys.readouterr().err
    assert link.is_symlink() and [p.name for p in tmp_path.iterdir()] == ["latest.png"]


def test_plot_into_a_missing_folder_fails_before_any_work(tmp_path: Path, samples: Path, capsys) -> None:
    dsl = samples / "nsys" / "dsl_2node_2rank_allreduce"
    assert main(["analyze", str(dsl), "--plot", str(tmp_path / "nope" / "ranks.png")]) == 2
    assert f"folder {tmp_path / 'nope'} does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["report.txt", "report", "report.pgf", "report.ps"])  # .pgf: TeX, after the analysis
def test_a_plot_path_naming_no_format_is_refused_before_any_work(tmp_path: Path, name: str) -> None:
    from rankscope.errors import InputError

    with pytest.raises(InputError, match=f"{name}: a plot's suffix names its format"):
        plot.check(tmp_path / name)
    plot.check(tmp_path / "report.svg")
    assert list(tmp_path.iterdir()) == []


def test_nccl_time_matched_to_no_peer_is_drawn_not_left_out(tmp_path: Path, monkeypatch) -> None:
    # One rank alone: 110 ms in NCCL in the table, an empty "collective time" panel.
    from matplotlib.axes import Axes

    from rankscope.analysis import simulate as sm
    from rankscope.analysis.sources import load_digests

    sm.simulate(sm.JobSpec(nodes=1, gpus_per_node=2, tp=2, steps=3), tmp_path / "job")
    with pytest.warns(RankscopeWarning, match=r"^1 of the job's 2 ranks not in the input \(1\)"):
        report = analyze(load_digests([tmp_path / "job" / "sim_rank00000.sqlite"]))
    (rank,) = report.ranks
    assert rank.nccl_unmatched_ns == rank.nccl_kernel_ns > 0
    drawn = {}
    bar = Axes.bar
    monkeypatch.setattr(Axes, "bar", lambda self, x, height, *a, **kw: drawn.setdefault(kw.get("label"), list(height))
                        and bar(self, x, height, *a, **kw))
    plot.save(report, tmp_path / "one.png")
    assert drawn["matched to no peer"] == [pytest.approx(rank.nccl_kernel_ns / 1e6)]


def test_a_plot_of_hundreds_of_ranks_stays_a_picture_one_can_open(tmp_path: Path) -> None:
    digests, _ = synthetic_job(SyntheticJob(nodes=64, gpus_per_node=8, steps=3))
    out = plot.save(analyze(digests), tmp_path / "many.png")
    width = int.from_bytes(out.read_bytes()[16:20], "big")
    assert width <= plot.MAX_WIDTH_IN * 110 + 1  # 512 ranks: 14,410 px wide before
