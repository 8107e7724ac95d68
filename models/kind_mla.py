"""Reference function and weight init of multi-head latent attention (ir/kind_mla.py).

The reference is the *naive* form, as the published equations (and Hugging
Face's DeepseekV3Attention) write it: the new tokens' c_kv (normed) and k_pe
(roped) are written to the latent cache first, then every head's k_nope and v
are expanded from the whole cache and attended causally. The kernel's absorbed
and expanded forms are checked against it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel.ir.ops import Rope
from megakernel.models.reference import REFERENCE, rope
from megakernel.models.weights import INIT

HI = jax.lax.Precision.HIGHEST


def latent_rows(op, q, kv_a, weight, positions):
    """(q_nope [n, H, dn], q_pe [n, H, dr], latent [n, R + dr]) of the new
    tokens: c_kv normed, q_pe and k_pe rotated (unless NoPE)."""
    n, heads, r = q.shape[0], op.num_heads, op.kv_lora_rank
    q = q.reshape(n, heads, op.qk_head_dim)
    q_nope, q_pe = q[..., :op.nope_dim], q[..., op.nope_dim:]
    c_kv = kv_a[:, :r]
    c_kv = c_kv * jax.lax.rsqrt(jnp.mean(c_kv * c_kv, axis=-1, keepdims=True) + op.kv_norm_eps)
    c_kv = c_kv * weight.astype(jnp.float32)
    k_pe = kv_a[:, r:]
    if op.rope:
        def rotate(x, h):
            return rope(Rope(h, op.rope_dim, op.theta, 0, op.scaling), x, positions)
        q_pe = rotate(q_pe.reshape(n, heads * op.rope_dim), heads).reshape(q_pe.shape)
        k_pe = rotate(k_pe, 1)
    return q_nope, q_pe, jnp.concatenate([c_kv, k_pe], axis=-1)


def mla(op, p, xs, ctx, name):
    """Write the T new latent rows, then causal attention of every head over
    the cache with k_nope / v expanded from it (the naive form)."""
    b, t, heads = ctx.batch, ctx.tokens, op.num_heads
    dn, dv, r = op.nope_dim, op.v_head_dim, op.kv_lora_rank
    q_nope, q_pe, latent = latent_rows(op, xs[0], xs[1], p["kv_norm"], ctx.positions)
    key = f"{ctx.prefix}{name}.latent"
    cache = ctx.caches[key]
    new = latent.reshape(b, t, -1).astype(cache.dtype)
    cache = jax.vmap(lambda c, x, s: jax.lax.dynamic_update_slice(c, x, (s, 0)))(
        cache, new, ctx.positions[:, 0])
    ctx.caches[key] = cache

    c_all = cache[..., :r]                                   # [B, S, R], cache dtype
    k_pe = cache[..., r:].astype(jnp.float32)                # [B, S, dr]
    w_uk = p["w_uk"].reshape(heads, dn, r)
    w_uv = p["w_uv"].reshape(r, heads, dv)
    k_nope = jnp.einsum("bsr,hdr->bshd", c_all.astype(w_uk.dtype), w_uk, precision=HI,
                        preferred_element_type=jnp.float32)
    v = jnp.einsum("bsr,rhd->bshd", c_all.astype(w_uv.dtype), w_uv, precision=HI,
                   preferred_element_type=jnp.float32)
    qn = q_nope.reshape(b, t, heads, dn)
    qp = q_pe.reshape(b, t, heads, op.rope_dim)
    scores = (jnp.einsum("bthd,bshd->bhts", qn, k_nope, precision=HI)
              + jnp.einsum("bthd,bsd->bhts", qp, k_pe, precision=HI)) * op.softmax_scale
    visible = jnp.arange(cache.shape[1])[None, None, :] <= ctx.positions[:, :, None]
    scores = jnp.where(visible[:, None, :, :], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhts,bshd->bthd", probs, v, precision=HI).reshape(b * t, heads * dv)
    if op.output_gate:
        out = out * jax.nn.sigmoid(xs[2])
    return out


REFERENCE.register("mla")(lambda n, p, xs, ctx: mla(n.op, p, xs, ctx, n.name))
# w_uk [H*dn, R] expands c_kv (fan-in R, its axis 1); w_uv [R, H*dv] likewise (axis 0).
INIT.register("mla")({"kv_norm": ("scale", 0), "w_uk": ("matrix", 1), "w_uv": ("matrix", 0)})
