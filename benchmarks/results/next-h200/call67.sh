# Device call for #14 (00:50 UTC 2026-12-08, same H100): why a full `slidedp calibrate` with the queued Timer did not
# finish in 305 s (c61; c59 with the old Timer: 203 s). The same command with every thread's stack dumped each 10 s.
source benchmarks/results/h200-2026-12-04/setup.sh
export OUT
BASE=h100-sxm-x1; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && BASE=h200-x1
timeout 330 python3 -c "
import faulthandler, sys, time
f = open('$OUT/stacks.txt', 'w')
faulthandler.dump_traceback_later(10, repeat=True, file=f)
from slidedp.cli import main
t = time.time()
rc = main(['calibrate', '--base', '$BASE', '--out', '$OUT/full.yaml'])
print('calibrate rc', rc, 'in', round(time.time() - t, 1), 's')
" > $OUT/calibrate.log 2>&1
echo "done at $(( $(date +%s) - T0 )) s" >> $OUT/calibrate.log; tail -5 $OUT/calibrate.log
