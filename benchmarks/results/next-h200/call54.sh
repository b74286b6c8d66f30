# Device call for #14 (twentieth session), right after call53 on the same H200 (written 2026-12-07 19:05 UTC, before
# either call). FSDP2 + CPUOffloadPolicy and GPU-resident, Qwen3-4B (tied), seq 4096, batch 1 2 4 8, predicted from
# call53's host calibration (copied to benchmarks/results/h200-2026-12-07/c53/host.yaml between the calls;
# predictions.json before the runs). Hypothesis: every row within 10% (#14's target). The H200 history: FSDP2-offload
# batch 1 measured 4.04-4.96 s over three sessions, GPU-resident batch 8 under-predicted by 8.6-10.2%.
# Needs an H200 (run with needs_h200). Carry .whl. Run: bash benchmarks/results/next-h200/call54.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c54_env.txt 2>&1
V="python3 -m benchmarks.peer_validation --steps 3 --no-contention --phases --calibrate none"
V="$V --base benchmarks/results/h200-2026-12-07/c53/host.yaml"
timeout $(left 330) $V --out $OUT/c54/fsdp2 --systems fsdp2-offload --batches 1 2 4 8 --deadline 320 --timeout 320 \
  > $OUT/c54_fsdp2.log 2>&1
timeout $(left 560) $V --out $OUT/c54/resident --systems resident --batches 1 2 4 8 --deadline 200 --timeout 200 \
  > $OUT/c54_resident.log 2>&1
rm -rf $OUT/c54/*/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c54_env.txt
