# 2026-12-06 (second session) call d3 (#21): MegaTrain (DLYuanGod/MegaTrain 919520f0, laid out in .peers by
# benchmarks.peer_external_setup; deepspeed 0.19.8 from its sdist in .whl) on Qwen3-4B random init, seq 4096,
# batches 1-16, 3 steps each (first = warm-up), one fresh process per batch; the first JIT-builds DeepSpeed's CPU
# Adam. Predictions written before (RESULTS "SlideFormer and MegaTrain", h200-x1 with stand-in rates).
# Carry .whl and .peers. Run: bash benchmarks/results/h200-2026-12-06b/d3.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/d3_env.txt 2>&1
timeout $(left 585) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --steps 3 \
  --systems megatrain --timeout 560 --batch-timeout 170 --deadline 565 \
  --peer-inputs /tmp/peer_inputs --out $OUT/p21 > $OUT/d3.log 2>&1
tar czf $OUT/p21_logs.tgz -C $OUT/p21 peer_logs 2>/dev/null && rm -r $OUT/p21/peer_logs
