"""How a plain per-core matrix is cut into tiles that fit one bank.

After import: ``tile_matrix`` gives the tiles of a [rows, cols] matrix
(row blocks of a weight, vocabulary column blocks of the LM head, in
column-major order) and ``_totals`` their DMA bytes and elements, raising
where a tile outgrows the bank. Quantized weights cut on top of it
(compiler/quantized_tiles.py); compiler/tile_weights.py re-exports both.
"""

from __future__ import annotations

import functools
import math

from megakernel.compiler.layout import LANES, padded_bytes, round_up, sublanes
from megakernel import dtypes
from megakernel.compiler.weight_stream import Tile
from megakernel.errors import PlanningError


def _spans(extent: int, block: int, quantum: int) -> list[tuple[int, int]]:
    """Balanced (start, length) blocks of at most ``block`` covering ``extent``."""
    block = max(min(block, round_up(extent, quantum)), quantum)
    n = -(-extent // block)
    size = round_up(-(-extent // n), quantum)
    return [(s, min(size, extent - s)) for s in range(0, extent, size)]


@functools.lru_cache(maxsize=4096)
def tile_matrix(name: str, rows: int, cols: int, dtype: str, bank: int,
                kind: str = "weight", quantum: int = 1,
                most: int | None = None, min_cols: int = 0) -> tuple[Tile, ...]:
    """Tiles of a per-core [rows, cols] matrix for banks of ``bank`` bytes.
    kind: "weight" (row blocks), "head" (vocab column blocks, whole
    contraction). Row blocks of a "weight" are whole multiples of ``quantum``
    rows too (a quantized weight's scale groups, megakernel/formats.py
    ``row_quantum``), and at most ``most`` rows. Column-major order: a column
    block's rows are adjacent."""
    # In bits: the ring holds 4-bit codes two to a byte (packed in words).
    item, sub, bank = dtypes.of(dtype).bits, sublanes(dtype), 8 * bank
    sub = math.lcm(sub, quantum)
    lane_cols, sub_rows = round_up(cols, LANES), round_up(rows, sub)
    if kind == "weight":
        fill = max(lane_cols, min_cols)
        if sub * fill * item <= bank:
            rb, cb = bank // (fill * item) // sub * sub, cols
        else:
            cb = max(bank // (sub * item) // LANES * LANES, LANES)
            rb = bank // (cb * item) // sub * sub
    else:
        fill = max(LANES, min_cols)      # the narrowest column block worth a matmul
        if sub_rows * fill * item <= bank:
            rb, cb = rows, bank // (sub_rows * item) // LANES * LANES
        else:
            rb, cb = bank // (fill * item) // sub * sub, fill
    if most is not None:
        rb = min(rb, most)
    rspans, cspans = _spans(rows, rb, sub), _spans(cols, cb, LANES)
    return tuple(Tile(name, r0, nr, c0, nc, dtype)
                 for c0, nc in cspans for r0, nr in rspans)


@functools.lru_cache(maxsize=4096)
def _totals(name: str, rows: int, cols: int, dtype: str, bank: int,
            kind: str = "weight", quantum: int = 1, most: int | None = None,
            min_cols: int = 0) -> tuple[int, int]:
    """(DMA bytes, elements) of ``tile_matrix``'s tiles; raises when one does
    not fit a bank (only possible for banks below a few native tiles)."""
    tiles = tile_matrix(name, rows, cols, dtype, bank, kind, quantum, most, min_cols)
    worst = max(tiles, key=lambda t: t.view[0] * t.view[1])
    need = padded_bytes(worst.words, "int32")      # as the bank holds it: words
    if need > bank:
        raise PlanningError(f"a {worst.view[0]}x{worst.view[1]} tile of {name} needs {need} "
                            f"bytes, more than bank_bytes={bank}", path="plan.ring",
                            hint="raise bank_bytes")
    return sum(t.nbytes for t in tiles), sum(t.elements for t in tiles)
