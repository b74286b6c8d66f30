# Next device session (#21, Qwen3-8B, about 9 min each part; an H200 preferably, whose 139 GiB the predictions
# assume): SlideDP tuned and host-only at batch 1, 4, 16 (part a), then MegaTrain at the same batches (part b, a
# call of its own). ZeRO-2-Offload does not fit the 128 GiB host (232.7 GiB predicted). Predictions written before
# (RESULTS "Qwen3-8B: predictions before the runs"). Carry .whl and .peers.
# Run: bash benchmarks/results/next-h200/call9.sh a   (then: ... call9.sh b)
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c9_env.txt 2>&1
if [ "$1" = b ]; then
  timeout $(left 585) python3 -m benchmarks.peer_compare --model qwen3-8b --seq 4096 --batches 1 4 16 --steps 3 \
    --systems megatrain --timeout 570 --batch-timeout 185 --deadline 570 --peer-inputs /tmp/peer_inputs \
    --out $OUT/p21m8 > $OUT/c9b.log 2>&1
  tar czf $OUT/p21m8_logs.tgz -C $OUT/p21m8 peer_logs 2>/dev/null && rm -r $OUT/p21m8/peer_logs
else
  timeout $(left 585) python3 -m benchmarks.peer_compare --model qwen3-8b --seq 4096 --batches 1 4 16 --steps 3 \
    --systems slidedp slidedp-host --timeout 285 --deadline 575 --out $OUT/p21s8 > $OUT/c9a.log 2>&1
fi
