"""What a streamed weight tile costs the MXU, by the width of its pieces.

The ring folds a tile wider than its banks into column pieces, each its own
DMA waited for just before its matmuls (``ring_layout``, ``runtime.Stream``).
The waits order the pieces, so one piece's matmuls cannot overlap the next
one's: a piece narrower than every MXU of the core side by side leaves some
idle, and a piece wider than 2,048 columns is multiplied in row chunks of
fewer than 32 rows (``runtime.chunk_rows``). ``megakernel calibrate``
streams bf16 tiles in pieces of each width at two row counts and fits a piece's cycles as
fixed cycles (its wait, issue and result) plus its weights at a per-width
rate (``ring_piece_cycles.{width}``, ``ring_piece_weights_per_cycle.{width}``;
``calibrate_kernels.ring_piece``). A 128-column piece costs ~260 fixed
cycles, a 512-column one ~24 (libtpu 0.0.51).

After ``mxu_elements``: a node's streamed tiles are counted as the bf16 weight
elements that, at the one-dot rate the cost model charges
(``mxu_weights_per_cycle.bfloat16.kn`` with ``mxu_push_rows`` rows), take
the core as long as those tiles do in their pieces. Quantized tiles keep
their format's own kernel-path rate (``cost.format_factor``); plain tiles of
another dtype are charged the one-dot rate (no piece probe covers them).
"""

from __future__ import annotations

import collections

from megakernel.compiler import calibration
from megakernel.compiler.calibration import RING_WIDTHS
from megakernel.compiler.layout import LANES


def piece_cycles(width: int, rows: int, cal=None) -> float:
    """Calibrated core cycles of one bf16 ring piece [rows, width] (width
    rounded up to whole lanes): its fixed cycles plus its weights at its
    width's rate. Between two probed widths: the slower of their two rules
    (the rate is not monotone in width: 640 and 768 run slower than 512);
    past the widest probed: the widest's."""
    cal = cal or calibration.load()
    w = -(-width // LANES) * LANES
    below = max((p for p in RING_WIDTHS if p <= w), default=RING_WIDTHS[0])
    above = min((p for p in RING_WIDTHS if p >= w), default=below)
    return max(cal.rate(f"ring_piece_cycles.{p}")
               + rows * width / cal.rate(f"ring_piece_weights_per_cycle.{p}")
               for p in (below, above))


def mxu_elements(tiles, ring, rows: int, cal=None) -> float:
    """bf16 one-dot weight elements as costly as plain bf16 ``tiles`` streamed
    through ``ring`` with ``rows`` LHS rows: a piece's cycles are the larger of
    its calibrated cycles and its flops."""
    cal = cal or calibration.load()
    fpc, push = cal.rate("flops_per_cycle"), cal.rate("mxu_push_rows")
    # the elements whose flops at max(rows, push rows) take those cycles (at up
    # to mxu_push_rows rows, fpc / (2 x push rows) is the one-dot rate)
    per_cycle = fpc / (2.0 * max(rows, push))
    cycles = _cycles(cal)
    out = 0.0
    # a layer's tiles repeat a few shapes, the head's all but one
    shapes = collections.Counter((t.rows, t.cols, t.view) for t in tiles)
    first = {(t.rows, t.cols, t.view): t for t in reversed(tiles)}
    for shape, count in shapes.items():
        tile = first[shape]
        for w in ring.piece_widths(tile):
            c = cycles.get((w, tile.rows))
            if c is None:
                c = cycles[w, tile.rows] = piece_cycles(w, tile.rows, cal)
            out += count * max(c, 2.0 * rows * tile.rows * w / fpc) * per_cycle
    return out


# Per calibration (held, so its id names no other), its pieces' cycles by
# (width, rows): the cost model asks for the same few shapes for every node of
# every stack of every geometry the planner tries.
_CYCLES: dict[int, tuple[object, dict]] = {}


def _cycles(cal) -> dict:
    kept = _CYCLES.get(id(cal))
    if kept is None:
        if len(_CYCLES) >= 8:            # calibrations made by tests: keep a few
            _CYCLES.clear()
        kept = _CYCLES[id(cal)] = (cal, {})
    return kept[1]
