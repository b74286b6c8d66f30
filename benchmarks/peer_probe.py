"""Run another project's training script as ``python SCRIPT ARGS`` would, and print its process's peak GPU memory and
peak host RSS when it exits, so `benchmarks.peer_external` measures every external peer the same way without
touching its code.

    python benchmarks/peer_probe.py SCRIPT [ARGS ...]

The last line it prints (also after an exception or ``sys.exit``) is ``PEER_PROBE {json}`` with
``gpu_peak_gib`` (``torch.cuda.max_memory_allocated`` of the current device, NaN where CUDA was never used) and
``host_rss_peak_gib`` (VmHWM). It imports nothing from SlideDP, so the peer's imports resolve as they would
when it runs alone (the script's folder first on ``sys.path``).

With ``PEER_PROBE_SDPA_PADDING_MASK=1`` in the environment, transformers' "sdpa" attention also takes the 2-D
``[batch, keys]`` padding mask that flash-attn 2's path takes: a peer written for flash-attn (MegaTrain hands
that mask to each decoder layer) then runs on a machine without flash-attn, its real tokens attending as with
flash-attn (padded keys masked, causal where the layer is), without a change to the peer's code.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path

MARKER = "PEER_PROBE"


def _peak_rss_gib() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return math.nan


def _gpu_peak_gib() -> float:
    torch = sys.modules.get("torch")  # only if the peer imported it: never initialise CUDA here
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return math.nan
    return torch.cuda.max_memory_allocated() / 2**30


def report() -> None:
    print(f"{MARKER} " + json.dumps({"gpu_peak_gib": _gpu_peak_gib(), "host_rss_peak_gib": _peak_rss_gib()}),
          flush=True)


def sdpa_taking_padding_masks(sdpa: Callable) -> Callable:
    """Wrap transformers' SDPA attention so that a 2-D 0/1 padding mask means what flash-attn 2 makes of it.

    An all-ones mask becomes no mask (SDPA's own causal or full attention, as flash-attn runs unpadded rows); one
    with padding becomes a 4-D boolean mask: the padded keys masked, the causal triangle where the layer is causal
    (bottom-right aligned, as flash-attn's), and the rows of padded queries left unmasked so that no row is
    all-masked (SDPA's kernels can give NaN there; flash-attn gives those rows zeros; the loss reads neither). The
    translation of the last mask is kept, keyed by the tensor, its version (an in-place change) and the shapes,
    so the mask handed to every layer of a step is inspected (one device sync) once a step, not once a layer."""
    import torch

    last: dict = {"key": None, "mask": None}  # the last mask's key and its translation

    def attend(module, query, key, value, attention_mask, *args, **kwargs):
        if attention_mask is not None and attention_mask.dim() == 2:
            causal = kwargs.get("is_causal")
            causal = getattr(module, "is_causal", True) if causal is None else causal
            q, k = query.shape[-2], key.shape[-2]
            shape = (attention_mask._version, q, k, query.device, causal)
            if last["key"] is None or last["key"][0] is not attention_mask or last["key"][1] != shape:
                keep = attention_mask.to(query.device).bool()
                if bool(keep.all()):
                    translated = None
                else:
                    translated = keep[:, None, None, :].expand(-1, 1, q, -1)
                    if causal:
                        translated = translated & torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)
                    translated = translated | ~keep[:, None, k - q:, None]  # padded query rows attend to all
                last.update(key=(attention_mask, shape), mask=translated)
            attention_mask = last["mask"]
        return sdpa(module, query, key, value, attention_mask, *args, **kwargs)

    return attend


def install_sdpa_padding_masks() -> None:
    """Register the wrapper as transformers' "sdpa" attention for every model of this process."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("sdpa", sdpa_taking_padding_masks(sdpa_attention_forward))


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: peer_probe.py SCRIPT [ARGS ...]", file=sys.stderr)
        sys.exit(2)
    script = Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.parent)
    atexit.register(report)
    if os.environ.get("PEER_PROBE_SDPA_PADDING_MASK") == "1":
        install_sdpa_padding_masks()
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
