"""The shared resources of a host and what each kind of traffic costs them.

Every flow in the simulator, every floor in the analytical model and every byte count in a measured trace
is expressed against these resources: a GPU's PCIe directions and duplex cap, a switch uplink, the host's
DRAM, a GPU's collective link. Their names are what bottleneck reports show.

The CPU passes of the optimizer are DRAM traffic too; their bytes per parameter are defined here once and
used by the workload, the runtime's trace annotations and the calibration fits alike.
"""

from __future__ import annotations

from slidedp.hardware import GB, HardwareProfile
from slidedp.state_precision import EXACT, GRAD_SLOT_BYTES, StatePrecision

# DRAM bytes per parameter of the CPU passes of exact fp32 state (fp32 master, m and v are 4 bytes each).
ADAM_HOST_BYTES_BASE = 24  # read p, m, v + write p, m, v; the gradient read is added per dtype
CAST_HOST_BYTES = 6  # read fp32 master, write bf16 copy for the next step's H2D
BF16_WRITE_BYTES = GRAD_SLOT_BYTES  # the one-pass kernel also writes the bf16 weights the next H2D reads


def has_cast_pass(state: StatePrecision, fused_cast: bool) -> bool:
    """A separate fp32 -> bf16 cast pass follows the update only with an fp32 master and an optimizer kernel that
    does not write the bf16 copy itself: a bf16 master is the streamed weight, so nothing is cast."""
    return not fused_cast and not state.master_streams


def update_host_bytes_per_param(state: StatePrecision, grad_bytes: int, fused_cast: bool) -> float:
    """DRAM bytes one parameter's optimizer update moves in the precision ``state``
    (StatePrecision.update_dram_bytes_per_param), less the bf16 weights write where a separate cast pass does it.
    Exact fp32 state: 28 B with bf16 gradients and the one-pass kernel, 26 without it (plus the 6 B cast)."""
    full = state.update_dram_bytes_per_param(grad_bytes)
    return full - GRAD_SLOT_BYTES if has_cast_pass(state, fused_cast) else full


def cast_host_bytes_per_param(state: StatePrecision, fused_cast: bool) -> float:
    """DRAM bytes per parameter of the separate cast pass (0 where there is none, see has_cast_pass)."""
    return CAST_HOST_BYTES if has_cast_pass(state, fused_cast) else 0.0


def adam_host_bytes_per_param(grad_bytes: int, fused_cast: bool) -> int:
    """DRAM bytes one parameter's exact fp32 AdamW moves: read p, m, v and the gradient, write p, m, v, and with
    the one-pass kernel (``fused_cast``) the bf16 weights as well (28 B with bf16 gradients). The fp32 case of
    update_host_bytes_per_param, kept for the fp32 calibration fits."""
    return int(update_host_bytes_per_param(EXACT, grad_bytes, fused_cast))


# The one-pass kernel with bf16 gradients: read p, m, v + bf16 grad, write p, m, v + bf16 weights.
FUSED_ADAM_HOST_BYTES = adam_host_bytes_per_param(2, fused_cast=True)


NIC = "nic"  # one host's NICs to the other hosts, pooled (HardwareProfile.network)
# The host's cores as a shared resource of capacity 1 (all of them for one second per second). A CPU pass that
# runs at ``solo_rate`` bytes/s on all of them uses 1 / solo_rate of it per byte, so two such passes at once
# (a peer's fetch cast and its update, each a team of every core) time-share the cores: each at its share of its
# solo rate. SlideDP's own passes do not use it (one update pass per rank at a time, its copies on DMA engines).
CORES = "cores"


def cpu_pass_usage(solo_rate: float) -> dict[str, float]:
    """Resources one byte of a CPU pass on every core crosses: host DRAM and the cores."""
    return {"hostmem": 1.0, CORES: 1.0 / solo_rate}


