# Device call (about 8 min, timeout 560): #16's three Qwen3-4B targets with the fp32+int8 mode (fp32 master, int8
# moments: the "8-bit moments" alone, ~8 B/param), beside exact fp32 and ZeRO-2-Offload in one
# invocation, 3 steps a batch. bf16+int8 met two targets on four hosts but never the 1.7x rate (1.32x-1.55x on
# model-207 hosts); fp32+int8 updates ~1.2x faster than bf16+int8 (c36's calibration: 9.44 / 7.89 / fp32 5.71
# G params/s at 16 threads, 1.65x fp32).
# Predicted before (c36's host profile; the shipped h200-x1 in brackets): fp32+int8 0.834 / 1.548 / 2.808 s at
# batch 1 / 4 / 8 (0.774 / 1.488 / 2.801); against c20's ZeRO-2-Offload on this host type (2.522 / 3.715 / 5.150 s)
# a geometric mean of 2.4x; the rate ratio 1.6-1.7x (borderline).
# Carry .whl. Run: [BUDGET=500] bash benchmarks/results/next-h200/call36.sh
source benchmarks/results/h200-2026-12-04/setup.sh
{ lscpu | grep -E "Model name|Model:"; nvidia-smi --query-gpu=name --format=csv,noheader; } > $OUT/c37_host.txt 2>&1
timeout $(left 60) python3 -m benchmarks.compact_state rates --threads 16 --params 64000000 --repeats 3 \
  --states fp32 fp32+int8 bf16+int8 --out /tmp/c37rates > $OUT/c37_rates.log 2>&1
B=${BUDGET:-500}
timeout $(left $((B - 15))) python3 -m benchmarks.peer_compare --profile h200-x1 --model qwen3-4b --seq 4096 \
  --batches 1 4 8 --steps 3 --systems slidedp-int8 deepspeed-offload slidedp-host --slidedp-gpu-budget 68 \
  --timeout 240 --deadline $(left $((B - 20))) --out $OUT/p37 > $OUT/c37.log 2>&1
