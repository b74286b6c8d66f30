"""Per-resource work of one step, in seconds at full capacity: the closed-form floor of the step time.

Each entry is a time the step cannot beat: a resource cannot serve its bytes faster than its capacity,
and a stream cannot run its serial operations faster than each one alone. Names match the simulator's
resources so bottlenecks read the same in both.
"""

from __future__ import annotations

from slidedp.workload import StepWorkload, collective_usage, dma_usage, resource_capacities


def _dma_floor(w: StepWorkload, usage: dict[str, float], caps: dict[str, float]) -> float:
    """Seconds per byte of a lone flow: the slowest resource it crosses."""
    return max(k / caps[r] for r, k in usage.items())


def resource_demands(w: StepWorkload) -> dict[str, float]:
    """Seconds of full-capacity work per resource and per serial stream (rank 0 stands for every rank)."""
    caps = resource_capacities(w.hw)
    n, c, units = w.ranks, w.chunks, w.units
    lat = w.pcie_latency
    compute = 0.0
    reduce_b = w.cpu_reduce_host_bytes(1.0) if w.needs_cpu_reduce() else 0.0
    adam_b, cast_b = w.adam_host_bytes(1.0), w.cast_host_bytes(1.0)
    cpu_sec = (reduce_b / w.cpu_reduce_cap() if reduce_b else 0.0) + adam_b / w.adam_cap() + cast_b / w.cast_cap()
    total_params = fetched_params = 0.0
    fetch_ops = 0
    ckpt_bytes = 0.0
    ckpt_ops = 0
    for u, unit in enumerate(units):
        compute += unit.fwd_s + unit.bwd_s
        fetches = 1 if w.resident_in_backward(u) else 2
        total_params += unit.params
        fetched_params += fetches * unit.params
        fetch_ops += fetches
        if w.offloads_checkpoint(u):
            ckpt_bytes += unit.checkpoint_bytes
            ckpt_ops += 1
    h2d_bytes = w.h2d_param_factor * fetched_params + ckpt_bytes
    h2d_ops = fetch_ops * c + ckpt_ops
    d2h_bytes = w.d2h_grad_factor * total_params + ckpt_bytes
    d2h_ops = len(units) * c + ckpt_ops
    link_bytes = w.allgather_factor * fetched_params + w.reduce_scatter_factor * total_params
    link_ops = (fetch_ops * c if w.allgather_factor else 0) + (len(units) * c if w.reduce_scatter_factor else 0)
    cpu_host_bytes = (reduce_b + adam_b + cast_b) * total_params
    cpu_time = cpu_sec * total_params

    h2d_use, d2h_use = dma_usage(w.hw, 0, "h2d"), dma_usage(w.hw, 0, "d2h")
    coll_use = collective_usage(w.hw, 0)
    coll_cap = w.collective_cap()
    coll_floor = max(1.0 / coll_cap, _dma_floor(w, coll_use, caps))
    demands = {
        "gpu[0]": compute,
        "h2d[0]": h2d_bytes / caps["h2d[0]"] + h2d_ops * lat,
        "d2h[0]": d2h_bytes / caps["d2h[0]"] + d2h_ops * lat,
        "cpu[0]": cpu_time / n,
    }
    if link_bytes:
        demands["link[0]"] = link_bytes * coll_floor + link_ops * w.link_latency
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
