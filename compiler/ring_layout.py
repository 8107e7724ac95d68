"""Lay out the weight ring's banks in VMEM: their shape, and each tile's place.

The ring is bytes: its banks are 32-bit words, ``[R, rows, cols]`` int32, and
every streamed weight is packed in HBM as words along its rows (two bf16 rows
or four int8 rows per word row; ``pack.to_words``). A tile of any dtype lands
in its bank as words and is read back through a typed view (``pltpu.bitcast``
of the loaded words), so tiles of different formats share one ring.

After ``ring_layout``: every streamed tile lands in the top-left corner of its
bank, either the main banks or, for a tile whose shape is not a whole number
of native tiles (a DMA into a corner of a bigger buffer must be aligned to
(8, 128) words along the tiled dims), an auxiliary ring of exactly its shape.
A main-ring tile wider than the banks is folded into column pieces stacked
along the bank's rows (``runtime.Stream``), each its own DMA and semaphore,
so a bank of ``bank_bytes`` holds any tile the tiling made for that size,
whatever its orientation. The ring's declared VMEM is ``nbytes``; it may
exceed ``num_banks * bank_bytes`` by the padding of the widest tile's pieces.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from megakernel.compiler.layout import scratch_bytes, word_rows

WORD = "int32"


def aligned(tile) -> bool:
    """Whether ``tile`` is a whole number of native [sublanes, 128] tiles."""
    return (tile.rows, tile.cols) == tile.view


def _aux_shape(tile) -> tuple[int, int]:
    return (word_rows(tile.rows, tile.dtype), tile.cols)


def _bank_rows_cols(shapes, mxu: int = 0) -> tuple[int, int]:
    """[rows, cols] of one main bank, in words, for tiles of word ``shapes``:
    pick the column width that makes the bank smallest once wider tiles are
    folded (ties: wider, fewer DMAs). A column piece is one matmul's output
    width, and each piece waits for its own DMA, so it must keep every MXU of
    the core busy: no width narrower than ``mxu`` columns
    (``Target.piece_cols``, 512 on TPU7x) is taken where a tile is at least
    that wide. libtpu's static schedule of qwen3-32b on 8 cores (2 layers)
    put 128-column pieces at 517,599 core cycles, 256-column ones at 204,631
    and 512-column ones at 145,048 (tools/profile_cut.py, vocabulary 4,096;
    the calibrated rates and the bench plans' before and after are in
    docs/floors.md, "Ring pieces as wide as every MXU"). The candidates are then multiples
    of that width, and the widest tile's width (nothing folded)."""
    def rows_for(width):
        return max(rows * -(-cols // width) for rows, cols in shapes)

    widest = max(cols for _, cols in shapes)
    widths = {cols for _, cols in shapes}
    if mxu:                          # whole MXU widths, or no folding at all
        widths = set(range(mxu, widest + 1, mxu)) | {widest}
    best = min(sorted(widths), key=lambda w: (rows_for(w) * w, -w))
    return rows_for(best), best


@dataclass(frozen=True)
class RingLayout:
    num_banks: int
    bank_rows: int                       # in 32-bit words
    bank_cols: int
    aux: tuple[tuple[int, int], ...]     # (word rows, cols) of each auxiliary ring
    max_pieces: int                      # most column pieces of one tile
    dtype: str = WORD
    scales: bool = False                 # quantized tiles: one more DMA, their scales

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_banks, self.bank_rows, self.bank_cols)

    def aux_shape(self, i: int) -> tuple[int, int, int]:
        return (self.num_banks, *self.aux[i])

    @property
    def nbytes(self) -> int:
        """VMEM of the banks and auxiliary rings, tiled as Mosaic tiles scratch:
        what the plan's ``ring.*`` buffers declare (plan_buffers.sized)."""
        return scratch_bytes(self.shape, WORD) + sum(
            scratch_bytes(self.aux_shape(i), WORD) for i in range(len(self.aux)))

    @property
    def sems_per_bank(self) -> int:
        """A semaphore per column piece, and one for a quantized tile's scales."""
        return self.max_pieces + int(self.scales)

    def scale_bank(self, tile) -> int:
        """Auxiliary ring (1-based, as ``bank_of``) of a quantized tile's scales."""
        return 1 + self.aux.index(tile.scale_view)

    def pieces(self, tile) -> int:
        """Column pieces a tile is folded into (each its own DMA and semaphore)."""
        return len(self.piece_widths(tile))

    def piece_widths(self, tile) -> list[int]:
        """Column widths (in the tile's columns) of the pieces ``tile`` streams
        in: bank-wide ones and the rest; one, in an auxiliary ring."""
        if self.bank_of(tile):
            return [tile.cols]
        return [min(self.bank_cols, tile.cols - c) for c in range(0, tile.cols, self.bank_cols)]

    def bank_of(self, tile) -> int:
        """0: the main banks; i > 0: auxiliary ring i - 1."""
        return 0 if aligned(tile) else 1 + self.aux.index(_aux_shape(tile))


def ring_layout(stream) -> RingLayout:
    """The banks for ``stream``'s tiles, at least ``stream.mxu`` columns wide
    (the target's MXU width, the narrowest column piece worth a matmul)."""
    # One tile of each shape: a layer's tiles repeat shapes, the head's all but one.
    every = [t for st in stream.stacks for t in st.tiles] + list(stream.head)
    tiles = list({(t.rows, t.cols, t.dtype, t.format): t for t in every}.values())
    main = [t for t in tiles if aligned(t)] or tiles
    rows, cols = _bank_rows_cols({t.words for t in main}, stream.mxu)
    scale_views = [t.scale_view for t in tiles if t.scale_view]
    aux = tuple(dict.fromkeys([_aux_shape(t) for t in tiles if not aligned(t)] + scale_views))
    layout = RingLayout(stream.num_banks, rows, cols, aux, 1, scales=bool(scale_views))
    return dataclasses.replace(layout, max_pieces=max(layout.pieces(t) for t in tiles))


def banks_static(runs, num_banks: int, steps: int = 1, total: int = 0) -> bool:
    """Whether every layer of a stack (``runs``: (first tile, tiles, layers)
    of each run of its body) finds its tile j in the same bank: every run
    does (``run_banks_static``). The kernel then indexes each tile's bank and
    semaphores by a constant rather than by one computed from the layer
    index, which libtpu's static schedule shows costs the core less
    (docs/floors.md). The planner (``WeightStream.constant_tiles``) and the
    kernel's ring (backends/pallas_tpu/kernels/ring.py, Stream) decide per run."""
    return all(run_banks_static(runs, t0, num_banks, steps, total) for t0, _, _ in runs)


def run_banks_static(runs, j: int, num_banks: int, steps: int = 1, total: int = 0) -> bool:
    """Whether the run holding tile ``j`` finds each of its tiles in the same
    bank at every layer: a repetition advances the flat index by whole turns
    of the ring, and so does each layer of the run where it has several. A
    call of ``steps`` > 1 runs the ring on across steps, so each step's
    ``total`` tiles must be whole turns too. Where only some runs are static
    (Qwen3.5's body: 110 tiles a repetition over 11 banks, the attention
    layer's run static, the Gated DeltaNet run of 3 x 28 tiles not), the
    kernel indexes those runs' banks by constants and the rest by the layer."""
    if steps > 1 and total % num_banks:
        return False
    _, n, c, _ = run_of(runs, j)
    per_rep = sum(n * c for _, n, c in runs)
    return per_rep % num_banks == 0 and (c == 1 or n % num_banks == 0)


def run_of(runs, j: int) -> tuple[int, int, int, int]:
    """(first tile, tiles, layers, first place in a repetition) of the run
    holding tile ``j`` of a stack whose body has runs of equal layers
    (``runs``: (first tile, tiles, layers) each, in stream order). Shared by
    the planner's stream (tile_weights.StackStream) and the kernel's ring
    (backends/pallas_tpu/kernels/ring.py, Segment)."""
    off = 0
    for t0, n, c in runs:
        if t0 <= j < t0 + n or (n == 0 and j == t0):
            return t0, n, c, off
        off += n * c
    raise IndexError(j)
