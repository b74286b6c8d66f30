"""The external peers' harness (benchmarks.peer_external, peer_external_setup, peer_probe) on the CPU, with fake peer
programs that print what SlideFormer's main_dp.py and MegaTrain's train.py print: parsing, failure reasons, rows,
the prepared inputs and the source layout. The real peers need CUDA and run on the GPU machine only."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from benchmarks.peer_external import (
    EXTERNAL,
    MEGATRAIN,
    SLIDEFORMER,
    failure_reason,
    parse_megatrain,
    parse_slideformer,
    prepare_inputs,
    run_external_peer,
)
from benchmarks.peer_external_setup import CPU_ADAM_BINDINGS, download_commands, lay_out
from slidedp.report.peers import load_rows, speedups, table_markdown
from tests.builders import REPO, TINY, process_gone, read_when_written

PROBE = 'PEER_PROBE {"gpu_peak_gib": 12.5, "host_rss_peak_gib": 48.0}'


def test_slideformer_step_times_are_the_gaps_between_its_step_lines():
    lines = [(0.0, "Model Structure:"), (10.0, "step=1 global_loss=12.100000 ranks=1"),
             (12.5, "step=2 global_loss=11.900000 ranks=1"), (14.5, "step=3 global_loss=11.700000 ranks=1"),
             (16.0, "step=4 global_loss=11.500000 ranks=1"), (16.1, "rank=0 completed=4"), (16.2, PROBE)]
    parsed = parse_slideformer(lines)
    assert parsed.step_times == [2.5, 2.0, 1.5]
    assert parsed.step_time_s == pytest.approx(1.75)  # median after the first gap (warm-up)
    assert parsed.final_loss == pytest.approx(11.5)
    assert (parsed.gpu_peak_gib, parsed.host_rss_peak_gib) == (12.5, 48.0)
    assert parsed.failure is None
    assert "two" in parse_slideformer(lines[:2]).failure


def test_megatrain_step_times_phases_and_a_silent_optimizer_fallback():
    log = textwrap.dedent("""\
        12:00:01 [INFO] Using DeepSpeed CPUAdam optimizer (SIMD-accelerated)
        12:00:09 [INFO] Step 1/3 | Loss 12.0100 | Avg 12.0100
        12:00:09 [INFO]   Time: 8.00s | Tokens/s 512.0 | TFLOPS 101.2
        12:00:09 [INFO]   FWD: 1.00s | BWD: 4.00s
        12:00:13 [INFO] Step 2/3 | Loss 11.9000 | Avg 11.9550
        12:00:13 [INFO]   Time: 4.00s | Tokens/s 1024.0 | TFLOPS 202.4
        12:00:13 [INFO]   FWD: 0.50s | BWD: 2.00s
        12:00:16 [INFO] Step 3/3 | Loss 11.8000 | Avg 11.9000
        12:00:16 [INFO]   Time: 3.00s | Tokens/s 1365.3 | TFLOPS 270.0
        12:00:16 [INFO]   FWD: 0.40s | BWD: 1.80s
        12:00:16 [INFO] Peak GPU: 30.25 GB""").splitlines()
    parsed = parse_megatrain([(float(i), line) for i, line in enumerate(log)] + [(99.0, PROBE)])
    assert parsed.step_times == [8.0, 4.0, 3.0] and parsed.step_time_s == pytest.approx(3.5)
    assert parsed.final_loss == pytest.approx(11.8)
    assert parsed.extra["phase_s"] == {"forward": pytest.approx(0.45), "backward": pytest.approx(1.9)}
    assert parsed.extra["own_gpu_peak_gib"] == 30.25 and parsed.gpu_peak_gib == 12.5
    assert parsed.failure is None
    fallback = parse_megatrain([(0.0, "12:00:01 [INFO] Using PyTorch AdamW optimizer"), (1.0, log[2])])
    assert "not DeepSpeedCPUAdam" in fallback.failure
    # As on the H100 (2026-12-06, Qwen3-8B): one step, then "Loss is nan!", then silence until the time limit.
    nan = parse_megatrain([(0.0, log[1]), (1.0, log[2]), (2.0, "12:00:10 [ERROR] Loss is nan! Training may be")])
    assert nan.step_times == [8.0] and "NaN after 1 step(s)" in nan.failure


def test_failure_reasons_name_the_exception_the_signal_or_the_limit():
    lines = [(0.0, "Traceback (most recent call last):"), (0.1, '  File "main_dp.py", line 3'),
             (0.2, "ModuleNotFoundError: No module named 'liger_kernel'"), (0.3, PROBE)]
    assert failure_reason(1, lines) == "ModuleNotFoundError: No module named 'liger_kernel'"
    assert failure_reason(-9, [(0.0, "loading")]).startswith("killed by signal SIGKILL")
    assert failure_reason(None, lines) == "stopped at its time limit"
    assert failure_reason(3, [(0.0, "bye")]) == "exit 3: bye"


FAKE_SLIDEFORMER = """
import argparse, time
p = argparse.ArgumentParser()
for a in ("--model", "--tokens", "--batch-size", "--steps", "--lr", "--cpu-threads"):
    p.add_argument(a)
p.add_argument("--double-buffer", action="store_true")
args = p.parse_args()
batch, steps = int(args.batch_size), int(args.steps)
if batch >= {oom_from}:
    raise SystemExit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
for step in range(1, steps + 1):
    time.sleep(0.02)
    print(f"step={{step}} global_loss={{12.0 - step / 10:.6f}} ranks=1", flush=True)
print("rank=0 completed=%d" % steps, flush=True)
"""

FAKE_MEGATRAIN = """
import argparse
p = argparse.ArgumentParser()
for a in ("--config", "--batch-size", "--num-steps", "--max-seq-len"):
    p.add_argument(a)
args = p.parse_args()
print("12:00:01 [INFO] Using DeepSpeed CPUAdam optimizer (SIMD-accelerated)")
for step in range(1, int(args.num_steps) + 1):
    print(f"12:00:0{step} [INFO] Step {step}/{args.num_steps} | Loss 11.5000 | Avg 11.5000")
    print(f"12:00:0{step} [INFO]   Time: {0.5 * int(args.batch_size):.2f}s | Tokens/s 1.0 | TFLOPS 1.0")
"""


def _fake_peers(root, oom_from: int = 99):
    (root / "slideformer/multi_gpu/scripts").mkdir(parents=True)
    (root / "slideformer/multi_gpu/scripts/main_dp.py").write_text(FAKE_SLIDEFORMER.format(oom_from=oom_from))
    (root / "megatrain/examples/sft").mkdir(parents=True)
    (root / "megatrain/examples/sft/train.py").write_text(FAKE_MEGATRAIN)
    return root


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny Qwen3 config and its peer inputs (random-init checkpoint, tokenizer, tokens, MegaTrain's data),
    prepared once: every run below reuses the checkpoint."""
    root = tmp_path_factory.mktemp("peer_inputs")
    config = root / "tiny.json"
    config.write_text(json.dumps(TINY["qwen3"]))
    inputs = prepare_inputs(str(config), 16, [1, 2, 4], 3, root / "out" / "peer_inputs", "cpu")
    return config, inputs


def _run(peer, prepared, peers_dir, batches=(1, 2, 4), gpus=1, modules=(), python_path=None):
    config, inputs = prepared
    args = argparse.Namespace(model=str(config), seq=16, batches=list(batches), steps=3,
                              out=str(inputs.workdir.parent), device="cpu", port=29999, gpus=gpus,
                              peers_dir=str(peers_dir), batch_timeout=120, peer_inputs=str(inputs.workdir))
    rows: list[dict] = []
    with pytest.MonkeyPatch.context() as mp:
        if python_path is not None:
            mp.setenv("PYTHONPATH", python_path)
        run_external_peer(args, rows.append, dataclasses.replace(peer, modules=modules))
    return rows


