"""In-kernel routed MoE: router, sort-free top-k, data-dependent expert DMAs.

Contract (the planner and the emitter use exactly these):

``MoEGeometry(rows, rows_padded, hidden, num_experts, experts_local, inter_local,
top_k, scoring, correction_bias, renormalize, routed_scaling, activation, slots,
dtype, chunk, router_logit_bias, expert_bias, swiglu_limit, swiglu_alpha,
n_group, topk_group, fmt, router_logit_scale, renormalize_eps,
expert_output_norm, expert_output_norm_eps, expert_output_norm_input_scaled,
expert_output_norm_offset)`` - one MoE node on one core, chosen by the planner.
``chunk`` splits each expert's intermediate into ``inter_local // chunk``
slices, as ``ExpertStream.chunk/chunks`` plans when a whole expert does not fit
a slot. gpt-oss's options (ir/ops.py MoE): biased router logits, biased
experts, clamped SwiGLU. ``n_group`` / ``topk_group``: DeepSeek's
group-limited selection (1 / 1: none). Muse Spark's: scaled logits, an
epsilon in the renormalisation, and each expert's output normalised before
it is weighted (``expert_output_norm``; its slices summed first when
``chunk`` splits an expert; the planner keeps experts whole on a core).

``buffers(g)`` - what ``moe_routed`` needs, by name (E = num_experts; the kernel
passes the ones the plan bound to a node as one ``Buffers``, ``bufs``):
  used_v      VMEM (8, E) int32          row 0: 1 where any valid row picked expert e
  used_s      SMEM (8, E) int32          the same, readable as scalars
  uniq        SMEM (experts_local,) i32  compact list of picked local experts
  gate_slots  VMEM (slots, hidden, chunk) dtype
  up_slots    VMEM (slots, hidden, chunk) dtype
  down_slots  VMEM (slots, chunk, hidden) dtype
  slot_sems   DMA (3, slots)             [gate|up|down, slot]
  ids_sem     DMA (1,)                   used_v -> used_s

``moe_routed(g, x, logits, router_bias, experts_gate, experts_up, experts_down,
layer, expert_offset, bufs=, logit_bias=None, biases=None, bias_here=True,
experts_scales=None, static_items=None, out_norm=None)
-> partial [rows_padded, hidden] f32`` - x value [RP, hidden] f32; logits value
[RP, E] f32, x @ router (the emitter streams the router through the ring like
any linear: x in the weight's dtype, f32 accumulation); router_bias value
[1, E] f32 or None; experts_* HBM refs [L, experts_local, ...]; layer traced
int32; expert_offset = global id of local expert 0 (EP) or 0 (TP); logit_bias
[1, E] f32 (``router_logit_bias``); biases (gate [1, experts_local, inter_local], up, down [1, experts_local,
hidden]) f32 (``expert_bias``); bias_here: whether this core adds the down
biases (one core of each group splitting an expert's intermediate);
experts_scales: the HBM refs of quantized experts' scales (gate, up, down);
static_items: a profile build's fixed count of expert items (the kernel's
``PROFILE_EXPERT_ITEMS``), in place of the routed one; out_norm: the
per-expert norm's weight [1, hidden] f32. Returns the
sum over this core's selected experts of weight * expert(x) for valid rows and
0 for padding rows; summing partials over cores gives the routed output.
With ``per_slot`` it returns (slots [rows_padded, top_k x hidden] f32, each
pick unweighted in its slot by ascending expert id, partial like the sum;
weights [rows_padded, top_k] f32) for expert_combine (moe_slots.py).

Why: the router and top-k run in vregs (moe_route.py: k rounds of row max +
lowest index attaining it, which is lax.top_k's tie rule; no sort primitive
on Mosaic).
Group-limited selection is the same rule one level up: per group the max and
the best other lane (its top-2 sum), then topk_group rounds of max over the
groups, ties to the lowest group. Every core runs it on the same replicated
router and input, so every core picks the same experts, bit for bit.
The union of picked experts goes VMEM -> SMEM by DMA (the only way a vector
value becomes a DMA index, found by a one-off interpret-mode prototype); each picked
local expert is fetched once per call and applied to all rows (extra LHS rows
are ~free on the MXU), with weight 0 for rows that did not pick it. (expert,
chunk) items stream through ``slots`` buffers, lookahead slots-1; the next
layer's experts are unknown until its router runs, so nothing crosses calls.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel import formats
from megakernel.backends.pallas_tpu.kernels import dequant
from megakernel.activations import apply as activation
from megakernel.activations import clamped_swiglu
# The geometry is the planner's record (jax-free); generated kernels build it as
# moe_lib.MoEGeometry.
from megakernel.compiler.geometry.moe import (  # noqa: F401 - re-exported
    MoEGeometry, buffers, scale_rows, value_bytes)
from megakernel.backends.pallas_tpu.kernels import moe_slots as slots_lib
from megakernel.backends.pallas_tpu.kernels.moe_route import route

HI = jax.lax.Precision.HIGHEST


class Buffers(NamedTuple):
    """The refs of ``buffers(g)`` bound to one MoE node, by name (the scales'
    slots only for quantized experts)."""

    used_v: Any
    used_s: Any
    uniq: Any
    gate_slots: Any
    up_slots: Any
    down_slots: Any
    slot_sems: Any
    ids_sem: Any
    gate_scales: Any = None
    up_scales: Any = None
    down_scales: Any = None


def _matmul(x, w):
    """As the reference: x in w's dtype, f32 accumulation. HIGHEST only for f32
    operands (Mosaic rejects an fp32-precision contract on bf16; bf16 is exact anyway)."""
    prec = HI if w.dtype == jnp.float32 else None
    return jnp.dot(x.astype(w.dtype), w, precision=prec, preferred_element_type=jnp.float32)


def _qmatmul(g: MoEGeometry, x, words, scales):
    """x @ one slot's quantized codes, dequantised per chunk (dequant.py)."""
    return dequant.matmul(x, words, scales, g.fmt, jnp.dtype(g.dtype), _matmul)


