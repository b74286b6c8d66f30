"""``slidedp train``'s settings: the flags, the run config file they can come from, and the TrainSpec.

Precedence, lowest first: the flag defaults, ``--config run.yaml`` (keys are the flag names, with - or _),
the flags given on the command line. The resolved settings (every one of them) are what the run directory's
config.yaml holds, so ``slidedp train --config <run>/config.yaml`` repeats a run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from slidedp.arg_types import fraction, non_negative_int, positive_float, positive_int
from slidedp.config_io import quote, read_mapping
from slidedp.errors import SlideDPError
from slidedp.state_choice import AUTO, state_arg, state_options

REQUIRED = ("model", "data", "steps", "out")
# Not saved in <out>/config.yaml: --overwrite would make `train --config <out>/config.yaml` delete a run unasked.
NOT_SETTINGS = ("config", "argv", "func", "command", "overwrite")
AUTO_POLICY = "auto"  # --policy auto: tune for this run, read before any file of that name
AUTO_BATCH_PER_RANK = 8  # --policy auto without --batch: sequences per rank the tuner plans for


def add_train_args(train: argparse.ArgumentParser) -> None:
    """Every train flag. Required ones are checked after --config is merged (they may come from the file)."""
    run = train.add_argument_group("run")
    run.add_argument("--config", help="run config YAML: any of these settings by name; flags given here override")
    run.add_argument("--model", help="preset, config.json, or HF checkpoint directory (safetensors loaded if present)")
    run.add_argument("--out", help="run directory")
    run.add_argument("--steps", type=positive_int,
                     help="optimizer steps this invocation runs (a count: a resumed run continues from the "
                          "checkpoint's global step and schedule)")
    run.add_argument("--seq", type=positive_int, default=4096, help="sequence length (default 4096)")
    run.add_argument("--batch", type=positive_int, help="global sequences per step (default: the policy's x ranks)")
    run.add_argument("--policy", help="policy YAML from slidedp tune, or 'auto': tune for this model, batch, seq "
                                      "and --hardware now (default: recompute, micro-batch 1)")
    run.add_argument("--state", type=state_arg, metavar="MODE",
                     help="host optimizer state precision: fp32 (exact, default), a compact mode such as fp32+int8 "
                          "or bf16+int8, or auto with --policy auto: the tuner chooses (slidedp.state_choice)")
    run.add_argument("--nproc", type=positive_int, default=1,
                     help="data-parallel ranks (one process per GPU via torchrun; all share one host state)")
    run.add_argument("--nnodes", type=positive_int, default=1,
                     help="hosts of the run (torchrun multi-node: start this command on every host with its "
                          "--node-rank and one --rdzv-endpoint); each host keeps one host state for its ranks")
    run.add_argument("--node-rank", type=non_negative_int, default=0, help="this host's index, 0 .. --nnodes - 1")
    run.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                     help="torchrun's c10d rendezvous endpoint, the same on every host (needed with --nnodes > 1)")
    run.add_argument("--host-layout", choices=["replicated", "sharded"],
                     help="across hosts: every host keeps the whole state, or 1/H of master and moments "
                          "(overrides the policy's host_layout)")
    run.add_argument("--ranks-per-gpu", type=positive_int, default=1,
                     help="ranks sharing each GPU (tests, small models; collectives then go over gloo)")
    run.add_argument("--hardware", default="h200-x1", help="profile for preflight and prediction (default h200-x1)")
    run.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    run.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"], help="compute dtype")
    run.add_argument("--seed", type=non_negative_int, default=0)
    run.add_argument("--gpu-budget", type=positive_float, metavar="GIB", help="GPU memory budget in GiB")
    run.add_argument("--host-limit", type=positive_float, metavar="GIB", help="host memory limit in GiB")

    data = train.add_argument_group("data")
    data.add_argument("--data", help="jsonl/json/parquet/csv/arrow/txt file or directory, a save_to_disk "
                                     "directory, or 'synthetic'")
    data.add_argument("--tokenizer", help="local HF tokenizer directory (default: byte-level)")
    data.add_argument("--format", default="auto", choices=["auto", "text", "prompt_completion", "messages"],
                      help="text (packed stream), prompt_completion, messages (chat template); auto: from the fields")
    data.add_argument("--fields", help="column names, e.g. prompt=question,completion=answer or role=from,"
                                       "content=value")
    data.add_argument("--train-on-prompt", action="store_true",
                      help="also take loss on system/user/prompt tokens (default: answers only)")
    data.add_argument("--no-packing", dest="packing", action="store_false",
                      help="one example per sequence (default: many per sequence, attention kept inside each)")
    data.add_argument("--too-long", default="truncate", choices=["truncate", "drop"],
                      help="examples longer than --seq: truncate (default) or drop; the count is printed")
    data.add_argument("--packed-attention", default="varlen", choices=["varlen", "mask"],
                      help="how packed rows keep attention inside each example: flash's variable-length kernel "
                           "(default; CUDA, else the mask) or a block-causal mask")
    data.add_argument("--eval-data", help="eval file or directory (same format)")
    data.add_argument("--eval-fraction", type=fraction, default=0.0, help="hold out this fraction of the rows")
    data.add_argument("--eval-every", type=non_negative_int, default=0,
                      help="evaluate every N steps (0, the default: only at the end; always at the end when "
                           "there is eval data)")
    data.add_argument("--cache-dir", help="tokenized-data cache (default <out>/data_cache)")

    opt = train.add_argument_group("optimizer")
    opt.add_argument("--lr", type=positive_float, help="peak learning rate (default 1e-5)")
    opt.add_argument("--weight-decay", type=float, default=0.0)
    opt.add_argument("--max-grad-norm", type=float, default=1.0, help="global clipping norm (0 disables)")
    opt.add_argument("--warmup", type=non_negative_int, help="warmup steps (default 0)")
    opt.add_argument("--total-steps", type=positive_int,
                     help="cosine schedule length (default --steps; on resume the checkpoint's)")
    opt.add_argument("--min-lr-ratio", type=float, help="final lr / peak lr (default 0.1)")

    out = train.add_argument_group("checkpoints, export and logs")
    out.add_argument("--resume", help="checkpoint directory to continue from")
    out.add_argument("--overwrite", action="store_true",
                     help="start a new run in an --out that holds an earlier one (its checkpoints, metrics.csv and "
                          "TensorBoard events are removed first); without it such an --out is refused")
    out.add_argument("--save-every", type=non_negative_int, default=0,
                     help="checkpoint every N steps and at the end (0, the default: only at the end)")
    out.add_argument("--keep", type=positive_int, default=1,
                     help="checkpoints kept: the latest in <out>/checkpoint and N-1 older checkpoint-step<N>")
    out.add_argument("--on-nonfinite", choices=["skip", "stop"], default="skip",
                     help="a NaN/inf gradient norm skips the step (default) or stops the run (exit 3)")
    out.add_argument("--no-checkpoint", action="store_true",
                     help="do not write the final checkpoint (benchmarks; --save-every still applies)")
    out.add_argument("--export-hf", help="write a Hugging Face model directory (bf16 safetensors, config, "
                                         "generation config, tokenizer) here at the end")
    out.add_argument("--log", default="tensorboard", choices=["tensorboard", "wandb", "none"],
                     help="TensorBoard event files in <out>/tensorboard (default), W&B (offline without a key), "
                          "or none; metrics.csv is always written")


SCHEDULE_DEFAULTS = {"lr": 1e-5, "warmup": 0, "min_lr_ratio": 0.1}


def resolve_settings(args: argparse.Namespace) -> argparse.Namespace:
    """Merge defaults < --config file < explicit flags; check the required settings; returns the namespace."""
    if args.config:
        parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
        add_train_args(parser)
        actions = {a.dest: a for a in parser._actions if a.dest != "help"}
        explicit = _explicit_flags(parser, args.argv[1:] if args.argv[:1] == ["train"] else args.argv)
        for key, value in read_mapping(args.config, "run config").items():
            dest = str(key).replace("-", "_")
            if dest in ("config",) or dest not in actions:
                raise SlideDPError(f"run config {args.config!r}: unknown setting {quote(key)}")
            if dest not in explicit:
                setattr(args, dest, _convert(actions[dest], value, args.config))
    missing = [f"--{k.replace('_', '-')}" for k in REQUIRED if getattr(args, k, None) in (None, "")]
    if missing:
        raise SlideDPError(f"missing {', '.join(missing)} (on the command line or in --config)")
    return args


# Settings that name files: config.yaml holds them absolute, so that the file reruns from any directory. The
# outputs always; the inputs where the name is a local path (a model or hardware preset, or a data set name,
# stays a name).
OUTPUT_PATH_SETTINGS = ("out", "cache_dir", "export_hf")
INPUT_PATH_SETTINGS = ("model", "data", "tokenizer", "eval_data", "policy", "resume", "hardware")


def _names_not_paths(key: str) -> set[str]:
    """The values of an input setting that name something rather than a file, read as such before any file of
    that name (--policy auto, --tokenizer bytes, --data synthetic, a model or hardware preset)."""
    from slidedp.hardware import hardware_presets
    from slidedp.presets.models import MODEL_PRESETS
    from slidedp.runtime.data import SYNTHETIC_DATA
    from slidedp.runtime.text_tokenizers import BYTE_TOKENIZER

    return {"model": set(MODEL_PRESETS), "hardware": set(hardware_presets()), "policy": {AUTO_POLICY},
            "tokenizer": {BYTE_TOKENIZER}, "data": {SYNTHETIC_DATA}}.get(key, set())


def settings(args: argparse.Namespace) -> dict:
    """The resolved settings, by name: what <out>/config.yaml holds."""
    def resolved(key: str, value):
        if not isinstance(value, str) or not value or os.path.isabs(value):
            return value
        if key in OUTPUT_PATH_SETTINGS or (key in INPUT_PATH_SETTINGS and os.path.exists(value)
                                           and value.lower() not in _names_not_paths(key)):
            return os.path.abspath(value)
        return value

    return {k: resolved(k, v) for k, v in vars(args).items() if k not in NOT_SETTINGS}


def _explicit_flags(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    for action in parser._actions:
        action.default = argparse.SUPPRESS
        action.required = False
    try:
        return set(vars(parser.parse_known_args(argv)[0]))
    except (argparse.ArgumentError, SystemExit):
        return set()


def _convert(action: argparse.Action, value, where: str):
    """A config value checked the way its flag is: booleans for switches, the flag's type and choices."""
    flag = action.option_strings[0]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise SlideDPError(f"run config {where!r}: {flag} must be true or false, got {quote(value)}")
        return value  # keys are the settings' names (packing: false), not the switches' (--no-packing)
    if value is None:
        return None
    if action.dest == "fields" and isinstance(value, dict):
        return value
    if isinstance(value, (dict, list)):
        raise SlideDPError(f"run config {where!r}: {flag} must be a single value, got {quote(value)}")
    if action.type is not None:
        try:
            value = action.type(str(value))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise SlideDPError(f"run config {where!r}: {flag}: {exc}") from None
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise SlideDPError(f"run config {where!r}: {flag} must be one of {', '.join(map(str, action.choices))}, "
                           f"got {quote(value)}")
    return value


