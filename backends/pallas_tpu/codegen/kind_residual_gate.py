"""Emitter of the residual gate (ir/kind_residual_gate.py): one line, on the
residual and branch values and the layer's f32 gate vector; every core holds
both inputs whole (compiler/kind_residual_gate.py), so no collective."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v


@EMITTERS.register("residual_gate")
def _residual_gate(c: StackCtx, n) -> list[str]:
    s, b = (v(t) for t in n.inputs)
    return [f"{v(n.outputs[0])} = rt.residual_gate({s}, {b}, {c.vec(n.name + '.gate')}, "
            f"temperature={literal(n.op.temperature)}, floor={literal(n.op.floor)})"]
