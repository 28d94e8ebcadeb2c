"""How many CPUs this process can keep busy: its affinity, capped by a cgroup CPU quota.

A Kubernetes CPU limit or systemd's ``CPUQuota=`` is a CFS quota, not an affinity mask:
``os.sched_getaffinity`` (and Python 3.13's ``os.process_cpu_count``) still report every
CPU of the node. Work spread over that many processes then shares the quota: each of N
``nsys export`` runs goes N/quota times slower, past a timeout set for one at full speed.
The quota is read from the process's cgroup (found through /proc/self/mountinfo and
/proc/self/cgroup; cgroup v2, or v1's ``cpu`` controller) and from its ancestors up to
the mount: the tightest of them binds.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path

_PROC = Path("/proc/self")
_Read = Callable[[Path], "float | None"]


@functools.cache  # ~0.15 ms of /proc reads, asked on every local read of exports
def usable(proc: Path = _PROC) -> int:
    """CPUs this process may use at once: at least 1. A quota of 1.5 CPUs counts as 1, so
    that each worker sized by it has a whole CPU, the speed its timeout was set for. Read
    once per process: a limit changed later (a pod resized in place) counts from the next."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_quota(proc)
    return max(1, min(cpus, int(quota))) if quota is not None else cpus


def cgroup_quota(proc: Path = _PROC) -> float | None:
    """The CPU quota, in CPUs, of this process's cgroup and its ancestors (the least); None
    where there is none, or no cgroup file system to read it from."""
    try:
        mounts = (proc / "mountinfo").read_text().splitlines()
        groups = (proc / "cgroup").read_text().splitlines()
        quotas = [quota for folder, mountpoint, read in _cgroup_folders(mounts, groups)
                  for quota in map(read, _up_to(folder, mountpoint)) if quota is not None]
    except (OSError, ValueError):  # no /proc, or lines not as Linux writes them: no quota known
        return None
    return min(quotas) if quotas else None


def _cgroup_folders(mounts: list[str], groups: list[str]) -> Iterator[tuple[Path, Path, _Read]]:
    """For each mounted hierarchy that can limit CPU: the process's cgroup folder in it, the
    mount point, and how to read a quota there."""
    paths = {}  # hierarchy ("" for v2) -> the process's cgroup path in it
    for line in groups:
        _, controllers, path = line.split(":", 2)
        if controllers == "" or "cpu" in controllers.split(","):
            paths["" if controllers == "" else "cpu"] = path
    for line in mounts:
        fields = line.split()
        dash = fields.index("-")
        root, mountpoint, fstype, options = fields[3], fields[4], fields[dash + 1], fields[dash + 3]
        if fstype == "cgroup2":
            kind, read = "", _v2_quota
        elif fstype == "cgroup" and "cpu" in options.split(","):
            kind, read = "cpu", _v1_quota
        else:
            continue
        path = paths.get(kind)
        if path is None:
            continue
        # The mount shows the hierarchy from `root` down (a container's own cgroup, say); a
        # path outside it is the container's, seen from the host: the mount point is its folder.
        inside = os.path.relpath(path, root) if (path + "/").startswith(root.rstrip("/") + "/") else "."
        yield Path(mountpoint) / inside, Path(mountpoint), read


def _up_to(folder: Path, mountpoint: Path) -> Iterator[Path]:
    """``folder`` and its parents, to the mount point: a parent's quota binds its children."""
    for at in (folder, *folder.parents):
        yield at
        if at == mountpoint:
            return


def _v2_quota(folder: Path) -> float | None:
    """cpu.max: "QUOTA PERIOD" in microseconds, QUOTA "max" for none."""
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):  # "max", or no such file at this level
        return None


def _v1_quota(folder: Path) -> float | None:
    """cpu.cfs_quota_us over cpu.cfs_period_us; a quota of -1 for none."""
    try:
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        period = int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
