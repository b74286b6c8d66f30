"""Fixtures only: each wraps a builder from tests/builders.py where a fixture reads better in a test's
signature. Test modules never import this file; they import the builders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slidedp.model_spec import ModelSpec
from tests.builders import TINY, tiny_model


@pytest.fixture
def model() -> ModelSpec:
    """The small four-layer ModelSpec the simulator and model tests constrain one resource against."""
    return tiny_model()


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    """The tiny Qwen3 (TINY["qwen3"]) written as tiny.json: what the benchmark scripts and CLIs take as --model."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY["qwen3"]))
    return path
