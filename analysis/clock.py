"""One time base for all ranks: a per-host clock offset and drift fitted on collective ends.

Ranks of one host share a clock, so there is one model per host:
``local = t0 + (1 + drift) * (aligned - t0) + offset``. It is fitted on the end times
of N-to-N collectives, which complete at nearly the same real time on every member
while their starts carry the skew being measured (reference/alignment-and-metrics.md
§2-§3): a robust alternating fit of a per-instance consensus end (median over hosts)
and a per-host Huber line, re-gauged each round to mean offset 0 (or the mean of the
coordinator's clock hints) and mean drift 0. Fallbacks (§3.7): fewer than
``MIN_DRIFT_ANCHORS`` anchors, or a drift known no better than a plausible one, gives
offset only; none gives the UTC anchor or the
coordinator's hint, flagged as NTP quality.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from rankscope.analysis.groups import ArrayLike, Groups, Table, codes, isin, take
from rankscope.analysis.matching import UNMATCHED
from rankscope.analysis.ops import N_TO_N_OPS
from rankscope.analysis.robust import MAD_TO_SIGMA, median_of_others, nanmedian

MIN_DRIFT_ANCHORS = 20
# Offset only errs at a window's edges by the host's drift times half the window, a fitted
# drift by its standard error times the same. So a drift is fitted where that error is below
# a plausible drift (crystals within ~100 ppm of each other, NTP-disciplined clocks tens or
# less), or where the drift stands out of it DRIFT_SIGNIFICANCE-fold (a clock drifting more
# than most). CPU-side ends noisy by hundreds of us over 100 ms give errors of hundreds of ppm.
PLAUSIBLE_DRIFT_PPM = 20.0
DRIFT_SIGNIFICANCE = 3.0
ROUNDS = 5
HUBER_K = 1.345
# The IRLS stops once an iteration moves no host's line by more than this share of its
# residual scale (or MIN_TOLERANCE_NS, for noise-free anchors): 10 iterations at most.
CONVERGED = 0.01
MIN_TOLERANCE_NS = 0.01
# nsys documents "one to tens of milliseconds" for NTP-synchronised hosts; a ping-based
# hint from the coordinator is better but still far from collective-anchored.
NTP_UNCERTAINTY_NS = 10_000_000.0
HINT_UNCERTAINTY_NS = 1_000_000.0
MAX_WINDOWS = 10
WINDOW_ANCHORS = 20  # anchors per window, at least
WINDOW_SIGNIFICANCE = 5.0
# With one or two anchors the fitted offset absorbs the residuals, so their spread says
# nothing; assume the end-coincidence spread of real exports instead (reference §2: ~1 us
# for nsys, hundreds of us for Kineto) at a conservative 10 us.
MIN_SPREAD_ANCHORS = 3
SPARSE_UNCERTAINTY_NS = 10_000.0
# Beyond this a ping-based hint and the collective fit cannot both be right.
HINT_TOLERANCE_NS = 2_000_000
# Fitted clocks this far apart are no NTP hosts' (within tens of ms, alignment-and-metrics.md
# §1): no clock sync, or traces of two runs whose collectives were matched as one job's.
FAR_APART_NS = 60_000_000_000


@dataclass(frozen=True)
class HostClock:
    host: str
    offset_ns: float  # host clock minus aligned time at t0
    drift_ppm: float  # relative to the mean of the fitted hosts
    uncertainty_ns: float  # 1-sigma alignment error of one event (residual MAD)
    anchors: int
    method: str  # "offset+drift", "offset", "shared clock", "coordinator hint", "utc (NTP quality)"
    # Non-linear remainder (§3.4): windowed median residuals at window centres (aligned
    # ns since t0), interpolated; empty when the line explains the anchors.
    window_centres: tuple[float, ...] = ()
    window_residuals: tuple[float, ...] = ()

    def correction(self, aligned_rel: np.ndarray) -> np.ndarray:
        if not self.window_centres:
            return np.zeros_like(aligned_rel)
        return np.interp(aligned_rel, self.window_centres, self.window_residuals)


@dataclass
class ClockModel:
    t0_ns: int
    hosts: dict[str, HostClock]
    method: str
    anchors: int
    warnings: list[str] = field(default_factory=list)
    off_hints: list[str] = field(default_factory=list)  # fitted hosts whose offset is far from the coordinator's

    def align(self, hosts: ArrayLike, times: np.ndarray) -> np.ndarray:
        """Local int64 ns on each row's host -> aligned int64 ns (vectorised)."""
        times = np.asarray(times, dtype=np.int64)
        if self._unmoved() and (not len(times) or np.abs(times - self.t0_ns).max() <= 1 << 53):
            return times.copy()  # what the arithmetic below gives: offsets 0, rates 1, exact in float64
        host, names = codes(hosts)
        clocks = [self.hosts[h] for h in names]
        offset = np.array([c.offset_ns for c in clocks], dtype=np.float64)[host]
        rate = 1.0 + np.array([c.drift_ppm for c in clocks], dtype=np.float64)[host] * 1e-6
        relative = (times - self.t0_ns).astype(np.float64)
        aligned = (relative - offset) / rate
        for code, clock in enumerate(clocks):
            if clock.window_centres:
                rows = host == code
                aligned[rows] -= clock.correction(aligned[rows]) / rate[rows]
        return self.t0_ns + np.rint(aligned).astype(np.int64)

    def _unmoved(self) -> bool:
        """Every clock reads aligned time (one host's shared clock, NTP-quality ones)."""
        return all(c.offset_ns == 0 and c.drift_ppm == 0 and not c.window_centres for c in self.hosts.values())

    def local_minus_aligned(self, host: str, aligned_ns: int) -> float:
        """How far the host's clock reads ahead of the aligned base at one instant."""
        clock = self.hosts[host]
        rel = float(aligned_ns - self.t0_ns)
        return clock.offset_ns + clock.drift_ppm * 1e-6 * rel + float(clock.correction(np.array([rel]))[0])

    def uncertainty(self, hosts: ArrayLike) -> np.ndarray:
        host, names = codes(hosts)
        return np.array([self.hosts[h].uncertainty_ns for h in names], dtype=np.float64)[host]


