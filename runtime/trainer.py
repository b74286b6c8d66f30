"""``slidedp train``: validate everything, then stream-train and leave a run directory behind.

Nothing is written before every input has been checked and the memory preflight has passed, so a bad
invocation never leaves a half-made run directory.
"""

from __future__ import annotations

import csv
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from slidedp.errors import SlideDPError, TrainingStopped
from slidedp.exposure import exposure_from_trace, limiter
from slidedp.hardware import GIB, HardwareProfile
from slidedp.model import estimate_memory, memory_shortfalls
from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.report.rundir import write_run_dir
from slidedp.run_summary import RunSummary
from slidedp.runtime import checkpoint_files
from slidedp.runtime.comm import Comm
from slidedp.runtime.data import PackedData, load_data
from slidedp.runtime.device import Device
from slidedp.runtime.engine import EngineConfig, StepStats, StreamingEngine, shared_buffer_sizes
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.shared_dir import LAUNCHER_PID_ENV, RUN_ID_ENV, SharedDir, new_run_id, state_dir
from slidedp.runtime.tracing import TraceRecorder
from slidedp.sim import simulate
from slidedp.trace import EXPOSURE_CATEGORIES
from slidedp.workload import StepWorkload

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class TrainSpec:
    model: str
    data: str
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
    world: int = 1  # data-parallel ranks (one process each, launched by torchrun)
    ranks_per_gpu: int = 1  # ranks sharing one GPU: rank r computes on GPU r // ranks_per_gpu
    on_nonfinite: str = "skip"  # skip the step, or stop the run, when the gradient norm is NaN/inf


def _meminfo_available() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def rss_bytes(field: str = "VmRSS") -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("nan")


