# Device call (about 8 min; after call17 on the same warm machine): #16's three Qwen3-4B targets on one more host,
# now predicted with that host's own CPU rates (call17's `slidedp calibrate --host-only`, runs/host-profile.yaml;
# h200-x1 if absent). The update rates first, then SlideDP host-only bf16+int8 and fp32 and ZeRO-2-Offload at
# batch 1, 4, 8 in one invocation, each SlideDP batch a fresh `slidedp train` run. The four hosts measured so far
# gave bf16+int8 batch 1 in 0.897 / 1.220 / 0.914 / 1.145 s and 1.80x / - / 1.84x / 2.32x ZeRO-2-Offload.
# Carry .whl. Run: [BUDGET=600] bash benchmarks/results/next-h200/call20.sh
source benchmarks/results/h200-2026-12-04/setup.sh
PROFILE=h200-x1; [ -f runs/host-profile.yaml ] && PROFILE=$PWD/runs/host-profile.yaml
{ lscpu | grep -E "Model name|Model:"; echo "profile $PROFILE"; } > $OUT/c20_host.txt 2>&1
timeout $(left 60) python3 -m benchmarks.compact_state rates --threads 16 --params 64000000 --repeats 3 \
  --states fp32 bf16+int8 --out /tmp/c20rates > $OUT/c20_rates.log 2>&1
B=${BUDGET:-600}  # seconds the call may take (less where little device time is left)
timeout $(left $((B - 15))) python3 -m benchmarks.peer_compare --profile $PROFILE --model qwen3-4b --seq 4096 \
  --batches 1 4 8 --steps 3 --systems slidedp-compact deepspeed-offload slidedp-host --slidedp-gpu-budget 68 \
  --timeout 240 --deadline $(left $((B - 20))) --out $OUT/p16h > $OUT/c20.log 2>&1
