"""GPU micro-benchmarks (when a CUDA device is present): pinned H2D/D2H time against transfer size (latency +
bandwidth fit), both directions at once, aggregate bandwidth with several streams and several GPUs copying at
once, NCCL all-gather / reduce-scatter across the GPUs of this host, the runtime's AdamW on GPU-held state
(``Policy.gpu_state_units``), and one decoder layer's forward and backward against tokens and sequence length.
"""

from __future__ import annotations

import torch

from slidedp.calibration.measurements import Measurements, Progress, median_time
from slidedp.hardware import GIB


def device_identity(index: int = 0) -> dict[str, object]:
    """Which card a calibration measured: its name, UUID and SM count. Lent machines of one model differ (GEMM rates
    several percent apart between two leases: benchmarks/RESULTS.md, call68), so a profile's report says which
    card it describes."""
    props = torch.cuda.get_device_properties(index)
    return {"name": props.name, "uuid": str(getattr(props, "uuid", "unknown")),
            "sm_count": props.multi_processor_count, "memory_gib": round(props.total_memory / GIB, 1)}


def gpu_benchmarks(m: Measurements, quick: bool, progress: Progress | None = None) -> None:
    if not torch.cuda.is_available():
        m.report["gpu"] = "no CUDA device: PCIe and GPU rates kept from the base profile"
        return
    m.report["gpu_device"] = device_identity()
    sizes = [2**20, 2**23, 2**26] if quick else [2**20, 2**22, 2**24, 2**26, 2**28, 2**30]
    host = torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(max(sizes), dtype=torch.uint8, device="cuda")
    for i, size in enumerate(sizes):
        for direction, table in (("h2d", m.h2d), ("d2h", m.d2h)):
            def copy(size=size, direction=direction):
                if direction == "h2d":
                    dev[:size].copy_(host[:size], non_blocking=True)
                else:
                    host[:size].copy_(dev[:size], non_blocking=True)
                torch.cuda.synchronize()
            table[size] = median_time(copy, 3 if quick else 10)
        if progress:
            progress(i + 1, len(sizes) + 2)
    big = max(sizes)
    other = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    dev2 = torch.empty(big, dtype=torch.uint8, device="cuda")

    def both():
        with torch.cuda.stream(s1):
            dev[:big].copy_(host[:big], non_blocking=True)
        with torch.cuda.stream(s2):
            other.copy_(dev2, non_blocking=True)
        torch.cuda.synchronize()
    m.duplex_gbps = 2 * big / median_time(both, 3) / 1e9
    concurrent_copy_benchmarks(m, host, quick)
    if progress:
        progress(len(sizes) + 1, len(sizes) + 2)
    collective_benchmarks(m, quick)
    gpu_adam_benchmark(m, quick)
    if progress:
        progress(len(sizes) + 2, len(sizes) + 2)


