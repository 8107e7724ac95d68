"""Emitter of RMSNorm: ``rt.rmsnorm`` with its weight vector (None for a
parameter-free norm, which reads no vector and so also serves the model's
embed ops, emitted without a stack)."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v


@EMITTERS.register("rmsnorm")
def _rmsnorm(c: StackCtx, n) -> list[str]:
    op = n.op
    weight = c.vec(n.name + ".weight") if op.weight else "None"
    return [f"{v(n.outputs[0])} = rt.rmsnorm({v(n.inputs[0])}, {weight}, "
            f"dim={literal(op.dim)}, eps={literal(op.eps)}, offset={literal(op.offset)})"]
