"""The optimizer's thread count on the machine a run is on: a plan for a larger host must not oversubscribe."""

from __future__ import annotations

import pytest

from slidedp.workload import threads_for_this_machine


@pytest.mark.parametrize("planned, cores, ranks, expected", [
    (112, 16, 1, 16),  # the h100-sxm-x1 preset's 112 threads on the lent 16-core host (2026-12-05)
    (112, 16, 2, 8),  # two ranks split the cores
    (8, 16, 1, 8),  # a plan that fits stays as planned
    (4, 3, 4, 1),  # fewer cores than ranks: still one thread each
])
def test_threads_never_exceed_the_cores_per_rank(planned, cores, ranks, expected):
    assert threads_for_this_machine(planned, cores, ranks) == expected


def test_the_trainer_runs_and_records_the_capped_count_and_says_so_once(monkeypatch):
    from types import SimpleNamespace

    from slidedp.runtime.trainer import Trainer

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    lines: list[str] = []
    from slidedp.policy import Policy

    def workload(policy):  # the trainer's _workload: the prediction follows the policy's threads
        return SimpleNamespace(adam_threads=policy.adam_threads)
    fake = SimpleNamespace(workload=SimpleNamespace(adam_threads=112), ranks_per_host=2, log=lines.append,
                           spec=SimpleNamespace(policy=Policy()), _workload=workload)
    assert Trainer._adam_threads(fake, rank=0) == 8
    assert fake.adam_threads_used == 8  # what the summary records, so --from-run re-predicts with 8
    assert fake.workload.adam_threads == 8  # and the prediction the summary records is made for 8
    assert len(lines) == 1 and "8 per rank, not the plan's 112" in lines[0]
    assert Trainer._adam_threads(fake, rank=1) == 8 and len(lines) == 1  # only rank 0 says it
    fits = SimpleNamespace(workload=SimpleNamespace(adam_threads=4), ranks_per_host=1, log=lines.append)
    assert Trainer._adam_threads(fits, rank=0) == 4 and len(lines) == 1
