"""In-kernel Gated DeltaNet: conv history and recurrent state fetched ahead, updated
in VMEM, written back behind (called by the megakernel).

Contract (the planner and the emitter use exactly these):

``GDNGeometry(batch, tokens, rows_padded, key_heads, value_heads, key_dim,
value_dim, conv_kernel, norm_eps, conv_dtype, layers, key_replication)`` - one
GDN node on one core (heads LOCAL to the core; local value head j reads local
key head j // (value_heads // key_heads)); ``layers``: repetitions of its stack.

``buffers(g)`` - what the functions below need, by argument name:
  hist_q, hist_k  (2, B, Kc-1, key_heads*key_dim) conv dtype   [repetition parity]
  hist_v          (2, B, Kc-1, value_heads*value_dim) conv dtype
  recurrent       (2, B, value_heads, key_dim, value_dim) f32
  sems            DMA (2, 2, 4)   [read|write, parity, hist_q|hist_k|hist_v|recurrent]

``fetch(g, hbm, k, ...)`` starts the reads of repetition k (the stack's first,
before its loop); ``step(g, xs, z, b, a, taps, a_log, dt_bias, norm, hbm, k,
..., stopped=None) -> y`` runs the op for repetition k (traced); ``drain(g,
hbm, ...)`` waits the last writes (after the loop). ``hbm`` = (hist_q, hist_k,
hist_v, recurrent) HBM refs [layers, ...] (aliased, updated in place).
``stopped`` (a multi-step call, backends/pallas_tpu/steps.py): SMEM [batch]
int32; a sequence with stopped[b] != 0 keeps its history and state as fetched
(its slot is not stored, so the write-back returns the old bytes), and its
rows' outputs are computed and ignored.

Pipelining: repetition k's state sits in slot k % 2. ``step`` waits its reads,
computes, starts its writes, then (if k + 1 < layers) waits the writes of
k - 1 - the last user of slot (k + 1) % 2 - and starts the reads of k + 1, so
the next repetition's state is in flight during the rest of this body. With
``sync`` (the synchronised ablation) each step reads and writes its own state
and waits for both.

Why this shape: T new rows per sequence go through the short conv and the
delta rule one after another (T <= 8), so rows are picked out of the [RP, C]
blocks with masked sums (no dynamic or unaligned sublane slicing), the rule
keeps S [dk, dv] in vregs and uses q and k as [dk, 1] columns, which come from
one transpose of the normalised q/k blocks per layer; everything is f32 on the
VPU (the matvecs are M=1: the MXU would only add pushes).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.compiler.buffers import Need, Space
from megakernel.compiler.plan_json import GEOMETRIES
from megakernel.errors import PlanningError

L2_EPS = 1e-6      # ir/kind_gdn.py L2_EPS (the library imports nothing from the IR)
STATES = ("hist_q", "hist_k", "hist_v", "recurrent")


@GEOMETRIES.register("gdn")
@dataclass(frozen=True)
class GDNGeometry:
    batch: int
    tokens: int
    rows_padded: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    norm_eps: float
    conv_dtype: str
    layers: int
    key_replication: int = 1

    def __post_init__(self):
        if not (self.rows_padded >= self.batch * self.tokens and self.rows_padded % 8 == 0):
            raise PlanningError(f"rows_padded={self.rows_padded} must be a multiple of 8 "
                                f"holding batch*tokens={self.batch * self.tokens} rows",
                                path="gdn.geometry")
        if self.value_heads % self.key_heads:
            raise PlanningError(f"value_heads={self.value_heads} is not a multiple of "
                                f"key_heads={self.key_heads} on one core", path="gdn.geometry")

    @property
    def group(self) -> int:
        return self.value_heads // self.key_heads

    @property
    def widths(self) -> tuple[int, int, int]:
        kw = self.key_heads * self.key_dim
        return kw, kw, self.value_heads * self.value_dim

    def describe(self) -> str:
        rep = f", each key head on {self.key_replication} cores" if self.key_replication > 1 else ""
        return (f"{self.value_heads} value head(s) and {self.key_heads} key head(s) per core"
                f"{rep}; state fetched ahead into a [2]-slot double buffer")


def buffers(g: GDNGeometry) -> tuple[Need, ...]:
    hist, (kw, _, vw) = g.conv_kernel - 1, g.widths
    vmem, note = Space.VMEM, "[repetition parity] raw {} rows of the last {} tokens"
    return (
        Need("hist_q", vmem, (2, g.batch, hist, kw), g.conv_dtype, note.format("q", hist)),
        Need("hist_k", vmem, (2, g.batch, hist, kw), g.conv_dtype, note.format("k", hist)),
        Need("hist_v", vmem, (2, g.batch, hist, vw), g.conv_dtype, note.format("v", hist)),
        Need("recurrent", vmem, (2, g.batch, g.value_heads, g.key_dim, g.value_dim), "float32",
             "[repetition parity] recurrent state S per value head"),
        Need("sems", Space.SEMAPHORE, (2, 2, len(STATES)), "dma_semaphore",
             "[read|write, parity, state]"),
    )


def value_bytes(g: GDNGeometry) -> int:
    """Bytes of values ``step`` holds at its peak beside its inputs: the conv
    outputs and the output ([RP, width] f32 each), the transposed q/k
    ([width, RP], a lane tile wide), the per-head outputs, the gates, and S
    with two temporaries of its size. Mosaic keeps them in VMEM."""
    kw, _, vw = g.widths
    rp = g.rows_padded
    return 4 * (rp * (2 * kw + 2 * vw + g.value_heads * g.value_dim + 2 * 128)
                + 2 * kw * 128 + 3 * g.key_dim * g.value_dim)


def vector_ops(g: GDNGeometry) -> int:
    """Elementwise f32 operations of one step (for the cost model): per row and
    value head ~8 passes over S (decay, two products and sums for u and o, the
    update), plus the conv's Kc multiply-adds per channel per row."""
    rows = g.batch * g.tokens
    return rows * (8 * g.value_heads * g.key_dim * g.value_dim
                   + 2 * g.conv_kernel * sum(g.widths))


