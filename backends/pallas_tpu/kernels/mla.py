"""In-kernel multi-head latent attention over the latent cache (called by the megakernel).

Contract (the planner and the emitter use exactly these):

``MLAGeometry(batch, tokens, rows_padded, heads, rank, nope_dim, rope_dim,
v_dim, kv_tile, max_seq_len, scale, eps, rope, rope_factor, output_gate, form,
cache_dtype, weight_dtype)`` - one MLA node on one core (``heads`` LOCAL to
the core), chosen by the planner. L = rank + rope_dim values per cached token.

``buffers(g)`` - by name (M = heads * rows_padded, RP = rows_padded; the kernel
passes the ones the plan bound to a node as one ``Buffers``, ``bufs``):
  tiles        (2, kv_tile, L) cache dtype     latent tile double buffer
  tile_sems    DMA (2,)                        [slot]
  window       (2, 1, W, L) cache dtype        the sequences' windows of new rows,
                                               [slot, part] (new_rows.Windows)
  window_sems  DMA (2, 1)                      window load/store, [slot, part]
  w_uk         (heads*dn, R) weight dtype      this core's W_UK, from the ring
                                               ((R, heads*dn), transposed, in the expanded form)
  w_uv         (R, heads*dv) weight dtype      this core's W_UV, from the ring
``form`` "absorbed" adds
  q_lat        (M, L) f32          [q_nope_h W_UK_h | q_pe_h] * scale, heads stacked in rows
  m, l         (M, 1) f32          online softmax running max, denominator
  acc, out     (M, R) f32          running / finished softmax-weighted latents
``form`` "expanded" adds
  q_nope       (heads, RP, dn) f32, q_pe (heads, RP, dr) f32   scaled query parts
  m, l         (heads, RP, 1) f32; acc, out (heads, RP, dv) f32

``attend(g, q, kv_a, gate, kv_norm, inv_freq, pos, cache, rows_out, layer,
start_ref, origin_ref, first, bufs=, stopped=None, sync=False) -> [RP,
heads*dv] f32`` - q [RP, heads*(dn+dr)] (this core's heads), kv_a [RP, L]
(replicated), gate [RP, heads*dv] or None, kv_norm [1, R] f32, inv_freq [1,
dr/2] f32 (None for NoPE), pos [RP, 1] int32, cache HBM ref [layers, batch,
max_seq_len, L], READ-ONLY, rows_out the kernel's HBM output [layers, batch,
W, L] of each sequence's window of new rows (new_rows.py writes it into the
cache after the call; replicated: every core holds the same rows), layer the
stack's repetition (traced int32, from 0: windows are numbered from there),
start_ref SMEM [batch] (this step's positions), origin_ref SMEM [batch] (the
call's: they place the window), first the call's first step, stopped SMEM
[batch] int32 in a multi-step call (backends/pallas_tpu/kernels/step_loop.py: a sequence
with stopped[b] != 0 puts no new rows in its window); the w_uk / w_uv buffers
hold this layer's weights already (the emitter copies them from the ring).
Puts the new latent rows (c_kv normed, k_pe roped) at start[b]+t of the
window, then attends causally (cache tiles before the window, then the window
from VMEM); padding rows give 0.

``prefetch(g, cache, rows_out, layer, start_ref, origin_ref, first,
bufs=, sync=False, when=True)`` starts ``layer``'s first window load and
latent tile a layer ahead, for its ``attend`` to wait; ``drain(g, cache,
rows_out, layers, bufs=, sync=False)`` waits the last windows' stores
after the stack's loop; ``attend`` waits every other DMA (mla_cache.py: none
on the critical path). Under ``sync`` (the synchronised ablation) both do
nothing and ``attend`` starts and waits all its own DMAs.

``value_bytes(g)`` - the values ``attend`` holds at its peak, which Mosaic
keeps in VMEM beside the declared buffers (``MemoryPlan.values_bytes``). Each
latent tile is read in chunks of ``chunk_rows(g)`` keys, and masks are made
per chunk rather than hoisted, to bound them.

Two forms, the planner's choice (compiler/kind_mla.py): *absorbed* folds W_UK
into the query and W_UV into the output, so attention is one-KV-head MQA with
key width L and value width R over the latent tiles, all heads stacked along
the rows of one matmul; *expanded* expands this core's heads' K and V from
each chunk (cheaper when few heads live on a core and the context is short).
Math is f32 (HIGHEST) like the reference; the expanded form multiplies the
cached c_kv by the weights in their own dtype with f32 accumulation, which is
exactly the reference's expansion.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from megakernel.backends.pallas_tpu.kernels import mla_cache
from megakernel.backends.pallas_tpu.kernels import blocks as rt
from megakernel.backends.pallas_tpu.kernels.mla_cache import chunk_rows, drain, prefetch  # noqa: F401
from megakernel.backends.pallas_tpu.kernels.attention import NEG, _row_of
# The geometry is the planner's record (jax-free); generated kernels build it as
# mla_lib.MLAGeometry.
from megakernel.compiler.geometry.mla import (  # noqa: F401 - re-exported
    FORMS, MLAGeometry, buffers, value_bytes)

HI = jax.lax.Precision.HIGHEST


class Buffers(NamedTuple):
    """The refs of ``buffers(g)`` bound to one MLA node, by name: the common
    ones, then the absorbed form's ``q_lat`` or the expanded form's
    ``q_nope`` / ``q_pe``."""

    tiles: Any
    tile_sems: Any
    window: Any
    window_sems: Any
    w_uk: Any
    w_uv: Any
    m: Any
    l: Any  # noqa: E741 - the online softmax's denominator, as the papers name it
    acc: Any
    out: Any
    q_lat: Any = None
    q_nope: Any = None
    q_pe: Any = None


def _dot_t(a, b):
    """a @ b.T in f32 (HIGHEST)."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=HI,
                               preferred_element_type=jnp.float32)


