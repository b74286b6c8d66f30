# Next device session (any one GPU, about 9 min): #21's SlideFormer (RegiaYoung/SlideFormer multi_gpu/ at
# e577d1aa, transcribed from the search index and laid out by benchmarks.peer_external_setup; its own CPU Adam is
# JIT-built on the machine) on Qwen3-4B, seq 4096, batch 1-16, beside the 2026-12-06 rows of SlideDP, ZeRO-2-Offload
# and MegaTrain. Predicted before (RESULTS "SlideFormer and MegaTrain", stand-in rate for its Adam): 1.460 / 1.510 /
# 1.670 / 3.053 / 5.818 s at batch 1 / 2 / 4 / 8 / 16. Carry .whl and .peers.
# Run: bash benchmarks/results/next-h200/call8.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c8_env.txt 2>&1
timeout $(left 585) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --steps 3 \
  --systems slideformer --timeout 570 --batch-timeout 170 --deadline 570 \
  --peer-inputs /tmp/peer_inputs --out $OUT/p21s > $OUT/c8.log 2>&1
tar czf $OUT/p21s_logs.tgz -C $OUT/p21s peer_logs 2>/dev/null && rm -r $OUT/p21s/peer_logs
