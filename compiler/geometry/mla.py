"""The geometry of one multi-head latent attention node on one core in either
form (absorbed / expanded), the buffers its kernel library
(backends/pallas_tpu/kernels/mla.py, mla_cache.py) needs, and their sizes."""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler.buffers import Need, Space
from megakernel.compiler.geometry.attention import window_rows
from megakernel.compiler.layout import LANES, round_up
from megakernel.compiler.plan_json import GEOMETRIES
from megakernel.errors import PlanningError


FORMS = ("absorbed", "expanded")


@GEOMETRIES.register("mla")
@dataclass(frozen=True)
class MLAGeometry:
    batch: int
    tokens: int
    rows_padded: int
    heads: int
    rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    kv_tile: int
    max_seq_len: int
    scale: float
    eps: float
    rope: bool
    rope_factor: float
    output_gate: bool
    form: str
    cache_dtype: str
    weight_dtype: str
    steps: int = 1          # decode steps per call: the window holds tokens*steps new rows

    def __post_init__(self):
        checks = [
            (self.rows_padded >= self.batch * self.tokens and self.rows_padded % 8 == 0,
             f"rows_padded={self.rows_padded} must be a multiple of 8 holding "
             f"batch*tokens={self.batch * self.tokens} rows"),
            (self.max_seq_len % self.kv_tile == 0,
             f"kv_tile={self.kv_tile} does not divide max_seq_len={self.max_seq_len}"),
            (self.form in FORMS, f"form={self.form!r} is not one of {FORMS}"),
            (self.rope_dim % 2 == 0, f"rope_dim={self.rope_dim} must be even"),
        ]
        for ok, message in checks:
            if not ok:
                raise PlanningError(message, path="mla.geometry")

    @property
    def latent(self) -> int:
        return self.rank + self.rope_dim

    @property
    def rows(self) -> int:
        """Query rows of the absorbed form: every head's rows stacked."""
        return self.heads * self.rows_padded

    @property
    def qk_dim(self) -> int:
        return self.nope_dim + self.rope_dim


def value_bytes(g: MLAGeometry) -> int:
    """Bytes of values ``attend`` holds at its peak: one f32 latent chunk, its
    scores and masks (~6 arrays of [rows, keys]), and per form the query
    block (absorbed: q_lat and one head's f32 W_UK or W_UV) or one head's K, V
    and query parts (expanded)."""
    # the keys of a tile's chunk or of the window, whichever is longer
    n, lp, rp = max(chunk_rows(g), window_rows(g)), round_up(g.latent, LANES), g.rows_padded
    if g.form == "absorbed":
        rows = g.rows
        head = g.rank * round_up(max(g.nope_dim, g.v_dim), LANES)
        return 4 * (n * lp + 6 * rows * n + 2 * rows * lp + head)
    kv = n * (round_up(g.nope_dim, LANES) + round_up(g.v_dim, LANES))
    return 4 * (n * lp + kv + 6 * rp * n + 2 * rp * round_up(g.qk_dim, LANES))


def buffers(g: MLAGeometry) -> tuple[Need, ...]:
    vmem, dma, f32 = Space.VMEM, Space.SEMAPHORE, "float32"
    L, R, H, RP = g.latent, g.rank, g.heads, g.rows_padded
    common = (
        Need("tiles", vmem, (2, g.kv_tile, L), g.cache_dtype,
             f"double buffer of {g.kv_tile}-token latent tiles (c_kv | k_pe)"),
        Need("tile_sems", dma, (2,), "dma_semaphore", "[slot]"),
        Need("window", vmem, (2, 1, window_rows(g), L), g.cache_dtype,
             "aligned latent rows holding the call's new rows, [slot, part]"),
        Need("window_sems", dma, (2, 1), "dma_semaphore", "window load/store, [slot, part]"),
        # The expanded form multiplies c_kv by W_UK_h^T: staged transposed once
        # per layer, every KV tile then pushes it at the full [K, N] rate.
        Need("w_uk", vmem, (R, H * g.nope_dim) if g.form == "expanded" else (H * g.nope_dim, R),
             g.weight_dtype, "this core's W_UK (ring)" + (", transposed" if g.form == "expanded"
                                                          else "")),
        Need("w_uv", vmem, (R, H * g.v_dim), g.weight_dtype, "this core's W_UV (ring)"),
    )
    if g.form == "absorbed":
        M = g.rows
        return common + (
            Need("q_lat", vmem, (M, L), f32, "absorbed queries, heads stacked in rows"),
            Need("m", vmem, (M, 1), f32, "online softmax running max"),
            Need("l", vmem, (M, 1), f32, "online softmax denominator"),
            Need("acc", vmem, (M, R), f32, "softmax-weighted latents, running"),
            Need("out", vmem, (M, R), f32, "softmax-weighted latents, finished rows"),
        )
    return common + (
        Need("q_nope", vmem, (H, RP, g.nope_dim), f32, "scaled q_nope per head"),
        Need("q_pe", vmem, (H, RP, g.rope_dim), f32, "scaled, roped q_pe per head"),
        Need("m", vmem, (H, RP, 1), f32, "online softmax running max"),
        Need("l", vmem, (H, RP, 1), f32, "online softmax denominator"),
        Need("acc", vmem, (H, RP, g.v_dim), f32, "online softmax numerator"),
        Need("out", vmem, (H, RP, g.v_dim), f32, "finished rows of every sequence"),
    )


# f32 bytes of one chunk of latent rows (lanes padded): the largest value the
# kernel makes from a tile. 256 KiB is 64 keys at DeepSeek's L = 576.
CHUNK_BYTES = 256 * 1024


def chunk_rows(g) -> int:
    """Keys attended at once: the largest power of two dividing the tile whose
    f32 latent rows fit ``CHUNK_BYTES`` (at least 16)."""
    n = g.kv_tile
    while n > 16 and (n * round_up(g.latent, LANES) * 4 > CHUNK_BYTES or g.kv_tile % n):
        n //= 2
    return n
