"""The pallas_call around a generated kernel: its refs bound by name from the
module's INPUTS / OUTPUTS / SCRATCH tables (``bind``), and ``make_step``, the
jitted, shard_mapped decode step that calls the kernel and writes the new rows
and state updates back after it (generated modules call it as ``rt.make_step``)."""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

from megakernel.backends.pallas_tpu.kernels import appended_state as nr, state_commit as cm
from megakernel.errors import EmitError

SPACES = {"smem": pltpu.SMEM, "vmem": pltpu.VMEM, "hbm": pl.ANY}


class Refs:
    """The kernel's refs of one group (inputs, outputs or scratch), read by name."""

    def __init__(self, group: str, refs: dict):
        object.__setattr__(self, "_group", group)
        object.__setattr__(self, "_refs", refs)

    def __getattr__(self, name):
        refs = object.__getattribute__(self, "_refs")
        if name not in refs:
            group = object.__getattribute__(self, "_group")
            raise EmitError(f"the kernel has no {group} ref named {name!r}",
                            path=f"kernel.{group}", hint=f"its {group}: {', '.join(refs)}")
        return refs[name]

    def __setattr__(self, name, value):
        raise AttributeError(f"{self._group} refs are bound once, by ``bind``")


def bind(refs, inputs, outputs, scratch, absent=()):
    """(inputs, outputs, scratch): the pallas_call's refs, in its order, named by
    the first field of each row of the three tables; names in ``absent`` read
    as None (the logits output of a call that does not return them)."""
    groups, at = [], 0
    for group, table in (("input", inputs), ("output", outputs), ("scratch", scratch)):
        names = [row[0] for row in table]
        named = dict(zip(names, refs[at:at + len(names)]))
        named.update((name, None) for name in absent if group == "output")
        groups.append(Refs(group, named))
        at += len(names)
    if at != len(refs):
        raise EmitError(f"the kernel got {len(refs)} refs, its tables name {at}",
                        path="kernel.refs")
    return tuple(groups)


def make_step(kernel, mesh, *, inputs, outputs, logits, scratch, new_rows, state_updates,
              vmem_limit, collective_id, batch, steps, max_seq_len, interpret=None,
              with_logits=False, auto_layouts=False, write_back=True):
    """jit(shard_map(the pallas_call of ``kernel``, then the call's new rows and
    state updates written into the caches and states)): (inputs in ``inputs``
    order) -> (next_token [cores*ROWS_PADDED, 128] int32, *updated states (every
    cache and state operand, in ``inputs`` order)[, logits]).

    ``kernel(inputs, outputs, scratch)`` takes its refs by name (``bind``). The
    generated module's tables: ``inputs`` rows (name, per-core shape, dtype,
    space, split over the cores); ``outputs`` and ``logits`` (name, per-core
    shape, dtype, space), next_token first, ``logits`` after the rest when
    ``with_logits``; ``scratch`` (name, allocation); ``new_rows`` (cache, output
    of its new rows, rows, row alignment, max_seq_len: ``new_rows.write_back``);
    ``state_updates`` (state, output of its updates, commit(state, updates,
    steps run)). ``collective_id``: the barrier semaphore's (None: no remote
    DMA); ``batch``, ``steps``, ``max_seq_len``: the steps each sequence ran
    (``commit.steps_run``).
    ``auto_layouts``: XLA lays each operand out as the kernel takes it (no
    relayout copy, e.g. of the [L, 1, n] vectors); for ahead-of-time
    compiles, whose ``input_formats`` say how to put the arrays.
    ``write_back=False`` leaves the new rows out of the caches: the kernel
    alone, for libtpu's static profile of its core work."""
    outs = tuple(outputs) + ((logits,) if with_logits else ())
    absent = () if with_logits else (logits[0],)

    @functools.wraps(kernel)
    def named(*refs):
        kernel(*bind(refs, inputs, outs, scratch, absent))

    call = pl.pallas_call(
        named,
        out_shape=tuple(jax.ShapeDtypeStruct(shape, dtype) for _, shape, dtype, _ in outs),
        in_specs=[pl.BlockSpec(memory_space=SPACES[row[3]]) for row in inputs],
        out_specs=tuple(pl.BlockSpec(memory_space=SPACES[row[3]]) for row in outs),
        scratch_shapes=[allocation for _, allocation in scratch],
        interpret=interpret if interpret is not None else False,
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=vmem_limit,
                                             collective_id=collective_id),
    )
    at = {row[0]: i for i, row in enumerate(inputs)}
    out_at = {row[0]: i for i, row in enumerate(outs)}
    start, end_id, limit = at["start_pos"], at.get("end_id"), at.get("limit")
    states = sorted(at[row[0]] for row in (*new_rows, *state_updates))
    returned = {row[1] for row in (*new_rows, *state_updates)}    # as the states they update

    def body(*args):
        ins = list(args)
        for i in states:     # read only: XLA must not stage a small state in VMEM
            ins[i] = pltpu.with_memory_space_constraint(ins[i], pltpu.HBM)
        results = call(*ins)
        if not write_back:     # the kernel alone (a static profile): updates as they are
            return tuple(results)
        updated = {}
        for cache, window, rows, align, seq in new_rows:
            updated[cache] = nr.write_back(args[at[cache]], results[out_at[window]],
                                           args[start], rows=rows, align=align, seq=seq)
        if state_updates:
            ran = cm.steps_run(results[0], args[start], None if end_id is None else args[end_id],
                               None if limit is None else args[limit], batch=batch,
                               steps=steps, max_len=max_seq_len)
            for state, update, fn in state_updates:
                updated[state] = fn(args[at[state]], results[out_at[update]], ran)
        rest = [r for row, r in zip(outs[1:], results[1:]) if row[0] not in returned]
        return (results[0], *[updated[row[0]] for row in inputs if row[0] in updated], *rest)

    spec = [P("x") if row[4] else P() for row in inputs]
    n_out = len(outs)
    step = jax.shard_map(body, mesh=mesh, in_specs=tuple(spec),
                         out_specs=tuple(P("x") for _ in range(n_out)), check_vma=False)
    donate = tuple(states)
    if not auto_layouts:
        return jax.jit(step, donate_argnums=donate)
    from jax.experimental.layout import Format, Layout

    auto = lambda s: Format(Layout.AUTO, NamedSharding(mesh, s))  # noqa: E731
    # a donated cache and the cache it becomes share a layout: the kernel's
    results = [NamedSharding(mesh, P("x"))] + [auto(P("x")) for _ in donate]
    results += [NamedSharding(mesh, P("x"))] * (n_out - len(results))
    return jax.jit(step, in_shardings=tuple(auto(s) for s in spec),
                   out_shardings=tuple(results), donate_argnums=donate)
