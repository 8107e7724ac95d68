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

The records are in compiler/weight_stream.py, a plain matrix's cut in
compiler/matrix_tiles.py, a quantized one's in compiler/quantized_tiles.py
and the expert slots in compiler/expert_stream.py; all re-exported here.
"""

from __future__ import annotations

from megakernel.compiler.expert_stream import (ExpertStream, chunk_options,  # noqa: F401
                                               expert_streams)
from megakernel.compiler.matrix_tiles import _spans, _totals, tile_matrix  # noqa: F401
from megakernel.compiler.quantized_tiles import _quantized_tiles, row_blocks, slice_ok  # noqa: F401
from megakernel.compiler.ring_layout import ring_layout
from megakernel.compiler.shard import ShardPlan
from megakernel.compiler.weight_stream import (NodeTiles, StackStream, StreamEntry,  # noqa: F401
                                               Tile, WeightStream)
from megakernel.errors import PlanningError


def piece_cols(shard: ShardPlan, target) -> int:
    """The narrowest column piece the ring's tiles are cut for (``tile_stream``'s
    ``mxu``): ``target.piece_cols`` (every MXU of the core side by side) where
    at least half the layers' streamed weight elements are in weights that
    wide, else ``target.mxu_size``. Cutting narrower weights as if that wide
    takes them fewer rows per tile, so a model of mostly narrow weights would
    stream twice the tiles for pieces it cannot widen (the drawn and tiny
    models; at full size every zoo card's weights are mostly wide)."""
    wide = every = 0
    for st in shard.stacks:
        for p in st.params:
            if p.channel == "ring" and not p.scale_of:
                n = p.shape[0] * p.shape[1] * st.reps(p.name)
                every += n
                wide += n if p.shape[1] >= target.piece_cols else 0
    return target.piece_cols if every and 2 * wide >= every else target.mxu_size


def tile_stream(shard: ShardPlan, bank_bytes: int, num_banks: int,
                mxu: int = 0) -> WeightStream:
    """The ring's tiles of every streamed weight for banks of ``bank_bytes``;
    ``mxu``: the target's MXU width (narrow weights are row-blocked as if that
    wide, ``tile_matrix``'s ``min_cols``)."""
    stacks, offset = [], 0
    for st in shard.stacks:
        tiles: list[Tile] = []
        nodes: list[NodeTiles] = []
        for p in st.params:
            if p.channel != "ring" or p.scale_of:      # scales go with their weight
                continue
            node = p.name.split(".")[0]
            if p.format == "plain":
                key = (p.name, *p.shape, p.dtype, bank_bytes, "weight", 1, None, mxu)
                mine = tile_matrix(*key)
                nbytes, elements = _totals(*key)
            else:
                mine, nbytes, elements = _quantized_tiles(p, bank_bytes, mxu)
            if nodes and nodes[-1].node == node:
                n = nodes[-1]
                nodes[-1] = NodeTiles(node, n.first, n.count + len(mine), n.nbytes + nbytes,
                                      n.elements + elements)
            else:
                nodes.append(NodeTiles(node, len(tiles), len(mine), nbytes, elements))
            tiles.extend(mine)
        runs = _run_tiles(st, tiles)
        stacks.append(StackStream(st.stack, st.start, st.count, st.period, offset, tuple(tiles),
                                  tuple(nodes), runs))
        offset += stacks[-1].count * stacks[-1].per_layer
    p = shard.global_param("lm_head.weight")
    if p.format == "plain":
        key = (p.name, *p.shape, p.dtype, bank_bytes, "head", 1, None, mxu)
        head = tile_matrix(*key)
        nbytes, elements = _totals(*key)
    else:
        head, nbytes, elements = _quantized_tiles(p, bank_bytes, mxu, kind="head")
    block = head[0].cols
    return WeightStream(bank_bytes, num_banks, tuple(stacks), head, offset, block, nbytes,
                        elements, mxu)


def ring_stream(shard: ShardPlan, target, bank_bytes: int, num_banks: int):
    """(the weight stream, its ring layout) for banks of ``bank_bytes`` on ``target``."""
    stream = tile_stream(shard, bank_bytes, num_banks, piece_cols(shard, target))
    return stream, ring_layout(stream)


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

