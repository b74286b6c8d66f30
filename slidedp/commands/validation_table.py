"""What ``slidedp calibrate --from-run`` and ``slidedp validate`` share: reading run directories as records and
showing a predicted-vs-measured table, so both commands print the same columns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
from rich.console import Console
from rich.table import Table

from slidedp.errors import first_few

if TYPE_CHECKING:
    from slidedp.calibration.from_run import RunRecord
    from slidedp.hardware import HardwareProfile


def load_records(paths: list[str]) -> list[RunRecord]:
    """Each run directory as a ``RunRecord`` (imported here, not at module level: it pulls in the simulator)."""
    from slidedp.calibration.from_run import load_record

    return [load_record(p) for p in paths]


def print_warning(line: str) -> None:
    """One ``slidedp: warning:`` line on stderr, unwrapped, unhighlighted and without rich markup (run names
    such as ``run[seed1]`` print as they are): how calibrate and validate say that a result needs reading with
    care."""
    Console(stderr=True).print(f"slidedp: warning: {line}", highlight=False, soft_wrap=True, markup=False)


def cpu_runs_warning(records: list[RunRecord], hw: HardwareProfile) -> str | None:
    """One warning line where runs measured on the CPU are judged against a profile of a GPU host: their errors
    say how far this CPU is from that host, not how good the profile is."""
    cpu = [r.label for r in records if r.measured_on_cpu]
    if not cpu:
        return None
    return (f"{first_few(cpu)} ran on the CPU: {hw.name} prices a GPU host, so these errors measure the difference "
            f"between the two, not the profile")


def more_ranks_warning(records: list[RunRecord], hw: HardwareProfile) -> str | None:
    """One warning line where runs had more ranks than the profile has GPUs: they are predicted on the profile
    widened to that many GPUs (from_run.RunRecord.workload), each added GPU with its own PCIe link and behind no
    switch, which may not be the machine they ran on (several ranks may have shared a GPU)."""
    wide = [r for r in records if r.ranks > hw.num_gpus]
    if not wide:
        return None
    most = max(r.ranks for r in wide)
    return (f"{first_few([r.label for r in wide])} ran {most if len(wide) == 1 else f'up to {most}'} ranks, "
            f"more than {hw.name}'s {hw.num_gpus} GPU(s): predicted as if the machine had a GPU per rank, each with "
            f"its own PCIe link")


def validation_table(title: str, table: pd.DataFrame) -> Table:
    """The rich view of a ``from_run.validate`` table: one row per run."""
    view = Table(title=title)
    view.add_column("run", overflow="fold")  # run names differ at the end (batch, state): never cut them off
    for col in ("measured s", "predicted s", "error %", "limiter (measured / predicted)"):
        view.add_column(col)
    for r in table.itertuples():
        view.add_row(r.label, f"{r.measured_s:.3f}", f"{r.predicted_s:.3f}", f"{r.error_percent:+.1f}",
                     f"{r.measured_limiter} / {r.predicted_limiter}")
    return view