def _checkpoint_schedule(resume: str | None) -> dict:
    """The schedule a checkpoint was trained with (its meta.json; verified later by the trainer)."""
    if not resume:
        return {}
    from slidedp.runtime.checkpoint_files import any_meta, read_meta

    try:
        return dict(read_meta(any_meta(Path(resume)), resume).get("schedule") or {})
    except (SlideDPError, ValueError, TypeError):
        return {}


def check_hosts_args(args: argparse.Namespace) -> None:
    """--nnodes, --node-rank and --rdzv-endpoint agree with each other."""
    if args.nnodes == 1:
        if args.rdzv_endpoint or args.node_rank:
            raise SlideDPError("--node-rank and --rdzv-endpoint need --nnodes above 1")
        return
    if args.node_rank >= args.nnodes:
        raise SlideDPError(f"--node-rank {args.node_rank} must be below --nnodes {args.nnodes}")
    endpoint = args.rdzv_endpoint or ""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SlideDPError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the same on every host), "
                           f"got {endpoint or 'none'}")


def build_train_spec(args: argparse.Namespace, log=print):
    from slidedp.policy import default_policy, load_policy_for
    from slidedp.problem import resolve_hardware
    from slidedp.routes import Routes
    from slidedp.runtime.data import DataSpec
    from slidedp.runtime.optim import OptimConfig
    from slidedp.runtime.trainer import TrainSpec

    resolve_settings(args)
    hw = resolve_hardware(args.hardware, None)
    ranks = args.nproc * args.nnodes  # every rank of every host: the global batch is per_rank x ranks
    if hw.num_gpus != args.nproc:  # the profile describes one host
        hw = hw.with_gpus(args.nproc)
    tuned = None
    if args.state == AUTO and args.policy != AUTO_POLICY:
        raise SlideDPError("--state auto lets the tuner choose the host state's precision: it needs --policy auto")
    if args.policy == AUTO_POLICY:
        policy, tuned = tune_policy(args, hw, log)
        source = "auto"
    elif args.policy:
        per_rank = args.batch // ranks if args.batch is not None and args.batch % ranks == 0 else None
        policy, source = load_policy_for(args.policy, per_rank), "file"
        if args.batch is not None and args.batch != policy.sequences_per_rank() * ranks:
            raise SlideDPError(f"--batch {args.batch} disagrees with the policy's micro_batch x accumulation x ranks "
                               f"= {policy.sequences_per_rank() * ranks}")
    else:
        policy, source = default_policy(args.batch or ranks, ranks), "default"
    policy = with_state(policy, args.state)
    if args.host_layout:
        policy = policy.with_(host_layout=args.host_layout)
    if policy.host_layout == "sharded" and not Routes.of(policy, args.nproc, hosts=args.nnodes).shards_hosts:
        log("note: host_layout sharded splits the state across hosts; on one host it is kept whole")
    # The schedule: flags, else (resuming) the checkpoint's, else the defaults; so a resume continues it.
    saved = _checkpoint_schedule(args.resume)
    pick = lambda name, key: getattr(args, name) if getattr(args, name) is not None else \
        saved.get(key, SCHEDULE_DEFAULTS.get(name))  # noqa: E731
    total = args.total_steps or saved.get("total_steps") or args.steps
    optim = OptimConfig(lr=pick("lr", "lr"), weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or None,
                        warmup_steps=pick("warmup", "warmup_steps"), total_steps=total,
                        min_lr_ratio=pick("min_lr_ratio", "min_lr_ratio"))
    # config.yaml: as resolved, except a schedule length the user left out: that follows --steps (or the
    # checkpoint's) when the file is run again with other --steps, as it did here.
    args.lr, args.warmup, args.min_lr_ratio = optim.lr, optim.warmup_steps, optim.min_lr_ratio
    if not args.resume and optim.total_steps < args.steps:
        after = f"step {args.steps}" if args.steps == optim.total_steps + 1 else \
            f"steps {optim.total_steps + 1}-{args.steps}"
        log(f"note: the learning-rate schedule ends at step {optim.total_steps} (--total-steps); {after} run at its "
            f"floor, lr {optim.lr * optim.min_lr_ratio:.3g}")
    check_hosts_args(args)
    world = int(os.environ.get("WORLD_SIZE", args.nproc * args.nnodes))
    if world != args.nproc * args.nnodes:
        raise SlideDPError(f"launched with WORLD_SIZE={world} but --nproc {args.nproc} x --nnodes {args.nnodes}")
    data = DataSpec(source=args.data, tokenizer=args.tokenizer, format=args.format, fields=args.fields,
                    train_on_prompt=args.train_on_prompt, packing=args.packing, too_long=args.too_long,
                    eval_source=args.eval_data, eval_fraction=args.eval_fraction)
    return TrainSpec(model=args.model, data=data, policy=policy, steps=args.steps, seq=args.seq,
                     out=Path(args.out), hardware=hw, optim=optim, tokenizer=args.tokenizer, device=args.device,
                     dtype=args.dtype, seed=args.seed, resume=args.resume, save_every=args.save_every,
                     export_hf=args.export_hf, gpu_budget_gib=args.gpu_budget, host_limit_gib=args.host_limit,
                     final_checkpoint=not args.no_checkpoint, world=world, hosts=args.nnodes,
                     on_nonfinite=args.on_nonfinite, packed_attention=args.packed_attention,
                     ranks_per_gpu=args.ranks_per_gpu,
                     eval_every=args.eval_every, log=args.log, keep=args.keep, cache_dir=args.cache_dir,
                     overwrite=args.overwrite,
                     run_config=settings(args), policy_source=source, tuner_step_time_s=tuned)


