"""In-kernel KV-cache write + causal GQA decode attention (called by the megakernel).

Contract (the planner and the emitter use exactly these):

``AttentionGeometry(batch, tokens, rows_padded, q_heads, kv_heads, head_dim,
kv_tile, max_seq_len, scale, window, cache_dtype, softcap, sinks)`` - static
geometry of one attention node on one core (heads LOCAL to the core), chosen
by the planner. Row ``n = b*tokens + t``; rows ``>= batch*tokens`` are padding.
``softcap``: scaled scores s -> softcap * tanh(s / softcap) before the mask;
``sinks``: ``attend`` takes each local head's sink logit, which joins every
softmax denominator (the online softmax starts from it: m = sink, l = 1).

``buffers(g)`` - the VMEM buffers and semaphores ``attend`` needs, by argument
name (the planner records them in the plan; the kernel declares the plan's):
  k_tiles, v_tiles  (2, kv_tile, HD) cache dtype   K / V tile double buffers
  tile_sems         DMA (2, 2)                     [k|v, slot]
  window            (2, W, HD) cache dtype         cache write window, k|v
  window_sems       DMA (2,)                       window read/write, k|v
  q_scaled          (kv_heads, G*RP, D) f32        scaled q, group heads stacked in rows
  m, l              (kv_heads, G*RP, 1) f32        online-softmax running max, denominator
  acc, out          (kv_heads, G*RP, D) f32        running numerator, finished rows
with HD = kv_heads*head_dim, G = q_heads // kv_heads, RP = rows_padded and
W = window_rows(g).

``attend(g, q, k, v, k_cache, v_cache, layer, start_ref, **buffers, sinks=None) -> out`` -
q [RP, Hq*D] f32 (roped), k/v [RP, HD] f32 values; caches are HBM refs
[L, batch, max_seq_len, HD]; layer a traced int32; start_ref SMEM [batch] int32;
sinks [1, q_heads] f32 (with ``g.sinks``).
Writes new k/v at positions start[b]+t, then attends over cache positions
j <= start[b]+t (and j > start[b]+t-window), returns [RP, Hq*D] f32 (padding
rows 0). Every DMA is waited before return, so it can run once per layer in a
fori_loop. Requires start[b] + tokens <= max_seq_len (the reference clamps).

Why this shape: a DMA into HBM at an unaligned token row is rejected by Mosaic
(HBM is tiled (8,128) f32 / (16,128) bf16), so the write is a read-modify-write
of an aligned W-row window (verified in /tmp/proto/p2_kv.py). Queries of all
sequences are kept as one [G*RP, D] block per kv head and rows of other
sequences are masked: extra LHS rows are ~free on the MXU at decode sizes and it
avoids any dynamic sublane slicing. Math is f32 (HIGHEST) like the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.activations import softcap
from megakernel.compiler.buffers import Need, Space
from megakernel.compiler.plan_json import GEOMETRIES
from megakernel.errors import PlanningError

NEG = -1e30          # finite "minus infinity": keeps exp() and max() NaN-free
HI = jax.lax.Precision.HIGHEST


@GEOMETRIES.register("attention")
@dataclass(frozen=True)
class AttentionGeometry:
    batch: int
    tokens: int
    rows_padded: int
    q_heads: int
    kv_heads: int
    head_dim: int
    kv_tile: int
    max_seq_len: int
    scale: float
    window: int | None
    cache_dtype: str
    softcap: float | None = None
    sinks: bool = False

    def __post_init__(self):
        _require(self.rows_padded >= self.batch * self.tokens and self.rows_padded % 8 == 0,
                 f"rows_padded={self.rows_padded} must be a multiple of 8 holding "
                 f"batch*tokens={self.batch * self.tokens} rows")
        _require(self.q_heads % self.kv_heads == 0,
                 f"q_heads={self.q_heads} is not a multiple of kv_heads={self.kv_heads}")
        _require(self.max_seq_len % self.kv_tile == 0,
                 f"kv_tile={self.kv_tile} does not divide max_seq_len={self.max_seq_len}")
        _require(self.window is None or self.window >= 1, f"window={self.window} must be >= 1")

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def width(self) -> int:
        return self.kv_heads * self.head_dim


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise PlanningError(message, path="attention.geometry")


def row_align(dtype) -> int:
    """Token rows per HBM tile: 8 for 32-bit, 16 for bf16, 32 for 8-bit."""
    return max(8, 32 // np.dtype(dtype).itemsize)


def window_rows(g: AttentionGeometry) -> int:
    """Rows of the write window: any T rows starting anywhere fit in an
    aligned window of round_up(T + align - 1, align) rows. When the sequence
    length is not tile aligned, the window is the whole sequence (w0 = 0)."""
    a = row_align(g.cache_dtype)
    w = -(-(g.tokens + a - 1) // a) * a
    if g.max_seq_len % a or w >= g.max_seq_len:
        return g.max_seq_len
    return w


SCORE_BYTES = 64 * 1024    # one [group rows, keys] f32 score block, at most


def score_cols(g: AttentionGeometry) -> int:
    """Keys scored at once: the widest block of the tile (a multiple of 128
    dividing it) whose [G * rows, keys] f32 scores fit ``SCORE_BYTES``."""
    gr = g.group * g.rows_padded
    fits = [c for c in range(128, g.kv_tile + 1, 128)
            if g.kv_tile % c == 0 and gr * c * 4 <= SCORE_BYTES]
    return max(fits) if fits else min(g.kv_tile, 128)


def value_bytes(g: AttentionGeometry) -> int:
    """Bytes of values ``attend`` holds at its peak (one score block: the K and
    V head slices in f32, ~6 [G*rows, keys] arrays of scores and masks, q/out):
    Mosaic keeps them in VMEM beside the declared buffers."""
    gr, sub = g.group * g.rows_padded, score_cols(g)
    capped = gr * sub if g.softcap is not None else 0      # the soft-capped scores
    return 4 * (2 * sub * g.head_dim + 6 * gr * sub + 2 * gr * g.head_dim + capped)


def buffers(g: AttentionGeometry) -> tuple[Need, ...]:
    gr, hd, dt, f32 = g.group * g.rows_padded, g.width, g.cache_dtype, "float32"
    vmem, dma = Space.VMEM, Space.SEMAPHORE
    return (
        Need("k_tiles", vmem, (2, g.kv_tile, hd), dt, f"double buffer of {g.kv_tile}-token K tiles"),
        Need("v_tiles", vmem, (2, g.kv_tile, hd), dt, f"double buffer of {g.kv_tile}-token V tiles"),
        Need("tile_sems", dma, (2, 2), "dma_semaphore", "[k|v, slot]"),
        Need("window", vmem, (2, window_rows(g), hd), dt,
             "aligned cache rows around the new tokens, k|v (read-modify-write)"),
        Need("window_sems", dma, (2,), "dma_semaphore", "[k|v]"),
        Need("q_scaled", vmem, (g.kv_heads, gr, g.head_dim), f32,
             "scaled q, the group's heads stacked along rows"),
        Need("m", vmem, (g.kv_heads, gr, 1), f32, "online softmax running max"),
        Need("l", vmem, (g.kv_heads, gr, 1), f32, "online softmax denominator"),
        Need("acc", vmem, (g.kv_heads, gr, g.head_dim), f32, "online softmax numerator"),
        Need("out", vmem, (g.kv_heads, gr, g.head_dim), f32, "finished rows of every sequence"),
    )


def _row_of(shape, rows_padded, group):
    """Token row n of each element of a [group*rows_padded, X] block (stacked
    heads): concatenated iotas, since vector integer % is best avoided."""
    one = jax.lax.broadcasted_iota(jnp.int32, (rows_padded, shape[1]), 0)
    return jnp.concatenate([one] * group, axis=0) if group > 1 else one


def _write_cache(g, k, v, k_cache, v_cache, layer, b, pos, win, wsem):
    """Read-modify-write the aligned window holding rows pos..pos+T-1 of seq b."""
    wr = window_rows(g)
    a = row_align(g.cache_dtype)
    if wr == g.max_seq_len:
        w0 = 0
    else:
        w0 = pl.multiple_of(jnp.minimum((pos // a) * a, g.max_seq_len - wr), a)
    caches = (k_cache, v_cache)
    rd = [pltpu.make_async_copy(c.at[layer, b, pl.ds(w0, wr), :], win.at[j], wsem.at[j])
          for j, c in enumerate(caches)]
    for c in rd:
        c.start()
    for c in rd:
        c.wait()
    wrow = jax.lax.broadcasted_iota(jnp.int32, (wr, g.width), 0)
    nrow = jax.lax.broadcasted_iota(jnp.int32, (g.rows_padded, g.width), 0)
    for j, new in enumerate((k, v)):
        w = win[j].astype(jnp.float32)
        for t in range(g.tokens):   # T is small; row b*T+t picked by a masked sum (exact)
            row = jnp.sum(jnp.where(nrow == b * g.tokens + t, new, 0.0), axis=0, keepdims=True)
            w = jnp.where(wrow == pos - w0 + t, row, w)
        win[j] = w.astype(win.dtype)
    wb = [pltpu.make_async_copy(win.at[j], c.at[layer, b, pl.ds(w0, wr), :], wsem.at[j])
          for j, c in enumerate(caches)]
    for c in wb:
        c.start()
    for c in wb:
        c.wait()            # the tile reads below must see the new rows


def _sink_rows(g: AttentionGeometry, sinks, h: int):
    """[G*RP, 1] f32: kv head h's stacked rows, each holding its query head's sink."""
    RP = g.rows_padded
    parts = [jnp.broadcast_to(sinks[:, h * g.group + j:h * g.group + j + 1], (RP, 1))
             for j in range(g.group)]
    return jnp.concatenate(parts, axis=0) if g.group > 1 else parts[0]


def attend(g: AttentionGeometry, q, k, v, k_cache, v_cache, layer, start_ref, *, k_tiles,
           v_tiles, tile_sems, window, window_sems, q_scaled, m, l, acc, out,  # noqa: E741
           sinks=None):
    kbuf, vbuf, tsem, win, wsem = k_tiles, v_tiles, tile_sems, window, window_sems
    q_s, m_s, l_s, acc_s, o_s = q_scaled, m, l, acc, out
    D, G, RP, St, T = g.head_dim, g.group, g.rows_padded, g.kv_tile, g.tokens
    GR = G * RP
    # Scaled queries, the G heads of kv head h stacked along rows (aligned: RP % 8 == 0).
    for h in range(g.kv_heads):
        parts = [q[:, (h * G + j) * D:(h * G + j + 1) * D] for j in range(G)]
        q_s[h] = (jnp.concatenate(parts, axis=0) if G > 1 else parts[0]) * g.scale
    o_s[...] = jnp.zeros(o_s.shape, jnp.float32)
    n_out = _row_of((GR, D), RP, G)

    def tile_copies(b, i, slot):
        s0 = pl.multiple_of(i * St, St)
        return (pltpu.make_async_copy(k_cache.at[layer, b, pl.ds(s0, St), :],
                                      kbuf.at[slot], tsem.at[0, slot]),
                pltpu.make_async_copy(v_cache.at[layer, b, pl.ds(s0, St), :],
                                      vbuf.at[slot], tsem.at[1, slot]))

    def seq_body(b, carry):
        pos = start_ref[b]
        _write_cache(g, k, v, k_cache, v_cache, layer, b, pos, win, wsem)
        n_valid = pos + T
        hi = (n_valid + St - 1) // St
        # With a window the earliest visible key is pos - window + 1 (query t = 0).
        lo = 0 if g.window is None else jnp.maximum(pos - g.window + 1, 0) // St
        for c in tile_copies(b, lo, lo % 2):
            c.start()
        if g.sinks:     # the sink is one more key with no value: e^(sink - m) in l
            for h in range(g.kv_heads):
                m_s[h] = _sink_rows(g, sinks, h)
            l_s[...] = jnp.ones(l_s.shape, jnp.float32)
        else:
            m_s[...] = jnp.full(m_s.shape, NEG, jnp.float32)
            l_s[...] = jnp.zeros(l_s.shape, jnp.float32)
        acc_s[...] = jnp.zeros(acc_s.shape, jnp.float32)

        def tile_body(i, c2):
            slot = i % 2

            @pl.when(i + 1 < hi)
            def _():
                for c in tile_copies(b, i + 1, 1 - slot):
                    c.start()

            for c in tile_copies(b, i, slot):
                c.wait()
            # The tile is scored in column blocks of `sub` keys, each made and
            # used in turn, with its masks built here rather than hoisted out of
            # the loops: Mosaic holds every live value in VMEM beside the
            # declared buffers, so this bounds them (``value_bytes``).
            sub = score_cols(g)
            for j0 in range(0, St, sub):
                n_tile = _row_of((GR, sub), RP, G)
                mine = (n_tile >= b * T) & (n_tile < b * T + T)      # rows of sequence b
                q_pos = pos + n_tile - b * T
                k_pos = i * St + j0 + jax.lax.broadcasted_iota(jnp.int32, (GR, sub), 1)
                mask = mine & (k_pos <= q_pos)
                if g.window is not None:
                    mask = mask & (k_pos > q_pos - g.window)
                # rows past the cache end may hold anything
                v_ok = (i * St + j0 + jax.lax.broadcasted_iota(jnp.int32, (sub, 1), 0)) < n_valid
                for h in range(g.kv_heads):
                    kh = kbuf[slot, pl.ds(j0, sub), pl.ds(h * D, D)].astype(jnp.float32)
                    vh = jnp.where(v_ok, vbuf[slot, pl.ds(j0, sub), pl.ds(h * D, D)]
                                   .astype(jnp.float32), 0.0)
                    s = jax.lax.dot_general(q_s[h], kh, (((1,), (1,)), ((), ())),
                                            precision=HI, preferred_element_type=jnp.float32)
                    if g.softcap is not None:
                        s = softcap(s, g.softcap)
                    s = jnp.where(mask, s, NEG)
                    m_old = m_s[h]
                    m_new = jnp.maximum(m_old, jnp.max(s, axis=-1, keepdims=True))
                    alpha = jnp.exp(m_old - m_new)
                    # explicit zero: a row with no visible key in this block adds nothing
                    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
                    l_s[h] = alpha * l_s[h] + jnp.sum(p, axis=-1, keepdims=True)
                    acc_s[h] = alpha * acc_s[h] + jnp.dot(p, vh, precision=HI,
                                                          preferred_element_type=jnp.float32)
                    m_s[h] = m_new
            return c2

        jax.lax.fori_loop(lo, hi, tile_body, 0)
        rows_b = (n_out >= b * T) & (n_out < b * T + T)
        for h in range(g.kv_heads):
            l = l_s[h]
            safe = jnp.where(l > 0, l, 1.0)     # other sequences' rows have l == 0
            o_s[h] = jnp.where(rows_b, acc_s[h] / safe, o_s[h])
        return carry

    jax.lax.fori_loop(0, g.batch, seq_body, 0)
    outs = [o_s[h][j * RP:(j + 1) * RP] for h in range(g.kv_heads) for j in range(G)]
    return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]
