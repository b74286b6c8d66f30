"""Where a run's numbers go: metrics.csv always, plus TensorBoard event files (default) or Weights & Biases.

One ``RunLog`` per run (rank 0 writes, the others hold a null log). metrics.csv has one row per step and
the eval columns filled on the steps that evaluated; TensorBoard gets the same numbers as scalars under
``train/``, ``eval/`` and ``perf/`` (x axis: the global optimizer step), in ``<out>/tensorboard``.
W&B is used only when asked for and installed; without a key or network it runs offline (its files in
``<out>/wandb``, synced later with ``wandb sync``). The W&B run's id is kept in ``<out>/wandb-run-id`` so that
an online resume continues the same W&B run; where it cannot (see :func:`wandb_continuation`) the resume logs
to a new W&B run and says why.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
from pathlib import Path

from slidedp.errors import SlideDPError

LOGGERS = ("tensorboard", "wandb", "none")
COLUMNS = ("step", "loss", "grad_norm", "lr", "skipped", "step_time_s", "tokens_per_s", "gpu_peak_gib",
           "host_rss_gib", "eval_loss", "eval_ppl")
METRICS_FILE = "metrics.csv"
TB_DIR = "tensorboard"
WANDB_RUN_FILE = "wandb-run-id"


def check_logger(kind: str) -> None:
    """Refuse an unknown or uninstalled logger before anything is allocated."""
    if kind not in LOGGERS:
        raise SlideDPError(f"--log must be one of {', '.join(LOGGERS)}, got {kind!r}")
    if kind == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise SlideDPError("--log tensorboard needs the tensorboard package (pip install tensorboard), "
                           "or use --log none")
    if kind == "wandb" and importlib.util.find_spec("wandb") is None:
        raise SlideDPError("--log wandb was asked for but wandb is not installed (pip install wandb), "
                           "or use --log tensorboard")


def _rows(path: Path, keep) -> list[list[str]]:
    """The rows of an earlier metrics.csv whose step passes ``keep``, in the current column order (a column
    the earlier file lacks is left empty)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [[row.get(c) or "" for c in COLUMNS] for row in rows
            if (row.get("step") or "").isdigit() and keep(int(row["step"]))]


