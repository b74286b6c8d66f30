"""The trace table: one row per operation, the same for simulated and measured steps.

Reports, exposure analysis and validation read this table only, so they never care whether a step was
simulated or run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from slidedp.errors import SlideDPError

# Trace op names, grouped by the resource category exposure is attributed to.
OP_CATEGORY: dict[str, str] = {
    "h2d_param": "h2d", "h2d_ckpt": "h2d", "h2d_grad": "h2d",
    "d2h_grad": "d2h", "d2h_ckpt": "d2h", "grad_sync": "d2h",
    "allgather": "collective", "reduce_scatter": "collective", "allreduce": "collective",
    "host_allreduce": "collective", "host_reduce_scatter": "collective", "weight_allgather": "collective",
    "cpu_reduce": "cpu", "adam": "cpu", "cast": "cpu", "clip": "cpu",
    "fwd": "compute", "bwd": "compute", "gpu_adam": "compute",
}
EXPOSURE_CATEGORIES: tuple[str, ...] = ("h2d", "d2h", "collective", "cpu", "bubble")

TRACE_COLUMNS: tuple[str, ...] = (
    "rank", "resource", "op", "unit", "chunk", "micro_batch", "start_s", "end_s", "bytes", "flops", "host_bytes",
)
# Traces written before the column was named for what it holds (a unit index: 0 is the embedding).
_RENAMED_COLUMNS = {"layer": "unit"}
_DTYPES = {"rank": "int64", "unit": "int64", "chunk": "int64", "micro_batch": "int64", "start_s": "float64",
           "end_s": "float64", "bytes": "float64", "flops": "float64", "host_bytes": "float64",
           "resource": "str", "op": "str"}


def make_trace(rows: list[tuple]) -> pd.DataFrame:
    """Build a trace from row tuples in TRACE_COLUMNS order."""
    df = pd.DataFrame.from_records(rows, columns=list(TRACE_COLUMNS))
    return df.astype(_DTYPES)


def validate_trace(df: pd.DataFrame) -> pd.DataFrame:
    df = df.rename(columns={old: new for old, new in _RENAMED_COLUMNS.items()
                            if old in df.columns and new not in df.columns})
    missing = [c for c in TRACE_COLUMNS if c not in df.columns]
    if missing:
        raise SlideDPError(f"trace lacks column(s): {', '.join(missing)}")
    if (df["end_s"] < df["start_s"]).any():
        raise SlideDPError("trace has an operation that ends before it starts")
    try:
        df = df[list(TRACE_COLUMNS)].astype(_DTYPES)
    except (TypeError, ValueError) as exc:
        raise SlideDPError(f"trace has a column of the wrong type: {exc}") from None
    if df.empty:
        raise SlideDPError("trace holds no operations")
    if not np.isfinite(df[["start_s", "end_s"]].to_numpy(dtype=float)).all():
        raise SlideDPError("trace has an operation without a finite start and end time")
    return df


def load_trace(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    try:
        if path.suffix == ".parquet":
            df = pd.read_parquet(path)
        elif path.suffix == ".json":
            df = from_chrome_trace(json.loads(path.read_text()))
        else:
            df = pd.read_csv(path)
    except (OSError, ValueError, TypeError) as exc:
        raise SlideDPError(f"cannot read trace {str(path)!r}: {exc}") from None
    return validate_trace(df)


TRACE_SUFFIXES = (".json", ".csv", ".parquet")  # Chrome trace JSON (Perfetto), CSV, parquet


def save_trace(df: pd.DataFrame, path: str | Path) -> None:
    """CSV, parquet, or Chrome trace JSON (open in Perfetto) by suffix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(to_chrome_trace(df)))
    elif path.suffix == ".parquet":
        df.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        raise SlideDPError(f"trace file {str(path)!r}: use a {' or '.join(TRACE_SUFFIXES)} suffix (.json opens in "
                           f"Perfetto)")


def to_chrome_trace(df: pd.DataFrame) -> dict:
    """Chrome trace-event JSON: one process per rank, one thread per resource; rows ride in ``args``."""
    events = []
    tids: dict[tuple[int, str], int] = {}
    for row in df.itertuples(index=False):
        key = (int(row.rank), row.resource)
        if key not in tids:
            tids[key] = len(tids)
            events.append({"ph": "M", "name": "thread_name", "pid": int(row.rank), "tid": tids[key],
                           "args": {"name": row.resource}})
        name = row.op if row.unit < 0 else f"{row.op} U{row.unit}" + (f".c{row.chunk}" if row.chunk >= 0 else "")
        events.append({
            "ph": "X", "name": name, "cat": row.op, "pid": int(row.rank), "tid": tids[key],
            "ts": row.start_s * 1e6, "dur": (row.end_s - row.start_s) * 1e6,
            "args": {c: (v.item() if hasattr(v, "item") else v) for c, v in zip(TRACE_COLUMNS, row, strict=True)},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def from_chrome_trace(data: object) -> pd.DataFrame:
    """The rows of a Chrome trace that SlideDP wrote (:func:`to_chrome_trace`: every column in each complete
    event's ``args``). A profiler's trace (torch.profiler, Nsight export) lacks those columns: ValueError naming
    the first event that does, so the caller can say so in one line."""
    events = data.get("traceEvents") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise ValueError("not a Chrome trace (a JSON object whose traceEvents is a list)")

    absent = object()

    def column(args: dict, name: str):
        if name in args:
            return args[name]
        old = next((o for o, n in _RENAMED_COLUMNS.items() if n == name and o in args), None)
        return absent if old is None else args[old]

    rows = []
    for i, event in enumerate(events):
        if not isinstance(event, dict):
            raise ValueError(f"traceEvents[{i}] is not an object")
        if event.get("ph") != "X":
            continue
        args = event.get("args")
        row = tuple(column(args, c) for c in TRACE_COLUMNS) if isinstance(args, dict) else (absent,) * len(
            TRACE_COLUMNS)
        missing = [c for c, v in zip(TRACE_COLUMNS, row, strict=True) if v is absent]
        if missing:
            raise ValueError(f"traceEvents[{i}] ({event.get('name', '?')!s:.40}) lacks {', '.join(missing)} in its "
                             "args: only traces SlideDP wrote (train or simulate --trace) can be read")
        rows.append(row)
    return make_trace(rows)


def busiest_resource(trace: pd.DataFrame) -> str:
    """The resource busy for the longest time in a trace (overlapping operations on it counted once): what a
    measured run reports as its busiest resource, the counterpart of the simulator's bottleneck."""
    if trace.empty:
        return ""
    busy: dict[str, float] = {}
    for resource, ops in trace.groupby("resource"):
        total, end = 0.0, float("-inf")
        for start, stop in sorted(zip(ops.start_s, ops.end_s, strict=True)):
            if stop > end:
                total += stop - max(start, end)
                end = stop
        busy[str(resource)] = total
    return max(busy, key=busy.get)

