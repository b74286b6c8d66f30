# Next H200 session, call 2 (about 9 min): #17's chat SFT of a Qwen3-0.6B-shaped model against the same text
# packed plain (loss curves from TensorBoard into chat_sft.png), then #16's update rates with the faster kernel
# (slidedp_cpu_adam_v4) at 4/8/16 threads. Carry: .whl. Run: bash benchmarks/results/next-h200/call2.sh
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
timeout $(left 420) python3 -m benchmarks.chat_sft --out $OUT/sft > $OUT/c2_sft.log 2>&1
timeout $(left 585) python3 -m benchmarks.compact_state rates --threads 4 8 16 --params 64000000 --repeats 5 \
  --states fp32 fp32+bf16 fp32+int8 bf16+bf16 bf16+int8 --out $OUT/rates > $OUT/c2_rates.log 2>&1
pack_runs c2_runs.tgz $OUT
