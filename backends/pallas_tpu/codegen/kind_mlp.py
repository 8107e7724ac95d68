"""Emitter of the dense MLP: gate and up (or up alone) and down through the
weight ring (``StackCtx.linear``), the activation between them."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v


@EMITTERS.register("mlp")
def _mlp(c: StackCtx, n) -> list[str]:
    op, x, out = n.op, v(n.inputs[0]), n.outputs[0]
    width = c.shard.param(f"{n.name}.up").shape[1]
    act = literal(op.activation.value)
    if op.gated:      # stream order: gate, up, down
        lines = [c.linear("gate", x, f"{n.name}.gate", width),
                 c.linear("up", x, f"{n.name}.up", width),
                 f"act = rt.activation({act}, gate) * up"]
    else:
        lines = [c.linear("up", x, f"{n.name}.up", width), f"act = rt.activation({act}, up)"]
    lines.append(c.linear(v(out), "act", f"{n.name}.down", c.shard.width(out)))
    return lines
