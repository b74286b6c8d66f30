# Device call (about 2.5 min): (1) benchmarks.update_spread again on another start (is the slow update a host
# property?), with the update's per-thread rate at 1/2/4/8/16 threads; (2) the GPU test's layer (#19's 11.9%)
# with `--live` now naming the C++ operators of the backward's allocations (c24's had no Python frames), at
# 8K/16K/32K tokens, tile 1,024.
# Carry .whl. Run: bash benchmarks/results/next-h200/call26.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c26; mkdir -p $O
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/c26_host.txt 2>&1
timeout $(left 70) python3 -m benchmarks.update_spread --rounds 6 --params 128000000 --out $O/spread > $OUT/c26_spread.log 2>&1
timeout $(left 110) python3 -m benchmarks.compact_state rates --threads 1 2 4 8 16 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 --out $O/rates > $OUT/c26_rates.log 2>&1
python3 -c "import json; from tests.builders import TINY; from tests.runtime.test_gpu_layer_memory import SHAPE; \
json.dump(dict(TINY['qwen3'], **SHAPE), open('$O/layer.json', 'w'))" > $OUT/c26_probe.log 2>&1
timeout $(left 200) python3 -m benchmarks.layer_memory_probe --model $O/layer.json --seqs 8192 16384 32768 \
  --tiles 1024 --live --out $O/probe >> $OUT/c26_probe.log 2>&1
pack_runs c26.tgz $O
