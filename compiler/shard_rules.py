"""Per-layer sharding rules: propagate a split state through a layer's dataflow.

After ``layer_rules``: each tensor of the layer is replicated, split along its
feature axis (a ``Split``), or a partial sum; each weight has its splits; each
partial sum read by a residual add is a ``Reduction`` (an all-reduce site).
The state flows forward in node order, so any graph built from the IR's op
kinds is handled by the same few rules, not by op names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from megakernel.compiler.layout import LANES, dtype_name, round_up
from megakernel.errors import ShardingError, error_context
from megakernel.ir.graph import Layer, Model
from megakernel.ir.ops import MLP, Add, Attention, Linear, MoE, RMSNorm, Rope
from megakernel.ir.types import DType


@dataclass(frozen=True)
class Split:
    """``axis`` cut into ``parts`` slices of ``stride`` entries (the last may be
    short), zero-padded to ``padded``; core c holds slice (c // div) % parts, so
    ``div`` > 1 means neighbouring cores hold the same slice (replication)."""

    axis: int
    parts: int
    div: int
    stride: int
    padded: int

    def part(self, core: int) -> int:
        return (core // self.div) % self.parts


def legal_core_counts(model: Model) -> list[int]:
    """Core counts in 1..32 with a legal head split for every attention op."""
    ops = {n.op for layer in model.layers for n in layer.attention_nodes()}
    return [c for c in range(1, 33) if all(
        a.num_q_heads % c == 0 and (a.num_kv_heads % c == 0 or c % a.num_kv_heads == 0)
        for a in ops)]


def _head_splits(node, cores: int, legal: list[int]) -> tuple[Split, Split, int]:
    a: Attention = node.op
    with error_context(node.name):
        if a.num_q_heads % cores:
            raise ShardingError(f"num_q_heads={a.num_q_heads} cannot be split evenly over "
                                f"{cores} TensorCores", path="num_q_heads",
                                hint=f"use devices in {legal}")
        if a.num_kv_heads % cores and cores % a.num_kv_heads:
            raise ShardingError(f"num_kv_heads={a.num_kv_heads} neither splits over nor "
                                f"replicates evenly onto {cores} TensorCores",
                                path="num_kv_heads", hint=f"use devices in {legal}")
    d = a.head_dim
    q = Split(0, cores, 1, a.num_q_heads // cores * d, a.num_q_heads // cores * d)
    if a.num_kv_heads >= cores:
        kv, rep = Split(0, cores, 1, a.num_kv_heads // cores * d, a.num_kv_heads // cores * d), 1
    else:
        rep = cores // a.num_kv_heads
        kv = Split(0, a.num_kv_heads, rep, d, d)
    return q, kv, rep


def _lane_split(full: int, parts: int, div: int = 1) -> Split:
    """An even split of a width that may be zero-padded (MLP/expert widths)."""
    stride = -(-full // parts)
    return Split(0, parts, div, stride, round_up(stride, LANES))


def _on(split: Split, axis: int) -> Split:
    return replace(split, axis=axis)


def layer_rules(layer: Layer, dtype: DType, cores: int, ep: int, legal: list[int]):
    """(params, widths, reductions, heads, experts) of one layer; see StackShard."""
    from megakernel.compiler.shard import ParamShard, Reduction

    dt = dtype_name(dtype)
    producer = {t: n for n in layer.nodes for t in n.outputs}
    # Which linear feeds which attention input: walk back through per-head ops.
    feeds: dict[str, Split] = {}
    heads, attn_out = [], {}
    for node in layer.attention_nodes():
        q, kv, rep = _head_splits(node, cores, legal)
        a = node.op
        heads.append((node.name, a.num_q_heads // cores, max(a.num_kv_heads // cores, 1), rep))
        attn_out[node.name] = q
        for tensor, split in zip(node.inputs, (q, kv, kv)):
            src = producer.get(tensor)
            while src is not None and isinstance(src.op, (Rope, RMSNorm)):
                src = producer.get(src.inputs[0])
            if src is not None and isinstance(src.op, Linear):
                feeds[src.name] = split

    state: dict[str, "Split | str"] = {layer.input: "rep"}
    params, reductions, experts = [], [], []
    partial = "partial" if cores > 1 else "rep"

    def param(node, pname, shape, splits, channel, role, pdt=dt):
        params.append(ParamShard(f"{node.name}.{pname}", tuple(shape), pdt, tuple(splits),
                                 channel, role))

    for node in layer.nodes:
        op, ins = node.op, [state[t] for t in node.inputs]
        with error_context(node.name):
            if isinstance(op, RMSNorm):
                s = ins[0]
                if s == "partial" or (isinstance(s, Split) and s.stride % op.dim):
                    raise ShardingError(f"dim={op.dim} norm reads a tensor that is split "
                                        f"or partial across cores", path="dim")
                param(node, "weight", (op.dim,), (), "vector", "replicated")
                out = s
            elif isinstance(op, Rope):
                out = ins[0]
            elif isinstance(op, Attention):
                out = attn_out[node.name]
            elif isinstance(op, Linear):
                out = _linear(node, ins[0], feeds.get(node.name), cores, param, partial)
            elif isinstance(op, Add):
                for t, s in zip(node.inputs, ins):
                    if s == "partial":
                        reductions.append(Reduction(t, producer[t].name, node.name))
                out = "rep" if "partial" in ins else ins[0]
            elif isinstance(op, MLP):
                split = _lane_split(op.intermediate, cores)
                for pname, spec in op.params(dtype).items():
                    axis = 0 if pname == "down" else 1
                    param(node, pname, spec.shape, (_on(split, axis),), "ring",
                          "rows of intermediate" if axis == 0 else "columns of intermediate")
                out = partial
            elif isinstance(op, MoE):
                _moe(node, dtype, cores, ep, param, experts)
                out = partial
            else:
                raise ShardingError(f"no sharding rule for op kind {op.kind!r}", path="kind")
        for t in node.outputs:
            state[t] = out
    widths = tuple((t.name, _width(t.shape[0], state.get(t.name, "rep"))) for t in layer.tensors)
    return tuple(params), widths, tuple(reductions), tuple(heads), tuple(experts)


def _width(full: int, s) -> int:
    return s.padded if isinstance(s, Split) else full


def _linear(node, s, feeds: Split | None, cores, param, partial):
    op: Linear = node.op
    shape = (op.in_features, op.out_features)
    if isinstance(s, Split):                      # row-parallel: input features are split
        if s.parts != cores:
            raise ShardingError("row-parallel projection reads a tensor replicated "
                                f"on {s.div} cores; its partial sums would repeat", path="weight")
        param(node, "weight", shape, (_on(s, 0),), "ring", "rows (input heads)")
        if op.bias:
            param(node, "bias", (op.out_features,), (), "vector",
                  "replicated, added once after the all-reduce")
        return partial
    if s == "partial":
        raise ShardingError("reads a partial sum before any all-reduce", path="inputs")
    if feeds is None:                             # feeds no attention: keep it whole
        param(node, "weight", shape, (), "ring", "replicated")
        if op.bias:
            param(node, "bias", (op.out_features,), (), "vector", "replicated")
        return "rep"
    param(node, "weight", shape, (_on(feeds, 1),), "ring", "columns (heads)")
    if op.bias:
        param(node, "bias", (op.out_features,), (_on(feeds, 0),), "vector", "columns (heads)")
    return feeds


def _moe(node, dtype, cores, ep, param, experts):
    op: MoE = node.op
    dt = dtype_name(dtype)
    tp = cores // ep
    per = Split(0, ep, tp, op.num_experts // ep, op.num_experts // ep)
    width = _lane_split(op.expert_intermediate, tp)
    role = f"experts over {ep} groups, intermediate over {tp} cores"
    param(node, "router", (op.hidden, op.num_experts), (), "ring", "replicated")
    if op.correction_bias:
        param(node, "router_bias", (op.num_experts,), (), "vector", "replicated", "float32")
    h, e, i = op.hidden, op.num_experts, op.expert_intermediate
    param(node, "experts_gate", (e, h, i), (per, _on(width, 2)), "experts", role)
    param(node, "experts_up", (e, h, i), (per, _on(width, 2)), "experts", role)
    param(node, "experts_down", (e, i, h), (per, _on(width, 1)), "experts", role)
    if op.num_shared_experts:
        s = _lane_split(op.shared_width, cores)
        param(node, "shared_gate", (h, op.shared_width), (_on(s, 1),), "ring", "columns of shared")
        param(node, "shared_up", (h, op.shared_width), (_on(s, 1),), "ring", "columns of shared")
        param(node, "shared_down", (op.shared_width, h), (_on(s, 0),), "ring", "rows of shared")
    experts.append((node.name, ep, tp, op.num_experts // ep, width.padded))
