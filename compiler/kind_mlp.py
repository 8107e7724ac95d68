"""Sharding, buffer, cost and constant rules of the dense MLP (ir/kind_mlp.py).

Sharding: the intermediate width split over the cores (gate and up by
columns, down by rows), so the output is a partial sum the next reader's
all-reduce completes. Buffers: none (its weights stream through the ring);
the values its code holds, and what a looped run of MLP layers adds
(``RUN_LOOP_VALUES``). Cost: its ring tiles through the MXU.
"""

from __future__ import annotations

from megakernel.compiler.cost import COST, vector_op_cost
from megakernel.compiler.layout import RUN_LOOP_VALUES
from megakernel.compiler.plan_buffers import BUFFERS, OpCtx, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_pass import SHARDING, LayerSharding, ShardRule, lane_split, on_axis
from megakernel.ir.graph import OpNode


def _mlp(ls: LayerSharding, node: OpNode):
    op = node.op
    ls.full(node, node.inputs[0])
    split = lane_split(op.intermediate, ls.cores)
    for pname, spec in op.params(ls.dtype).items():
        axis = 0 if pname == "down" else 1
        ls.param(node, pname, spec.shape, (on_axis(split, axis),), "ring",
                 "rows of intermediate" if axis == 0 else "columns of intermediate")
    return ls.partial


SHARDING.register("mlp")(ShardRule(_mlp))


# A stack looping over a run of equal dense-MLP layers holds more values:
# measured (libtpu 0.0.51) against the same bodies unrolled, +1.04 MiB on
# qwen3.5-27b/8 (2.30 MiB held, was 1.26) and +0.89 on gemma-3-1b/1 (2.15,
# was 1.26); without this term those run kernels compiled +0.70
# (qwen3.5-27b/8), +0.71 (at 4 steps per call) and +0.96 MiB (gemma-3-1b/1)
# above their plans. qwen3-next-80b-a3b/8, whose run's layers have a MoE
# instead, held only +0.14 (-0.24 against its plan without the term), so MoE
# has no rule. Their mean, rounded; which values these are is not known (a
# fit, like the rest of layout's values model).
RUN_LOOP_VALUES.register("mlp")(800 * 1024)


@BUFFERS.register("mlp")
def _mlp_buffers(cx: OpCtx, node) -> OpLayout:
    # gate, up and their product, each [rows, intermediate on this core] f32
    width = cx.ss.param(f"{node.name}.up").shape[1]
    return OpLayout(values=3 * cx.rows_padded * width * 4)


COST.register("mlp")(vector_op_cost)
CONSTANTS.register("mlp")(lambda op: {})
