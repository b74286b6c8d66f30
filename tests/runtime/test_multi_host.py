"""Data parallel across emulated hosts (gloo ranks on CPU, host-major, one shared state directory per host):
both host layouts against one process at the same global batch."""

import pytest
import torch

from slidedp.policy import Policy
from slidedp.routes import Routes
from tests.builders import write_config
from tests.runtime.dp_runner import run_data_parallel
from tests.runtime.test_data_parallel import single_process

SEQ, STEPS = 16, 3  # as test_data_parallel.single_process, the reference

# (layout, hosts, ranks per host, grad route): one rank per host (the gradient crosses hosts from the GPU: an
# all-reduce, or a reduce-scatter over every rank), and two per host on the per-rank route (the CPU sum crosses
# hosts: all-reduce or reduce-scatter with the peer). The reduce-scatter over 2 x 2 ranks is the one-rank code
# path with another shard index, which test_routes_say_which_collectives_cross_hosts checks.
CASES = [(layout, 2, ranks, grad) for layout in ("replicated", "sharded")
         for ranks, grad in ((1, "reduce_scatter"), (2, "per_rank"))]
CASES = [pytest.param(*c, marks=pytest.mark.slow) if c[0] == "replicated" and c[2] == 2 else c for c in CASES]


@pytest.mark.parametrize("layout, hosts, ranks, grad_route", CASES)
def test_hosts_match_single_process_at_the_same_global_batch(tmp_path, layout, hosts, ranks, grad_route):
    config = write_config(tmp_path, "qwen3")
    policy = Policy(param_route="sharded", grad_route=grad_route, micro_batch=1, accumulation=1, chunks_per_layer=3,
                    host_layout=layout)
    per_host = run_data_parallel(hosts * ranks, config, policy, SEQ, STEPS, tmp_path, hosts=hosts)
    losses, master = single_process(config, hosts * ranks, policy)
    for result in per_host:
        assert result["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
        # Every host streams the same new weights (its slot), whichever layout kept the master.
        torch.testing.assert_close(result["weights"], master, rtol=1e-5, atol=2e-6)
        if layout == "replicated":
            assert result["share"] is None
            torch.testing.assert_close(result["master"], master, rtol=1e-5, atol=2e-6)
        else:  # the host keeps master (and moments) of its share only: 1/H of the parameters
            kept = torch.cat([master[lo:hi] for lo, hi, _ in result["share"]])
            torch.testing.assert_close(result["master"], kept, rtol=1e-5, atol=2e-6)
            assert abs(result["master"].numel() - master.numel() / hosts) <= 3 * 5 * hosts
    if layout == "sharded":  # the two shares tile the model: no parameter kept twice or never
        covered = sorted((lo, hi) for r in per_host for lo, hi, _ in r["share"])
        assert covered[0][0] == 0 and covered[-1][1] == master.numel()
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:], strict=False))


def test_routes_say_which_collectives_cross_hosts():
    one = Routes.of(Policy(grad_route="reduce_scatter"), 8)
    rep = Routes.of(Policy(grad_route="reduce_scatter", host_layout="replicated"), 8, hosts=4)
    sha = Routes.of(Policy(grad_route="reduce_scatter", host_layout="sharded"), 8, hosts=4)
    per = Routes.of(Policy(grad_route="per_rank", host_layout="sharded"), 8, hosts=4)
    assert (one.cross_host_grad, rep.cross_host_grad, sha.cross_host_grad, per.cross_host_grad) == \
        (None, "all_reduce", None, "reduce_scatter")
    assert (rep.gpu_scatter_ranks, sha.gpu_scatter_ranks, per.gpu_scatter_ranks) == (8, 32, 1)
    assert rep.nic_grad_factor == pytest.approx(2 * 0.75 * 2) and sha.nic_grad_factor == pytest.approx(0.75 * 2)
    assert (rep.nic_weight_factor, sha.nic_weight_factor) == (0.0, pytest.approx(0.75 * 2))
    assert (rep.host_state_fraction, sha.host_state_fraction) == (1.0, 0.25)
    # Rank (h, l) of a sharded reduce-scatter owns global shard h * 8 + l, inside host h's part of the chunk.
    for h in range(4):
        lo, hi = sha.host_range(0, 1000, h)
        parts = [sha.owned_range(0, 0, 0, 1000, r, h) for r in range(8)]
        assert parts[0][0] == lo and parts[-1][1] == hi
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    assert sum(sha.host_share_numel([1000, 333], h) for h in range(4)) == 1333
