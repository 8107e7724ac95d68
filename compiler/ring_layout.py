"""Lay out the weight ring's banks in VMEM: their shape, and each tile's place.

After ``ring_layout``: every streamed tile lands in the top-left corner of its
bank, either the main banks ``[R, rows, cols]`` or, for a tile whose shape is
not a whole number of native tiles (a DMA into a corner of a bigger buffer
must be aligned to (sublanes, 128) along the tiled dims), an auxiliary ring of
exactly its shape. A main-ring tile wider than the banks is folded into column
pieces stacked along the bank's rows (``runtime.Stream``), so a bank of
``bank_bytes`` holds any tile the tiling made for that size, whatever its
orientation. The ring's declared VMEM is ``nbytes``, which is what the kernel
allocates; it may exceed ``num_banks * bank_bytes`` by the padding of the
widest tile's pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

from megakernel.compiler.layout import padded_bytes
from megakernel.errors import PlanningError


def aligned(tile) -> bool:
    """Whether ``tile`` is a whole number of native [sublanes, 128] tiles."""
    return (tile.rows, tile.cols) == tile.view


def _bank_rows_cols(tiles) -> tuple[int, int]:
    """[rows, cols] of one main bank: pick the column width that makes the bank
    smallest once wider tiles are folded (ties: wider, fewer DMAs)."""
    views = {t.view for t in tiles}          # many tiles share a shape: size each once

    def rows_for(width):
        return max(r * -(-c // width) for r, c in views)

    widths = sorted({c for _, c in views})
    best = min(widths, key=lambda w: (rows_for(w) * w, -w))
    return rows_for(best), best


@dataclass(frozen=True)
class RingLayout:
    num_banks: int
    dtype: str
    bank_rows: int
    bank_cols: int
    aux: tuple[tuple[int, int], ...]     # (rows, cols) of each auxiliary ring

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_banks, self.bank_rows, self.bank_cols)

    def aux_shape(self, i: int) -> tuple[int, int, int]:
        return (self.num_banks, *self.aux[i])

    @property
    def nbytes(self) -> int:
        return padded_bytes(self.shape, self.dtype) + sum(
            padded_bytes(self.aux_shape(i), self.dtype) for i in range(len(self.aux)))

    def bank_of(self, tile) -> int:
        """0: the main banks; i > 0: auxiliary ring i - 1."""
        return 0 if aligned(tile) else 1 + self.aux.index((tile.rows, tile.cols))


def ring_layout(stream) -> RingLayout:
    tiles = [t for st in stream.stacks for t in st.tiles] + list(stream.head)
    dtypes = sorted({t.dtype for t in tiles})
    if len(dtypes) != 1:
        raise PlanningError(f"ring tiles of several dtypes {dtypes} need typed views of one "
                            "byte ring, which this planner does not build yet", path="plan.ring")
    main = [t for t in tiles if aligned(t)] or tiles
    rows, cols = _bank_rows_cols(main)
    aux = tuple(dict.fromkeys((t.rows, t.cols) for t in tiles if not aligned(t)))
    return RingLayout(stream.num_banks, dtypes[0], rows, cols, aux)
