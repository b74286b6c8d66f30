"""Which host-state precision ``--state auto`` picks, and the one-line reason the commands print.

The rule (one home for ``simulate``, ``tune``, ``sweep`` and ``train --policy auto``): among the allowed modes
whose step fits the GPU and host memory budgets, let T be the fastest predicted step time; pick the first mode
in STATE_CHOICES order (exact fp32 first, then fp32+bf16, fp32+int8, bf16+bf16, bf16+int8) whose predicted
step time is within COMPACT_MARGIN of T. So exact fp32 state is kept unless it does not fit, or some compact mode
is predicted more than 10% faster; and a less precise compact mode is only taken over a more precise one on the
same terms. The margin is there because compact state trades exactness for speed: a few percent of predicted
step time (within the simulator's own error, see benchmarks/RESULTS.md) does not pay for that.

A mode whose CPU update rate the hardware profile has not measured (its rate is derived from DRAM bytes) is taken
for fit only, never for speed: on the 2-core development machine every compact mode's one-pass update ran at
0.33-0.41x the fp32 pass (arithmetic-bound, benchmarks/RESULTS.md "Compact host state (CPU, 2026-12-04)"), where
the bytes-derived rate says 1.7-2.8x, so a speed claim needs the host's own measurement (``slidedp calibrate``).
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from dataclasses import dataclass

from slidedp.errors import SlideDPError
from slidedp.hardware import HostSpec
from slidedp.state_precision import EXACT, STATE_CHOICES, StatePrecision

AUTO = "auto"
COMPACT_MARGIN = 0.10


def state_options(text: str) -> tuple[str, ...]:
    """The mode names a ``--state`` value allows, in preference order: ``auto`` -> every STATE_CHOICES mode,
    else the one mode named (checked; ``fp32+fp32`` is spelled ``fp32``)."""
    if str(text).strip().lower() == AUTO:
        return tuple(s.name for s in STATE_CHOICES)
    return (StatePrecision.parse(text).name,)


def state_arg(text: str) -> str:
    """argparse type of ``--state``: ``auto`` or a StatePrecision name, normalised."""
    try:
        options = state_options(text)
    except SlideDPError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return AUTO if len(options) > 1 else options[0]


@dataclass(frozen=True)
class StateChoice:
    """The chosen mode, why, and each mode's predicted step time (None: it does not fit)."""

    state: str
    reason: str
    step_s: dict[str, float | None]


def _preference(name: str) -> int:
    names = [s.name for s in STATE_CHOICES]
    return names.index(name) if name in names else len(names)


def measured_states(host: HostSpec) -> frozenset[str]:
    """The modes whose update rate ``host`` has measured: fp32 (``adam_gparams_per_s``) and every calibrated one."""
    return frozenset({EXACT.name, *host.state_update_gparams_per_s})


def choose_state(step_s: dict[str, float | None], measured: Collection[str] | None = None,
                 margin: float = COMPACT_MARGIN) -> StateChoice:
    """Apply the module's rule to the predicted step time of each allowed mode (None where it does not fit);
    ``measured`` names the modes whose rate was measured (None: all), the others being eligible for fit only."""
    order = sorted(step_s, key=_preference)
    fitting = [m for m in order if step_s[m] is not None]
    if not fitting:
        raise SlideDPError(f"no host-state precision fits ({', '.join(order)})")
    unmeasured = [m for m in fitting[1:] if measured is not None and m not in measured]
    eligible = [m for m in fitting if m not in unmeasured]
    fastest = min(step_s[m] for m in eligible)
    chosen = next(m for m in eligible if step_s[m] <= fastest * (1 + margin))
    misfits = [m for m in order if step_s[m] is None]
    first = fitting[0]
    pct = f"{margin:.0%}"
    if len(order) == 1:
        reason = "the only mode allowed"
    elif chosen == first:
        faster = min((m for m in eligible if m != chosen), key=step_s.get, default=None)
        vs = (f"; fastest other: {faster} {step_s[faster]:.3f} s vs {step_s[chosen]:.3f} s"
              if faster is not None else "")
        head = ("exact fp32 state fits" if chosen == EXACT.name
                else f"{', '.join(misfits)} do{'es' if len(misfits) == 1 else ''} not fit; {chosen} is the most "
                     f"precise mode that does")
        reason = f"{head} and no other mode is more than {pct} faster{vs}"
    else:
        gain = step_s[first] / step_s[chosen] - 1
        reason = (f"{chosen} is {gain:.0%} faster than {first} ({step_s[chosen]:.3f} vs {step_s[first]:.3f} s), "
                  f"more than the {pct} margin, and the most precise mode within it of the fastest")
        if misfits:
            reason += f"; {', '.join(misfits)} do{'es' if len(misfits) == 1 else ''} not fit"
    if unmeasured:
        reason += (f"; {', '.join(unmeasured)} not chosen for speed (update rate derived from DRAM bytes, not "
                   f"measured on this host)")
    return StateChoice(chosen, reason, dict(step_s))
