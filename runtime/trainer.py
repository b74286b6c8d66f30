"""``slidedp train``: validate everything, then stream-train and leave a run directory behind.

Nothing is written before every input has been checked and the memory preflight has passed, so a bad
invocation never leaves a half-made run directory.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from slidedp.errors import Interrupted, SlideDPError, TrainingStopped
from slidedp.exposure import exposure_from_trace, limiter
from slidedp.hardware import GIB, HardwareProfile, gib_text
from slidedp.model import estimate_memory, memory_shortfalls
from slidedp.model_spec import ModelSpec
from slidedp.output_paths import check_output_dir
from slidedp.policy import Policy
from slidedp.problem import REPLAN_BUDGET_FRACTION, gpu_memory_gib
from slidedp.report.rundir import measurement_files, write_run_dir
from slidedp.routes import Routes
from slidedp.run_summary import RunSummary, span_field
from slidedp.runtime import checkpoint_files, checkpoint_history
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.comm import Comm, HostGroups
from slidedp.runtime.data import DataSpec, LoadedData, Rows, load_data, rows_digest
from slidedp.runtime.device import Device, rank_gpu_gib
from slidedp.runtime.engine import EngineConfig, StepStats, StreamingEngine, shared_buffer_sizes
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.lifetime import RunLock
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.packed_attention import VarlenKernel, example_lengths, torch_varlen_kernel, varlen_available
from slidedp.runtime.run_logs import (
    METRICS_FILE,
    RunLog,
    check_logger,
    copy_rows_after,
    perplexity,
)
from slidedp.runtime.shared_dir import (
    LAUNCHER_PID_ENV,
    NODE_RANK_ENV,
    RUN_ID_ENV,
    SharedDir,
    new_run_id,
    state_dir,
)
from slidedp.runtime.tracing import TraceRecorder
from slidedp.sim import simulate
from slidedp.trace import EXPOSURE_CATEGORIES, busiest_resource
from slidedp.units import attention_span
from slidedp.workload import StepWorkload, threads_for_this_machine

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


DATA_CACHE = "data_cache"


@dataclass(frozen=True)
class TrainSpec:
    """Everything a run is. ``data`` is a path (text format, the tokenizer below) or a full DataSpec.
    ``steps`` counts the optimizer steps this invocation runs; a resumed run continues at the checkpoint's
    global step (and, through build_train_spec, its learning-rate schedule)."""

    model: str
    data: str | DataSpec
    policy: Policy
    steps: int
    seq: int
    out: Path
    hardware: HardwareProfile
    optim: OptimConfig = OptimConfig()
    tokenizer: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    resume: str | None = None
    save_every: int = 0
    export_hf: str | None = None
    gpu_budget_gib: float | None = None
    host_limit_gib: float | None = None
    final_checkpoint: bool = True
    world: int = 1  # data-parallel ranks of every host (one process each, launched by torchrun)
    hosts: int = 1  # hosts of the run (torchrun --nnodes); each keeps one host state for its world / hosts ranks
    ranks_per_gpu: int = 1  # ranks sharing one GPU: rank r computes on GPU r // ranks_per_gpu
    on_nonfinite: str = "skip"  # skip the step, or stop the run, when the gradient norm is NaN/inf
    packed_attention: str = "varlen"  # packed rows: varlen (flash's kernel where CUDA has it, else mask) | mask
    eval_every: int = 0  # evaluate every N steps (and at the end) when there is eval data; 0: at the end only
    log: str = "none"  # tensorboard | wandb | none (metrics.csv is always written)
    keep: int = 1  # checkpoints kept: the latest plus keep - 1 older ones
    cache_dir: str | None = None  # tokenized data cache (default <out>/data_cache)
    overwrite: bool = False  # start a new run in an --out that holds an earlier one (its checkpoint, metrics.csv)
    run_config: dict | None = None  # the resolved settings, saved as <out>/config.yaml
    policy_source: str = "file"  # file | default | auto (chosen by the tuner)
    tuner_step_time_s: float | None = None  # --policy auto: the tuner's predicted step time

    def __post_init__(self) -> None:
        if isinstance(self.data, str):
            object.__setattr__(self, "data", DataSpec(source=self.data, tokenizer=self.tokenizer))


def proc_bytes(path: str, field: str, missing: float = float("nan")) -> float:
    """A kB field of a /proc file (``field:  N kB``) in bytes; ``missing`` where the file or field is absent."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return missing


def _meminfo_available() -> float:
    return proc_bytes("/proc/meminfo", "MemAvailable", missing=float("inf"))


def rss_bytes(field: str = "VmRSS") -> float:
    return proc_bytes("/proc/self/status", field)


def pss_bytes() -> float:
    """This process's proportional set size: shared pages (the one host state in /dev/shm that every rank maps)
    count 1/N in each of the N processes that map them, so summed over a run's ranks it is what the group really
    holds, where the ranks' RSS would count the shared state once per rank."""
    return proc_bytes("/proc/self/smaps_rollup", "Pss")


