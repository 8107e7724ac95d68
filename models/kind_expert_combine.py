"""Reference and weight init of the routed experts' combine
(ir/kind_expert_combine.py): each slot normed (Muse Spark's per-expert
output norm, ``slot_norm``), weighted by its routing weight, summed."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel.models.reference import REFERENCE
from megakernel.models.weights import INIT


def slot_norm(w, y, eps: float, input_scaled: bool, offset: bool):
    """y [..., hidden] normalised: rms(y) * s, or input-scaled rms(round(y * s))
    with the product rounded to the dtype of the weight w (the model's);
    s = 1 + w with ``offset``, else w."""
    s = w.astype(jnp.float32) + (1.0 if offset else 0.0)
    if input_scaled:
        y = (y * s).astype(w.dtype).astype(jnp.float32)
    y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + eps)
    return y if input_scaled else y * s


def combine(op, p, slots, weights):
    """slots [n, top_k * hidden], weights [n, top_k] -> [n, hidden] f32."""
    y = slots.reshape(slots.shape[0], op.top_k, op.hidden).astype(jnp.float32)
    if op.norm:
        y = slot_norm(p["weight"], y, op.norm_eps, op.norm_input_scaled, op.norm_offset)
    return jnp.einsum("nk,nkh->nh", weights.astype(jnp.float32), y,
                      precision=jax.lax.Precision.HIGHEST)


REFERENCE.register("expert_combine")(lambda n, p, xs, ctx: combine(n.op, p, *xs))
INIT.register("expert_combine")({"weight": ("scale", 0)})
