"""The fit probe's bisection: the smallest cap that runs, to the resolution asked, or None."""

from benchmarks.gpu_fit_probe import smallest_cap


def test_bisection_finds_the_smallest_cap_to_the_resolution():
    tried = []

    def fits(cap: float) -> bool:
        tried.append(cap)
        return cap >= 73.3

    cap, trials = smallest_cap(fits, 60.0, 80.0, 0.25)
    assert 73.3 <= cap <= 73.3 + 0.25
    assert trials == len(tried) and trials <= 2 + 7  # the whole card, then log2(20 / 0.25) halvings


def test_a_step_that_does_not_run_on_the_whole_card_has_no_cap():
    assert smallest_cap(lambda cap: False, 60.0, 80.0, 0.25) == (None, 1)
