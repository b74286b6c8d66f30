"""The peers that are other projects' programs (SlideFormer, MegaTrain), run by `benchmarks.peer_compare` as
external programs from an ignored folder, with their own entry points and output.

Their code never enters this repository: `python -m benchmarks.peer_external_setup` lays their sources into
``.peers/<name>`` (ignored by git, carried to the GPU machine). For each batch this module starts the peer's own
training script through `benchmarks/peer_probe.py` (which adds one line with the process's peak GPU memory and
peak RSS at exit), on inputs it prepares once per model in ``OUT/peer_inputs``: a random-init checkpoint of the
model saved with ``save_pretrained`` (bf16), a word-level tokenizer (MegaTrain's data path needs one with a chat
template; no hub), SlideFormer's packed token file and MegaTrain's alpaca-format dataset and YAML config.

A peer's folder may hold wheels only its own process is to see (``wheels/``: SlideFormer's pinned transformers,
which the image's newer one would break; peer_external_setup.PRIVATE_WHEELS): they are installed once into the
folder's ``site/`` (pip, no index) and put first on the peer's PYTHONPATH, leaving this process's packages alone.

Step times come from the peer's own output: MegaTrain prints each step's wall time (``Time: 1.23s``, forward and
backward before the optimizer step included, synchronised by its CPU optimizer); SlideFormer prints one
``step=N`` line per step after waiting for every layer's update, so its step time is the gap between consecutive
lines, timestamped as they arrive (both flush). The first step is warm-up, as for the other systems: the median of
the rest is the step time. A peer that cannot run keeps its rows, with the reason as the status.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from benchmarks.common import end_process_group, log, sigterm_raises_exit
from benchmarks.peer_setup import BETAS, CLIP, EPS, LR, SKIPPED_AFTER_OOM, BatchesAfterOom
from slidedp.runtime.lifetime import die_with_parent

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PEERS_DIR = REPO / ".peers"
PROBE = Path(__file__).resolve().parent / "peer_probe.py"
PROBE_MARKER = "PEER_PROBE"
TOKENIZER_WORDS = 1000  # word-level vocabulary of the synthetic tokenizer (ids 0-1 are pad and eos)
SETUP_HINT = "python -m benchmarks.peer_external_setup --help"
PRIVATE_WHEELS_DIR = "wheels"  # in a peer's folder: wheels only its process sees (peer_external_setup.PRIVATE_WHEELS)
PRIVATE_SITE = "site"  # where install_private_wheels puts them; first on the peer's PYTHONPATH

Lines = list[tuple[float, str]]  # (monotonic seconds when the line arrived, line)


@dataclass(frozen=True)
class PeerInputs:
    """What a peer trains on, prepared once per model and sequence length."""

    checkpoint: Path  # save_pretrained folder: config, bf16 random-init weights, tokenizer
    workdir: Path
    seq: int
    steps: int

    def tokens(self, batch: int) -> Path:
        return self.workdir / f"tokens_b{batch}.pt"

    @property
    def megatrain_data(self) -> Path:
        return self.workdir / "megatrain_data"

    @property
    def megatrain_config(self) -> Path:
        return self.workdir / "megatrain.yaml"


@dataclass
class Parsed:
    """What a peer's output says about one run."""

    step_times: list[float] = field(default_factory=list)
    final_loss: float = math.nan
    gpu_peak_gib: float = math.nan
    host_rss_peak_gib: float = math.nan
    extra: dict = field(default_factory=dict)
    failure: str | None = None  # set where the output shows the run did not do what it was asked

    @property
    def step_time_s(self) -> float:
        """The median of the steps after the first (warm-up), or the only one."""
        timed = self.step_times[1:] or self.step_times
        return statistics.median(timed)


@dataclass(frozen=True)
class ExternalPeer:
    """One external peer: where its code lies, what it imports, how it is started and how its output is read."""

    name: str
    folder: str  # under the peers folder
    script: str  # its training entry point, relative to the folder
    python_path: tuple[str, ...]  # folders (relative to the folder) its imports need on PYTHONPATH
    modules: tuple[str, ...]  # third-party modules it imports that the GPU machine's image may lack
    optimizer: str
    differences: tuple[str, ...]  # every setting that differs from the other systems of the comparison
    arguments: Callable[[PeerInputs, Path, int, int], list[str]]  # (inputs, script, batch, steps) -> its argv
    parse: Callable[[Lines], Parsed]
    probe_environment: tuple[tuple[str, str], ...] = ()  # peer_probe settings its process needs (see peer_probe)


