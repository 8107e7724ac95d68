"""Per-kind sharding rules: propagate a split state through a layer's dataflow.

After ``layer_rules``: each tensor of the layer is replicated ("rep"), split
along its feature axis (a ``Split``), or a partial sum ("partial"); each
weight has its splits; wherever an op needs the full value of a partial sum
(a norm, a residual add next to a replicated tensor, a projection, a
nonlinearity) a ``Reduction`` (an all-reduce site) sits between that tensor's
producer and its first such consumer, and the tensor is replicated after it.

Two passes, each a rule per op kind from ``SHARDING``:
  * backward, ``want``: the split each op would like its inputs to have. The
    attention op wants its q/k/v split by heads; per-head ops (rope, a
    per-head norm) pass that wish on; a projection adopts it as its column
    split. So any graph of the IR's kinds is sharded by the same few rules,
    never by op names.
  * forward, ``forward``: the state of each op's output from its inputs'.

The records are in compiler/shard_records.py, the pass and the ``SHARDING``
registry in compiler/shard_pass.py, each kind's rule in its
compiler/kind_*.py; the two every layer is made of, the projection
(``linear``) and the residual ``add``, are here, and the names kind modules
use are re-exported.
"""

from __future__ import annotations

from megakernel.compiler.shard_pass import (SHARDING, LayerSharding, ShardRule,  # noqa: F401
                                            State, _no_wish, _pass_wish, _width, lane_split,
                                            layer_rules, on_axis)
from megakernel.compiler.shard_records import (PARTIAL, REP, ParamShard,  # noqa: F401
                                               Reduction, Split, StateShard, _source)
from megakernel.errors import ShardingError
from megakernel.ir.graph import OpNode


# ---- rules -----------------------------------------------------------------

def _linear_want(ls: LayerSharding, node: OpNode, out_want):
    return (None,)


def _linear(ls: LayerSharding, node: OpNode):
    op = node.op
    shape = (op.in_features, op.out_features)
    s = ls.full(node, node.inputs[0])
    if isinstance(s, Split):                      # row-parallel: input features are split
        if s.parts != ls.cores:
            raise ShardingError("row-parallel projection reads a tensor replicated "
                                f"on {s.div} cores; its partial sums would repeat",
                                path="weight")
        ls.param(node, "weight", shape, (on_axis(s, 0),), "ring", "rows (input heads)")
        if op.bias:
            ls.param(node, "bias", (op.out_features,), (), "vector",
                     "replicated, added once after the all-reduce")
        return ls.partial
    want = ls.wants.get(node.outputs[0])
    if want is None and op.split_rows and ls.cores > 1:
        # row-parallel on a whole input: each core reads its slice of it (the
        # kernel cuts it locally) and streams 1/N of the rows; a partial sum
        rows = lane_split(op.in_features, ls.cores)
        ls.param(node, "weight", shape, (on_axis(rows, 0),), "ring",
                 "rows (a local slice of the whole input)")
        if op.bias:
            ls.param(node, "bias", (op.out_features,), (), "vector",
                     "replicated, added once after the all-reduce")
        return ls.partial
    if want is None:                              # nobody wants it split: keep it whole
        ls.param(node, "weight", shape, (), "ring", "replicated")
        if op.bias:
            ls.param(node, "bias", (op.out_features,), (), "vector", "replicated")
        return REP
    ls.param(node, "weight", shape, (on_axis(want, 1),), "ring", "columns (heads)")
    if op.bias:
        ls.param(node, "bias", (op.out_features,), (on_axis(want, 0),), "vector",
                 "columns (heads)")
    return want


SHARDING.register("linear")(ShardRule(_linear, _linear_want))


def _add(ls: LayerSharding, node: OpNode):
    states = [ls.state[t] for t in node.inputs]
    if all(s == PARTIAL for s in states):
        return PARTIAL                            # a sum of partial sums stays partial
    states = [ls.full(node, t) for t in node.inputs]
    if any(s != states[0] for s in states):
        raise ShardingError(f"adds tensors held differently across cores: {states}",
                            path="inputs")
    return states[0]


SHARDING.register("add")(ShardRule(_add))