def _expert_row(table, e, chunk, g: MoEGeometry):
    """[1, chunk] f32: local expert e's row of a [1, experts_local, width] bias
    table, columns of slice ``chunk`` (the whole row when None; masked sums:
    no dynamic slicing)."""
    t = table[0]
    rows = jax.lax.broadcasted_iota(jnp.int32, t.shape, 0)
    row = jnp.sum(jnp.where(rows == e, t, 0.0), axis=0, keepdims=True)
    if g.chunks == 1 or chunk is None:
        return row
    C = g.chunk
    return sum(jnp.where(chunk == c, row[:, c * C:(c + 1) * C], 0.0) for c in range(g.chunks))


def _down_biases(g: MoEGeometry, combine, table, expert_offset):
    """sum_e weight[n, e] * down_bias[e] over this core's experts (weight 0 for
    experts a row did not pick), one local expert at a time on the VPU."""
    lane = jax.lax.broadcasted_iota(jnp.int32, combine.shape, 1)
    out = jnp.zeros((g.rows_padded, g.hidden), jnp.float32)
    for j in range(g.experts_local):
        w = jnp.sum(jnp.where(lane == expert_offset + j, combine, 0.0), axis=-1, keepdims=True)
        out = out + w * table[0][j:j + 1, :]
    return out


def _output_norm(g: MoEGeometry, y, w):
    """One expert's whole output y [RP, hidden] normalised, as the reference's
    ``expert_output_norm`` (moe_slots.slot_norm with the op's fields)."""
    return slots_lib.slot_norm(y, w, g.expert_output_norm_eps,
                               g.expert_output_norm_input_scaled,
                               g.expert_output_norm_offset, g.dtype)


def _glu(g: MoEGeometry, gate, up):
    if g.swiglu_limit is None:
        return activation(g.activation, gate) * up
    return clamped_swiglu(gate, up, g.swiglu_limit, g.swiglu_alpha)


