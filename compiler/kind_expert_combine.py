"""Sharding, buffer, cost and constant rules of the routed experts' combine
(ir/kind_expert_combine.py).

Sharding: it reads both inputs whole. The slots come from a MoE op split
over cores (experts over ``ep`` groups, each expert's FFN width over ``tp``)
as a partial sum, so the sharding pass all-reduces them first
([rows, top_k x hidden] on the wire: the plan's one collective that is wider
than the hidden size, folded into its slots, compiler/schedule_collectives.py);
the weights are replicated already. The norm vector is replicated, the
output replicated: every core computes the same [rows, hidden].
Cost: vector work on the slots (the norm's square, mean, scale and the
weighted sum, about 6 f32 ops per slot element) at the VPU's rate; no
buffers, no constants.
"""

from __future__ import annotations

from megakernel.compiler.cost import COST
from megakernel.compiler.kind_elementwise import both_whole
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_rules import SHARDING, LayerSharding, ShardRule

# f32 vector ops per slot element: square, mean's add, the rms scale, the
# norm weight (or the input scaling and its rounding), the routing weight, the sum.
OPS_PER_ELEMENT = 6


def _combine(ls: LayerSharding, node):
    state = both_whole(ls, node)
    if node.op.norm:
        ls.param(node, "weight", (node.op.hidden,), (), "vector", "replicated")
    return state


def _combine_cost(cx, node, ph: dict) -> dict:
    op = node.op
    work = cx.memory.rows_padded * op.top_k * op.hidden * OPS_PER_ELEMENT
    return dict(ph, overhead_s=ph["overhead_s"] + work / cx.target.constants.vpu_f32_ops_per_s)


SHARDING.register("expert_combine")(ShardRule(_combine))
BUFFERS.register("expert_combine")(lambda cx, node: OpLayout())
COST.register("expert_combine")(_combine_cost)
CONSTANTS.register("expert_combine")(lambda op: {})