def resource_capacities(hw: HardwareProfile, hosts: int = 1) -> dict[str, float]:
    """Bytes/s of every shared resource a flow can cross: its name is what bottleneck reports show. Over
    several hosts, one host's resources plus its NICs (``nic``)."""
    caps: dict[str, float] = {"hostmem": hw.host.mem_bw_gbps * GB, CORES: 1.0}
    if hosts > 1 and hw.network is not None:
        caps[NIC] = hw.network.host_Bps
    for g in range(hw.num_gpus):
        caps[f"h2d[{g}]"] = hw.gpu.h2d_gbps * GB
        caps[f"d2h[{g}]"] = hw.gpu.d2h_gbps * GB
        caps[f"pcie[{g}]"] = hw.gpu.duplex_gbps * GB
        if hw.link.kind == "nvlink":
            caps[f"link[{g}]"] = hw.link.bw_gbps * GB
    for s, sw in enumerate(hw.switches):
        caps[f"uplink_h2d[{s}]"] = sw.uplink_gbps * GB
        caps[f"uplink_d2h[{s}]"] = sw.uplink_gbps * GB
    return caps


def dma_usage(hw: HardwareProfile, gpu: int, direction: str) -> dict[str, float]:
    """Resources one byte of a host<->GPU copy crosses."""
    usage = {f"{direction}[{gpu}]": 1.0, f"pcie[{gpu}]": 1.0, "hostmem": 1.0}
    sw = hw.switch_of(gpu)
    if sw is not None:
        usage[f"uplink_{direction}[{sw}]"] = 1.0
    return usage


def nic_usage(from_host_memory: bool) -> dict[str, float]:
    """Resources one byte of a cross-host collective crosses: the host's NICs, and host DRAM when it is sent
    from (or received into) host memory (the per-rank route's CPU sums, the sharded layout's weight
    all-gather); a gradient leaving the GPU goes NIC to GPU directly (GPUDirect RDMA)."""
    return {NIC: 1.0, "hostmem": 1.0} if from_host_memory else {NIC: 1.0}


def collective_usage(hw: HardwareProfile, gpu: int) -> dict[str, float]:
    """Resources one byte a rank sends in a ring collective crosses.

    Over NVLink only the GPU's link. Without peer access NCCL stages through host memory: every byte
    goes down one PCIe link and up another and is written and read in DRAM.
    """
    if hw.link.kind == "nvlink":
        return {f"link[{gpu}]": 1.0}
    usage = {f"h2d[{gpu}]": 1.0, f"d2h[{gpu}]": 1.0, f"pcie[{gpu}]": 2.0, "hostmem": 2.0}
    sw = hw.switch_of(gpu)
    if sw is not None:
        usage[f"uplink_h2d[{sw}]"] = 1.0
        usage[f"uplink_d2h[{sw}]"] = 1.0
    return usage


# How the host serves CPU passes and DMA together (measured on the H200, benchmarks/RESULTS.md "Call 2"): a CPU
# pass is served first from host DRAM, but runs slower by the profile's interference factor while copies run in
# either direction (``HostSpec.dma_interference``); the copies get the DRAM the passes leave.
CPU_PASS = "cpu"


# The resources only host<->GPU copies cross (resource_capacities names them): their capacities are what a copy
# loses beside CPU passes (HostSpec.copy_slowdown, sim.fluid).
COPY_RESOURCE_PREFIXES = ("h2d[", "d2h[", "pcie[", "uplink_h2d[", "uplink_d2h[")


def flow_class(usage: dict[str, float]) -> str:
    """What a flow is, from the resources it crosses: a CPU pass (host DRAM only), a copy in one or both PCIe
    directions ("h2d", "d2h", "h2d+d2h": a collective bounced through host memory crosses both), or "other"."""
    dirs = [d for d in ("h2d", "d2h") if any(r.startswith(f"{d}[") for r in usage)]
    if dirs:
        return "+".join(dirs)
    return CPU_PASS if set(usage) in ({"hostmem"}, {"hostmem", CORES}) else "other"


def seconds_per_byte(usage: dict[str, float], caps: dict[str, float]) -> float:
    """Seconds per byte of a lone flow with this usage: the slowest resource it crosses."""
    return max(k / caps[r] for r, k in usage.items())