def anchor_ends(events: Table, t0: int) -> tuple[np.ndarray, np.ndarray]:
    """Hosts x anchor instances: each host's median end (local ns after ``t0``) of N-to-N
    instances spanning hosts (NaN where a host has no row), and the hosts of its rows.
    Relative to t0 because epoch ns do not fit float64 exactly."""
    instance = np.asarray(events["instance"], np.int64)
    rows = (instance != UNMATCHED) & isin(events["op"], N_TO_N_OPS)
    host, names = codes(take(events["host"], rows))
    per_host = Groups(instance[rows], host)
    median_end = per_host.median(np.asarray(events["end_ns"], np.int64)[rows] - t0)
    anchor, anchor_host = per_host.keys
    anchors, column = np.unique(anchor, return_inverse=True)
    spans = np.bincount(column, minlength=len(anchors)) > 1
    kept = spans[column]
    used = np.unique(anchor_host[kept])
    table = np.full((len(used), int(spans.sum())), np.nan)
    table[np.searchsorted(used, anchor_host[kept]), (np.cumsum(spans) - 1)[column[kept]]] = median_end[kept]
    return table, names[used]


def linked_hosts(events: Table) -> frozenset[frozenset[str]]:
    """The groups of hosts that the matched N-to-N instances spanning hosts link (`fit` aligns
    each group on its own)."""
    values, names = anchor_ends(events, 0)  # only which host saw which anchor matters here
    return frozenset(frozenset(names[component].tolist()) for component in _components(values))


