"""Kernel-side building blocks the generated megakernel calls (as ``rt``).

Everything here runs while the Pallas kernel is traced: refs are VMEM/SMEM/HBM
refs, values are [rows_padded, width] f32 arrays. Sizes arrive as literals from
the generated module (computed by ``emit.py`` from the plan). The weight ring
and per-layer vectors are in ``ring.py``, the remote-DMA collectives in
``collectives.py``; both are re-exported here so generated code needs one name.
``bind`` names the kernel's refs by its tables, and ``make_step`` turns a
generated module's kernel and tables into the jitted call (the same for every
kernel, so it lives here rather than in each module).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import activations
from megakernel.errors import EmitError
from megakernel.compiler.layout import WEIGHT_CHUNK_BYTES
from megakernel.backends.pallas_tpu.kernels import dequant
from megakernel.backends.pallas_tpu.kernels.collectives import (  # noqa: F401
    AllReduce, all_reduce, all_reduce_rs_ag, barrier, exchange_argmax, merge_argmax)
from megakernel.backends.pallas_tpu.kernels.ring import Segment, Stream, Tile, Vectors, tile_pieces  # noqa: F401
from megakernel.backends.pallas_tpu.kernels.step_loop import begin_step, end_step  # noqa: F401
from megakernel.backends.pallas_tpu.kernels.call import (  # noqa: F401 - the library's contract
    Refs, bind, make_step)

NEG_INF = float("-inf")


# Weight bytes loaded per MXU pass: Mosaic holds a loaded weight chunk as one
# value, in VMEM beside the declared buffers, so this bounds what it needs
# there (MemoryPlan.values_bytes); smaller chunks mean more unrolled dots.
CHUNK_BYTES = WEIGHT_CHUNK_BYTES


def matmul(x, w, exact=False):
    """x @ w in w's dtype, f32 accumulation (the reference's ``matmul``);
    ``exact``: full f32 precision for f32 operands (the MXU's default takes
    f32 in fewer bf16 passes), which Mosaic accepts for f32 only."""
    prec = jax.lax.Precision.HIGHEST if exact else None
    return jnp.dot(x.astype(w.dtype), w, preferred_element_type=jnp.float32, precision=prec)


def chunk_rows(rows, cols, itemsize, chunk_bytes=None):
    """Rows of a [rows, cols] weight per MXU pass: at most ``chunk_bytes``, a
    multiple of 16 rows (one packed bf16 tile, two f32 ones)."""
    per = (chunk_bytes or CHUNK_BYTES) // max(cols * itemsize, 1) // 16 * 16
    return min(rows, max(per, 16))


def matmul_ref(x, w, exact=False):
    """x @ w reading the ring view ``w`` (``ring.Words``) in row chunks."""
    rows, cols = w.shape
    step = chunk_rows(rows, cols, w.dtype.itemsize)
    acc = None
    for r in range(0, rows, step):
        n = min(step, rows - r)
        part = matmul(x[:, r:r + n], w.load(r, n), exact)
        acc = part if acc is None else acc + part
    return acc


def ring_linear(stream, s, k, x, tiles, out_cols, first, dequant_to=None, exact=False):
    """y[:, c0:c0+cols] (+)= x[:, r0:r0+rows] @ tile, over static tiles
    ``first .. first+len(tiles)`` of segment s (row blocks accumulate). A
    quantized tile arrives with its scales and is dequantised to
    ``dequant_to`` before the dot (``dequant.matmul``); ``exact``: plain f32
    tiles at full f32 precision (``matmul``)."""
    blocks = {}
    stream.begin(s, k, first, len(tiles))
    for j, t in enumerate(tiles):
        xs = x[:, t.r0:t.r0 + t.rows]
        if t.fmt:
            parts = stream.consume(s, k, first + j, lambda pieces, xs=xs, t=t: [
                ((t.c0 + c, w.shape[1]),
                 dequant.matmul(xs, w.ref, pltpu.bitcast(sc[...], jnp.float32), t.fmt,
                                jnp.dtype(dequant_to), matmul))
                for c, w, sc in pieces])
        else:
            parts = stream.consume(s, k, first + j, lambda pieces, xs=xs, t=t: [
                ((t.c0 + c, w.shape[1]), matmul_ref(xs, w, exact)) for c, w in pieces])
        for key, part in parts:
            blocks[key] = part if key not in blocks else blocks[key] + part
    cols = sorted(blocks)
    out = [blocks[c] for c in cols]
    if sum(c[1] for c in cols) != out_cols:
        raise EmitError(f"tiles {tiles} cover {sum(c[1] for c in cols)} output columns, the "
                        f"plan says {out_cols}", path=f"ring.segment{s}")
    return out[0] if len(out) == 1 else jnp.concatenate(out, axis=-1)


def rmsnorm(x, scale, dim, eps, offset):
    """Groups of ``dim`` features normalised by their rms, times (offset+)scale
    (``scale`` None: parameter-free)."""
    scale = scale + 1.0 if offset else scale
    outs = []
    for g in range(x.shape[-1] // dim):
        h = x[:, g * dim:(g + 1) * dim]
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps)
        if scale is None:
            outs.append(h)
        else:
            outs.append(h * scale[:, :dim] if scale.shape[-1] == dim
                        else h * scale[:, g * dim:(g + 1) * dim])
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-1)


def positions(start_ref, rows_padded, batch, tokens):
    """[rows_padded, 1] int32: start_pos[r // T] + r % T (0 for pad rows)."""
    row = jax.lax.broadcasted_iota(jnp.int32, (rows_padded, 1), 0)
    pos = jnp.zeros((rows_padded, 1), jnp.int32)
    for b in range(batch):
        pos = jnp.where(row // tokens == b, start_ref[b] + row % tokens, pos)
    return pos


def rope(x, pos, inv_freq, heads, head_dim, rotary_dim, factor=1.0):
    """Rotate-half RoPE of the first ``rotary_dim`` features of each head;
    inv_freq is [1, rotary_dim // 2] f32; cos and sin times ``factor`` (YaRN)."""
    half = rotary_dim // 2
    angle = pos.astype(jnp.float32) * inv_freq                      # [rows, half]
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    outs = []
    for h in range(heads):
        base = h * head_dim
        x1 = x[:, base:base + half]
        x2 = x[:, base + half:base + rotary_dim]
        parts = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
        if rotary_dim < head_dim:
            parts.append(x[:, base + rotary_dim:base + head_dim])
        outs.extend(parts)
    return jnp.concatenate(outs, axis=-1)


def pad_lanes(x, width):
    """x [rows, w] zero-padded on the right to [rows, width]."""
    return jnp.concatenate([x, jnp.zeros((x.shape[0], width - x.shape[1]), x.dtype)], axis=-1)


def local_slice(x, me, parts, stride, padded):
    """This core's slice of a whole x [rows, F]: features [me * stride, + stride)
    (the last may be short), zero-padded to ``padded``: the input of a
    row-parallel projection on a replicated tensor (its rows cut alike). A
    select over the static slices: no dynamic lane offset."""
    def piece(c):
        part = x[:, c * stride:min((c + 1) * stride, x.shape[1])]
        return part if part.shape[1] == padded else pad_lanes(part, padded)
    out = piece(parts - 1)
    for c in range(parts - 2, -1, -1):
        out = jnp.where(me == c, piece(c), out)
    return out


def activation(kind, x):
    return activations.apply(kind, x)


def row_gate(x, w, dtype):
    """sigmoid(x . w) per row, [rows, 1]: the reference's ``matmul(x, w[:, None])``
    (x rounded to the weight dtype ``dtype``, f32 products and sum)."""
    x = x.astype(jnp.dtype(dtype)).astype(jnp.float32)
    return jax.nn.sigmoid(jnp.sum(x * w, axis=-1, keepdims=True))


def softcap(x, cap):
    return activations.softcap(x, cap)


def residual_gate(s, b, gate, temperature, floor):
    """alpha * s + beta * b from the f32 gate row [1, dim] (the reference's formula)."""
    return activations.residual_gate(s, b, gate, temperature, floor)


def block_argmax(logits, valid):
    """(max [rows,1], first index [rows,1]) over columns < valid (dynamic)."""
    col = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    masked = jnp.where(col < valid, logits, NEG_INF)
    m = jnp.max(masked, axis=-1, keepdims=True)
    idx = jnp.min(jnp.where(masked == m, col, jnp.int32(2**30)), axis=-1, keepdims=True)
    return m, idx


def gather_embedding(tokens, embed, blocks, sem, me, stride, rows, rows_padded, dtype):
    """Embedding rows of this core's vocabulary slice by token id (SMEM).
    Row r's token arrives in blocks[r] inside its aligned block of A rows
    (blocks is [rows, A, H]) and is picked by a masked sum; rows of
    tokens another core owns stay zero (the all-reduce fills them)."""
    align, hidden = blocks.shape[1], blocks.shape[2]
    blocks[...] = jnp.zeros(blocks.shape, blocks.dtype)

    def local(r):
        return tokens[r] - me * stride

    def each_owned(fn):
        for r in range(rows):
            @pl.when((local(r) >= 0) & (local(r) < stride))
            def _():
                base = pl.multiple_of(local(r) // align * align, align)
                fn(pltpu.make_async_copy(embed.at[pl.ds(base, align)], blocks.at[r],
                                         sem.at[0]))

    each_owned(lambda c: c.start())
    each_owned(lambda c: c.wait())
    sub = jax.lax.broadcasted_iota(jnp.int32, (align, hidden), 0)
    row = jax.lax.broadcasted_iota(jnp.int32, (rows_padded, hidden), 0)
    x = jnp.zeros((rows_padded, hidden), jnp.float32)
    for r in range(rows):
        pick = jnp.where(sub == local(r) % align, blocks[r].astype(jnp.float32), 0.0)
        x = jnp.where(row == r, jnp.sum(pick, axis=0, keepdims=True), x)
    return x


def lm_head(stream, s, xn, logits_ref, valid, base, post=None, dequant_to=None,
            pad_ids=False):
    """Logits blocks from the head tiles; running (max, first global index)
    over the valid vocabulary columns of this core. Each block is reduced as
    soon as its last tile is consumed, so at most a few blocks are live.
    ``pad_ids``: the columns from ``valid`` on are padding ids (the model's
    vocab_used), whose logits are written as -inf, as the reference's.

    A block is (first column, width) of this core's logits: a [hidden, vocab]
    tile's column pieces. The leading run of evenly
    stepped tiles that are whole blocks on their own is a fori_loop; the rest
    (the last R tiles, odd shapes, blocks split over tiles) is unrolled. A
    quantized head's tiles arrive with their scales and are dequantised to
    ``dequant_to`` before the dot (``dequant.matmul``), as ``ring_linear``'s."""
    seg = stream.segments[s]

    def keys(t):
        return head_blocks(t, stream.banks.shape[2])

    def use(pieces, t, r0, c0):
        """[(block key, partial logits)] of one tile at offsets (r0, c0)."""
        xs = xn[:, t.r0:t.r0 + t.rows]
        if t.fmt:
            return [((c0 + c, w.shape[1]),
                     dequant.matmul(xs, w.ref, pltpu.bitcast(sc[...], jnp.float32), t.fmt,
                                    jnp.dtype(dequant_to), matmul)) for c, w, sc in pieces]
        return [((c0 + c, w.shape[1]), matmul_ref(xs, w)) for c, w in pieces]

    def reduce(best, key, blk):
        c0, cols = key
        if post is not None:       # the model's logit ops (e.g. soft-capping), per block
            blk = post(blk)
        if pad_ids:
            col = jax.lax.broadcasted_iota(jnp.int32, blk.shape, 1)
            blk = jnp.where(col < valid - c0, blk, NEG_INF)
        if logits_ref is not None:
            logits_ref[:, pl.ds(c0, cols)] = blk
        m, idx = block_argmax(blk, valid - c0)
        cand = (m, idx + c0 + base)
        return cand if best is None else merge_argmax(best, cand)

    def reduce_parts(best, parts):
        for key, blk in parts:
            best = reduce(best, key, blk)
        return best

    stream.begin(s, 0, 0, len(seg.tiles))
    rolled, step, group = head_loop(seg.tiles, stream.banks.shape[2], stream.R)
    best = None
    if rolled:
        first = seg.tiles[:group]
        rows = xn.shape[0]
        init = (jnp.full((rows, 1), NEG_INF, jnp.float32), jnp.full((rows, 1), 2**30, jnp.int32))

        def body(j, best):
            # the group's row tiles add up to the same blocks, piece by piece
            parts = None
            for i, t in enumerate(first):
                got = stream.consume_run(s, j, first, i, step,
                                         lambda p, r0, c0, t=t: use(p, t, r0, c0))
                parts = got if parts is None else [(key, a + b) for (key, a), (_, b)
                                                   in zip(parts, got)]
            return reduce_parts(best, parts)

        best = jax.lax.fori_loop(0, rolled, body, init)
        rolled *= group

    last = {}
    for j, t in enumerate(seg.tiles):
        for key in keys(t):
            last[key] = j
    blocks = {}
    for j in range(rolled, len(seg.tiles)):
        t = seg.tiles[j]
        for key, part in stream.consume(s, 0, j, lambda p, t=t: use(p, t, t.r0, t.c0)):
            blocks[key] = part if key not in blocks else blocks[key] + part
        for key in [k for k in blocks if last.get(k) == j]:
            best = reduce(best, key, blocks.pop(key))
    for key, blk in blocks.items():      # keys not predicted above (none expected)
        best = reduce(best, key, blk)
    return best


def head_blocks(t, bank_cols):
    """The logits blocks (first column, width) head tile ``t`` contributes to."""
    return [(t.c0 + c, w) for c, w in tile_pieces(t, bank_cols)]


def head_loop(tiles, bank_cols, num_banks):
    """(n, step, group): lm_head loops over n groups of ``group`` tiles,
    tiles[0:n * group]. A group is the row tiles of one column block (a
    hidden size split over tiles where a whole column block does not fit a
    bank; 1 where it does). Tile group * j + i has tile i's shape and sits at
    tile i's offsets plus j * step (columns only); a group's tiles hold the
    same whole logits blocks, no other tile does, and tile k + num_banks
    (started by tile k) is in the loop too."""
    def keys(t):
        return head_blocks(t, bank_cols)

    if len(tiles) < 2:
        return 0, (0, 0), 1
    group = next((i for i, t in enumerate(tiles) if t.c0 != tiles[0].c0), len(tiles))
    if group == len(tiles):
        return 0, (0, 0), 1
    step = (0, tiles[group].c0 - tiles[0].c0)
    owners = {}
    for k, t in enumerate(tiles):
        for key in keys(t):
            owners.setdefault(key, set()).add(k)
    n = 0
    for j in range(len(tiles) // group):
        members = set(range(j * group, (j + 1) * group))

        def fits(i):
            t, t0 = tiles[j * group + i], tiles[i]
            return ((t.ref, t.rows, t.cols, t.bank) == (t0.ref, t0.rows, t0.cols, t0.bank)
                    and (t.r0, t.c0) == (t0.r0, t0.c0 + j * step[1])
                    # block starts index logits lanes, so they must stay lane aligned
                    and all(owners[k] == members and k[0] % 128 == 0 for k in keys(t)))
        if not all(fits(i) for i in range(group)):
            break
        n += 1
    return max((n * group - num_banks) // group, 0), step, group


def ring_to_ref(stream, s, k, tiles, first, dst, transpose=False):
    """A whole (small) weight copied from its ring tiles into the VMEM ref
    ``dst`` at each tile's offsets, a weight chunk at a time (bounded loads,
    no whole-matrix value), for ops that read it more than once; with
    ``transpose`` dst holds it transposed (a once-per-layer transpose, in f32,
    instead of transposed MXU pushes at every use)."""
    stream.begin(s, k, first, len(tiles))

    def put(pieces, t):
        for c, w in pieces:
            step = chunk_rows(t.rows, w.shape[1], w.dtype.itemsize)
            for r in range(0, t.rows, step):
                n = min(step, t.rows - r)
                rows, cols = pl.ds(t.r0 + r, n), pl.ds(t.c0 + c, w.shape[1])
                if transpose:
                    dst[cols, rows] = w.load(r, n).astype(jnp.float32).T.astype(dst.dtype)
                else:
                    dst[rows, cols] = w.load(r, n).astype(dst.dtype)

    for j, t in enumerate(tiles):
        stream.consume(s, k, first + j, lambda pieces, t=t: put(pieces, t))
