"""Reference functions and weight init of the two-part norm (ir/kind_norm_parts.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel.models.reference import REFERENCE
from megakernel.models.weights import INIT


def _rms_scale(n, p, xs, ctx):
    x, ms = xs
    scale = p["weight"].astype(jnp.float32) + (1.0 if n.op.offset else 0.0)
    return x * jax.lax.rsqrt(ms + n.op.eps) * scale


REFERENCE.register("mean_square")(lambda n, p, xs, ctx: jnp.mean(xs[0] * xs[0], axis=-1,
                                                                 keepdims=True))
REFERENCE.register("rms_scale")(_rms_scale)

INIT.register("mean_square")({})
INIT.register("rms_scale")({"weight": ("scale", 0)})