def test_prepared_inputs_are_what_each_peer_reads(prepared):
    """SlideFormer's packed tokens (batch x steps rows of seq tokens); MegaTrain's rows fill the whole sequence
    through the saved tokenizer's chat template, padded and truncated as its ChatDataset does; its YAML carries
    the comparison's optimizer settings."""
    import torch
    import yaml
    from transformers import AutoConfig, AutoTokenizer

    config, inputs = prepared
    tokens = torch.load(inputs.tokens(4))
    assert tokens.dtype == torch.int64 and tuple(tokens.shape) == (4 * 3, 16)
    cfg = yaml.safe_load(inputs.megatrain_config.read_text())
    assert cfg["optimizer"]["beta2"] == 0.95 and cfg["training"]["max_grad_norm"] == 1.0
    assert cfg["dataset"]["train_on_prompt"] is True and cfg["model"]["attn_implementation"] == "sdpa"
    tok = AutoTokenizer.from_pretrained(cfg["model"]["name"])
    row = json.loads((inputs.megatrain_data / "synthetic.json").read_text())[0]
    messages = [{"role": "user", "content": row["instruction"]}, {"role": "assistant", "content": row["output"]}]
    enc = tok(tok.apply_chat_template(messages, tokenize=False), max_length=16, truncation=True,
              padding="max_length")
    assert sum(enc["attention_mask"]) == 16
    assert AutoConfig.from_pretrained(inputs.checkpoint).num_hidden_layers == TINY["qwen3"]["num_hidden_layers"]


def test_fake_peers_run_through_the_harness_and_give_rows_the_report_divides(tmp_path, prepared):
    peers = _fake_peers(tmp_path / "peers")
    mega = _run(MEGATRAIN, prepared, peers)
    slide = _run(SLIDEFORMER, prepared, peers)
    model = str(prepared[0])
    assert [(r["batch"], r["status"]) for r in mega + slide] == [(b, "ok") for b in (1, 2, 4)] * 2
    assert [r["step_time_s"] for r in mega] == [0.5, 1.0, 2.0]  # the median of steps 2-3 it printed
    assert all(r["step_time_s"] > 0 and r["host_rss_peak_gib"] > 0 for r in slide)
    assert all(math.isnan(r["gpu_peak_gib"]) for r in slide)  # CUDA never used by the fake
    assert mega[0]["tokens_per_s"] == pytest.approx(16 / 0.5)
    assert any("no global gradient clipping" in d for d in slide[0]["differences"])
    assert any("no fp32 master" in d for d in mega[0]["differences"])
    ours = [{"system": "slidedp", "model": model, "seq": 16, "batch": b, "status": "ok", "tokens_per_s": 64.0}
            for b in (1, 2, 4)]
    ratio = speedups(ours + mega, model)["megatrain"]
    assert ratio["per_batch"] == {1: 2.0, 2: 2.0, 4: 2.0} and ratio["geomean"] == pytest.approx(2.0)
    assert "| megatrain |" in table_markdown(ours + mega + slide)