def _copies(hbm, bufs, sems, k, direction):
    """The DMAs of repetition k: HBM slab k -> slot k % 2 (0) or back (1)."""
    p = k % 2
    out = []
    for i, (h, b) in enumerate(zip(hbm, bufs)):
        src, dst = (h.at[k], b.at[p]) if direction == 0 else (b.at[p], h.at[k])
        out.append(pltpu.make_async_copy(src, dst, sems.at[direction, p, i]))
    return out


def _each(copies, what):
    for c in copies:
        getattr(c, what)()


def fetch(g, hbm, k, *, sync, hist_q, hist_k, hist_v, recurrent, sems):
    if not sync:
        _each(_copies(hbm, (hist_q, hist_k, hist_v, recurrent), sems, k, 0), "start")


def drain(g, hbm, *, sync, hist_q, hist_k, hist_v, recurrent, sems):
    """Wait the writes ``step`` left in flight: those of the last two repetitions."""
    if sync:
        return
    bufs = (hist_q, hist_k, hist_v, recurrent)
    for k in range(max(g.layers - 2, 0), g.layers):
        _each(_copies(hbm, bufs, sems, k, 1), "wait")


def _pick_row(x, rows, r):
    """Row r (traced) of x [RP, C] as [1, C]: a masked sum, exact."""
    return jnp.sum(jnp.where(rows == r, x, 0.0), axis=0, keepdims=True)


def _store(ref, index, value, stopped, b):
    """ref[index] = value, unless sequence b has stopped (a multi-step call)."""
    if stopped is None:
        ref[index] = value
        return

    @pl.when(stopped[b] == 0)
    def _():
        ref[index] = value


def _conv(g, xs, taps, hist_refs, p, b, outs, stopped):
    """The causal conv + SiLU of sequence b's T rows, for q, k and v; stores the
    new history in slot p (unless b stopped); returns the outputs with those
    rows filled in."""
    new = []
    for x, w, ref, out in zip(xs, taps, hist_refs, outs):
        rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, 0)
        hist = ref[p, b].astype(jnp.float32)                         # [Kc-1, C]
        hrows = jax.lax.broadcasted_iota(jnp.int32, hist.shape, 0)
        seq = [_pick_row(hist, hrows, m) for m in range(g.conv_kernel - 1)]
        # rounded to the history's dtype before use, as the reference does
        seq += [_pick_row(x, rows, b * g.tokens + t).astype(ref.dtype).astype(jnp.float32)
                for t in range(g.tokens)]
        for t in range(g.tokens):
            acc = sum(w[j] * seq[t + j] for j in range(g.conv_kernel))
            out = jnp.where(rows == b * g.tokens + t, acc * jax.nn.sigmoid(acc), out)
        kept = jnp.zeros(hist.shape, jnp.float32)
        for m in range(g.conv_kernel - 1):
            kept = jnp.where(hrows == m, seq[g.tokens + m], kept)
        _store(ref, (p, b), kept.astype(ref.dtype), stopped, b)
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


