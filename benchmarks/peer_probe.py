"""Run another project's training script as ``python SCRIPT ARGS`` would, and print its process's peak GPU memory and
peak host RSS when it exits, so `benchmarks.peer_external` measures every external peer the same way without
touching its code.

    python benchmarks/peer_probe.py SCRIPT [ARGS ...]

The last line it prints (also after an exception or ``sys.exit``) is ``PEER_PROBE {json}`` with
``gpu_peak_gib`` (``torch.cuda.max_memory_allocated`` of the current device, NaN where CUDA was never used) and
``host_rss_peak_gib`` (VmHWM). It imports nothing from SlideDP, so the peer's imports resolve as they would
when it runs alone (the script's folder first on ``sys.path``).
"""

from __future__ import annotations

import atexit
import json
import math
import runpy
import sys
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


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: peer_probe.py SCRIPT [ARGS ...]", file=sys.stderr)
        sys.exit(2)
    script = Path(sys.argv[1]).resolve()
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path[0] = str(script.parent)
    atexit.register(report)
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