def moe_routed(g: MoEGeometry, x, logits, router_bias, experts_gate, experts_up,
               experts_down, layer, expert_offset, *, bufs: Buffers, logit_bias=None,
               biases=None, bias_here=True, experts_scales=None, static_items=None,
               out_norm=None):
    used_v, used_s, uniq_s, isem = bufs.used_v, bufs.used_s, bufs.uniq, bufs.ids_sem
    gate_b, up_b, down_b, sems = bufs.gate_slots, bufs.up_slots, bufs.down_slots, bufs.slot_sems
    gate_scales, up_scales, down_scales = bufs.gate_scales, bufs.up_scales, bufs.down_scales
    K, C, nc = g.slots, g.chunk, g.chunks
    combine, used, picked = route(g, logits, router_bias, logit_bias)
    used_v[...] = jnp.broadcast_to(used, used_v.shape)
    cp = pltpu.make_async_copy(used_v, used_s, isem.at[0])
    cp.start()
    cp.wait()

    # Compact list of this core's picked experts, ascending local id.
    def collect(e, n):
        hit = used_s[0, expert_offset + e] > 0

        @pl.when(hit)
        def _():
            uniq_s[n] = e

        return n + hit.astype(jnp.int32)

    n_items = jax.lax.fori_loop(0, g.experts_local, collect, jnp.int32(0)) * nc
    if static_items is not None:     # a profile build (never run): a counted loop
        n_items = static_items

    def copies(q):
        """DMAs of item q = (expert uniq[q // nc], chunk q % nc) into slot q % K."""
        e = uniq_s[q // nc] if nc > 1 else uniq_s[q]
        slot = q % K
        if nc == 1:
            src = (experts_gate.at[layer, e], experts_up.at[layer, e],
                   experts_down.at[layer, e])
        else:
            c0 = pl.multiple_of((q % nc) * C, C)
            src = (experts_gate.at[layer, e, :, pl.ds(c0, C)],
                   experts_up.at[layer, e, :, pl.ds(c0, C)],
                   experts_down.at[layer, e, pl.ds(c0, C), :])
        dst = (gate_b.at[slot], up_b.at[slot], down_b.at[slot])
        if g.fmt:        # words of packed codes, and the scales of their groups
            per = 32 // formats.get(g.fmt).code_bits
            sg, su, sd = experts_scales
            if nc == 1:
                src = src + (sg.at[layer, e], su.at[layer, e], sd.at[layer, e])
            else:
                c0 = pl.multiple_of((q % nc) * C, C)
                # the down slice's scale rows: its groups, or the one per-channel row
                whole = formats.get(g.fmt).group_rows == formats.WHOLE
                dr = scale_rows(g, C)
                d0 = 0 if whole else pl.multiple_of((q % nc) * dr, dr)
                # the code words' row offset, its alignment stated for Mosaic
                w0 = pl.multiple_of((q % nc) * (C // per), C // per)
                src = (src[0], src[1], experts_down.at[layer, e, pl.ds(w0, C // per), :],
                       sg.at[layer, e, :, pl.ds(c0, C)], su.at[layer, e, :, pl.ds(c0, C)],
                       sd.at[layer, e, pl.ds(d0, dr), :])
            dst = dst + (gate_scales.at[slot], up_scales.at[slot], down_scales.at[slot])
        return [pltpu.make_async_copy(s, d, sems.at[j, slot])
                for j, (s, d) in enumerate(zip(src, dst))]

    for j in range(K - 1):
        @pl.when(j < n_items)
        def _():
            for c in copies(j):
                c.start()

    xw = x.astype(jnp.dtype(g.dtype))
    lane = jax.lax.broadcasted_iota(jnp.int32, combine.shape, 1)

    def item(q, carry):
        acc, whole = carry
        @pl.when(q + K - 1 < n_items)
        def _():
            # slot (q-1) % K was consumed by the previous iteration
            for c in copies(q + K - 1):
                c.start()

        for c in copies(q):
            c.wait()
        slot = q % K
        e_local = uniq_s[q // nc] if nc > 1 else uniq_s[q]
        e = e_local + expert_offset
        wgt = jnp.sum(jnp.where(lane == e, combine, 0.0), axis=-1, keepdims=True)  # [RP, 1]
        if g.fmt:
            gate = _qmatmul(g, xw, gate_b.at[slot], gate_scales[slot])
            up = _qmatmul(g, xw, up_b.at[slot], up_scales[slot])
        else:
            gate, up = _matmul(xw, gate_b[slot]), _matmul(xw, up_b[slot])
        if g.expert_bias:
            gate = gate + _expert_row(biases[0], e_local, q % nc, g)
            up = up + _expert_row(biases[1], e_local, q % nc, g)
        act = _glu(g, gate, up)
        y = (_qmatmul(g, act, down_b.at[slot], down_scales[slot])
             if g.fmt else _matmul(act, down_b[slot]))
        if g.per_slot:      # the pick's slot, unweighted; its down bias once per expert
            if g.expert_bias:
                first = jnp.logical_and(bias_here, q % nc == 0)
                y = y + jnp.where(first, _expert_row(biases[2], e_local, None, g), 0.0)
            return slots_lib.place(acc, whole, y, picked, e, q % nc == nc - 1, nc)
        if not g.expert_output_norm:
            return acc + wgt * y, whole
        # The norm reads the expert's whole output, its down bias included:
        # its slices are summed in ``whole`` and normed after the last (an
        # expert's slices are consecutive items), then ``whole`` starts again.
        summed = whole + y if nc > 1 else y
        done = summed + _expert_row(biases[2], e_local, None, g) if g.expert_bias else summed
        if nc == 1:
            return acc + wgt * _output_norm(g, done, out_norm), whole
        last = q % nc == nc - 1
        acc = jnp.where(last, acc + wgt * _output_norm(g, done, out_norm), acc)
        return acc, jnp.where(last, 0.0, summed)

    zeros = jnp.zeros((g.rows_padded, g.hidden), jnp.float32)
    first = (zeros,) * g.top_k if g.per_slot else zeros
    acc, _ = jax.lax.fori_loop(0, n_items, item, (first, zeros))
    if g.per_slot:          # [RP, top_k x hidden] partial picks, [RP, top_k] weights
        rows = jax.lax.broadcasted_iota(jnp.int32, (g.rows_padded, g.top_k * g.hidden), 0)
        return (jnp.where(rows < g.rows, jnp.concatenate(acc, axis=-1), 0.0),
                slots_lib.slot_weights(combine, picked, g.top_k))
    if g.expert_bias and not g.expert_output_norm:     # normed experts added theirs
        down = _down_biases(g, combine, biases[2], expert_offset)
        acc = acc + jnp.where(bias_here, down, 0.0)
    rows = jax.lax.broadcasted_iota(jnp.int32, acc.shape, 0)
    return jnp.where(rows < g.rows, acc, 0.0)
