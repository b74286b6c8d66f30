# Call 2 (#16 baseline, #14 held-out): DeepSpeed ZeRO-2-Offload on Qwen3-4B batch 1/4/8 (same machine as call 1),
# then the held-out shapes whose predictions are in RESULTS ("Held-out predictions for the next H200 session").
source .device/setup.sh
O=/tmp/c2; mkdir -p $O
python3 -m benchmarks.zero2_heldout --write-configs /tmp/z2cfg > $O/z2cfg.log 2>&1
pc() { python3 -m benchmarks.peer_compare --systems deepspeed-offload --steps 3 "$@"; }
pc --model qwen3-4b --seq 4096 --batches 1 4 8 --timeout $(left 330) --deadline $(left 330) --out $O/z2-4b
pc --model qwen3-0.6b --seq 4096 --batches 1 4 --timeout $(left 400) --deadline $(left 400) --out $O/z2-06b-s4096
pc --model /tmp/z2cfg/qwen3-1.7b.json --seq 4096 --batches 1 4 --timeout $(left 480) --deadline $(left 480) \
   --out $O/z2-17b-s4096
pc --model /tmp/z2cfg/llama3b.json --seq 4096 --batches 1 4 --timeout $(left 535) --deadline $(left 535) \
   --out $O/z2-llama3b
for d in $O/z2-*; do [ -f $d/results.jsonl ] && sed "s/^/$(basename $d) /" $d/results.jsonl; done > $OUT/c2_results.txt
pack_runs c2_runs.tgz $O
