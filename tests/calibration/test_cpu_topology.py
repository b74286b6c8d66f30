"""calibration/cpu_topology.py: from the probe's rate ratios to the physical cores (synthetic ratios; the one
run of the real probe checks only its shape, never this machine's timing)."""

from slidedp.calibration.cpu_topology import CoreLayout, layout_from, one_per_core, probe_layout, regular_pairs

CPUS = list(range(16))


def _ratios(probe: int, siblings: set[int]) -> dict[int, float]:
    return {q: 0.55 if q in siblings else 0.98 for q in CPUS if q != probe}


def test_siblings_eight_apart_give_the_first_eight_vcpus():
    assert regular_pairs(CPUS, {0: [8], 1: [9]}) == (8, list(range(8)))
    layout = layout_from(CPUS, {0: _ratios(0, {8}), 1: _ratios(1, {9})})
    assert (layout.pair_offset, layout.cores, layout.siblings) == (8, 8, {0: [8], 1: [9]})
    assert "8 cores x 2 threads" in layout.describe()


def test_adjacent_siblings_found_either_way_round_give_every_other_vcpu():
    assert regular_pairs(CPUS, {0: [1], 1: [0]}) == (1, list(range(0, 16, 2)))


def test_no_sibling_found_keeps_every_vcpu():
    layout = layout_from(CPUS, {0: _ratios(0, set())})
    assert (layout.pair_offset, layout.one_per_core) == (None, CPUS)
    assert "16 cores" in layout.describe()


def test_an_irregular_pattern_gives_no_placement():
    assert regular_pairs(CPUS, {0: [8], 1: [2]}) == (None, None)
    assert regular_pairs(CPUS, {0: [8, 9], 1: [9]}) == (None, None)
    assert "not known" in layout_from(CPUS, {0: _ratios(0, {8, 9})}).describe()


def test_one_per_core_needs_every_vcpus_sibling():
    assert one_per_core([0, 1, 2, 3], {0: 2, 2: 0, 1: 3, 3: 1}) == [0, 1]
    assert one_per_core([0, 1, 2], {0: 1, 1: 0}) is None


def test_the_probe_runs_here_and_restores_torchs_thread_count():
    import torch

    before = torch.get_num_threads()
    layout = probe_layout((0,), seconds=0.02)
    assert isinstance(layout, CoreLayout) and torch.get_num_threads() == before
    assert set(layout.ratios.get(0, {})) == set(layout.vcpus) - {0}
    assert all(r > 0 for r in layout.ratios.get(0, {}).values())
    first = min(layout.vcpus)
    assert list(probe_layout(seconds=0.02).ratios) == [first]  # by default the first vCPU it may run on
