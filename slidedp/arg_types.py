"""Argument types of the command line: each parses one value and rejects it with the one-line message argparse
turns into ``slidedp: error: ...`` (exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def _number(text: str, cast: Callable[[str], float], ok: Callable[[float], bool], expected: str):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda v: v > 0, "a positive number")


def fraction(text: str) -> float:
    return _number(text, float, lambda v: 0 <= v < 1, "a number in [0, 1)")
