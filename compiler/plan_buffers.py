"""The per-layer buffers of the memory plan: activations, op scratch, vectors.

After ``layer_buffers``: every tensor of every stack's layer lives in a VMEM
buffer of [rows, per-core width] f32. An elementwise op (norm, rope, residual
add) writes in place over its input when that input dies there, so the layer
input, the mid-layer residual and the layer output are one loop-carried
``residual`` buffer. Every op has the scratch it needs (accumulators, online
softmax state, KV tile double buffers, router and expert-slot buffers), and
every per-layer vector weight a [2, n] buffer indexed by layer parity.
"""

from __future__ import annotations

from megakernel.compiler.buffers import Buffer, Kind, Space
from megakernel.compiler.layout import LANES, padded_bytes, round_up, smem_bytes
from megakernel.ir.ops import MLP, Add, Attention, MoE, RMSNorm, Rope


class BufferTable:
    """Buffers by name; adding a name again widens its lifetime to the union,
    or, when the shape differs, files it under a stack-qualified name."""

    def __init__(self):
        self._by_name: dict[str, Buffer] = {}

    def add(self, b: Buffer, stack: int | None = None) -> str:
        old = self._by_name.get(b.name)
        if old is None:
            self._by_name[b.name] = b
            return b.name
        if (old.shape, old.dtype, old.space) == (b.shape, b.dtype, b.space):
            self._by_name[b.name] = Buffer(old.name, old.space, old.kind, old.shape, old.dtype,
                                           old.nbytes, min(old.first, b.first),
                                           max(old.last, b.last), old.note)
            return b.name
        assert stack is not None, f"buffer {b.name} declared twice with different shapes"
        renamed = Buffer(f"s{stack}.{b.name}", b.space, b.kind, b.shape, b.dtype, b.nbytes,
                         b.first, b.last, b.note)
        return self.add(renamed)

    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(self._by_name.values())


def _vmem(table, name, kind, shape, dtype, first, last, note="", stack=None) -> str:
    return table.add(Buffer(name, Space.VMEM, kind, tuple(shape), dtype,
                            padded_bytes(tuple(shape), dtype), first, last, note), stack)


_ELEMENTWISE = (RMSNorm, Rope, Add)


def layer_buffers(table, model, shard, request, points, kv, experts, rows_p) -> None:
    index = {p.label: p.index for p in points}
    n_vectors = 0
    for st, ss in zip(model.stacks, shard.stacks):
        layer, s = st.layer, ss.stack
        at = {n.name: index[f"s{s}.{n.name}"] for n in layer.nodes}
        last_use: dict[str, int] = {}
        for n in layer.nodes:
            for t in n.inputs:
                last_use[t] = max(last_use.get(t, -1), at[n.name])
        # Activations, elementwise ops writing in place over inputs that die there.
        buf_of = {layer.input: "residual"}
        span = {"residual": (0, len(points) - 1)}
        for n in layer.nodes:
            out, src = n.outputs[0], n.inputs[0]
            in_place = (isinstance(n.op, _ELEMENTWISE) and last_use.get(src) == at[n.name]
                        and ss.width(src) == ss.width(out))
            if out == layer.output:
                buf_of[out] = "residual"      # the final residual add lands in the carry
            else:
                buf_of[out] = buf_of[src] if in_place else f"act.{out}"
            first, last = span.get(buf_of[out], (at[n.name], at[n.name]))
            span[buf_of[out]] = (min(first, at[n.name]), max(last, last_use.get(out, at[n.name])))
        for name in dict.fromkeys(buf_of.values()):
            tensor = next(t for t, b in buf_of.items() if b == name)
            _vmem(table, name, Kind.ACTIVATION, (rows_p, ss.width(tensor)), "float32",
                  *span[name], "loop-carried residual stream" if name == "residual" else
                  f"tensor {tensor} (+ in-place successors)", stack=s)
        for n in layer.nodes:
            _op_scratch(table, n, ss, at[n.name], rows_p, request, kv, experts, s)
        for p in ss.params:
            if p.channel == "vector":
                _vmem(table, f"vec.{p.name}", Kind.LAYER_VECTORS, (2, *p.shape), p.dtype,
                      0, len(points) - 1, "[layer parity]; next layer's copy in flight",
                      stack=s)
                n_vectors += 1
    if n_vectors:
        table.add(Buffer("vec.sems", Space.SEMAPHORE, Kind.SEMAPHORES, (2, n_vectors),
                         "dma_semaphore", 0, 0, len(points) - 1, "[parity, vector]"))
    if kv:
        att = [p.index for p in points if p.node and any(k.node == p.node for k in kv)]
        for name, shape in (("kv.sems", (2, 2)), ("kv.write_sems", (2,))):
            table.add(Buffer(name, Space.SEMAPHORE, Kind.SEMAPHORES, shape, "dma_semaphore", 0,
                             min(att), max(att), "[k|v, buffer]" if len(shape) == 2 else "[k|v]"))


