# Device call (about 6 min, timeout 420): #16's two fine-tunes never run on a GPU host, fp32+bf16 and bf16+bf16,
# with the settings of 2026-12-04's fp32 / fp32+int8 / bf16+int8 runs (h200-2026-12-04/c3.sh, c4.sh): Qwen3-0.6B
# shape, seed 0, seq 512, batch 8, 300 steps, lr 3e-4, held-out loss every 50 steps on the Python standard
# library sources of the device host. Expectation written before (the CPU tests hold both within 2% of torch's
# AdamW on a small model; 2026-12-04's 8-bit modes ended +0.05% / +0.07% over fp32's 1.5751): each within 1%.
# Carry .whl. Run: [BUDGET=<s, default 400>] bash benchmarks/results/next-h200/call32.sh [modes, default fp32+bf16 bf16+bf16]
# (about 3 min a mode)
source benchmarks/results/h200-2026-12-04/setup.sh
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/c32_host.txt 2>&1
timeout $(left ${BUDGET:-400}) python3 -m benchmarks.compact_state finetune --states ${@:-fp32+bf16 bf16+bf16} --seq 512 --batches 8 \
  --micro-batch 8 --steps 300 --eval-every 50 --out /tmp/ft32 > $OUT/c32.log 2>&1
cp /tmp/ft32/results.jsonl $OUT/c32_ft.jsonl; cp /tmp/ft32/finetune.md $OUT/c32_finetune.md
for d in /tmp/ft32/runs/finetune-*/; do cp $d/metrics.csv $OUT/c32_$(basename $d | tr '+' 'p').csv; done
