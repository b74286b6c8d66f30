# Call 1 (#16): the one-pass CPU update per state mode on the H200 host, then Qwen3-4B with every optimizer state
# on the host, seq 4096, step time per mode at batch 1/4/8 (tuned host-only policy with the mode applied).
source .device/setup.sh
O=/tmp/c1; mkdir -p $O
{ nproc; lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA node\(s\)|L3'; free -g; nvidia-smi -L; } > $OUT/c1_env.txt 2>&1
timeout 200 python3 -m benchmarks.compact_state rates --threads 4 8 16 --params 64000000 --repeats 5 --out $O
timeout $(left 440) python3 -m benchmarks.compact_state steps --batches 1 4 8 --states fp32 bf16+int8 --steps 5 --out $O
timeout $(left 535) python3 -m benchmarks.compact_state steps --batches 1 --states fp32+int8 --steps 5 --out $O
cp $O/results.jsonl $OUT/c1_results.jsonl; pack_runs c1_runs.tgz $O
