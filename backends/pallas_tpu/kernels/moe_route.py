"""The router of the in-kernel MoE (backends/pallas_tpu/kernels/moe.py), in
vregs: scores from the router logits, a sort-free top-k (k rounds of row max
and the lowest lane attaining it, lax.top_k's tie rule: Mosaic has no sort),
DeepSeek's group-limited selection one level up, and the combine weights.
Every core runs it on the same replicated logits, so every core picks the
same experts, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel.compiler.geometry.moe import MoEGeometry


def route(g: MoEGeometry, logits, router_bias, logit_bias=None):
    """combine [RP, E] f32 from the router logits [RP, E] f32: row n's weight
    for global expert e (0 if not picked or a padding row), used [1, E]
    int32: picked by any valid row, and picked [RP, E] bool (valid rows)."""
    if g.router_logit_scale != 1.0:      # as the reference: scaled, then biased
        logits = logits * g.router_logit_scale
    if g.router_logit_bias:
        logits = logits + logit_bias
    if g.scoring == "softmax":
        m = jnp.max(logits, axis=-1, keepdims=True)
        ex = jnp.exp(logits - m)
        scores = ex / jnp.sum(ex, axis=-1, keepdims=True)
    else:
        scores = jax.nn.sigmoid(logits)
    select = scores + router_bias if g.correction_bias else scores
    E = g.num_experts
    lane = jax.lax.broadcasted_iota(jnp.int32, select.shape, 1)
    valid = jax.lax.broadcasted_iota(jnp.int32, select.shape, 0) < g.rows
    if g.n_group > 1:
        select = _group_limit(g, select, lane)
    picked = jnp.zeros(select.shape, jnp.bool_)
    cur = select
    for _ in range(g.top_k):
        top = jnp.max(cur, axis=-1, keepdims=True)
        idx = jnp.min(jnp.where(cur == top, lane, E), axis=-1, keepdims=True)
        hit = lane == idx
        picked = picked | hit
        cur = jnp.where(hit, -jnp.inf, cur)
    picked = picked & valid
    w = jnp.where(picked, scores, 0.0)
    if g.renormalize:
        tot = jnp.sum(w, axis=-1, keepdims=True)
        # padding rows have tot == 0 (and w == 0)
        w = w / (jnp.where(tot > 0, tot, 1.0) + g.renormalize_eps)
    w = w * g.routed_scaling
    used = jnp.max(picked.astype(jnp.int32), axis=0, keepdims=True)
    return w, used, picked


def _group_limit(g: MoEGeometry, select, lane):
    """``select`` with the experts outside the topk_group best groups at -inf.
    A group's score is its best plus its best other lane (the reference's
    top-2 sum, added in the same order); groups are picked by topk_group
    rounds of max, ties to the lowest group."""
    per = g.num_experts // g.n_group
    E = g.num_experts
    inside, score = [], []
    for j in range(g.n_group):
        mine = (lane >= j * per) & (lane < (j + 1) * per)
        vals = jnp.where(mine, select, -jnp.inf)
        first = jnp.max(vals, axis=-1, keepdims=True)
        at = jnp.min(jnp.where(vals == first, lane, E), axis=-1, keepdims=True)
        second = jnp.max(jnp.where(lane == at, -jnp.inf, vals), axis=-1, keepdims=True)
        inside.append(mine)
        score.append(first + second)                                  # [RP, 1]
    picked = [jnp.zeros(score[0].shape, jnp.bool_) for _ in score]
    for _ in range(g.topk_group):
        cand = [jnp.where(p, -jnp.inf, s) for p, s in zip(picked, score)]
        top = cand[0]
        for c in cand[1:]:
            top = jnp.maximum(top, c)
        found = jnp.zeros(top.shape, jnp.bool_)
        for j, c in enumerate(cand):
            hit = (c == top) & ~found & ~picked[j]
            picked[j], found = picked[j] | hit, found | hit
    keep = jnp.zeros(select.shape, jnp.bool_)
    for mine, p in zip(inside, picked):
        keep = keep | (mine & p)
    return jnp.where(keep, select, -jnp.inf)
