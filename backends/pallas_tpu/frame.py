"""The kernel code around the layer loops: the prologue and the epilogue.

``prologue_lines``: core id, positions, the weight ring and its first R tile
DMAs, expert-parallel bases, the entry barrier, the embedding gather and its
all-reduce. ``epilogue_lines``: final norm, LM head with a running argmax,
the distributed argmax and the output. Buffers are named as the plan names
them (``Buffer.ident``, in the kernel's group of refs: ``declare.ref``);
numbers come from the plan through ``literal``.
"""

from __future__ import annotations

from megakernel.backends.pallas_tpu.declare import buffer_bundles, dtype_expr, literal, ref


def allreduce_algorithm(plan) -> str | None:
    spec = next((s for s in plan.collectives.specs if s.kind == "all_reduce"), None)
    return spec.algorithm if spec else None


def allreduce_call(plan, x: str, parity: str, site: str) -> str:
    """The generated all-reduce of variable ``x`` at one site."""
    b = lambda name: ref(plan, f"allreduce.{name}")  # noqa: E731
    if allreduce_algorithm(plan) == "one_shot":
        return (f"{x} = rt.all_reduce({x}, {b('slots')}, {b('send_sems')}, {b('recv_sems')}, "
                f"{parity}, me, NUM_CORES, local=LOCAL_COLLECTIVES)  # {site}")
    return (f"{x} = rt.all_reduce_rs_ag({x}, {b('stage')}, {b('rs_slots')}, {b('ag_slots')}, "
            f"{b('send_sems')}, {b('recv_sems')}, {parity}, me, NUM_CORES, "
            f"local=LOCAL_COLLECTIVES)  # {site}")


def prologue_lines(model, plan, ctxs) -> list[str]:
    """The call's set-up; for a one-step call the step's embedding too (a
    multi-step call embeds in its step loop, ``step_begin_lines``)."""
    mem, n, multi = plan.memory, plan.shard.cores, plan.request.steps > 1
    refs = [f"({''.join(f'{c.hbm(p)}, ' for p in c.ring)})" for c in ctxs]
    refs.append(f"({ref(plan, 'hbm.lm_head')},)")
    aux = "".join(f"{ref(plan, f'ring.aux{i}')}, " for i in range(len(mem.ring.aux)))
    steps = ", steps=STEPS_PER_CALL" if multi else ""
    lines = ["me = jax.lax.axis_index('x')" if n > 1 else "me = 0"]
    bundles = buffer_bundles(plan)
    if bundles:
        lines += ["# each op library's buffers, as the plan bound them", *bundles]
    if not multi:
        lines.append(f"pos = rt.positions({ref(plan, 'start_pos')}, ROWS_PADDED, BATCH, TOKENS)")
    lines += [f"stream = rt.Stream({ref(plan, 'ring.banks')}, {ref(plan, 'ring.sems')}, "
              f"NUM_BANKS, SEGMENTS, "
              f"({', '.join(refs)},), ({aux}), sync=SYNCHRONISED{steps}, "
              "static_sems=STATIC_RING_SEMAPHORES)",
              "stream.prologue()   # first NUM_BANKS tiles of the step in flight"]
    for c in ctxs:
        for node, ep, tp, _, _ in c.shard.experts:
            lines.append(f"expert_base_s{c.s}_{node} = (me // {literal(tp)}) % {literal(ep)}")
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
            f"{b('stopped')}, BATCH, {literal(model.max_seq_len)})",
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
        lines.append(allreduce_call(plan, "x", literal(site.parity()), site.name))
    return lines + _embed_ops(model) + [f"{ref(plan, 'residual')}[...] = x", ""]


def _embed_ops(model) -> list[str]:
    """The model's embed ops on the whole embedded rows, by their own emitters
    (after the all-reduce: each core then holds every row)."""
    from megakernel.backends.pallas_tpu.emit import EMITTERS
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
    from megakernel.backends.pallas_tpu.emit import EMITTERS
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
             "# node: lm_head",
             "valid = jnp.clip(VOCAB_SIZE - me * VOCAB_STRIDE, 0, VOCAB_STRIDE)",
             f"m, idx = rt.lm_head(stream, {literal(len(plan.shard.stacks))}, xn, "
             f"outputs.logits, valid, me * VOCAB_STRIDE{post})"]
    if n > 1:
        b = lambda name: ref(plan, f"argmax.{name}")  # noqa: E731
        lines.append(f"m, idx = rt.exchange_argmax(m, idx, {b('values')}, {b('indices')}, "
                     f"{b('sems')}, me, NUM_CORES, local=LOCAL_COLLECTIVES)")
    if plan.request.steps == 1:
        return lines + [f"{ref(plan, 'next_token')}[...] = "
                        "jnp.broadcast_to(idx, (ROWS_PADDED, 128))"]
    b = lambda name: ref(plan, f"step.{name}")  # noqa: E731
    return lines + [f"rt.end_step(i, idx, {ref(plan, 'next_token')}, {ref(plan, 'end_id')}, "
                    f"{b('tokens')}, {b('stopped')}, "
                    f"{b('argmax_v')}, {b('argmax_s')}, {b('sems')}, BATCH)"]
