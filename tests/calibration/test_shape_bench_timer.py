"""calibration.shape_bench's timing: how many calls a CUDA timing group queues (the timing itself needs a GPU and
is checked on the device: benchmarks.resident_kernels prints it beside one-call and plain queued timing)."""

import torch

from slidedp.calibration.shape_bench import QUEUED_CALLS, QUEUED_SECONDS, Timer, queued_calls


def test_a_group_queues_short_calls_up_to_the_cap_and_long_ones_once():
    assert queued_calls(1e-5) == QUEUED_CALLS
    assert queued_calls(QUEUED_SECONDS / 4) == 4
    assert queued_calls(QUEUED_SECONDS * 3) == 1
    assert queued_calls(0.0) == QUEUED_CALLS


def test_the_cpu_path_times_each_call_and_bounds_a_slow_benchmark():
    calls = []
    timer = Timer(torch.device("cpu"), repeats=5, max_seconds=0.0)  # every warm-up is "too slow": timed once
    assert timer.seconds(lambda: calls.append(1)) >= 0.0
    assert len(calls) == 2  # the warm-up and one timed call
    calls.clear()
    assert Timer(torch.device("cpu"), repeats=5, max_seconds=10.0).seconds(lambda: calls.append(1)) >= 0.0
    assert len(calls) == 6
