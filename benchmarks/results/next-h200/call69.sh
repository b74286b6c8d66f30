# Device call for #14 (01:22 UTC 2026-12-08): the GEMM grid of calibration and the layer GEMMs of three models timed
# in one call on one card (c68 and c65 ran on different leases), with the card's serial. Fitted on the development
# machine: the curve from this call's grid (with c65's other families) against this call's layer shapes.
# Hypothesis (RESULTS, "Predictions for call69"): the layer shapes run 3-16% faster than the grid's curve here too.
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
nvidia-smi -q | grep -E "Product Name|Serial Number|GPU UUID|Max Clocks" -A0 > $OUT/c69_env.txt; lscpu | grep -E "^Model:" >> $OUT/c69_env.txt
timeout 300 python3 - > $OUT/c69.log 2>&1 <<'PY'
import json, os, time, torch
from calibration.shape_bench import GPU_GEMMS, Timer, gemm_samples
layers = {"qwen3-4b": ((4096, 2560), (1024, 2560), (2560, 4096), (9728, 2560), (2560, 9728)),
          "llama-3.2-1b": ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)),
          "qwen2.5-1.5b": ((1536, 1536), (256, 1536), (8960, 1536), (1536, 8960))}
timer = Timer(torch.device("cuda"), 10, 2.0)
t = time.time()
grid = [(op.m, op.n, op.k, s) for op, s in gemm_samples(timer, torch.bfloat16, GPU_GEMMS)]
shapes = [(tok, o, i) for tok in (4096, 16384, 32768) for ws in layers.values() for o, i in ws]
layer = [(op.m, op.n, op.k, s) for op, s in gemm_samples(timer, torch.bfloat16, shapes)]
grid_again = [(op.m, op.n, op.k, s) for op, s in gemm_samples(timer, torch.bfloat16, GPU_GEMMS[:12])]
json.dump({"grid": grid, "layer": layer, "grid_again": grid_again}, open(os.environ["OUT"] + "/c69_gemms.json", "w"))
print("timed in", round(time.time() - t, 1), "s")
PY
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c69_env.txt; tail -2 $OUT/c69.log; cat $OUT/c69_env.txt
