"""calibration.shape_bench's timing: how many calls a CUDA timing group queues, and the CUDA path's order of
operations against a fake GPU clock (its real timing is checked on the device: benchmarks.resident_kernels prints
it beside one-call and plain queued timing)."""

import pytest
import torch

from slidedp.calibration.shape_bench import (
    HOLD_FLOOR_SECONDS,
    HOLD_MAX_SECONDS,
    QUEUED_CALLS,
    QUEUED_SECONDS,
    Timer,
    queued_calls,
)


def test_a_group_queues_short_calls_up_to_the_cap_and_long_ones_once():
    assert queued_calls(1e-5) == QUEUED_CALLS
    assert queued_calls(QUEUED_SECONDS / 4) == 4
    assert queued_calls(QUEUED_SECONDS * 3) == 1
    assert queued_calls(0.0) == QUEUED_CALLS


def test_the_cpu_path_times_each_call_and_bounds_a_slow_benchmark():
    calls = []
    timer = Timer(torch.device("cpu"), repeats=5, max_seconds=0.0)  # every warm-up is "too slow": timed once
    timer.seconds(lambda: calls.append(1))
    assert len(calls) == 2  # the warm-up and one timed call
    calls.clear()
    Timer(torch.device("cpu"), repeats=5, max_seconds=10.0).seconds(lambda: calls.append(1))
    assert len(calls) == 6


class FakeGpu:
    """A GPU clock: each call of the timed function runs ``call_s``, a spin kernel its cycles at ``rate``."""

    def __init__(self, rate: float, call_s: float = 1e-3):
        self.t, self.rate, self.call_s, self.log = 0.0, rate, call_s, []

    def sleep(self, cycles: int) -> None:
        self.log.append(("sleep", cycles))
        self.t += cycles / self.rate

    def run(self) -> None:
        self.log.append("fn")
        self.t += self.call_s


@pytest.fixture
def fake_gpu(monkeypatch):
    def make(rate: float = 2e9) -> FakeGpu:
        gpu = FakeGpu(rate)

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.at = None

            def record(self) -> None:
                self.at = gpu.t
                gpu.log.append("record")

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return (end.at - self.at) * 1e3

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", gpu.sleep)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
        return gpu
    return make


def test_the_cuda_path_holds_the_gpu_then_times_queued_groups(fake_gpu):
    gpu = fake_gpu()
    assert Timer(torch.device("cuda"), repeats=3, max_seconds=10.0).seconds(gpu.run) == pytest.approx(gpu.call_s)
    sleeps = [e[1] for e in gpu.log if isinstance(e, tuple)]
    assert sleeps[0] == 20_000_000 and len(sleeps) == 4  # the spin kernel's rate, timed once, then one hold a group
    assert all(HOLD_FLOOR_SECONDS * gpu.rate <= c <= HOLD_MAX_SECONDS * gpu.rate for c in sleeps[1:])
    calls = queued_calls(0.0)  # the warm-up's host time is microseconds here
    assert gpu.log.count("fn") == 2 + 3 * calls  # warm-up, the issue time's call, three groups
    group = gpu.log[gpu.log.index(("sleep", sleeps[1])):]
    assert group[:3] == [("sleep", sleeps[1]), "record", "fn"] and group[2 + calls] == "record"


def test_layer_passes_and_slow_shapes_are_not_held_and_an_implausible_spin_rate_turns_the_hold_off(fake_gpu):
    gpu = fake_gpu()
    Timer(torch.device("cuda"), repeats=3, max_seconds=10.0, hold_gpu=False).seconds(gpu.run)
    assert not [e for e in gpu.log if isinstance(e, tuple)] and gpu.log.count("fn") == 1 + 3 * queued_calls(0.0)
    gpu = fake_gpu()
    Timer(torch.device("cuda"), repeats=3, max_seconds=0.0).seconds(gpu.run)  # timed once: no hold, one call
    assert not [e for e in gpu.log if isinstance(e, tuple)] and gpu.log.count("fn") == 2
    gpu = fake_gpu(rate=1e13)  # a spin kernel that returns at once: not a clock
    assert Timer(torch.device("cuda"), repeats=3, max_seconds=10.0).seconds(gpu.run) == pytest.approx(gpu.call_s)
    assert [e[1] for e in gpu.log if isinstance(e, tuple)] == [20_000_000]