# ---- parsing ---------------------------------------------------------------------------------------------------
_FLOAT = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_SLIDEFORMER_STEP = re.compile(rf"^step=(\d+) global_loss={_FLOAT}")
_MEGATRAIN_TIME = re.compile(rf"Time: {_FLOAT}s \| Tokens/s")
_MEGATRAIN_LOSS = re.compile(rf"Step \d+/\d+ \| Loss {_FLOAT}")
_MEGATRAIN_PHASES = re.compile(rf"FWD: {_FLOAT}s \| BWD: {_FLOAT}s")
_MEGATRAIN_PEAK = re.compile(rf"Peak GPU: {_FLOAT} GB")
_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit)\w*)(?::|$)")
_OOM = ("OutOfMemoryError", "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED")


def probe_figures(lines: Lines, parsed: Parsed) -> None:
    """Peak GPU memory and peak RSS from peer_probe's last line."""
    for _, line in reversed(lines):
        if line.startswith(PROBE_MARKER + " "):
            figures = json.loads(line[len(PROBE_MARKER) + 1:])
            parsed.gpu_peak_gib = float(figures["gpu_peak_gib"])
            parsed.host_rss_peak_gib = float(figures["host_rss_peak_gib"])
            return


def parse_slideformer(lines: Lines) -> Parsed:
    """``step=N global_loss=X ranks=1`` per step (printed after ``wait_for_completion``): step k's time is the gap
    between the lines of steps k-1 and k, so step 1 (warm-up, model set-up before it) has none."""
    out = Parsed()
    stamps = []
    for t, line in lines:
        m = _SLIDEFORMER_STEP.match(line)
        if m:
            stamps.append(t)
            out.final_loss = float(m.group(2))
    out.step_times = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    out.extra["steps_printed"] = len(stamps)
    probe_figures(lines, out)
    if len(stamps) < 2:
        out.failure = f"printed {len(stamps)} step line(s); a step time needs two"
    return out


def parse_megatrain(lines: Lines) -> Parsed:
    """Each step's ``Time: X s`` (forward, backward, clip, DeepSpeedCPUAdam and the weight sync), ``FWD``/``BWD``
    seconds and loss; which optimizer it chose (it falls back to torch AdamW when DeepSpeed does not import)."""
    out = Parsed()
    phases = []
    for _, line in lines:
        if m := _MEGATRAIN_TIME.search(line):
            out.step_times.append(float(m.group(1)))
        elif m := _MEGATRAIN_LOSS.search(line):
            out.final_loss = float(m.group(1))
        elif m := _MEGATRAIN_PHASES.search(line):
            phases.append({"forward": float(m.group(1)), "backward": float(m.group(2))})
        elif m := _MEGATRAIN_PEAK.search(line):
            out.extra["own_gpu_peak_gib"] = float(m.group(1))
        elif "Using PyTorch AdamW optimizer" in line:
            out.failure = "ran with torch AdamW, not DeepSpeedCPUAdam (deepspeed did not import)"
        elif "Loss is nan" in line:  # it logs this and goes on, so the row must say it even if a time follows
            out.failure = f"its loss became NaN after {len(out.step_times)} step(s) ('Loss is nan!' in its log)"
    if phases:
        timed = phases[1:] or phases
        out.extra["phase_s"] = {k: statistics.median(p[k] for p in timed) for k in timed[0]}
    probe_figures(lines, out)
    if not out.step_times and out.failure is None:
        out.failure = "printed no step time"
    return out


def failure_reason(returncode: int | None, lines: Lines) -> str:
    """One phrase for a run that ended badly: its last exception line, else its exit status."""
    if returncode is None:
        return "stopped at its time limit"
    text = [line.strip() for _, line in lines if line.strip() and not line.startswith(PROBE_MARKER)]
    for line in reversed(text):
        if _ERROR.match(line):
            return line[:200]
    if returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}" + (
            " (the kernel's out-of-memory killer?)" if returncode == -signal.SIGKILL else "")
    return f"exit {returncode}" + (f": {text[-1][:160]}" if text else "")


def ran_out_of_gpu_memory(lines: Lines) -> bool:
    return any(marker in line for _, line in lines for marker in _OOM)


