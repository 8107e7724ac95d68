"""Emitter of the routed experts' combine (ir/kind_expert_combine.py): one
call of the MoE library's ``moe_slots.combine`` on the all-reduced slots
(the collective the plan puts between the MoE op and this node is emitted
after the MoE op, stack_loop.py) and the slot weights."""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import LIBRARIES, literal
from megakernel.backends.pallas_tpu.codegen.emit import EMITTERS, StackCtx, v

# the MoE library's per-slot half, imported by kernels that combine slots
LIBRARIES.register("moe_slots")("moe_slots_lib")


@EMITTERS.register("expert_combine")
def _expert_combine(c: StackCtx, n) -> list[str]:
    op = n.op
    lib = c.library("moe_slots")
    slots, weights = (v(t) for t in n.inputs)
    norm = c.vec(n.name + ".weight") if op.norm else "None"
    return [f"{v(n.outputs[0])} = {lib}.combine({slots}, {weights}, {norm}, "
            f"top_k={literal(op.top_k)}, eps={literal(op.norm_eps)}, "
            f"input_scaled={literal(op.norm_input_scaled)}, offset={literal(op.norm_offset)}, "
            f"dtype={literal(c.model.dtype.value)})"]
