"""The kernel's scratch buffers, ring tables and the code around the layer loops.

``plan_scratch`` turns the memory plan into the scratch list of the
generated module (names, pltpu shapes, ring segment tables, attention / MoE
geometries); ``prologue_lines`` / ``epilogue_lines`` are the kernel code before
the first stack (ring prologue, embedding gather, its all-reduce) and after the
last (final norm, LM head, distributed argmax).

Deviation from the plan, deliberately: the ring is declared
[num_banks, max tile rows, max tile cols] over all tiles (each tile DMA'd into
the top-left corner of its bank), per-layer vectors as [2, 1, n] (a leading
parity axis keeps their DMAs whole-tile), and the embedding gather moves
each token's aligned block of 8 (f32) / 16 (bf16) rows (a DMA at an
unaligned HBM row is rejected by Mosaic) and selects the row in VMEM. ``extra_vmem_bytes`` reports what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from megakernel.backends.pallas_tpu import pack
from megakernel.compiler.layout import padded_bytes, sublanes
from megakernel.ir.ops import Attention, MoE

JNP = {"float32": "jnp.float32", "bfloat16": "jnp.bfloat16", "int32": "jnp.int32"}


@dataclass
class Scratch:
    names: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unpack: list[str] = field(default_factory=list)
    geometry_lines: list[str] = field(default_factory=list)
    segments: list[dict] = field(default_factory=list)
    bank_shape: tuple[int, int, int] = (0, 0, 0)
    aux: list = field(default_factory=list)
    vmem_limit: int = 0
    vmem_bytes: int = 0

    sizes: dict = field(default_factory=dict)

    def vmem_bytes_of(self, prefix: str) -> int:
        return sum(b for n, b in self.sizes.items() if n.startswith(prefix)
                   or n.startswith("aux_" + prefix))

    def add(self, name, kind, shape, dtype=None):
        self.names.append(name)
        if kind == "dma":
            self.lines.append(f"pltpu.SemaphoreType.DMA({tuple(shape)})")
        else:
            self.lines.append(f"pltpu.VMEM({tuple(shape)}, {JNP[dtype]})")
            self.sizes[name] = padded_bytes(tuple(shape), dtype)
            self.vmem_bytes += self.sizes[name]


def aligned(t) -> bool:
    """Whether tile t can land in a corner of the main banks (Mosaic needs
    DMA slices along tiled dims aligned to (sublanes, 128))."""
    return (t.rows, t.cols) == t.view


def bank_rows_cols(tiles) -> tuple[int, int]:
    """[rows, cols] of one bank: tiles wider than ``cols`` are folded into
    column pieces stacked along rows (runtime.Stream._pieces); pick the width
    that makes the bank smallest (ties: wider, fewer DMAs)."""
    def rows_for(width):
        return max(t.view[0] * -(-t.view[1] // width) for t in tiles)

    widths = sorted({t.view[1] for t in tiles})
    best = min(widths, key=lambda w: (rows_for(w) * w, -w))
    return rows_for(best), best


def _tile_entry(ref: int, t, aux: list) -> dict:
    bank = 0 if aligned(t) else 1 + aux.index((t.rows, t.cols))
    return {"args": f"{ref}, {t.row0}, {t.rows}, {t.col0}, {t.cols}, bank={bank}",
            "note": f"{t.param}[{t.row0}:{t.row0 + t.rows}, {t.col0}:{t.col0 + t.cols}]"}


def plan_scratch(model, plan, ctxs) -> Scratch:
    mem, shard = plan.memory, plan.shard
    stream, n = mem.stream, shard.cores
    sc = Scratch()
    tiles = [t for st in stream.stacks for t in st.tiles] + list(stream.head)
    dtypes = {t.dtype for t in tiles}
    assert len(dtypes) == 1, dtypes
    (dt,) = dtypes
    main = [t for t in tiles if aligned(t)] or tiles
    sc.bank_shape = (stream.num_banks, *bank_rows_cols(main))
    sc.aux = list(dict.fromkeys((t.rows, t.cols) for t in tiles if not aligned(t)))
    for c in ctxs:
        sc.segments.append({"name": f"S{c.s}_TILES", "offset": c.stream.offset,
                            "count": c.stream.count, "layered": True,
                            "tiles": [_tile_entry(c.ring.index(t.param), t, sc.aux)
                                      for t in c.stream.tiles]})
    sc.segments.append({"name": "HEAD_TILES", "offset": stream.head_offset, "count": 1,
                        "layered": False, "tiles": [_tile_entry(0, t, sc.aux) for t in stream.head]})
    sc.add("banks", "vmem", sc.bank_shape, dt)
    for i, (rows, cols) in enumerate(sc.aux):
        sc.add(f"aux_banks_{i}", "vmem", (stream.num_banks, rows, cols), dt)
    sc.add("ring_sems", "dma", (stream.num_banks,))
    # Each token's row arrives inside its aligned block of `sublanes` rows.
    sc.add("embed_rows", "vmem", (mem.rows, sublanes(model.dtype.value),
                                  model.hidden_size), model.dtype.value)
    sc.add("embed_sem", "dma", (1,))
    sc.add("residual", "vmem", (mem.rows_padded, model.hidden_size), "float32")
    for c in ctxs:
        for i, name in enumerate(c.vectors):
            p = c.shard.param(name)
            sc.add(f"vec_s{c.s}_{i}", "vmem", (2, 1, p.shape[0]), p.dtype)
        sc.add(f"vec_sems_s{c.s}", "dma", (2, max(len(c.vectors), 1)))
    if n > 1:
        rp, h = mem.rows_padded, model.hidden_size
        if allreduce_algorithm(plan) == "one_shot":
            sc.add("ar_slots", "vmem", (2, n, rp, h), "float32")
            sc.add("ar_send_sems", "dma", (2, n))
            sc.add("ar_recv_sems", "dma", (2, n))
        else:   # rs_ag: staging copy of the partial + scatter and gather slots
            sc.add("ar_stage", "vmem", (2, rp, h), "float32")
            sc.add("ar_rs_slots", "vmem", (2, n, rp, h // n), "float32")
            sc.add("ar_ag_slots", "vmem", (2, n, rp, h // n), "float32")
            sc.add("ar_send_sems", "dma", (2, 2, n))
            sc.add("ar_recv_sems", "dma", (2, 2, n))
        sc.add("am_values", "vmem", (n, rp, 128), "float32")
        sc.add("am_indices", "vmem", (n, rp, 128), "int32")
        sc.add("am_sems", "dma", (2, 2, n))
    _op_scratch(model, plan, ctxs, sc)
    # The compiler's limit is the whole VMEM: the plan's reserve (capacity -
    # budget) is left for Mosaic's internal scratch and spills, so it must not
    # be withheld from the compiler too.
    sc.vmem_limit = int(plan.target.vmem_bytes)
    return sc


def _op_scratch(model, plan, ctxs, sc: Scratch) -> None:
    """Geometries and scratch of the colleague-owned attention / MoE ops."""
    from megakernel.backends.pallas_tpu import attention as attn_lib

    req, mem = plan.request, plan.memory
    offset = len(sc.names)
    for c in ctxs:
        for n in c.layer.nodes:
            if isinstance(n.op, Attention):
                kv = next(k for k in mem.kv if k.stack == c.s and k.node == n.name)
                _, q_l, kv_l, _ = next(h for h in c.shard.heads if h[0] == n.name)
                a = n.op
                args = (req.batch, req.tokens, mem.rows_padded, q_l, kv_l, a.head_dim,
                        kv.kv_tile, model.max_seq_len, a.softmax_scale, a.sliding_window)
                g = attn_lib.AttentionGeometry(*args, model.dtype.jnp)
                name = f"ATTN_S{c.s}_{n.name}"
                sc.geometry_lines.append(
                    f"{name} = attn_lib.AttentionGeometry({', '.join(map(repr, args))}, "
                    f"{JNP[model.dtype.value]})")
                count = len(attn_lib.scratch_shapes(g))
                sc.extra.append(f"shapes += attn_lib.scratch_shapes({name})")
                sc.unpack.append(f"attn_s{c.s}_{n.name} = scratch[{offset}:{offset + count}]")
                offset += count
            elif isinstance(n.op, MoE):
                offset = _moe_scratch(model, plan, c, n, sc, offset)


def _moe_scratch(model, plan, c, n, sc: Scratch, offset: int) -> int:
    from megakernel.backends.pallas_tpu import moe as moe_lib

    _, ep, tp, local, width = next(e for e in c.shard.experts if e[0] == n.name)
    es = next(e for e in plan.memory.experts if e.stack == c.s and e.node == n.name)
    op, mem = n.op, plan.memory
    args = (mem.rows, mem.rows_padded, op.hidden, op.num_experts, local, width, op.top_k,
            op.scoring.value, op.correction_bias, op.renormalize, op.routed_scaling,
            op.activation.value, es.slots)
    g = moe_lib.MoEGeometry(*args, model.dtype.jnp, es.chunk)
    name = f"MOE_S{c.s}_{n.name}"
    sc.geometry_lines.append(f"{name} = moe_lib.MoEGeometry({', '.join(map(repr, args))}, "
                             f"{JNP[model.dtype.value]}, {es.chunk})")
    count = len(moe_lib.scratch_shapes(g))
    sc.extra.append(f"shapes += moe_lib.scratch_shapes({name})")
    sc.unpack.append(f"moe_s{c.s}_{n.name} = scratch[{offset}:{offset + count}]")
    return offset + count


def allreduce_algorithm(plan) -> str | None:
    spec = next((s for s in plan.collectives.specs if s.kind == "all_reduce"), None)
    return spec.algorithm if spec else None


def allreduce_call(plan, x: str, parity: str, site: str) -> str:
    """The generated all-reduce of variable ``x`` at one site."""
    if allreduce_algorithm(plan) == "one_shot":
        return (f"{x} = rt.all_reduce({x}, ar_slots, ar_send_sems, ar_recv_sems, "
                f"{parity}, me, NUM_CORES)  # {site}")
    return (f"{x} = rt.all_reduce_rs_ag({x}, ar_stage, ar_rs_slots, ar_ag_slots, "
            f"ar_send_sems, ar_recv_sems, {parity}, me, NUM_CORES)  # {site}")


def prologue_lines(model, plan, ctxs, sc: Scratch) -> list[str]:
    n = plan.shard.cores
    refs = [f"({''.join(f's{c.s}_{pack.ident(p)}, ' for p in c.ring)})" for c in ctxs]
    refs.append("(embed,)" if plan.shard.tied else "(lm_head,)")
    aux = "".join(f"aux_banks_{i}, " for i in range(len(sc.aux)))
    lines = ["me = jax.lax.axis_index('x')" if n > 1 else "me = 0",
             "pos = rt.positions(start_pos, ROWS_PADDED, BATCH, TOKENS)",
             f"stream = rt.Stream(banks, ring_sems, NUM_BANKS, SEGMENTS, ({', '.join(refs)},), ({aux}), "
             "sync=SYNCHRONISED)",
             "stream.prologue()   # first NUM_BANKS tiles of the step in flight"]
    for c in ctxs:
        for _, ep, tp, _, _ in c.shard.experts:
            lines.append(f"expert_base_s{c.s}_{c.shard.experts[0][0]} = (me // {tp}) % {ep}")
    if n > 1:
        lines.append("rt.barrier(me, NUM_CORES)   # peers are in the kernel before remote writes")
    lines += ["# node: embed",
              "x = rt.gather_embedding(tokens, embed, embed_rows, embed_sem, me, VOCAB_STRIDE, "
              "ROWS, ROWS_PADDED)"]
    site = next((s for s in plan.collectives.sites if s.name == "embed.allreduce"), None)
    if site is not None:
        lines.append(allreduce_call(plan, "x", str(site.parity()), site.name))
    return lines + ["residual[...] = x", ""]


def epilogue_lines(model, plan) -> list[str]:
    norm, n = model.final_norm, plan.shard.cores
    lines = ["# node: final_norm",
             f"xn = rt.rmsnorm(residual[...], final_norm[...].astype(jnp.float32), "
             f"dim={norm.dim}, eps={norm.eps!r}, offset={norm.offset})",
             "# node: lm_head",
             "valid = jnp.clip(VOCAB_SIZE - me * VOCAB_STRIDE, 0, VOCAB_STRIDE)",
             f"m, idx = rt.lm_head(stream, {len(plan.shard.stacks)}, xn, {plan.shard.tied}, "
             "logits, valid, me * VOCAB_STRIDE)"]
    if n > 1:
        lines.append("m, idx = rt.exchange_argmax(m, idx, am_values, am_indices, am_sems, me, "
                     "NUM_CORES)")
    return lines + ["next_token[...] = jnp.broadcast_to(idx, (ROWS_PADDED, 128))"]


def extra_vmem_bytes(plan, sc: Scratch) -> int:
    """Declared ring bytes beyond the plan's num_banks * bank_bytes."""
    stream = plan.memory.stream
    return sc.vmem_bytes_of("banks") - stream.num_banks * stream.bank_bytes