def _write_rows(path: Path, rows: list[list[str]]) -> None:
    """A metrics file of ``rows`` under the header, written beside ``path`` and renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def copy_rows_after(path: Path, step: int, dest: Path) -> None:
    """Copy the rows of ``path`` past ``step`` into a new metrics file ``dest``: the log of a history a
    resume from an earlier step sets aside with its checkpoints (the new run's log drops them)."""
    if path.exists():
        _write_rows(dest, _rows(path, lambda s: s > step))


def wandb_continuation(out: Path, resume_step: int | None, last_logged: int | None, project: str,
                       online: bool) -> tuple[str | None, str]:
    """The W&B run a run in ``out`` continues (None: a new one) and, for a resume that cannot continue it, why.
    A fresh run starts a new W&B run. A resume continues the earlier W&B run (``<out>/wandb-run-id``) when
    metrics.csv shows no step logged past ``resume_step`` (W&B keeps the first value of a step and cannot
    drop logged steps), the project is the same, and the run is online (W&B does not resume offline runs:
    it would start a second offline run of the same id, and syncing both would overwrite the first)."""
    if resume_step is None:
        return None, ""
    try:
        earlier_project, _, earlier_id = (out / WANDB_RUN_FILE).read_text().strip().rpartition("/")
    except OSError:
        earlier_project, earlier_id = "", ""
    if not earlier_id:
        return None, f"{out} holds no earlier W&B run to continue"
    if last_logged is not None and last_logged > resume_step:
        past = f"step {last_logged}" if last_logged == resume_step + 1 else f"steps {resume_step + 1}-{last_logged}"
        return None, (f"metrics.csv held {past} past the checkpoint, which W&B run {earlier_id} may hold and "
                      f"cannot drop: a new W&B run")
    if earlier_project != project:
        return None, f"run {earlier_id} is in project {earlier_project!r}, this one in {project!r}: a new W&B run"
    if not online:
        return None, (f"W&B does not resume offline runs: a new run beside {earlier_id}; `wandb sync` uploads "
                      f"both")
    return earlier_id, ""


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else float("inf")


class RunLog:
    """``resume_step``: the optimizer step a resumed run starts after (None for a fresh run). The earlier
    history up to that step is kept; rows and TensorBoard events past it came from work the checkpoint does
    not hold (a run killed after its last save, or a resume from an older checkpoint) and are dropped, so that
    no step has two values in a log."""

    def __init__(self, out: Path, kind: str, resume_step: int | None, config: dict | None = None,
                 active: bool = True, log=print):
        self.active = active
        self._csv = self._tb = self._wandb = None
        if not active:
            return
        path = out / METRICS_FILE
        earlier = _rows(path, lambda step: True) if resume_step is not None and path.exists() else []
        kept = [row for row in earlier if int(row[0]) <= resume_step]
        last_logged = max((int(row[0]) for row in earlier), default=None)
        if kind == "wandb":
            project = os.environ.get("WANDB_PROJECT", "slidedp")
            mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
            earlier_id, why_new = wandb_continuation(out, resume_step, last_logged, project, mode == "online")
        if len(kept) < len(earlier):
            # The earlier W&B run may hold the steps this resume redoes: it is never continued, whichever log
            # this run writes, so a retry of the resume (whose metrics.csv no longer shows them) cannot either.
            (out / WANDB_RUN_FILE).unlink(missing_ok=True)
        _write_rows(path, kept)  # atomically: a kill here leaves the old file or the new one, never a cut one
        self._fh = open(path, "a", newline="")  # noqa: SIM115 - closed in close()
        self._csv = csv.writer(self._fh)
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(log_dir=str(out / TB_DIR), purge_step=purge)
        elif kind == "wandb":
            self._wandb = self._start_wandb(out, project, mode, earlier_id, resume_step, config)
            where = f"in {out / 'wandb'}"
            if earlier_id:
                log(f"wandb: {mode} run {earlier_id} continued from step {resume_step + 1}, {where}")
            else:
                log(f"wandb: {mode} run {self._wandb.id} {where}" + (f" ({why_new})" if why_new else ""))

    @staticmethod
    def _start_wandb(out: Path, project: str, mode: str, earlier_id: str | None, resume_step: int | None,
                     config: dict | None):
        """The W&B run, its id written to ``<out>/wandb-run-id`` before it starts (a run that fails to start
        leaves an id that holds no step, which a retry may continue). A failure is one line, not W&B's
        traceback."""
        import wandb

        run_id = earlier_id or wandb.util.generate_id()
        (out / WANDB_RUN_FILE).write_text(f"{project}/{run_id}\n")
        # A continued run keeps its name; a new run of a resume says where it starts.
        name = None if earlier_id else out.name if resume_step is None else f"{out.name}-from-step{resume_step + 1}"
        try:
            return wandb.init(project=project, dir=str(out), mode=mode, config=config or {}, name=name, id=run_id,
                              resume="allow")
        except Exception as exc:  # noqa: BLE001 - W&B raises many types (network, auth, a deleted run id)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SlideDPError(f"--log wandb: W&B run {run_id} could not start ({first}); use --log tensorboard, "
                               f"or remove {out / WANDB_RUN_FILE} to start a new W&B run") from None

    def step(self, row: dict) -> None:
        if not self.active:
            return
        self._csv.writerow([row.get(c, "") for c in COLUMNS])
        self._fh.flush()
        step = int(row["step"])
        scalars = {"train/loss": row["loss"], "train/grad_norm": row["grad_norm"], "train/lr": row["lr"],
                   "perf/tokens_per_s": row["tokens_per_s"], "perf/step_time_s": row["step_time_s"]}
        if row.get("eval_loss", "") != "":
            scalars.update({"eval/loss": row["eval_loss"], "eval/perplexity": row["eval_ppl"]})
        self._scalars(scalars, step)

    def _scalars(self, values: dict, step: int) -> None:
        values = {k: float(v) for k, v in values.items()}
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def close(self) -> None:
        if not self.active:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
