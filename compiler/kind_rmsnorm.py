"""Sharding, buffer, cost and constant rules of RMSNorm (ir/ops.py).

Sharding: the norm reads its input whole, or split in slices that keep its
groups (a per-head norm over heads split by cores), passes the split its
reader wishes for on to its input and announces its input's; its weight,
if it has one, is replicated. It asks for
no buffers and no constants, and costs one vector op.
"""

from __future__ import annotations

from megakernel.compiler.cost import COST, vector_op_cost
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.shard_pass import SHARDING, LayerSharding, ShardRule, _pass_wish
from megakernel.compiler.shard_records import Split
from megakernel.errors import ShardingError
from megakernel.ir.graph import OpNode


def _rmsnorm(ls: LayerSharding, node: OpNode):
    op, s = node.op, ls.full(node, node.inputs[0])
    if isinstance(s, Split) and s.stride % op.dim:
        raise ShardingError(f"dim={op.dim} norm reads a tensor split over cores in "
                            f"slices of {s.stride} features, which cut its groups",
                            path="dim", hint="use a core count that keeps whole groups")
    if op.weight:           # a parameter-free norm has no vector to hold
        ls.param(node, "weight", (op.dim,), (), "vector", "replicated")
    return s


# A norm keeps its input's split, so it announces what its input's producer
# does: an output gate after a per-head norm of the attention output (Muse
# Spark) then wishes its projection split by heads, as without the norm.
SHARDING.register("rmsnorm")(ShardRule(_rmsnorm, _pass_wish,
                                       lambda ls, node: ls.announced(node.inputs[0])))


BUFFERS.register("rmsnorm")(lambda cx, node: OpLayout())
COST.register("rmsnorm")(vector_op_cost)
CONSTANTS.register("rmsnorm")(lambda op: {})
