# Device call for #14, written 2026-12-07 20:15 UTC (twentieth session) for the next session, before any run.
# FSDP2-offload with the model of 2026-12-07 (its copies wait for the previous layer's pass; predicted from c53's
# H200 host calibration: batch 1 4.227 s, batch 8 6.646 s, forward 0.406 / 1.050, backward 0.678 / 2.453, clip
# 2.113 at both). The remaining error is the CPU clip: in c54's steps 1.67-1.95 s (2.1-2.4 G params/s) against the
# calibration's 64-piece benchmark of 2^27 parameters (1.67-2.20 G/s between two calibrations of one host).
# 1. The clip benchmark (calibration.peer_bench's worker, 16 threads) at the calibration's size (2^27, three times)
#    and at Qwen3-4B's (2^32, twice): does size explain the gap?
# 2. FSDP2-offload, the tied Qwen3-4B, batch 1 and 8, phases, predicted from c53's profile (predictions.json before
#    the runs; the comparison prints predicted beside measured phases).
# Hypotheses: forward and backward within 10% at both batches; the in-step clip within 10% of the 2^32 benchmark's
# rate (refuted if the 2^27 and 2^32 rates differ by less than 5% while the step's clip is still 10% faster).
# Needs an H200 (needs_h200; on an H100 use benchmarks/results/h100-2026-12-07h/c49/host_a.yaml). Carry .whl.
# Run: bash benchmarks/results/next-h200/call57.sh
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c57_env.txt 2>&1
mkdir -p $OUT/c57
for params in 134217728 134217728 134217728 4294967296 4294967296; do
  OMP_NUM_THREADS=16 timeout $(left 200) python3 -m slidedp.calibration.peer_bench --impl torch_clip_grad_norm \
    --threads 16 --params $params --repeats 3 >> $OUT/c57/clip.jsonl 2>> $OUT/c57_clip.log
done
echo "clip done at $(( $(date +%s) - T0 )) s" >> $OUT/c57_env.txt
timeout $(left 470) python3 -m benchmarks.peer_validation --out $OUT/c57/fsdp2 --calibrate none \
  --base benchmarks/results/h200-2026-12-07/c53/host.yaml --systems fsdp2-offload --batches 1 8 --steps 4 \
  --no-contention --phases --deadline 250 --timeout 250 > $OUT/c57_fsdp2.log 2>&1
rm -rf $OUT/c57/fsdp2/peers
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c57_env.txt
