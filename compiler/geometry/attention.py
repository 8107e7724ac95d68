"""The geometry of one attention node on one core, the buffers its kernel
library (backends/pallas_tpu/kernels/attention.py) needs, and their sizes:
what the planner reads without the kernel code.

After ``buffers(g)``: every VMEM buffer and semaphore array the library's
``prefetch``, ``attend`` and ``drain`` use, by argument name, with its shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler import layout
from megakernel.compiler.buffers import Need, Space
from megakernel.compiler.plan_json import GEOMETRIES
from megakernel.errors import PlanningError


@GEOMETRIES.register("attention")
@dataclass(frozen=True)
class AttentionGeometry:
    batch: int
    tokens: int
    rows_padded: int
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_tile: int
    max_seq_len: int
    scale: float
    window: int | None
    cache_dtype: str
    softcap: float | None = None
    sinks: bool = False
    steps: int = 1          # decode steps per call: the window holds tokens*steps new rows

    def __post_init__(self):
        _require(self.rows_padded >= self.batch * self.tokens and self.rows_padded % 8 == 0,
                 f"rows_padded={self.rows_padded} must be a multiple of 8 holding "
                 f"batch*tokens={self.batch * self.tokens} rows")
        _require(self.q_heads % self.kv_heads == 0,
                 f"q_heads={self.q_heads} is not a multiple of kv_heads={self.kv_heads}")
        _require(self.max_seq_len % self.kv_tile == 0,
                 f"kv_tile={self.kv_tile} does not divide max_seq_len={self.max_seq_len}")
        _require(self.window is None or self.window >= 1, f"window={self.window} must be >= 1")

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def width(self) -> int:
        return self.kv_heads * self.head_dim


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise PlanningError(message, path="attention.geometry")


def row_align(dtype) -> int:
    """Token rows per HBM tile: 8 for 32-bit, 16 for bf16, 32 for 8-bit."""
    return layout.row_align(str(dtype))


def window_rows(g: AttentionGeometry) -> int:
    """Rows of a sequence's window of new rows (the call's tokens x steps,
    starting anywhere; ``compiler.layout.append_window``)."""
    return layout.append_window(g.tokens * g.steps, g.cache_dtype, g.max_seq_len)


SCORE_BYTES = 64 * 1024    # one [group rows, keys] f32 score block, at most


def score_cols(g: AttentionGeometry) -> int:
    """Keys scored at once: the widest block of the tile (a multiple of 128
    dividing it) whose [G * rows, keys] f32 scores fit ``SCORE_BYTES``."""
    gr = g.group * g.rows_padded
    fits = [c for c in range(128, g.kv_tile + 1, 128)
            if g.kv_tile % c == 0 and gr * c * 4 <= SCORE_BYTES]
    return max(fits) if fits else min(g.kv_tile, 128)


def value_bytes(g: AttentionGeometry) -> int:
    """Bytes of values ``attend`` holds at its peak (one score block: the K and
    V head slices in f32, ~6 [G*rows, keys] arrays of scores and masks, q/out):
    Mosaic keeps them in VMEM beside the declared buffers."""
    gr, sub = g.group * g.rows_padded, max(score_cols(g), window_rows(g))
    capped = gr * sub if g.softcap is not None else 0      # the soft-capped scores
    return 4 * (2 * sub * g.head_dim + 6 * gr * sub + 2 * gr * g.head_dim + capped)


def buffers(g: AttentionGeometry) -> tuple[Need, ...]:
    gr, hd, dt, f32 = g.group * g.rows_padded, g.width, g.cache_dtype, "float32"
    vmem, dma = Space.VMEM, Space.SEMAPHORE
    return (
        Need("k_tiles", vmem, (2, g.kv_tile, hd), dt, f"double buffer of {g.kv_tile}-token K tiles"),
        Need("v_tiles", vmem, (2, g.kv_tile, hd), dt, f"double buffer of {g.kv_tile}-token V tiles"),
        Need("tile_sems", dma, (2, 2), "dma_semaphore", "[k|v, slot]"),
        Need("window", vmem, (2, 2, window_rows(g), hd), dt,
             "aligned cache rows around the new tokens, [sequence parity, k|v]"),
        Need("window_sems", dma, (2, 2), "dma_semaphore", "[sequence parity, k|v]"),
        Need("q_scaled", vmem, (g.kv_heads, gr, g.head_dim), f32,
             "scaled q, the group's heads stacked along rows"),
        Need("m", vmem, (g.kv_heads, gr, 1), f32, "online softmax running max"),
        Need("l", vmem, (g.kv_heads, gr, 1), f32, "online softmax denominator"),
        Need("acc", vmem, (g.kv_heads, gr, g.head_dim), f32, "online softmax numerator"),
        Need("out", vmem, (g.kv_heads, gr, g.head_dim), f32, "finished rows of every sequence"),
    )
