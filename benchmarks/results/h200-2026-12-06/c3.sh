# 2026-12-06 call 3: packed rows through flash's variable-length kernel (--packed-attention varlen, new today)
# against the block-causal mask of 2026-12-05. The GPU test of the kernel first (bf16, against the masked SDPA),
# then the chat SFT of 2026-12-05's c4 (Qwen3-0.6B shape, seq 2048, batch 16, the policy tuned at 56 GiB), 40
# steps each: chat (varlen), chat-mask, text. Expected before (H100, from 2026-12-05: chat with the mask 1.101
# s/step, text 0.917): chat-mask ~1.10, chat ~0.90-0.95 (its attention covers each conversation only, less than a
# plain row), text ~0.92; eval loss of chat and chat-mask within 1% of each other at step 40. Carry .whl.
source benchmarks/results/h200-2026-12-04/setup.sh  # wheels and the project into /tmp, left(), pack_runs
O=/tmp/c3; mkdir -p $O
HW=h200-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && HW=h100-sxm-x1
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c3_env.txt 2>&1
python3 -c "import torch, inspect, torch.nn.attention.varlen as v; print(torch.__version__, inspect.signature(v.varlen_attn))" \
  >> $OUT/c3_env.txt 2>&1
timeout $(left 60) python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/runtime/test_gpu_packed_attention.py \
  > $OUT/c3_gpu_test.log 2>&1
python3 -m slidedp.cli tune --model qwen3-0.6b --hardware $HW --seq 2048 --batch 16 --gpu-budget 56 \
  --out $O/policy.yaml > $OUT/c3_tune.log 2>&1
timeout $(left 400) python3 -m benchmarks.chat_sft --hardware $HW --steps 40 --eval-every 10 \
  --policy $O/policy.yaml --runs chat chat-mask text --out $O/sft > $OUT/c3_sft.log 2>&1
cp $O/sft/results.jsonl $OUT/c3_sft.jsonl 2>/dev/null; cp $O/sft/chat_sft.png $O/sft/chat_sft.md $OUT/ 2>/dev/null
pack_runs c3_runs.tgz $O