def _op_scratch(table, node, ss, p, rows_p, request, kv, experts, s) -> None:
    op, name = node.op, node.name
    if isinstance(op, Attention):
        _, q_l, kv_l, _ = next(h for h in ss.heads if h[0] == name)
        k = next(x for x in kv if x.stack == s and x.node == name)
        qrows = round_up(request.rows * q_l, 8)
        for part, shape in (("m", (qrows, LANES)), ("l", (qrows, LANES)), ("acc", (qrows, op.head_dim))):
            _vmem(table, f"{name}.{part}", Kind.SCRATCH, shape, "float32", p, p,
                  "online softmax, rows = (token, local q head)", s)
        group_rows = round_up(request.tokens * q_l // kv_l, 8)
        _vmem(table, f"{name}.scores", Kind.SCRATCH, (group_rows, k.kv_tile), "float32", p, p,
              "scores of one (sequence, kv head) against one KV tile", s)
        for part in ("k", "v"):
            _vmem(table, f"{name}.{part}_tiles", Kind.KV_TILES, (2, k.kv_tile, k.width), k.dtype,
                  p, p, f"double buffer of {k.kv_tile}-token cache tiles", s)
            _vmem(table, f"{name}.{part}_new", Kind.SCRATCH, (round_up(request.rows, 16), k.width),
                  k.dtype, p, p, "new rows, cast for the cache write", s)
    elif isinstance(op, MLP):
        width = ss.param(f"{name}.up").shape[1]
        parts = ("gate_acc", "up_acc") if op.gated else ("up_acc",)
        for part in parts:
            _vmem(table, f"{name}.{part}", Kind.SCRATCH, (rows_p, width), "float32", p, p,
                  "accumulates over K tiles", s)
    elif isinstance(op, MoE):
        e = next(x for x in experts if x.stack == s and x.node == name)
        f32 = "float32"
        for part, shape, dt in (("router_logits", (rows_p, op.num_experts), f32),
                                ("topk_ids", (rows_p, op.top_k), "int32"),
                                ("topk_weights", (rows_p, op.top_k), f32),
                                ("combine", (rows_p, e.experts_local), f32)):
            _vmem(table, f"{name}.{part}", Kind.ROUTER, shape, dt, p, p, "routing", s)
        for part, shape in (("gate_slots", (e.slots, e.hidden, e.chunk)),
                            ("up_slots", (e.slots, e.hidden, e.chunk)),
                            ("down_slots", (e.slots, e.chunk, e.hidden))):
            _vmem(table, f"{name}.{part}", Kind.EXPERT_SLOTS, shape, e.dtype, p, p,
                  f"slice n of the layer's expert fetches in slot n % {e.slots}", s)
        _vmem(table, f"{name}.expert_h", Kind.SCRATCH, (2, rows_p, e.chunk), f32, p, p,
              "gate | up outputs of one expert slice", s)
        if op.num_shared_experts:
            width = ss.param(f"{name}.shared_up").shape[1]
            _vmem(table, f"{name}.shared_acc", Kind.SCRATCH, (2, rows_p, width), f32, p, p,
                  "shared expert gate | up", s)
        for part, shape in (("expert_ids", (e.max_distinct,)), ("expert_count", (1,))):
            table.add(Buffer(f"{name}.{part}", Space.SMEM, Kind.SCALARS, shape, "int32",
                             smem_bytes(shape), p, p, "distinct local experts to fetch"), s)
        table.add(Buffer(f"{name}.slot_sems", Space.SEMAPHORE, Kind.SEMAPHORES, (e.slots, 3),
                         "dma_semaphore", 0, p, p, "[slot, gate|up|down]"), s)
