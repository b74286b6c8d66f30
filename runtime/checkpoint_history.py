"""The checkpoints of one run directory: which of them a run keeps and where an earlier history goes.

Layout, written once here and read by the trainer, ``--overwrite`` and resume messages alike:

- ``<out>/checkpoint/``: the latest checkpoint (one :mod:`checkpoint_files` directory, or one per host share);
- ``<out>/checkpoint-step<N>/``: older checkpoints ``--keep`` holds beside it, hard links of the files the
  latest had when it was replaced, so keeping one costs no copy of its bytes;
- ``<out>/superseded-after-step<N>[-K]/``: where a resume from an earlier step of the same directory moves the
  first history's later checkpoints, whole, so ``--keep`` and the new run's step names never mix two histories.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from slidedp.errors import SlideDPError
from slidedp.runtime import checkpoint_files
from slidedp.runtime.run_logs import METRICS_FILE, TB_DIR, WANDB_RUN_FILE

LATEST = "checkpoint"
SUPERSEDED = "superseded-after-step"


def latest(out: Path) -> Path:
    """The latest checkpoint of run directory ``out`` (which may not exist yet)."""
    return out / LATEST


def _kept_name(step: int | str) -> str:
    return f"{LATEST}-step{step}"


def kept(out: Path) -> list[tuple[int, Path]]:
    """The checkpoint-step<N> directories beside the latest, as (N, path), oldest first."""
    found = []
    prefix = _kept_name("")
    for p in out.glob(prefix + "*"):
        suffix = p.name[len(prefix):]
        if suffix.isdigit() and p.is_dir():
            found.append((int(suffix), p))
    return sorted(found)


def superseded(out: Path) -> list[Path]:
    """The histories a resume from an earlier step set aside in ``out``."""
    return sorted(p for p in out.glob(SUPERSEDED + "*") if p.is_dir())


def training_history(out: Path) -> list[Path]:
    """What a training run leaves in ``out`` as its history: the latest checkpoint, kept ones, an interrupted
    save's leftovers, set-aside histories, and its logs (metrics, TensorBoard events, the W&B run id). What
    marks ``out`` as a training run's directory, for the trainer (--overwrite removes it, with the step's
    measurement files) and for a simulation, which must not write its files beside it."""
    current = latest(out)
    found = [current] if current.exists() or current.is_symlink() else []
    found += [p for _, p in kept(out)] + checkpoint_files.save_leftovers(current)
    found += superseded(out)
    return found + [p for p in (out / METRICS_FILE, out / TB_DIR, out / WANDB_RUN_FILE) if p.exists() or p.is_symlink()]


def checkpoint_step(directory: Path) -> int | None:
    """The data step a one-host checkpoint directory was saved at (its meta.json); None where unreadable."""
    try:
        return int(checkpoint_files.read_meta(directory / checkpoint_files.META_FILE, str(directory))["data_step"])
    except (SlideDPError, ValueError, KeyError, TypeError):
        return None


def continues_history(out: Path, checkpoint: Path) -> bool:
    """Whether resuming from ``checkpoint`` continues the history of run directory ``out``: a checkpoint in
    it, not one of a history set aside. From elsewhere, ``out`` must not hold another run's checkpoints and
    metrics to mix with: its log and --keep assume one history."""
    try:
        inside = checkpoint.resolve().relative_to(out.resolve())
    except ValueError:
        return False
    return not (inside.parts and inside.parts[0].startswith(SUPERSEDED))


def set_aside_later_checkpoints(out: Path, start_step: int) -> Path | None:
    """A resume from an earlier checkpoint starts a second history in ``out`` at ``start_step``: the first
    history's checkpoints past that step (kept ones and the latest) would otherwise be mixed with the new
    run's, pruned by --keep in place of the checkpoint resumed from, or kept under a step name the new run
    writes again. They are moved, whole and untouched, into <out>/superseded-after-step<N>/; what directory
    that is, or None when there were none."""
    later = [p for step, p in kept(out) if step > start_step]
    step = checkpoint_step(latest(out))
    if step is not None and step > start_step:
        later.append(latest(out))
    if not later:
        return None
    dest, n = out / f"{SUPERSEDED}{start_step}", 1
    while dest.exists():
        n += 1
        dest = out / f"{SUPERSEDED}{start_step}-{n}"
    dest.mkdir()
    os.chmod(dest, 0o700)  # like every checkpoint directory, whatever the umask
    for p in later:
        p.rename(dest / p.name)
    return dest


def keep_aside(out: Path, new_step: int) -> None:
    """Before the latest checkpoint is replaced by the one of ``new_step``: hard-link its files into
    checkpoint-step<N> (no copy of the bytes; the atomic replace then removes only the old names)."""
    current = latest(out)
    step = checkpoint_step(current)
    if step is None or step == new_step:
        return
    aside = out / _kept_name(step)
    if aside.exists():
        return
    tmp = aside.with_name(aside.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    os.chmod(tmp, 0o700)
    for f in current.iterdir():
        try:
            os.link(f, tmp / f.name)
        except OSError:  # a filesystem without hard links
            shutil.copy2(f, tmp / f.name)
    tmp.rename(aside)


def prune(out: Path, older: int) -> None:
    """Keep the ``older`` most recent checkpoint-step<N> directories beside the latest checkpoint."""
    found = kept(out)
    for _, p in found[:max(0, len(found) - older)]:
        shutil.rmtree(p, ignore_errors=True)
