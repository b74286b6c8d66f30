"""Helpers for the notebooks: show a saved figure inline under Jupyter."""

from __future__ import annotations

from pathlib import Path


def show(stem: Path) -> None:
    """Display ``<stem>.png`` inline under IPython/Jupyter; print its path when run as a script."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Image(filename=str(stem.with_suffix(".png"))))
    else:
        print(f"figure: {stem.with_suffix('.png')}")
