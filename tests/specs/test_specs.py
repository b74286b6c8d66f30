import json

import pytest

from slidedp.errors import SlideDPError
from slidedp.hardware import HardwareProfile, hardware_presets, interpolate_curve, load_hardware
from slidedp.model_spec import ModelSpec, load_model_spec
from slidedp.policy import Policy, default_policy
from slidedp.presets.models import MODEL_PRESETS

# Published parameter counts (billions) of each preset's family.
KNOWN_PARAMS_B = {"qwen3-0.6b": 0.596, "qwen3-4b": 4.022, "qwen3-8b": 8.191, "qwen3-14b": 14.768,
                  "qwen3-32b": 32.762, "qwen2.5-72b": 72.706, "llama-3-8b": 8.030, "llama-3-70b": 70.554}


@pytest.mark.parametrize("name", sorted(KNOWN_PARAMS_B))
def test_presets_match_published_parameter_counts(name):
    spec = load_model_spec(name)
    assert spec.total_params / 1e9 == pytest.approx(KNOWN_PARAMS_B[name], abs=2e-3)


def test_hf_config_file_and_directory_give_the_preset(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MODEL_PRESETS["qwen3-14b"]))
    from_dir = load_model_spec(str(tmp_path))
    from_file = load_model_spec(str(tmp_path / "config.json"))
    preset = load_model_spec("qwen3-14b")
    for spec in (from_dir, from_file):
        assert spec.total_params == preset.total_params
        assert spec.train_flops_per_token(4096) == preset.train_flops_per_token(4096)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen2", "llama", "mistral"])
