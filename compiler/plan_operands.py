"""The operands and outputs of the kernel call, as plan buffers, in call order.

After ``operand_buffers``: the table holds one buffer per operand (step
inputs in SMEM, the final norm and constant tables in VMEM, weights and
caches in HBM with their per-core shapes: a stack's weights stacked over its
layers, vectors as [layers, 1, n]) and the ``next_token`` output; the returned
``Operand`` list gives the call order, where each comes from and whether it is
split over the cores. Appended-row state (attention K/V, the MLA latent
cache) is a read-only operand: the kernel returns each sequence's window of
the call's new rows in an HBM output ``new.<cache>`` (after ``next_token``),
written into the donated cache after the call in the same jit
(backends/pallas_tpu/kernels/appended_state.py), because XLA copies every aliased operand
of a communicating kernel in and out around each call. Whole-access state
(Gated DeltaNet's conv histories and recurrent state) is read only as well:
the kernel returns the call's updates in a small HBM output ``new.<state>``
whose shape its op kind's ``UPDATES`` rule gives, committed into the donated
state after the call in the same jit (backends/pallas_tpu/kernels/state_commit.py).
"""

from __future__ import annotations

from megakernel.compiler.buffers import Kind, Operand, Space
from megakernel.compiler.layout import LANES, append_window, word_rows
from megakernel.ir.types import APPEND, WHOLE
from megakernel.compiler.plan_buffers import BufferTable, sized
from megakernel.compiler.ring_layout import WORD
from megakernel.registry import Registry

# One rule per op kind: (op) -> {name suffix: f32 table [1, n]} the kernel reads
# from VMEM (none for most kinds).
CONSTANTS: Registry = Registry("constant operand",
                               "compiler/kind_*.py (linear, add: compiler/plan_operands.py)")
CONSTANTS.register("linear", "add")(lambda op: {})

# One rule per op kind owning whole-access state: (op, state name, its
# StateSpec, its per-core layout of one layer, request, cores) -> (shape of one layer's
# update output, dtype, note): what the kernel returns of the call for that
# state (its commit after the call: backends/pallas_tpu/kernels/state_commit.py).
UPDATES: Registry = Registry("state update output", "compiler/kind_<name>.py",
                             per_op_kind=False, need="it owns whole-access state",
                             needed_by=lambda op_class: WHOLE in op_class.STATE_ACCESS)