def _dot(a, b):
    return jnp.dot(a, b, precision=HI, preferred_element_type=jnp.float32)


def _new_rows(g, q, kv_a, kv_norm, inv_freq, pos):
    """(q_nope per head [RP, dn], q_pe per head [RP, dr] roped, latent rows
    [RP, L]: c_kv normed | k_pe roped) of this step's tokens."""
    R, dn, dr = g.rank, g.nope_dim, g.rope_dim

    def roped(x):
        if not g.rope:
            return x
        return rt.rope(x, pos, inv_freq, heads=1, head_dim=dr, rotary_dim=dr,
                       factor=g.rope_factor)

    c = kv_a[:, :R]
    c = c * jax.lax.rsqrt(jnp.mean(c * c, axis=-1, keepdims=True) + g.eps) * kv_norm
    latent = jnp.concatenate([c, roped(kv_a[:, R:])], axis=-1)
    base = [h * (dn + dr) for h in range(g.heads)]
    q_nope = [q[:, b:b + dn] for b in base]
    q_pe = [roped(q[:, b + dn:b + dn + dr]) for b in base]
    return q_nope, q_pe, latent


def _online(m_ref, l_ref, acc_ref, s, mask, value):
    """One online-softmax step: scores s (masked), values ``value``."""
    s = jnp.where(mask, s, NEG)
    m_old = m_ref[...]
    m_new = jnp.maximum(m_old, jnp.max(s, axis=-1, keepdims=True))
    alpha = jnp.exp(m_old - m_new)
    # explicit zero: a row with no visible key in this tile adds nothing
    p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + _dot(p, value)
    m_ref[...] = m_new


def _fresh(m_ref, l_ref, acc_ref):
    """The ``begin`` of a sequence: an empty online softmax (max -inf, sums 0)."""
    def begin(b):
        m_ref[...] = jnp.full(m_ref.shape, NEG, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)
    return begin


