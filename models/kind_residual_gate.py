"""Reference and weight init of the residual gate (ir/kind_residual_gate.py):
alpha * s + beta * b in f32 from the f32 gate vector (the formula is
megakernel/activations.py's, which the kernel calls too; tests/models checks
it against numpy)."""

from __future__ import annotations

import jax.numpy as jnp

from megakernel import activations
from megakernel.models.reference import REFERENCE, WIRE_TOLERANCE
from megakernel.models.weights import INIT


@REFERENCE.register("residual_gate")
def _residual_gate(n, p, xs, ctx):
    s, b = xs
    gate = p["gate"].astype(jnp.float32)[None, :]
    return activations.residual_gate(s, b, gate, n.op.temperature, n.op.floor)


# Muse Spark's blocks add unit-rms branches (the all-reduced o_proj and MLP
# sums, through parameter-free post norms) at O(1) weight into a stream the
# gates keep at unit scale, so the bf16 wire's rounding of those sums reaches
# the stream about whole. Measured (2026-12-05, bf16, 2 steps, kernel vs
# reference): the 4-layer card of tests/muse_like.py on 2 cores (8 draws,
# batch 1-4, 1-2 tokens) logits <= 3.4e-2 of the scale, state <= 2.0e-2; on
# 4 cores (4 draws) 1.7e-2 and 1.7e-2; on an f32 wire the same plans <= 2.7e-3
# and one bf16 ulp of the state. Without gates (free post norms only) state
# 1.7e-2, without post norms 3.7e-3. 20 model_configs draws with residual
# gates on 2 and 4 cores: <= 1.4e-2 and 2.3e-2. So 4e-2 (bounds 6e-2 and 4.8e-2).
WIRE_TOLERANCE.register("residual_gate")(4e-2)


# Standard normal: at Muse Spark's temperature 0.3, u spans about -10..10, so
# a random model has gates near 0 and 1 and the floor binds for a few features.
INIT.register("residual_gate")({"gate": ("gate", 0)})
