"""In-kernel collectives by remote DMA: entry barrier, all-reduce, argmax exchange.

All sums run in rank order 0..N-1 on every core, so every core holds the
bit-identical f32 result (one-shot and reduce-scatter + all-gather agree, as
both add the same partials in the same order). Slots are double-buffered by
the parity of the collective's sequence number: a peer cannot start
collective n+2 (same parity) before this core has finished n, so the layer
loop needs no barrier.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def barrier(me, n):
    """Every peer is inside the kernel before anyone writes to its VMEM."""
    sem = pltpu.get_barrier_semaphore()
    for j in range(n):
        @pl.when(me != j)
        def _():
            pl.semaphore_signal(sem, 1, device_id={"x": j})
    pl.semaphore_wait(sem, n - 1)


def all_reduce(x, slots, send_sems, recv_sems, parity, me, n):
    """One-shot all-reduce of x [rows, H] f32: push to every peer's
    slots[parity, me], sum slots[parity, 0..n-1] in rank order."""
    def push(j):
        return pltpu.make_async_remote_copy(
            src_ref=slots.at[parity, me], dst_ref=slots.at[parity, me],
            send_sem=send_sems.at[parity, j], recv_sem=recv_sems.at[parity, me],
            device_id={"x": j})

    def incoming(j):
        return pltpu.make_async_remote_copy(
            src_ref=slots.at[parity, j], dst_ref=slots.at[parity, j],
            send_sem=send_sems.at[parity, j], recv_sem=recv_sems.at[parity, j],
            device_id={"x": j})

    slots[parity, me] = x
    _each_peer(me, n, lambda j: push(j).start())
    _each_peer(me, n, lambda j: incoming(j).wait_recv())
    acc = slots[parity, 0]
    for j in range(1, n):
        acc = acc + slots[parity, j]
    _each_peer(me, n, lambda j: push(j).wait_send())
    return acc


def _each_peer(me, n, fn):
    for j in range(n):
        @pl.when(me != j)
        def _():
            fn(j)


def all_reduce_rs_ag(x, stage, rs_slots, ag_slots, send_sems, recv_sems, parity, me, n):
    """Reduce-scatter + all-gather all-reduce of x [rows, H] f32 (H = n chunks
    of whole lane groups). Phase 0: chunk j of x to core j's rs_slots[par, me];
    core c sums its chunk in rank order. Phase 1: the reduced chunk to every
    core's ag_slots[par, c]. stage [2, rows, H] holds x while it is sent."""
    chunk = rs_slots.shape[-1]

    def scatter(j, src):   # src's chunk j -> core j's rs_slots[par, src]
        return pltpu.make_async_remote_copy(
            src_ref=stage.at[parity, :, pl.ds(j * chunk, chunk)],
            dst_ref=rs_slots.at[parity, src], send_sem=send_sems.at[parity, 0, j],
            recv_sem=recv_sems.at[parity, 0, src], device_id={"x": j})

    def gather(j, src):    # src's reduced chunk -> core j's ag_slots[par, src]
        return pltpu.make_async_remote_copy(
            src_ref=ag_slots.at[parity, src], dst_ref=ag_slots.at[parity, src],
            send_sem=send_sems.at[parity, 1, j], recv_sem=recv_sems.at[parity, 1, src],
            device_id={"x": j})

    stage[parity] = x
    own = pltpu.make_async_copy(
        stage.at[parity, :, pl.ds(pl.multiple_of(me * chunk, 128), chunk)],
        rs_slots.at[parity, me], recv_sems.at[parity, 0, me])
    own.start()
    _each_peer(me, n, lambda j: scatter(j, me).start())
    own.wait()
    _each_peer(me, n, lambda j: scatter(me, j).wait_recv())
    acc = rs_slots[parity, 0]
    for j in range(1, n):
        acc = acc + rs_slots[parity, j]
    ag_slots[parity, me] = acc
    _each_peer(me, n, lambda j: gather(j, me).start())
    _each_peer(me, n, lambda j: gather(me, j).wait_recv())
    out = jnp.concatenate([ag_slots[parity, j] for j in range(n)], axis=-1)
    _each_peer(me, n, lambda j: scatter(j, me).wait_send())
    _each_peer(me, n, lambda j: gather(j, me).wait_send())
    return out


def merge_argmax(best, cand):
    """Keep best unless cand is larger (the smaller index wins ties, in any
    merge order)."""
    (bm, bi), (cm, ci) = best, cand
    take = (cm > bm) | ((cm == bm) & (ci < bi))
    return jnp.where(take, cm, bm), jnp.where(take, ci, bi)


def exchange_argmax(m, idx, values, indices, sems, me, n):
    """Distributed argmax: every core's (max, global index) to every peer's
    values/indices[me]; the lowest rank wins ties (= lowest vocab index)."""
    lanes = values.shape[-1]
    values[me] = jnp.broadcast_to(m, (m.shape[0], lanes))
    indices[me] = jnp.broadcast_to(idx, (idx.shape[0], lanes))

    def copies(j, src):
        return [pltpu.make_async_remote_copy(
            src_ref=buf.at[src], dst_ref=buf.at[src], send_sem=sems.at[0, i, j],
            recv_sem=sems.at[1, i, src], device_id={"x": j})
            for i, buf in enumerate((values, indices))]

    _each_peer(me, n, lambda j: [c.start() for c in copies(j, me)])
    _each_peer(me, n, lambda j: [c.wait_recv() for c in copies(j, j)])
    best = (values[0][:, :1], indices[0][:, :1])
    for j in range(1, n):
        best = merge_argmax(best, (values[j][:, :1], indices[j][:, :1]))
    _each_peer(me, n, lambda j: [c.wait_send() for c in copies(j, me)])
    return best