def ranks_host_memory(world: Comm) -> tuple[list[float], list[float]]:
    """Every rank's peak RSS and current PSS (GiB), by rank, gathered over ``world`` (a CPU all-reduce of one
    row per rank: the world group carries CPU tensors on every backend the trainer uses)."""
    rows = torch.zeros(world.world, 2, dtype=torch.float64)
    rows[world.rank] = torch.tensor([rss_bytes("VmHWM"), pss_bytes()], dtype=torch.float64) / GIB
    if world.active:
        import torch.distributed as dist

        dist.all_reduce(rows, group=world.group)
    return rows[:, 0].tolist(), rows[:, 1].tolist()


class Trainer:
    def __init__(self, spec: TrainSpec, on_step: Callable[[int, StepStats, float], None] | None = None,
                 log: Callable[[str], None] = print):
        self.spec, self.on_step, self.log = spec, on_step, log
        # The signal number once something (slidedp train's SIGINT / SIGTERM handler) asked the run to stop; the
        # loop ends with errors.Interrupted after the step in progress, at a point where state and logs agree.
        self.stop_requested: Callable[[], int | None] | None = None
        self._validate()

    # ---- everything that can be wrong with the inputs, checked before anything is written -------------------
    def _validate(self) -> None:
        s = self.spec
        if s.steps < 1:
            raise SlideDPError("--steps must be at least 1")
        if s.keep < 1:
            raise SlideDPError("--keep must be at least 1")
        if s.keep > 1 and not s.final_checkpoint and not s.save_every:
            raise SlideDPError(f"--keep {s.keep} keeps checkpoints, but --no-checkpoint without --save-every writes "
                               f"none")
        if s.hosts > 1 and s.keep > 1:
            raise SlideDPError("--keep above 1 is not supported with --nnodes above 1 yet (one checkpoint per host "
                               "share is kept)")
        if s.hosts > 1 and s.world % s.hosts:
            raise SlideDPError(f"{s.world} ranks cannot be split evenly over {s.hosts} hosts")
        if s.hosts > 1 and s.policy.host_layout == "sharded" and s.policy.gpu_state_units:
            raise SlideDPError("host_layout sharded cannot yet hold units on the GPU: set gpu_state_units to 0")
        if s.hosts > 1 and s.policy.host_layout == "sharded":
            HostState.check_share_precision(s.policy.state_precision)  # before any rank starts
        if s.eval_every < 0:
            raise SlideDPError("--eval-every must be >= 0")
        check_logger(s.log)
        check_output_dir(s.out, "--out")
        if s.overwrite and s.resume is not None:
            raise SlideDPError("--overwrite starts a new run and --resume continues one: give one of them")
        launched = "WORLD_SIZE" in os.environ  # a rank: its launcher checked the directory and holds its lock
        if not launched and s.hosts == 1:  # several hosts lock the directory per node (RunLock), each its own
            RunLock.refuse_if_held(s.out)
        self.resumes_here = s.resume is not None and checkpoint_history.continues_history(s.out, Path(s.resume))
        earlier = [] if launched or self.resumes_here or s.overwrite else earlier_run(s.out)
        if earlier and s.resume is not None:
            raise SlideDPError(f"--out {str(s.out)!r} holds another run ({', '.join(p.name for p in earlier[:3])}"
                               f"{', ...' if len(earlier) > 3 else ''}) than the one --resume {s.resume!r} "
                               f"continues: choose another --out")
        if earlier:
            resume = f"--resume {str(checkpoint_history.latest(s.out))!r} to continue it, " \
                if checkpoint_history.latest(s.out).is_dir() else ""
            raise SlideDPError(f"--out {str(s.out)!r} holds an earlier run ({', '.join(p.name for p in earlier[:3])}"
                               f"{', ...' if len(earlier) > 3 else ''}): add {resume}--overwrite to start over "
                               f"there, or choose another --out")
        if s.cache_dir:
            check_output_dir(s.cache_dir, "--cache-dir")
        if s.export_hf:
            if Path(s.export_hf).resolve() == Path(s.out).resolve():
                raise SlideDPError(f"--export-hf {str(s.export_hf)!r} is the run directory --out: export the model "
                                   f"to a directory of its own (e.g. {str(Path(s.out) / 'hf')!r})")
            _check_export_dir(Path(s.export_hf))
        if s.policy.update_schedule == "as_ready" and s.on_nonfinite == "skip":
            # as_ready applies each chunk's update as its gradient lands, before the step's norm is known: a
            # non-finite step could only be skipped for the chunks that had not landed yet.
            raise SlideDPError("update_schedule as_ready updates chunks before the step's gradient norm is known, "
                               "so a non-finite step cannot be skipped cleanly: add --on-nonfinite stop (the run "
                               "ends at the first one) or use next_forward")
        device = s.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device not in ("cpu",) and not re.fullmatch(r"cuda(:\d+)?", device):
            raise SlideDPError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise SlideDPError("--device cuda was asked for but no CUDA device is available")
        self.rank = int(os.environ.get("RANK", "0")) if s.world > 1 else 0
        if device.startswith("cuda") and s.world > 1:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) // s.ranks_per_gpu}"
        self.device_name = device
        self.precision = s.policy.state_precision
        dtype = s.dtype if s.dtype != "auto" else \
            ("bf16" if device.startswith("cuda") or self.precision.master_streams else "fp32")
        if self.precision.master_streams and dtype != "bf16":
            raise SlideDPError(f"--state {self.precision.name}: a bf16 master is the weight the device reads, so "
                               f"--dtype must be bf16 (or auto), got {dtype}")
        if dtype not in DTYPES:
            raise SlideDPError(f"--dtype must be bf16 or fp32, got {dtype!r}")
        self.compute_dtype = DTYPES[dtype]
        self.config = load_hf_config(s.model)
        self.model_dir = Path(s.model) if Path(s.model).is_dir() else None
        if self.model_dir is not None and not list(self.model_dir.glob("*.safetensors")):
            self.model_dir = None  # a directory with only config.json: random init
        self.model_spec = ModelSpec.from_hf_config(self.config.to_dict(), name=Path(s.model).name or s.model)
        self.per_rank = s.policy.micro_batch * s.policy.accumulation
        self.per_step = self.per_rank * s.world  # global batch
        self.ranks_per_host = s.world // s.hosts
        self.host_index = int(os.environ.get("GROUP_RANK", "0")) if s.hosts > 1 else 0  # torchrun's node rank
        self.hw = s.hardware if s.hardware.num_gpus == self.ranks_per_host else \
            s.hardware.with_gpus(self.ranks_per_host)
        self.attention_span: float | None = None  # set below when packed rows take the varlen kernel
        self.workload = self._workload(s.policy)
        self.adam_threads_used = self.workload.adam_threads  # capped to this machine's cores on a GPU run
        if s.seq > getattr(self.config, "max_position_embeddings", s.seq):
            raise SlideDPError(f"--seq {s.seq} exceeds the model's max_position_embeddings "
                               f"{self.config.max_position_embeddings}")
        self.resume_meta = self._check_resume() if s.resume is not None else None
        self.start_step = int(self.resume_meta.get("data_step", 0)) if self.resume_meta else 0
        self.memory = estimate_memory(self.workload)
        # The memory this rank may use: --gpu-budget, else the profile's GPU or, where smaller, this rank's share
        # of the card it runs on (ranks sharing a card split it); the allocator is capped at it in run().
        gpu_budget = (s.gpu_budget_gib if s.gpu_budget_gib is not None else
                      gpu_memory_gib(s.hardware, rank_gpu_gib(device, s.ranks_per_gpu))) * GIB
        host_budget = (s.host_limit_gib * GIB) if s.host_limit_gib is not None else _meminfo_available()
        problems = memory_shortfalls(self.memory, gpu_budget, host_budget)
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            if self.memory.gpu_peak > free:
                problems.append(f"GPU peak {gib_text(self.memory.gpu_peak)} GiB exceeds the free "
                                f"{gib_text(free)} GiB on {device}")
        if problems:
            raise SlideDPError("preflight: " + "; ".join(problems))
        self.gpu_budget = gpu_budget
        cache = Path(s.cache_dir) if s.cache_dir else s.out / DATA_CACHE
        self.loaded: LoadedData = load_data(s.data, self.config.vocab_size, s.seq, self.per_step, s.seed, cache)
        self.data = self.loaded.train
        self.eval_rows: Rows | None = self.loaded.eval
        if s.eval_every and self.eval_rows is None:
            raise SlideDPError("--eval-every needs eval data: --eval-data or --eval-fraction")
        for note in self.loaded.notes:
            self.log(f"data: {note}")
        saved_data = (self.resume_meta or {}).get("data_key")
        # Hashed where the line is printed (the launcher, or rank 0); other ranks hash the rows only to save
        # their host's checkpoint (local rank 0), never just to compare (~30 ms per million tokens each).
        if saved_data and self.rank == 0 and saved_data != self.data_key:
            self.log(f"resume: the training rows differ from the checkpoint's run (data, tokenizer, packing or seed); "
                     f"steps from {self.start_step + 1} on draw rows of this data")
        self.varlen_kernel = self._varlen_kernel(torch.device(device))
        if self.varlen_kernel is not None:  # attention stays inside the examples: priced by their lengths
            self.attention_span = attention_span(example_lengths(self.data.rows.segments))
            self.workload = self._workload(s.policy)
            self.log(f"packed rows: the examples' attention span is {self.attention_span:.0f} tokens (slidedp "
                     f"simulate/tune --attention-span {self.attention_span:.0f} price this data)")
        if self.loaded.cached:
            self.log(f"data: tokenized rows reused from {self.loaded.cache_file}")

    def _check_resume(self) -> dict:
        """The checkpoint to resume from, verified before anything is allocated (digest, header, sizes), with
        an interrupted save of it finished or undone first; a different model is refused, other differences
        from the run it came from are stated."""
        s = self.spec
        path = Path(s.resume)
        if not path.is_dir():
            aside = [p.name for p in checkpoint_history.superseded(path.parent)]
            where = f" (a resume from an earlier step moved later checkpoints into {', '.join(aside)})" if aside else ""
            raise SlideDPError(f"--resume {s.resume!r}: no such checkpoint directory{where}")
        checkpoint_files.check_hosts(path, s.hosts)
        if s.hosts > 1 and "WORLD_SIZE" not in os.environ:
            # A launcher: which share this host resumes is known once torchrun's rendezvous has placed it.
            return checkpoint_files.read_meta(checkpoint_files.any_meta(path), f"--resume {s.resume!r}")
        path = checkpoint_files.share_dir(path, self.host_index, s.hosts)
        for line in checkpoint_files.recover(path):
            self.log(f"checkpoint: {line}")
        if not path.is_dir():
            raise SlideDPError(f"--resume {s.resume!r}: no share of host {self.host_index} ({path.name})")
        meta = checkpoint_files.verify(path, self._share_numel(), self.precision)
        saved_spec = meta.get("model_spec")
        if saved_spec is not None and {k: v for k, v in saved_spec.items() if k != "name"} != \
                {k: v for k, v in self.model_spec.to_dict().items() if k != "name"}:
            raise SlideDPError(f"--resume {s.resume!r} holds another model ({saved_spec.get('name')}: "
                               f"{saved_spec.get('layers')} layers, hidden {saved_spec.get('hidden')}); refusing")
        now = {"world": s.world, "seq": s.seq, "batch": self.per_step, "policy": s.policy.to_dict(),
               "schedule": schedule_dict(s.optim)}
        for line in resume_differences(meta, now):
            self.log(f"resume: {line}")
        return meta

    def _share_table(self, adapter: ModelAdapter, local_rank: int = 0) -> ChunkTable:
        """This host's chunks and share of the parameters (all of them unless sharded across hosts)."""
        routes = Routes.of(self.spec.policy, self.ranks_per_host, hosts=self.spec.hosts)
        return ChunkTable(adapter.units, routes, local_rank, host=self.host_index)

    def _share_numel(self) -> int:
        return self._share_table(ModelAdapter(self.config)).share_numel

    def _checkpoint_dir(self, directory: Path) -> Path:
        return checkpoint_files.share_dir(directory, self.host_index, self.spec.hosts)

    @functools.cached_property
    def data_key(self) -> str:
        """The training rows' content digest (runtime.data.rows_digest), once per run."""
        return rows_digest(self.data.rows, self.spec.seed)

    # ---- the run ----------------------------------------------------------------------------------------------
    def out_of_memory_message(self, exc: BaseException) -> str:
        """One line for a run whose plan did not fit the GPU after all: what the memory model predicted, the
        budget it was planned in, what the allocator reported, and what to do."""
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return (f"out of GPU memory: the plan's predicted peak was {self.memory.gpu_peak / GIB:.1f} GiB of a "
                f"{self.gpu_budget / GIB:.1f} GiB budget ({first}); plan for less, e.g. --policy auto "
                f"--gpu-budget {REPLAN_BUDGET_FRACTION * self.gpu_budget / GIB:.0f}, or a smaller micro-batch")

    def run(self) -> RunSummary:
        s = self.spec
        groups = self._init_distributed()
        comm, world = groups.local, groups.world
        device = Device(self.device_name)
        if device.is_cuda:
            total = torch.cuda.get_device_properties(device.torch_device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.gpu_budget / total), device.torch_device)
            torch.cuda.reset_peak_memory_stats(device.torch_device)
        adapter = ModelAdapter(self.config)
        bf16_grads = s.policy.grad_dtype == "bf16" and self.compute_dtype == torch.bfloat16
        grad_dtype = torch.bfloat16 if bf16_grads else torch.float32
        shared = None
        share = self._share_table(adapter, comm.rank).share_pieces()
        if world.active:
            shared, host, start_step = self._shared_state(adapter, groups, device, grad_dtype, share)
        else:
            host = HostState.allocate(adapter.total_params, self.compute_dtype, grad_dtype, pin=device.is_cuda,
                                      precision=self.precision, unit_numels=[u.numel for u in adapter.units],
                                      share=share)
            start_step = self._initialise(host, adapter, device)
        where = (f"predicted GPU peak {self.memory.gpu_peak / GIB:.1f} GiB of a {self.gpu_budget / GIB:.1f} GiB budget"
                 if device.is_cuda else "device cpu: no GPU, the weights stream into host memory")
        spec_bytes = self.precision.host_bytes_per_param(host.grad_buffer.element_size(), self.compute_dtype.itemsize)
        self.log(f"host state {self.precision.name} (master {self.precision.master}, moments {self.precision.moments}"
                 f"): {spec_bytes:.2f} bytes/param by spec")
        self.log(f"host state: {host.bytes_per_param():.1f} bytes/param x {adapter.total_params / 1e9:.3f} B params "
                 f"= {host.total_bytes() / GIB:.2f} GiB (one copy for {comm.world} rank(s), pinned={host.pinned}"
                 f"{f'; host {groups.host} of {groups.hosts}, {s.policy.host_layout}' if groups.hosts > 1 else ''}); "
                 f"{where}")
        threads = self._adam_threads(comm.rank) if device.is_cuda else None
        seed = int(self.resume_meta.get("rounding_seed", s.seed)) if self.resume_meta else s.seed
        config = EngineConfig(s.policy, s.optim, s.seq, self.compute_dtype, adam_threads=threads, rounding_seed=seed,
                              varlen_kernel=self.varlen_kernel)
        engine = StreamingEngine(config, adapter, self.model_spec, host, device, TraceRecorder(device, rank=world.rank),
                                 groups=groups)
        if s.resume and host.share is not None:  # each host loaded its share: every host's into every slot
            engine.publish_share()
        s.out.mkdir(parents=True, exist_ok=True)
        if s.overwrite and not s.resume and world.rank == 0:
            for line in _clear_earlier_run(s.out):
                self.log(f"--overwrite: removed {line}")
        if comm.rank == 0 and not s.overwrite:  # a save of this host's checkpoint (share) that a kill interrupted
            for line in checkpoint_files.recover(self._checkpoint_dir(checkpoint_history.latest(s.out))):
                self.log(f"checkpoint: {line}")
        if world.rank == 0 and self.resumes_here and s.hosts == 1 and (s.final_checkpoint or s.save_every):
            moved = checkpoint_history.set_aside_later_checkpoints(s.out, start_step)
            if moved is not None:
                copy_rows_after(s.out / METRICS_FILE, start_step, moved / METRICS_FILE)
                self.log(f"resume: from step {start_step}; the earlier run's checkpoints past it, and its metrics "
                         f"rows, are moved to {moved}")
        if world.rank == 0 and s.run_config is not None:
            import yaml

            (s.out / "config.yaml").write_text(yaml.safe_dump(s.run_config, sort_keys=False))
        runlog = RunLog(s.out, s.log, resume_step=start_step if self.resumes_here else None, config=s.run_config,
                        active=world.rank == 0, log=self.log)
        try:
            times, last, evals = self._loop(engine, host, device, start_step, runlog, groups)
            if s.export_hf and world.rank == 0:
                from slidedp.runtime.export import export_hf

                export_hf(host, adapter, Path(s.export_hf), s.data.tokenizer, self.config)
                self.log(f"exported {s.export_hf}")
            exposure = exposure_from_trace(last.trace)
            memory = ranks_host_memory(world)
            summary = self._summary(last, times, device, host, exposure, evals, start_step, memory)
            if world.active:
                last.trace.to_parquet(s.out / f"trace_rank{world.rank}.parquet", index=False)
            if world.rank == 0:
                write_run_dir(s.out, last.trace, exposure, summary, s.policy, s.hardware)
            world.barrier()
        finally:
            runlog.close()
            engine.close()
            host.close()
            if world.active:
                import torch.distributed as dist

                dist.destroy_process_group()
                if comm.rank == 0 and shared is not None:
                    shared.remove()
        return summary

    def _init_distributed(self) -> HostGroups:
        """The default process group and, over several hosts, the host and peer groups (runtime.comm)."""
        if self.spec.world == 1:
            return HostGroups.single()
        import torch.distributed as dist

        cuda = self.device_name.startswith("cuda")
        shared_gpu = cuda and self.spec.ranks_per_gpu > 1  # NCCL refuses two ranks on one device
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if cuda and not shared_gpu else "gloo"
            if cuda:
                torch.cuda.set_device(torch.device(self.device_name))
            dist.init_process_group(backend)
        groups = HostGroups.create(self.spec.hosts, host_staged=shared_gpu)
        comm = groups.world
        if groups.hosts > 1 and groups.host != self.host_index:
            raise SlideDPError(f"rank {comm.rank} is on host {groups.host} by its rank but torchrun placed it on "
                               f"node {self.host_index}: every host must run the same --nproc")
        if shared_gpu and comm.rank == 0:
            self.log(f"{self.spec.ranks_per_gpu} ranks share each GPU: collectives run over gloo through host "
                     "memory (slower than NCCL; for tests and small models)")
        if not self.device_name.startswith("cuda"):  # ranks share the cores instead of oversubscribing them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.world))
        if comm.world != self.spec.world:
            raise SlideDPError(f"launched with {comm.world} ranks, the run asked for {self.spec.world}")
        return groups

    def _varlen_kernel(self, device: torch.device) -> VarlenKernel | None:
        """The varlen attention kernel for packed rows (--packed-attention varlen where this device has one)."""
        packed = self.data.rows.segments is not None
        if self.spec.packed_attention != "varlen" or not packed:
            return None
        # Unpacked rows (--no-packing) hold one example and its padding, which still takes the same attention.
        rows = "packed rows" if self.spec.data.packing else "rows of one example and padding"
        if not varlen_available(device):
            self.log(f"{rows}: attention through a block-causal mask (no varlen kernel on {device.type})")
            return None
        self.log(f"{rows}: attention through flash's variable-length kernel (--packed-attention mask: the mask)")
        return torch_varlen_kernel()

    def _workload(self, policy) -> StepWorkload:
        """This host's step as the simulator sees it: the policy on this host's ranks, priced for the data."""
        s = self.spec
        return StepWorkload(self.model_spec, self.hw, policy, s.seq, self.per_rank * self.ranks_per_host,
                            attention_span=self.attention_span)

    def _adam_threads(self, rank: int) -> int:
        """The planned optimizer threads, capped at this machine's cores per rank (said once, by rank 0). When
        capped, the prediction the summary records is made for the threads the run uses."""
        planned, cores = self.workload.adam_threads, len(os.sched_getaffinity(0))
        threads = threads_for_this_machine(planned, cores, self.ranks_per_host)
        self.adam_threads_used = threads
        if threads < planned:
            self.workload = self._workload(self.spec.policy.with_(adam_threads=threads))
            if rank == 0:
                self.log(f"optimizer threads: {threads} per rank, not the plan's {planned}: this machine has {cores} "
                         f"cores for {self.ranks_per_host} rank(s) (the profile or policy describes a larger host)")
        return threads

    def _initialise(self, host: HostState, adapter: ModelAdapter, device: Device) -> int:
        """Fill the state (resume, HF weights or random init); returns the data step to continue from."""
        s = self.spec
        if s.resume:
            step = int(host.load(self._checkpoint_dir(Path(s.resume)))["data_step"])
            self.log(f"resumed from {s.resume} at step {step}")
            return step
        if self.model_dir is not None:
            host.load_hf_weights(adapter, self.model_dir)
        else:
            host.init_random(adapter, s.seed, device.torch_device)
        return 0

    def _shared_state(self, adapter: ModelAdapter, groups: HostGroups, device: Device, grad_dtype: torch.dtype,
                      share: list[tuple[int, int, int]] | None) -> tuple[SharedDir, HostState, int]:
        """Each host's local rank 0 creates the host's private state directory and fills its one host state;
        the host's other ranks check it and map the same pages afterwards; then local rank 0 removes the
        directory's names, so that the state lives in /dev/shm by name only while the ranks set up. The
        directory's random name comes from the host's launcher (or from local rank 0, under a bare torchrun)
        and travels as a tensor within the host, never pickled; over several hosts it carries the node rank,
        so that hosts sharing one /dev/shm (emulated on one machine) never meet."""
        import torch.distributed as dist

        s = self.spec
        comm = groups.local
        flags, landing = shared_buffer_sizes(adapter, s.policy, comm.world)
        args = (adapter.total_params, self.compute_dtype, grad_dtype)
        kwargs = dict(pin=device.is_cuda, flags=flags, world=comm.world, landing_numel=landing,
                      precision=self.precision, unit_numels=[u.numel for u in adapter.units], share=share)
        run_id = os.environ.get(RUN_ID_ENV) or new_run_id()
        sync_device = self.device_name if self.device_name.startswith("cuda") and not comm.host_staged else "cpu"
        ident = torch.tensor(list(bytes.fromhex(run_id)), dtype=torch.uint8, device=sync_device)
        dist.broadcast(ident, src=groups.host * comm.world, group=comm.group)
        node = int(os.environ.get(NODE_RANK_ENV, groups.host)) if groups.hosts > 1 else None
        path = state_dir(bytes(ident.cpu().tolist()).hex(), node=node)
        info = torch.zeros(2, dtype=torch.int64, device=sync_device)
        if comm.rank == 0:
            launcher = int(os.environ.get(LAUNCHER_PID_ENV, os.getpid()))
            shared = SharedDir.create(path, launcher, s.out.resolve())
            host = HostState.allocate_shared(shared, *args, create=True, **kwargs)
            info[0], info[1] = self._initialise(host, adapter, device), host.step
            host.flags.fill_(host.step)
        dist.broadcast(info, src=groups.host * comm.world, group=comm.group)  # also the barrier: the files exist
        if comm.rank != 0:
            shared = SharedDir.attach(path)
            host = HostState.allocate_shared(shared, *args, create=False, **kwargs)
            host.step = int(info[1])
        comm.barrier()  # every rank has mapped every file
        if comm.rank == 0:
            # The mappings keep the pages; with the names gone, no kill of any process (the launcher's SIGKILL
            # included) can leave the state in /dev/shm: the kernel frees it when the last rank exits.
            shared.remove()
        return shared, host, int(info[0])

    def evaluate(self, engine: StreamingEngine, comm: Comm) -> tuple[float, int]:
        """``comm``: every rank of every host."""
        """Mean token loss over the eval rows, in groups of one global batch (the step's memory), each group's
        rows dealt to the ranks in turn; returns (loss, trained tokens)."""
        rows = self.eval_rows
        total, count = 0.0, 0
        for g in range(0, len(rows), self.per_step):
            group = rows.select(slice(g, g + self.per_step))
            loss_sum, n = engine.evaluate(group.select(slice(comm.rank, None, comm.world)))
            total, count = total + loss_sum, count + n
        return total / max(1, count), count

    def _loop(self, engine: StreamingEngine, host: HostState, device: Device, start_step: int, runlog: RunLog,
              groups: HostGroups) -> tuple[list[float], StepStats, list[tuple[int, float]]]:
        s = self.spec
        comm = groups.world
        evals: list[tuple[int, float]] = []
        fault_rank, fault_step = os.environ.get("SLIDEDP_FAULT_RANK"), os.environ.get("SLIDEDP_FAULT_STEP")
        nan_step = os.environ.get("SLIDEDP_FAULT_NAN_STEP")  # fault injection: a NaN gradient at this step
        oom_step = os.environ.get("SLIDEDP_FAULT_OOM_STEP")  # fault injection: the GPU allocator fails at this step
        times: list[float] = []
        last = None
        for step in range(start_step, start_step + s.steps):
            if fault_rank is not None and int(fault_rank) == comm.rank and int(fault_step) == step + 1:
                os.kill(os.getpid(), signal.SIGKILL)  # fault injection for the failure tests: die mid-run
            engine.poison_next_gradient = nan_step is not None and int(nan_step) == step + 1
            if oom_step is not None and int(oom_step) == step + 1:
                raise torch.OutOfMemoryError(f"CUDA out of memory (fault injection at step {step + 1})")
            t0 = time.perf_counter()
            batch = self.data.batch(step)
            trained = batch.label_tokens()  # the loss is the mean over the global batch's trained tokens
            stats = engine.step(batch.select(slice(comm.rank * self.per_rank, (comm.rank + 1) * self.per_rank)),
                                total_tokens=trained)
            dt = time.perf_counter() - t0
            times.append(dt)
            last = stats
            peak = torch.cuda.max_memory_allocated(device.torch_device) / GIB if device.is_cuda else 0.0
            row = {"step": step + 1, "loss": f"{stats.loss:.6f}", "grad_norm": f"{stats.grad_norm:.6f}",
                   "lr": f"{stats.lr:.3e}", "skipped": int(stats.skipped), "step_time_s": f"{dt:.4f}",
                   "tokens_per_s": f"{self.per_step * s.seq / dt:.1f}", "gpu_peak_gib": f"{peak:.2f}",
                   "host_rss_gib": f"{rss_bytes() / GIB:.2f}"}
            final = step + 1 == start_step + s.steps
            if self.eval_rows is not None and ((s.eval_every and (step + 1) % s.eval_every == 0) or final):
                eval_loss, _ = self.evaluate(engine, comm)
                evals.append((step + 1, eval_loss))
                row.update(eval_loss=f"{eval_loss:.6f}", eval_ppl=f"{perplexity(eval_loss):.4f}")
                if not final:  # the closing lines (commands/train.run_outcome) say the final one
                    self.log(f"step {step + 1}: eval loss {eval_loss:.4f}, perplexity {perplexity(eval_loss):.2f}")
            runlog.step(row)
            if stats.skipped:
                if s.on_nonfinite == "stop":
                    untouched = ("chunks updated before the norm was known (as_ready) keep their update; the last "
                                 "checkpoint is intact" if s.policy.update_schedule == "as_ready"
                                 else "the host state was not updated by that step")
                    raise TrainingStopped(f"non-finite gradient norm at step {step + 1}: stopped (--on-nonfinite "
                                          f"stop); {untouched}")
                self.log(f"step {step + 1}: non-finite gradient norm, update skipped (host state untouched)")
            if self.on_step and comm.rank == 0:
                self.on_step(step + 1, stats, dt)
            if s.save_every and (step + 1) % s.save_every == 0:
                self._checkpoint(engine, host, groups, step + 1)
            requested = self.stop_requested() if self.stop_requested is not None else None
            if requested is not None and step + 1 < start_step + s.steps:  # a signal asked the run to stop
                raise Interrupted(requested)
        end = start_step + s.steps
        if s.final_checkpoint and not (s.save_every and end % s.save_every == 0):  # not saved a moment ago
            self._checkpoint(engine, host, groups, end)
        elif not s.final_checkpoint:
            engine.flush()
        return times, last, evals

    def _checkpoint(self, engine: StreamingEngine, host: HostState, groups: HostGroups, data_step: int) -> None:
        """Each host's local rank 0 writes the host's state (its share, over several hosts)."""
        engine.flush()
        groups.world.barrier()  # every owner on every host has applied its updates
        if groups.local.rank == 0:
            s = self.spec
            latest = checkpoint_history.latest(s.out)
            if s.keep > 1:
                checkpoint_history.keep_aside(s.out, data_step)
            hosts = {"hosts": groups.hosts, "host": groups.host} if groups.hosts > 1 else {}
            if hosts:
                latest.mkdir(parents=True, exist_ok=True)
            host.save(self._checkpoint_dir(latest), {
                "data_step": data_step, "policy": s.policy.to_dict(), "world": groups.world.world, "seq": s.seq,
                "batch": self.per_step, "model_spec": self.model_spec.to_dict(), "schedule": schedule_dict(s.optim),
                "rounding_seed": engine.config.rounding_seed, "data_key": self.data_key, **hosts})
            checkpoint_history.prune(s.out, s.keep - 1)
        groups.world.barrier()

    def _summary(self, last: StepStats, times: list[float], device: Device, host: HostState,
                 exposure, evals: list[tuple[int, float]], start_step: int,
                 ranks_memory: tuple[list[float], list[float]]) -> RunSummary:
        s = self.spec
        steady = times[1:] if len(times) > 1 else times
        step_time = statistics.median(steady)
        mean = exposure.drop(columns="rank").mean()
        predicted = simulate(self.workload)
        return RunSummary(
            model=self.model_spec.name, model_spec=self.model_spec.to_dict(), hardware=s.hardware.name,
            gpus=s.world, seq=s.seq, **span_field(self.attention_span), adam_threads=self.adam_threads_used,
            batch=self.per_step, tokens_per_step=self.per_step * s.seq, policy=s.policy.to_dict(),
            ranks=s.world,
            source="measured", device=self.device_name, dtype=str(self.compute_dtype).replace("torch.", ""),
            steps=len(times), step_time_s=step_time, tokens_per_s=self.per_step * s.seq / step_time,
            model_tflops_per_gpu=self.workload.model_flops_per_step() / step_time / s.world / 1e12,
            limiter=limiter(float(mean["compute"]), {c: float(mean[c]) for c in EXPOSURE_CATEGORIES}),
            bottleneck=_device_label(busiest_resource(last.trace), device),
            final_loss=last.loss,
            gpu_peak_gib=torch.cuda.max_memory_allocated(device.torch_device) / GIB if device.is_cuda else None,
            predicted_gpu_peak_gib=self.memory.gpu_peak / GIB,
            predicted_gpu_allocated_gib=self.memory.gpu_allocated_peak / GIB,  # compare with gpu_peak_gib
            host_rss_peak_gib=rss_bytes("VmHWM") / GIB,
            host_rss_peak_gib_by_rank=ranks_memory[0], host_pss_gib_by_rank=ranks_memory[1],
            host_state_bytes_per_param=host.bytes_per_param(),
            predicted_step_time_s=predicted.step_time_s,
            predicted_limiter=predicted.limiter,
            pid=os.getpid(),
            global_step=start_step + len(times),
            policy_source=s.policy_source,
            tuner_step_time_s=s.tuner_step_time_s,
            data_format=self.loaded.format,
            **({"eval_loss": evals[-1][1], "eval_perplexity": perplexity(evals[-1][1])} if evals else {}),
        )


