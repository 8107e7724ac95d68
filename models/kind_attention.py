"""Reference function and weight init of attention and rotary embedding
(ir/kind_attention.py): causal grouped-query attention over the K/V cache,
written from the published equations, the new rows written into the cache
first (``rope`` itself is reference.py's, which MLA's reference shares).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel import activations
from megakernel.models.reference import REFERENCE, _Ctx, rope
from megakernel.models.weights import INIT


def attention(op, q, k, v, ctx: _Ctx, name: str, p=None):
    """Write the T new k/v rows into the cache, then causal GQA over the cache
    (scores soft-capped before the mask, and a sink logit per head in the
    softmax denominator, when the op says so)."""
    b, t, d = ctx.batch, ctx.tokens, op.head_dim
    kname, vname = f"{ctx.prefix}{name}.k", f"{ctx.prefix}{name}.v"
    k_cache, v_cache = ctx.caches[kname], ctx.caches[vname]
    start = ctx.positions[:, 0]

    def write(cache, new):
        new = new.reshape(b, t, op.num_kv_heads, d).astype(cache.dtype)
        return jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (s, 0, 0)))(
            cache, new, start)

    k_cache, v_cache = write(k_cache, k), write(v_cache, v)
    ctx.caches[kname], ctx.caches[vname] = k_cache, v_cache

    s = k_cache.shape[1]
    qh = q.reshape(b, t, op.num_kv_heads, op.group_size, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qh, k_cache.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST) * op.softmax_scale
    if op.logit_softcap is not None:
        scores = activations.softcap(scores, op.logit_softcap)
    key_pos = jnp.arange(s)[None, None, :]                 # [1, 1, S]
    query_pos = ctx.positions[:, :, None]                  # [B, T, 1]
    visible = key_pos <= query_pos
    if op.sliding_window is not None:
        visible &= key_pos > query_pos - op.sliding_window
    scores = jnp.where(visible[:, None, None, :, :], scores, -jnp.inf)
    if op.sinks:
        # One more column per head: the sink's logit, which has no value row.
        sink = p["sinks"].astype(jnp.float32).reshape(op.num_kv_heads, op.group_size)
        sink = jnp.broadcast_to(sink[None, :, :, None, None], (*scores.shape[:-1], 1))
        probs = jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]
    else:
        probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache.astype(jnp.float32),
                     precision=jax.lax.Precision.HIGHEST)
    return out.reshape(b * t, op.num_q_heads * d)


REFERENCE.register("rope")(lambda n, p, xs, ctx: rope(n.op, xs[0], ctx.positions))
REFERENCE.register("attention")(lambda n, p, xs, ctx: attention(n.op, *xs, ctx, n.name, p))
INIT.register("attention")({"sinks": ("sink", 0)})
INIT.register("rope")({})
