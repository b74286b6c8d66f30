"""Tables a report or a loaded run reads from files (CSV or parquet): checked on read, so that an emptied,
truncated or hand-edited file is one error line naming the file and what is wrong, never pandas' traceback
from a plot that reads it later."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from slidedp.config_io import quote
from slidedp.errors import SlideDPError


def read_table(path: str | Path, what: str, required: tuple[str, ...], positive: tuple[str, ...] = (),
               numeric: tuple[str, ...] = ()) -> pd.DataFrame:
    """The table at ``path`` with its ``required`` columns present and at least one row; ``positive`` columns
    finite numbers > 0 in every row, ``numeric`` ones numbers (NaN allowed), both converted to numbers."""
    path = str(path)
    try:
        df = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise SlideDPError(f"cannot read {what} {path!r}: {' '.join(str(exc).split())[:200]}") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise SlideDPError(f"{what} {path!r} lacks column(s): {', '.join(missing)}")
    if df.empty:
        raise SlideDPError(f"{what} {path!r} has no rows")
    for column in (*positive, *numeric):
        values = pd.to_numeric(df[column], errors="coerce")
        bad = df[~(values > 0) | ~values.map(math.isfinite)] if column in positive else \
            df[values.isna() & df[column].notna()]
        if not bad.empty:
            kind = "a positive number" if column in positive else "a number"
            raise SlideDPError(f"{what} {path!r}: {column} must be {kind} in every row, got "
                               f"{quote(_plain(bad[column].iloc[0]))} in row {int(bad.index[0]) + 1}")
        df[column] = values
    return df


def _plain(value):
    """A cell as Python has it (numpy's scalars print as ``np.int64(-1)``)."""
    return value.item() if hasattr(value, "item") else value
