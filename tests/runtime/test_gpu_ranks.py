"""Several data-parallel ranks on one real GPU (`--ranks-per-gpu`): the CUDA side of the shared host state (pinned
registration of the shared mapping in several processes, CUDA events before the CPU reads landed gradients and
before the GPU reads updated weights, copy streams of several processes on one link) for every route pair and
update schedule, against one rank at the same global batch; and the launcher's cleanup with CUDA ranks. Run with
`python -m pytest -m gpu` on a CUDA machine; skipped elsewhere (CI)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from slidedp.policy import Policy
from slidedp.report.rundir import load_run
from slidedp.runtime.shared_dir import PREFIX, state_dir
from tests.builders import TINY
from tests.runtime.helpers import checkpoint_master, run_losses
from tests.runtime.test_run_lifetime import _ranks_of, _run_id_of, _wait_for_steps

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (python -m pytest -m gpu)")]

STEPS, SEQ = 3, 32
# bf16 compute: the ranks sum their gradients in another order than one process does (and through a bf16
# landing buffer on the per-rank route), so losses agree to bf16's resolution, not bit for bit.
LOSS_RTOL = 2e-2
# Final weights: the fp32 masters' updates (final minus initial) of the ranks and of one rank point the same way
# and have the same size. Element by element they cannot agree tightly: Adam's first steps move each weight by
# about +-lr whatever the gradient's size, so a gradient near zero whose bf16 sum flips sign moves that weight the
# other way; a route that drops, doubles or misplaces a chunk's update shows as a cosine far below this.
UPDATE_COSINE, UPDATE_NORM_RTOL = 0.98, 0.05


def _state_dirs() -> set[Path]:
    return {p for p in Path("/dev/shm").glob(f"{PREFIX}*") if p.is_dir() and p.stat().st_uid == os.getuid()}


def _cmd(tmp_path: Path, out: Path, nproc: int, policy: Policy, *extra: str) -> list[str]:
    (tmp_path / "tiny.json").write_text(json.dumps(dict(TINY["qwen3"], vocab_size=300)))
    (tmp_path / "data.txt").write_text("streaming layers through a shared host state on one GPU " * 80)
    policy_path = tmp_path / f"policy-{out.name}.yaml"
    policy.save(policy_path)
    return [sys.executable, "-m", "slidedp.cli", "train", "--model", str(tmp_path / "tiny.json"), "--data",
            str(tmp_path / "data.txt"), "--seq", str(SEQ), "--device", "cuda", "--dtype", "bf16", "--policy",
            str(policy_path), "--nproc", str(nproc), "--ranks-per-gpu", str(nproc), "--out", str(out), *extra]


def assert_same_update(ranks: torch.Tensor, single: torch.Tensor, initial: torch.Tensor) -> None:
    """The ranks' final weights against one rank's, as the update each applied to the same initial weights."""
    ours, theirs = (ranks - initial).double(), (single - initial).double()
    assert theirs.norm() > 0, "one rank's run did not change the weights"
    cosine = float(ours @ theirs / (ours.norm() * theirs.norm()))
    size = float(ours.norm() / theirs.norm())
    assert cosine >= UPDATE_COSINE and abs(size - 1) <= UPDATE_NORM_RTOL, (cosine, size)


def _train(tmp_path: Path, name: str, nproc: int, policy: Policy, *extra: str) -> tuple[list[float], dict]:
    out = tmp_path / name
    if policy.update_schedule == "as_ready":  # it updates before the norm is known: no clipping, stop on NaN
        extra = (*extra, "--max-grad-norm", "0", "--on-nonfinite", "stop")
    done = subprocess.run(_cmd(tmp_path, out, nproc, policy, "--steps", str(STEPS), *extra), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return run_losses(out), json.loads((out / "summary.json").read_text())


def _policy(world: int, param_route: str, grad_route: str, schedule: str = "next_forward",
            gpu_state_units: int = 0) -> Policy:
    return Policy(param_route=param_route, grad_route=grad_route, micro_batch=1, accumulation=2, chunks_per_layer=3,
                  update_schedule=schedule, gpu_state_units=gpu_state_units)


CASES = [(2, pr, gr, "next_forward", 0) for pr in ("replicated", "sharded") for gr in ("per_rank", "reduce_scatter")]
CASES += [(3, pr, gr, "next_forward", 0) for pr in ("replicated", "sharded") for gr in ("per_rank", "reduce_scatter")]
CASES += [(2, "replicated", "per_rank", "after_backward", 0), (2, "sharded", "reduce_scatter", "as_ready", 0),
          (2, "sharded", "reduce_scatter", "next_forward", 2), (2, "replicated", "per_rank", "next_forward", 2),
          (2, "replicated", "reduce_scatter", "next_forward", 2), (2, "sharded", "per_rank", "next_forward", 2)]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """One rank's losses and final master per (accumulation, schedule, GPU-held units): the routes do not apply to
    one rank, so every route pair at a world size is compared with the same single-rank run."""
    cache: dict[tuple, tuple[list[float], torch.Tensor]] = {}

    def run(policy: Policy) -> tuple[list[float], torch.Tensor]:
        key = (policy.accumulation, policy.update_schedule, policy.gpu_state_units)
        if key not in cache:
            out = tmp_path_factory.mktemp("one")
            losses, _ = _train(out, "single", 1, policy)
            cache[key] = losses, checkpoint_master(out / "single" / "checkpoint")
        return cache[key]
    return run


@pytest.fixture(scope="module")
def initial_master(tmp_path_factory) -> torch.Tensor:
    """The weights every run starts from (same seed): one step at a learning rate of 1e-30 (0 is refused) leaves
    them as initialized (a change of 1e-30 is lost in any nonzero fp32 weight of this model's scale; a weight
    that is exactly zero moves by 1e-30, which neither the cosine nor the size notices)."""
    out = tmp_path_factory.mktemp("initial")
    subprocess.run(_cmd(out, out / "lr0", 1, _policy(1, "replicated", "per_rank"), "--steps", "1", "--lr", "1e-30",
                        "--weight-decay", "0"), check=True, capture_output=True, timeout=300)
    return checkpoint_master(out / "lr0" / "checkpoint")


@pytest.mark.parametrize("world, param_route, grad_route, schedule, held", CASES)
def test_ranks_sharing_the_gpu_train_like_one_rank(tmp_path, one_rank, initial_master, world, param_route, grad_route,
                                                   schedule, held):
    before = _state_dirs()
    policy = _policy(world, param_route, grad_route, schedule, held)
    ranks, summary = _train(tmp_path, "ranks", world, policy)
    single, single_master = one_rank(Policy(**{**policy.to_dict(), "accumulation": policy.accumulation * world}))
    assert ranks == pytest.approx(single, rel=LOSS_RTOL)
    assert_same_update(checkpoint_master(tmp_path / "ranks" / "checkpoint"), single_master, initial_master)
    assert summary["ranks"] == world
    run = load_run(tmp_path / "ranks")  # what slidedp report reads: every rank's trace and exposure
    assert sorted(run.trace["rank"].unique()) == list(range(world)) and len(run.exposure) == world
    assert not (_state_dirs() - before)  # a clean end leaves nothing in /dev/shm


def test_sigint_to_the_launcher_and_a_killed_cuda_rank_leave_nothing(tmp_path):
    """SIGINT once the ranks train (the state's names are gone by then: rank 0 removes them once every rank has
    mapped the pages, so waiting for them to appear would race a set-up of a fraction of a second), then a CUDA
    rank that SIGKILLs itself: both end without ranks or state left behind."""
    before = _state_dirs()
    policy = _policy(2, "sharded", "reduce_scatter")
    proc = subprocess.Popen(_cmd(tmp_path, tmp_path / "int", 2, policy, "--steps", "100000"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    run_id = _run_id_of(proc.pid, deadline=180)
    _wait_for_steps(tmp_path / "int", deadline=180)
    assert not state_dir(run_id).exists()  # mapped by every rank, no name left in /dev/shm while it trains
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1].startswith("slidedp: interrupted"), err[-2000:]
    time.sleep(0.5)
    assert not _ranks_of(proc.pid) and not state_dir(run_id).exists() and not (_state_dirs() - before)
    fault = {**os.environ, "SLIDEDP_FAULT_RANK": "1", "SLIDEDP_FAULT_STEP": "2"}  # rank 1 SIGKILLs itself
    killed = subprocess.run(_cmd(tmp_path, tmp_path / "kill", 2, policy, "--steps", "4"), capture_output=True,
                            text=True, timeout=300, env=fault)
    assert killed.returncode != 0 and "a rank failed" in killed.stderr, killed.stderr[-2000:]
    assert not (_state_dirs() - before)
