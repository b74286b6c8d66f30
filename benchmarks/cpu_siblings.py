"""Which vCPUs of this host share a physical core, measured (slidedp.calibration.cpu_topology says how and why).

    python -m benchmarks.cpu_siblings --out DIR [--probe 0 1] [--seconds 0.4]

Writes siblings.json: the guest's own sysfs view, each probed vCPU's rate ratio with every other vCPU busy,
the siblings found, and one vCPU per physical core as a list (call23.sh turns it into OMP_PLACES).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from slidedp.calibration.cpu_topology import probe_layout


def sysfs_siblings(vcpus: list[int]) -> dict[int, str | None]:
    """What the guest's kernel says each vCPU shares a core with (a cloud guest often says: nothing)."""
    out: dict[int, str | None] = {}
    for c in vcpus:
        path = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list")
        out[c] = path.read_text().strip() if path.exists() else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--probe", type=int, nargs="+", default=[0, 1], help="vCPUs to pair with every other")
    parser.add_argument("--seconds", type=float, default=0.4)
    args = parser.parse_args()
    layout = probe_layout(tuple(args.probe), args.seconds)
    for p, row in layout.ratios.items():
        print(f"vCPU {p}: rate with each other vCPU busy / alone: "
              + " ".join(f"{q}:{r:.2f}" for q, r in row.items()), flush=True)
    report = dataclasses.asdict(layout) | {"sysfs_thread_siblings": sysfs_siblings(layout.vcpus),
                                           "describe": layout.describe()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "siblings.json").write_text(json.dumps(report, indent=1))
    print(layout.describe())
    print(f"one vCPU per core: {layout.one_per_core}")


if __name__ == "__main__":
    main()
