# Device call for #14 (written 2026-12-07 23:50 UTC, twenty-second session, for the next one). On either card.
# 1. The shape micro-benchmarks with the queued Timer, now with the GPU optimizer step (clip + fused AdamW over
#    layer-shaped fp32 parameters, kind "optimizer"), fitted into the card's preset (layer pass terms kept):
#    on an H200 this is the h200-x1 preset's queued refit, on an H100 the second one after c61b.
# 2. GPU-resident Qwen3-4B batch 4 and 1, Llama-3.2-1B shape batch 8, predicted from (1) before the runs, with
#    phases: the step after backward (clip + AdamW) against the optimizer kind's price.
# Hypotheses (to be written in RESULTS before it runs): the optimizer kind's bandwidth 2.0-2.4 TB/s on an H100
# (2.1-2.3 in the steps of c62-c64), 2.6-3.4 on an H200; after-backward within 10% of its measured phase.
# Run: bash benchmarks/results/next-h200/call65.sh   (carry .whl)
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
mkdir -p $OUT/c65
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; echo "base $BASE"; } > $OUT/c65_env.txt
timeout 240 python3 - $BASE > $OUT/c65_fit.log 2>&1 <<'PY'
import json, os, sys, time
from dataclasses import replace
from slidedp.calibration.profile_fit import compute_curves_profile
from slidedp.calibration.shape_bench import shape_samples
from slidedp.calibration.shape_fit import samples_to_json
from slidedp.hardware import load_hardware
out = os.environ["OUT"] + "/c65"
t = time.time()
samples = shape_samples()
json.dump(samples_to_json(samples), open(out + "/shapes.json", "w"))
print("shape samples in", round(time.time() - t, 1), "s")
base, warnings = load_hardware(sys.argv[1]), []
gpu, report = compute_curves_profile(base.gpu, samples, warnings)  # the calibrate path: untimed terms kept
replace(base, name=sys.argv[1] + "-queued", gpu=gpu).save(out + "/queued.yaml")
print(warnings, report, gpu.compute.memory_gbps_by_kind)
PY
C=benchmarks/results/next-h200/configs
timeout $(left 420) python3 -m benchmarks.peer_validation --out $OUT/c65/qwen3-4b --calibrate none \
  --base $OUT/c65/queued.yaml --systems resident --batches 4 1 --steps 4 --no-contention --phases \
  --deadline 120 --timeout 120 > $OUT/c65_qwen3.log 2>&1
timeout $(left 520) python3 -m benchmarks.peer_validation --out $OUT/c65/llama --calibrate none \
  --base $OUT/c65/queued.yaml --model $C/llama-3.2-1b.json --systems resident --batches 8 --steps 4 \
  --no-contention --phases --deadline 80 --timeout 80 > $OUT/c65_llama.log 2>&1
find $OUT/c65 -name peers -type d -prune -exec rm -rf {} +
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c65_env.txt
tail -2 $OUT/c65_fit.log; head -8 $OUT/c65/*/comparison.md
