"""The kernel code around the layer loops: the prologue and the epilogue.

``prologue_lines``: core id, positions, the weight ring and its first R tile
DMAs, expert-parallel bases, the entry barrier, the embedding gather and its
all-reduce. ``epilogue_lines``: final norm, LM head with a running argmax,
the distributed argmax and the output. Buffers are named as the plan names
them (``Buffer.ident``, in the kernel's group of refs: ``declare.ref``);
numbers come from the plan through ``literal``.
"""

from __future__ import annotations

from megakernel.backends.pallas_tpu.codegen.declare import (buffer_bundles, dtype_expr, literal, ref,
                                                     tuple_of)


def allreduce_fn(spec_name: str) -> str:
    """The kernel's name of the all-reduce bound to plan spec ``spec_name``
    (``allreduce`` -> ``all_reduce``, ``allreduce_wide`` -> ``all_reduce_wide``)."""
    return spec_name.replace("allreduce", "all_reduce", 1)


def allreduce_bundle(plan) -> list[str]:
    """``all_reduce = rt.AllReduce(...)``: this core's all-reduce with the
    plan's buffers of its algorithm, bound once per all-reduce spec (none
    without all-reduces; ``all_reduce_wide`` too when the wide sites have
    their own, compiler/schedule_collectives.py)."""
    out = []
    for spec in plan.collectives.specs:
        if spec.kind != "all_reduce":
            continue
        slots = ("slots",) if spec.algorithm == "one_shot" else ("stage", "rs_slots", "ag_slots")
        b = lambda part, spec=spec: ref(plan, f"{spec.name}.{part}")  # noqa: E731
        out.append(f"{allreduce_fn(spec.name)} = rt.AllReduce(me, NUM_CORES, {b('send_sems')}, "
                   f"{b('recv_sems')}, " + "".join(f"{name}={b(name)}, " for name in slots)
                   + "local=LOCAL_COLLECTIVES)")
    return out


def allreduce_call(x: str, parity: str, site) -> str:
    """The generated all-reduce of variable ``x`` at one site (a plan
    ``Collective``), through its spec's bound all-reduce."""
    return f"{x} = {allreduce_fn(site.spec)}({x}, parity={parity})  # {site.name}"


def prologue_lines(model, plan, ctxs) -> list[str]:
    """The call's set-up; for a one-step call the step's embedding too (a
    multi-step call embeds in its step loop, ``step_begin_lines``)."""
    mem, n, multi = plan.memory, plan.shard.cores, plan.request.steps > 1
    refs = [tuple_of(c.hbm(p) for p in c.ring) for c in ctxs]
    quantized = plan.shard.global_param("lm_head.weight").format != "plain"
    refs.append(tuple_of([ref(plan, "hbm.lm_head")]
                         + ([ref(plan, "hbm.lm_head_scale")] if quantized else [])))
    aux = tuple_of(ref(plan, f"ring.aux{i}") for i in range(len(mem.ring.aux)))
    aux = f"aux={aux}, " if mem.ring.aux else ""
    steps = ", steps=STEPS_PER_CALL" if multi else ""
    lines = ["me = jax.lax.axis_index('x')" if n > 1 else "me = 0"]
    if not multi:
        lines.append(f"pos = rt.positions({ref(plan, 'start_pos')}, ROWS_PADDED, BATCH, TOKENS)")
    libraries, reduce = buffer_bundles(plan), allreduce_bundle(plan)
    if libraries:
        lines += ["# each op library's buffers, as the plan bound them", *libraries]
    lines += reduce
    # One tuple per segment of SEGMENTS (the stacks', then the head's): the
    # HBM weights its tiles are cut from, by Tile.ref.
    lines += ["ring_weights = (", *(f"    {r}," for r in refs), ")",
              f"stream = rt.Stream({ref(plan, 'ring.banks')}, {ref(plan, 'ring.sems')}, "
              f"NUM_BANKS, SEGMENTS, ring_weights, {aux}sync=SYNCHRONISED{steps}, "
              "static_sems=STATIC_RING_SEMAPHORES)",
              "stream.prologue()   # first NUM_BANKS tiles of the step in flight"]
    for c in ctxs:       # each core's first expert (kind_moe.first_expert): me // tp < ep
        for node, ep, tp, local, _ in c.shard.experts:
            if ep > 1:
                group = "me" if tp == 1 else f"(me // {literal(tp)})"
                lines.append(f"first_expert_s{c.s}_{node} = {group} * {literal(local)}")
    if n > 1:
        lines.append("rt.barrier(me, NUM_CORES, local=LOCAL_COLLECTIVES)   # peers are in the "
                     "kernel before remote writes")
    return lines if multi else lines + _embed_lines(model, plan, ref(plan, "tokens"))


def step_begin_lines(model, plan) -> list[str]:
    """Start of step i of a multi-step call: tokens, positions, stop flags
    (``steps.begin_step``), then the embedding of the step's tokens."""
    b = lambda name: ref(plan, f"step.{name}")  # noqa: E731
    inputs = ", ".join(ref(plan, name) for name in ("tokens", "start_pos", "limit"))
    return ["stream.step = i   # the ring's bank of a tile depends on the step",
            f"rt.begin_step(i, {inputs}, {b('tokens')}, {b('start')}, "
            f"{b('stopped')}, BATCH, MAX_SEQ_LEN)",
            f"pos = rt.positions({b('start')}, ROWS_PADDED, BATCH, TOKENS)"
            ] + _embed_lines(model, plan, b("tokens"))


