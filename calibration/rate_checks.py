"""Whether a host rate curve (rate against thread count) measured what the machine can do, or a busy minute.

A lent host shares its memory system with whatever else runs there: three host calibrations of one H100 host
model (benchmarks/RESULTS.md, nineteenth session) differ by up to 59% in DRAM stream rate and 44% in
DeepSpeedCPUAdam rate, and one of them predicted its own call's runs 2-21% slow. Two signs tell such a curve from
the machine's:

- **a dip**: a rate bound by DRAM or by cores is concave in the thread count (each added thread adds no more than
  the one before), so a point well below the line through its neighbours was measured while something else ran
  (that calibration's 4-thread stream rate: 23.4 GB/s between 22.2 at 2 threads and 43.2 at 8);
- **rounds that disagree**: the same point, timed in rounds interleaved with the others', has half or more of its
  rounds more than 15% from its median (a minority of busy rounds is outvoted by the median and by re-timing).

The host benchmarks time every point in interleaved rounds and take each point's median over rounds, re-time
(bounded) the points that fail either check, and warn with one line where a failure persists, so ``slidedp
calibrate`` says when a host rate is not credible instead of passing it silently to every prediction of a
CPU-bound step. The peers' optimizer benchmarks re-time a dip once and keep the faster value (interference only
slows a pass down).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from slidedp.errors import first_few

# A point more than this fraction below the line through its neighbours is a dip.
DIP_TOLERANCE = 0.10
# A round more than this fraction from its point's median is off; a point with half or more of its rounds off
# is not settled (a minority of busy rounds does not move the median, and re-timing can outvote them).
SPREAD_LIMIT = 0.15


def dips(curve: dict[int, float], tolerance: float = DIP_TOLERANCE) -> list[int]:
    """Thread counts whose rate lies more than ``tolerance`` below the chord between their measured neighbours
    (the first and last points have only one, and are not judged: scaling from one thread to two can be
    superlinear on real hosts, 1.49 -> 3.41 G/s for the H200's cast)."""
    points = sorted(curve.items())
    out = []
    for (t0, r0), (t, r), (t1, r1) in zip(points, points[1:], points[2:], strict=False):
        chord = r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        if r < (1 - tolerance) * chord:
            out.append(t)
    return out


def spread(values: list[float]) -> float:
    """max / min - 1 of one point's values over rounds (0 for fewer than two; inf where one is not positive):
    what the report shows of how settled the host was."""
    if len(values) < 2:
        return 0.0
    return max(values) / min(values) - 1 if min(values) > 0 else float("inf")


def rounds_off(values: list[float], limit: float = SPREAD_LIMIT) -> int:
    """Rounds more than ``limit`` from the median of ``values`` (every one, where the median is not positive)."""
    middle = statistics.median(values)
    if middle <= 0:
        return len(values)
    return sum(abs(v / middle - 1) > limit for v in values)


def combine(rounds: dict[int, list[float]]) -> dict[int, float]:
    """One rate per thread count: the median of its round values (one busy round in three does not move it)."""
    return {t: statistics.median(v) for t, v in sorted(rounds.items()) if v}


@dataclass(frozen=True)
class Verdict:
    """What is not credible in one curve: points whose rounds disagree (threads -> rounds off, rounds), and
    points of the combined curve (``combined``) that dip below their neighbours."""

    combined: dict[int, float]
    scattered: dict[int, tuple[int, int]]
    dipped: list[int]

    @property
    def unsettled(self) -> list[int]:
        return sorted(set(self.scattered) | set(self.dipped))


def judge(rounds: dict[int, list[float]], limit: float = SPREAD_LIMIT,
          tolerance: float = DIP_TOLERANCE) -> Verdict:
    """The one rule both the re-timing (which points to time again) and the warning (what to name) apply."""
    scattered = {}
    for t, values in rounds.items():
        if len(values) >= 2 and 2 * (off := rounds_off(values, limit)) >= len(values):
            scattered[t] = (off, len(values))
    combined = combine(rounds)
    return Verdict(combined, scattered, dips(combined, tolerance))


def unsettled(rounds: dict[int, list[float]]) -> list[int]:
    """Thread counts to time again: their rounds disagree, or their combined rate is a dip."""
    return judge(rounds).unsettled


def _threads(t: int) -> str:
    return f"{t} thread" + ("" if t == 1 else "s")


def problems(rounds: dict[int, list[float]], unit: str) -> str | None:
    """What is not credible in one curve (rounds that disagree, dips), at most three points of each, or None."""
    verdict = judge(rounds)
    parts = []
    if verdict.scattered:
        parts.append(first_few([f"{off} of {n} rounds off the median at {_threads(t)}"
                                for t, (off, n) in sorted(verdict.scattered.items())]))
    if verdict.dipped:
        parts.append("a dip at " + first_few([f"{_threads(t)} ({verdict.combined[t]:.3g} {unit})"
                                               for t in verdict.dipped]))
    return "; ".join(parts) or None


def warning(curves: dict[str, tuple[dict[int, list[float]], str]]) -> str | None:
    """One line over several curves (name -> (threads -> round values, unit)) naming what is not credible in
    each, or None when every curve passes."""
    found = {name: p for name, (rounds, unit) in curves.items() if (p := problems(rounds, unit))}
    if not found:
        return None
    listed = "; ".join(f"{name}: {p}" for name, p in found.items())
    return (f"host rates not settled ({listed}): the host was busy while they were timed, and predictions of "
            f"CPU-bound steps rest on them; calibrate again on an idle host")
