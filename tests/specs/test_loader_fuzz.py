"""Loader fuzzing: policy, hardware and model-config loaders either accept a mapping or raise SlideDPError,
never another exception (a traceback is a bug in the loader, not in the input)."""

import contextlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slidedp.config_io import from_mapping
from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, load_hardware
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from tests.builders import TINY

json_values = st.recursive(st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True)
                           | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


def _mutations(base: dict):
    keys = st.sampled_from(sorted(base))
    return st.lists(st.tuples(keys, json_values), max_size=4).map(lambda ch: {**base, **dict(ch)}) | \
        st.dictionaries(st.text(max_size=10), json_values, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_mutations(Policy().to_dict()))
def test_policy_loader_fuzz(data):
    with contextlib.suppress(SlideDPError):
        Policy.from_dict(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_mutations(load_hardware("h100-sxm-x4").to_dict()))
def test_hardware_loader_fuzz(data):
    with contextlib.suppress(SlideDPError):
        HardwareProfile.from_dict(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_mutations(dict(TINY["qwen3"])))
def test_model_config_fuzz(data):
    with contextlib.suppress(SlideDPError):
        ModelSpec.from_hf_config(data, "fuzz")


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_policy_file_fuzz(tmp_path, text):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with contextlib.suppress(SlideDPError):
        Policy.load(path)


def test_from_mapping_rejects_nested_garbage():
    with pytest.raises(SlideDPError):
        from_mapping(HardwareProfile, {"name": "x", "num_gpus": 1, "gpu": [1, 2], "host": {}, "link": {}}, "hw")


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_key_value_heads", "hidden_size", "vocab_size"])
def test_model_config_refuses_an_infinite_size(key):
    """Found by the fuzz above: float('inf') from a JSON 'Infinity' raised OverflowError out of int()."""
    with pytest.raises(SlideDPError, match=f"{key} must be an integer, got inf"):
        ModelSpec.from_hf_config({**TINY["qwen3"], key: float("inf")}, "inf")
