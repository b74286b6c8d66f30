# Device call (about 4 min, after call24 on the same warm machine): #14's contention experiments held out on a
# fresh host, with the CPU-pass DRAM weight now fitted through the simulator (calibration.profile_fit
# .fit_cpu_dram_weight). `--calibrate-first` measures this host's calibration set (AdamW curve, the pass alone and
# with H2D / D2H / both at 16 threads, the copies alone and during the pass), fits the profile, writes the
# predictions of the held-out experiments (thread counts 14, 10, 4, 3: none used before) and only then measures
# them. Target (#14): each within 10%. Re-predicting c23's held-out set with the new rule (not blind: those values
# had been seen) gave 17 of 22.
# Carry .whl. Run: bash benchmarks/results/next-h200/call25.sh [thread counts, default 14 10 4 3]
# (C=<tag> names the outputs, default c25: call33.sh reruns it so)
source benchmarks/results/h200-2026-12-04/setup.sh
C=${C:-c25}; O=/tmp/$C; mkdir -p $O
{ nvidia-smi --query-gpu=name,memory.total --format=csv; lscpu | grep -E "Model name|Model:"; } > $OUT/${C}_host.txt 2>&1
timeout $(left 300) python3 -m benchmarks.contention --out $O/ct --calibrate-first --threads ${@:-14 10 4 3} --repeats 3 \
  > $OUT/${C}_ct.log 2>&1
pack_runs $C.tgz $O