# ---- the two peers -----------------------------------------------------------------------------------------------
def slideformer_arguments(inputs: PeerInputs, script: Path, batch: int, steps: int) -> list[str]:
    """main_dp.py on one rank: the prepared checkpoint and packed tokens (batch x steps rows), lr as the others,
    every host core for its CPU Adam, double-buffered gradients; SDPA where this version of the script takes
    ``--attn-implementation`` (the first multi_gpu release hard-codes eager attention)."""
    argv = ["--model", str(inputs.checkpoint), "--tokens", str(inputs.tokens(batch)), "--batch-size", str(batch),
            "--steps", str(steps), "--lr", str(LR), "--cpu-threads", str(os.cpu_count() or 1), "--double-buffer"]
    if "--attn-implementation" in script.read_text():
        argv += ["--attn-implementation", "sdpa"]
    return argv


def megatrain_arguments(inputs: PeerInputs, script: Path, batch: int, steps: int) -> list[str]:
    return ["--config", str(inputs.megatrain_config), "--batch-size", str(batch), "--num-steps", str(steps),
            "--max-seq-len", str(inputs.seq)]


SLIDEFORMER = ExternalPeer(
    name="slideformer", folder="slideformer", script="multi_gpu/scripts/main_dp.py", python_path=(),
    modules=("transformers", "liger_kernel", "triton", "ninja"),
    optimizer="SlideFormer LayerAdam (its own C++ CPU Adam, adapted from DeepSpeed's), per layer during backward",
    differences=(
        "attention: eager where its main_dp.py takes no --attn-implementation (the e577d1aa release hard-codes "
        "it), else SDPA",
        "its process imports transformers 5.5.4 (its pin; carried in its folder), not the image's",
        "no global gradient clipping: each layer is updated as soon as its gradient lands",
        "no gradient accumulation: one optimizer step per backward",
        "AdamW betas (0.9, 0.999) and weight decay 0.01 are fixed in main_dp.py (others: 0.9/0.95, 0.0)",
        "fp32 master and moments on the host; bf16 weights and gradients cross PCIe",
        "loss: its vendored Liger fused linear cross-entropy (mean over seq-1 targets)",
        "checkpoints (each decoder layer's input) kept in pinned host memory",
    ),
    arguments=slideformer_arguments, parse=parse_slideformer)

MEGATRAIN = ExternalPeer(
    name="megatrain", folder="megatrain", script="examples/sft/train.py", python_path=(".",),
    modules=("transformers", "deepspeed", "datasets", "psutil", "yaml"),
    optimizer="DeepSpeedCPUAdam over bf16 host weights after backward, torch clip_grad_norm_ first",
    differences=(
        "bf16 parameters on the host with no fp32 master (AdamW updates bf16 weights; fp32 moments)",
        "activation checkpoint every 4 decoder layers (checkpoint_interval), each layer fetched 3 times a step",
        "loss over 128-token chunks whose log-probabilities stay until backward (no per-chunk recompute)",
        "attention: SDPA, not its default flash-attn 2 (not on the GPU machine); its layers get the 2-D padding "
        "mask flash-attn takes, which peer_probe translates for SDPA (no padding in these rows: causal)",
        "global clipping at 1.0 over bf16 CPU gradients; lr, betas, eps, weight decay as the others",
    ),
    arguments=megatrain_arguments, parse=parse_megatrain,
    probe_environment=(("PEER_PROBE_SDPA_PADDING_MASK", "1"),))

EXTERNAL: dict[str, ExternalPeer] = {p.name: p for p in (SLIDEFORMER, MEGATRAIN)}


