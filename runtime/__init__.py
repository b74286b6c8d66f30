"""The host-resident streaming runtime behind ``slidedp train``.

``trainer`` checks the inputs and runs the loop; ``engine`` streams one step's units through the GPU while
``updates`` / ``cpu_adam`` apply AdamW on the host state (``host_state``) and ``gpu_state`` on GPU-held units;
``hf_adapter`` maps a Hugging Face model onto streamable units, ``data`` feeds it, ``tracing`` records each
operation in the simulator's trace schema, and ``comm`` / ``device`` hide the one-rank and CPU cases.
"""
