# Device call (about 5 min, an H100 or H200 machine): why the compact update runs at 6 or at 12 G params/s at 16
# threads on one machine (#16), and the GPU test of a tiled layer's working set that missed by 11.9% (#19).
# Hypothesis written before (benchmarks/RESULTS.md "Fourteenth session"): the hypervisor gives each busy vCPU
# about half a physical core when all 16 are busy and its neighbours are busy too, so (1) in
# benchmarks.update_spread's rounds the bf16+int8 rate at 16 threads follows the all-busy core share (about 6-7
# G/s where the share is about 0.5-0.6, about 11-13 where it is above 0.9), while 8 threads and the
# bandwidth-bound fp32 update vary much less; (2) in a training step (Qwen3-4B, batch 1, bf16+int8) 14 update
# threads leave a core to the trainer's thread and run the update no slower than 16.
# Carry .whl. Run: bash benchmarks/results/next-h200/call24.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c24; mkdir -p $O runs
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu; free -g; \
  ls "$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')/lib" | grep -i omp; } > $OUT/c24_host.txt 2>&1
timeout $(left 150) python3 -m benchmarks.update_spread --rounds 12 --params 128000000 --out $O/spread \
  > $OUT/c24_spread.log 2>&1
i=0
for t in 16 14 16 14; do
  i=$((i + 1))
  timeout $(left 330) python3 -m slidedp.cli train --model qwen3-4b --data synthetic --seq 4096 --batch 1 --steps 4 \
    --hardware h200-x1 --policy benchmarks/results/next-h200/qwen3-4b-b1-compact-t$t.yaml --no-checkpoint --out $O/train$i-t$t \
    2>&1 | grep -E "^done|^predicted|^step|error" | sed "s/^/threads $t: /" >> $OUT/c24_train.log
done
python3 -c "import json; from tests.builders import TINY; from tests.runtime.test_gpu_layer_memory import SHAPE; \
json.dump(dict(TINY['qwen3'], **SHAPE), open('$O/layer.json', 'w'))" > $OUT/c24_probe.log 2>&1
timeout $(left 400) python3 -m benchmarks.layer_memory_probe --model $O/layer.json --seqs 8192 16384 --tiles 1024 0 \
  --live --out $O/probe >> $OUT/c24_probe.log 2>&1
timeout $(left 420) python3 -m benchmarks.update_spread --rounds 4 --params 128000000 --out $O/spread2 \
  > $OUT/c24_spread2.log 2>&1
pack_runs c24.tgz $O