def test_omitted_kv_heads_and_head_dim_are_what_transformers_builds(model_type):
    """The simulator prices the model slidedp train builds: the same defaults as transformers' config class."""
    from transformers import CONFIG_MAPPING

    cfg = dict(model_type=model_type, hidden_size=256, num_attention_heads=32, intermediate_size=512,
               num_hidden_layers=2, vocab_size=1000)
    hf = CONFIG_MAPPING[model_type](**{k: v for k, v in cfg.items() if k != "model_type"})
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.kv_heads == hf.num_key_value_heads
    assert spec.head_dim == (getattr(hf, "head_dim", None) or 256 // 32)


def test_a_head_dim_that_is_neither_given_nor_whole_is_refused():
    cfg = dict(model_type="llama", hidden_size=30, num_attention_heads=4, num_key_value_heads=4,
               intermediate_size=64, num_hidden_layers=2, vocab_size=100)
    with pytest.raises(SlideDPError, match="not a multiple of num_attention_heads 4 and config.json gives no head_dim"):
        ModelSpec.from_hf_config(cfg)
    assert ModelSpec.from_hf_config({**cfg, "head_dim": 8}).head_dim == 8


def test_layer_flops_match_the_h200_probe_formula():
    # The probe reports 506 TFLOP/s for one Qwen3-14B layer fwd+bwd at 4096 tokens in 17.06 ms.
    spec = load_model_spec("qwen3-14b")
    assert spec.layer_params == 330_311_936
    per_token = 3 * (spec.layer_linear_flops_per_token() + spec.layer_attention_flops_per_token(4096))
    assert per_token * 4096 / 17.0609e-3 / 1e12 == pytest.approx(506.0, rel=0.01)


def test_activation_policies_order_memory():
    spec = load_model_spec("qwen3-8b")
    assert spec.full_activation_bytes_per_token() > 10 * spec.checkpoint_bytes_per_token()


@pytest.mark.parametrize("cfg, message", [
    ({"model_type": "llama", "hidden_size": 64}, "lacks required key"),
    ({"hidden_size": 64}, "gives no model_type .supported: llama, mistral, qwen2, qwen3."),
    ({**MODEL_PRESETS["qwen3-8b"], "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({**MODEL_PRESETS["qwen3-8b"], "head_dim": 7}, "head_dim 7 is odd"),
    ({**MODEL_PRESETS["qwen3-8b"], "hidden_size": "big"}, "hidden_size must be an integer, got 'big'"),
    ({**MODEL_PRESETS["qwen3-8b"], "hidden_size": True}, "hidden_size must be an integer, got True"),
    ({**MODEL_PRESETS["qwen3-8b"], "intermediate_size": 256.5}, "intermediate_size must be an integer"),
    ({**MODEL_PRESETS["qwen3-8b"], "model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({**MODEL_PRESETS["qwen3-8b"], "num_hidden_layers": 0}, "layers must be a positive integer"),
    ({**MODEL_PRESETS["qwen3-8b"], "num_key_value_heads": 5}, "multiple of kv_heads"),
])
def test_malformed_model_configs(tmp_path, cfg, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SlideDPError, match=message):
        load_model_spec(str(path))


def test_unknown_model_and_broken_json(tmp_path):
    with pytest.raises(SlideDPError, match="unknown model"):
        load_model_spec("gpt-17")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(SlideDPError, match="cannot read model config"):
        load_model_spec(str(bad))


def test_hardware_presets_load_and_round_trip(tmp_path):
    assert {"h100-sxm-x1", "h100-sxm-x4", "h100-sxm-x8", "rtx4090-x4", "h200-x1"} <= set(hardware_presets())
    for name in hardware_presets():
        hw = load_hardware(name)
        for suffix in (".yaml", ".json"):  # JSON writes the thread-count keys of the rate curves as strings
            path = tmp_path / f"{name}{suffix}"
            hw.save(path)
            assert load_hardware(str(path)) == hw, suffix
    assert load_hardware("rtx4090-x4").link.kind == "host"


def test_h200_profile_carries_the_measurements():
    """The shipped H200 profile is slidedp calibrate's output on that host (benchmarks/results/...02b), with DRAM
    under contention from the fifth session's experiments (.../h200-2026-12-03b/pv/)."""
    hw = load_hardware("h200-x1")
    assert hw.gpu.h2d_gbps == pytest.approx(55.14)
    assert hw.host.adam_rate(16) == pytest.approx(4.523e9)
    assert hw.host.adam_rate(8) == pytest.approx(3.874e9)
    assert hw.host.fused_cast and hw.host.mem_bw_gbps == pytest.approx(80.0 + 69.6)  # pass + copies, together
    assert hw.host.interference("h2d+d2h") == pytest.approx(0.094 / 0.064, rel=1e-3)
    assert hw.host.cpu_dram_weight == pytest.approx(1.469)  # calibration.profile_fit.fit_cpu_dram_weight


def test_thread_curve_interpolation():
    curve = {4: 2.0, 8: 3.0, 16: 4.0}
    assert interpolate_curve(curve, 2) == 1.0
    assert interpolate_curve(curve, 6) == 2.5
    assert interpolate_curve(curve, 64) == 4.0


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(bogus=1), "unknown key 'bogus'"),
    (lambda d: d.pop("gpu"), "missing required key 'gpu'"),
    (lambda d: d["gpu"].update(h2d_gbps=-3), "h2d_gbps must be positive"),
    (lambda d: d["gpu"].update(h2d_gbps="fast"), "expected a number"),
    (lambda d: d["host"].update(cores=2.5), "expected an integer"),
    (lambda d: d["link"].update(kind="carrier-pigeon"), "is not one of"),
    (lambda d: d.update(switches=[{"gpus": [0, 9], "uplink_gbps": 10}]), "not in 0..3"),
])
def test_hardware_schema_errors(mutate, message):
    data = load_hardware("h100-sxm-x4").to_dict()
    mutate(data)
    with pytest.raises(SlideDPError, match=message):
        HardwareProfile.from_dict(data)


def test_a_yaml_exponent_without_a_dot_is_the_number_meant(tmp_path):
    """YAML 1.1 reads ``1e3`` as a string; a profile's float field takes it as 1000.0, a word stays an error."""
    path = tmp_path / "hw.yaml"
    load_hardware("h200-x1").save(path)
    path.write_text(path.read_text().replace("memory_gib: ", "memory_gib: 1e3 #", 1))
    assert load_hardware(str(path)).gpu.memory_gib == 1000.0
    path.write_text(path.read_text().replace("memory_gib: 1e3 #", "memory_gib: lots #", 1))
    with pytest.raises(SlideDPError, match="memory_gib: expected a number, got 'lots'"):
        load_hardware(str(path))


def test_malformed_yaml_files(tmp_path):
    bad = tmp_path / "hw.yaml"
    bad.write_text("gpu: [unclosed")
    with pytest.raises(SlideDPError, match="malformed hardware profile"):
        load_hardware(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(SlideDPError, match="must hold a mapping"):
        load_hardware(str(bad))
    bad.write_text("# only a comment\n")
    with pytest.raises(SlideDPError, match="is empty"):
        load_hardware(str(bad))
    with pytest.raises(SlideDPError, match="unknown hardware"):
        load_hardware("tpu-v9")



def test_a_key_given_twice_is_refused_in_yaml_and_json(tmp_path):
    """YAML and JSON keep the last of two equal keys silently; a policy with two param_route lines is refused.
    A YAML merge key's values may still be overridden (that is not a key given twice)."""
    policy = tmp_path / "p.yaml"
    policy.write_text("param_route: replicated\nmicro_batch: 1\nparam_route: sharded\n")
    with pytest.raises(SlideDPError, match="key 'param_route' is given twice \\(line 3\\)"):
        Policy.load(policy)
    config = tmp_path / "config.json"
    config.write_text('{"hidden_size": 64, "hidden_size": 128}')
    with pytest.raises(SlideDPError, match="key 'hidden_size' is given twice"):
        load_model_spec(str(config))
    from slidedp.config_io import read_mapping

    policy.write_text("a: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")
    assert read_mapping(policy, "test")["c"] == {"x": 3, "y": 2}


def test_policy_round_trip_and_errors(tmp_path):
    policy = Policy(param_route="replicated", grad_route="per_rank", chunks_per_layer=8, activation="offload",
                    micro_batch=2, accumulation=3, adam_threads=6, update_schedule="as_ready")
    path = tmp_path / "policy.yaml"
    policy.save(path)
    assert Policy.load(path) == policy
    with pytest.raises(SlideDPError, match="chunks_per_layer must be a positive integer"):
        Policy(chunks_per_layer=0)
    path.write_text("param_route: teleport\n")
    with pytest.raises(SlideDPError, match="is not one of"):
        Policy.load(path)
    path.write_text("micro_batch: -2\n")
    with pytest.raises(SlideDPError, match="micro_batch must be a positive integer"):
        Policy.load(path)


def test_default_policy_divides_the_batch():
    p = default_policy(32, 4)
    assert p.micro_batch * p.accumulation * 4 == 32
    with pytest.raises(SlideDPError, match="multiple of the GPU count"):
        default_policy(6, 4)


def test_model_spec_rejects_bad_sizes():
    with pytest.raises(SlideDPError):
        ModelSpec(name="x", layers=-1, hidden=8, ffn=8, heads=1, kv_heads=1, head_dim=8, vocab=8)


@pytest.mark.parametrize("text, micro, accumulation", [
    ("gpu_state_units: 2\n", 1, 8),  # a change to the default policy, not a batch of one
    ("micro_batch: 2\n", 2, 4),
    ("accumulation: 2\n", 4, 2),
    ("micro_batch: 3\n", 3, 1),  # 8 sequences per rank are no multiple of 3: as written, refused by the workload
])
def test_a_partial_policy_file_fills_the_batch_as_the_default_does(tmp_path, text, micro, accumulation):
    from slidedp.policy import load_policy_for

    (tmp_path / "p.yaml").write_text(text)
    policy = load_policy_for(tmp_path / "p.yaml", per_rank=8)
    assert (policy.micro_batch, policy.accumulation) == (micro, accumulation)


def test_a_policy_file_that_gives_both_is_taken_as_written(tmp_path, capsys):
    from slidedp.cli import main

    (tmp_path / "both.yaml").write_text("micro_batch: 1\naccumulation: 1\n")
    (tmp_path / "part.yaml").write_text("gpu_state_units: 2\n")
    argv = ["simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--batch", "32", "--seq", "1024"]
    assert main([*argv, "--policy", str(tmp_path / "both.yaml")]) == 2
    assert "batch 32 != GPUs 4 x micro_batch 1 x accumulation 1" in capsys.readouterr().err
    assert main([*argv, "--policy", str(tmp_path / "part.yaml"), "--json"]) == 0
    policy = json.loads(capsys.readouterr().out)["policy"]
    assert (policy["micro_batch"], policy["accumulation"], policy["gpu_state_units"]) == (1, 8, 2)


@pytest.mark.parametrize("n_bytes, text", [(0, "0.0"), (206 * 2**30, "206.0"), (1.25 * 2**30, "1.2"),
                                           (10_000, "9.3e-06"), (0.25 * 2**30, "0.25"),
                                           (0.996 * 2**30, "1.00")])
def test_gib_text_never_reads_a_small_limit_as_zero(n_bytes, text):
    from slidedp.hardware import gib_text

    assert gib_text(n_bytes) == text
