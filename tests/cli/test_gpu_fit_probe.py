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


def test_an_out_of_memory_message_keeps_its_figures():
    from benchmarks.common import oom_fields

    message = ("CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
               "1.94 GiB is free. Including non-PyTorch memory, this process has 77.23 GiB memory in use. Of the "
               "allocated memory 71.50 GiB is allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but "
               "unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")
    assert oom_fields(message) == {"request_gib": 2.32, "capacity_gib": 79.18, "in_use_gib": 77.23,
                                   "allocated_gib": 71.5, "reserved_unallocated_gib": 0.5}
    assert oom_fields("CUBLAS_STATUS_ALLOC_FAILED") == {}
