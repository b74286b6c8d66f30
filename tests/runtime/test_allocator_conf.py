"""The CUDA allocator setting the train command asks for (expandable segments) and that a user's own wins."""

from __future__ import annotations

from slidedp.runtime.device import ALLOC_CONF_ENV, EXPANDABLE_SEGMENTS, prefer_expandable_segments


def test_expandable_segments_are_set_when_the_user_set_nothing():
    env: dict[str, str] = {}
    assert prefer_expandable_segments(env)
    assert env == {ALLOC_CONF_ENV: EXPANDABLE_SEGMENTS}


def test_a_users_allocator_setting_is_kept():
    for name in (ALLOC_CONF_ENV, "PYTORCH_ALLOC_CONF"):
        env = {name: "max_split_size_mb:256"}
        assert not prefer_expandable_segments(env)
        assert env == {name: "max_split_size_mb:256"}


def test_the_train_command_sets_it_before_it_builds_anything(monkeypatch):
    """run_train's first act: a bad argument still leaves the variable set (nothing CUDA happened before)."""
    import argparse

    import pytest

    from slidedp.commands import train

    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    seen = {}

    def stop(*_a, **_k):
        import os

        seen["conf"] = os.environ.get(ALLOC_CONF_ENV)
        raise RuntimeError("stop here")

    monkeypatch.setattr(train, "check_rank_placement", stop)
    with pytest.raises(RuntimeError, match="stop here"):
        train.run_train(argparse.Namespace(nproc=1, ranks_per_gpu=1, device="cpu"))
    assert seen["conf"] == EXPANDABLE_SEGMENTS
