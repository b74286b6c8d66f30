"""The host-resident layer-streaming runtime: ``slidedp train`` and the benchmarks run real steps with it.

Master weights and Adam moments live in host memory (one copy shared by every data-parallel rank, in
/dev/shm); compute-dtype layers are streamed to the device chunk by chunk, gradients are copied back and
AdamW runs on the CPU. The same code runs on CUDA (streams, events, pinned memory) and on the CPU (the
tests), see device.py. Entry points: trainer.Trainer (the CLI), engine.StreamingEngine (one step).
"""
