"""Reference functions and weight init of the elementwise kinds (ir/kind_elementwise.py)."""

from __future__ import annotations

import jax.numpy as jnp

from megakernel import activations
from megakernel.models.reference import REFERENCE
from megakernel.models.weights import INIT

REFERENCE.register("mul")(lambda n, p, xs, ctx: xs[0] * xs[1])
REFERENCE.register("activation")(lambda n, p, xs, ctx: activations.apply(n.op.fn, xs[0]))
REFERENCE.register("scale")(lambda n, p, xs, ctx: xs[0] * n.op.factor)
REFERENCE.register("softcap")(lambda n, p, xs, ctx: activations.softcap(xs[0], n.op.cap))
REFERENCE.register("channel_scale")(      # with offset: x * (1 + w)
    lambda n, p, xs, ctx: xs[0] * (p["weight"].astype(jnp.float32) + float(n.op.offset)))

INIT.register("mul", "activation", "scale", "softcap")({})
INIT.register("channel_scale")({"weight": ("scale", 0)})