def operand_buffers(table: BufferTable, model, shard, request, rows_p: int,
                    last: int) -> tuple[Operand, ...]:
    whole = (0, last)
    out: list[Operand] = []

    def add(name, space, kind, shape, dtype, source, sharded, role, stack=None, note="",
            words=False, new_rows=None, updates=None):
        element = None
        if words:          # streamed through the ring: 32-bit words, rows packed
            element, dtype = dtype, WORD
            shape = (*shape[:-2], word_rows(shape[-2], element), shape[-1])
            note = f"{note}; {element} packed as 32-bit words along rows"
        table.add(sized(name, space, kind, shape, dtype, *whole, note, role="operand"))
        out.append(Operand(name, source, sharded, role, stack, element, new_rows, updates))

    add("tokens", Space.SMEM, Kind.SCALARS, (request.rows,), "int32", "tokens", False, "step",
        note="token ids of the step's rows")
    add("start_pos", Space.SMEM, Kind.SCALARS, (request.batch,), "int32", "start_pos", False,
        "step", note="first position of each sequence's new tokens")
    if request.steps > 1:       # the stop rule of a multi-step call (see step_buffers)
        add("end_id", Space.SMEM, Kind.SCALARS, (1,), "int32", "end_id", False, "step",
            note="end-of-sequence id (-1: none); a row that emits it stops")
        add("limit", Space.SMEM, Kind.SCALARS, (request.batch,), "int32", "limit", False,
            "step", note="per sequence, the position it may not reach (length limit)")
    embed = shard.global_param("embed.weight")
    add("hbm.embed", Space.HBM, Kind.HBM_WEIGHTS, embed.shape, embed.dtype, "embed.weight",
        True, "gather", note=f"{embed.channel}; {embed.role}")
    add("final_norm", Space.VMEM, Kind.RESIDENT, (1, model.hidden_size), model.dtype.value,
        "final_norm.weight", False, "vector", note="read once, after the last layer")
    head = shard.global_param("lm_head.weight")
    add("hbm.lm_head", Space.HBM, Kind.HBM_WEIGHTS, head.shape, head.dtype, head.name,
        True, "ring", note=f"{head.channel}; {head.role}", words=True)
    if head.format != "plain":          # a quantized head's scales ride the ring beside it
        sc = shard.global_param(head.name + "_scale")
        add("hbm.lm_head_scale", Space.HBM, Kind.HBM_WEIGHTS, sc.shape, sc.dtype, sc.name,
            True, "ring", note=f"{sc.channel}; {sc.role}", words=True)
    for ss in shard.stacks:
        for p in ss.params:
            n = ss.reps(p.name)              # a run's weights: one per run-layer
            shape = (n, 1, *p.shape) if p.channel == "vector" else (n, *p.shape)
            add(f"hbm.s{ss.stack}.{p.name}", Space.HBM, Kind.HBM_WEIGHTS, shape, p.dtype, p.name,
                True, p.channel, ss.stack, f"{p.channel}; {p.role}",
                words=p.channel == "ring" or p.format != "plain")
    for st, ss in zip(model.stacks, shard.stacks):
        for n in st.layer.nodes:
            tables = CONSTANTS(n.op.kind, f"layers[{ss.stack}].{n.name}")(n.op)
            for suffix, t in tables.items():
                add(f"s{ss.stack}.{n.name}.{suffix}", Space.VMEM, Kind.RESIDENT, t.shape,
                    "float32", f"{n.name}.{suffix}", False, "constant", ss.stack,
                    "constant table")
    windows = []        # (output name, shape, dtype, note) of each appended state
    updates = []        # the same of each whole-access state (outputs after the windows)
    for st, ss in zip(model.stacks, shard.stacks):
        for s in ss.states:
            spec = st.layer.node(s.node).op.state(request.batch, model.max_seq_len,
                                                  model.dtype)[s.name]
            name, shape = f"s{ss.stack}.{s.node}.{s.name}", (ss.reps(s.node),
                                                             *s.layout(spec.shape))
            if s.access != APPEND:
                op = st.layer.node(s.node).op
                tail, dtype, text = UPDATES(op.kind, f"layers[{ss.stack}].{s.node}")(
                    op, s.name, spec, shape[1:], request, shard.cores)
                add(f"hbm.{name}", Space.HBM, Kind.HBM_CACHE, shape, spec.dtype.value,
                    f"{s.node}.{s.name}", True, "cache", ss.stack,
                    f"{s.access} state, read only (the call's updates come back in "
                    f"new.{name}, committed after the call)", updates=f"new.{name}")
                updates.append((f"new.{name}", (shape[0], *tail), dtype, text))
                continue
            rows = append_window(request.tokens * request.steps, spec.dtype.value,
                                 model.max_seq_len)
            add(f"hbm.{name}", Space.HBM, Kind.HBM_CACHE, shape, spec.dtype.value,
                f"{s.node}.{s.name}", True, "cache", ss.stack,
                f"{s.access} state, read only (new rows come back in new.{name})",
                new_rows=f"new.{name}")
            windows.append((f"new.{name}", (*shape[:2], rows, *shape[3:]), spec.dtype.value,
                            f"per layer and sequence, the aligned {rows} rows holding the "
                            f"call's {request.tokens * request.steps} new rows of {name}; "
                            "written into the cache after the call, in the same jit"))
    note = ("greedy next token of each row (broadcast over lanes)" if request.steps == 1 else
            "lane i: row's greedy token of step i (end_id once stopped); later lanes repeat "
            "the last step's")
    table.add(sized("next_token", Space.VMEM, Kind.SCALARS, (rows_p, LANES), "int32", *whole,
                    note, role="output"))
    for name, shape, dtype, text in windows + updates:
        table.add(sized(name, Space.HBM, Kind.HBM_OUTPUT, shape, dtype, *whole, text,
                        role="output"))
    return tuple(out)


def step_buffers(table: BufferTable, request, rows_p: int, last: int) -> None:
    """Scratch of a multi-step call (``request.steps`` > 1): the rows' current
    tokens and positions and whether each sequence stopped, as scalars, and the
    VMEM -> SMEM staging of each step's argmax (a vector reaches the scalar
    unit only by DMA)."""
    if request.steps == 1:
        return
    whole = (0, last)
    for name, space, kind, shape, dtype, note in (
            ("step.tokens", Space.SMEM, Kind.SCALARS, (request.rows,), "int32",
             "this step's token of each row"),
            ("step.start", Space.SMEM, Kind.SCALARS, (request.batch,), "int32",
             "this step's position of each sequence (frozen once stopped)"),
            ("step.stopped", Space.SMEM, Kind.SCALARS, (request.batch,), "int32",
             "1 once a sequence emitted end_id or reached its limit"),
            ("step.argmax_v", Space.VMEM, Kind.SCALARS, (rows_p, LANES), "int32",
             "the step's argmax, staged for the DMA to SMEM"),
            ("step.argmax_s", Space.SMEM, Kind.SCALARS, (rows_p, LANES), "int32",
             "the step's argmax, as scalars"),
            ("step.sems", Space.SEMAPHORE, Kind.SEMAPHORES, (1,), "dma_semaphore",
             "argmax VMEM -> SMEM")):
        table.add(sized(name, space, kind, shape, dtype, *whole, note))


def operand_table(model, shard, request, rows_p: int, last: int):
    """(buffers by name, operands) of the call's operands and outputs and a
    multi-step call's scratch: the first buffers of every plan."""
    table = BufferTable()
    operands = operand_buffers(table, model, shard, request, rows_p, last)
    step_buffers(table, request, rows_p, last)
    return dict(zip((b.name for b in table.buffers()), table.buffers())), operands
