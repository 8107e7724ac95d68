"""What the weight ring streams: its tiles, their segments, and a tile's views.

After import: ``Tile`` is one streamed block of a weight (its rows in words,
its bank, a quantized tile's scales), ``Segment`` the tiles of one stack
layer or of the LM head (runs of equal layers included), ``Words`` the view
of bank words in a tile's own dtype, ``tile_pieces`` the column pieces a
wide tile is folded into, and ``_run_offsets`` a rolled run's traced tile
offsets. The ring itself (``Stream``) is in backends/pallas_tpu/kernels/ring.py,
which re-exports all of this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import dtypes
from megakernel.compiler.ring_layout import run_of


@dataclass(frozen=True)
class Tile:
    """Rows [r0, r0+rows) x cols [c0, c0+cols) of one streamed weight."""

    ref: int          # index into the segment's weight refs
    r0: int
    rows: int
    c0: int
    cols: int
    bank: int = 0     # 0: the main ring; i > 0: auxiliary ring i-1 (unaligned shape)
    dtype: str = "float32"   # the elements the words carry
    fmt: str = ""            # quantized codes: their format (megakernel/formats.py)
    # A quantized tile's f32 scales: rows [sr0, sr0+srows) x the tile's columns
    # of segment weight ``sref``, fetched with the codes into slot t % R of
    # auxiliary ring sbank-1 (its own semaphore, after the pieces').
    sref: int = 0
    sr0: int = 0
    srows: int = 0
    sbank: int = 0

    @property
    def per(self) -> int:
        """Element rows per word row."""
        return 32 // dtypes.of(self.dtype).bits

    @property
    def r0_w(self) -> int:
        return self.r0 // self.per

    @property
    def rows_w(self) -> int:
        return self.rows // self.per


class Words:
    """A region of 32-bit words viewed as ``dtype`` (element rows packed per
    word row): ``load`` bitcasts the loaded words, ``shape`` is in elements."""

    def __init__(self, ref, dtype):
        self.ref, self.dtype = ref, jnp.dtype(dtype)
        self.per = 32 // dtypes.of(self.dtype.name).bits

    @property
    def shape(self) -> tuple[int, int]:
        return (self.ref.shape[0] * self.per, self.ref.shape[1])

    def load(self, r: int, n: int):
        """Element rows [r, r + n) (multiples of ``per``) as a value."""
        words = self.ref[pl.ds(r // self.per, n // self.per), :]
        return pltpu.bitcast(words, self.dtype)

    def __getitem__(self, index):
        if index is not Ellipsis:
            raise TypeError("a ring tile view loads whole rows: use load(r, n) or [...]")
        return self.load(0, self.shape[0])


@dataclass(frozen=True)
class Segment:
    """The ring tiles of one stack layer (``count`` layers) or of the LM head
    (``count`` = 1, unlayered). A stack whose body repeats layers has
    ``runs``: (first tile, tiles, layers) of each run of its body, ``tiles``
    holding one copy of each run's layer; a repetition streams each run's
    tiles once per layer of the run, and a run's tiles are read at its
    run-layer index (repetition k // layers, layer k % layers)."""

    offset: int
    count: int
    tiles: tuple[Tile, ...]
    layered: bool = True
    runs: tuple[tuple[int, int, int], ...] = ()

    @property
    def per_rep(self) -> int:
        """Tiles of one repetition."""
        return sum(n * c for _, n, c in self.runs) if self.runs else len(self.tiles)

    @property
    def end(self) -> int:
        return self.offset + self.count * self.per_rep

    def run_at(self, j: int) -> tuple[int, int, int, int]:
        """(first tile, tiles, layers, first place in a repetition) of the
        run holding tile ``j``."""
        return run_of(self.runs, j)

    def at(self, place: int) -> tuple[int, int, int]:
        """(run layers, run layer, tile) of static place ``place`` of a repetition."""
        off = 0
        for t0, n, c in self.runs:
            if place < off + n * c:
                i, jj = divmod(place - off, n)
                return c, i, t0 + jj
            off += n * c
        raise IndexError(place)


def tile_pieces(tile, width):
    """(col offset, width) pieces of ``tile`` in a main ring of ``width``-column
    banks (an auxiliary-ring tile is one piece)."""
    if tile.bank:
        return [(0, tile.cols)]
    return [(c, min(width, tile.cols - c)) for c in range(0, tile.cols, width)]


def _run_offsets(r0, c0, step, j):
    """(r0, c0) moved by a traced j * step, alignment stated for Mosaic."""
    def moved(base, d):
        return base if d == 0 else pl.multiple_of(base + j * d, math.gcd(base, d))

    return moved(r0, step[0]), moved(c0, step[1])
