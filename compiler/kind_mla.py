"""Sharding, buffer, cost and constant rules of multi-head latent attention.

Sharding: heads split evenly over the cores. The query projection's output is
split by heads (the MLA op wishes it so, as attention does), the kv_a
projection stays whole, so every core computes the same c_kv and k_pe and
keeps the whole latent cache: one replicated appended state per MLA layer.
W_UK and W_UV are split by heads and streamed through the ring; the output is
split by heads, so the output projection after it is row-parallel.

The kernel has two forms (backends/pallas_tpu/kernels/mla.py); ``form_costs`` models
both per layer and the buffer rule takes the cheaper, unless the request's
``mla_form`` override fixes it. Matmuls are charged as the rest of the cost
model charges them: weight-push bound, at least ``mxu_push_rows`` LHS rows.
Both forms read the same latent tiles, so only their compute differs:

  absorbed  q~ = q_nope W_UK and o = c^ W_UV once per step (heads x [RP rows]),
            then per latent tile one [heads*RP, L] x [L, St] score matmul and
            one [heads*RP, St] x [St, R] value matmul for all heads together;
  expanded  per tile and head, K = tile W_UK_h^T and V = tile W_UV_h
            ([St rows] x [R, dn + dv]), then [RP, dn+dr] x [., St] scores and
            [RP, St] x [St, dv] values.

The absorbed form pays the expansion once per step, the expanded one once per
tile and head; with one or two heads on a core and a context of one or two
tiles, the expanded form's smaller per-tile matmuls win.
"""

from __future__ import annotations

from megakernel.compiler.buffers import Kind
from megakernel.compiler.cost import COST
from megakernel.compiler.plan_buffers import BUFFERS, OpLayout
from megakernel.compiler.pipeline import CHOICE_NOTES
from megakernel.compiler.plan_operands import CONSTANTS
from megakernel.compiler.request import KIND_OVERRIDES
from megakernel.compiler.stepping import STEPPING, Stepping
from megakernel.compiler.shard_rules import REP, SHARDING, LayerSharding, ShardRule, Split, \
    StateShard
from megakernel.compiler.geometry import mla
from megakernel.errors import ShardingError

FORMS = ("absorbed", "expanded")
KIND_OVERRIDES.register("mla_form")(FORMS)


def head_splits(op, cores: int) -> tuple[Split, Split, int]:
    """(q split, output split, heads per core) of an MLA op over ``cores``."""
    if op.num_heads % cores:
        raise ShardingError(f"num_heads={op.num_heads} cannot be split evenly over {cores} "
                            "TensorCores", path="num_heads",
                            hint="use a core count that divides the head count")
    local = op.num_heads // cores
    q = Split(0, cores, 1, local * op.qk_head_dim, local * op.qk_head_dim)
    return q, Split(0, cores, 1, local * op.v_head_dim, local * op.v_head_dim), local


def _want(ls: LayerSharding, node, out_want):
    q, out, _ = head_splits(node.op, ls.cores)
    return (q, None, out) if node.op.output_gate else (q, None)


def _forward(ls: LayerSharding, node):
    op = node.op
    q, out, local = head_splits(op, ls.cores)
    wanted = (q, REP, out)
    for t, want in zip(node.inputs, wanted):
        state = ls.full(node, t) if want == REP else ls.state[t]
        if state != want:
            raise ShardingError(f"input {t!r} is {state!r} across cores, expected "
                                f"{want!r}: the query (and gate) must come from projections "
                                "split by heads, kv_a from a whole one", path="inputs")
    ls.param(node, "kv_norm", (op.kv_lora_rank,), (), "vector", "replicated")
    ls.param(node, "w_uk", (op.num_heads * op.nope_dim, op.kv_lora_rank),
             (Split(0, ls.cores, 1, local * op.nope_dim, local * op.nope_dim),), "ring",
             "rows (heads)")
    ls.param(node, "w_uv", (op.kv_lora_rank, op.num_heads * op.v_head_dim),
             (Split(1, ls.cores, 1, local * op.v_head_dim, local * op.v_head_dim),), "ring",
             "columns (heads)")
    # One latent "kv head", the same on every core.
    ls.heads.append((node.name, local, 1, ls.cores))
    ls.states.append(StateShard(node.name, "latent", "append", ()))
    return out


SHARDING.register("mla")(ShardRule(_forward, _want))


def form_costs(op, heads: int, rows_padded: int, kv_tile: int, tiles: int,
               constants, rate: float) -> dict[str, float]:
    """Modeled seconds of each form's compute for one layer on one core;
    ``tiles`` latent tiles in all (batch x tiles per sequence)."""
    p = constants.mxu_push_rows
    rows = lambda n: max(n, p)  # noqa: E731 - LHS rows the MXU charges for
    r, dn, dr, dv, st = op.kv_lora_rank, op.nope_dim, op.rope_dim, op.v_head_dim, kv_tile
    absorb_once = heads * rows(rows_padded) * r * (dn + dv)
    absorbed = 2.0 * (absorb_once + tiles * rows(heads * rows_padded) * (r + dr + r) * st)
    expanded = 2.0 * tiles * heads * (rows(st) * r * (dn + dv)
                                      + rows(rows_padded) * st * (dn + dr + dv))
    over = constants.tile_overhead_s
    return {"absorbed": absorbed / rate + 2 * tiles * over,
            "expanded": expanded / rate + (1 + heads) * tiles * over}


