# Next device session (any one GPU, about 9 min): #16's 2.0x target over ZeRO-2-Offload with kept layers
# (Policy.kept_layers, new on 2026-12-06 fourth session): the tuner now keeps the graphs of as many of the last
# layers as the card leaves room for, which at batch 4 / 8 takes 22 / 10 of Qwen3-4B's 36 recomputed forwards
# out of the step (predicted with h200-x1's host and the H100's GPU side: bf16+int8 1.585 / 3.240 s against
# 1.829 / 3.455 without, RESULTS "Kept layers"). The GPU tests of kept layers and the host's rates first; then
# SlideDP host-only bf16+int8 and fp32 and ZeRO-2-Offload at batch 1, 4, 8 in one invocation (planned within
# 68 GiB: the memory model of kept graphs is new); then the same tuned bf16+int8 policies at batch 4 and 8 with
# kept_layers 0, on the same machine (the A/B). Carry .whl. Run: bash benchmarks/results/next-h200/call13.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c13_env.txt 2>&1
{ lscpu | grep -E "Model name|Model:|NUMA node"; head -1 /proc/stat; } > $OUT/c13_host.txt 2>&1
# First the GPU checks of kept layers: the same losses and weights as the CPU reference, and each kept layer's
# measured GPU memory against the memory model (tests/runtime/test_gpu_engine.py).
timeout $(left 100) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_engine.py \
  > $OUT/c13_gpu_tests.log 2>&1
timeout $(left 60) python3 -m benchmarks.compact_state rates --threads 16 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 --out /tmp/c13rates > $OUT/c13_rates.log 2>&1
timeout $(left 470) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 4 8 --steps 3 \
  --systems slidedp-compact deepspeed-offload slidedp-host --slidedp-gpu-budget 68 --timeout 200 \
  --deadline $(left 465) --out $OUT/p16k > $OUT/c13.log 2>&1
R=$OUT/p16k/slidedp_runs
for b in 4 8; do
  P=$(ls -t $R/qwen3-4b-s4096-b$b-g1-slidedp-compact*.yaml | head -1)   # the last plan (after any retry)
  sed 's/^kept_layers: .*/kept_layers: 0/' $P > /tmp/nokeep-b$b.yaml
  timeout $(left 585) python3 -m slidedp.cli train --model qwen3-4b --data synthetic --seq 4096 --batch $b \
    --policy /tmp/nokeep-b$b.yaml --steps 4 --hardware h200-x1 --device auto --no-checkpoint \
    --out $R/nokeep-b$b --log none >> $OUT/c13_ab.log 2>&1
done
head -1 /proc/stat >> $OUT/c13_host.txt