def _embed_lines(model, plan, tokens: str) -> list[str]:
    # A replicated table: every core gathers every row itself (no all-reduce).
    owner = "me, VOCAB_STRIDE" if plan.shard.embed == "vocab" else "0, VOCAB_SIZE"
    lines = ["# node: embed",
             f"x = rt.gather_embedding({tokens}, {ref(plan, 'hbm.embed')}, "
             f"{ref(plan, 'embed.rows')}, {ref(plan, 'embed.sems')}, {owner}, "
             f"ROWS, ROWS_PADDED, {dtype_expr(model.dtype.value)})"]
    site = next((s for s in plan.collectives.sites if s.name == "embed.allreduce"), None)
    if site is not None:
        lines.append(allreduce_call("x", literal(site.parity()), site))
    return lines + _embed_ops(model) + [f"{ref(plan, 'residual')}[...] = x", ""]


def _embed_ops(model) -> list[str]:
    """The model's embed ops on the whole embedded rows, by their own emitters
    (after the all-reduce: each core then holds every row)."""
    from megakernel.backends.pallas_tpu.codegen.emitters import EMITTERS
    from megakernel.ir.graph import OpNode

    if not model.embed_ops:
        return []
    lines, x = ["# node: embed_ops", "t_embed0 = x"], "embed0"
    for i, op in enumerate(model.embed_ops):
        node = OpNode(f"embed_op{i}", op, (x,), (f"embed{i + 1}",))
        lines += EMITTERS(op.kind, f"embed_ops.{i}")(None, node)
        x = node.outputs[0]
    return lines + [f"x = t_{x}"]


def _logit_ops(model) -> list[str]:
    """``def logit_ops(t_logits)``: the model's logit ops, by their own emitters."""
    from megakernel.backends.pallas_tpu.codegen.emitters import EMITTERS
    from megakernel.ir.graph import OpNode

    if not model.logit_ops:
        return []
    lines, x = ["# node: logit_ops", "def logit_ops(t_logits0):"], "logits0"
    for i, op in enumerate(model.logit_ops):
        node = OpNode(f"logit_op{i}", op, (x,), (f"logits{i + 1}",))
        lines += [f"    {line}" for line in EMITTERS(op.kind, f"logit_ops.{i}")(None, node)]
        x = node.outputs[0]
    return lines + [f"    return t_{x}", ""]


def epilogue_lines(model, plan) -> list[str]:
    norm, n = model.final_norm, plan.shard.cores
    post = ", post=logit_ops" if model.logit_ops else ""
    lines = _logit_ops(model) + ["# node: final_norm",
             f"xn = rt.rmsnorm({ref(plan, 'residual')}[...], "
             f"{ref(plan, 'final_norm')}[...].astype(jnp.float32), "
             f"dim={literal(norm.dim)}, eps={literal(norm.eps)}, offset={literal(norm.offset)})",
             "# node: lm_head"]
    # Ids from vocab_used on are padding: not valid, and their logits -inf.
    used = "VOCAB_SIZE" if model.vocab_used is None else literal(model.vocab_used)
    if model.vocab_used is not None:
        post += ", pad_ids=True"
    if n == 1 and plan.shard.vocab_stride >= model.vocab_size:     # one core: every column
        lines.append(f"valid, first_column = {used}, 0")
    else:       # this core's columns of the vocabulary: the valid ones, the first's id
        lines += [f"valid = jnp.clip({used} - me * VOCAB_STRIDE, 0, VOCAB_STRIDE)",
                  "first_column = me * VOCAB_STRIDE"]
    quantized = plan.shard.global_param("lm_head.weight").format != "plain"
    to = f", dequant_to={literal(model.dtype.value)}" if quantized else ""
    lines.append(f"max_logit, token = rt.lm_head(stream, {literal(len(plan.shard.stacks))}, xn, "
                 f"outputs.logits, valid, first_column{post}{to})")
    if n > 1:
        b = lambda name: ref(plan, f"argmax.{name}")  # noqa: E731
        lines.append(f"max_logit, token = rt.exchange_argmax(max_logit, token, {b('values')}, "
                     f"{b('indices')}, {b('sems')}, me, NUM_CORES, local=LOCAL_COLLECTIVES)")
    if plan.request.steps == 1:
        return lines + [f"{ref(plan, 'next_token')}[...] = "
                        "jnp.broadcast_to(token, (ROWS_PADDED, 128))"]
    b = lambda name: ref(plan, f"step.{name}")  # noqa: E731
    return lines + [f"rt.end_step(i, token, {ref(plan, 'next_token')}, {ref(plan, 'end_id')}, "
                    f"{b('tokens')}, {b('stopped')}, "
                    f"{b('argmax_v')}, {b('argmax_s')}, {b('sems')}, BATCH)"]
