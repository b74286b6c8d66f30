"""``slidedp clean``: list (and with --remove delete) the shared host state that killed runs left in /dev/shm.

A data-parallel run keeps its state (14-16 bytes per parameter) in /dev/shm; the launcher removes it however
the ranks end, but a launcher killed with SIGKILL cannot. Only the current user's directories whose launcher
process is gone are listed, so a live run's state is never touched.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from slidedp.hardware import GIB


def run_clean(args: argparse.Namespace) -> int:
    from slidedp.runtime.shared_dir import stale_states

    console = Console()
    stale = stale_states()
    if not stale:
        console.print("no stale SlideDP state in /dev/shm")
        return 0
    table = Table(title="SlideDP state of runs whose launcher is gone")
    for col in ("directory", "GiB", "launcher pid", "run directory"):
        table.add_column(col, overflow="fold")
    for s in stale:
        table.add_row(str(s.path), f"{s.bytes / GIB:.2f}", str(s.launcher_pid or "?"), s.out)
    console.print(table)
    total = sum(s.bytes for s in stale) / GIB
    if not args.remove:
        console.print(f"{len(stale)} director{'y' if len(stale) == 1 else 'ies'}, {total:.2f} GiB: "
                      f"`slidedp clean --remove` deletes them")
        return 0
    from slidedp.runtime.shared_dir import SharedDir

    for s in stale:
        SharedDir(s.path).remove()
    console.print(f"removed {len(stale)} director{'y' if len(stale) == 1 else 'ies'}, {total:.2f} GiB")
    return 0
