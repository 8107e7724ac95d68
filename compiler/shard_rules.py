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
registry in compiler/shard_pass.py; the core kinds' rules are here (others
in compiler/kind_*.py), and everything moved is re-exported here.
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

def _rmsnorm(ls: LayerSharding, node: OpNode):
    op, s = node.op, ls.full(node, node.inputs[0])
    if isinstance(s, Split) and s.stride % op.dim:
        raise ShardingError(f"dim={op.dim} norm reads a tensor split over cores in "
                            f"slices of {s.stride} features, which cut its groups",
                            path="dim", hint="use a core count that keeps whole groups")
    ls.param(node, "weight", (op.dim,), (), "vector", "replicated")
    return s


SHARDING.register("rmsnorm")(ShardRule(_rmsnorm, _pass_wish))
SHARDING.register("rope")(ShardRule(lambda ls, node: ls.full(node, node.inputs[0]),
                                    _pass_wish))


def head_splits(op, cores: int) -> tuple[Split, Split, int]:
    """(q split, kv split, kv replication) of an attention op over ``cores``."""
    if op.num_q_heads % cores:
        raise ShardingError(f"num_q_heads={op.num_q_heads} cannot be split evenly over "
                            f"{cores} TensorCores", path="num_q_heads")
    if op.num_kv_heads % cores and cores % op.num_kv_heads:
        raise ShardingError(f"num_kv_heads={op.num_kv_heads} neither splits over nor "
                            f"replicates evenly onto {cores} TensorCores", path="num_kv_heads")
    d = op.head_dim
    q = Split(0, cores, 1, op.num_q_heads // cores * d, op.num_q_heads // cores * d)
    if op.num_kv_heads >= cores:
        return q, Split(0, cores, 1, op.num_kv_heads // cores * d,
                        op.num_kv_heads // cores * d), 1
    rep = cores // op.num_kv_heads
    return q, Split(0, op.num_kv_heads, rep, d, d), rep


def _attention_want(ls: LayerSharding, node: OpNode, out_want):
    q, kv, _ = head_splits(node.op, ls.cores)
    return (q, kv, kv)


def _attention(ls: LayerSharding, node: OpNode):
    op = node.op
    q, kv, rep = head_splits(op, ls.cores)
    for t, want in zip(node.inputs, (q, kv, kv)):
        if ls.state[t] != want:
            raise ShardingError(f"input {t!r} is {ls.state[t]!r} across cores, expected "
                                "split by heads: it must come from a projection through "
                                "per-head ops only", path="inputs")
    kv_local = max(op.num_kv_heads // ls.cores, 1)
    ls.heads.append((node.name, op.num_q_heads // ls.cores, kv_local, rep))
    if op.sinks:                                  # one logit per query head: split like q
        per = op.num_q_heads // ls.cores
        ls.param(node, "sinks", (op.num_q_heads,), (Split(0, ls.cores, 1, per, per),),
                 "vector", "query heads")
    # K/V [B, S, Hkv, D]: the core's kv heads (axis 2), merged into lanes.
    heads = Split(2, kv.parts, kv.div, kv_local, kv_local)
    for name, spec in op.state(1, 1, ls.dtype).items():
        ls.states.append(StateShard(node.name, name, spec.access, (heads,), merge=2))
    return q


SHARDING.register("attention")(ShardRule(_attention, _attention_want,
                                         lambda ls, node: head_splits(node.op, ls.cores)[0]))


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


def _moe(ls: LayerSharding, node: OpNode):
    op, ep = node.op, ls.ep
    ls.full(node, node.inputs[0])
    tp = ls.cores // ep
    per = Split(0, ep, tp, op.num_experts // ep, op.num_experts // ep)
    width = lane_split(op.expert_intermediate, tp)
    role = f"experts over {ep} groups, intermediate over {tp} cores"
    h, e, i = op.hidden, op.num_experts, op.expert_intermediate
    ls.param(node, "router", (h, e), (), "ring", "replicated")
    if op.correction_bias:
        ls.param(node, "router_bias", (e,), (), "vector", "replicated", "float32")
    if op.router_logit_bias:
        ls.param(node, "router_logit_bias", (e,), (), "vector", "replicated")
    ls.param(node, "experts_gate", (e, h, i), (per, on_axis(width, 2)), "experts", role)
    ls.param(node, "experts_up", (e, h, i), (per, on_axis(width, 2)), "experts", role)
    ls.param(node, "experts_down", (e, i, h), (per, on_axis(width, 1)), "experts", role)
    if op.expert_bias:
        # Small [experts, width] tables, whole per layer: the kernel picks an
        # expert's row by a masked sum, and adds the down bias on one core of
        # each intermediate split only.
        for part in ("gate", "up"):
            ls.param(node, f"experts_{part}_bias", (e, i), (per, on_axis(width, 1)), "vector",
                     role)
        ls.param(node, "experts_down_bias", (e, h), (per,), "vector",
                 f"experts over {ep} groups; added once per group")
    if op.num_shared_experts:
        s = lane_split(op.shared_width, ls.cores)
        ls.param(node, "shared_gate", (h, op.shared_width), (on_axis(s, 1),), "ring",
                 "columns of shared")
        ls.param(node, "shared_up", (h, op.shared_width), (on_axis(s, 1),), "ring",
                 "columns of shared")
        ls.param(node, "shared_down", (op.shared_width, h), (on_axis(s, 0),), "ring",
                 "rows of shared")
        if op.shared_expert_gate:   # scales a partial sum per token: still a partial sum
            ls.param(node, "shared_expert_gate", (h,), (), "vector", "replicated")
    ls.experts.append((node.name, ep, tp, op.num_experts // ep, width.padded))
    return ls.partial


SHARDING.register("moe")(ShardRule(_moe))
