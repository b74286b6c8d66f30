"""A resumed run's logs hold one value per step: what came after the checkpoint is dropped."""

import sys

import pandas as pd
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from slidedp.errors import SlideDPError
from slidedp.runtime.run_logs import COLUMNS, WANDB_RUN_FILE, RunLog


def _log_steps(out, steps, loss, resume_step=None, kind="tensorboard", lines=None):
    log = RunLog(out, kind, resume_step=resume_step, log=(lambda _: None) if lines is None else lines.append)
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
    """The part of the wandb module RunLog uses: init's arguments and each run's logged steps are recorded;
    ``fail`` makes the next init raise as W&B does when it cannot reach its server."""

    def __init__(self):
        self.inits, self.logged, self.fail, self.ids = [], {}, False, 0
        fake = self

        class util:
            @staticmethod
            def generate_id():
                fake.ids += 1
                return f"id{fake.ids}"

        self.util = util

    def init(self, **kwargs):
        self.inits.append(kwargs)
        if self.fail:
            self.fail = False
            raise RuntimeError("Network error (ConnectTimeout), entering retry loop.\nmore detail")
        fake, run_id = self, kwargs["id"]

        class Run:
            id = run_id

            def log(self, values, step):
                fake.logged.setdefault(run_id, []).append(step)

            def finish(self):
                pass

        return Run()


@pytest.fixture
def wandb_run(tmp_path, monkeypatch):
    """log_steps(steps, resume_step=None, kind="wandb"): one run of RunLog in tmp_path; returns its lines."""
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)

    def log_steps(steps, resume_step=None, kind="wandb"):
        lines = []
        _log_steps(tmp_path, steps, lambda _: 1.0, resume_step=resume_step, kind=kind, lines=lines)
        return lines

    log_steps.fake = fake
    return log_steps


def _id_file(out):
    return (out / WANDB_RUN_FILE).read_text().strip()


def test_wandb_continues_its_run_on_a_clean_resume_and_starts_a_new_one_when_steps_would_repeat(
        tmp_path, wandb_run):
    fake = wandb_run.fake
    wandb_run(range(1, 5))  # saved at step 4 and ended there
    assert fake.inits[0]["id"] == "id1" and _id_file(tmp_path) == "slidedp/id1"
    lines = wandb_run(range(5, 9), resume_step=4)  # --resume <out>/checkpoint: the same W&B run goes on
    assert fake.inits[1]["id"] == "id1" and fake.inits[1]["resume"] == "allow" and fake.inits[1]["name"] is None
    assert fake.logged == {"id1": list(range(1, 9))}
    assert "id1 continued from step 5" in lines[-1]
    lines = wandb_run(range(7, 9), resume_step=6)  # steps 7-8 were logged already: W&B would keep their first values
    assert fake.inits[2]["id"] == "id2" and fake.inits[2]["name"].endswith("-from-step7")
    assert fake.logged["id2"] == [7, 8] and _id_file(tmp_path) == "slidedp/id2"
    assert "metrics.csv held steps 7-8 past the checkpoint" in lines[-1]
    assert pd.read_csv(tmp_path / "metrics.csv").step.tolist() == list(range(1, 9))


def test_a_failed_wandb_start_is_one_line_and_its_retry_never_continues_the_run_holding_later_steps(
        tmp_path, wandb_run):
    fake = wandb_run.fake
    wandb_run(range(1, 7))  # killed after step 6, its last save at step 4
    fake.fail = True
    with pytest.raises(SlideDPError, match=r"W&B run id2 could not start \(Network error.*remove .*wandb-run-id"):
        wandb_run([], resume_step=4)
    lines = wandb_run(range(5, 7), resume_step=4)  # metrics.csv no longer shows steps 5-6: the id file decides
    assert fake.logged == {"id1": [1, 2, 3, 4, 5, 6], "id2": [5, 6]}
    assert "id2 continued from step 5" in lines[-1]


def test_a_resume_logging_elsewhere_drops_the_wandb_run_it_redid_steps_of(tmp_path, wandb_run):
    wandb_run(range(1, 7))
    wandb_run([], resume_step=4, kind="none")  # redoes steps 5-6 without W&B
    assert not (tmp_path / WANDB_RUN_FILE).exists()
    lines = wandb_run(range(5, 7), resume_step=4)
    assert wandb_run.fake.inits[-1]["id"] == "id2" and "holds no earlier W&B run" in lines[-1]


def test_wandb_offline_or_another_project_starts_a_new_run(tmp_path, wandb_run, monkeypatch):
    wandb_run(range(1, 3))
    monkeypatch.setenv("WANDB_PROJECT", "other")
    lines = wandb_run(range(3, 5), resume_step=2)
    assert wandb_run.fake.inits[-1]["id"] == "id2" and "in project 'slidedp', this one in 'other'" in lines[-1]
    monkeypatch.setenv("WANDB_MODE", "offline")
    lines = wandb_run(range(5, 7), resume_step=4)
    assert wandb_run.fake.inits[-1]["id"] == "id3" and "does not resume offline runs" in lines[-1]
    assert _id_file(tmp_path) == "other/id3"


def test_overwrite_counts_the_wandb_run_id_as_part_of_an_earlier_run(tmp_path, wandb_run):
    from slidedp.runtime.trainer import earlier_run

    wandb_run(range(1, 3))
    (tmp_path / "metrics.csv").unlink()
    assert earlier_run(tmp_path) == [tmp_path / WANDB_RUN_FILE]
