"""The systems SlideDP is compared with, as simulated systems: DeepSpeed ZeRO-2/3 with CPU offload, FSDP2 with
CPUOffloadPolicy, GPU-resident FSDP2 and DDP, and the layer-streaming SlideFormer and MegaTrain (one GPU each).

``SYSTEMS`` (slidedp.peers.systems) is the registry; :func:`simulate_system` runs any registered name, SlideDP
included, through the same simulator, so sweeps and reports can put them side by side.
"""

from __future__ import annotations

from slidedp.peers.memory import PeerMemory, estimate_peer_memory
from slidedp.peers.plan import build_peer_plan, phase_seconds
from slidedp.peers.step import PeerStep, peer_policy, peer_workload, system_workload
from slidedp.peers.systems import SLIDEDP, SYSTEM_NAMES, SYSTEMS, PeerSystem, check_system, peer_system

__all__ = ["SLIDEDP", "SYSTEMS", "SYSTEM_NAMES", "PeerMemory", "PeerStep", "PeerSystem", "build_peer_plan",
           "check_system", "estimate_peer_memory", "peer_policy", "peer_step", "peer_system", "peer_workload",
           "phase_seconds", "simulate_peer", "system_workload"]


def peer_step(name: str, model, hw, seq: int, batch: int) -> PeerStep:
    """Peer ``name`` (not SlideDP) running ``model`` on every GPU of ``hw`` at global ``batch``; refuses where
    the profile lacks the peer's CPU optimizer rate."""
    system = peer_system(name)
    if system is None:
        raise ValueError("slidedp runs its own policy-driven plan, not a peer step")
    step = PeerStep(system, system_workload(system, model, hw, seq, batch))
    step.check_rates()
    return step


def simulate_peer(step: PeerStep):
    """One simulated step of a peer (a SimResult, like SlideDP's)."""
    from slidedp.sim import simulate

    return simulate(step.w, plan=build_peer_plan(step))
