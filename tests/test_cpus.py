"""CPUs usable under a cgroup CPU quota: /proc and cgroup files laid out as Linux writes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rankscope import cpus


def _proc(tmp_path: Path, mounts: list[str], cgroup: list[str]) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text("".join(line + "\n" for line in mounts))
    (proc / "cgroup").write_text("".join(line + "\n" for line in cgroup))
    return proc


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


@pytest.fixture
def eight_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))


def test_a_containers_cgroup_v2_limit_caps_the_cpus_its_affinity_shows(tmp_path, eight_cpus) -> None:
    """A Kubernetes CPU limit of 2.5 in a cgroup namespace: the container's cgroup is the mount's root."""
    fs = tmp_path / "sys/fs/cgroup"
    _write(fs, cpu_max="250000 100000")
    proc = _proc(tmp_path, ["20 19 0:26 / /proc/sys rw - proc proc rw",
                            f"30 19 0:27 / {fs} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"], ["0::/"])
    assert cpus.cgroup_quota(proc) == 2.5
    assert cpus.usable(proc) == 2  # each worker a whole CPU


def test_a_parents_quota_binds_the_service_below_it(tmp_path, eight_cpus) -> None:
    """systemd on a host (cgroup v2): the slice's CPUQuota binds the unit, whose own cpu.max is "max"."""
    fs = tmp_path / "sys/fs/cgroup"
    _write(fs / "rankscope.slice", cpu_max="300000 100000")
    _write(fs / "rankscope.slice/agent.service", cpu_max="max 100000")
    _write(fs / "other.slice", cpu_max="100000 100000")  # not ours: not read
    proc = _proc(tmp_path, [f"30 19 0:27 / {fs} rw shared:9 - cgroup2 cgroup2 rw"],
                 ["0::/rankscope.slice/agent.service"])
    assert cpus.cgroup_quota(proc) == 3.0 and cpus.usable(proc) == 3


def test_cgroup_v1_quota_under_the_cpu_controller_and_a_floor_of_one(tmp_path, eight_cpus) -> None:
    """Docker on cgroup v1: the host path of the container's cgroup is the mount's root."""
    fs = tmp_path / "sys/fs/cgroup"
    _write(fs / "cpu,cpuacct", cpu_cfs_quota_us="50000", cpu_cfs_period_us="100000")
    _write(fs / "memory", cpu_cfs_quota_us="10000", cpu_cfs_period_us="100000")  # no cpu controller there
    proc = _proc(tmp_path, [f"40 31 0:29 /docker/abc {fs}/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct",
                            f"41 31 0:30 /docker/abc {fs}/memory rw - cgroup cgroup rw,memory"],
                 ["4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc"])
    assert cpus.cgroup_quota(proc) == 0.5
    assert cpus.usable(proc) == 1


@pytest.mark.parametrize("v2, v1", [("max 100000", "-1"), (None, None)])
def test_no_quota_leaves_the_affinity(tmp_path, eight_cpus, v2, v1) -> None:
    """No limit set ("max", -1), or no files at all (a hybrid host's empty cgroup2 mount)."""
    fs = tmp_path / "sys/fs/cgroup"
    if v2 is not None:
        _write(fs / "unified", cpu_max=v2)
        _write(fs / "cpu", cpu_cfs_quota_us=v1, cpu_cfs_period_us="100000")
    proc = _proc(tmp_path, [f"41 31 0:38 / {fs}/unified rw - cgroup2 cgroup2 rw",
                            f"32 31 0:29 / {fs}/cpu rw - cgroup cgroup rw,cpu"], ["1:cpu:/", "0::/"])
    assert cpus.cgroup_quota(proc) is None
    assert cpus.usable(proc) == 8


def test_without_proc_files_the_affinity_counts(tmp_path, eight_cpus) -> None:
    assert cpus.cgroup_quota(tmp_path / "absent") is None
    assert cpus.usable(tmp_path / "absent") == 8
