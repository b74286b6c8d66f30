# Device call for #14 (twenty-first session), written 2026-12-07 21:32 UTC when call61 (full calibration, about
# 330 s) no longer fitted the device time left after refused starts: only the shape micro-benchmarks with the new
# Timer (queued calls behind a held GPU), saved as calibration.shape_fit's samples JSON and fitted here offline
# (benchmarks/RESULTS.md, "Predictions for call61" hold for the fitted curves). Carry .whl.
# Run: bash benchmarks/results/next-h200/call61b.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
mkdir -p $OUT/c61
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/c61_env.txt 2>&1
timeout 200 python3 - > $OUT/c61_shapes.log 2>&1 <<PY
import json, os, time
from slidedp.calibration.shape_bench import shape_samples
from slidedp.calibration.shape_fit import samples_to_json
t = time.time()
samples = shape_samples()
json.dump(samples_to_json(samples), open(os.environ["OUT"] + "/c61/shapes.json", "w"))
print("shape samples in", round(time.time() - t, 1), "s")
PY
tail -3 $OUT/c61_shapes.log
