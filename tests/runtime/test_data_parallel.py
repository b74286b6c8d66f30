"""Synchronous data parallel over gloo ranks on CPU, all sharing one host state."""

import json

import pytest
import torch

from slidedp.policy import Policy
from tests.builders import TINY, write_config
from tests.runtime.dp_runner import run_data_parallel
from tests.runtime.helpers import batches, make_engine, run_cli_train

SEQ, STEPS = 16, 3


def single_process(config_path: str, world: int, policy: Policy, optim=None) -> tuple[list[float], torch.Tensor]:
    """The same global batch in one process: N x the per-rank accumulation, micro-batches in rank order."""
    single = Policy(micro_batch=policy.micro_batch, accumulation=policy.accumulation * world,
                    chunks_per_layer=policy.chunks_per_layer, activation=policy.activation,
                    update_schedule=policy.update_schedule, state=policy.state)
    engine, _, host = (make_engine(config_path, single, SEQ) if optim is None else
                       make_engine(config_path, single, SEQ, optim))
    data = batches(TINY["qwen3"]["vocab_size"], SEQ, policy.sequences_per_rank() * world, STEPS, seed=1)
    losses = [engine.step(t).loss for t in data]
    engine.flush()
    return losses, host.master.clone()


CASES = [(world, pr, gr) for world in (2, 3) for pr in ("replicated", "sharded")
         for gr in ("per_rank", "reduce_scatter")]
# Three ranks (uneven shards, a third owner) on one route pair by default; the other three in the slow tier.
CASES = [pytest.param(*c, marks=pytest.mark.slow) if c[0] == 3 and c[1:] != ("sharded", "reduce_scatter") else c
         for c in CASES]


