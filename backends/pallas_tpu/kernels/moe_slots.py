"""A per-slot MoE (ir/kind_moe.py ``per_slot``) in the kernel: each row's
picks apart, and the expert_combine op that norms and sums them
(ir/kind_expert_combine.py).

Slot j of a row holds its j-th picked expert by ascending global id: a rank
every core computes alike from the replicated routing (``picked``), so the
partial slots of a split expert line up across cores for the all-reduce.
Ranks are counted by masked sums over the expert lanes (no cumsum, no sort
on Mosaic); the slot weights by top_k rounds of "lowest picked lane left",
the router's own tie-free rule (moe_route.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def slot_weights(w, picked, top_k: int):
    """[RP, top_k] f32: each row's routing weight of its picks, ascending id."""
    E = w.shape[-1]
    lane = jax.lax.broadcasted_iota(jnp.int32, w.shape, 1)
    left, cols = picked, []
    for _ in range(top_k):
        idx = jnp.min(jnp.where(left, lane, E), axis=-1, keepdims=True)
        hit = lane == idx
        cols.append(jnp.sum(jnp.where(hit, w, 0.0), axis=-1, keepdims=True))
        left = left & ~hit
    return jnp.concatenate(cols, axis=-1)


def slot_of(picked, e):
    """([RP, 1] int32 rank of global expert e among each row's picks, [RP, 1]
    bool whether the row picked it)."""
    lane = jax.lax.broadcasted_iota(jnp.int32, picked.shape, 1)
    rank = jnp.sum(jnp.where(picked & (lane < e), 1, 0), axis=-1, keepdims=True)
    mine = jnp.sum(jnp.where(picked & (lane == e), 1, 0), axis=-1, keepdims=True) > 0
    return rank, mine


def add_to_slots(acc: tuple, y, rank, mine) -> tuple:
    """Each slot accumulator plus y [RP, hidden] on the rows whose pick it is."""
    return tuple(a + jnp.where(mine & (rank == j), y, 0.0) for j, a in enumerate(acc))


def place(acc: tuple, whole, y, picked, e, last, chunks: int):
    """(slot accumulators, running sum of an expert's slices) after item y of
    global expert e: its slices are summed first and placed once, after the
    last (an expert's slices are consecutive items), since placing costs
    top_k selects of [RP, hidden] (the cost model's per-slot term,
    compiler/kind_moe.py). The accumulators are loop values, not a planned
    buffer: Mosaic reuses their VMEM across the layer's MoE nodes, where one
    scratch per node would add up (4 MiB at Muse Spark's four body nodes)."""
    if chunks == 1:
        return add_to_slots(acc, y, *slot_of(picked, e)), whole
    summed = whole + y
    acc = jax.lax.cond(last, lambda a: add_to_slots(a, summed, *slot_of(picked, e)),
                       lambda a: a, acc)
    return acc, jnp.where(last, 0.0, summed)


def slot_norm(y, w, eps: float, input_scaled: bool, offset: bool, dtype):
    """As the reference's ``slot_norm``: rms(y) * s, or rms(round(y * s)) with
    the product rounded to ``dtype``; s = 1 + w with ``offset``, else w [1, hidden]."""
    s = w + 1.0 if offset else w
    if input_scaled:
        y = (y * s).astype(jnp.dtype(dtype)).astype(jnp.float32)
    y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + eps)
    return y if input_scaled else y * s


def combine(slots, weights, norm_w, *, top_k: int, eps: float, input_scaled: bool,
            offset: bool, dtype):
    """expert_combine: slots [RP, top_k x hidden] (all-reduced), weights
    [RP, top_k] -> [RP, hidden] f32, the slots summed in order 0..top_k-1."""
    h = slots.shape[-1] // top_k
    out = None
    for j in range(top_k):
        y = slots[:, j * h:(j + 1) * h]
        if norm_w is not None:
            y = slot_norm(y, norm_w, eps, input_scaled, offset, dtype)
        term = weights[:, j:j + 1] * y
        out = term if out is None else out + term
    return out
