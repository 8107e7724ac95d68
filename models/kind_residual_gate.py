"""Reference and weight init of the residual gate (ir/kind_residual_gate.py):
alpha * s + beta * b in f32 from the f32 gate vector (the formula is
megakernel/activations.py's, which the kernel calls too; tests/models checks
it against numpy)."""

from __future__ import annotations

import jax.numpy as jnp

from megakernel import activations
from megakernel.models.reference import REFERENCE
from megakernel.models.weights import INIT


@REFERENCE.register("residual_gate")
def _residual_gate(n, p, xs, ctx):
    s, b = xs
    gate = p["gate"].astype(jnp.float32)[None, :]
    return activations.residual_gate(s, b, gate, n.op.temperature, n.op.floor)


# Standard normal: at Muse Spark's temperature 0.3, u spans about -10..10, so
# a random model has gates near 0 and 1 and the floor binds for a few features.
INIT.register("residual_gate")({"gate": ("gate", 0)})