# ---- inputs ------------------------------------------------------------------------------------------------------
def save_tokenizer(folder: Path) -> None:
    """A word-level tokenizer (``w0`` ... ``w999`` as one token each) with a chat template that joins the
    messages: MegaTrain's dataset applies a chat template, and no hub is reachable from the GPU machine."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(TOKENIZER_WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<eos>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tok.save_pretrained(folder)


def _words(count: int, offset: int) -> str:
    return " ".join(f"w{(offset + 7 * i) % TOKENIZER_WORDS}" for i in range(count))


def prepare_inputs(model: str, seq: int, batches: list[int], steps: int, workdir: Path, device: str) -> PeerInputs:
    """The checkpoint (once per model: kept while its config matches), tokens and dataset for every batch."""
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.common import synthetic_tokens
    from slidedp.runtime.hf_adapter import load_hf_config

    workdir.mkdir(parents=True, exist_ok=True)
    inputs = PeerInputs(checkpoint=workdir / "checkpoint", workdir=workdir, seq=seq, steps=steps)
    cfg = load_hf_config(model)
    stamp = inputs.checkpoint / "slidedp_source.json"
    source = {"model": model, "config": cfg.to_dict()}
    if not stamp.exists() or json.loads(stamp.read_text()) != json.loads(json.dumps(source, default=str)):
        t0 = time.perf_counter()
        where = device if device.startswith("cuda") and torch.cuda.is_available() else "cpu"
        with torch.device(where):
            lm = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        lm.save_pretrained(inputs.checkpoint)
        del lm
        if where != "cpu":
            torch.cuda.empty_cache()  # this worker stays alive while the peer runs: leave it the GPU's memory
        save_tokenizer(inputs.checkpoint)
        stamp.write_text(json.dumps(source, default=str))
        log(f"peer inputs: random-init {model} saved to {inputs.checkpoint} in {time.perf_counter() - t0:.0f} s")
    for batch in batches:
        tokens = synthetic_tokens(cfg.vocab_size, batch * steps, seq)[:, :seq].contiguous()
        torch.save(tokens.to(torch.int64), inputs.tokens(batch))
    data = inputs.megatrain_data
    data.mkdir(exist_ok=True)
    rows = [{"instruction": _words(seq // 2, i), "input": "", "output": _words(seq, i + 1)}
            for i in range(max(batches) * steps)]
    (data / "synthetic.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"synthetic": {"file_name": "synthetic.json"}}))
    inputs.megatrain_config.write_text(megatrain_yaml(inputs))
    return inputs


def megatrain_yaml(inputs: PeerInputs) -> str:
    """MegaTrain's configuration: the comparison's optimizer settings, every non-padding token trained on, its
    own defaults for the memory knobs (checkpoint every 4 layers, 12 gradient slabs)."""
    import yaml

    b1, b2 = BETAS
    return yaml.safe_dump({
        "model": {"name": str(inputs.checkpoint), "dtype": "bfloat16", "device": 0, "attn_implementation": "sdpa",
                  "trust_remote_code": False},
        "dataset": {"name": "synthetic", "dataset_dir": str(inputs.megatrain_data), "max_seq_len": inputs.seq,
                    "num_workers": 0, "train_on_prompt": True},
        "training": {"batch_size": 1, "gradient_accumulation_steps": 1, "num_steps": inputs.steps,
                     "learning_rate": LR, "weight_decay": 0.0, "max_grad_norm": CLIP, "seed": 42},
        "optimizer": {"type": "deepspeed_adam", "beta1": b1, "beta2": b2, "eps": EPS},
        "memory": {"checkpoint_interval": 4, "num_grad_slabs": 12},
        "logging": {"log_interval": 1, "enable_timing": False},
    }, sort_keys=False)


# ---- running -----------------------------------------------------------------------------------------------------
def run_logged(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float, log_path: Path) -> tuple[int | None,
                                                                                                          Lines]:
    """Run ``cmd``, timestamping each output line (stdout and stderr together) as it arrives; None for a run
    stopped at ``timeout`` seconds. The whole output goes to ``log_path``.

    The peer runs in a session of its own, so that stopping it stops whatever it started too. That session is
    outside the worker's, which the driver ends at its own time limit (SIGTERM, then SIGKILL): a SIGTERM to the
    worker therefore ends the peer's session first."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1, preexec_fn=die_with_parent, start_new_session=True)  # dies with the worker
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the peer and whatever it started (its session)

    timer = threading.Timer(timeout, stop)
    timer.start()
    lines: Lines = []
    with sigterm_raises_exit():
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("w") as f:
                for line in proc.stdout:
                    lines.append((time.monotonic(), line.rstrip("\n")))
                    f.write(line)
            code = proc.wait()
        finally:
            timer.cancel()
            end_process_group(proc, grace_s=5.0)  # anything of the peer's still running: not beside the next run
    return (None if stopped.is_set() else code), lines


def install_private_wheels(folder: Path) -> str | None:
    """Install the wheels of ``folder/wheels`` into ``folder/site`` (once per set of wheels: a stamp names them);
    the reason where pip fails, else None. Nothing to do for a folder without private wheels."""
    wheels = sorted((folder / PRIVATE_WHEELS_DIR).glob("*.whl"))
    if not wheels:
        return None
    site = folder / PRIVATE_SITE
    stamp = site / ".installed"
    names = "\n".join(w.name for w in wheels)
    if stamp.is_file() and stamp.read_text() == names:
        return None
    shutil.rmtree(site, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--disable-pip-version-check", "--target", str(site), *map(str, wheels)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"installing its private wheels failed: {last[:160]}"
    stamp.write_text(names)
    return None


def peer_env(peer: ExternalPeer, folder: Path, port: int) -> dict[str, str]:
    """One rank of a single-process group (SlideFormer's script initialises gloo from the environment), the
    peer's private site and folders first on PYTHONPATH, unbuffered output so the step lines arrive when
    printed."""
    env = dict(os.environ)
    site = [str((folder / PRIVATE_SITE).resolve())] if (folder / PRIVATE_SITE).is_dir() else []
    paths = site + [str((folder / p).resolve()) for p in peer.python_path]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env["PYTHONPATH"]] if env.get("PYTHONPATH") else paths)
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
    env.update(peer.probe_environment)
    return env