def modeled_forms(op, heads: int, rows_padded: int, kv, batch: int, target,
                  dtype: str) -> dict[str, float]:
    """``form_costs`` of one MLA node of a plan (``kv`` its KVStream)."""
    c = target.constants
    rate = target.bf16_flops / (c.f32_matmul_slowdown if dtype == "float32" else 1)
    return form_costs(op, heads, rows_padded, kv.kv_tile, batch * kv.tiles_per_seq, c, rate)


def _heads(ss, node) -> int:
    return next(h for h in ss.heads if h[0] == node.name)[1]


@BUFFERS.register("mla")
def _buffers(cx, node) -> OpLayout:

    op, s = node.op, cx.ss.stack
    kv = next(x for x in cx.kv if x.stack == s and x.node == node.name)
    heads = _heads(cx.ss, node)
    costs = modeled_forms(op, heads, cx.rows_padded, kv, cx.request.batch, cx.target,
                          cx.model.dtype.value)
    form = cx.request.overrides.mla_form or min(FORMS, key=lambda f: costs[f])
    weights = {p.name: p for p in cx.ss.params}
    g = mla.MLAGeometry(
        batch=cx.request.batch, tokens=cx.request.tokens, rows_padded=cx.rows_padded,
        heads=heads, rank=op.kv_lora_rank, nope_dim=op.nope_dim, rope_dim=op.rope_dim,
        v_dim=op.v_head_dim, kv_tile=kv.kv_tile, max_seq_len=cx.model.max_seq_len,
        scale=op.softmax_scale, eps=op.kv_norm_eps, rope=op.rope,
        rope_factor=op.attention_factor(), output_gate=op.output_gate, form=form,
        cache_dtype=kv.dtype, weight_dtype=weights[f"{node.name}.w_uk"].dtype,
        steps=cx.request.steps)
    # the next repetition's first latent tile is fetched a layer ahead and the
    # windows drain after the loop (kernels/mla_cache.py): buffers span the stack
    return OpLayout("mla", g, mla.buffers(g), Kind.KV_TILES, mla.value_bytes(g),
                    stack_lifetime=True)


@COST.register("mla")
def _cost(cx, node, ph: dict) -> dict:
    c = cx.target.constants
    kv = cx.memory.kv_of(cx.ss.stack, node.name)
    g = cx.memory.geometry_of(cx.ss.stack, node.name).geometry
    seconds = modeled_forms(node.op, g.heads, g.rows_padded, kv, cx.request.batch,
                            cx.target, cx.model.dtype.value)[g.form]
    tiles = cx.request.batch * kv.tiles_per_seq
    overhead = (2 if g.form == "absorbed" else 1 + g.heads) * tiles * c.tile_overhead_s
    rate = cx.rate
    # The form's matmuls include the ring's W_UK / W_UV (absorbed: once per
    # step; expanded: per tile), so they replace the ring's own charge.
    return dict(ph, other_bytes=ph["other_bytes"] + kv.bytes_per_layer,
                floor_bytes=ph["ring_bytes"] + ph["other_bytes"] + kv.valid_bytes_per_layer,
                flops=(seconds - overhead) * rate, outstanding=cx.ring + 2,
                overhead_s=ph["overhead_s"] + overhead, stall_s=cx.sequence_stall(seconds))


@CHOICE_NOTES.register("mla")
def form_notes(plan, model) -> list[tuple[str, str]]:
    """(decision, why) of every MLA node's form, for the plan's choices."""
    out = []
    for og in plan.memory.geometries:
        if og.library != "mla":
            continue
        g = og.geometry
        node = model.stacks[og.stack].layer.node(og.node)
        kv = next(k for k in plan.memory.kv if (k.stack, k.node) == (og.stack, og.node))
        costs = modeled_forms(node.op, g.heads, g.rows_padded, kv, plan.request.batch,
                              plan.target, model.dtype.value)
        how = ("set by overrides.mla_form" if plan.request.overrides.mla_form
               else "the cheaper modeled compute")
        out.append((f"mla s{og.stack}.{og.node}",
                    f"{g.form} form ({how}; modeled per layer: absorbed "
                    f"{costs['absorbed'] * 1e6:.2f} us, expanded {costs['expanded'] * 1e6:.2f} "
                    f"us; {g.heads} head(s) per core, {kv.tiles_per_seq} latent tile(s) of "
                    f"{kv.kv_tile} per sequence)"))
    return out


CONSTANTS.register("mla")(
    lambda op: {"inv_freq": op.inv_freq().astype("float32")[None, :]} if op.rope else {})


# How its kernel library (backends/pallas_tpu/kernels/mla.py) runs in a multi-step call.
STEPPING.register("mla")(Stepping(
    True, "writes each running sequence's latent row at the step's position; a stopped "
          "sequence's cache is not written"))
