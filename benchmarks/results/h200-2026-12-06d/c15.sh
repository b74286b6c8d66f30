# 2026-12-06 (fourth session) call c15 (#21; the session's last ~150 s of device time, a fresh machine): SlideFormer
# on Qwen3-8B at batch 1 only (its peer model predicts 96.1 GiB of host memory, 3.19 s/step with the H100's GPU
# side; its Qwen3-4B RSS ran 20% above the model's, so the 125.8 GiB host may not hold it). Carry .whl and .peers.
# Run: bash benchmarks/results/h200-2026-12-06d/c15.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c15_env.txt 2>&1
timeout $(left 125) python3 -m benchmarks.peer_compare --model qwen3-8b --seq 4096 --batches 1 --steps 3 \
  --systems slideformer --timeout 115 --batch-timeout 110 --deadline $(left 118) --peer-inputs /tmp/peer_inputs8 \
  --out $OUT/p21f8 > $OUT/c15.log 2>&1
free -g >> $OUT/c15.log
tar czf $OUT/p21f8_logs.tgz -C $OUT/p21f8 peer_logs 2>/dev/null && rm -r $OUT/p21f8/peer_logs
