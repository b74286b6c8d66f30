"""benchmarks/cpu_siblings.py: from the siblings its probes found to one vCPU per physical core."""

from benchmarks.cpu_siblings import one_per_core, regular_pairs

CPUS = list(range(16))


def test_siblings_eight_apart_give_the_first_eight_vcpus():
    assert regular_pairs(CPUS, {0: [8], 1: [9]}) == (8, list(range(8)))


def test_adjacent_siblings_give_every_other_vcpu():
    assert regular_pairs(CPUS, {0: [1], 1: [0]}) == (1, list(range(0, 16, 2)))


def test_no_sibling_found_keeps_every_vcpu():
    assert regular_pairs(CPUS, {0: [], 1: []}) == (None, CPUS)


def test_an_irregular_pattern_gives_no_placement():
    assert regular_pairs(CPUS, {0: [8], 1: [2]}) == (None, None)
    assert regular_pairs(CPUS, {0: [8, 9], 1: [9]}) == (None, None)


def test_one_per_core_needs_every_vcpus_sibling():
    assert one_per_core([0, 1, 2, 3], {0: 2, 2: 0, 1: 3, 3: 1}) == [0, 1]
    assert one_per_core([0, 1, 2], {0: 1, 1: 0}) is None
