"""The weight-stream records: tiles, each stack's tile list, the whole stream.

After import: ``Tile`` is one bank-sized block of a per-core weight (its
bank view, word view, quantized scales and DMA bytes), ``NodeTiles`` an
op's share of a layer's tiles, ``StackStream`` one stack body's tiles and
their flat indices (runs of equal layers included), and ``WeightStream``
the whole step's stream with the LM head (its banks, ``static_banks`` and
``expand``). compiler/tile_weights.py builds them and re-exports them all.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from megakernel.compiler.layout import LANES, round_up, sublanes, word_rows
from megakernel import dtypes, formats
from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.ring_layout import run_banks_static, run_of
from megakernel.ir.graph import body_global_name


@dataclass(frozen=True)
class Tile:
    """Rows [row0, row0+rows) x cols [col0, col0+cols) of the per-core weight
    ``param`` (layer-local name, or global for the LM head), stored [in, out]."""

    param: str
    row0: int
    rows: int
    col0: int
    cols: int
    dtype: str
    # a quantized weight's codes: megakernel/formats.py
    format: str = dataclasses.field(default="plain", metadata={OMIT_DEFAULT: True})

    @functools.cached_property      # read for every tile of every geometry tried
    def view(self) -> tuple[int, int]:
        """Shape of the tile as it sits in its bank (tile-padded)."""
        return (round_up(self.rows, sublanes(self.dtype)), round_up(self.cols, LANES))

    @property
    def words(self) -> tuple[int, int]:
        """The bank-resident view in 32-bit words: the ring holds every tile as
        words, rows packed (megakernel/dtypes.py; ``pltpu.bitcast`` views them)."""
        return (word_rows(self.view[0], self.dtype), self.view[1])

    @property
    def scale_view(self) -> tuple[int, int] | None:
        """[rows, cols] of the f32 scales a quantized tile brings with it (its
        groups' rows, or the one per-channel row), in an auxiliary ring of that
        shape, fetched with the codes under the same flat index; None: plain."""
        if self.format == "plain":
            return None
        fmt = formats.get(self.format)
        return (1 if fmt.group_rows == formats.WHOLE else self.rows // fmt.group_rows,
                self.cols)

    @property
    def scale_row0(self) -> int:
        fmt = formats.get(self.format)
        return 0 if fmt.group_rows == formats.WHOLE else self.row0 // fmt.group_rows

    @property
    def nbytes(self) -> int:
        """Bytes the tile's DMAs move from HBM (4-bit codes: half a byte each;
        a quantized tile's scales included)."""
        scales = self.scale_view[0] * self.cols * 4 if self.scale_view else 0
        return self.rows * self.cols * dtypes.of(self.dtype).bits // 8 + scales

    @property
    def elements(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class NodeTiles:
    """Tiles [first, first + count) of a layer's list belong to op ``node``."""

    node: str
    first: int
    count: int
    nbytes: int
    elements: int


@dataclass(frozen=True)
class StackStream:
    """The tiles of one body of stack ``stack`` (same for all ``count``
    repetitions): ``tiles`` holds one copy of each run's layer (``runs`` as in
    ``ir.graph.Stack``); a repetition streams run 0's tiles once per layer of
    the run, then run 1's, ... Tile j of run-layer k of the run holding j is
    flat index ``flat(k, j)``."""

    stack: int
    start: int
    count: int
    period: int
    offset: int
    tiles: tuple[Tile, ...]
    node_tiles: tuple[NodeTiles, ...]
    # (first body position, first tile, tiles, layers) of each run (empty:
    # no repeated layers, every body layer streamed once per repetition)
    run_tiles: tuple[tuple[int, int, int, int], ...] = dataclasses.field(
        default=(), metadata={OMIT_DEFAULT: True})

    @property
    def runs(self) -> tuple[tuple[int, int, int], ...]:
        """(first tile, tiles, layers) of each run."""
        return tuple(r[1:] for r in self.run_tiles) or ((0, len(self.tiles), 1),)

    @property
    def body_runs(self) -> tuple[tuple[int, int], ...]:
        """The stack's ``ir.graph.Stack.runs``."""
        return tuple((r[0], r[3]) for r in self.run_tiles)

    @property
    def per_layer(self) -> int:
        """Tiles one repetition streams (every run's layers)."""
        return sum(n * c for _, n, c in self.runs)

    @property
    def bytes_per_layer(self) -> int:
        """Ring bytes one repetition streams (every run's layers)."""
        return sum(n.nbytes * self.layers_of(n.first) for n in self.node_tiles)

    def run_at(self, j: int) -> tuple[int, int, int, int]:
        """(first tile, tiles, layers, offset in a repetition) of the run
        holding tile ``j``."""
        return run_of(self.runs, j)

    def layers_of(self, j: int) -> int:
        """Layers of the run holding tile ``j``."""
        return self.run_at(j)[2] if self.run_tiles else 1

    def flat(self, k: int, j: int) -> int:
        """Flat stream index of tile ``j`` of run-layer ``k`` of its run."""
        t0, n, c, off = self.run_at(j)
        rep, i = divmod(k, c)
        return self.offset + rep * self.per_layer + off + i * n + j - t0


@dataclass(frozen=True)
class StreamEntry:
    index: int
    bank: int
    layer: int | None    # None for the LM head
    param: str           # full weight name
    tile: Tile


@dataclass(frozen=True)
class WeightStream:
    bank_bytes: int
    num_banks: int
    stacks: tuple[StackStream, ...]
    head: tuple[Tile, ...]
    head_offset: int
    head_block: int      # logits columns produced per head block
    head_bytes: int
    head_elements: int
    # The MXU width (columns) the tiles were cut for (tile_weights.tile_stream),
    # the narrowest bank the ring lays out (ring_layout); 0: not considered.
    mxu: int = dataclasses.field(default=0, metadata={OMIT_DEFAULT: True})

    @property
    def total(self) -> int:
        return self.head_offset + len(self.head)

    def bank(self, index: int) -> int:
        return index % self.num_banks

    def static_banks(self, steps: int = 1) -> bool:
        """Whether every streamed tile's bank is the same in every layer
        (every run's, ``constant_tiles``)."""
        static, every = self.constant_tiles(steps)
        return static == every

    def constant_tiles(self, steps: int = 1) -> tuple[int, int]:
        """(layers' tiles per step whose bank is a constant, layers' tiles per
        step): the runs of ``ring_layout.run_banks_static``, each counted
        over its stack's repetitions (the report's ring line)."""
        static = every = 0
        for st in self.stacks:
            for t0, n, c in st.runs:
                every += n * c * st.count
                if run_banks_static(st.runs, t0, self.num_banks, steps, self.total):
                    static += n * c * st.count
        return static, every

    def expand(self):
        """The flat ordered stream of one step (for tests and reports)."""
        for st in self.stacks:
            for rep in range(st.count):
                for t0, n, c in st.runs:
                    for r in range(c):
                        for j in range(t0, t0 + n):
                            i = st.flat(rep * c + r, j)
                            name = body_global_name(st.start, st.period, rep * c + r,
                                                    st.tiles[j].param, st.body_runs)
                            yield StreamEntry(i, self.bank(i), int(name.split(".")[1]), name,
                                              st.tiles[j])
        for j, tile in enumerate(self.head):
            i = self.head_offset + j
            yield StreamEntry(i, self.bank(i), None, tile.param, tile)
