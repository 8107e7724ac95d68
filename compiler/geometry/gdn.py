"""The geometry of one Gated DeltaNet node on one core, the buffers its
kernel library (backends/pallas_tpu/kernels/gdn.py) needs, and their sizes: what
the planner reads (compiler/kind_gdn.py) without the kernel code.

After ``buffers(g)``: every VMEM buffer and semaphore array ``gdn.step``,
``fetch`` and ``drain`` use, by name (``gdn.Buffers``), with its shape; the HBM update
outputs' shapes are ``window`` / ``conv_rows`` / ``update_width``
(compiler/kind_gdn.py's UPDATES rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler.buffers import Need, Space
from megakernel.compiler.plan_json import GEOMETRIES
from megakernel.errors import PlanningError

STATES = ("hist_q", "hist_k", "hist_v", "recurrent")


def window(tokens: int, steps: int) -> int:
    """Rows per sequence of the call's updates: tokens x steps, rounded up to 8
    (a sublane tile). The rebuild transposes a window of keys; and with W = 1
    XLA relaid the commit's operands out (a copy of every key and update, 0.3
    MiB per core per call for qwen3.5-27b/8), treating the degenerate matmul
    as a product over [layers, heads, 128]."""
    return -(-tokens * steps // 8) * 8


def conv_rows(conv_kernel: int, tokens: int, steps: int) -> int:
    """Rows per sequence of a conv rows window: the history before the call
    and the call's rows, rounded up to 8."""
    return -(-(conv_kernel - 1 + tokens * steps) // 8) * 8


def update_width(key_dim: int, value_dim: int) -> int:
    """Lanes of one value head's update row: key | delta-rule update | summed
    log-decay repeated over value_dim lanes."""
    return key_dim + 2 * value_dim


@GEOMETRIES.register("gdn")
@dataclass(frozen=True)
class GDNGeometry:
    batch: int
    tokens: int
    rows_padded: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    norm_eps: float
    conv_dtype: str
    layers: int
    key_replication: int = 1
    steps: int = 1

    def __post_init__(self):
        if not (self.rows_padded >= self.batch * self.tokens and self.rows_padded % 8 == 0):
            raise PlanningError(f"rows_padded={self.rows_padded} must be a multiple of 8 "
                                f"holding batch*tokens={self.batch * self.tokens} rows",
                                path="gdn.geometry")
        if self.value_heads % self.key_heads:
            raise PlanningError(f"value_heads={self.value_heads} is not a multiple of "
                                f"key_heads={self.key_heads} on one core", path="gdn.geometry")

    @property
    def group(self) -> int:
        return self.value_heads // self.key_heads

    @property
    def widths(self) -> tuple[int, int, int]:
        kw = self.key_heads * self.key_dim
        return kw, kw, self.value_heads * self.value_dim

    @property
    def window(self) -> int:
        return window(self.tokens, self.steps)

    @property
    def conv_rows(self) -> int:
        return conv_rows(self.conv_kernel, self.tokens, self.steps)

    @property
    def update_width(self) -> int:
        return update_width(self.key_dim, self.value_dim)

    def describe(self) -> str:
        rep = f", each key head on {self.key_replication} cores" if self.key_replication > 1 else ""
        return (f"{self.value_heads} value head(s) and {self.key_heads} key head(s) per core"
                f"{rep}; state read ahead into a [2]-slot double buffer (read only), the "
                f"call's updates returned ({self.window} rows per sequence)")


def buffers(g: GDNGeometry) -> tuple[Need, ...]:
    hist, (kw, _, vw), w, c = g.conv_kernel - 1, g.widths, g.window, g.conv_rows
    vmem, note = Space.VMEM, "[repetition parity] raw {} rows of the last {} tokens (read only)"
    rows = ("[repetition parity] the history before the call, then the call's raw {} "
            "rows (row Kc-1+i*T+t: step i, token t)")
    return (
        Need("hist_q", vmem, (2, g.batch, hist, kw), g.conv_dtype, note.format("q", hist)),
        Need("hist_k", vmem, (2, g.batch, hist, kw), g.conv_dtype, note.format("k", hist)),
        Need("hist_v", vmem, (2, g.batch, hist, vw), g.conv_dtype, note.format("v", hist)),
        Need("recurrent", vmem, (2, g.batch, g.value_heads, g.key_dim, g.value_dim), "float32",
             "[repetition parity] recurrent state S_0 per value head (read only)"),
        Need("rows_q", vmem, (2, g.batch, c, kw), g.conv_dtype, rows.format("q")),
        Need("rows_k", vmem, (2, g.batch, c, kw), g.conv_dtype, rows.format("k")),
        Need("rows_v", vmem, (2, g.batch, c, vw), g.conv_dtype, rows.format("v")),
        Need("updates", vmem, (2, g.batch, g.value_heads, w, g.update_width), "float32",
             "[repetition parity] per value head, the call's key | update | summed "
             "log-decay rows"),
        Need("sems", Space.SEMAPHORE, (3, 2, len(STATES)), "dma_semaphore",
             "[state read | window read | window store, parity, part]"),
    )


def value_bytes(g: GDNGeometry) -> int:
    """Bytes of values ``step`` holds at its peak beside its inputs: the conv
    outputs and the output ([RP, width] f32 each), the transposed q/k
    ([width, RP], a lane tile wide), the per-head outputs, the gates, S with
    two temporaries of its size, and a head's update window with its
    transposed keys ([W, update width] and [key_dim, W])."""
    kw, _, vw = g.widths
    rp = g.rows_padded
    return 4 * (rp * (2 * kw + 2 * vw + g.value_heads * g.value_dim + 2 * 128)
                + 2 * kw * 128 + 3 * g.key_dim * g.value_dim
                + g.window * (2 * g.update_width + 2 * kw + vw) + g.key_dim * 128)


def vector_ops(g: GDNGeometry) -> int:
    """Elementwise f32 operations of one step (for the cost model): per row and
    value head ~8 passes over S (decay, two products and sums for u and o, the
    update), plus the conv's Kc multiply-adds per channel per row; over several
    steps per call, the rebuild of S from the call's rows (rank i*T at step i,
    on average half the window) per sequence and value head."""
    rows = g.batch * g.tokens
    rebuild = g.batch * g.value_heads * g.key_dim * g.value_dim * 2 * (g.tokens * (g.steps - 1)
                                                                        // 2)
    return rows * (8 * g.value_heads * g.key_dim * g.value_dim
                   + 2 * g.conv_kernel * sum(g.widths)) + rebuild
