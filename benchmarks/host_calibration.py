"""The host side of `slidedp calibrate` that the peers and the contention model need, alone (minutes, not the
full calibration): the peers' CPU AdamW rates (calibration.peer_bench) and host DRAM under DMA contention
(calibration.contention_bench), written as measured.json and as a profile with those fields refitted.

    python -m benchmarks.host_calibration --out DIR [--base h200-x1] [--quick]
    python -m benchmarks.host_calibration --out DIR --peer-impls deepspeed_cpu_adam_bf16 torch_clip_grad_norm_bf16 \
        --no-contention       # MegaTrain's bf16 optimizer phase only, into the base profile's peer rates
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from benchmarks.common import log


def main() -> int:
    from slidedp.calibration.contention_bench import contention_benchmark
    from slidedp.calibration.host_bench import peer_thread_counts
    from slidedp.calibration.measurements import Measurements
    from slidedp.calibration.peer_bench import BF16_IMPLEMENTATIONS, IMPLEMENTATIONS, peer_adam_benchmarks
    from slidedp.calibration.profile_fit import contention_host, dram_capacity_gbps
    from slidedp.hardware import load_hardware

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--base", default="h200-x1")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--peer-impls", nargs="+", default=list(IMPLEMENTATIONS),
                        choices=IMPLEMENTATIONS + BF16_IMPLEMENTATIONS, help="peer CPU optimizer passes to time")
    parser.add_argument("--no-contention", action="store_true", help="skip the DRAM contention experiments")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = load_hardware(args.base)
    m = Measurements()
    peer_adam_benchmarks(m, args.quick, peer_thread_counts(), lambda i, n: log(f"peer AdamW {i}/{n}"),
                         implementations=tuple(args.peer_impls))
    log(f"peer rates: {m.peer_adam_gparams_per_s}")
    if not args.no_contention:
        contention_benchmark(m, args.quick)
        log(f"contention: {m.contention}")
    # The base profile's own passes (adam curve x bytes, stream, duplex) stay candidates for the capacity.
    m.adam_gparams_per_s, m.stream_gbps = dict(base.host.adam_gparams_per_s), dict(base.host.stream_gbps)
    m.adam_fused_cast, m.duplex_gbps = base.host.fused_cast, base.gpu.duplex_gbps
    capacity = dram_capacity_gbps(m)
    host = replace(base.host, mem_bw_gbps=round(capacity, 1),
                   peer_adam_gparams_per_s={**base.host.peer_adam_gparams_per_s, **m.peer_adam_gparams_per_s})
    if m.contention:
        host = contention_host(m.contention, replace(base, host=host))
    replace(base, host=host).save(out / "profile.yaml")
    (out / "measured.json").write_text(json.dumps(
        {"peer_adam_gparams_per_s": m.peer_adam_gparams_per_s, "contention": m.contention,
         "mem_bw_gbps": capacity, "warnings": m.report.get("warnings", [])}, indent=1))
    for line in m.report.get("warnings", []):
        log(f"warning: {line}")
    log(f"DRAM capacity {capacity:.1f} GB/s; wrote {out / 'profile.yaml'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
