"""SlideDP's variants in the peer comparisons, each the tuner's search space it runs under.

One home for what "slidedp", "slidedp-host", "slidedp-compact" and "slidedp-int8" mean, used by the measured comparison
(benchmarks.peer_systems) and the predicted one (benchmarks.paper_peer_predictions) alike. The names are
slidedp.report.peers.OURS, which only reads rows.
"""

from __future__ import annotations

from slidedp.tune import TuneSpace

# The compact modes #16's targets are measured in: bf16 master (stochastic rounding) with int8 blockwise moments
# (~6 B/param, "both" in the issue's words), and fp32 master with int8 moments (~8 B/param: the issue's "8-bit
# moments" alone, whose update does no stochastic rounding of the master and ran 1.2x bf16+int8's rate on c36's
# host).
COMPACT_STATE = "bf16+int8"
INT8_MOMENTS_STATE = "fp32+int8"

VARIANT_SPACES: dict[str, TuneSpace] = {
    # Tuned freely: the tuner may hold leading units' optimizer state in spare GPU memory.
    "slidedp": TuneSpace(gpu_state=True),
    # Every optimizer state on the host, exact fp32: like for like against peers that offload the whole optimizer.
    "slidedp-host": TuneSpace(gpu_state=False),
    # Every optimizer state on the host in the compact mode (`slidedp tune --no-gpu-state --state bf16+int8`).
    "slidedp-compact": TuneSpace(gpu_state=False, states=(COMPACT_STATE,)),
    # The same with fp32 master weights and int8 moments (`--state fp32+int8`).
    "slidedp-int8": TuneSpace(gpu_state=False, states=(INT8_MOMENTS_STATE,)),
}


def variant_space(name: str) -> TuneSpace:
    """The search space of one of SlideDP's variants (KeyError for a name that is not one)."""
    return VARIANT_SPACES[name]
