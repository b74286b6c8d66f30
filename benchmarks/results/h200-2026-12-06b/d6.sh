# 2026-12-06 (second session) call d6 (#21): d3 again after its failure (every batch: "Expected attn_mask dtype
# to be bool or float ... got long int": MegaTrain hands flash-attn's 2-D padding mask to each layer, SDPA
# rejects it; peer_probe now translates it, PEER_PROBE_SDPA_PADDING_MASK=1), then MegaTrain's bf16 optimizer
# phase alone (DeepSpeedCPUAdam on bf16 weights, clip_grad_norm_ on bf16 gradients) replacing the stand-in rates.
# Carry .whl and .peers. Run: bash benchmarks/results/h200-2026-12-06b/d6.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/d6_env.txt 2>&1
timeout $(left 400) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --steps 3 \
  --systems megatrain --timeout 390 --batch-timeout 150 --deadline 390 \
  --peer-inputs /tmp/peer_inputs --out $OUT/p21 > $OUT/d6.log 2>&1
tar czf $OUT/p21_logs.tgz -C $OUT/p21 peer_logs 2>/dev/null && rm -r $OUT/p21/peer_logs
timeout $(left 585) python3 -m benchmarks.host_calibration --out $OUT/hc --peer-impls deepspeed_cpu_adam_bf16 \
  torch_clip_grad_norm_bf16 --no-contention > $OUT/d6_hc.log 2>&1
