"""Host contention on one GPU host, measured and predicted by the simulator's processor-sharing model.

    python -m benchmarks.contention --out DIR [--params 268435456] [--profile h200-x1]

Experiments (each the median of --repeats):
  adam            the runtime's CPU AdamW pass (one-pass kernel, all cores) alone
  adam+dma        the same pass while H2D and D2H copies run on their own streams the whole time
  dma             H2D and D2H at once (pinned, 1 GiB pieces) alone: the two directions' rates
  dma+adam        the same copies while the AdamW pass runs: their rates during it
  h2d x1 / x2     H2D alone on one stream and on two streams at once

Predictions: the same flows started together in the simulator's fluid network (sim/fluid.py), with the
profile's capacities and the workload's CPU-pass caps: AdamW is a DRAM flow capped at the worker's rate,
each copy crosses its PCIe direction, the duplex cap and host DRAM. Written to predictions.json before
anything is measured; measured.json and a table follow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from benchmarks.common import log

GIB = 2**30


def predict(profile: str, params: int) -> dict:
    """Each experiment's flows in the fluid network: seconds of the AdamW pass, GB/s of each copy."""
    from slidedp.hardware import load_hardware
    from slidedp.resources import adam_host_bytes_per_param, dma_usage

    hw = load_hardware(profile)
    per_param = adam_host_bytes_per_param(2, hw.host.fused_cast)
    adam = (per_param * params, {"hostmem": 1.0}, hw.host.adam_rate(hw.host.cores) * per_param)
    endless = 1e15  # copies that outlast every window
    h2d, d2h = (endless, dma_usage(hw, 0, "h2d"), float("inf")), (endless, dma_usage(hw, 0, "d2h"), float("inf"))
    out: dict = {"profile": hw.name, "params": params, "adam_threads": hw.host.cores}
    out["adam_s"] = _fluid(hw, {"adam": adam}, until="adam")["adam_end"]
    both = _fluid(hw, {"adam": adam, "h2d": h2d, "d2h": d2h}, until="adam")
    out["adam+dma_s"] = both["adam_end"]
    out["dma+adam_h2d_gbps"], out["dma+adam_d2h_gbps"] = both["h2d"] / 1e9, both["d2h"] / 1e9
    alone = _fluid(hw, {"h2d": h2d, "d2h": d2h}, until=1.0)
    out["dma_h2d_gbps"], out["dma_d2h_gbps"] = alone["h2d"] / 1e9, alone["d2h"] / 1e9
    out["h2d_x1_gbps"] = _fluid(hw, {"a": h2d}, until=1.0)["a"] / 1e9
    two = _fluid(hw, {"a": h2d, "b": h2d}, until=1.0)
    out["h2d_x2_gbps"] = (two["a"] + two["b"]) / 1e9
    return out


def _fluid(hw, flows: dict[str, tuple[float, dict, float]], until: str | float) -> dict[str, float]:
    """Start ``flows`` together in the simulator's fluid network and run until flow ``until`` ends (or ``until``
    seconds): the bytes/s each flow averaged over that window, and the window's end as ``<until>_end``."""
    import simpy

    from slidedp.resources import resource_capacities
    from slidedp.sim.fluid import FluidNetwork

    env = simpy.Environment()
    net = FluidNetwork(env, resource_capacities(hw))
    done = {name: net.transfer(amount, usage, cap) for name, (amount, usage, cap) in flows.items()}
    env.run(until=done[until] if isinstance(until, str) else until)
    t = env.now
    left = net.remaining()
    out = {name: (flows[name][0] - left.get(ev, 0.0)) / t for name, ev in done.items()}
    if isinstance(until, str):
        out[f"{until}_end"] = t
    return out


