# Next device session (any one GPU, about 7 min; #21's last rows): SlideFormer on Qwen3-8B at batch 1 and 4 on the
# same machine as SlideDP (host-only, tuned) and MegaTrain at batch 4. On 2026-12-06 (fourth session) SlideFormer's
# batch 1 ran on a machine of its own (2.775 s, host RSS 109.1 GiB) and MegaTrain/SlideDP on another. Predicted
# before (h200-x1's host with the H100's GPU side): SlideFormer 3.193 / 6.118 s, 96.1 / 99.5 GiB of host memory.
# ZeRO-2-Offload is left out: 232.7 GiB of host memory predicted on a 125.8 GiB host.
# Carry .whl and .peers. Run: bash benchmarks/results/next-h200/call14.sh
source benchmarks/results/h200-2026-12-04/setup.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/c14_env.txt 2>&1
timeout $(left 590) python3 -m benchmarks.peer_compare --model qwen3-8b --seq 4096 --batches 1 4 --steps 3 \
  --systems slideformer slidedp-host slidedp megatrain --timeout 200 --batch-timeout 150 --deadline $(left 585) \
  --peer-inputs /tmp/peer_inputs8 --out $OUT/p21f8 > $OUT/c14.log 2>&1
tar czf $OUT/p21f8_logs.tgz -C $OUT/p21f8 peer_logs 2>/dev/null && rm -r $OUT/p21f8/peer_logs
