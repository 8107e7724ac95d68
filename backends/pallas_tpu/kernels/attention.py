"""In-kernel KV-cache write + causal GQA decode attention (called by the megakernel).

Contract (the planner and the emitter use exactly these):

``AttentionGeometry(batch, tokens, rows_padded, q_heads, kv_heads, head_dim,
kv_tile, max_seq_len, scale, window, cache_dtype, softcap, sinks, steps)`` - static
geometry of one attention node on one core (heads LOCAL to the core), chosen
by the planner. Row ``n = b*tokens + t``; rows ``>= batch*tokens`` are padding.
``softcap``: scaled scores s -> softcap * tanh(s / softcap) before the mask;
``sinks``: ``attend`` takes each local head's sink logit, which joins every
softmax denominator (the online softmax starts from it: m = sink, l = 1);
``steps``: decode steps per call.

``buffers(g)`` - the VMEM buffers and semaphores ``attend`` needs, by name (the
planner records them in the plan; the kernel declares the plan's and bundles
the ones bound to a node as one ``Buffers``, passed as ``bufs``):
  k_tiles, v_tiles  (2, kv_tile, HD) cache dtype   K / V tile double buffers
  tile_sems         DMA (2, 2)                     [k|v, slot]
  window            (2, 2, W, HD) cache dtype      the sequences' windows of new rows,
                                                   [sequence parity, k|v]
  window_sems       DMA (2, 2)                     window load/store, [parity, k|v]
  q_scaled          (kv_heads, G*RP, D) f32        scaled q, group heads stacked in rows
  m, l              (kv_heads, G*RP, 1) f32        online-softmax running max, denominator
  acc, out          (kv_heads, G*RP, D) f32        running numerator, finished rows
with HD = kv_heads*head_dim, G = q_heads // kv_heads, RP = rows_padded and
W = window_rows(g): the aligned rows holding the call's tokens*steps new rows.

``prefetch(g, k_cache, v_cache, k_new, v_new, layer, start_ref, origin_ref,
first, bufs=, sync=False, when=True)`` - starts ``layer``'s first window
load and first cache tile, which depend only on the layer and the positions:
the megakernel calls it a layer ahead; ``attend`` of that layer waits them
(with ``sync``, the synchronised ablation, ``attend`` starts them itself).

``attend(g, q, k, v, k_cache, v_cache, k_new, v_new, layer, start_ref,
origin_ref, first, bufs=, sinks=None, stopped=None, sync=False) -> out`` -
q [RP, Hq*D] f32 (roped), k/v [RP, HD] f32 values; caches are READ-ONLY HBM
refs [L, batch, max_seq_len, HD]; k_new/v_new the kernel's HBM outputs [L,
batch, W, HD] (backends/pallas_tpu/kernels/appended_state.py writes them into the caches
after the call); layer the stack's repetition, traced int32 (0-based: the
windows are numbered from repetition 0); start_ref SMEM [batch] int32 (this
step's positions), origin_ref SMEM [batch] (the call's first positions: they
place the window, ``window_start``), first: the call's first step (bool or
traced); sinks [1, q_heads] f32 (with ``g.sinks``); stopped SMEM [batch]
int32 (a multi-step call: sequences with stopped[b] != 0 write no new rows).
Puts new k/v at positions start[b]+t of the window (loaded from the cache on
the first step, else from the output), stores it, then attends over positions
j <= start[b]+t (and j > start[b]+t-window): cache tiles for j < the window's
start, the window in VMEM for the rest. Returns [RP, Hq*D] f32 (padding rows
0). Requires start[b] + tokens <= max_seq_len (the reference clamps).

``drain(g, k_cache, v_cache, k_new, v_new, layers, bufs=, sync=False)`` -
after the stack's loop over ``layers`` repetitions: waits the last windows'
stores. Every other DMA ``attend`` waits before it returns.

The DMAs leave the critical path: the windows rotate through two slots
across sequences and layers (``new_rows.Windows``: b + 1's loads while b is
scored, stores run on until the slot is needed again), b + 1's first tile
starts when b's tiles are done, and the next layer's first window and tile
start as soon as this layer's attend returns. Under ``sync`` (the
synchronised ablation) each attend starts its own DMAs and waits them all.

Why this shape: a kernel that does remote DMAs gets its aliased operands
copied by XLA around every call, so the cache is only read here and the new
rows leave as a small output (new_rows.py). A DMA at an unaligned token row of
tiled HBM (8,128) f32 / (16,128) bf16 is rejected by Mosaic, so the new rows
travel in an aligned W-row window. Queries of all
sequences are kept as one [G*RP, D] block per kv head and rows of other
sequences are masked: extra LHS rows are ~free on the MXU at decode sizes and it
avoids any dynamic sublane slicing. Math is f32 (HIGHEST) like the reference.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.activations import softcap
from megakernel.backends.pallas_tpu.kernels import appended_state as new_rows
# The geometry is the planner's record (jax-free); generated kernels build it as
# attn_lib.AttentionGeometry.
from megakernel.compiler.geometry.attention import (  # noqa: F401 - re-exported
    AttentionGeometry, buffers, row_align, score_cols, value_bytes, window_rows)

NEG = -1e30          # finite "minus infinity": keeps exp() and max() NaN-free
HI = jax.lax.Precision.HIGHEST


class Buffers(NamedTuple):
    """The refs of ``buffers(g)`` bound to one attention node, by name."""

    k_tiles: Any
    v_tiles: Any
    tile_sems: Any
    window: Any
    window_sems: Any
    q_scaled: Any
    m: Any
    l: Any  # noqa: E741 - the online softmax's denominator, as the papers name it
    acc: Any
    out: Any


def window_start(g: AttentionGeometry, origin):
    """First cache row of the window of a sequence whose call starts at ``origin``."""
    wr, a = window_rows(g), row_align(g.cache_dtype)
    w0 = new_rows.window_start(origin, wr, a, g.max_seq_len)
    return w0 if wr >= g.max_seq_len else pl.multiple_of(w0, a)


def _row_of(shape, rows_padded, group):
    """Token row n of each element of a [group*rows_padded, X] block (stacked
    heads): concatenated iotas, since vector integer % is best avoided."""
    one = jax.lax.broadcasted_iota(jnp.int32, (rows_padded, shape[1]), 0)
    return jnp.concatenate([one] * group, axis=0) if group > 1 else one


def _windows(g, caches, news, layer, origin_ref, first, window, window_sems, sync=False):
    """The sequences' windows of this call's rows (new_rows.Windows), numbered
    across the stack's layers (from 0 in each layer under ``sync``)."""
    return new_rows.Windows(caches, news, layer, lambda b: window_start(g, origin_ref[b]),
                            first, window, window_sems, n0=0 if sync else layer * g.batch)