def fit(events: Table, hosts: list[str], hints: Mapping[str, int] | None = None) -> ClockModel:
    """Fit every host's clock from the matched collective rows (columns instance, op, host, end_ns)."""
    hints = dict(hints or {})
    end = np.asarray(events["end_ns"], np.int64)
    t0 = int(end.min()) if len(end) else 0
    if len(hosts) == 1:  # no instance spans hosts: no anchors to find
        shared = HostClock(hosts[0], 0.0, 0.0, 0.0, 0, "shared clock")
        return ClockModel(t0_ns=t0, hosts={hosts[0]: shared}, method="single host (shared clock)", anchors=0)
    values, fitted = anchor_ends(events, t0)
    model = ClockModel(t0_ns=t0, hosts={}, method="", anchors=int(values.shape[1]))
    components = _components(values)
    for component in components:
        names = [fitted[i] for i in component]
        hinted = all(h in hints for h in names)
        target = float(np.mean([hints[h] for h in names])) if hinted else 0.0
        prior = np.array([hints.get(h, 0.0) for h in names], dtype=np.float64)
        model.hosts.update(_fit_component(names, values[component], prior, target))
        model.warnings += _far_apart([model.hosts[h] for h in names])
        if hinted:
            far = [h for h in names if abs(model.hosts[h].offset_ns - hints[h]) > HINT_TOLERANCE_NS]
            model.off_hints += far
            model.warnings += _hint_disagreements(model, far, hints)
    if len(components) > 1:
        model.warnings.append(
            "hosts fall into groups that share no collective; each group is aligned on its own and "
            "cross-group lateness has only NTP quality"
        )
    for host in hosts:
        if host not in model.hosts:
            if host in hints:
                model.hosts[host] = HostClock(host, float(hints[host]), 0.0, HINT_UNCERTAINTY_NS, 0, "coordinator hint")
            else:
                model.hosts[host] = HostClock(host, 0.0, 0.0, NTP_UNCERTAINTY_NS, 0, "utc (NTP quality)")
            model.warnings.append(f"host {host}: no collective shared with other hosts; clock is {model.hosts[host].method}")
    methods = {c.method for c in model.hosts.values()}
    fitted = any(m.startswith("offset") for m in methods)
    model.method = ("collective-anchored " if fitted else "") + "/".join(sorted(methods))
    return model


def _far_apart(clocks: list[HostClock]) -> list[str]:
    """A warning where linked hosts' fitted clocks lie FAR_APART_NS or more apart."""
    low, high = min(clocks, key=lambda c: c.offset_ns), max(clocks, key=lambda c: c.offset_ns)
    apart = high.offset_ns - low.offset_ns
    if apart < FAR_APART_NS:
        return []
    return [f"hosts {low.host} and {high.host}: clocks fitted {apart / 1e9:,.0f} s apart, where NTP keeps hosts within "
            "milliseconds: unsynchronised clocks, or traces of two runs matched as one job's (analyse one run at a time)"]


def _hint_disagreements(model: ClockModel, far: list[str], hints: Mapping[str, int]) -> list[str]:
    """A fit far from the coordinator's ping-based offsets (hosts ``far``) means mismatched
    collectives (e.g. ordinals shifted by a capture window), not a bad clock."""
    return [
        f"host {h}: collective-fitted clock offset differs from the coordinator's by "
        f"{abs(model.hosts[h].offset_ns - hints[h]) / 1e6:.1f} ms; cross-host collectives may be matched "
        "one call off (capture windows starting mid-sequence)"
        for h in far
    ]


def _components(values: np.ndarray) -> list[np.ndarray]:
    """Groups of hosts linked by shared anchors (label propagation over the hosts x anchors mask)."""
    present = ~np.isnan(values)
    hosts = present.shape[0]
    if present.shape[1] == 0:
        return []
    label = np.arange(hosts, dtype=np.float64)
    for _ in range(hosts):
        per_anchor = np.where(present, label[:, None], np.inf).min(axis=0)
        new = np.minimum(label, np.where(present, per_anchor[None, :], np.inf).min(axis=1))
        if np.array_equal(new, label):
            break
        label = new
    return [np.flatnonzero(label == value) for value in np.unique(label)]