def source_of(folder: Path) -> dict:
    """Repository and commit the setup script recorded when it laid the sources out."""
    path = folder / "SOURCE.json"
    return json.loads(path.read_text()) if path.exists() else {}


def why_not_runnable(peer: ExternalPeer, peers_dir: Path) -> str | None:
    folder = peers_dir / peer.folder
    if not (folder / peer.script).is_file():
        return f"not prepared ({folder / peer.script} missing; see {SETUP_HINT})"
    missing = [m for m in peer.modules if find_spec(m) is None]
    if missing:
        return f"missing Python packages: {', '.join(missing)} (carry them as wheels; see {SETUP_HINT})"
    return None


def run_external_peer(args, emit, peer: ExternalPeer) -> None:
    """One row per batch of ``args.batches`` for ``peer``: run, out of memory (batches no smaller then skipped:
    BatchesAfterOom), or why not."""
    from slidedp.model_spec import load_model_spec

    peers_dir = Path(args.peers_dir)
    folder = peers_dir / peer.folder
    spec = load_model_spec(args.model)
    seq = args.seq
    base = {"system": peer.name, "model": args.model, "seq": seq, "gpus": 1, "optimizer": peer.optimizer,
            "differences": list(peer.differences), "source": source_of(folder)}

    def rows_for_all(status: str) -> None:
        for batch in args.batches:
            emit({**base, "batch": batch, "tokens_per_step": batch * seq, "status": status})

    if args.gpus != 1:
        rows_for_all(f"not run ({peer.name} runs on one GPU here)")
        return
    reason = why_not_runnable(peer, peers_dir) or install_private_wheels(folder)
    if reason:
        rows_for_all(f"not run ({reason})")
        return
    try:
        inputs = prepare_inputs(args.model, seq, args.batches, args.steps, Path(args.peer_inputs), args.device)
    except Exception as exc:  # noqa: BLE001 - a peer without inputs is a row with the reason, not a crash
        rows_for_all(f"not run (preparing its inputs failed: {str(exc).splitlines()[0][:160]})")
        return
    script = folder / peer.script
    env = peer_env(peer, folder, args.port)
    after_oom = BatchesAfterOom()
    for batch in args.batches:
        if after_oom.skips(batch):
            emit({**base, "batch": batch, "tokens_per_step": batch * seq, "status": SKIPPED_AFTER_OOM})
            continue
        cmd = [sys.executable, str(PROBE), str(script), *peer.arguments(inputs, script, batch, args.steps)]
        row = {**base, "batch": batch, "tokens_per_step": batch * seq, "command": " ".join(cmd[1:])}
        code, lines = run_logged(cmd, folder, env, args.batch_timeout,
                                 Path(args.out) / "peer_logs" / f"{peer.name}-b{batch}.log")
        parsed = peer.parse(lines)
        row.update(gpu_peak_gib=parsed.gpu_peak_gib, host_rss_peak_gib=parsed.host_rss_peak_gib, **parsed.extra)
        if code != 0 and ran_out_of_gpu_memory(lines):
            emit({**row, "status": "oom", "error": failure_reason(code, lines)})
            after_oom.ran_out(batch)
            continue
        if code != 0:
            # what its output said of the steps it did run before it ended (e.g. a NaN loss, then silence)
            detail = f" ({parsed.failure})" if parsed.failure and parsed.step_times else ""
            emit({**row, "status": f"failed: {failure_reason(code, lines)}{detail}"})
            continue
        if parsed.failure:
            emit({**row, "status": f"failed: {parsed.failure}"})
            continue
        step = parsed.step_time_s
        emit({**row, "status": "ok", "step_times_s": parsed.step_times, "step_time_s": step,
              "tokens_per_s": batch * seq / step, "model_tflops": spec.train_flops_per_token(seq) * batch * seq
              / step / 1e12, "final_loss": parsed.final_loss})

