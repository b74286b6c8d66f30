"""Precision of the host optimizer state: the one home of its byte counts and names.

The host state is fp32 master weights and fp32 Adam moments by default (exact AdamW). Compact modes store the
master in bf16 (updated with stochastic rounding, and then itself the weight that streams to the GPU) and/or
the moments in bf16 or blockwise 8-bit (per-block absmax scale). They cut the bytes the host holds and the
DRAM bytes the CPU update moves, the two walls of host-resident training. The memory model, the workload
(update bytes and rate), the runtime's state layout and the CLI's ``--state`` all read this module.

Names: ``<master>+<moments>`` (``fp32+int8``, ``bf16+int8``, ...); ``fp32`` alone is ``fp32+fp32``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from slidedp.errors import SlideDPError

MasterDtype = Literal["fp32", "bf16"]
MomentDtype = Literal["fp32", "bf16", "int8"]
MASTER_DTYPES: tuple[str, ...] = ("fp32", "bf16")
MOMENT_DTYPES: tuple[str, ...] = ("fp32", "bf16", "int8")

# Elements per absmax scale of the 8-bit moments; one fp32 scale per block per moment. Blocks are counted from
# each unit's first element (a unit's last block may be shorter), and every chunk and data-parallel shard
# boundary is a multiple of the block inside its unit (slidedp.routes), so no update job shares a block with
# another. Why 256 (and the maps, in runtime/compact_adam.py): benchmarks/quant_maps.py measured the
# round-trip error of the Adam update direction for blocks of 64, 256 and 2048 (benchmarks/RESULTS.md).
INT8_BLOCK = 256
_SCALE_BYTES = 4
_ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
GRAD_SLOT_BYTES = 2  # the bf16 slot a unit's gradient lands in (and, with an fp32 master, the streamed weights)


@dataclass(frozen=True)
class StatePrecision:
    """Storage dtypes of the host optimizer state."""

    master: MasterDtype = "fp32"
    moments: MomentDtype = "fp32"

    def __post_init__(self) -> None:
        if self.master not in MASTER_DTYPES:
            raise SlideDPError(f"state master must be one of {', '.join(MASTER_DTYPES)}, got {self.master!r}")
        if self.moments not in MOMENT_DTYPES:
            raise SlideDPError(f"state moments must be one of {', '.join(MOMENT_DTYPES)}, got {self.moments!r}")

    @property
    def name(self) -> str:
        return "fp32" if self.is_exact else f"{self.master}+{self.moments}"

    @classmethod
    def parse(cls, name: str) -> StatePrecision:
        """``fp32``, ``bf16`` (both master and moments) or ``<master>+<moments>``."""
        text = str(name).strip().lower()
        if "+" in text:
            master, _, moments = text.partition("+")
        elif text in ("fp32", "bf16"):
            master = moments = text
        else:
            raise SlideDPError(f"state {name!r}: expected fp32, bf16 or <master>+<moments> with master in "
                               f"{'/'.join(MASTER_DTYPES)} and moments in {'/'.join(MOMENT_DTYPES)}")
        return cls(master, moments)  # type: ignore[arg-type]

    @property
    def is_exact(self) -> bool:
        """fp32 master and moments: today's exact AdamW."""
        return self.master == "fp32" and self.moments == "fp32"

    @property
    def master_streams(self) -> bool:
        """A bf16 master is itself the weight the GPU reads: no cast pass and no separate weight copy."""
        return self.master == "bf16"

    @property
    def master_bytes(self) -> float:
        return _ELEMENT_BYTES[self.master]

    @property
    def moment_bytes(self) -> float:
        """Bytes per parameter of one moment, its share of the block scales included."""
        if self.moments == "int8":
            return 1 + _SCALE_BYTES / INT8_BLOCK
        return _ELEMENT_BYTES[self.moments]

    @property
    def block(self) -> int:
        """Element alignment that chunk and shard boundaries need: the 8-bit block, else 1."""
        return INT8_BLOCK if self.moments == "int8" else 1

    @property
    def optimizer_bytes_per_param(self) -> float:
        """Master weights and both moments: what a host keeps only for its share when sharded across hosts."""
        return self.master_bytes + 2 * self.moment_bytes

    def needs_grad_buffer(self, grad_bytes: int, slot_bytes: int = GRAD_SLOT_BYTES) -> bool:
        """Whether gradients need a host buffer of their own beside the slot: always with a bf16 master (the slot
        is the master), else where the gradient's dtype is not the slot's. The runtime allocates by this rule
        (runtime.host_state) and the memory model counts by it."""
        return self.master_streams or grad_bytes != slot_bytes

    def slot_bytes_per_param(self, grad_bytes: int = 2, slot_bytes: int = GRAD_SLOT_BYTES) -> float:
        """The slot a unit's gradient lands in, which with an fp32 master also holds the weights the next H2D
        reads (``slot_bytes``: 2 for the bf16 compute of a GPU run, 4 for a CPU run in fp32; a bf16 master is the
        slot itself), plus the gradient buffer where ``needs_grad_buffer``."""
        own_slot = 0 if self.master_streams else slot_bytes
        return own_slot + (grad_bytes if self.needs_grad_buffer(grad_bytes, slot_bytes) else 0)

    def host_bytes_per_param(self, grad_bytes: int = 2, slot_bytes: int = GRAD_SLOT_BYTES) -> float:
        """Host bytes per parameter of the shared state: master, m, v, the slot and any gradient buffer. 14 for
        fp32 with bf16 gradients, ~8 with 8-bit moments, ~6 with a bf16 master and 8-bit moments; fp32 gradients
        need 4 more with an fp32 master and 2 more with a bf16 one (16 for an fp32 CPU run, slot and gradient
        alike)."""
        return self.optimizer_bytes_per_param + self.slot_bytes_per_param(grad_bytes, slot_bytes)

    def update_dram_bytes_per_param(self, grad_bytes: int) -> float:
        """DRAM bytes one parameter's one-pass update moves: read the gradient, read and write master, m and v,
        and with an fp32 master write the bf16 weights too (28 for fp32 with bf16 gradients)."""
        weights_out = 0 if self.master_streams else GRAD_SLOT_BYTES
        return grad_bytes + 2 * self.master_bytes + 4 * self.moment_bytes + weights_out


def unit_block_starts(unit_numels: list[int] | tuple[int, ...]) -> list[int]:
    """Index of each unit's first 8-bit block in the flat scale arrays (blocks counted from each unit's start),
    with the total block count appended: the one rule of where a range's scales are."""
    starts = [0]
    for numel in unit_numels:
        starts.append(starts[-1] + -(-numel // INT8_BLOCK))
    return starts


EXACT = StatePrecision()

# What ``--state auto`` may choose from, in order of preference when they tie (exact first).
STATE_CHOICES: tuple[StatePrecision, ...] = (
    EXACT, StatePrecision("fp32", "bf16"), StatePrecision("fp32", "int8"), StatePrecision("bf16", "bf16"),
    StatePrecision("bf16", "int8"),
)