def gpu_adam_benchmark(m: Measurements, quick: bool) -> None:
    """The runtime's update of GPU-held units (clip scale, fused AdamW, bf16 refresh) on 2^22 (quick) or 2^27
    parameters split like decoder layers; HBM-bound, so one size gives the rate."""
    from slidedp.runtime.gpu_state import GpuOptimizerState
    from slidedp.runtime.optim import OptimConfig

    n, pieces = (2**22, 4) if quick else (2**27, 8)
    state = GpuOptimizerState.from_tensors([torch.randn(n // pieces, device="cuda") for _ in range(pieces)],
                                           torch.bfloat16)
    grads = [torch.randn_like(t) * 1e-3 for t in state.master]
    cfg, step = OptimConfig(), [0]

    def update() -> None:
        step[0] += 1
        state.update_all(grads, step[0], cfg.lr, cfg, 0.5)
        torch.cuda.synchronize()
    update()
    m.gpu_adam_gparams_per_s = n / median_time(update, 3 if quick else 10) / 1e9


def concurrent_copy_benchmarks(m: Measurements, host: torch.Tensor, quick: bool) -> None:
    """Aggregate pinned H2D bandwidth with 1..N GPUs copying at once, each on 1, 2 or 4 streams: what the
    host (DRAM, root complex, shared switch uplinks) delivers when ranks compete for it."""
    gpus = torch.cuda.device_count()
    size = host.numel() // 4  # each copy moves a quarter of the pinned buffer
    counts = sorted({1, gpus} | {g for g in (2, 4) if g < gpus})
    targets = {g: torch.empty(size, dtype=torch.uint8, device=f"cuda:{g}") for g in range(gpus)}
    for g_count in counts:
        for streams in ((1, 2) if quick else (1, 2, 4)):
            pool = [(g, torch.cuda.Stream(device=g)) for g in range(g_count) for _ in range(streams)]
            part = size // streams

            def copy_all(pool=pool, part=part, streams=streams, g_count=g_count):
                for i, (g, stream) in enumerate(pool):
                    with torch.cuda.stream(stream):
                        lo = (i % streams) * part
                        targets[g][lo:lo + part].copy_(host[lo:lo + part], non_blocking=True)
                for g in range(g_count):
                    torch.cuda.synchronize(g)
            seconds = median_time(copy_all, 3)
            m.concurrent_h2d_gbps[(g_count, streams)] = g_count * streams * part / seconds / 1e9
    m.report["concurrent_h2d_gbps"] = {f"{g} GPU x {s} streams": round(v, 2)
                                       for (g, s), v in m.concurrent_h2d_gbps.items()}


def collective_benchmarks(m: Measurements, quick: bool) -> None:
    """NCCL all-gather and reduce-scatter of bf16 buffers across every GPU of this host, from one process
    (torch.cuda.nccl), against bytes per rank: the link fit gives the collective bus bandwidth."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        m.report["collectives"] = "one GPU: no collectives to measure (link kept from the base profile)"
        return
    from torch.cuda import nccl

    sizes = [2**20, 2**24] if quick else [2**20, 2**22, 2**24, 2**26]
    for op in ("allgather", "reduce_scatter"):
        table = m.collectives.setdefault(op, {})
        for size in sizes:
            elems = size // 2
            shards = [torch.ones(elems, dtype=torch.bfloat16, device=f"cuda:{g}") for g in range(gpus)]
            fulls = [torch.empty(elems * gpus, dtype=torch.bfloat16, device=f"cuda:{g}") for g in range(gpus)]

            def run(op=op, shards=shards, fulls=fulls):
                if op == "allgather":
                    nccl.all_gather(shards, fulls)
                else:
                    nccl.reduce_scatter(fulls, shards)
                for g in range(gpus):
                    torch.cuda.synchronize(g)
            # Bytes each rank sends and receives: (N-1)/N of the full buffer.
            table[int(size * (gpus - 1))] = median_time(run, 3 if quick else 5)


def layer_benchmarks(m: Measurements, model: str, quick: bool, progress: Progress | None = None) -> None:
    """Forward and backward time of one decoder layer of ``model`` against tokens and sequence length, on the
    device the runtime would use (CUDA when present, else CPU in fp32), timed as calibration.shape_bench
    times layer passes (the runtime's own layer call, detached weight leaves)."""
    from slidedp.calibration.shape_bench import Timer, layer_pass_times

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    grid = [(64, 1), (64, 4), (256, 1), (256, 2)] if quick else [(1024, 1), (1024, 8), (4096, 1), (4096, 4),
                                                                 (16384, 1), (32768, 1)]
    timer = Timer(device, 2 if quick else 5, max_seconds=2.0, hold_gpu=False)  # the CPU's share counts here
    for i, (seq, batch, fwd, bwd) in enumerate(layer_pass_times(timer, dtype, model, grid)):
        m.layer.append((model, seq, batch * seq, fwd, bwd))
        if progress:
            progress(i + 1, len(grid))
