"""Run the engine with several gloo ranks on CPU, sharing one host state, for the data-parallel tests; with
``hosts`` > 1, the ranks are split host-major into emulated hosts, each with its own shared state directory."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from slidedp.model_spec import ModelSpec
from slidedp.policy import Policy
from slidedp.routes import Routes
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.comm import Comm, HostGroups
from slidedp.runtime.device import Device
from slidedp.runtime.engine import EngineConfig, StreamingEngine, shared_buffer_sizes
from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig
from slidedp.runtime.shared_dir import SharedDir
from slidedp.runtime.tracing import TraceRecorder
from tests.runtime.helpers import OPTIM, batches


def shared_state(adapter: ModelAdapter, policy: Policy, comm: Comm, directory: Path,
                 groups: HostGroups | None = None) -> HostState:
    """``comm``: the host's ranks; ``groups`` (several hosts): which host this is, for its share."""
    flags, landing = shared_buffer_sizes(adapter, policy, comm.world)
    hosts, index = (groups.hosts, groups.host) if groups else (1, 0)
    share = ChunkTable(adapter.units, Routes.of(policy, comm.world, hosts=hosts), comm.rank, host=index).share_pieces()
    layout = dict(precision=policy.state_precision, unit_numels=[u.numel for u in adapter.units], share=share)
    host = None
    if comm.rank == 0:
        shared = SharedDir.create(directory, os.getpid(), directory.parent)
        host = HostState.allocate_shared(shared, adapter.total_params, torch.float32, torch.float32, pin=False,
                                         create=True, flags=flags, world=comm.world, landing_numel=landing, **layout)
        host.init_random(adapter, 0)
    comm.barrier()
    if comm.rank != 0:
        host = HostState.allocate_shared(SharedDir.attach(directory), adapter.total_params, torch.float32,
                                         torch.float32, pin=False, create=False, flags=flags, world=comm.world,
                                         landing_numel=landing, **layout)
    return host


def shared_pss(directory: Path) -> dict[str, int]:
    """Proportional set size (bytes) this process holds of each shared state file: summed over ranks it is
    the memory the state really takes, so one copy shows as the file's size, not N times it."""
    pss: dict[str, int] = {}
    current = None
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if header.match(line):
            current = Path(parts[-1]).name if len(parts) >= 6 and parts[-1].startswith(str(directory)) else None
        elif current and line.startswith("Pss:"):
            pss[current] = pss.get(current, 0) + int(parts[1]) * 1024
    return pss


def _worker(rank: int, world: int, init_file: str, config_path: str, policy_dict: dict, seq: int, steps: int,
            shm: str, out: str, hosts: int = 1, optim_dict: dict | None = None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    groups = HostGroups.create(hosts)
    comm = groups.local
    policy = Policy.from_dict(policy_dict)
    adapter = ModelAdapter(load_hf_config(config_path))
    cfg = json.loads(Path(config_path).read_text())
    shm_dir = Path(shm) if hosts == 1 else Path(f"{shm}-host{groups.host}")
    host = shared_state(adapter, policy, comm, shm_dir, groups)
    device = Device("cpu")
    spec = ModelSpec.from_hf_config(cfg, "tiny")
    optim = OPTIM if optim_dict is None else OptimConfig(**optim_dict)
    engine = StreamingEngine(EngineConfig(policy, optim, seq, torch.float32), adapter, spec, host, device,
                             TraceRecorder(device, rank=rank), groups=groups)
    per_rank = policy.sequences_per_rank()
    losses = []
    for step, tokens in enumerate(batches(cfg["vocab_size"], seq, per_rank * world, steps, seed=1)):
        mine = tokens[rank * per_rank:(rank + 1) * per_rank]
        stats = engine.step(mine, total_tokens=per_rank * world * seq)
        losses.append(stats.loss)
        if step == 0 and rank == world - 1:
            stats.trace.to_parquet(Path(out).with_suffix(f".trace{rank}.parquet"))
    engine.flush()
    groups.world.barrier()
    Path(out).with_suffix(f".pss{rank}.json").write_text(json.dumps(shared_pss(shm_dir)))
    groups.world.barrier()
    if comm.rank == 0:  # each host: its state (its share under the sharded host layout) and its full weights
        torch.save({"losses": losses, "master": host.master.clone(), "weights": host.full_weights().clone(),
                    "share": host.share}, out if groups.host == 0 else Path(f"{out}.host{groups.host}"))
    groups.world.barrier()
    engine.close()
    dist.destroy_process_group()


def run_data_parallel(world: int, config_path: str, policy: Policy, seq: int, steps: int, tmp: Path,
                      hosts: int = 1, optim: OptimConfig | None = None) -> dict | list[dict]:
    """One result (hosts == 1) or one per host: losses, the host's master (its share) and full weights.
    ``optim``: the ranks' optimizer settings (default: the tests' OPTIM, which clips)."""
    out = tmp / f"dp{world}.pt"
    optim_dict = None if optim is None else dataclasses.asdict(optim)
    mp.start_processes(_worker, args=(world, str(tmp / "init"), config_path, policy.to_dict(), seq, steps,
                                      str(tmp / "shm"), str(out), hosts, optim_dict), nprocs=world,
                       start_method="spawn")
    if hosts == 1:
        return torch.load(out)
    return [torch.load(out if h == 0 else Path(f"{out}.host{h}")) for h in range(hosts)]
