# Device call (about 4 min): why c14's tuned Qwen3-8B batch-4 plan (15 GPU-held units, activations offloaded)
# updated on the CPU at 1.65 G params/s against 3.20 for the host-only plan on the same host (2026-12-06 fifth
# session, RESULTS "Eleventh session's device calls"). The same plan, then the same with activation recompute,
# with vmstat and /proc/meminfo sampled every second: if the offload plan again updates at half rate, and the
# host's free memory or kswapd's CPU time tell the two apart, the tuner needs a host-memory headroom rule.
# Carry .whl. Run: bash benchmarks/results/next-h200/call19.sh
source benchmarks/results/h200-2026-12-04/setup.sh
{ lscpu | grep -E "Model name|Model:"; free -g; } > $OUT/c19_host.txt 2>&1
for a in offload recompute; do
  vmstat -t 1 > $OUT/c19_vmstat_$a.txt 2>&1 & V=$!
  ( while sleep 2; do grep -E "MemFree|MemAvailable|Cached|Mlocked|AnonHugePages" /proc/meminfo | tr -s ' ' \
      | paste -sd' '; done ) > $OUT/c19_meminfo_$a.txt 2>&1 & M=$!
  timeout 88 python3 -m slidedp.cli train --model qwen3-8b --data synthetic --seq 4096 --batch 4 \
    --policy benchmarks/results/next-h200/c19-$a-b4.yaml --steps 4 --hardware h200-x1 --device auto \
    --no-checkpoint --out /tmp/c19/$a --log none > $OUT/c19_$a.log 2>&1
  kill $V $M 2>/dev/null
done
pack_runs c19_runs.tgz /tmp/c19
