"""Host rate curves timed on a busy host are found and re-timed: synthetic rates only, never this machine's clock."""

from __future__ import annotations

import pytest

from slidedp.calibration import host_bench, peer_bench
from slidedp.calibration.measurements import Measurements
from slidedp.calibration.rate_checks import combine, dips, judge, rounds_off, spread, unsettled, warning

# Host rate curves of three `slidedp calibrate --host-only` runs on H100 hosts with Xeon model 207 (GB/s of the
# DRAM stream; benchmarks/RESULTS.md, nineteenth session): c45's 4-thread point was timed while the host was busy.
C42A_STREAM = {1: 11.3, 2: 22.0, 4: 42.2, 8: 67.8, 16: 85.4}
C43_STREAM = {1: 14.6, 2: 28.7, 4: 52.5, 8: 80.2, 16: 109.3}
C45_STREAM = {1: 11.1, 2: 22.2, 4: 23.4, 8: 43.2, 16: 68.7}


def test_a_dip_below_the_neighbours_chord_is_found_and_a_concave_curve_passes():
    assert dips(C45_STREAM) == [4]
    assert dips(C42A_STREAM) == [] and dips(C43_STREAM) == []
    # within the tolerance (10% under the chord) is timing noise, not a dip
    assert dips({1: 10.0, 2: 18.5, 4: 30.0}) == []
    assert dips({1: 10.0, 2: 14.0, 4: 30.0}) == [2]
    # the end points have one neighbour and are not judged (one thread to two may scale superlinearly)
    assert dips({1: 1.49, 2: 3.41, 4: 6.16}) == [] and dips({4: 2.0, 8: 4.0, 16: 1.0}) == []


def test_a_minority_of_busy_rounds_is_outvoted_and_a_majority_is_not():
    assert spread([10.0, 12.0]) == pytest.approx(0.2) and spread([10.0]) == 0.0 and spread([0.0, 1.0]) == float("inf")
    assert rounds_off([20.0, 14.0, 20.1]) == 1 and rounds_off([0.0, 0.0]) == 2
    rounds = {1: [10.0, 10.2, 9.9], 2: [10.0, 14.0, 20.0], 4: [38.0, 30.0, 38.5], 8: [60.0, 61.0, 59.0]}
    verdict = judge(rounds)
    assert verdict.scattered == {2: (2, 3)}  # 4 threads has one busy round in three: its median is clean
    assert unsettled(rounds) == [2]
    assert combine(rounds) == {1: 10.0, 2: 14.0, 4: 38.0, 8: 60.0}
    dipped = {1: [10.0, 10.0], 2: [11.0, 11.0], 4: [40.0, 40.0]}
    assert judge(dipped).scattered == {} and unsettled(dipped) == [2]


def test_the_warning_is_one_line_naming_each_problem_and_none_when_settled():
    clean = {"DRAM stream": ({t: [v, v] for t, v in C42A_STREAM.items()}, "GB/s")}
    assert warning(clean) is None
    line = warning({"DRAM stream": ({t: [v, v] for t, v in C45_STREAM.items()}, "GB/s"),
                    "AdamW": ({1: [1.0, 1.5], 2: [2.0, 2.0], 4: [3.0, 3.0]}, "G/s")})
    assert "\n" not in line
    assert "DRAM stream: a dip at 4 threads (23.4 GB/s)" in line
    assert "AdamW: 2 of 2 rounds off the median at 1 thread" in line
    many = {t: [1.0, 2.0] for t in (1, 2, 4, 8, 16)}
    assert "and 2 more" in warning({"cast": (many, "G/s")})  # one line however many points


class _Scripted:
    """A benchmark whose rate at each thread count follows a script (one value per call), then a steady rate."""

    def __init__(self, steady: dict[int, float], script: dict[int, list[float]]):
        self.steady, self.script, self.calls = steady, {t: list(v) for t, v in script.items()}, []

    def __call__(self) -> float:
        import torch

        threads = torch.get_num_threads()
        self.calls.append(threads)
        queued = self.script.get(threads)
        return queued.pop(0) if queued else self.steady[threads]


