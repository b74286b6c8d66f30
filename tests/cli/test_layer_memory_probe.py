"""benchmarks.layer_memory_probe.live_at_peak on a synthetic allocator history (the probe itself needs a GPU)."""

from benchmarks.layer_memory_probe import live_at_peak


def _event(action: str, addr: int, size: int, where: str = "model.py") -> dict:
    frames = [{"filename": f"/site-packages/torch/{where}", "line": 1, "name": "inner"},
              {"filename": f"/work/{where}", "line": 7, "name": "forward"},
              {"filename": "/work/ops.cpp", "line": 3, "name": "kernel"}]
    return {"action": action, "addr": addr, "size": size, "frames": frames}


def test_live_at_peak_replays_allocs_and_frees_and_groups_what_was_live():
    trace = [_event("alloc", 1, 100, "a.py"), _event("alloc", 2, 100, "a.py"), _event("alloc", 3, 50, "b.py"),
             _event("free_requested", 3, 50, "b.py"), _event("free_completed", 3, 50, "b.py"),
             _event("alloc", 4, 80, "c.py"),  # 280 live: the peak (250 before the free)
             _event("free_completed", 1, 100, "a.py"), _event("alloc", 5, 60, "d.py")]  # 240
    live = live_at_peak({"device_traces": [trace]})
    assert live["peak_bytes"] == 280
    assert live["rows"] == [{"bytes": 100, "count": 2, "where": "a.py:7:forward"},
                            {"bytes": 80, "count": 1, "where": "c.py:7:forward"}]


def test_an_allocation_without_python_frames_is_named_by_its_operators():
    frames = [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
              {"filename": "/lib/libtorch.so", "line": 0, "name": "torch::unwind::unwind()"},
              {"filename": "/lib/libtorch.so", "line": 0, "name": "torch::CapturedTraceback::gather(bool, bool, bool)"},
              {"filename": "/lib/libtorch.so", "line": 0, "name": "at::detail::empty_cuda(c10::ArrayRef<long>)"},
              {"filename": "/lib/libtorch.so", "line": 0, "name": "at::_ops::empty_memory_format::call"},
              {"filename": "/lib/libtorch.so", "line": 0, "name": "at::native::flash_attention_backward"},
              {"filename": "/lib/libtorch.so", "line": 0, "name": "torch::autograd::Engine::thread_main"}]
    live = live_at_peak({"device_traces": [[{"action": "alloc", "addr": 1, "size": 64, "frames": frames}]]})
    assert live["rows"][0]["where"] == "at::native::flash_attention_backward < torch::autograd::Engine::thread_main"