class Trainer:
    def __init__(self, spec: TrainSpec, on_step: Callable[[int, StepStats, float], None] | None = None,
                 log: Callable[[str], None] = print):
        self.spec, self.on_step, self.log = spec, on_step, log
        self._validate()

    # ---- everything that can be wrong with the inputs, checked before anything is written -------------------
    def _validate(self) -> None:
        s = self.spec
        if s.steps < 1:
            raise SlideDPError("--steps must be at least 1")
        if s.policy.update_schedule == "as_ready" and s.on_nonfinite == "skip":
            # as_ready applies each chunk's update as its gradient lands, before the step's norm is known: a
            # non-finite step could only be skipped for the chunks that had not landed yet.
            raise SlideDPError("update_schedule as_ready updates chunks before the step's gradient norm is known, "
                               "so a non-finite step cannot be skipped cleanly: add --on-nonfinite stop (the run "
                               "ends at the first one) or use next_forward")
        device = s.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise SlideDPError("--device cuda was asked for but no CUDA device is available")
        if device not in ("cpu",) and not device.startswith("cuda"):
            raise SlideDPError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
        self.rank = int(os.environ.get("RANK", "0")) if s.world > 1 else 0
        if device.startswith("cuda") and s.world > 1:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) // s.ranks_per_gpu}"
        self.device_name = device
        dtype = s.dtype if s.dtype != "auto" else ("bf16" if device.startswith("cuda") else "fp32")
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
        hw = s.hardware if s.hardware.num_gpus == s.world else s.hardware.with_gpus(s.world)
        self.workload = StepWorkload(self.model_spec, hw, s.policy, s.seq, self.per_step)
        if s.seq > getattr(self.config, "max_position_embeddings", s.seq):
            raise SlideDPError(f"--seq {s.seq} exceeds the model's max_position_embeddings "
                               f"{self.config.max_position_embeddings}")
        self.resume_meta = self._check_resume() if s.resume is not None else None
        self.memory = estimate_memory(self.workload)
        gpu_budget = (s.gpu_budget_gib if s.gpu_budget_gib is not None else s.hardware.gpu.memory_gib) * GIB
        host_budget = (s.host_limit_gib * GIB) if s.host_limit_gib is not None else _meminfo_available()
        problems = memory_shortfalls(self.memory, gpu_budget, host_budget)
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            if self.memory.gpu_peak > free:
                problems.append(f"GPU peak {self.memory.gpu_peak / GIB:.1f} GiB exceeds the free "
                                f"{free / GIB:.1f} GiB on {device}")
        if problems:
            raise SlideDPError("preflight: " + "; ".join(problems))
        self.gpu_budget = gpu_budget
        self.data: PackedData = load_data(s.data, s.tokenizer, self.config.vocab_size, s.seq, self.per_step, s.seed)

    def _check_resume(self) -> dict:
        """The checkpoint to resume from, verified before anything is allocated (digest, header, sizes), with
        an interrupted save of it finished or undone first; a different model is refused, other differences
        from the run it came from are stated."""
        s = self.spec
        path = Path(s.resume)
        for line in checkpoint_files.recover(path):
            self.log(f"checkpoint: {line}")
        if not path.is_dir():
            raise SlideDPError(f"--resume {s.resume!r}: no such checkpoint directory")
        meta = checkpoint_files.verify(path, self.model_spec.total_params)
        saved_spec = meta.get("model_spec")
        if saved_spec is not None and {k: v for k, v in saved_spec.items() if k != "name"} != \
                {k: v for k, v in self.model_spec.to_dict().items() if k != "name"}:
            raise SlideDPError(f"--resume {s.resume!r} holds another model ({saved_spec.get('name')}: "
                               f"{saved_spec.get('layers')} layers, hidden {saved_spec.get('hidden')}); refusing")
        now = {"world": s.world, "seq": s.seq, "batch": self.per_step, "policy": s.policy.to_dict()}
        for key, value in now.items():
            if key in meta and meta[key] != value:
                self.log(f"resume: {key} differs from the checkpoint's run ({meta[key]!r:.60} then, {value!r:.60} now)")
        return meta

    # ---- the run ----------------------------------------------------------------------------------------------
    def run(self) -> RunSummary:
        s = self.spec
        comm = self._init_distributed()
        device = Device(self.device_name)
        if device.is_cuda:
            total = torch.cuda.get_device_properties(device.torch_device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.gpu_budget / total), device.torch_device)
            torch.cuda.reset_peak_memory_stats(device.torch_device)
        adapter = ModelAdapter(self.config)
        bf16_grads = s.policy.grad_dtype == "bf16" and self.compute_dtype == torch.bfloat16
        grad_dtype = torch.bfloat16 if bf16_grads else torch.float32
        shared = None
        if comm.active:
            shared, host, start_step = self._shared_state(adapter, comm, device, grad_dtype)
        else:
            host = HostState.allocate(adapter.total_params, self.compute_dtype, grad_dtype, pin=device.is_cuda)
            start_step = self._initialise(host, adapter, device)
        self.log(f"host state: {host.bytes_per_param():.1f} bytes/param x {adapter.total_params / 1e9:.3f} B params "
                 f"= {host.total_bytes() / GIB:.2f} GiB (one copy for {comm.world} rank(s), pinned={host.pinned}); "
                 f"predicted GPU peak {self.memory.gpu_peak / GIB:.1f} GiB of a {self.gpu_budget / GIB:.1f} GiB budget")
        threads = self.workload.adam_threads if device.is_cuda else None
        config = EngineConfig(s.policy, s.optim, s.seq, self.compute_dtype, adam_threads=threads)
        engine = StreamingEngine(config, adapter, self.model_spec, host, device, TraceRecorder(device, rank=comm.rank),
                                 comm)
        s.out.mkdir(parents=True, exist_ok=True)
        if comm.rank == 0:  # a save of this run directory's checkpoint that a kill interrupted
            for line in checkpoint_files.recover(s.out / "checkpoint"):
                self.log(f"checkpoint: {line}")
        metrics_path = s.out / "metrics.csv"
        fresh = not (s.resume and metrics_path.exists())
        try:
            with open(metrics_path if comm.rank == 0 else os.devnull, "w" if fresh else "a", newline="") as metrics:
                times, last = self._loop(engine, host, device, start_step, csv.writer(metrics), metrics, fresh, comm)
            if s.export_hf and comm.rank == 0:
                host.export_hf(adapter, Path(s.export_hf))
            exposure = exposure_from_trace(last.trace)
            summary = self._summary(last, times, device, host, exposure)
            if comm.active:
                last.trace.to_parquet(s.out / f"trace_rank{comm.rank}.parquet", index=False)
            if comm.rank == 0:
                write_run_dir(s.out, last.trace, exposure, summary, s.policy, s.hardware)
            comm.barrier()
        finally:
            engine.close()
            host.close()
            if comm.active:
                import torch.distributed as dist

                dist.destroy_process_group()
                if comm.rank == 0 and shared is not None:
                    shared.remove()
        return summary

    def _init_distributed(self) -> Comm:
        if self.spec.world == 1:
            return Comm()
        import torch.distributed as dist

        cuda = self.device_name.startswith("cuda")
        shared_gpu = cuda and self.spec.ranks_per_gpu > 1  # NCCL refuses two ranks on one device
        if not dist.is_initialized():
            backend = "cpu:gloo,cuda:nccl" if cuda and not shared_gpu else "gloo"
            if cuda:
                torch.cuda.set_device(torch.device(self.device_name))
            dist.init_process_group(backend)
        comm = Comm.from_process_group(host_staged=shared_gpu)
        if shared_gpu and comm.rank == 0:
            self.log(f"{self.spec.ranks_per_gpu} ranks share each GPU: collectives run over gloo through host "
                     "memory (slower than NCCL; for tests and small models)")
        if not self.device_name.startswith("cuda"):  # ranks share the cores instead of oversubscribing them
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // comm.world))
        if comm.world != self.spec.world:
            raise SlideDPError(f"launched with {comm.world} ranks, the run asked for {self.spec.world}")
        return comm

    def _initialise(self, host: HostState, adapter: ModelAdapter, device: Device) -> int:
        """Fill the state (resume, HF weights or random init); returns the data step to continue from."""
        s = self.spec
        if s.resume:
            step = int(host.load(Path(s.resume))["data_step"])
            self.log(f"resumed from {s.resume} at step {step}")
            return step
        if self.model_dir is not None:
            host.load_hf_weights(adapter, self.model_dir)
        else:
            host.init_random(adapter, s.seed, device.torch_device)
        return 0

    def _shared_state(self, adapter: ModelAdapter, comm: Comm, device: Device,
                      grad_dtype: torch.dtype) -> tuple[SharedDir, HostState, int]:
        """Rank 0 creates the run's private state directory and fills the one host state; the others check it
        and map the same pages afterwards; then rank 0 removes the directory's names, so that the state lives
        in /dev/shm by name only while the ranks set up. The directory's random name comes from the launcher
        (or from rank 0, under a bare torchrun) and travels as a tensor, never pickled."""
        import torch.distributed as dist

        s = self.spec
        flags, landing = shared_buffer_sizes(adapter, s.policy, comm.world)
        args = (adapter.total_params, self.compute_dtype, grad_dtype)
        kwargs = dict(pin=device.is_cuda, flags=flags, world=comm.world, landing_numel=landing)
        run_id = os.environ.get(RUN_ID_ENV) or new_run_id()
        sync_device = self.device_name if self.device_name.startswith("cuda") and not comm.host_staged else "cpu"
        ident = torch.tensor(list(bytes.fromhex(run_id)), dtype=torch.uint8, device=sync_device)
        dist.broadcast(ident, src=0)
        path = state_dir(bytes(ident.cpu().tolist()).hex())
        info = torch.zeros(2, dtype=torch.int64, device=sync_device)
        if comm.rank == 0:
            launcher = int(os.environ.get(LAUNCHER_PID_ENV, os.getpid()))
            shared = SharedDir.create(path, launcher, s.out.resolve())
            host = HostState.allocate_shared(shared, *args, create=True, **kwargs)
            info[0], info[1] = self._initialise(host, adapter, device), host.step
            host.flags.fill_(host.step)
        dist.broadcast(info, src=0)  # also the barrier: the files exist and hold the state
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

    def _loop(self, engine: StreamingEngine, host: HostState, device: Device, start_step: int, writer, fh,
              fresh: bool, comm: Comm) -> tuple[list[float], StepStats]:
        s = self.spec
        if fresh:
            writer.writerow(["step", "loss", "grad_norm", "lr", "skipped", "step_time_s", "tokens_per_s",
                             "gpu_peak_gib", "host_rss_gib"])
        fault_rank, fault_step = os.environ.get("SLIDEDP_FAULT_RANK"), os.environ.get("SLIDEDP_FAULT_STEP")
        nan_step = os.environ.get("SLIDEDP_FAULT_NAN_STEP")  # fault injection: a NaN gradient at this step
        times: list[float] = []
        last = None
        for step in range(start_step, start_step + s.steps):
            if fault_rank is not None and int(fault_rank) == comm.rank and int(fault_step) == step + 1:
                os.kill(os.getpid(), signal.SIGKILL)  # fault injection for the failure tests: die mid-run
            engine.poison_next_gradient = nan_step is not None and int(nan_step) == step + 1
            t0 = time.perf_counter()
            batch = self.data.batch(step)[comm.rank * self.per_rank:(comm.rank + 1) * self.per_rank]
            stats = engine.step(batch, total_tokens=self.per_step * s.seq)
            dt = time.perf_counter() - t0
            times.append(dt)
            last = stats
            peak = torch.cuda.max_memory_allocated(device.torch_device) / GIB if device.is_cuda else 0.0
            writer.writerow([step + 1, f"{stats.loss:.6f}", f"{stats.grad_norm:.6f}", f"{stats.lr:.3e}",
                             int(stats.skipped), f"{dt:.4f}", f"{self.per_step * s.seq / dt:.1f}", f"{peak:.2f}",
                             f"{rss_bytes() / GIB:.2f}"])
            fh.flush()
            if stats.skipped:
                if s.on_nonfinite == "stop":
                    untouched = ("chunks updated before the norm was known (as_ready) keep their update; the last "
                                 "checkpoint is intact" if s.policy.update_schedule == "as_ready"
                                 else "the host state was not updated by that step")
                    raise TrainingStopped(f"non-finite gradient norm at step {step + 1}: stopped (--on-nonfinite "
                                          f"stop); {untouched}")
                self.log(f"step {step + 1}: non-finite gradient norm, update skipped (host state untouched)")
            if self.on_step and comm.rank == 0:
                self.on_step(step - start_step + 1, stats, dt)
            if s.save_every and (step + 1) % s.save_every == 0:
                self._checkpoint(engine, host, comm, step + 1)
        if s.final_checkpoint:
            self._checkpoint(engine, host, comm, start_step + s.steps)
        else:
            engine.flush()
        return times, last

    def _checkpoint(self, engine: StreamingEngine, host: HostState, comm: Comm, data_step: int) -> None:
        engine.flush()
        comm.barrier()  # every owner has applied its updates
        if comm.rank == 0:
            s = self.spec
            host.save(s.out / "checkpoint", {"data_step": data_step, "policy": s.policy.to_dict(), "world": comm.world,
                                             "seq": s.seq, "batch": self.per_step,
                                             "model_spec": self.model_spec.to_dict()})
        comm.barrier()

    def _summary(self, last: StepStats, times: list[float], device: Device, host: HostState,
                 exposure) -> RunSummary:
        s = self.spec
        steady = times[1:] if len(times) > 1 else times
        step_time = statistics.median(steady)
        mean = exposure.drop(columns="rank").mean()
        predicted = simulate(self.workload)
        return RunSummary(
            model=self.model_spec.name, model_spec=self.model_spec.to_dict(), hardware=s.hardware.name,
            gpus=s.world, seq=s.seq, adam_threads=self.workload.adam_threads,
            batch=self.per_step, tokens_per_step=self.per_step * s.seq, policy=s.policy.to_dict(),
            ranks=s.world,
            source="measured", device=self.device_name, dtype=str(self.compute_dtype).replace("torch.", ""),
            steps=len(times), step_time_s=step_time, tokens_per_s=self.per_step * s.seq / step_time,
            model_tflops_per_gpu=self.workload.model_flops_per_step() / step_time / s.world / 1e12,
            limiter=limiter(float(mean["compute"]), {c: float(mean[c]) for c in EXPOSURE_CATEGORIES}),
            bottleneck="",
            final_loss=last.loss,
            gpu_peak_gib=torch.cuda.max_memory_allocated(device.torch_device) / GIB if device.is_cuda else None,
            predicted_gpu_peak_gib=self.memory.gpu_peak / GIB,
            predicted_gpu_allocated_gib=self.memory.gpu_allocated_peak / GIB,  # compare with gpu_peak_gib
            host_rss_peak_gib=rss_bytes("VmHWM") / GIB,
            host_state_bytes_per_param=host.bytes_per_param(),
            predicted_step_time_s=predicted.step_time_s,
            predicted_limiter=predicted.limiter,
            pid=os.getpid(),
        )