def test_a_peer_that_runs_out_of_memory_or_cannot_start_keeps_its_rows_with_the_reason(tmp_path, prepared):
    peers = _fake_peers(tmp_path / "peers", oom_from=2)
    rows = _run(SLIDEFORMER, prepared, peers)
    assert [(r["batch"], r["status"]) for r in rows] == [(1, "ok"), (2, "oom"), (4, "skipped (oom at smaller)")]
    assert "CUDA out of memory" in rows[1]["error"]
    rows = _run(SLIDEFORMER, prepared, peers, batches=(1, 2, 4, 1))  # batch 1 again last: it still runs
    assert [(r["batch"], r["status"]) for r in rows] == [(1, "ok"), (2, "oom"), (4, "skipped (oom at smaller)"),
                                                         (1, "ok")]
    broken = tmp_path / "broken"
    (broken / "megatrain/examples/sft").mkdir(parents=True)
    (broken / "megatrain/examples/sft/train.py").write_text("import liger_missing_module_xyz\n")
    rows = _run(MEGATRAIN, prepared, broken, batches=(1,))
    assert rows[0]["status"] == "failed: ModuleNotFoundError: No module named 'liger_missing_module_xyz'"
    rows = _run(SLIDEFORMER, prepared, tmp_path / "nowhere", batches=(1, 2))
    assert all(r["status"].startswith("not run (not prepared") for r in rows) and len(rows) == 2
    rows = _run(MEGATRAIN, prepared, peers, batches=(1,), modules=("surely_not_installed_pkg",))
    assert rows[0]["status"].startswith("not run (missing Python packages: surely_not_installed_pkg")
    assert _run(MEGATRAIN, prepared, peers, batches=(2,), gpus=2)[0]["status"].startswith("not run (")


def test_peer_compare_keeps_rows_for_peers_that_were_never_laid_out(tmp_path, tiny_config):
    out = tmp_path / "peers_out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.peer_compare", "--model", str(tiny_config), "--seq", "16",
                           "--batches", "1", "2", "--device", "cpu", "--systems", *EXTERNAL, "--peers-dir",
                           str(tmp_path / "empty"), "--out", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = load_rows(out)
    assert {(r["system"], r["batch"]) for r in rows} == {(s, b) for s in EXTERNAL for b in (1, 2)}
    assert all(r["status"].startswith("not run (not prepared") for r in rows)
    assert "| slideformer | not run" in (out / "table.md").read_text()


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_setup_lays_out_only_what_the_peer_runs_and_records_the_commit(tmp_path):
    src = tmp_path / "MegaTrain"
    for path, text in {"infinity/__init__.py": "x = 1\n", "infinity/model/cpu_master.py": "y = 2\n",
                       "examples/sft/train.py": "print('train')\n", "LICENSE": "Apache\n",
                       "infinity/cuda_pipeline/build/lib/cuda_pipeline.so": "ELF", "build/lib/infinity/x.py": "",
                       "infinity/__pycache__/a.pyc": "", "verl/README.md": "other project\n",
                       "horizon_lm.egg-info/PKG-INFO": ""}.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(text)
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "x")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True).stdout.strip()
    peers = tmp_path / "peers"
    peers.mkdir()
    info = lay_out("megatrain", src / ".git", peers)
    laid = sorted(p.relative_to(peers / "megatrain").as_posix() for p in (peers / "megatrain").rglob("*")
                  if p.is_file())
    assert laid == ["LICENSE", "SOURCE.json", "examples/sft/train.py", "infinity/__init__.py",
                    "infinity/model/cpu_master.py"]
    assert info["commit"] == head and info["files"] == 4 and info["missing"] == []
    copy = shutil.copytree(src, tmp_path / "copy", ignore=shutil.ignore_patterns(".git"))
    plain = lay_out("megatrain", copy, tmp_path / "plain")  # a plain folder: the same files
    assert plain["files"] == 4 and plain["commit"].startswith("working tree")
    with pytest.raises(SystemExit, match="main_dp.py"):
        lay_out("slideformer", src / ".git", peers)


def test_paper_predictions_label_the_stand_in_rate_and_divide_like_the_report(tiny_config):
    """SlideFormer's untimed kernel is predicted with DeepSpeedCPUAdam's measured curve and, on a profile that has
    not timed them, MegaTrain's bf16 passes with the fp32 ones, each row naming only its own stand-ins (h200-x1 has
    MegaTrain's since 2026-12-06); ZeRO-2-Offload uses the profile's own rates; the ratio lines are SlideDP's
    tokens/s over each peer's."""
    from benchmarks.paper_peer_predictions import markdown, measured_steps, predictions
    from slidedp.hardware import load_hardware

    hardware = load_hardware("h200-x1")
    pred = predictions(str(tiny_config), hardware, 64, [1, 2])
    assert pred["slideformer"][1]["note"] == "stand-in rate slideformer_cpu_adam := deepspeed_cpu_adam"
    assert pred["megatrain"][1]["note"] == ""
    untimed = {k: v for k, v in hardware.host.peer_adam_gparams_per_s.items() if not k.endswith("_bf16")}
    older = dataclasses.replace(hardware, host=dataclasses.replace(hardware.host, peer_adam_gparams_per_s=untimed))
    assert predictions(str(tiny_config), older, 64, [1])["megatrain"][1]["note"] == (
        "stand-in rate deepspeed_cpu_adam_bf16 := deepspeed_cpu_adam, "
        "torch_clip_grad_norm_bf16 := torch_clip_grad_norm")
    assert pred["zero2-offload"][2]["note"] == "" and pred["zero2-offload"][2]["status"] == "ok"
    ratio = pred["slidedp"][2]["tokens_per_s"] / pred["megatrain"][2]["tokens_per_s"]
    assert f"b2: {ratio:.2f}x" in markdown(pred, [1, 2])
    rows = [{"system": "deepspeed-offload", "model": str(tiny_config), "seq": 64, "batch": 1, "status": "ok",
             "step_time_s": pred["zero2-offload"][1]["step_s"] / 1.1},
            {"system": "megatrain", "model": str(tiny_config), "seq": 64, "batch": 2, "status": "oom"}]
    table = markdown(pred, [1, 2], measured_steps(rows, str(tiny_config), 64))
    assert "+10.0% |" in next(line for line in table.splitlines() if line.startswith("| zero2-offload | 1 |"))
    assert next(line for line in table.splitlines() if line.startswith("| megatrain | 2 |")).endswith(" oom | - |")


# A stand-in for SlideFormer's optimizer sources as the search index holds them (no csrc/cpu_adam.cpp): what the
# binding step reads is the names layer_adam.py calls and the functions the C++ files define and declare.
FAKE_LAYER_ADAM = """
class LayerAdam:
    def __init__(self, ext):
        self.cpu_adam = ext
        self.cpu_adam.create_adam(0, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, False)
    def step_chunk(self, p, g, m, v, group):
        self.cpu_adam.adam_update(0, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, p, g, m, v)
    def __del__(self):
        self.cpu_adam.destroy_adam(0)
"""
_FUNCS = ("create_adam_optimizer", "ds_adam_step", "destroy_adam_optimizer")
FAKE_ADAM_CPP = {"csrc/cpu_adam.h": "".join(f"int {f}(int id);\n" for f in _FUNCS),
                 "csrc/cpu_adam_impl.cpp": "".join(f"int {f}(int id) {{ return 0; }}\n" for f in _FUNCS)}


def _fake_slideformer_source(root, layer_adam=FAKE_LAYER_ADAM):
    adam = root / "multi_gpu/optimizer/layer_adam"
    files = {"multi_gpu/scripts/main_dp.py": "print('main')\n", "multi_gpu/optimizer/layer_adam/layer_adam.py":
             layer_adam, **{f"multi_gpu/optimizer/layer_adam/{k}": v for k, v in FAKE_ADAM_CPP.items()}}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    digest = hashlib.sha256(b"print('main')\n").hexdigest()
    (root / "multi_gpu/SHA256SUMS").write_text(f"{digest}  scripts/main_dp.py\n{'0' * 64}  optimizer/layer_adam/csrc/"
                                                f"cpu_adam.cpp\n{'1' * 64}  README.md\n")
    (root / "INDEX_VERSIONS.json").write_text(json.dumps({"tree_commit": "e577d1aa", "files": {
        p: "e577d1aa" for p in [*files, "multi_gpu/SHA256SUMS"]}, "absent": {"multi_gpu/README.md": "not read"}}))
    return adam


def test_setup_writes_slideformers_missing_cpu_adam_binding_and_records_it(tmp_path):
    """A SlideFormer tree without csrc/cpu_adam.cpp (the index holds none) gets our binding of the three functions
    under the names layer_adam.py calls, recorded in SOURCE.json with the index's commits and the SHA256SUMS
    check; a tree whose layer_adam.py calls a name the binding lacks gets none, and says why."""
    _fake_slideformer_source(tmp_path / "src")
    info = lay_out("slideformer", tmp_path / "src", tmp_path / "peers")
    binding = tmp_path / "peers/slideformer/multi_gpu/optimizer/layer_adam/csrc/cpu_adam.cpp"
    text = binding.read_text()
    assert '#include "cpu_adam.h"' in text and "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in text
    assert [line.strip() for line in text.splitlines() if "m.def(" in line] == [
        f'm.def("{py}", &{cpp}, "{cpp} (cpu_adam_impl.cpp)");' for py, cpp in CPU_ADAM_BINDINGS.items()]
    assert set(CPU_ADAM_BINDINGS) == {"create_adam", "adam_update", "destroy_adam"}
    entry = info["reconstructed"]["multi_gpu/optimizer/layer_adam/csrc/cpu_adam.cpp"]
    assert entry["written"] and entry["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    saved = json.loads((tmp_path / "peers/slideformer/SOURCE.json").read_text())
    assert saved["reconstructed"] == info["reconstructed"] and saved["commit"] == "e577d1aa"
    assert saved["versions"]["multi_gpu/scripts/main_dp.py"] == "e577d1aa"
    assert saved["absent_from_index"] == {"multi_gpu/README.md": "not read"}
    assert saved["sha256sums"]["multi_gpu/SHA256SUMS"] == {
        "matched": 1, "differs": ["optimizer/layer_adam/csrc/cpu_adam.cpp"], "absent": ["README.md"]}
    again = lay_out("slideformer", tmp_path / "peers/slideformer", tmp_path / "peers2")  # has one: left alone
    assert "reconstructed" not in again
    _fake_slideformer_source(tmp_path / "odd", FAKE_LAYER_ADAM + "\nx = ext.cpu_adam.adam_update_fused(0)\n")
    odd = lay_out("slideformer", tmp_path / "odd", tmp_path / "peers3")
    entry = odd["reconstructed"]["multi_gpu/optimizer/layer_adam/csrc/cpu_adam.cpp"]
    assert not entry["written"] and "adam_update_fused" in entry["why_not"]
    assert not (tmp_path / "peers3/slideformer/multi_gpu/optimizer/layer_adam/csrc/cpu_adam.cpp").exists()


def _wheel(folder, module: str, text: str):
    """A minimal pure-Python wheel of one module (pip installs it without an index)."""
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{module}-1.0.dist-info"
    files = {f"{module}.py": text, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{module}-1.0-py3-none-any.whl", "w") as z:
        for path, body in files.items():
            z.writestr(path, body)


def test_a_peers_private_wheels_are_installed_in_its_folder_and_seen_first_by_its_process(tmp_path, prepared):
    """SlideFormer's pinned transformers must not replace the image's for everything else: wheels in the peer's
    ``wheels/`` go into its ``site/`` and only its process sees them, ahead of the rest of PYTHONPATH."""
    peers = _fake_peers(tmp_path / "peers")
    script = peers / "slideformer/multi_gpu/scripts/main_dp.py"
    script.write_text("import sf_private_probe\nassert sf_private_probe.VALUE == 7\n" + script.read_text())
    _wheel(peers / "slideformer/wheels", "sf_private_probe", "VALUE = 7\n")
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "sf_private_probe.py").write_text("VALUE = 1\n")  # what the harness's own PYTHONPATH would give
    rows = _run(SLIDEFORMER, prepared, peers, batches=(1,), python_path=str(shadow))
    assert rows[0]["status"] == "ok"
    assert (peers / "slideformer/site/.installed").read_text() == "sf_private_probe-1.0-py3-none-any.whl"
    (peers / "slideformer/wheels/sf_private_probe-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    (peers / "slideformer/wheels/broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    rows = _run(SLIDEFORMER, prepared, peers, batches=(1,))
    assert rows[0]["status"].startswith("not run (installing its private wheels failed")
    cmds = download_commands(["slideformer"], tmp_path / "whl", tmp_path / "p")
    assert [c[-1] for c in cmds] == ["liger-kernel==0.7.0", "transformers==5.5.4", "tokenizers==0.22.2"]
    private = str(tmp_path / "p/slideformer/wheels")
    assert [c[c.index("-d") + 1] for c in cmds] == [str(tmp_path / "whl"), private, private]


def test_the_compact_variant_is_predicted_host_only_in_bf16_int8_and_with_another_profiles_gpu(tiny_config):
    """SlideDP's variants are the names the report reads (slidedp.report.peers.OURS), one search space each; the
    compact one plans every optimizer state on the host in bf16+int8. `--gpu-from` keeps the host and swaps the
    GPU (memory, PCIe and compute curves) for another profile's."""
    from benchmarks.our_variants import VARIANT_SPACES
    from benchmarks.paper_peer_predictions import predict_ours
    from slidedp.hardware import load_hardware
    from slidedp.model_spec import load_model_spec
    from slidedp.report.peers import OURS

    assert tuple(VARIANT_SPACES) == OURS
    h200 = load_hardware("h200-x1")
    h100 = load_hardware("h100-sxm-x1")
    mixed = h200.with_gpu_of(h100)
    assert mixed.gpu == h100.gpu and mixed.host == h200.host and mixed.link == h200.link
    assert mixed.name == "h200-x1+h100-sxm-x1-gpu" and mixed.num_gpus == h200.num_gpus
    model = load_model_spec(str(tiny_config))
    compact = predict_ours(model, h200, 64, 2, VARIANT_SPACES["slidedp-compact"])
    exact = predict_ours(model, h200, 64, 2, VARIANT_SPACES["slidedp-host"])
    assert compact["status"] == exact["status"] == "ok"
    assert compact["note"] == exact["note"] == "gpu_state_units=0"
    assert compact["host_gib"] < 0.5 * exact["host_gib"]  # ~6 against 14 bytes per parameter


# A peer that starts a helper, writes the helper's pid to the file named by its argument, and hangs.
_PEER_WITH_A_HELPER = ("import subprocess, sys, time; c = subprocess.Popen(['sleep', '60']); "
                       "open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(60)")


def test_a_peer_stopped_at_its_limit_or_with_its_worker_takes_its_helpers_along(tmp_path):
    """A peer that started a helper process and hangs: at the batch's limit both end; and when the driver ends
    the worker (SIGTERM at the worker's own limit), the peer's session ends with it."""
    import os
    import signal
    import time

    from benchmarks.peer_external import run_logged

    pid_file = tmp_path / "helper.pid"
    t0 = time.monotonic()
    code, _ = run_logged([sys.executable, "-c", _PEER_WITH_A_HELPER, str(pid_file)], tmp_path, dict(os.environ), 2,
                         tmp_path / "peer.log")
    assert code is None and time.monotonic() - t0 < 15
    assert process_gone(int(pid_file.read_text()))
    pid_file.unlink()

    worker = textwrap.dedent(f"""\
        import os, sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO)!r})
        from benchmarks.peer_external import run_logged
        print("worker", os.getpid(), flush=True)
        run_logged([sys.executable, "-c", {_PEER_WITH_A_HELPER!r}, {str(pid_file)!r}], Path({str(tmp_path)!r}),
                   dict(os.environ), 60, Path({str(tmp_path / 'peer2.log')!r}))
        """)
    proc = subprocess.Popen([sys.executable, "-c", worker], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    helper = int(read_when_written(pid_file))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    assert process_gone(helper)