def test_rounds_interleave_the_thread_counts_and_re_time_only_what_is_unsettled():
    counts = [1, 2, 4, 8]
    steady = {1: 10.0, 2: 20.0, 4: 38.0, 8: 60.0}
    busy = _Scripted(steady, {4: [20.0, 21.0]})  # two of three rounds busy at 4 threads: a dip in the median
    calm = _Scripted({t: v / 10 for t, v in steady.items()}, {})
    rounds = host_bench.timed_rounds({"stream": busy, "cast": calm}, counts, rounds=3, extra_rounds=2)
    assert busy.calls[:4] == counts and busy.calls[4:8] == counts  # interleaved: every count once per round
    assert rounds["stream"][4] == [20.0, 21.0, 38.0, 38.0, 38.0]  # two extra rounds, at the unsettled point only
    assert len(rounds["stream"][1]) == 3
    assert all(len(v) == 3 for v in rounds["cast"].values())  # a settled pass is not timed again beside it
    assert combine(rounds["stream"])[4] == 38.0
    assert warning({"stream": (rounds["stream"], "GB/s")}) is None  # the busy rounds were outvoted


def test_rounds_stop_re_timing_once_settled_and_never_exceed_the_bound():
    counts = [1, 2, 4]
    settled = _Scripted({1: 10.0, 2: 20.0, 4: 38.0}, {})
    bar = []
    rounds = host_bench.timed_rounds({"x": settled}, counts, rounds=2, extra_rounds=5,
                                     progress=lambda done, total: bar.append((done, total)))
    assert len(settled.calls) == 6  # no extra round
    assert bar == [(1, 7), (2, 7), (7, 7)]  # the bar ends full though no extra round ran
    stuck = _Scripted({1: 10.0, 2: 11.0, 4: 38.0}, {})  # a dip that never goes away
    rounds = host_bench.timed_rounds({"x": stuck}, counts, rounds=2, extra_rounds=3)
    assert len(rounds["x"][2]) == 5 and len(rounds["x"][1]) == 2
    assert "a dip at 2 threads" in warning({"x": (rounds["x"], "G/s")})


def test_a_peer_optimizer_dip_is_re_timed_once_and_the_faster_value_kept(monkeypatch):
    monkeypatch.setattr(peer_bench, "installed", lambda impl: True)
    timings = {(peer_bench.TORCH_ADAMW_FUSED, 8): [1.5, 3.5], (peer_bench.TORCH_CLIP_GRAD_NORM, 8): [1.0, 1.1]}
    steady = {4: 2.0, 8: 3.4, 16: 4.0}
    calls = []

    def fake(impl, threads, params, repeats):
        calls.append((impl, threads))
        queued = timings.get((impl, threads))
        return (queued.pop(0) if queued else steady[threads]), ""

    monkeypatch.setattr(peer_bench, "rate_in_subprocess", fake)
    m = Measurements()
    peer_bench.peer_adam_benchmarks(m, True, [4, 8, 16], implementations=(peer_bench.TORCH_ADAMW_FUSED,
                                                                         peer_bench.TORCH_CLIP_GRAD_NORM))
    assert m.peer_adam_gparams_per_s[peer_bench.TORCH_ADAMW_FUSED] == {4: 2.0, 8: 3.5, 16: 4.0}
    assert m.peer_adam_gparams_per_s[peer_bench.TORCH_CLIP_GRAD_NORM][8] == 1.1  # still a dip: kept, and said
    assert calls.count((peer_bench.TORCH_ADAMW_FUSED, 8)) == 2 and calls.count((peer_bench.TORCH_ADAMW_FUSED, 4)) == 1
    assert m.report["peer_adam_retimed"] == {peer_bench.TORCH_ADAMW_FUSED: [8], peer_bench.TORCH_CLIP_GRAD_NORM: [8]}
    warnings = m.report["warnings"]
    assert len(warnings) == 1 and peer_bench.TORCH_CLIP_GRAD_NORM in warnings[0] and "a dip at 8 threads" in warnings[0]
    assert peer_bench.TORCH_ADAMW_FUSED not in warnings[0]


def test_a_failed_re_time_keeps_the_first_timing_and_says_why(monkeypatch):
    monkeypatch.setattr(peer_bench, "installed", lambda impl: True)
    seen = []

    def fake(impl, threads, params, repeats):
        seen.append(threads)
        if threads == 8 and seen.count(8) == 2:
            return None, "no result within 600 s"
        return {4: 2.0, 8: 1.5, 16: 4.0}[threads], ""

    monkeypatch.setattr(peer_bench, "rate_in_subprocess", fake)
    m = Measurements()
    peer_bench.peer_adam_benchmarks(m, True, [4, 8, 16], implementations=(peer_bench.TORCH_ADAMW_FUSED,))
    assert m.peer_adam_gparams_per_s[peer_bench.TORCH_ADAMW_FUSED][8] == 1.5
    failed, dipped = m.report["warnings"]
    assert "timed again for a dip: no result within 600 s; kept the first timing" in failed
    assert "a dip at 8 threads" in dipped
