"""Discrete-event simulator of one streamed training step (simpy, fluid bandwidth sharing)."""

from slidedp.sim.simulator import SimResult, simulate

__all__ = ["SimResult", "simulate"]
