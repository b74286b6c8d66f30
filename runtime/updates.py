"""The CPU optimizer: AdamW chunk by chunk on the host (:class:`HostUpdater`), on a background worker
thread when a GPU is busy (:class:`UpdateWorker`).

Jobs run strictly in submission order (the order the schedule needs them). A job may carry a CUDA
event: the worker blocks on it before touching the host buffer the device copy wrote, which is the
guard against reading a gradient before its D2H finished.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable

import torch

from slidedp.errors import SlideDPError
from slidedp.resources import CAST_HOST_BYTES, FUSED_ADAM_HOST_BYTES, adam_host_bytes_per_param
from slidedp.runtime.chunks import ChunkTable
from slidedp.runtime.comm import Comm
from slidedp.runtime.compact_adam import AdamScalars, compact_update
from slidedp.runtime.cpu_adam import fused_kernel, fused_kernel_error
from slidedp.runtime.device import Device
from slidedp.runtime.host_state import HostState
from slidedp.runtime.optim import OptimConfig, adamw_chunk_, lr_at
from slidedp.runtime.tracing import TraceRecorder


class UpdateWorker:
    """Runs ``run_job(key, args)`` jobs in submission order, inline or on one daemon thread."""

    def __init__(self, run_job: Callable[[tuple, tuple], None], threaded: bool, threads: int | None):
        self._run_job = run_job
        self._threaded = threaded
        self._done: dict[tuple, threading.Event] = {}
        self._error: BaseException | None = None
        self._threads = threads
        if threaded:
            self._queue: queue.Queue = queue.Queue()
            self._thread = threading.Thread(target=self._loop, name="slidedp-adam", daemon=True)
            self._thread.start()

    def submit(self, key: tuple, args: tuple, event=None) -> None:
        """Queue job ``key`` (e.g. (unit, chunk)) with ``args``; inline workers run it now."""
        done = threading.Event()
        self._done[key] = done
        if self._threaded:
            self._queue.put((key, args, event, done))
        else:
            Device.host_wait(event)
            self._run_job(key, args)
            done.set()

    def wait(self, key: tuple) -> None:
        done = self._done.get(key)
        if done is None:
            return
        while not done.wait(timeout=0.5):
            self._raise_if_failed()
        self._raise_if_failed()
        del self._done[key]

    def wait_all(self) -> None:
        for key in list(self._done):
            self.wait(key)

    def close(self) -> None:
        if self._threaded:
            self._queue.put(None)
            self._thread.join(timeout=60)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"CPU optimizer worker failed: {self._error}") from self._error

    def _loop(self) -> None:
        if self._threads:
            torch.set_num_threads(self._threads)
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, args, event, done = item
            try:
                Device.host_wait(event)
                self._run_job(key, args)
            except BaseException as exc:  # surfaced to the trainer thread by wait()
                self._error = exc
            finally:
                done.set()


class HostUpdater:
    """The CPU AdamW of every chunk range this rank owns, run by an :class:`UpdateWorker`.

    A job updates one range: the one-pass kernel (read gradient + state, write state + bf16 weights) where
    the gradient lands in a bf16 slot, otherwise torch's AdamW followed by a cast of the new master into
    the slot. Either way the slot then holds what the chunk's next H2D copies. Lifecycle per step: jobs are
    submitted (all at once, deferred to the next forward, or chunk by chunk as gradients land), the
    streamer waits for a chunk's job before copying it in, ``flush`` drains everything.

    Under the ``sharded`` host layout a job then all-gathers the new weights with this rank's peers on the
    other hosts (``weight_peers``) into the slot, so the chunk is whole in every host's slot before its flag
    says it is updated.
    """

    def __init__(self, table: ChunkTable, host: HostState, optim: OptimConfig, recorder: TraceRecorder,
                 as_ready: bool, threaded: bool, threads: int | None, fused_adam: bool | None, seed: int = 0,
                 weight_peers: Comm | None = None):
        self.table, self.host, self.optim, self.recorder = table, host, optim, recorder
        self.weight_peers = weight_peers if table.routes.shards_hosts else None
        self.as_ready = as_ready  # jobs run before the global norm is known: a chunk guards itself
        self.seed = seed  # of the stochastic rounding of compact state (runtime/compact_adam.py)
        self.compact = not host.precision.is_exact
        # One-pass AdamW + bf16 cast when the gradient lands in the bf16 weight slot, and for every compact
        # state (None: when it compiles).
        slot_is_bf16 = host.grads is None and host.slot.dtype == torch.bfloat16
        self._kernel = None
        if (slot_is_bf16 or self.compact) and fused_adam is not False:
            self._kernel = fused_kernel()
            if self._kernel is None and fused_adam:
                raise SlideDPError(f"the fused CPU AdamW kernel did not compile: {fused_kernel_error()}")
            if self._kernel is None:
                print(f"slidedp: warning: the one-pass CPU AdamW kernel is unavailable ({fused_kernel_error()}); "
                      f"using torch's AdamW and a separate cast (slower)", file=sys.stderr)
        self._scratch = torch.empty(table.largest_chunk, dtype=torch.float32)  # the worker's fp32 gradient
        self._deferred: tuple[float, float, int] | None = None  # (lr, clip coefficient, step) for next forward
        self.nonfinite_chunks = 0  # as_ready only: chunks whose update was skipped for a non-finite gradient
        self.worker: UpdateWorker | None = UpdateWorker(self._run, threaded=threaded, threads=threads)

    # ---- submitting -------------------------------------------------------------------------------------------
    def submit_all(self, lr: float, coef: float, step: int) -> None:
        for u, c, _, _ in self.table.owned():
            self.worker.submit((u, c), (lr, coef, step))

    def defer(self, lr: float, coef: float, step: int) -> None:
        """Hold this step's updates until the next forward (or a flush) submits them."""
        self._deferred = (lr, coef, step)

    def submit_deferred(self) -> None:
        if self._deferred is not None:
            self.submit_all(*self._deferred)
            self._deferred = None

    def submit_landed(self, u: int, c: int, landed=None) -> None:
        """as_ready: update chunk ``c`` of unit ``u`` as soon as its gradient is in host memory (``landed``:
        the event of its D2H), with the next step's learning rate and no clipping."""
        step = self.host.step
        self.worker.submit((u, c), (lr_at(self.optim, step), 1.0, step + 1), landed)

    # ---- waiting ----------------------------------------------------------------------------------------------
    def wait_chunk(self, u: int, c: int) -> None:
        """Block until every owner's update of chunk ``c`` of unit ``u`` for the current step is in the slot."""
        self.worker.wait((u, c))
        self.table.wait_for_owners(u, c, self.host.step)

    def wait_all(self) -> None:
        self.worker.wait_all()

    def flush(self) -> None:
        """Submit deferred updates and wait for every job: afterwards the host state is complete."""
        self.submit_deferred()
        self.worker.wait_all()

    def restore_slots(self) -> None:
        """A skipped step: the owned slots hold its gradients; put the unchanged weights back (and, sharded
        across hosts, the other hosts' parts of the chunks, which a CPU sum may have overwritten)."""
        self.worker.wait_all()
        self.publish_all()

    def publish_all(self) -> None:
        """Every owned range's slot from its master, all-gathered across hosts under ``sharded``: after a
        skipped step, and after a resume has filled only this host's share."""
        master, slot = self.host.master, self.host.slot
        for u, c, lo, hi in self.table.owned():
            slo, shi = self.table.state_range(u, c, lo, hi)
            if slot is not master:  # (a bf16 master is the slot)
                slot[lo:hi].copy_(master[slo:shi])
            self._exchange(u, c, lo, hi)

    def _exchange(self, u: int, c: int, lo: int, hi: int) -> None:
        """Sharded host layout: the new weights of this rank's range, and of its peers' ranges on the other
        hosts, into this host's slot."""
        if self.weight_peers is None:
            return
        ranges = self.table.peer_ranges(u, c)
        base = min(a for a, _ in ranges)
        top = max(b for _, b in ranges)
        n = sum(b - a for a, b in ranges) - (hi - lo)
        with self.recorder.host_span("nic", "weight_allgather", u, c, nbytes=n * self.host.slot.element_size(),
                                     host_bytes=n * self.host.slot.element_size()):
            self.weight_peers.all_gather_ranges(self.host.slot[base:top], self.host.slot[lo:hi],
                                                [(a - base, b - base) for a, b in ranges])

    def close(self) -> None:
        self.worker.close()
        self.worker = None  # break the updater <-> worker cycle so the host state can be freed at once

    # ---- the job ----------------------------------------------------------------------------------------------
    def _run(self, key: tuple, args: tuple) -> None:
        (u, c), (lr, coef, step) = key, args
        lo, hi = self.table.owned_range(u, c)
        self._update(u, c, lo, hi, lr, coef, step)
        self._exchange(u, c, lo, hi)
        self.table.mark_updated(u, c, step)

    def _update(self, u: int, c: int, lo: int, hi: int, lr: float, coef: float, step: int) -> None:
        host = self.host
        grad = host.grad_buffer[lo:hi]
        slo, shi = self.table.state_range(u, c, lo, hi)  # the same range unless the host keeps a share
        master, exp_avg, exp_avg_sq = host.master[slo:shi], host.exp_avg[slo:shi], host.exp_avg_sq[slo:shi]
        n = hi - lo
        if self.as_ready and not bool(torch.isfinite(grad).all()):
            # Updated before the norm is known, a chunk can only protect itself: skip it, keep its weights.
            if host.slot is not host.master:
                host.slot[lo:hi].copy_(master)
            self.nonfinite_chunks += 1
            return
        if self.compact:
            self._update_compact(u, c, lo, hi, lr, coef, step)
            return
        if self._kernel is not None:  # one pass: read grad + state, write state + bf16 weights (28 B/param)
            with self.recorder.host_span("cpu", "adam", u, c, nbytes=n * FUSED_ADAM_HOST_BYTES,
                                         host_bytes=n * FUSED_ADAM_HOST_BYTES):
                o = self.optim
                self._kernel.adamw_bf16(master, exp_avg, exp_avg_sq, grad, lr,
                                        o.beta1, o.beta2, o.eps, o.weight_decay, float(step), coef)
            return
        adam_bytes = n * adam_host_bytes_per_param(grad.element_size(), fused_cast=False)
        with self.recorder.host_span("cpu", "adam", u, c, nbytes=adam_bytes, host_bytes=adam_bytes):
            adamw_chunk_(master, grad, exp_avg, exp_avg_sq, step, lr, self.optim, coef, self._scratch)
        with self.recorder.host_span("cpu", "cast", u, c, nbytes=n * CAST_HOST_BYTES, host_bytes=n * CAST_HOST_BYTES):
            host.slot[lo:hi].copy_(master)

    def _update_compact(self, u: int, c: int, lo: int, hi: int, lr: float, coef: float, step: int) -> None:
        """Compact state: the kernel, or its bit-identical torch path (runtime/compact_adam.py)."""
        host, o = self.host, self.optim
        nbytes = (hi - lo) * host.precision.update_dram_bytes_per_param(host.grad_buffer.element_size())
        scalars = AdamScalars(lr, o.beta1, o.beta2, o.eps, o.weight_decay, step, coef, self.seed)
        with self.recorder.host_span("cpu", "adam", u, c, nbytes=nbytes, host_bytes=nbytes):
            compact_update(self._kernel, host.range(lo, hi), scalars)