def _absorbed(g, q_nope, q_pe, new, cache, bufs):
    R, RP, T, M = g.rank, g.rows_padded, g.tokens, g.rows
    dn, dv = g.nope_dim, g.v_dim
    q_lat, m, l, acc, out = bufs.q_lat, bufs.m, bufs.l, bufs.acc, bufs.out
    w_uk, w_uv = bufs.w_uk, bufs.w_uv
    for h in range(g.heads):       # q~_h = q_nope_h W_UK_h: this head's key in latent space
        absorbed = _dot(q_nope[h], w_uk[pl.ds(h * dn, dn), :].astype(jnp.float32))
        q_lat[pl.ds(h * RP, RP), :] = jnp.concatenate([absorbed, q_pe[h]], axis=-1) * g.scale
    out[...] = jnp.zeros(out.shape, jnp.float32)
    begin = _fresh(m, l, acc)

    def chunk(b, k0, lat, pos, end):
        keys, lat = lat.shape[0], lat.astype(jnp.float32)   # a tile's chunk, or the window
        n_tile = _row_of((M, keys), RP, g.heads)        # made here, not hoisted
        col = jax.lax.broadcasted_iota(jnp.int32, (M, keys), 1)
        mine = (n_tile >= b * T) & (n_tile < b * T + T)
        mask = mine & (k0 + col <= pos + n_tile - b * T) & (k0 + col < end)
        _online(m, l, acc, _dot_t(q_lat[...], lat), mask, lat[:, :R])

    def finish(b):
        n_out = _row_of((M, R), RP, g.heads)
        rows_b = (n_out >= b * T) & (n_out < b * T + T)
        safe = jnp.where(l[...] > 0, l[...], 1.0)    # other sequences' rows have l == 0
        out[...] = jnp.where(rows_b, acc[...] / safe, out[...])

    mla_cache.sequences(g, *cache, new, bufs, begin, chunk, finish)
    # o_h = c^_h W_UV_h: back from latent space to this head's values
    return [_dot(out[pl.ds(h * RP, RP), :], w_uv[:, pl.ds(h * dv, dv)].astype(jnp.float32))
            for h in range(g.heads)]


def _expanded(g, q_nope, q_pe, new, cache, bufs):
    R, RP, T = g.rank, g.rows_padded, g.tokens
    dn, dv = g.nope_dim, g.v_dim
    qn, qp, m, l, acc, out = bufs.q_nope, bufs.q_pe, bufs.m, bufs.l, bufs.acc, bufs.out
    w_uk, w_uv = bufs.w_uk, bufs.w_uv
    exact = HI if w_uk.dtype == jnp.float32 else None   # bf16 products are exact in f32
    for h in range(g.heads):
        qn[h] = q_nope[h] * g.scale
        qp[h] = q_pe[h] * g.scale
    out[...] = jnp.zeros(out.shape, jnp.float32)
    begin = _fresh(m, l, acc)

    def chunk(b, k0, lat, pos, end):
        keys = lat.shape[0]             # a tile's chunk, or the window
        c_kv = lat[:, :R].astype(w_uk.dtype)
        k_pe = lat[:, R:].astype(jnp.float32)
        for h in range(g.heads):       # this head's K and V, expanded from the chunk
            n_tile = jax.lax.broadcasted_iota(jnp.int32, (RP, keys), 0)  # made here
            col = jax.lax.broadcasted_iota(jnp.int32, (RP, keys), 1)
            mask = ((n_tile >= b * T) & (n_tile < b * T + T)
                    & (k0 + col <= pos + n_tile - b * T) & (k0 + col < end))
            k_nope = jnp.dot(c_kv, w_uk[:, pl.ds(h * dn, dn)], precision=exact,
                             preferred_element_type=jnp.float32)
            v = jnp.dot(c_kv, w_uv[:, pl.ds(h * dv, dv)], precision=exact,
                        preferred_element_type=jnp.float32)
            s = _dot_t(qn[h], k_nope) + _dot_t(qp[h], k_pe)
            _online(m.at[h], l.at[h], acc.at[h], s, mask, v)

    def finish(b):
        n_out = jax.lax.broadcasted_iota(jnp.int32, (RP, dv), 0)
        rows_b = (n_out >= b * T) & (n_out < b * T + T)
        for h in range(g.heads):
            lh = l[h]
            safe = jnp.where(lh > 0, lh, 1.0)
            out[h] = jnp.where(rows_b, acc[h] / safe, out[h])

    mla_cache.sequences(g, *cache, new, bufs, begin, chunk, finish)
    return [out[h] for h in range(g.heads)]


def attend(g: MLAGeometry, q, kv_a, gate, kv_norm, inv_freq, pos, cache, rows_out, layer,
           start_ref, origin_ref, first, *, bufs: Buffers, stopped=None, sync=False):
    q_nope, q_pe, new = _new_rows(g, q, kv_a, kv_norm, inv_freq, pos)
    form = _absorbed if g.form == "absorbed" else _expanded
    # mla_cache.sequences' order
    cache = (cache, rows_out, layer, start_ref, origin_ref, first, stopped, sync)
    heads = form(g, q_nope, q_pe, new, cache, bufs)
    o = jnp.concatenate(heads, axis=-1) if len(heads) > 1 else heads[0]
    if g.output_gate:
        o = o * jax.nn.sigmoid(gate)
    rows = jax.lax.broadcasted_iota(jnp.int32, o.shape, 0)
    return jnp.where(rows < g.batch * g.tokens, o, 0.0)