def _fit_component(
    names: list[str], y: np.ndarray, prior: np.ndarray, target: float
) -> dict[str, HostClock]:
    """Alternating robust fit of consensus ends E and per-host lines y = (1+a) E + b."""
    counts = (~np.isnan(y)).sum(axis=1)
    enough = counts >= MIN_DRIFT_ANCHORS
    drifting = enough
    rate = np.ones(len(names))
    offset = prior.copy()
    for _ in range(ROUNDS):
        consensus = nanmedian((y - offset[:, None]) / rate[:, None], axis=0)
        if enough.any():
            slope, intercept, slope_error, centre = _huber_lines(consensus, y)
            known = np.maximum(PLAUSIBLE_DRIFT_PPM * 1e-6, np.abs(slope - 1.0) / DRIFT_SIGNIFICANCE)
            drifting = enough & (slope_error <= known)
            # Without its slope, the line through its anchors' centre: the Huber estimate of
            # the offset, more efficient than the median where anchors abound.
            level = intercept + (slope - 1.0) * centre
        else:  # too few anchors on every host for a drift: lines would be fitted, then discarded
            slope = intercept = level = np.zeros(len(names))
        rate = np.where(drifting, slope, 1.0)
        offset = np.where(drifting, intercept, np.where(enough, level, nanmedian(y - consensus[None, :], axis=1)))
        # Re-gauge: E' = k E + m leaves every observation unchanged.
        k = rate.mean()
        rate /= k
        offset -= rate * (offset.mean() - target)
    consensus = nanmedian((y - offset[:, None]) / rate[:, None], axis=0)
    residual = y - (rate[:, None] * consensus[None, :] + offset[:, None])
    windows = _windows(consensus, residual, drifting)
    if any(w[0] for w in windows):
        bend = np.vstack([np.interp(consensus, *w) if w[0] else np.zeros_like(consensus) for w in windows])
        consensus = nanmedian((y - bend - offset[:, None]) / rate[:, None], axis=0)
        bend = np.vstack([np.interp(consensus, *w) if w[0] else np.zeros_like(consensus) for w in windows])
        residual = y - bend - (rate[:, None] * consensus[None, :] + offset[:, None])
    else:
        bend = 0.0
    # The spread is taken against the other hosts' consensus: against one the host is part
    # of, its residuals shrink (to 0 for the median host of three).
    residual = y - bend - (rate[:, None] * median_of_others((y - bend - offset[:, None]) / rate[:, None]) + offset[:, None])
    seen = (~np.isnan(residual)).sum(axis=1)
    mad = nanmedian(np.abs(residual - nanmedian(residual, axis=1, keepdims=True)), axis=1)
    sigmas = np.where(seen > 1, MAD_TO_SIGMA * mad * _own_share(len(names) - 1), 0.0)
    sigmas = np.where(seen < MIN_SPREAD_ANCHORS, np.maximum(sigmas, SPARSE_UNCERTAINTY_NS), sigmas)
    clocks = {}
    for h, name in enumerate(names):
        clocks[name] = HostClock(
            name,
            float(offset[h]),
            float((rate[h] - 1.0) * 1e6),
            float(sigmas[h]),
            int(counts[h]),
            "offset+drift" + (" (windowed)" if windows[h][0] else "") if drifting[h] else "offset",
            *windows[h],
        )
    return clocks


def _own_share(others: int) -> float:
    """A host's part of the spread of its residuals against the other hosts' median. With
    one other host, that spread is the pair's (both hosts' noise) for each: split evenly,
    or a pair combined per host counted it twice. With more, the median's own noise is a
    smaller part, left in (measured against simulated jobs: within their scatter)."""
    return float(np.sqrt(0.5)) if others == 1 else 1.0


