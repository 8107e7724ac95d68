"""Emitter of RMSNorm: ``rt.rmsnorm`` with its weight vector."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v


@EMITTERS.register("rmsnorm")
def _rmsnorm(c: StackCtx, n) -> list[str]:
    op = n.op
    return [f"{v(n.outputs[0])} = rt.rmsnorm({v(n.inputs[0])}, {c.vec(n.name + '.weight')}, "
            f"dim={literal(op.dim)}, eps={literal(op.eps)}, offset={literal(op.offset)})"]
