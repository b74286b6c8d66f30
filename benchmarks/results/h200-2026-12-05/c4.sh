# 2026-12-05 call 4 (#17, #18), after call 2 ran out of its limit: c2's chat SFT with train's default policy
# (micro-batch 1 x 16, 4 chunks/layer) ran 4.2-4.9 s/step on the H100 (predicted 3.52) and was cut at step 66/200
# before the plain-text run; c2's GPU tests passed 5 before the sigint test was cut (-q, no names). Here: the
# policy tuned for this card at a 56 GiB budget (predicted 1.04 s/step on h100-sxm-x1), 40 steps per run, then
# the sigint / killed-CUDA-rank test alone, verbose.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
O=/tmp/c4; mkdir -p $O
HW=h200-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && HW=h100-sxm-x1
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c4_env.txt 2>&1
python3 -m slidedp.cli tune --model qwen3-0.6b --hardware $HW --seq 2048 --batch 16 --gpu-budget 56 \
  --out $O/policy.yaml > $OUT/c4_tune.log 2>&1
timeout $(left 200) python3 -m benchmarks.chat_sft --hardware $HW --steps 40 --eval-every 10 \
  --policy $O/policy.yaml --out $O/sft > $OUT/c4_sft.log 2>&1
cp $O/sft/results.jsonl $OUT/c4_sft.jsonl 2>/dev/null; cp $O/sft/chat_sft.png $O/sft/chat_sft.md $OUT/ 2>/dev/null
timeout $(left 290) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_ranks.py -k sigint \
  --durations=0 > $OUT/c4_gpu_tests.log 2>&1
pack_runs c4_runs.tgz $O