@pytest.mark.parametrize("world, param_route, grad_route", CASES)
def test_matches_single_process_at_the_same_global_batch(tmp_path, world, param_route, grad_route):
    config = write_config(tmp_path, "qwen3")
    policy = Policy(param_route=param_route, grad_route=grad_route, micro_batch=1, accumulation=2, chunks_per_layer=3,
                    activation="offload" if world == 3 else "recompute")
    result = run_data_parallel(world, config, policy, SEQ, STEPS, tmp_path)
    losses, master = single_process(config, world, policy)
    assert result["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(result["master"], master, rtol=1e-5, atol=2e-6)
    trace = __import__("pandas").read_parquet(tmp_path / f"dp{world}.trace{world - 1}.parquet")
    ops = set(trace.op)
    assert ("allgather" in ops) == (param_route == "sharded")
    assert ("reduce_scatter" in ops) == (grad_route == "reduce_scatter")
    assert ("cpu_reduce" in ops) == (grad_route == "per_rank" and (world - 1) in
                                     {(u * 3 + c) % world for u in range(5) for c in range(3)})


@pytest.mark.parametrize("param_route, grad_route", [pytest.param("replicated", "per_rank", marks=pytest.mark.slow),
                                                     ("sharded", "reduce_scatter")])
def test_as_ready_ranks_match_single_process(tmp_path, param_route, grad_route):
    """The as_ready schedule (each chunk updated as soon as its summed gradient is on the host; no clipping,
    which it cannot do) over ranks sharing the state, against one process at the same global batch."""
    from dataclasses import replace

    from tests.runtime.helpers import OPTIM

    optim = replace(OPTIM, max_grad_norm=None)
    config = write_config(tmp_path, "qwen3")
    policy = Policy(param_route=param_route, grad_route=grad_route, micro_batch=1, accumulation=2,
                    chunks_per_layer=3, update_schedule="as_ready")
    result = run_data_parallel(2, config, policy, SEQ, STEPS, tmp_path, optim=optim)
    losses, master = single_process(config, 2, policy, optim)
    assert result["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(result["master"], master, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("grad_route", ["per_rank", "reduce_scatter"])
def test_gpu_state_units_all_reduce_and_match_single_process(tmp_path, grad_route):
    """Every rank keeps a replica of the GPU-held units and all-reduces their gradients; the norm counts
    them once, and rank 0 writes them back to the one host state."""
    config = write_config(tmp_path, "qwen3")
    policy = Policy(param_route="sharded", grad_route=grad_route, micro_batch=1, accumulation=2, chunks_per_layer=3,
                    gpu_state_units=2)
    result = run_data_parallel(2, config, policy, SEQ, STEPS, tmp_path)
    losses, master = single_process(config, 2, policy.with_(gpu_state_units=0))
    assert result["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    torch.testing.assert_close(result["master"], master, rtol=1e-5, atol=2e-6)
    trace = __import__("pandas").read_parquet(tmp_path / "dp2.trace1.parquet")
    assert set(trace[trace.op == "allreduce"].unit) == {0, 1}
    assert not set(trace[trace.op.isin(["h2d_param", "allgather", "d2h_grad"])].unit) & {0, 1}


def test_three_ranks_hold_one_copy_of_the_state(tmp_path):
    config = write_config(tmp_path, "qwen3")
    policy = Policy(param_route="sharded", grad_route="per_rank", micro_batch=1, accumulation=1, chunks_per_layer=2)
    run_data_parallel(3, config, policy, SEQ, 1, tmp_path)
    _, adapter, single_host = make_engine(config, Policy(), SEQ)
    state_files = ("master.bin", "exp_avg.bin", "exp_avg_sq.bin", "slot.bin")
    shm = tmp_path / "shm"
    shared_bytes = sum((shm / f).stat().st_size for f in state_files)
    assert shared_bytes == single_host.total_bytes()  # the same state as one process, not three
    landing = sum(p.stat().st_size for p in shm.glob("landing_*.bin"))
    largest_unit = max(u.numel for u in adapter.units) * 4
    assert landing == 3 * largest_unit  # the only per-rank host buffers: one unit's gradient each
    pss = [json.loads((tmp_path / f"dp3.pss{r}.json").read_text()) for r in range(3)]
    for f in state_files:  # proportional set sizes over the three ranks add up to one file, not three
        assert sum(p.get(f, 0) for p in pss) <= (shm / f).stat().st_size * 1.01 + 3 * 4096


def _train(tmp_path, out, *extra, env=None):
    return run_cli_train(tmp_path, out, "--batch", "4", "--nproc", "2", "--device", "cpu", *extra, env=env)


def test_cli_nproc_trains_and_a_killed_rank_stops_every_rank(tmp_path):
    import time

    from slidedp.runtime.host_state import HostState

    ok = _train(tmp_path, tmp_path / "run", "--steps", "2")
    assert ok.returncode == 0, ok.stderr[-2000:]
    # one copy of each start-up line (rank 0's), no warning repeated per rank and step, no torchrun banner
    assert ok.stderr.count("host state:") == 1 and "Warning" not in ok.stderr and "OMP_NUM_THREADS" not in ok.stderr
    assert ok.stderr.count("data:") == 1 and ok.stderr.count("policy ") <= 1
    metrics = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 3 and (tmp_path / "run" / "trace_rank1.parquet").exists()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks"] == 2
    # every rank's host memory: RSS counts the mapped shared state in each rank, PSS splits it between them
    rss, pss = summary["host_rss_peak_gib_by_rank"], summary["host_pss_gib_by_rank"]
    assert len(rss) == len(pss) == 2 and all(0 < p <= r for p, r in zip(pss, rss, strict=True))
    # the report reads every rank's trace: one track set and one exposure row per rank
    from slidedp.cli import main
    from slidedp.report.rundir import load_run

    run = load_run(tmp_path / "run")
    assert sorted(run.trace["rank"].unique()) == [0, 1] and sorted(run.exposure["rank"]) == [0, 1]
    assert main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "report")]) == 0
    assert (tmp_path / "report" / "report.md").exists()

    t0 = time.monotonic()
    killed = _train(tmp_path, tmp_path / "killed", "--steps", "5", "--save-every", "1",
                    env={"SLIDEDP_FAULT_RANK": "1", "SLIDEDP_FAULT_STEP": "3"})
    assert killed.returncode != 0
    assert time.monotonic() - t0 < 120
    assert "a rank failed" in killed.stderr and "is intact" in killed.stderr
    ckpt = tmp_path / "killed" / "checkpoint"
    assert sorted(p.name for p in (tmp_path / "killed").iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]
    state = HostState.allocate(_param_count(tmp_path), torch.float32, torch.float32, pin=False)
    assert state.load(ckpt)["data_step"] == 2


