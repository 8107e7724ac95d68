"""In-kernel collectives by remote DMA: entry barrier, all-reduce, argmax exchange.

Only the valid rows travel: the first ``rows`` (batch x tokens) of the
[rows_padded, H] f32 activation, cast to the slots' dtype (the plan's wire
dtype: the model's activation dtype, bf16 for bf16 models). Every core adds
the received partials in f32 in rank order 0..N-1, so every core holds the
bit-identical result; pad rows come back as zeros (what the embedding gives
them). Slots are double-buffered by the parity of the collective's sequence
number: a peer cannot start collective n+2 (same parity) before this core has
finished n, so the layer loop needs no barrier.

``local=True`` (the generated kernel's ``LOCAL_COLLECTIVES``) builds the same
collectives for libtpu's static profile only, never to run: libtpu's profile
pass cannot pair a wait with a DMA a peer issued ("No DMA issue node found for
sync flag") and aborts on every multi-core kernel. Each link to peer p becomes
a local DMA of the same bytes into this core's slot p, on the semaphore the
peer's DMA would signal; the sums read the same slots. The core's work (DMA
issue, waits, casts and sums) is the kernel's; the data is not.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def barrier(me, n, local=False):
    """Every peer is inside the kernel before anyone writes to its VMEM."""
    if local:           # no peer to wait for in a profile
        return
    sem = pltpu.get_barrier_semaphore()
    for j in range(n):
        @pl.when(me != j)
        def _():
            pl.semaphore_signal(sem, 1, device_id={"x": j})
    pl.semaphore_wait(sem, n - 1)


def _pad_rows(v, rows_padded):
    """[rows, W] -> [rows_padded, W], zeros below."""
    rows = v.shape[0]
    if rows == rows_padded:
        return v
    return jnp.concatenate([v, jnp.zeros((rows_padded - rows, v.shape[1]), v.dtype)], axis=0)


def _sum_f32(slot, n):
    """slot(0) + slot(1) + ... + slot(n-1) in f32, in this order on every core."""
    acc = slot(0).astype(jnp.float32)
    for j in range(1, n):
        acc = acc + slot(j).astype(jnp.float32)
    return acc


class _Local:
    """A link to a peer built as a local DMA (``local=True``, profiles only)."""

    def __init__(self, src, dst, sem):
        self.copy = pltpu.make_async_copy(src, dst, sem)

    def start(self):
        self.copy.start()

    def wait_recv(self):
        self.copy.wait()

    def wait_send(self):
        """The local DMA's one wait is ``wait_recv``'s."""


class AllReduce(NamedTuple):
    """This core's all-reduce with the plan's buffers, bound once:
    ``all_reduce(x, parity=p)`` sums x over the cores through the slots of
    parity p, one shot (``slots``) or reduce-scatter then all-gather
    (``stage``, ``rs_slots``, ``ag_slots``)."""

    me: Any
    cores: int
    send_sems: Any
    recv_sems: Any
    slots: Any = None
    stage: Any = None
    rs_slots: Any = None
    ag_slots: Any = None
    local: bool = False

    def __call__(self, x, parity):
        if self.slots is not None:
            return all_reduce(x, self.slots, self.send_sems, self.recv_sems, parity, self.me,
                              self.cores, local=self.local)
        return all_reduce_rs_ag(x, self.stage, self.rs_slots, self.ag_slots, self.send_sems,
                                self.recv_sems, parity, self.me, self.cores, local=self.local)


def all_reduce(x, slots, send_sems, recv_sems, parity, me, n, local=False):
    """One-shot all-reduce of x [rows_padded, H] f32 through slots
    [2, n, rows, H]: the valid rows to every peer's slots[parity, me], then
    the f32 sum of slots[parity, 0..n-1] in rank order. Folded slots
    [2, n, fold, rows, H] also take x [rows_padded, f x H] (f <= fold): its
    f lane pieces travel as pieces 0..f-1 of the slot. Unfolded slots take a
    narrower x too, [rows_padded, w] with w a multiple of 128 below H: only
    its w lanes of the slot travel and are summed."""
    rows, h = slots.shape[-2], slots.shape[-1]
    f, at = _pieces(x, slots, h)

    def push(j):
        if local:
            return _Local(at(parity, me), at(parity, j), recv_sems.at[parity, j])
        return pltpu.make_async_remote_copy(
            src_ref=at(parity, me), dst_ref=at(parity, me),
            send_sem=send_sems.at[parity, j], recv_sem=recv_sems.at[parity, me],
            device_id={"x": j})

    def incoming(j):
        if local:
            return push(j)
        return pltpu.make_async_remote_copy(
            src_ref=at(parity, j), dst_ref=at(parity, j),
            send_sem=send_sems.at[parity, j], recv_sem=recv_sems.at[parity, j],
            device_id={"x": j})

    _store_pieces(slots, (parity, me), x, f, rows, h)
    _each_peer(me, n, lambda j: push(j).start())
    _each_peer(me, n, lambda j: incoming(j).wait_recv())
    if slots.ndim == 4 and x.shape[1] < h:      # a narrower x: the lanes that travelled
        acc = _sum_f32(lambda j: slots[parity, j, :, pl.ds(0, x.shape[1])], n)
    else:
        acc = _unfold([_sum_f32(lambda j: _piece(slots, (parity, j), q), n) for q in range(f)])
    _each_peer(me, n, lambda j: push(j).wait_send())
    return _pad_rows(acc, x.shape[0])


def _pieces(x, slots, h):
    """(pieces f of x, slot view (parity, rank) -> the ref its pieces use)."""
    if slots.ndim == 4:             # unfolded slots: x is one [rows, w <= H] piece
        w = x.shape[1]
        if w == h:
            return 1, lambda par, j: slots.at[par, j]
        return 1, lambda par, j: slots.at[par, j, :, pl.ds(0, w)]
    f = x.shape[1] // h
    return f, lambda par, j: slots.at[par, j, pl.ds(0, f)]


def _store_pieces(ref, index, x, f, rows, h):
    """x's valid rows into ref[index] (unfolded) or its pieces 0..f-1."""
    if ref.ndim == len(index) + 2 and x.shape[1] < h:     # a narrower x: its lanes
        ref[index + (slice(None), pl.ds(0, x.shape[1]))] = x[:rows].astype(ref.dtype)
        return
    if ref.ndim == len(index) + 2:
        ref[index] = x[:rows].astype(ref.dtype)
        return
    for q in range(f):
        ref[index + (q,)] = x[:rows, q * h:(q + 1) * h].astype(ref.dtype)


