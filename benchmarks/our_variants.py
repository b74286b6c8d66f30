"""SlideDP's variants in the peer comparisons, each the tuner's search space it runs under.

One home for what "slidedp", "slidedp-host" and "slidedp-compact" mean, used by the measured comparison
(benchmarks.peer_systems) and the predicted one (benchmarks.paper_peer_predictions) alike. The names are
slidedp.report.peers.OURS, which only reads rows.
"""

from __future__ import annotations

from slidedp.tune import TuneSpace

# The 8-bit-moment mode #16's targets name: bf16 master (stochastic rounding), int8 blockwise moments.
COMPACT_STATE = "bf16+int8"

VARIANT_SPACES: dict[str, TuneSpace] = {
    # Tuned freely: the tuner may hold leading units' optimizer state in spare GPU memory.
    "slidedp": TuneSpace(gpu_state=True),
    # Every optimizer state on the host, exact fp32: like for like against peers that offload the whole optimizer.
    "slidedp-host": TuneSpace(gpu_state=False),
    # Every optimizer state on the host in the compact mode (`slidedp tune --no-gpu-state --state bf16+int8`).
    "slidedp-compact": TuneSpace(gpu_state=False, states=(COMPACT_STATE,)),
}


def variant_space(name: str) -> TuneSpace:
    """The search space of one of SlideDP's variants (KeyError for a name that is not one)."""
    return VARIANT_SPACES[name]