def measure(params: int, repeats: int) -> dict:
    import torch

    from slidedp.runtime.cpu_adam import fused_kernel, fused_kernel_error

    kernel = fused_kernel()
    if kernel is None:
        raise SystemExit(f"the one-pass kernel did not build: {fused_kernel_error()}")
    torch.set_num_threads(torch.get_num_threads())
    p, m, v = torch.randn(params), torch.zeros(params), torch.zeros(params)
    slot = torch.randn(params).bfloat16()
    step = [0]

    def adam() -> float:
        step[0] += 1
        t0 = time.perf_counter()
        kernel.adamw_bf16(p, m, v, slot, 1e-5, 0.9, 0.95, 1e-8, 0.0, float(step[0]), 1.0)
        return time.perf_counter() - t0

    piece = GIB
    h_src = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
    h_dst = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
    d_dst = torch.empty(piece, dtype=torch.uint8, device="cuda")
    d_src = torch.empty(piece, dtype=torch.uint8, device="cuda")
    d_two = torch.empty(piece, dtype=torch.uint8, device="cuda")
    s_h2d, s_d2h, s_two = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()

    def copies(stop: threading.Event | None, seconds: float, directions: tuple[str, ...]) -> dict[str, float]:
        """Copy 1 GiB pieces back to back in each direction until ``stop`` (or ``seconds``); GB/s each."""
        moved = dict.fromkeys(directions, 0)
        t0 = time.perf_counter()
        while (stop is None and time.perf_counter() - t0 < seconds) or (stop is not None and not stop.is_set()):
            for d in directions:
                if d == "h2d":
                    with torch.cuda.stream(s_h2d):
                        d_dst.copy_(h_src, non_blocking=True)
                elif d == "h2d_b":
                    with torch.cuda.stream(s_two):
                        d_two.copy_(h_src, non_blocking=True)
                else:
                    with torch.cuda.stream(s_d2h):
                        h_dst.copy_(d_src, non_blocking=True)
                moved[d] += piece
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        return {d: b / dt / 1e9 for d, b in moved.items()}

    adam()  # warm-up: pages touched, threads started
    copies(None, 0.5, ("h2d", "d2h"))
    out: dict = {"params": params, "threads": torch.get_num_threads()}
    out["adam_s"] = statistics.median(adam() for _ in range(repeats))
    with_dma, dma_during = [], []
    for _ in range(repeats):
        stop, result = threading.Event(), {}
        worker = threading.Thread(target=lambda stop=stop, result=result: result.update(
            rates=copies(stop, 0.0, ("h2d", "d2h"))))
        worker.start()
        time.sleep(0.2)  # copies at full rate before the pass starts
        with_dma.append(adam())
        stop.set()
        worker.join()
        dma_during.append(result["rates"])
    out["adam+dma_s"] = statistics.median(with_dma)
    alone = [copies(None, 2.0, ("h2d", "d2h")) for _ in range(repeats)]
    out["dma_h2d_gbps"] = statistics.median(r["h2d"] for r in alone)
    out["dma_d2h_gbps"] = statistics.median(r["d2h"] for r in alone)
    # Copies while a pass runs: the pass in a thread (the kernel releases the GIL), copies until it ends.
    during = []
    for _ in range(repeats):
        stop = threading.Event()
        t = threading.Thread(target=lambda stop=stop: (adam(), stop.set()))
        t.start()
        during.append(copies(stop, 0.0, ("h2d", "d2h")))
        t.join()
    out["dma+adam_h2d_gbps"] = statistics.median(r["h2d"] for r in during)
    out["dma+adam_d2h_gbps"] = statistics.median(r["d2h"] for r in during)
    out["h2d_x1_gbps"] = statistics.median(copies(None, 2.0, ("h2d",))["h2d"] for _ in range(repeats))
    out["h2d_x2_gbps"] = statistics.median(sum(copies(None, 2.0, ("h2d", "h2d_b")).values())
                                           for _ in range(repeats))
    out["dma_during_adam_while_timing_adam"] = dma_during
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--params", type=int, default=2**28)
    parser.add_argument("--profile", default="h200-x1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--predict-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    predicted = predict(args.profile, args.params)
    (out / "predictions.json").write_text(json.dumps(predicted, indent=1))
    log(f"predicted: {predicted}")
    if args.predict_only:
        return
    measured = measure(args.params, args.repeats)
    (out / "measured.json").write_text(json.dumps(measured, indent=1))
    for key in ("adam_s", "adam+dma_s", "dma_h2d_gbps", "dma_d2h_gbps", "dma+adam_h2d_gbps", "dma+adam_d2h_gbps",
                "h2d_x1_gbps", "h2d_x2_gbps"):
        p, m = predicted[key], measured[key]
        log(f"{key:20s} predicted {p:9.4f} measured {m:9.4f} error {100 * (p - m) / m:+6.1f}%")


if __name__ == "__main__":
    main()