def _device_label(resource: str, device: Device) -> str:
    """Trace resources keep the schema's names (gpu[g]) on any device; a CPU run's report says cpu."""
    return resource if device.is_cuda or not resource.startswith("gpu[") else "compute on cpu"


def resume_differences(then: dict, now: dict) -> list[str]:
    """What differs between a checkpoint's run (its meta.json) and this one, a line per setting: a dict-valued
    setting (the policy, the schedule) by its fields that differ, so the change is never cut off."""
    lines = []
    for key, value in now.items():
        if key not in then or then[key] == value:
            continue
        if isinstance(value, dict) and isinstance(then[key], dict):
            fields = sorted(set(value) | set(then[key]))
            changed = [f"{f} {then[key].get(f)!r} -> {value.get(f)!r}" for f in fields
                       if then[key].get(f) != value.get(f)]
            lines.append(f"{key} differs from the checkpoint's run: {', '.join(changed)}")
        else:
            lines.append(f"{key} differs from the checkpoint's run: {then[key]!r} then, {value!r} now")
    return lines


def schedule_dict(optim: OptimConfig) -> dict:
    """The learning-rate schedule a checkpoint carries, so a resumed run continues the same one."""
    return {"lr": optim.lr, "warmup_steps": optim.warmup_steps, "total_steps": optim.total_steps,
            "min_lr_ratio": optim.min_lr_ratio}


def _check_export_dir(path: Path) -> None:
    """An export target must be writable, and empty or an earlier export (its config.json), so nothing else in
    it is overwritten."""
    check_output_dir(path, "--export-hf")
    if path.is_dir() and any(path.iterdir()) and not (path / "config.json").is_file():
        raise SlideDPError(f"--export-hf {str(path)!r} is a non-empty directory that is not an earlier export")


def earlier_run(out: Path) -> list[Path]:
    """What an earlier run left in ``out`` that a new one would mix with its own: its checkpoint, kept
    checkpoints and interrupted saves, metrics, TensorBoard events and measurement files. One list, which
    decides whether ``out`` holds a run and is what --overwrite removes; nothing else in ``out`` is touched."""
    return checkpoint_history.training_history(out) + measurement_files(out)


def _clear_earlier_run(out: Path) -> list[str]:
    """--overwrite: remove ``earlier_run(out)``; links are removed, never followed."""
    removed = []
    for path in earlier_run(out):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed
