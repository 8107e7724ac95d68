"""In-kernel Gated DeltaNet: the state read ahead (read only), the call's
updates returned small (called by the megakernel).

Contract (the planner and the emitter use exactly these):

``GDNGeometry(batch, tokens, rows_padded, key_heads, value_heads, key_dim,
value_dim, conv_kernel, norm_eps, conv_dtype, layers, key_replication, steps)``
(compiler/geometry/gdn.py, re-exported here with ``buffers`` and the sizes)
- one GDN node on one core (heads LOCAL to the core; local value head j reads
local key head j // (value_heads // key_heads)); ``layers``: repetitions of
its stack; ``steps``: decode steps per call.

``buffers(g)`` - what the functions below need, by name (the kernel passes the
ones the plan bound to a node as one ``Buffers``, ``bufs``):
  hist_q, hist_k  (2, B, Kc-1, key_heads*key_dim) conv dtype    [repetition parity]
  hist_v          (2, B, Kc-1, value_heads*value_dim) conv dtype
  recurrent       (2, B, value_heads, key_dim, value_dim) f32
  rows_q, rows_k, rows_v (2, B, C, width) conv dtype  history | the call's raw rows
  updates         (2, B, value_heads, W, key_dim + 2 value_dim) f32  the call's k | u | G
  sems            DMA (3, 2, 4)  [state read | window read | window write, parity, part]
W = ``g.window`` (tokens x steps, rounded up to 8 rows), C = ``g.conv_rows``
(Kc - 1 + tokens x steps, rounded up to 8).

``fetch(g, hbm, out, k, i, ...)`` starts the reads of repetition k (the
stack's first, before its loop); ``step(g, xs, z, b, a, taps, a_log, dt_bias,
norm, hbm, out, k, i, ...) -> y`` runs the op for repetition k at step i of
the call (traced); ``drain(g, out, ...)`` waits the last window stores (after
the loop). ``hbm`` = (hist_q, hist_k, hist_v, recurrent) HBM refs [layers,
...], READ ONLY: they hold the state before the call (S_0) on every step.
``out`` = (rows_q, rows_k, rows_v, updates) HBM outputs [layers, B, ...]:
  rows_*   [C, width]: rows 0..Kc-2 the history before the call, row Kc-1 +
           i*T + t the raw (pre-conv) q / k / v row of step i's token t,
           rounded to the conv dtype;
  updates  [value_heads, W, key_dim + 2 value_dim]: per value head, row i*T +
           t: the normalised key k_t, the delta-rule update u_t = beta_t (v_t
           - S_{t-1}^T k_t) after the decay, and G_t, the call's log-decays
           summed up to t, repeated over value_dim lanes.
Laid out so that the commit is elementwise in the state and reads nothing
else of it (XLA copies a donated state that its update reads elsewhere, and
relaid out a log-decay sliced out of one lane): the new history is Kc - 1 rows
from n*T on, and G lines up with u and with S's columns.
After the call the same jit commits them into the donated state
(``commit.py``): the conv histories take the new rows, the recurrent state
S_n = exp(G_n) S_0 + sum_t exp(G_n - G_t) k_t u_t^T, for the rows of the
steps each sequence ran (a stopped sequence's later rows are computed on
finite values, stored, and not committed).

Several steps per call: HBM keeps S_0, so step i rebuilds the state after step
i - 1 in VMEM from S_0 and the call's earlier rows, which it reads back from
its own outputs with the state: the conv history is rows i*T..i*T+Kc-2 of the
rows window, and S = exp(G) S_0 + K^T U~ (G the summed log-decays, U~ the
updates scaled by exp(the decay after them)): a matmul of rank i*T <= W. Keeping the rows in VMEM across steps instead would hold
every layer's window at once (qwen3.5-27b at 16 steps, batch 4: 12 MiB per
core); read back, a layer's window costs one small DMA beside its state and
shares its slot. A one-step call reads no window and rebuilds nothing.

Pipelining: repetition k's state and windows sit in slot k % 2. ``step``
waits its reads, computes, starts its window stores, then (if k + 1 < layers)
waits the stores of k - 1 - the last user of slot (k + 1) % 2 - and starts the
reads of k + 1, so the next repetition's state is in flight during the rest
of this body. With ``sync`` (the synchronised ablation) each step reads and
stores its own and waits for both.

Why this shape: T new rows per sequence go through the short conv and the
delta rule one after another (T <= 8), so rows are picked out of the [RP, C]
blocks with masked sums (no dynamic or unaligned sublane slicing), the rule
keeps S [dk, dv] in vregs and uses q and k as [dk, 1] columns, which come from
one transpose of the normalised q/k blocks per layer; everything is f32 on the
VPU (the matvecs are M=1: the MXU would only add pushes) but a later step's
rebuild, a [dk, W] x [W, dv] matmul per value head and sequence.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.compiler.geometry.gdn import (  # noqa: F401 - the library's contract
    STATES, GDNGeometry, buffers, conv_rows, update_width, value_bytes, vector_ops, window)
from megakernel.backends.pallas_tpu.kernels.appended_state import when

L2_EPS = 1e-6      # ir/kind_gdn.py L2_EPS (the library imports nothing from the IR)
WINDOWS = ("rows_q", "rows_k", "rows_v", "updates")
HI = jax.lax.Precision.HIGHEST


class Buffers(NamedTuple):
    """The refs of ``buffers(g)`` bound to one GDN node, by name."""

    hist_q: Any
    hist_k: Any
    hist_v: Any
    recurrent: Any
    rows_q: Any
    rows_k: Any
    rows_v: Any
    updates: Any
    sems: Any

    @property
    def states(self) -> tuple:
        """The slots of the state before the call, in ``STATES`` order."""
        return self.hist_q, self.hist_k, self.hist_v, self.recurrent

    @property
    def windows(self) -> tuple:
        """The slots of the call's update windows (``WINDOWS``)."""
        return self.rows_q, self.rows_k, self.rows_v, self.updates


def _state_reads(hbm, states, sems, k):
    """The reads of repetition k's state slices (before the call) into slot k % 2."""
    p = k % 2
    return [pltpu.make_async_copy(h.at[k], b.at[p], sems.at[0, p, j])
            for j, (h, b) in enumerate(zip(hbm, states))]


def _window_reads(out, wins, sems, k):
    """The reads of repetition k's update windows (the call's earlier rows)."""
    p = k % 2
    return [pltpu.make_async_copy(o.at[k], w.at[p], sems.at[1, p, j])
            for j, (o, w) in enumerate(zip(out, wins))]


def _stores(out, wins, sems, k):
    p = k % 2
    return [pltpu.make_async_copy(w.at[p], o.at[k], sems.at[2, p, j])
            for j, (o, w) in enumerate(zip(out, wins))]


def _each(copies, what):
    for c in copies:
        getattr(c, what)()


def _reads(hbm, out, states, wins, sems, k, i, what):
    """Start or wait (``what``) repetition k's reads at step i: its state, and
    on a later step of the call (statically never on a one-step call's) its
    update windows."""
    _each(_state_reads(hbm, states, sems, k), what)
    when(i > 0, lambda: _each(_window_reads(out, wins, sems, k), what))


def fetch(g, hbm, out, k, i, *, bufs: Buffers, sync):
    if not sync:
        _reads(hbm, out, bufs.states, bufs.windows, bufs.sems, k, i, "start")


def drain(g, out, *, bufs: Buffers, sync):
    """Wait the window stores ``step`` left in flight: those of the last two repetitions."""
    if sync:
        return
    for k in range(max(g.layers - 2, 0), g.layers):
        _each(_stores(out, bufs.windows, bufs.sems, k), "wait")


def _pick_row(x, rows, r):
    """Row r (traced) of x [RP, C] as [1, C]: a masked sum, exact (0 if no row is r)."""
    return jnp.sum(jnp.where(rows == r, x, 0.0), axis=0, keepdims=True)


def _conv(g, xs, taps, hists, wins, p, b, n, outs):
    """The causal conv + SiLU of sequence b's T rows, for q, k and v, after the
    call's first n rows; puts the rows into rows-window rows Kc-1+n.. (slot p;
    on the call's first step the history before the call into rows 0..Kc-2);
    returns the outputs with those rows filled in."""
    kc1, new = g.conv_kernel - 1, []
    for x, w, href, wref, out in zip(xs, taps, hists, wins, outs):
        rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
        win = wref[p, b].astype(jnp.float32)           # [C, width]: rows < Kc-1+n valid
        wrows = jax.lax.broadcasted_iota(jnp.int32, win.shape, 0)
        # On the call's first step the window starts as the history before the
        # call (a later step's came back from the output with it).
        hist = href[p, b].astype(jnp.float32)          # [Kc-1, width]
        hrows = jax.lax.broadcasted_iota(jnp.int32, hist.shape, 0)
        for m in range(kc1):
            first = (wrows == m) if isinstance(n, int) else (wrows == m) & (n == 0)
            win = jnp.where(first, _pick_row(hist, hrows, m), win)
        # the history now (rows n..n+Kc-2), then the step's rows, rounded to
        # the history's dtype before use, as the reference does
        seq = [_pick_row(win, wrows, n + m) for m in range(kc1)]
        seq += [_pick_row(x, rows, b * g.tokens + t).astype(wref.dtype).astype(jnp.float32)
                for t in range(g.tokens)]
        for t in range(g.tokens):
            acc = sum(w[j] * seq[t + j] for j in range(g.conv_kernel))
            out = jnp.where(rows == b * g.tokens + t, acc * jax.nn.sigmoid(acc), out)
            win = jnp.where(wrows == kc1 + n + t, seq[kc1 + t], win)
        wref[p, b] = win.astype(wref.dtype)
        new.append(out)
    return tuple(new)


def _l2norm_heads(x, heads, dim, scale):
    parts = []
    for h in range(heads):
        v = x[:, h * dim:(h + 1) * dim]
        parts.append(v * jax.lax.rsqrt(jnp.sum(v * v, axis=-1, keepdims=True) + L2_EPS) * scale)
    return parts[0] if heads == 1 else jnp.concatenate(parts, axis=-1)


def _softplus(x):
    return jnp.maximum(x, 0.0) + jnp.log(1.0 + jnp.exp(-jnp.abs(x)))


def _scalar(x, mask):
    """The one element of x where mask holds, as [1, 1]."""
    picked = jnp.where(mask, x, 0.0)
    return jnp.sum(jnp.sum(picked, axis=0, keepdims=True), axis=1, keepdims=True)


def _rebuild(g, win, n, s0):
    """(the state of one value head after the call's first n rows, G after
    them [1, dv]): from S_0 ``s0`` [dk, dv] and the head's update window
    ``win`` [W, dk + 2 dv], exp(G) S_0 + K^T (U * exp(G - G_r)), rows >= n
    counting as 0."""
    dk, dv = g.key_dim, g.value_dim
    rows = jax.lax.broadcasted_iota(jnp.int32, (g.window, dv), 0)
    valid = rows < n
    summed = win[:, dk + dv:]                                          # G_r, [W, dv]
    total = _pick_row(summed, rows, n - 1)                             # G after n rows
    keys = jnp.where(valid[:, :1], win[:, :dk], 0.0)
    us = jnp.where(valid, win[:, dk:dk + dv] * jnp.exp(total - summed), 0.0)
    return jnp.exp(total) * s0 + jnp.dot(jnp.transpose(keys), us, precision=HI,
                                         preferred_element_type=jnp.float32), total


def _recurrence(g, qt, kt, kn, v, beta, logd, state, upd, p, b, n, outs):
    """The delta rule over sequence b's T rows for every local value head,
    from S_0 (slot p of ``state``) and the call's first n update rows; puts
    the rows' updates into window rows n..n+T-1 of each head; returns the
    per-head outputs with b's rows."""
    dk, dv, rp = g.key_dim, g.value_dim, g.rows_padded
    lanes = jax.lax.broadcasted_iota(jnp.int32, (dk, rp), 1)          # row index of q/k columns
    rows_v = jax.lax.broadcasted_iota(jnp.int32, (rp, dv), 0)
    rows_h = jax.lax.broadcasted_iota(jnp.int32, beta.shape, 0)
    heads_h = jax.lax.broadcasted_iota(jnp.int32, beta.shape, 1)
    rows_k = jax.lax.broadcasted_iota(jnp.int32, kn.shape, 0)
    wrows = jax.lax.broadcasted_iota(jnp.int32, (g.window, g.update_width), 0)
    decay = jnp.exp(logd)
    new = []
    for h in range(g.value_heads):
        kh = h // g.group
        if h % g.group == 0:        # the key head's q and k columns, shared by its group
            cols = [[jnp.sum(jnp.where(lanes == b * g.tokens + t, m[kh * dk:(kh + 1) * dk], 0.0),
                             axis=1, keepdims=True) for m in (kt, qt)]      # [dk, 1] each
                    for t in range(g.tokens)]
            keys = [_pick_row(kn[:, kh * dk:(kh + 1) * dk], rows_k[:, :dk], b * g.tokens + t)
                    for t in range(g.tokens)]                           # [1, dk] each
        win = upd[p, b, h]                                              # [W, dk + 2 dv]
        s = state[p, b, h]                                              # [dk, dv], S_0
        summed = jnp.zeros((1, dv), jnp.float32)                        # G so far
        if not (isinstance(n, int) and n == 0):     # the state after the call's first n rows
            s, summed = _rebuild(g, win, n, s)
        out = outs[h]
        for t in range(g.tokens):
            r = b * g.tokens + t
            kc, qc = cols[t]
            vr = _pick_row(v[:, h * dv:(h + 1) * dv], rows_v, r)        # [1, dv]
            mask = (rows_h == r) & (heads_h == h)
            s = s * _scalar(decay, mask)
            u = jnp.sum(kc * s, axis=0, keepdims=True)                  # S^T k
            delta = _scalar(beta, mask) * (vr - u)
            s = s + kc * delta
            out = jnp.where(rows_v == r, jnp.sum(qc * s, axis=0, keepdims=True), out)
            summed = summed + _scalar(logd, mask)
            row = jnp.concatenate([keys[t], delta, summed], axis=1)
            win = jnp.where(wrows == n + t, row, win)
        upd[p, b, h] = win
        new.append(out)
    return tuple(new)


def step(g, xs, z, b_in, a_in, taps, a_log, dt_bias, norm, hbm, out, k, i, *, bufs: Buffers,
         sync):
    """One GDN node for repetition k at step i of the call: xs = (q, k, v) raw
    projections [RP, width] f32, z [RP, HV*dv], b/a [RP, >= HV] (zero-padded
    to 128 lanes: the first HV are the heads'); taps = three [1, Kc, C]
    vectors; a_log, dt_bias [1, HV] f32; norm [1, dv]. Returns y [RP, HV*dv]
    f32 (0 in padding rows)."""
    states, wins, sems = bufs.states, bufs.windows, bufs.sems
    recurrent, updates = bufs.recurrent, bufs.updates
    p = k % 2
    if sync:
        _reads(hbm, out, states, wins, sems, k, i, "start")
    _reads(hbm, out, states, wins, sems, k, i, "wait")
    n = i * g.tokens            # the call's rows of each sequence before this step
    taps = [[_pick_row(w[0], jax.lax.broadcasted_iota(jnp.int32, w[0].shape, 0), j)
             for j in range(g.conv_kernel)] for w in taps]
    zero = tuple(jnp.zeros(x.shape, jnp.float32) for x in xs)
    cq, ck, cv = jax.lax.fori_loop(
        0, g.batch, lambda b, outs: _conv(g, xs, taps, states[:3], wins[:3], p, b, n, outs),
        zero)
    kn = _l2norm_heads(ck, g.key_heads, g.key_dim, 1.0)
    qt = jnp.transpose(_l2norm_heads(cq, g.key_heads, g.key_dim, g.key_dim ** -0.5))
    kt = jnp.transpose(kn)
    beta = jax.nn.sigmoid(b_in[:, :g.value_heads])
    logd = -jnp.exp(a_log) * _softplus(a_in[:, :g.value_heads] + dt_bias)
    heads = tuple(jnp.zeros((g.rows_padded, g.value_dim), jnp.float32)
                  for _ in range(g.value_heads))
    outs = jax.lax.fori_loop(0, g.batch, lambda b, o: _recurrence(
        g, qt, kt, kn, cv, beta, logd, recurrent, updates, p, b, n, o), heads)
    stores = _stores(out, wins, sems, k)
    _each(stores, "start")
    if sync:
        _each(stores, "wait")
    else:
        @pl.when(k + 1 < g.layers)
        def _():
            @pl.when(k >= 1)
            def _():
                _each(_stores(out, wins, sems, k - 1), "wait")
            _reads(hbm, out, states, wins, sems, k + 1, i, "start")
    ys = []
    for h, o in enumerate(outs):
        zh = z[:, h * g.value_dim:(h + 1) * g.value_dim]
        o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + g.norm_eps)
        ys.append(o * norm * (zh * jax.nn.sigmoid(zh)))
    return ys[0] if len(ys) == 1 else jnp.concatenate(ys, axis=-1)
