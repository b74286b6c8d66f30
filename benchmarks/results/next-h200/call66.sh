# Device call for #14 (00:47 UTC 2026-12-08, right after c65 on the same H100). Held-out shapes from c65's queued fit
# (with the optimizer kind) and the counted backward: Qwen2.5-1.5B shape resident b8/4/1 and Llama-3.2-1B shape b4/1,
# predicted by peer_validation before each run (predictions.json). Hypothesis: every row within 8%, backward within
# 10%, after-backward within 10%. Everything packed in one tarball (the results file count limit).
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
C=benchmarks/results/next-h200/configs; Q=benchmarks/results/h100-2026-12-08/c65/queued.yaml
mkdir -p /tmp/c66
nvidia-smi --query-gpu=name --format=csv,noheader > /tmp/c66/env.txt
timeout $(left 250) python3 -m benchmarks.peer_validation --out /tmp/c66/qwen2.5 --calibrate none --base $Q \
  --model $C/qwen2.5-1.5b.json --systems resident --batches 8 4 1 --steps 4 --no-contention --phases \
  --deadline 200 --timeout 200 > /tmp/c66/qwen2.5.log 2>&1
timeout $(left 400) python3 -m benchmarks.peer_validation --out /tmp/c66/llama --calibrate none --base $Q \
  --model $C/llama-3.2-1b.json --systems resident --batches 4 1 --steps 4 --no-contention --phases \
  --deadline 140 --timeout 140 > /tmp/c66/llama.log 2>&1
find /tmp/c66 -name peers -type d -prune -exec rm -rf {} +
tar czf $OUT/c66.tgz -C /tmp c66; cat /tmp/c66/*/comparison.md | grep "^| resident"