def _windows(
    consensus: np.ndarray, residual: np.ndarray, drifting: np.ndarray
) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
    """Per host: windowed medians of its residuals, if they wander beyond their noise (a
    clock whose rate changed mid-capture, e.g. an NTP slew); else nothing.

    A host's anchors are ordered by consensus time and split into ``count`` windows as
    np.array_split does (the first ``n % count`` windows one longer); all hosts at once.
    """
    none: tuple[tuple[float, ...], tuple[float, ...]] = ((), ())
    seen = ~np.isnan(residual)
    n = seen.sum(axis=1)
    count = np.minimum(MAX_WINDOWS, n // WINDOW_ANCHORS)
    hosts = np.flatnonzero(drifting & (count >= 3))
    windows = [none] * len(residual)
    if not len(hosts):
        return windows
    by_time = np.argsort(consensus, kind="stable")
    ordered = seen[hosts][:, by_time]
    host, column = np.nonzero(ordered)  # per host, its anchors in time order
    anchor = by_time[column]
    position = np.cumsum(ordered, axis=1)[host, column] - 1
    size, extra = n[hosts][host] // count[hosts][host], n[hosts][host] % count[hosts][host]
    long_part = extra * (size + 1)
    window = np.where(position < long_part, position // (size + 1), extra + (position - long_part) // np.maximum(size, 1))
    x, r = consensus[anchor], residual[hosts[host], anchor]
    per_window = Groups(host, window)
    centres, medians = per_window.median(x), per_window.median(r)
    per_host = Groups(host, ordered=True)  # nonzero's rows: host by host
    centre = per_host.median(r)
    sigma = MAD_TO_SIGMA * per_host.median(np.abs(r - per_host.broadcast(centre)))
    # standard error of a median ~ 1.25 sigma / sqrt(n); demand a clear excess
    noise = 1.2533 * sigma / np.sqrt(n[hosts] // count[hosts])
    of_host = per_window.keys[0]
    host_windows = Groups(of_host, ordered=True)
    typical = host_windows.median(medians)
    wander = host_windows.max(np.abs(medians - typical[of_host]))
    for i, h in enumerate(hosts.tolist()):
        if wander[i] > WINDOW_SIGNIFICANCE * noise[i]:
            mine = of_host == i
            windows[h] = (tuple(centres[mine].tolist()), tuple(medians[mine].tolist()))
    return windows


def _huber_lines(
    x: np.ndarray, y: np.ndarray, iterations: int = 10
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``y`` (NaN = not observed): slope and intercept on ``x`` by IRLS with
    Huber weights and a MAD scale, all hosts at once; also the slope's standard error
    (residual scale over the weighted spread of the row's anchors in ``x``) and their
    weighted centre. Stops early once no host's line moved, anywhere over its anchors,
    by more than `CONVERGED` of its residual scale: what is left to move is far below
    the uncertainty the fit reports."""
    seen = ~np.isnan(y)
    xs = np.where(seen, x[None, :], np.nan)
    xm = np.nanmean(xs, axis=1, keepdims=True)
    xc = np.where(seen, xs - xm, 0.0)
    reach = np.abs(xc).max(axis=1)  # how far a change of slope moves the line, at most
    yy = np.where(seen, y, 0.0)
    weights = seen.astype(np.float64)
    slope = np.ones(len(y))
    intercept = np.zeros(len(y))
    tolerance = None
    every = seen.all()  # the common case: masking below would change nothing
    for _ in range(iterations):
        w_sum = np.maximum(weights.sum(axis=1), 1e-300)
        x_bar = (weights * xc).sum(axis=1) / w_sum
        y_bar = (weights * yy).sum(axis=1) / w_sum
        dx = xc - x_bar[:, None]
        spread = (weights * dx**2).sum(axis=1)
        cov = (weights * dx * (yy - y_bar[:, None])).sum(axis=1)
        last_slope, last_intercept = slope, intercept
        slope = np.divide(cov, spread, out=np.ones_like(cov), where=spread > 0)
        intercept = y_bar - slope * x_bar
        if tolerance is not None and (
                np.abs(intercept - last_intercept) + np.abs(slope - last_slope) * reach <= tolerance).all():
            break
        residual = yy - (slope[:, None] * xc + intercept[:, None])
        if not every:
            residual = np.where(seen, residual, np.nan)
        centre = nanmedian(residual, axis=1, keepdims=True)
        scale = MAD_TO_SIGMA * nanmedian(np.abs(residual - centre), axis=1, keepdims=True)
        tolerance = np.maximum(CONVERGED * scale[:, 0], MIN_TOLERANCE_NS)
        u = np.abs(residual if every else np.where(seen, residual, 0.0)) / np.maximum(HUBER_K * scale, 1e-9)
        weights = 1.0 / np.maximum(u, 1.0)  # Huber: 1 inside k * scale, k * scale / |r| beyond
        if not every:
            weights = np.where(seen, weights, 0.0)
    error = np.divide(scale[:, 0], np.sqrt(spread), out=np.full_like(spread, np.inf), where=spread > 0)
    return slope, intercept - slope * xm[:, 0], error, x_bar + xm[:, 0]


@dataclass(frozen=True)
class HappensBefore:
    checked: int
    violating: np.ndarray  # the violating instances' ids

    @property
    def violations(self) -> int:
        return int(self.violating.size)

    @property
    def rate(self) -> float:
        return self.violations / self.checked if self.checked else 0.0


def happens_before(aligned: Table) -> HappensBefore:
    """N-to-N instances where some rank ended before the last one started (aligned times)."""
    instance = np.asarray(aligned["instance"], np.int64)
    rows = (instance != UNMATCHED) & isin(aligned["op"], N_TO_N_OPS)
    per = Groups(instance[rows])
    last_start = per.max(np.asarray(aligned["start"])[rows])
    first_end = per.min(np.asarray(aligned["end"])[rows])
    violating = per.keys[0][last_start > first_end]
    return HappensBefore(int(per.count), violating)
