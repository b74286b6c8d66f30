# call63 (twenty-second session, 23:36 UTC): c61's queued-Timer shape samples (h100-2026-12-07j/c61/shapes.json)
# fitted on the device into the h100-sxm-x1 preset (layer pass terms kept), then GPU-resident Qwen3-4B batch 4, 2, 1
# predicted from it before the runs (peer_validation writes predictions.json first).
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
mkdir -p $OUT/c63
python3 - <<'PY'
import json, os
from dataclasses import replace
from slidedp.calibration.shape_fit import samples_from_json, fit_curves
from slidedp.calibration.profile_fit import LAYER_PASS_FIELDS
from slidedp.hardware import load_hardware
base = load_hardware("h100-sxm-x1")
fit = fit_curves(samples_from_json(json.load(open("benchmarks/results/h100-2026-12-07j/c61/shapes.json"))), 989.4, 3350.0)
curves = replace(fit.curves, **{n: getattr(base.gpu.compute, n) for n in LAYER_PASS_FIELDS})
replace(base, name="h100-c61-queued", gpu=replace(base.gpu, compute=curves)).save(os.environ["OUT"] + "/c63/queued.yaml")
print(fit.warnings)
PY
timeout 300 python3 -m benchmarks.peer_validation --out $OUT/c63/peers --calibrate none --base $OUT/c63/queued.yaml \
  --systems resident --batches 4 2 1 --steps 4 --no-contention --phases --deadline 200 --timeout 200 > $OUT/c63.log 2>&1
rm -rf $OUT/c63/peers/peers
cat $OUT/c63/peers/comparison.md | head -20