def _tiles_before(g: AttentionGeometry, start_ref, origin_ref, b):
    """(lo, hi, below): sequence b's cache tiles [lo, hi) hold its keys before
    the window (those below ``below``); with a sliding window the earliest
    visible key is pos - window + 1 (query t = 0)."""
    pos, St = start_ref[b], g.kv_tile
    below = jnp.minimum(pos + g.tokens, window_start(g, origin_ref[b]))
    hi = (below + St - 1) // St
    lo = 0 if g.window is None else jnp.maximum(pos - g.window + 1, 0) // St
    return lo, hi, below


def _tile_copies(g, k_cache, v_cache, layer, b, i, k_tiles, v_tiles, tile_sems):
    s0 = pl.multiple_of(i * g.kv_tile, g.kv_tile)
    slot = i % 2
    return (pltpu.make_async_copy(k_cache.at[layer, b, pl.ds(s0, g.kv_tile), :],
                                  k_tiles.at[slot], tile_sems.at[0, slot]),
            pltpu.make_async_copy(v_cache.at[layer, b, pl.ds(s0, g.kv_tile), :],
                                  v_tiles.at[slot], tile_sems.at[1, slot]))


def _start_first_tile(g, k_cache, v_cache, layer, start_ref, origin_ref, b, k_tiles, v_tiles,
                      tile_sems):
    lo, hi, _ = _tiles_before(g, start_ref, origin_ref, b)

    @pl.when(lo < hi)
    def _():
        for c in _tile_copies(g, k_cache, v_cache, layer, b, lo, k_tiles, v_tiles, tile_sems):
            c.start()


