"""Sharding, buffer, cost and constant rules of the residual gate
(ir/kind_residual_gate.py).

Sharding: alpha * s + beta * b is linear in b, but s is held whole by every
core, so a partial b (o_proj's or the MLP's row-parallel sum) cannot stay
partial: alpha * s would be counted once per core. Both inputs are read
whole (a partial branch is all-reduced first, as a residual add next to a
replicated tensor is), and the gate vector is replicated: every core
computes the same [rows, hidden] result, vector work like a norm's. No
buffers, no constants; one vector op's cost.
"""

from __future__ import annotations

from megakernel.compiler.cost import COST, vector_op_cost
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.kind_elementwise import both_whole
from megakernel.compiler.shard_rules import SHARDING, LayerSharding, ShardRule


def _residual_gate(ls: LayerSharding, node):
    state = both_whole(ls, node)
    ls.param(node, "gate", (node.op.dim,), (), "vector", "replicated (f32)", "float32")
    return state


SHARDING.register("residual_gate")(ShardRule(_residual_gate))
BUFFERS.register("residual_gate")(lambda cx, node: OpLayout())
COST.register("residual_gate")(vector_op_cost)
CONSTANTS.register("residual_gate")(lambda op: {})
