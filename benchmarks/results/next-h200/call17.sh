# Device call for #19's second part on an H100 80GB (no H200 has started in five sessions): the longest sequence
# for the Qwen3-14B-wide x 8-layer model within 76 GiB of the H100 (hard cap, set_per_process_memory_fraction), one
# step. Predicted before (2026-12-06 fifth session, h200-x1 profile, `python -m benchmarks.long_seq_tiled --layers 8
# --parts whole --whole-gib 76 --max-seq 1048576 --predict-only`): 557,056 tokens, sequence tile 4,096, activations
# offloaded, 223.0 s/step, GPU peak 75.5 GiB (allocated 73.5); on failure it steps down 32,768 tokens (524,288:
# 199.2 s, peak 73.8 GiB at 74 GiB). 256K under the same cap measured 63.6 s against 56.8 predicted (c16).
# Carry .whl. Run: bash benchmarks/results/next-h200/call17.sh
source benchmarks/results/h200-2026-12-04/setup.sh
O=/tmp/c17; mkdir -p $O
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c17_env.txt 2>&1
{ lscpu | grep -E "Model name|Model:"; free -g; } > $OUT/c17_host.txt 2>&1
# This host's CPU rates into a profile for call18 on the same warm machine (runs/ is ignored, so it stays there);
# the long-sequence run below is GPU-bound and keeps h200-x1, with which its prediction was written.
mkdir -p runs && timeout $(left 200) python3 -m slidedp.cli calibrate --host-only --base h200-x1 \
  --out runs/host-profile.yaml > $OUT/c17_calibrate.log 2>&1 && cp runs/host-profile.yaml $OUT/
timeout $(left 575) python3 -m benchmarks.long_seq_tiled --layers 8 --parts whole --whole-gib 76 \
  --max-seq 1048576 --steps 1 --deadline 200 --out $O/whole > $OUT/c17_whole.log 2>&1
cp $O/whole/results.jsonl $OUT/c17_results.jsonl 2>/dev/null
pack_runs c17_runs.tgz $O
