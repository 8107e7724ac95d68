"""How a quantized weight is cut into tiles: row blocks on whole scale groups.

After import: ``_quantized_tiles`` gives a quantized weight's tiles (each
bringing its scales), ``row_blocks`` the legal row cuts of a quantized
matrix, largest first, and ``slice_ok`` whether Mosaic can fetch slices of
a given block with their scales (also the expert slices' rule,
compiler/expert_stream.py). compiler/tile_weights.py re-exports them.
"""

from __future__ import annotations

import dataclasses
import math

from megakernel import formats
from megakernel.compiler.matrix_tiles import _totals, tile_matrix
from megakernel.compiler.weight_stream import Tile
from megakernel.errors import PlanningError


def _quantized_tiles(p, bank: int, mxu: int = 0,
                     kind: str = "weight") -> tuple[tuple[Tile, ...], int, int]:
    """(tiles, DMA bytes, weight elements) of quantized weight ``p``: row blocks
    of codes on whole scale groups (the first legal cut, ``row_blocks``, whose
    tiles fit a bank), each bringing its scales (``Tile.scale_view``) under
    its own flat index. Per-channel scales (one row) come with every row
    block of their columns. ``mxu``: as ``tile_matrix``'s ``min_cols``;
    ``kind`` "head": vocabulary column blocks, as a plain head's (row blocks
    the whole vocabulary wide made the head's logits blocks as wide: 128
    unrolled [64, 25,344] int8 tiles for Muse Spark on 8 cores compiled to
    4.5 MiB of VMEM over the plan, in 233 s against 30)."""
    rows, cols = p.shape[-2:]
    err = None
    for quantum, most in row_blocks(p.format, rows):
        key = (p.name, rows, cols, p.dtype, bank, kind, quantum, most, mxu)
        try:
            _totals(*key)                  # every tile fits a bank
        except PlanningError as e:         # this cut's smallest tile outgrows the bank
            err = err or e
            continue
        tiles = tuple(dataclasses.replace(t, format=p.format) for t in tile_matrix(*key))
        return tiles, sum(t.nbytes for t in tiles), sum(t.elements for t in tiles)
    raise err


def row_blocks(fmt_name: str, rows: int) -> tuple[tuple[int, int], ...]:
    """(quantum, most rows) of each legal cut of a quantized [rows, N] matrix
    into row blocks, the largest blocks first. A block is whole code tiles
    and scale groups, and its f32 scales are a slice of an HBM array, which
    Mosaic cuts along a tiled dimension only into whole 8-row tiles or into
    1-, 2- or 4-row pieces at a multiple of their size (``slice_ok``)."""
    fmt = formats.get(fmt_name)
    q = fmt.row_quantum(rows)
    if fmt.group_rows == formats.WHOLE:
        return ((q, rows),)
    eight = math.lcm(q, 8 * fmt.group_rows)
    out = [(eight, rows)] if rows % eight == 0 else [(rows, rows)]
    return tuple(out + [(size, size) for size in (4 * fmt.group_rows, 2 * fmt.group_rows,
                                                  fmt.group_rows)
                        if size < rows and slice_ok(fmt_name, rows, size)])


def slice_ok(fmt_name: str, rows: int, block: int) -> bool:
    """Whether ``block``-row slices (at multiples of ``block``) of a quantized
    [rows, N] matrix can be fetched with their scales. Measured with libtpu
    0.0.51 (DMA of an f32 [56, 1536] HBM array into VMEM): slices of 8k rows
    at multiples of 8, and of 1, 2 or 4 rows at multiples of their size,
    compile; a 5-row slice fails ("offsets along tiled dimensions must be
    aligned to tiles"), as deepseek-v3's 1024-row fp8 blocks cut to 640 did."""
    if block == rows:
        return True
    fmt = formats.get(fmt_name)
    if block % fmt.row_quantum(rows) or rows % block:
        return False
    if fmt.group_rows == formats.WHOLE:
        return True
    scale_rows = block // fmt.group_rows
    return scale_rows in (1, 2, 4) or scale_rows % 8 == 0
