"""A resumed run's logs hold one value per step: what came after the checkpoint is dropped."""

import sys
from pathlib import Path

import pandas as pd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from slidedp.runtime.run_logs import COLUMNS, WANDB_RUN_FILE, RunLog, wandb_continuation


def _log_steps(out, steps, loss, resume_step=None, kind="tensorboard"):
    log = RunLog(out, kind, resume_step=resume_step, log=lambda _: None)
    for step in steps:
        log.step({"step": step, "loss": loss(step), "grad_norm": 1.0, "lr": 1e-3, "skipped": 0,
                  "step_time_s": 0.1, "tokens_per_s": 10.0})
    log.close()


def test_a_resume_drops_the_rows_and_events_past_its_checkpoint(tmp_path):
    _log_steps(tmp_path, range(1, 7), lambda s: 10.0 + s)  # killed after step 6; its last save was step 4
    _log_steps(tmp_path, range(5, 9), lambda s: 20.0 + s, resume_step=4)
    rows = pd.read_csv(tmp_path / "metrics.csv")
    assert list(rows.columns) == list(COLUMNS)
    assert rows.step.tolist() == list(range(1, 9))
    assert rows.loss.tolist() == [11.0, 12.0, 13.0, 14.0, 25.0, 26.0, 27.0, 28.0]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    got = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in got] == list(range(1, 9))
    assert [v for _, v in got][4:] == [25.0, 26.0, 27.0, 28.0]


def test_a_resume_from_an_older_checkpoint_keeps_one_history(tmp_path):
    _log_steps(tmp_path, range(1, 7), lambda s: 1.0 * s, kind="none")
    _log_steps(tmp_path, range(3, 5), lambda s: 100.0 + s, resume_step=2, kind="none")
    rows = pd.read_csv(tmp_path / "metrics.csv")
    assert rows.step.tolist() == [1, 2, 3, 4] and rows.loss.tolist() == [1.0, 2.0, 103.0, 104.0]


def test_a_fresh_run_starts_a_new_file(tmp_path):
    _log_steps(tmp_path, range(1, 4), lambda s: 1.0, kind="none")
    _log_steps(tmp_path, range(1, 3), lambda s: 2.0, kind="none")
    assert pd.read_csv(tmp_path / "metrics.csv").loss.tolist() == [2.0, 2.0]


class _FakeWandb:
    """The part of the wandb module RunLog uses: init's arguments and each run's logged steps are recorded."""

    def __init__(self):
        self.inits, self.logged = [], {}

    def init(self, **kwargs):
        self.inits.append(kwargs)
        fake = self
        run_id = kwargs["id"] or f"run{len(self.inits)}"

        class Run:
            id = run_id

            def log(self, values, step):
                fake.logged.setdefault(run_id, []).append(step)

            def finish(self):
                pass

        return Run()


def test_wandb_continues_its_run_on_a_clean_resume_and_starts_a_new_one_when_steps_would_repeat(
        tmp_path, monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    lines = []

    def log_steps(steps, resume_step=None):
        log = RunLog(tmp_path, "wandb", resume_step=resume_step, log=lines.append)
        for step in steps:
            log.step({"step": step, "loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "skipped": 0, "step_time_s": 0.1,
                      "tokens_per_s": 10.0})
        log.close()

    log_steps(range(1, 5))  # saved at step 4 and ended there
    assert fake.inits[0]["id"] is None and (tmp_path / WANDB_RUN_FILE).read_text().strip() == "run1"
    log_steps(range(5, 9), resume_step=4)  # --resume <out>/checkpoint: the same W&B run goes on
    assert fake.inits[1]["id"] == "run1" and fake.inits[1]["resume"] == "allow"
    assert fake.logged == {"run1": list(range(1, 9))}
    assert "run1 continued from step 5" in lines[-1]
    log_steps(range(7, 9), resume_step=6)  # steps 7-8 were logged already: W&B would keep their first values
    assert fake.inits[2]["id"] is None and fake.inits[2]["name"].endswith("-from-step7")
    assert fake.logged["run3"] == [7, 8] and (tmp_path / WANDB_RUN_FILE).read_text().strip() == "run3"
    assert "logged steps 7-8, after the checkpoint" in lines[-1]
    assert pd.read_csv(tmp_path / "metrics.csv").step.tolist() == list(range(1, 9))


def test_wandb_continuation_rule():
    assert wandb_continuation(Path("/nonexistent"), None, None) == (None, "")
    run_id, why = wandb_continuation(Path("/nonexistent"), 4, 4)
    assert run_id is None and "holds no earlier W&B run" in why