def _piece(ref, index, q):
    """Piece q of ref[index] (the whole of it when ref is unfolded)."""
    return ref[index] if ref.ndim == len(index) + 2 else ref[index + (q,)]


def _unfold(pieces):
    """[rows, H] pieces side by side along lanes: [rows, f x H]."""
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=-1)


def _peer(a, b):
    """The peer of a link between this core (its traced id) and rank a or b."""
    return b if isinstance(b, int) else a


def _each_peer(me, n, fn):
    for j in range(n):
        @pl.when(me != j)
        def _():
            fn(j)


def all_reduce_rs_ag(x, stage, rs_slots, ag_slots, send_sems, recv_sems, parity, me, n,
                     local=False):
    """Reduce-scatter + all-gather all-reduce of x [rows_padded, H] f32 (H =
    n chunks of whole lane groups), valid rows only. Phase 0: chunk j of the
    partial to core j's rs_slots[par, me]; core c sums its chunk in f32 in
    rank order. Phase 1: the reduced chunk, in the wire dtype, to every core's
    ag_slots[par, c]; every core (the owner too) reads the chunks back from
    ag_slots. stage [2, rows, H] holds the partial while it is sent. Folded
    buffers (a fold axis after the rank: stage [2, fold, rows, H]) take x
    [rows_padded, f x H] as f pieces, each chunked alike."""
    rows, chunk = rs_slots.shape[-2], rs_slots.shape[-1]
    h = stage.shape[-1]
    folded = stage.ndim == 4
    f = x.shape[1] // h if folded else 1
    pf = (pl.ds(0, f),) if folded else ()       # the pieces in use of a folded buffer

    def chunk_of(j):        # stage's chunk j, every piece in use
        return stage.at[(parity,) + pf + (slice(None), pl.ds(j * chunk, chunk))]

    def scatter(j, src):   # src's chunk j -> core j's rs_slots[par, src]
        if local:          # the link's peer p: chunk p -> this core's rs_slots[par, p]
            p = _peer(j, src)
            return _Local(chunk_of(p), rs_slots.at[(parity, p) + pf],
                          recv_sems.at[parity, 0, p])
        return pltpu.make_async_remote_copy(
            src_ref=chunk_of(j), dst_ref=rs_slots.at[(parity, src) + pf],
            send_sem=send_sems.at[parity, 0, j],
            recv_sem=recv_sems.at[parity, 0, src], device_id={"x": j})

    def gather(j, src):    # src's reduced chunk -> core j's ag_slots[par, src]
        if local:
            p = _peer(j, src)
            return _Local(ag_slots.at[(parity, me) + pf], ag_slots.at[(parity, p) + pf],
                          recv_sems.at[parity, 1, p])
        return pltpu.make_async_remote_copy(
            src_ref=ag_slots.at[(parity, src) + pf], dst_ref=ag_slots.at[(parity, src) + pf],
            send_sem=send_sems.at[parity, 1, j], recv_sem=recv_sems.at[parity, 1, src],
            device_id={"x": j})

    _store_pieces(stage, (parity,), x, f, rows, h)
    own = pltpu.make_async_copy(
        stage.at[(parity,) + pf + (slice(None), pl.ds(pl.multiple_of(me * chunk, 128), chunk))],
        rs_slots.at[(parity, me) + pf], recv_sems.at[parity, 0, me])
    own.start()
    _each_peer(me, n, lambda j: scatter(j, me).start())
    own.wait()
    _each_peer(me, n, lambda j: scatter(me, j).wait_recv())
    for q in range(f):
        mine = (parity, me, q) if folded else (parity, me)
        ag_slots[mine] = _sum_f32(lambda j: _piece(rs_slots, (parity, j), q),
                                  n).astype(ag_slots.dtype)
    _each_peer(me, n, lambda j: gather(j, me).start())
    _each_peer(me, n, lambda j: gather(me, j).wait_recv())
    out = _unfold([jnp.concatenate([_piece(ag_slots, (parity, j), q)
                                    .astype(jnp.float32) for j in range(n)], axis=-1)
                   for q in range(f)])
    _each_peer(me, n, lambda j: scatter(j, me).wait_send())
    _each_peer(me, n, lambda j: gather(j, me).wait_send())
    return _pad_rows(out, x.shape[0])


def merge_argmax(best, cand):
    """Keep best unless cand is larger (the smaller index wins ties, in any
    merge order)."""
    (bm, bi), (cm, ci) = best, cand
    take = (cm > bm) | ((cm == bm) & (ci < bi))
    return jnp.where(take, cm, bm), jnp.where(take, ci, bi)


def exchange_argmax(m, idx, values, indices, sems, me, n, local=False):
    """Distributed argmax of the valid rows: every core's (max, global index)
    [rows_padded, 1] to every peer's values/indices[me] ([n, rows, lanes]);
    the lowest rank wins ties (= lowest vocab index). Pad rows return 0."""
    rows, lanes = values.shape[1], values.shape[-1]
    values[me] = jnp.broadcast_to(m[:rows], (rows, lanes))
    indices[me] = jnp.broadcast_to(idx[:rows], (rows, lanes))

    def copies(j, src):
        if local:
            p = _peer(j, src)
            return [_Local(buf.at[me], buf.at[p], sems.at[1, i, p])
                    for i, buf in enumerate((values, indices))]
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
    return tuple(_pad_rows(v, m.shape[0]) for v in best)
