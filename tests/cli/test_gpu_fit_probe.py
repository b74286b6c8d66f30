"""The fit probe's bisection: the smallest cap that runs, to the resolution asked, or None."""

from benchmarks.gpu_fit_probe import smallest_cap


def test_bisection_finds_the_smallest_cap_to_the_resolution():
    tried = []

    def fits(cap: float) -> bool:
        tried.append(cap)
        return cap >= 73.3

    cap, trials, exact = smallest_cap(fits, 60.0, 80.0, 0.25)
    assert exact and 73.3 <= cap <= 73.3 + 0.25
    assert trials == len(tried) == 7  # log2(20 / 0.25) halvings, the whole card known to pass


def test_a_deadline_stops_the_bisection_with_an_upper_bound():
    calls = iter([False, False, True])
    cap, trials, exact = smallest_cap(lambda cap: cap >= 73.3, 60.0, 80.0, 0.25, lambda: next(calls))
    assert not exact and trials == 2 and cap == 75.0  # 70 failed, 75 passed, then out of time


def test_an_out_of_memory_message_keeps_its_figures():
    from benchmarks.common import oom_fields

    message = ("CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
               "1.94 GiB is free. Including non-PyTorch memory, this process has 77.23 GiB memory in use. Of the "
               "allocated memory 71.50 GiB is allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but "
               "unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF")
    assert oom_fields(message) == {"request_gib": 2.32, "capacity_gib": 79.18, "in_use_gib": 77.23,
                                   "allocated_gib": 71.5, "reserved_unallocated_gib": 0.5}
    assert oom_fields("CUBLAS_STATUS_ALLOC_FAILED") == {}
    assert oom_fields("and 0 bytes is reserved by PyTorch but unallocated.") == {"reserved_unallocated_gib": 0.0}
