"""Cut the streamed weights into bank-sized tiles: the weight-stream schedule.

After ``tile_stream``: every ring-channel weight of every layer and the LM head
is covered by tiles that fit one bank, exactly once, in consumption order. The
per-layer tile list is the same for every layer of a stack, so the kernel finds
tile j of layer l of stack s at flat index ``offset_s + (l - start_s) * n_s + j``
and its bank at ``flat % num_banks``. Ring protocol: before the first layer the
kernel starts tiles 0..R-1; after it has consumed tile t it starts tile t+R
into the bank t just freed, so at most R tiles are in flight or resident and
the stream runs ahead across op, layer and stack boundaries into the LM head.

Tiles of a [in, out] matrix are row blocks (the matmul accumulates over them);
a matrix whose sublane-high row block does not fit a bank is cut into column
blocks first. LM head tiles are column blocks of the vocabulary covering the
whole contraction, so each finished block is one slice of logits (a tied
head too: it streams a [hidden, vocab] copy of the embedding).
Routed experts are not in the ring: after routing, each selected expert is
fetched as ``chunks`` intermediate slices (gate/up columns + down rows) through
K expert slots, slice n of the layer going to slot n % K.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from megakernel.compiler.layout import (LANES, itemsize, padded_bytes, round_up, sublanes,
                                        word_rows)
from megakernel import dtypes, formats
from megakernel.compiler.plan_json import OMIT_DEFAULT
from megakernel.compiler.ring_layout import banks_static, run_of
from megakernel.compiler.shard import ShardPlan
from megakernel.errors import PlanningError
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
    # (format, weight elements) of its quantized weights: each format's kernel
    # path (dequant.matmul) has its own calibrated MXU rate
    quantized: tuple[tuple[str, int], ...] = dataclasses.field(
        default=(), metadata={OMIT_DEFAULT: True})


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

    @property
    def total(self) -> int:
        return self.head_offset + len(self.head)

    def bank(self, index: int) -> int:
        return index % self.num_banks

    def static_banks(self, steps: int = 1) -> bool:
        """Whether every streamed tile's bank is the same in every layer
        (ring_layout.banks_static for each stack, and a whole number of ring
        turns per step when a call runs several)."""
        if steps > 1 and self.total % self.num_banks:
            return False
        return all(banks_static(st.runs, self.num_banks) for st in self.stacks)

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


@dataclass(frozen=True)
class ExpertStream:
    """Expert-slot plan of one MoE node of stack ``stack``: slot k holds
    gate [hidden, chunk], up [hidden, chunk], down [chunk, hidden] of one slice
    of one expert; each expert is ``chunks`` slices of ``chunk`` columns."""

    stack: int
    node: str
    slots: int
    chunk: int
    chunks: int
    hidden: int
    experts_local: int
    max_distinct: int    # worst case distinct experts per layer per core
    dtype: str
    # quantized experts (megakernel/formats.py): codes as 32-bit words in the
    # slots, f32 scales in slots of their own
    format: str = dataclasses.field(default="plain", metadata={OMIT_DEFAULT: True})

    def scale_rows(self, rows: int) -> int:
        """Scale rows of a [rows, N] slice of one expert matrix."""
        fmt = formats.get(self.format)
        return 1 if fmt.group_rows == formats.WHOLE else rows // fmt.group_rows

    @property
    def slot_bytes(self) -> int:
        h, c = self.hidden, self.chunk
        if self.format == "plain":
            return 3 * padded_bytes((h, c), self.dtype)
        words = (2 * padded_bytes((word_rows(h, self.dtype), c), "int32")
                 + padded_bytes((word_rows(c, self.dtype), h), "int32"))
        return words + 2 * padded_bytes((self.scale_rows(h), c), "float32") + padded_bytes(
            (self.scale_rows(c), h), "float32")

    @property
    def chunk_dma_bytes(self) -> int:
        h, c = self.hidden, self.chunk
        codes = 3 * h * c * dtypes.of(self.dtype).bits // 8
        if self.format == "plain":
            return codes
        return codes + 4 * (2 * self.scale_rows(h) * c + self.scale_rows(c) * h)

    @property
    def bytes_per_layer(self) -> int:
        return self.max_distinct * self.chunks * self.chunk_dma_bytes


def _spans(extent: int, block: int, quantum: int) -> list[tuple[int, int]]:
    """Balanced (start, length) blocks of at most ``block`` covering ``extent``."""
    block = max(min(block, round_up(extent, quantum)), quantum)
    n = -(-extent // block)
    size = round_up(-(-extent // n), quantum)
    return [(s, min(size, extent - s)) for s in range(0, extent, size)]


@functools.lru_cache(maxsize=4096)
def tile_matrix(name: str, rows: int, cols: int, dtype: str, bank: int,
                kind: str = "weight", quantum: int = 1,
                most: int | None = None) -> tuple[Tile, ...]:
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
        if sub * lane_cols * item <= bank:
            rb, cb = bank // (lane_cols * item) // sub * sub, cols
        else:
            cb = max(bank // (sub * item) // LANES * LANES, LANES)
            rb = bank // (cb * item) // sub * sub
    else:
        if sub_rows * LANES * item <= bank:
            rb, cb = rows, bank // (sub_rows * item) // LANES * LANES
        else:
            rb, cb = bank // (LANES * item) // sub * sub, LANES
    if most is not None:
        rb = min(rb, most)
    rspans, cspans = _spans(rows, rb, sub), _spans(cols, cb, LANES)
    return tuple(Tile(name, r0, nr, c0, nc, dtype)
                 for c0, nc in cspans for r0, nr in rspans)


@functools.lru_cache(maxsize=4096)
def _totals(name: str, rows: int, cols: int, dtype: str, bank: int,
            kind: str = "weight", quantum: int = 1, most: int | None = None) -> tuple[int, int]:
    """(DMA bytes, elements) of ``tile_matrix``'s tiles; raises when one does
    not fit a bank (only possible for banks below a few native tiles)."""
    tiles = tile_matrix(name, rows, cols, dtype, bank, kind, quantum, most)
    worst = max(tiles, key=lambda t: t.view[0] * t.view[1])
    need = padded_bytes(worst.words, "int32")      # as the bank holds it: words
    if need > bank:
        raise PlanningError(f"a {worst.view[0]}x{worst.view[1]} tile of {name} needs {need} "
                            f"bytes, more than bank_bytes={bank}", path="plan.ring",
                            hint="raise bank_bytes")
    return sum(t.nbytes for t in tiles), sum(t.elements for t in tiles)


def tile_stream(shard: ShardPlan, bank_bytes: int, num_banks: int) -> WeightStream:
    stacks, offset = [], 0
    for st in shard.stacks:
        tiles: list[Tile] = []
        nodes: list[NodeTiles] = []
        for p in st.params:
            if p.channel != "ring" or p.scale_of:      # scales go with their weight
                continue
            node = p.name.split(".")[0]
            if p.format == "plain":
                key = (p.name, *p.shape, p.dtype, bank_bytes)
                mine = tile_matrix(*key)
                nbytes, elements = _totals(*key)
            else:
                mine, nbytes, elements = _quantized_tiles(p, bank_bytes)
            q = () if p.format == "plain" else ((p.format, elements),)
            if nodes and nodes[-1].node == node:
                n = nodes[-1]
                nodes[-1] = NodeTiles(node, n.first, n.count + len(mine), n.nbytes + nbytes,
                                      n.elements + elements, _merged(n.quantized + q))
            else:
                nodes.append(NodeTiles(node, len(tiles), len(mine), nbytes, elements, q))
            tiles.extend(mine)
        runs = _run_tiles(st, tiles)
        stacks.append(StackStream(st.stack, st.start, st.count, st.period, offset, tuple(tiles),
                                  tuple(nodes), runs))
        offset += stacks[-1].count * stacks[-1].per_layer
    p = shard.global_param("lm_head.weight")
    key = (p.name, *p.shape, p.dtype, bank_bytes, "head")
    head = tile_matrix(*key)
    nbytes, elements = _totals(*key)
    block = head[0].cols
    return WeightStream(bank_bytes, num_banks, tuple(stacks), head, offset, block, nbytes,
                        elements)


def _run_tiles(st, tiles) -> tuple[tuple[int, int, int, int], ...]:
    """(body position, first tile, tiles, layers) of each run of shard stack ``st`` (empty
    without runs: every body layer streams once per repetition)."""
    if not st.runs:
        return ()
    out = []
    for first, c in st.runs:
        mine = [j for j, t in enumerate(tiles) if t.param.startswith(f"l{first}_")]
        t0 = mine[0] if mine else (out[-1][1] + out[-1][2] if out else 0)
        if mine != list(range(t0, t0 + len(mine))):
            raise PlanningError(f"tiles of the run at body position {first} are not "
                                "contiguous in the stream", path=f"plan.layers[{st.stack}]")
        out.append((first, t0, len(mine), c))
    return tuple(out)


def _merged(pairs) -> tuple[tuple[str, int], ...]:
    """(format, elements) pairs summed per format."""
    out: dict[str, int] = {}
    for fmt, n in pairs:
        out[fmt] = out.get(fmt, 0) + n
    return tuple(sorted(out.items()))


def _quantized_tiles(p, bank: int) -> tuple[tuple[Tile, ...], int, int]:
    """(tiles, DMA bytes, weight elements) of quantized weight ``p``: row blocks
    of codes on whole scale groups (the first legal cut, ``row_blocks``, whose
    tiles fit a bank), each bringing its scales (``Tile.scale_view``) under
    its own flat index. Per-channel scales (one row) come with every row
    block of their columns."""
    rows, cols = p.shape[-2:]
    err = None
    for quantum, most in row_blocks(p.format, rows):
        key = (p.name, rows, cols, p.dtype, bank, "weight", quantum, most)
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


def expert_streams(shard: ShardPlan, rows: int, top_k: dict[str, int], slots: int,
                   chunks: int | None) -> tuple[ExpertStream, ...]:
    """Slot plans for every MoE node. ``chunks`` slices per expert (rounded to a
    divisor of the 128-lane groups of the per-core intermediate; None = 1)."""
    out = []
    for st in shard.stacks:
        for node, _ep, _tp, local, width in st.experts:
            p = st.param(f"{node}.experts_gate")
            groups = width // LANES
            # a slice of a quantized down matrix brings a legal slice of scale rows
            c = max(d for d in range(1, groups + 1) if groups % d == 0 and d <= (chunks or 1)
                    and (p.format == "plain" or slice_ok(p.format, width, width // d)))
            out.append(ExpertStream(st.stack, node, slots, width // c, c, p.shape[1], local,
                                    min(local, rows * top_k[node]), p.dtype, p.format))
    return tuple(out)


def chunk_options(width: int) -> list[int]:
    """Legal slices-per-expert counts for a per-core intermediate ``width``."""
    groups = width // LANES
    return [d for d in range(1, groups + 1) if groups % d == 0]
