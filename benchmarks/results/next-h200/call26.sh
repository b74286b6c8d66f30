# Device call (about 3 min): (1) the one-pass kernel with threads claiming 65,536-element runs (v7, OpenMP's
# dynamic schedule) against the equal shares it replaces (v6, built from the previous revision's source), on the
# same tensors, alternating (benchmarks.kernel_ab), bf16+int8 and fp32 at 16 threads; (2)
# benchmarks.update_spread with v7 (per-vCPU rates alone, all-busy share); (3) Qwen3-4B batch 1 bf16+int8 steps
# with v7; (4) the GPU test's layer (#19's 11.9%) with `--live` naming the backward's C++ operators.
# Prediction written before (benchmarks/RESULTS.md "Fourteenth session"): where this host's vCPUs run unequally
# alone (min / median below 0.8, as c24's 2,295 / 3,346), v7 runs the 16-thread bf16+int8 update >= 1.1x v6;
# where they run alike, within 3% of it.
# Before the call (the device has no git): git show 6b23335:runtime/cpu_adam.py > benchmarks/results/next-h200/cpu_adam_v6.py
# (left untracked; delete it after). Carry .whl. Run: bash benchmarks/results/next-h200/call26.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c26; mkdir -p $O
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/c26_host.txt 2>&1
cp benchmarks/results/next-h200/cpu_adam_v6.py $O/
( python3 -c "import importlib.util as u; s = u.spec_from_file_location('cpu_adam_v6', '$O/cpu_adam_v6.py'); \
m = u.module_from_spec(s); s.loader.exec_module(m); k = m.fused_kernel(); print(k.__file__ if k else m.fused_kernel_error())" \
  > $O/v6_path.txt 2>&1 & python3 -c "from slidedp.runtime.cpu_adam import fused_kernel; print(fused_kernel().__file__)" \
  > $O/v7_path.txt 2>&1; wait )
cat $O/v6_path.txt $O/v7_path.txt > $OUT/c26_ab.log
for state in bf16+int8 fp32; do
  timeout $(left 90) python3 -m benchmarks.kernel_ab "$(tail -1 $O/v6_path.txt)" --params 64000000 --threads 16 \
    --repeats 5 --state $state >> $OUT/c26_ab.log 2>&1
done
timeout $(left 115) python3 -m benchmarks.update_spread --rounds 3 --params 128000000 --out $O/spread > $OUT/c26_spread.log 2>&1
for i in 1; do
  timeout $(left 170) python3 -m slidedp.cli train --model qwen3-4b --data synthetic --seq 4096 --batch 1 --steps 4 \
    --hardware h200-x1 --policy benchmarks/results/next-h200/qwen3-4b-b1-compact-t16.yaml --no-checkpoint \
    --out $O/train$i 2>&1 | grep -E "^done|^predicted|^the CPU update|error" >> $OUT/c26_train.log
done
python3 -c "import json; from tests.builders import TINY; from tests.runtime.test_gpu_layer_memory import SHAPE; \
json.dump(dict(TINY['qwen3'], **SHAPE), open('$O/layer.json', 'w'))" > $OUT/c26_probe.log 2>&1
timeout $(left 205) python3 -m benchmarks.layer_memory_probe --model $O/layer.json --seqs 8192 16384 32768 \
  --tiles 1024 --live --out $O/probe >> $OUT/c26_probe.log 2>&1
pack_runs c26.tgz $O
