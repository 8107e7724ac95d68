"""Reference function and weight init of the dense MLP (ir/kind_mlp.py)."""

from __future__ import annotations

from megakernel.models.reference import REFERENCE, activation, gated_ffn, matmul
from megakernel.models.weights import INIT


def mlp(op, p, x):
    if op.gated:
        return gated_ffn(op.activation, x, p["gate"], p["up"], p["down"])
    return matmul(activation(op.activation, matmul(x, p["up"])), p["down"])


REFERENCE.register("mlp")(lambda n, p, xs, ctx: mlp(n.op, p, xs[0]))
INIT.register("mlp")({"gate": ("matrix", 0), "up": ("matrix", 0), "down": ("residual", 0)})
