# Next device session (any one GPU; two calls back to back on the same warm machine, about 9 min each): #21's
# comparison with every system on one machine, Qwen3-4B, seq 4096, batch 1-16 (so far the five systems ran on three
# lent machines that differ 2.3x in CPU speed: RESULTS "Ninth session's device calls"). Part a: the host's CPU
# update rates and core speed first (the compact and exact updates, a CPU matmul, steal time), then SlideDP
# host-only in the compact bf16+int8 state (#16's 2.0x target over ZeRO-2-Offload, now in the same invocation, so
# call12.sh is folded in here), ZeRO-2-Offload, SlideDP host-only (exact fp32, the like-for-like ratio) and SlideDP
# tuned (the tuner now plans within the card's memory). Part b: MegaTrain and SlideFormer. Afterwards, here:
#   python -m benchmarks.peer_compare --collate --out <a>/p21all --include <b>/p21all/results.jsonl
# Carry .whl and .peers. Run: bash benchmarks/results/next-h200/call11.sh a   (then: ... call11.sh b)
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c11_env.txt 2>&1
if [ "$1" = b ]; then
  timeout $(left 590) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --steps 3 \
    --systems megatrain slideformer --timeout 290 --batch-timeout 170 --deadline 580 \
    --peer-inputs /tmp/peer_inputs --out $OUT/p21all > $OUT/c11b.log 2>&1
  tar czf $OUT/p21all_logs.tgz -C $OUT/p21all peer_logs 2>/dev/null && rm -r $OUT/p21all/peer_logs
  exit 0
fi
{ lscpu; grep -m1 MHz /proc/cpuinfo; head -1 /proc/stat; } > $OUT/c11_host.txt 2>&1
timeout $(left 70) python3 -m benchmarks.compact_state rates --threads 16 8 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 --out /tmp/c11rates > $OUT/c11_rates.log 2>&1
timeout $(left 120) python3 -c "
import time, torch
torch.set_num_threads(16); a = torch.randn(4096, 4096); a @ a
t = time.perf_counter(); [a @ a for _ in range(10)]; s = (time.perf_counter() - t) / 10
print(f'CPU fp32 matmul 4096^3 at 16 threads: {2 * 4096**3 / s / 1e12:.2f} TFLOP/s')" >> $OUT/c11_rates.log 2>&1
head -1 /proc/stat >> $OUT/c11_host.txt
timeout $(left 590) python3 -m benchmarks.peer_compare --model qwen3-4b --seq 4096 --batches 1 2 4 8 16 --steps 3 \
  --systems slidedp-compact deepspeed-offload slidedp-host slidedp --timeout 200 --deadline $(left 575) \
  --out $OUT/p21all > $OUT/c11a.log 2>&1