def with_state(policy, state: str | None):
    """The policy with ``--state`` (or the config's ``state:``) applied; None keeps the policy's own, and ``auto``
    the one the tuner chose (build_train_spec refuses ``auto`` without ``--policy auto``)."""
    from slidedp.state_precision import StatePrecision

    if state is None or str(state).strip().lower() == AUTO:
        return policy
    return policy.with_(state=StatePrecision.parse(state).name)


def device_gpu_gib(args: argparse.Namespace) -> float | None:
    """GPU memory one rank of this run will have (its card's, split between ranks that share it); None without
    a GPU. The tuner plans within it even where the hardware profile describes a larger card."""
    from slidedp.runtime.device import rank_gpu_gib

    return rank_gpu_gib(args.device, getattr(args, "ranks_per_gpu", 1))


def tune_policy(args: argparse.Namespace, hw, log=print):
    """--policy auto: the tuner's best policy for this model, batch, seq and hardware profile (with the
    memory budget the run will have), printed with its predicted step time. Returns (policy, seconds)."""
    from slidedp.model_spec import ModelSpec
    from slidedp.problem import resolve_budget
    from slidedp.runtime.hf_adapter import load_hf_config
    from slidedp.tune import TuneSpace, tune

    spec = ModelSpec.from_hf_config(load_hf_config(args.model).to_dict(), name=args.model)
    batch = args.batch or AUTO_BATCH_PER_RANK * hw.num_gpus
    budget = resolve_budget(hw, args.gpu_budget, args.host_limit, device_gpu_gib(args))
    space = TuneSpace(clipping=bool(args.max_grad_norm), states=state_options(args.state or "fp32"))
    result = tune(spec, hw, args.seq, batch, budget, space, refine_top=4)
    best = result.best
    predicted = best.sim_step_s if best.sim_step_s is not None else best.estimate.step_time_s
    p = best.policy
    how = "simulated" if best.sim_step_s is not None else "analytical"
    kept = f" (last {p.kept_layers} layers kept)" if p.kept_layers else ""
    log(f"policy auto: tuned for {hw.base_name}, seq {args.seq}, batch {batch} ({len(result.candidates)} candidates "
        f"fit, {result.elapsed_s:.1f} s): micro-batch {p.micro_batch} x {p.accumulation}, "
        f"{p.param_route}/{p.grad_route} routes, {p.chunks_per_layer} chunks/layer, depth {p.prefetch_depth}, "
        f"activations {p.activation}{kept}, "
        f"{p.update_schedule}{f', sequence tile {p.seq_tile_tokens}' if p.seq_tile_tokens else ''}, "
        f"host state {p.state}; predicted {predicted:.3f} s/step ({how})")
    if result.state_choice is not None:
        log(f"state auto: {p.state}: {result.state_choice.reason}")
    return p, predicted
