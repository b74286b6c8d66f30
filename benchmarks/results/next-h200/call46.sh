# Device call for #14 (about 5 min, any H100/H200): the smallest card that holds a GPU-resident step
# (`benchmarks.gpu_fit_probe`: the cap bisected with torch.cuda.set_per_process_memory_fraction), on Qwen3-4B
# (batch 8 ran out of an H100's 79.2 GiB in c42 where the memory model, allocated peak + 2 GiB reserve, says it
# fits) and two models the memory model's checkpoint rule was not fitted to.
# Written before the call (2026-12-07 14:26 UTC, development machine). Allocated peaks the memory model gives
# (GiB): Qwen3-4B 62.8 / 62.8 / 65.5 / 74.0 at batch 1 / 2 / 4 / 8; Qwen3-1.7B shape 37.9 / 48.7 / 70.3 at 8 / 16
# / 32; Llama-3.2-3B shape 53.5 / 61.1 / 76.4 at 4 / 8 / 16. With its 2 GiB reserve every one of them fits an H100.
# Hypothesis from c42 (Qwen3-4B b8: 74.2 allocated on the H200, out of memory with 78.7 usable): under pressure the
# allocator needs 0.3-0.5 x the step's transient bytes (allocated peak minus weights, gradients and moments) on top
# of the allocated peak. It says: Llama-3.2-3B shape batch 16 (transient 28.6 GiB: needs 85-91) and the 1.7B shape
# batch 32 (44.7: needs 84-93) run out of an H100's memory; every other row fits.
# Carry .whl. Run: bash benchmarks/results/next-h200/call46.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:|^CPU\(s\)"; free -g; } \
  > $OUT/c46_env.txt 2>&1
mkdir -p /tmp/c46cfg && python3 -c "
import json; from benchmarks.shape_validation import ARCHS
for n in ('qwen3-1.7b', 'llama3b'): open(f'/tmp/c46cfg/{n}.json', 'w').write(json.dumps(ARCHS[n]))"
P="python3 -m benchmarks.gpu_fit_probe --out $OUT/c46"
timeout $(left 150) $P --model qwen3-4b --batches 1 2 4 8 --deadline 120 > $OUT/c46_qwen3-4b.log 2>&1
timeout $(left 280) $P --model /tmp/c46cfg/llama3b.json --batches 4 8 16 --deadline 110 > $OUT/c46_llama3b.log 2>&1
timeout $(left 420) $P --model /tmp/c46cfg/qwen3-1.7b.json --batches 8 16 32 --deadline 120 > $OUT/c46_q17.log 2>&1
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c46_env.txt
