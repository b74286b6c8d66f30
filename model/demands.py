"""Per-resource work of one step, in seconds at full capacity: the closed-form floor of the step time.

Each entry is a time the step cannot beat: a resource cannot serve its bytes faster than its capacity,
and a stream cannot run its serial operations faster than each one alone. Names match the simulator's
resources so bottlenecks read the same in both.
"""

from __future__ import annotations

from dataclasses import dataclass

from slidedp.resources import collective_usage, dma_usage, resource_capacities, seconds_per_byte
from slidedp.workload import StepWorkload


@dataclass(frozen=True)
class _Sums:
    """Per-rank sums over units that every closed form below is built from."""

    total_params: float  # parameters updated on the host (GPU-state units excluded)
    fetched_params: float  # forward fetch plus backward re-fetch (Workload.refetched_in_backward)
    fetch_ops: int
    host_units: int  # units whose gradients leave the GPU
    allreduce_bytes: float  # per rank, GPU-state units' gradients
    ckpt_bytes: float
    ckpt_ops: int
    compute_s: float
    fwd_flops: float
    bwd_flops: float


def _sums(w: StepWorkload) -> _Sums:
    total = fetched = ckpt = compute = fwd_flops = bwd_flops = allreduce = 0.0
    fetch_ops = ckpt_ops = host_units = 0
    for u, unit in enumerate(w.units):
        compute += unit.fwd_s + unit.bwd_s + w.gpu_adam_s(u)
        if w.gpu_state(u):
            allreduce += w.allreduce_bytes(u)
        else:
            fetches = 2 if w.refetched_in_backward(u) else 1
            total += unit.params
            fetched += fetches * unit.params
            fetch_ops += fetches
            host_units += 1
        fwd_flops += unit.fwd_flops
        bwd_flops += unit.bwd_flops
        if w.offloads_checkpoint(u):
            ckpt += unit.checkpoint_bytes
            ckpt_ops += 1
    return _Sums(total, fetched, fetch_ops, host_units, allreduce, ckpt, ckpt_ops, compute, fwd_flops, bwd_flops)


def op_totals(w: StepWorkload) -> dict[str, dict[str, float]]:
    """Closed-form totals per trace op over all ranks: ``bytes``, ``flops`` and ``host_bytes``.

    The simulator's trace must add up to exactly these numbers (conservation).
    """
    s, n = _sums(w), w.ranks
    k_host = collective_usage(w.hw, 0).get("hostmem", 0.0)
    reduce_b, adam_b, cast_b = w.cpu_update_host_bytes_per_param()
    routes = w.routes

    def row(nbytes: float, host: float | None = None, flops: float = 0.0) -> dict[str, float]:
        return {"bytes": nbytes, "host_bytes": nbytes if host is None else host, "flops": flops}

    totals = {"fwd": row(0.0, 0.0, n * s.fwd_flops), "bwd": row(0.0, 0.0, n * s.bwd_flops)}
    if not s.host_units:  # every unit's state is on the GPU: nothing crosses PCIe or touches the CPU
        reduce_b = cast_b = 0.0
    else:
        totals["h2d_param"] = row(n * routes.h2d_param_factor * s.fetched_params)
        totals["d2h_grad"] = row(n * routes.d2h_grad_factor * s.total_params)
        totals["adam"] = row(adam_b * s.total_params)
    if cast_b:  # no separate cast pass when the optimizer kernel writes the bf16 copy (HostSpec.fused_cast)
        totals["cast"] = row(cast_b * s.total_params)
    if routes.allgather_factor and s.host_units:
        ag = n * routes.allgather_factor * s.fetched_params
        totals["allgather"] = row(ag, ag * k_host)
    if routes.reduce_scatter_factor and s.host_units:
        rs = n * routes.reduce_scatter_factor * s.total_params
        totals["reduce_scatter"] = row(rs, rs * k_host)
    if s.ckpt_ops:
        totals["d2h_ckpt"] = row(n * s.ckpt_bytes)
        totals["h2d_ckpt"] = row(n * s.ckpt_bytes)
    if reduce_b:
        totals["cpu_reduce"] = row(reduce_b * s.total_params)
    if s.allreduce_bytes:
        ar = n * s.allreduce_bytes
        totals["allreduce"] = row(ar, ar * k_host)
    if w.policy.gpu_state_units:
        totals["gpu_adam"] = row(0.0, 0.0)
    if w.nic_grad_op and s.host_units:  # one host's NIC traffic (the simulator runs one host)
        nb = routes.nic_grad_factor * s.total_params
        totals[w.nic_grad_op] = row(nb, nb if w.nic_grad_from_host else 0.0)
    if routes.nic_weight_factor and s.host_units:
        totals["weight_allgather"] = row(routes.nic_weight_factor * s.total_params)
    return totals


