# 2026-12-06 (fourth session) call c13 (#21, Qwen3-8B; the rest of the session's device time, ~560 s, on the warm
# H100 that ran call11 a and b): MegaTrain at batch 1 and 4, then SlideDP host-only at the same batches on the
# same machine (ZeRO-2-Offload does not fit the 128 GiB host). Predictions before: RESULTS "Qwen3-8B: predictions
# before the runs". Carry .whl and .peers. Run: bash benchmarks/results/h200-2026-12-06d/c13.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c13_env.txt 2>&1
timeout $(left 560) python3 -m benchmarks.peer_compare --model qwen3-8b --seq 4096 --batches 1 4 --steps 3 \
  --systems megatrain slidedp-host --timeout 380 --batch-timeout 170 --deadline $(left 550) \
  --peer-inputs /tmp/peer_inputs8 --out $OUT/p21m8 > $OUT/c13.log 2>&1
tar czf $OUT/p21m8_logs.tgz -C $OUT/p21m8 peer_logs 2>/dev/null && rm -r $OUT/p21m8/peer_logs
rm -rf $OUT/p21m8/slidedp_runs
