"""Argument types of the command line: each parses one value and rejects it with the one-line message argparse
turns into ``slidedp: error: ...`` (exit 2), quoting at most a short prefix of what was given. Integers are
bounded (a 30-digit --seed or --warmup is a mistake) and floats finite."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from slidedp.config_io import MAX_INT, quote


def _number(text: str, cast: Callable[[str], float], ok: Callable[[float], bool], expected: str):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {quote(text)}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {quote(text)}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: 1 <= v <= MAX_INT, f"a positive integer (at most {MAX_INT:.0e})")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: 0 <= v <= MAX_INT, f"an integer >= 0 (at most {MAX_INT:.0e})")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: v > 0 and math.isfinite(v), "a positive finite number")


def fraction(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < 1, "a number in [0, 1)")