def _recurrence(g, qt, kt, v, beta, decay, state, p, b, outs, stopped):
    """The delta rule over sequence b's T rows for every local value head; S
    lives in slot p of ``state`` (kept as it was if b stopped); returns the
    per-head outputs with b's rows."""
    dk, dv, rp = g.key_dim, g.value_dim, g.rows_padded
    lanes = jax.lax.broadcasted_iota(jnp.int32, (dk, rp), 1)          # row index of q/k columns
    rows_v = jax.lax.broadcasted_iota(jnp.int32, (rp, dv), 0)
    rows_h = jax.lax.broadcasted_iota(jnp.int32, beta.shape, 0)
    heads_h = jax.lax.broadcasted_iota(jnp.int32, beta.shape, 1)
    new = []
    for h in range(g.value_heads):
        kh = h // g.group
        if h % g.group == 0:        # the key head's q and k columns, shared by its group
            cols = [[jnp.sum(jnp.where(lanes == b * g.tokens + t, m[kh * dk:(kh + 1) * dk], 0.0),
                             axis=1, keepdims=True) for m in (kt, qt)]      # [dk, 1] each
                    for t in range(g.tokens)]
        s = state[p, b, h]                                              # [dk, dv]
        out = outs[h]
        for t in range(g.tokens):
            r = b * g.tokens + t
            kc, qc = cols[t]
            vr = _pick_row(v[:, h * dv:(h + 1) * dv], rows_v, r)        # [1, dv]
            mask = (rows_h == r) & (heads_h == h)
            s = s * _scalar(decay, mask)
            u = jnp.sum(kc * s, axis=0, keepdims=True)                  # S^T k
            s = s + kc * (_scalar(beta, mask) * (vr - u))
            out = jnp.where(rows_v == r, jnp.sum(qc * s, axis=0, keepdims=True), out)
        _store(state, (p, b, h), s, stopped, b)
        new.append(out)
    return tuple(new)


def step(g, xs, z, b_in, a_in, taps, a_log, dt_bias, norm, hbm, k, *, sync, hist_q, hist_k,
         hist_v, recurrent, sems, stopped=None):
    """One GDN node for repetition k: xs = (q, k, v) raw projections [RP, width]
    f32, z [RP, HV*dv], b/a [RP, >= HV] (zero-padded to 128 lanes: the first HV
    are the heads'); taps = three [1, Kc, C] vectors; a_log,
    dt_bias [1, HV] f32; norm [1, dv]. Returns y [RP, HV*dv] f32 (0 in padding rows)."""
    bufs = (hist_q, hist_k, hist_v, recurrent)
    p = k % 2
    reads = _copies(hbm, bufs, sems, k, 0)
    if sync:
        _each(reads, "start")
    _each(reads, "wait")
    taps = [[_pick_row(w[0], jax.lax.broadcasted_iota(jnp.int32, w[0].shape, 0), j)
             for j in range(g.conv_kernel)] for w in taps]
    zero = tuple(jnp.zeros(x.shape, jnp.float32) for x in xs)
    cq, ck, cv = jax.lax.fori_loop(
        0, g.batch, lambda b, outs: _conv(g, xs, taps, bufs[:3], p, b, outs, stopped), zero)
    qt = jnp.transpose(_l2norm_heads(cq, g.key_heads, g.key_dim, g.key_dim ** -0.5))
    kt = jnp.transpose(_l2norm_heads(ck, g.key_heads, g.key_dim, 1.0))
    beta = jax.nn.sigmoid(b_in[:, :g.value_heads])
    decay = jnp.exp(-jnp.exp(a_log) * _softplus(a_in[:, :g.value_heads] + dt_bias))
    heads = tuple(jnp.zeros((g.rows_padded, g.value_dim), jnp.float32)
                  for _ in range(g.value_heads))
    outs = jax.lax.fori_loop(0, g.batch, lambda b, o: _recurrence(
        g, qt, kt, cv, beta, decay, recurrent, p, b, o, stopped), heads)
    writes = _copies(hbm, bufs, sems, k, 1)
    _each(writes, "start")
    if sync:
        _each(writes, "wait")
    else:
        @pl.when(k + 1 < g.layers)
        def _():
            @pl.when(k >= 1)
            def _():
                _each(_copies(hbm, bufs, sems, k - 1, 1), "wait")
            _each(_copies(hbm, bufs, sems, k + 1, 0), "start")
    ys = []
    for h, o in enumerate(outs):
        zh = z[:, h * g.value_dim:(h + 1) * g.value_dim]
        o = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + g.norm_eps)
        ys.append(o * norm * (zh * jax.nn.sigmoid(zh)))
    return ys[0] if len(ys) == 1 else jnp.concatenate(ys, axis=-1)
