# Device call for #14 (01:05 UTC 2026-12-08): why a step runs its GEMMs ~13-15% faster than the calibration's curve
# prices them (c56's kernels against c65's curves). Qwen3-4B's layer GEMMs at 32768 and 4096 tokens under the
# conditions of benchmarks/gemm_conditions.py. Hypotheses in benchmarks/RESULTS.md ("Predictions for call68").
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
{ nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader; lscpu | grep -E "^Model:"; } > $OUT/c68_env.txt
timeout 400 python3 -m benchmarks.gemm_conditions --out $OUT/c68_gemms.jsonl --tokens 32768 4096 > $OUT/c68.log 2>&1
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/c68_env.txt
for p in h100-sxm-x1 h200-x1; do python3 -m benchmarks.gemm_conditions --compare $OUT/c68_gemms.jsonl --profile $p > $OUT/c68_vs_$p.txt 2>&1; done
tail -3 $OUT/c68.log; head -40 $OUT/c68_vs_h100-sxm-x1.txt