def prefetch(g: AttentionGeometry, k_cache, v_cache, k_new, v_new, layer, start_ref, origin_ref,
             first, *, bufs: Buffers, sync=False, when=True):
    """Begin ``layer``'s first window load and first cache tile (if ``when``).
    Both depend only on the layer and the positions, so the megakernel starts
    them a layer ahead (after the previous repetition's attend; before the
    loop for repetition 0) and they stream under the MLP and projections;
    ``attend`` waits them. ``sync`` (the synchronised ablation): nothing here,
    ``attend`` starts its own (starting them here too would leave a second
    DMA on each semaphore that nothing waits)."""
    if not sync:
        new_rows.when(when, lambda: _start_first(
            g, (k_cache, v_cache), (k_new, v_new), layer, start_ref, origin_ref, first,
            (bufs.k_tiles, bufs.v_tiles, bufs.tile_sems), bufs.window, bufs.window_sems))


def _start_first(g, caches, news, layer, start_ref, origin_ref, first, tiles, window,
                 window_sems, sync=False):
    """Start sequence 0's window load and first cache tile of ``layer``."""
    _windows(g, caches, news, layer, origin_ref, first, window, window_sems, sync).start_load(0)
    _start_first_tile(g, *caches, layer, start_ref, origin_ref, 0, *tiles)


def drain(g: AttentionGeometry, k_cache, v_cache, k_new, v_new, layers: int, *,
          bufs: Buffers, sync=False):
    """After the stack's loop of ``layers`` repetitions: wait the last
    windows' stores (the megakernel emits it; under ``sync`` each attend waits
    its own)."""
    if not sync:
        _windows(g, (k_cache, v_cache), (k_new, v_new), 0, None, True, bufs.window,
                 bufs.window_sems).drain(layers * g.batch)


def _sink_rows(g: AttentionGeometry, sinks, h: int):
    """[G*RP, 1] f32: kv head h's stacked rows, each holding its query head's sink."""
    RP = g.rows_padded
    parts = [jnp.broadcast_to(sinks[:, h * g.group + j:h * g.group + j + 1], (RP, 1))
             for j in range(g.group)]
    return jnp.concatenate(parts, axis=0) if g.group > 1 else parts[0]