def resource_demands(w: StepWorkload) -> dict[str, float]:
    """Seconds of full-capacity work per resource and per serial stream (rank 0 stands for every rank)."""
    caps = resource_capacities(w.hw, w.hosts)
    n, c = w.ranks, w.chunks
    s = _sums(w)
    lat = w.pcie_latency
    routes = w.routes
    cpu_sec = w.cpu_update_seconds_per_param()
    h2d_bytes = routes.h2d_param_factor * s.fetched_params + s.ckpt_bytes
    h2d_ops = s.fetch_ops * c + s.ckpt_ops
    d2h_bytes = routes.d2h_grad_factor * s.total_params + s.ckpt_bytes
    d2h_ops = s.host_units * c + s.ckpt_ops
    link_bytes = (routes.allgather_factor * s.fetched_params + routes.reduce_scatter_factor * s.total_params
                  + s.allreduce_bytes)
    link_ops = ((s.fetch_ops * c if routes.allgather_factor else 0)
                + (s.host_units * c if routes.reduce_scatter_factor else 0)
                + (w.policy.gpu_state_units if s.allreduce_bytes else 0))
    cpu_host_bytes = sum(w.cpu_update_host_bytes_per_param()) * s.total_params
    cpu_time = cpu_sec * s.total_params
    compute = s.compute_s

    h2d_use, d2h_use = dma_usage(w.hw, 0, "h2d"), dma_usage(w.hw, 0, "d2h")
    coll_use = collective_usage(w.hw, 0)
    coll_cap = w.collective_cap()
    coll_floor = max(1.0 / coll_cap, seconds_per_byte(coll_use, caps))
    demands = {
        "gpu[0]": compute,
        "h2d[0]": h2d_bytes / caps["h2d[0]"] + h2d_ops * lat,
        "d2h[0]": d2h_bytes / caps["d2h[0]"] + d2h_ops * lat,
        "cpu[0]": (cpu_time + sum(map(w.update_calls, range(len(w.units)))) * w.update_call_latency) / n,
    }
    if link_bytes:
        demands["link[0]"] = link_bytes * coll_floor + link_ops * w.link_latency
    nic_grad = routes.nic_grad_factor * s.total_params
    nic_weight = routes.nic_weight_factor * s.total_params
    if nic_grad + nic_weight:  # one host's NICs, and host DRAM for what is sent from host memory
        nic_ops = s.host_units * c * ((1 if nic_grad else 0) + (1 if nic_weight else 0))
        demands["nic"] = (nic_grad + nic_weight) / caps["nic"] + nic_ops * w.nic_latency
        cpu_host_bytes += nic_weight + (nic_grad if w.nic_grad_from_host else 0.0)
    pcie = (h2d_bytes + d2h_bytes + link_bytes * coll_use.get("pcie[0]", 0.0)) / caps["pcie[0]"]
    demands["pcie[0]"] = pcie
    host = n * (h2d_bytes + d2h_bytes + link_bytes * coll_use.get("hostmem", 0.0)) + cpu_host_bytes
    demands["hostmem"] = host / caps["hostmem"]
    if w.hw.switches:
        members = len(w.hw.switches[0].gpus)
        for direction, nbytes, use in (("h2d", h2d_bytes, h2d_use), ("d2h", d2h_bytes, d2h_use)):
            key = f"uplink_{direction}[0]"
            if key in use:
                extra = link_bytes * coll_use.get(key, 0.0)
                demands[key] = members * (nbytes + extra) / caps[key]
    return demands