def _param_count(tmp_path) -> int:
    from slidedp.runtime.hf_adapter import ModelAdapter, load_hf_config

    return ModelAdapter(load_hf_config(str(tmp_path / "tiny.json"))).total_params


def test_reduce_scatter_falls_back_to_all_reduce_only_where_the_backend_lacks_it(monkeypatch):
    """A backend without reduce-scatter gets all-reduce + this rank's part; once the native op has
    worked, a later failure is a real error and is raised, not hidden by the fallback."""
    import torch.distributed as dist

    op = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"

    from slidedp.runtime.comm import Comm

    calls = []

    def missing(out, inp, group=None):
        calls.append("rs")
        raise NotImplementedError("no reduce_scatter on this backend")

    monkeypatch.setattr(dist, op, missing)
    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: calls.append("ar") or t.mul_(2))
    comm = Comm(rank=1, world=2)
    out = comm.reduce_scatter_(torch.empty(3), torch.arange(6.0))
    assert out.tolist() == [6.0, 8.0, 10.0] and comm.native_reduce_scatter is False
    comm.reduce_scatter_(torch.empty(3), torch.arange(6.0))
    assert calls == ["rs", "ar", "ar"]  # the missing op is tried once

    def native(out, inp, group=None):
        out.copy_(inp[3:] * 2)

    monkeypatch.setattr(dist, op, native)
    comm = Comm(rank=1, world=2)
    assert comm.reduce_scatter_(torch.empty(3), torch.arange(6.0)).tolist() == [6.0, 8.0, 10.0]
    monkeypatch.setattr(dist, op, missing)
    with pytest.raises(NotImplementedError):
        comm.reduce_scatter_(torch.empty(3), torch.arange(6.0))
    assert Comm().reduce_scatter_(torch.empty(2), torch.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("nproc, per_gpu, device, gpus, message", [
    (2, 1, "auto", 1, "--nproc 2 needs 2 GPU(s) at 1 rank(s) per GPU, but 1 is visible"),
    (3, 2, "cuda", 1, "add --ranks-per-gpu 3"),
    (4, 2, "cuda", 4, None),
    (3, 2, "cuda", 2, "--nproc 3 is not a multiple of --ranks-per-gpu 2"),
    (2, 1, "cuda:0", 2, "names one GPU"),
    (2, 2, "cpu", 0, "--ranks-per-gpu needs a CUDA device"),
    (2, 1, "cpu", 0, None),
])
def test_launcher_refuses_ranks_without_a_gpu_before_starting_any(monkeypatch, nproc, per_gpu, device, gpus, message):
    """On a one-GPU host `--nproc 2` once started torchrun and died with a CUDA traceback in rank 1."""
    from slidedp.commands.train import check_rank_placement
    from slidedp.errors import SlideDPError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    if message is None:
        check_rank_placement(nproc, per_gpu, device)
        return
    with pytest.raises(SlideDPError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        check_rank_placement(nproc, per_gpu, device)
    assert "\n" not in str(err.value)


def test_cli_refuses_two_ranks_on_one_visible_gpu_with_one_line(monkeypatch, capsys, tmp_path):
    from slidedp.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code = main(["train", "--model", "qwen3-0.6b", "--data", "synthetic", "--steps", "1", "--out",
                 str(tmp_path / "r"), "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--ranks-per-gpu 2" in err
    assert not (tmp_path / "r").exists()  # refused before anything was created