def attend(g: AttentionGeometry, q, k, v, k_cache, v_cache, k_new, v_new, layer, start_ref,
           origin_ref, first, *, bufs: Buffers, sinks=None, stopped=None, sync=False):
    kbuf, vbuf, tsem = bufs.k_tiles, bufs.v_tiles, bufs.tile_sems
    win, wsem = bufs.window, bufs.window_sems
    q_s, m_s, l_s, acc_s, o_s = bufs.q_scaled, bufs.m, bufs.l, bufs.acc, bufs.out
    if sync:      # the synchronised ablation: no DMA started ahead of this op
        _start_first(g, (k_cache, v_cache), (k_new, v_new), layer, start_ref, origin_ref, first,
                     (kbuf, vbuf, tsem), win, wsem, sync=True)
    D, G, RP, St, T = g.head_dim, g.group, g.rows_padded, g.kv_tile, g.tokens
    GR, W = G * RP, window_rows(g)
    # Scaled queries, the G heads of kv head h stacked along rows (aligned: RP % 8 == 0).
    for h in range(g.kv_heads):
        parts = [q[:, (h * G + j) * D:(h * G + j + 1) * D] for j in range(G)]
        q_s[h] = (jnp.concatenate(parts, axis=0) if G > 1 else parts[0]) * g.scale
    o_s[...] = jnp.zeros(o_s.shape, jnp.float32)
    n_out = _row_of((GR, D), RP, G)

    wins = _windows(g, (k_cache, v_cache), (k_new, v_new), layer, origin_ref, first, win, wsem,
                    sync)

    def tile_copies(b, i):
        return _tile_copies(g, k_cache, v_cache, layer, b, i, kbuf, vbuf, tsem)

    def score(b, pos, k0, keys, kv, below):
        """Online softmax over ``keys`` keys from position k0: kv(h, j0, sub)
        -> (K, V) [sub, D] of kv head h; keys at or past ``below`` are not
        read (their rows may hold anything)."""
        # Scored in column blocks of `sub` keys, each made and used in turn,
        # with its masks built here rather than hoisted out of the loops:
        # Mosaic holds every live value in VMEM beside the declared buffers,
        # so this bounds them (``value_bytes``). The blocks are a loop, not
        # unrolled: unrolled, Mosaic kept more of them live the wider the
        # tile (libtpu 0.0.51, mistral-7b-v0.1/8 with kv tiles of 512 to
        # 4096 keys: 0.53 to 0.86 MiB of values; gpt-oss-20b/8 +0.29 MiB from
        # 1024 to 2048).
        sub = score_cols(g) if keys == St else keys
        blocks = keys // sub

        def block(jb, carry):
            j0 = jb * sub if blocks == 1 else pl.multiple_of(jb * sub, sub)
            n_tile = _row_of((GR, sub), RP, G)
            mine = (n_tile >= b * T) & (n_tile < b * T + T)      # rows of sequence b
            q_pos = pos + n_tile - b * T
            k_pos = k0 + j0 + jax.lax.broadcasted_iota(jnp.int32, (GR, sub), 1)
            mask = mine & (k_pos <= q_pos) & (k_pos < below)
            if g.window is not None:
                mask = mask & (k_pos > q_pos - g.window)
            v_ok = (k0 + j0 + jax.lax.broadcasted_iota(jnp.int32, (sub, 1), 0)) < below
            for h in range(g.kv_heads):
                kh, vh = kv(h, j0, sub)
                vh = jnp.where(v_ok, vh.astype(jnp.float32), 0.0)
                s = jax.lax.dot_general(q_s[h], kh.astype(jnp.float32), (((1,), (1,)), ((), ())),
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
            return carry

        if blocks == 1:
            block(0, 0)
        else:
            jax.lax.fori_loop(0, blocks, block, 0)

    def seq_body(b, carry):
        # In flight already: b's window load and first tile (``prefetch`` for
        # the first sequence, the previous sequence's body for the others).
        pos = start_ref[b]
        live = True if stopped is None else stopped[b] == 0   # a stopped sequence writes nothing
        wins.wait_load(b)
        for j, new in enumerate((k, v)):
            new_rows.when(live, lambda j=j, new=new: new_rows.put_rows(
                new, wins.view(b, j), pos - window_start(g, origin_ref[b]), b * T, T))
        wins.start_store(b)          # runs on while b's keys are scored, and later

        @pl.when(b + 1 < g.batch)    # the next sequence's window, into the other slot
        def _():
            wins.start_load(b + 1)
        lo, hi, below = _tiles_before(g, start_ref, origin_ref, b)
        w0, n_valid = window_start(g, origin_ref[b]), pos + T

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
                for c in tile_copies(b, i + 1):
                    c.start()

            for c in tile_copies(b, i):
                c.wait()
            score(b, pos, i * St, St, lambda h, j0, sub: (
                kbuf[slot, pl.ds(j0, sub), pl.ds(h * D, D)],
                vbuf[slot, pl.ds(j0, sub), pl.ds(h * D, D)]), below)
            return c2

        jax.lax.fori_loop(lo, hi, tile_body, 0)

        @pl.when(b + 1 < g.batch)   # both tile slots are free: the next sequence's first
        def _():
            _start_first_tile(g, k_cache, v_cache, layer, start_ref, origin_ref, b + 1, kbuf,
                              vbuf, tsem)

        wk, wv = wins.view(b, 0), wins.view(b, 1)
        score(b, pos, w0, W, lambda h, j0, sub: (
            wk[pl.ds(j0, sub), pl.ds(h * D, D)], wv[pl.ds(j0, sub), pl.ds(h * D, D)]), n_valid)
        rows_b = (n_out >= b * T) & (n_out < b * T + T)
        for h in range(g.kv_heads):
            l = l_s[h]
            safe = jnp.where(l > 0, l, 1.0)     # other sequences' rows have l == 0
            o_s[h] = jnp.where(rows_b, acc_s[h] / safe, o_s[h])
        return carry

    jax.lax.fori_loop(0, g.batch, seq_body, 0)
    if sync:
        wins.drain(g.batch)
    outs = [o_s[h][j * RP:(j + 1) * RP] for h in range(g.kv_heads) for j in range(G)]
    return jnp.concatenate(outs, axis=1) if len(outs) > 1 else outs[0]
