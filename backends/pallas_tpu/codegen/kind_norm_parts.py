"""Emitters of the two-part norm (ir/kind_norm_parts.py): one line of JAX each.

``mean_square`` sums this core's features and divides by the whole ``dim``,
so the all-reduce the plan places after it (emit.StackCtx.reduce) completes
the mean; ``rms_scale`` then scales this core's features by their weights.
"""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, v


@EMITTERS.register("mean_square")
def _mean_square(c, n) -> list[str]:
    x = v(n.inputs[0])
    return [f"{v(n.outputs[0])} = jnp.sum({x} * {x}, axis=-1, keepdims=True) * "
            f"{literal(1.0 / n.op.dim)}"]


@EMITTERS.register("rms_scale")
def _rms_scale(c, n) -> list[str]:
    op = n.op
    x, ms = (v(t) for t in n.inputs)
    w = c.vec(n.name + ".weight") + (" + 1.0" if op.offset else "")
    return [f"{v(n.outputs[0])} = {x} * jax.lax.rsqrt({ms} + {literal(op.eps)}) * ({w})"]
