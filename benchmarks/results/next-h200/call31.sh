# Device call (about 4 min): is a CPU update call's fixed cost (host.update_call_us, fitted as 562 us from c28's four
# chunk counts on another lent host) a property of these hosts? Qwen3-4B batch 1, bf16+int8, every state on the
# host, 16 update threads, at 1, 4, 8 and again 1 chunks a layer (6 steps each, fresh runs); then the GPU test's layer
# at 8K with `--live`, now naming the operators past the allocator's frames (#19).
# Prediction written before (benchmarks/RESULTS.md "Fifteenth session"): step time at 4 and 8 chunks over 1 chunk
# 1.06-1.07 and 1.16-1.18 (h200-x1 and c28's refit, each with 562 us a call); the model without a cost per call:
# 1.00 for both. Carry .whl. Run: bash benchmarks/results/next-h200/call31.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c31; mkdir -p $O
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/c31_host.txt 2>&1
P=benchmarks/results/next-h200/qwen3-4b-b1-compact-t16.yaml
for c in 1 4 8 1; do
  sed "s/chunks_per_layer: 4/chunks_per_layer: $c/" $P > $O/c$c.yaml
  echo "chunks $c" >> $OUT/c31_train.log
  timeout $(left 200) python3 -m slidedp.cli train --model qwen3-4b --data synthetic --seq 4096 --batch 1 --steps 6 \
    --hardware h200-x1 --policy $O/c$c.yaml --no-checkpoint --out $O/c$c-$(date +%s) > $O/c$c.txt 2>&1
  grep -A3 -E "^done" $O/c$c.txt >> $OUT/c31_train.log
done
python3 -c "import json; from tests.builders import TINY; from tests.runtime.test_gpu_layer_memory import SHAPE; \
json.dump(dict(TINY['qwen3'], **SHAPE), open('$O/layer.json', 'w'))" > $OUT/c31_probe.log 2>&1
timeout $(left 240) python3 -m benchmarks.layer_memory_probe --model $O/layer.json --seqs 8192 16384 --tiles 1024 \
  --live --out $O/probe >> $OUT/c31_probe.log 2>&1
pack_runs c31.tgz $O
