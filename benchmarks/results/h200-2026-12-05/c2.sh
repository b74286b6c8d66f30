# 2026-12-05 call 2 (#18, #17): the GPU tests not run on 2026-12-03 (after_backward, GPU-held units, SIGINT /
# killed CUDA rank, test_gpu_engine.py), then the chat SFT of a Qwen3-0.6B-shaped model against plain packed text.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
O=/tmp/c2; mkdir -p $O
# the preset for the card this call got (an H100 when no H200 starts): only the printed predictions use it
HW=h200-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && HW=h100-sxm-x1
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c2_env.txt 2>&1
timeout $(left 250) python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/runtime/test_gpu_engine.py \
  tests/runtime/test_gpu_ranks.py -k "engine or after_backward or next_forward-2 or sigint" --durations=0 \
  > $OUT/c2_gpu_tests.log 2>&1
timeout $(left 585) python3 -m benchmarks.chat_sft --hardware $HW --out $O/sft > $OUT/c2_sft.log 2>&1
cp $O/sft/results.jsonl $OUT/c2_sft.jsonl 2>/dev/null; cp $O/sft/chat_sft.png $O/sft/chat_sft.md $OUT/ 2>/dev/null
pack_runs c2_runs.tgz $O
