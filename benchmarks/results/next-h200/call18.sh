# Device call for #21's last row and the 8B CPU-update slowdown (2026-12-06 fifth session, c14): SlideFormer on
# Qwen3-8B at batch 4 beside SlideDP tuned and host-only, on one machine, with the time SlideFormer's 8B set-up
# needs (its batch-1 run alone took most of c14's 200 s). Predicted before (h200-x1 host, the H100's GPU side):
# SlideFormer 6.118 s. SlideDP's batches now run as fresh `slidedp train` processes (c14's in-process second batch
# updated at half rate; c19 in a fresh process did not). Carry .whl and .peers.
# Run: bash benchmarks/results/next-h200/call18.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c18_env.txt 2>&1
{ lscpu | grep -E "Model name|Model:"; free -g; df -h /tmp; } > $OUT/c18_host.txt 2>&1
# call17's host-only calibration of this machine, if call18 runs on the same warm machine (else h200-x1)
PROFILE=h200-x1; [ -f runs/host-profile.yaml ] && PROFILE=$PWD/runs/host-profile.yaml; echo "profile $PROFILE" >> $OUT/c18_host.txt
timeout $(left 590) python3 -m benchmarks.peer_compare --profile $PROFILE --model qwen3-8b --seq 4096 --batches 4 --steps 3 \
  --systems slideformer slidedp slidedp-host --timeout 330 --batch-timeout 320 --deadline $(left 585) \
  --peer-inputs /tmp/peer_inputs8 --out $OUT/p21f8b > $OUT/c18.log 2>&1
tar czf $OUT/p21f8b_logs.tgz -C $OUT/p21f8b peer_logs 2>/dev/null && rm -r $OUT/p21f8b/peer_logs
