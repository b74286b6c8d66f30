"""The fault census's classifier on synthetic outcomes (the census itself is a benchmark, never run by pytest)."""

from __future__ import annotations

import pytest

from benchmarks.fault_census import Observation, Result, classify, table

ONE = "slidedp: error: --lr must be finite, got inf\n"
TORCHRUN = ("Traceback (most recent call last):\n  File \"/x/torch/distributed/run.py\", line 9\n"
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15\n")
OURS = "Traceback (most recent call last):\n  File \"/x/slidedp/cli.py\", line 3\nKeyError: 'x'\n"


def _obs(rc, err="", timed_out=False, check=None, leaked=(), kill=False) -> Observation:
    return Observation(Result(rc, err, timed_out, 1.0), check, list(leaked), kill)


@pytest.mark.parametrize("expect, obs, outcome", [
    ("refuse", _obs(2, ONE), "clean refusal"),
    ("refuse", _obs(2, "usage: slidedp train ...\nslidedp train: error: argument --steps: invalid int\n"),
     "clean refusal"),
    ("refuse", _obs(2, ONE + ONE), "other failure"),  # two error lines are not one
    ("refuse", _obs(1, ONE), "other failure"),  # the wrong exit code
    ("refuse", _obs(1, OURS), "traceback"),
    ("refuse", _obs(2, OURS + ONE), "traceback"),
    ("refuse", _obs(0, ""), "accepted silently"),
    ("refuse", _obs(0, "", check=(False, "loss nan")), "accepted silently"),
    ("refuse", _obs(None, "", timed_out=True), "hang"),
    ("refuse", _obs(2, ONE, leaked=["1 process(es) still running"]), "leak"),
    ("survive", _obs(-9, TORCHRUN, check=(True, "checkpoint intact"), kill=True), "survived correctly"),
    ("survive", _obs(1, TORCHRUN, check=(False, "no checkpoint"), kill=True), "other failure"),
    ("survive", _obs(1, OURS, check=(False, "no checkpoint"), kill=True), "traceback"),
    ("survive", _obs(1, TORCHRUN, check=(False, "x")), "traceback"),  # torchrun's report counts outside kills
    ("survive", _obs(0, "", check=(False, "victim overwritten")), "accepted silently"),
    ("survive", _obs(130, "", check=(True, "ok"), leaked=["slidedp-0-ab left in /dev/shm (10 bytes)"]), "leak"),
    ("survive", _obs(None, "", timed_out=True, check=(True, "ok")), "hang"),
])
def test_classify(expect, obs, outcome):
    assert classify(expect, obs)[0] == outcome


def test_table_counts_each_category_and_all():
    rows = [{"category": "kill", "outcome": "leak"}, {"category": "kill", "outcome": "hang"},
            {"category": "bad input", "outcome": "clean refusal"}]
    text = table(rows)
    assert "| kill | 0 | 0 | 0 | 1 | 0 | 1 | 0 | 2 |" in text and "| all | 1 | 0 | 0 | 1 | 0 | 1 | 0 | 3 |" in text
