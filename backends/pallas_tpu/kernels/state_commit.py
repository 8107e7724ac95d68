"""Whole-access state outside the kernel: the call's updates committed into
the state after the call, in the same jit.

A kernel with remote DMAs gets every aliased operand copied in and every
output copied out by XLA (docs/verification.md, "Copies around the call"), so
whole-access state (Gated DeltaNet's conv histories and recurrent state) is
passed to the megakernel read only, like the appended caches
(``new_rows.py``), and the kernel returns per layer and sequence a window of
W rows of updates, row i*T + t for step i's token t. ``runtime.make_step``
commits them into the donated state (``STATE_UPDATES`` in the generated
module), each state by its op kind's rule (``COMMITS``), counting for each
sequence only the rows of the steps it ran (``steps_run``).

After a commit: ``shift_rows`` - history = the last Kc-1 rows of (history |
the sequence's n*T new rows); ``low_rank`` - S = exp(G) S_0 + sum_t
exp(sum_{s>t} g_s) k_t u_t^T over the sequence's n*T rows (G their summed
log-decays), in float32; a sequence that ran no step keeps its state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from megakernel.ir.types import WHOLE
from megakernel.registry import Registry

HI = jax.lax.Precision.HIGHEST

# One rule per op kind owning whole-access state: (its library geometry, the
# state's name) -> (function of this module, keyword arguments) that commits
# the state's update output; the emitter renders it into STATE_UPDATES.
COMMITS: Registry = Registry("state commit", "the kind's emitter (backends/pallas_tpu/codegen/kind_<name>.py)",
                             per_op_kind=False,
                             need="it owns whole-access state",
                             needed_by=lambda op_class: WHOLE in op_class.STATE_ACCESS)


def steps_run(next_token, start_pos, end_id, limit, *, batch: int, steps: int, max_len: int):
    """[batch] int32: how many of the call's steps each sequence ran. The stop
    rule of ``steps.begin_step`` / ``steps.end_step`` replayed on the call's
    tokens (lane i of row b of ``next_token`` is step i's token of sequence b,
    its argmax while it runs): b runs step 0 iff start < min(limit, max_len),
    and step i iff it ran step i - 1, did not emit ``end_id`` there, and
    start + i < min(limit, max_len)."""
    if steps == 1:
        return jnp.ones((batch,), jnp.int32)
    lim = jnp.minimum(limit[:batch], max_len)
    running = start_pos[:batch] < lim
    count = running.astype(jnp.int32)
    for i in range(1, steps):
        running = running & (next_token[:batch, i - 1] != end_id[0]) & (start_pos[:batch] + i
                                                                         < lim)
        count = count + running.astype(jnp.int32)
    return count


def shift_rows(hist, rows, ran, *, tokens: int):
    """The history [L, B, Kc-1, C] after the call: rows n..n+Kc-2 of each
    sequence's ``rows`` [L, B, R, C] (the history before the call, then the
    call's rows), n = ran[b] * tokens; a sequence that ran no step keeps
    ``hist``. One masked sum over the window's rows (exact: one term), and
    ``hist`` read only where it is kept: written in place into the donated
    history (XLA copied a history its update did not read, and relaid out
    one-row slices of the window)."""
    kc1, r = hist.shape[2], rows.shape[2]
    n = ran * tokens
    src = n[:, None, None] + jnp.arange(kc1)[None, :, None]            # [B, Kc-1, 1]
    pick = (src == jnp.arange(r)[None, None, :])[None, :, :, :, None]  # [1, B, Kc-1, R, 1]
    taken = jnp.sum(jnp.where(pick, rows[:, :, None].astype(jnp.float32), 0.0), axis=3)
    return jnp.where((n == 0)[None, :, None, None], hist, taken.astype(hist.dtype))


def low_rank(state, updates, ran, *, tokens: int, key_dim: int, value_dim: int):
    """state [L, B, HV, dk, dv] f32 after each sequence's first n = ran[b] *
    tokens rows of ``updates`` [L, B, HV, W, dk + 2 dv] (per value head: key |
    delta-rule update | the call's log-decays summed up to the row, repeated
    over dv lanes): exp(G_n) S_0 + K^T (U * exp(G_n - G_r)). The sums line up
    with U's lanes and S's columns, so nothing is relaid out."""
    w = updates.shape[3]
    n = (ran * tokens)[None, :, None, None, None]
    rows = jnp.arange(w)[None, None, None, :, None]
    keys, us = updates[..., :key_dim], updates[..., key_dim:key_dim + value_dim]
    summed = updates[..., key_dim + value_dim:]                       # G_r [L, B, HV, W, dv]
    total = jnp.sum(jnp.where(rows == n - 1, summed, 0.0), axis=3, keepdims=True)
    valid = rows < n
    keys = jnp.where(valid, keys, 0.0)
    us = jnp.where(valid, us * jnp.exp(total - summed), 0.0)
    return jnp.exp(total) * state + jnp.einsum("lbhwk,lbhwv->lbhkv", keys, us, precision=HI)
