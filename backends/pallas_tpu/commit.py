"""Whole-access state outside the kernel: the call's updates committed into
the state after the call, in the same jit.

A kernel with remote DMAs gets every aliased operand copied in and every
output copied out by XLA (docs/verification.md, "Copies around the call"), so
whole-access state (Gated DeltaNet's conv histories and recurrent state) is
passed to the megakernel read only, like the appended caches
(``new_rows.py``), and the kernel returns per layer and sequence a window of
W rows of updates, row i*T + t for step i's token t. The generated
``make_step`` commits them into the donated state (``STATE_UPDATES`` in the
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

from megakernel.registry import Registry

HI = jax.lax.Precision.HIGHEST

# One rule per op kind owning whole-access state: (its library geometry, the
# state's name) -> (function of this module, keyword arguments) that commits
# the state's update output; the emitter renders it into STATE_UPDATES.
COMMITS: Registry = Registry("state commit", "the kind's emitter (backends/pallas_tpu/kind_<name>.py)",
                             per_op_kind=False)


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
    """hist [L, B, Kc-1, C] with each sequence's first ran[b] * tokens rows of
    ``rows`` [L, B, W, C] shifted in."""
    seq = jnp.concatenate([hist, rows.astype(hist.dtype)], axis=2)
    kept = [jax.lax.dynamic_slice_in_dim(seq[:, b], ran[b] * tokens, hist.shape[2], axis=1)
            for b in range(hist.shape[1])]
    return jnp.stack(kept, axis=1)


def low_rank(state, updates, ran, *, tokens: int, key_dim: int, value_dim: int):
    """state [L, B, HV, dk, dv] f32 after each sequence's first ran[b] * tokens
    rows of ``updates`` [L, B, HV, W, dk + dv + 1] (per value head: key |
    delta-rule update | log-decay). The decay after each row is a masked sum,
    not a cumulative sum along W (which XLA relaid out, a copy)."""
    w = updates.shape[3]
    valid = (jnp.arange(w)[None, :] < (ran * tokens)[:, None])[None, :, None, :, None]
    rows = jnp.where(valid, updates, 0.0)
    keys, us, g = (rows[..., :key_dim], rows[..., key_dim:key_dim + value_dim],
                   rows[..., key_dim + value_dim])                    # g [L, B, HV, W]
    later = jnp.arange(w)[None, :] > jnp.arange(w)[:, None]          # [r, s]: s after r
    after = jnp.sum(jnp.where(later, g[..., None, :], 0.0), axis=-1)
    weight = jnp.where(valid[..., 0], jnp.exp(after), 0.0)
    total = jnp.sum(g, axis=-1)[..., None, None]
    return jnp.exp(total) * state + jnp.einsum("lbhwk,lbhwv->lbhkv", keys * weight[..., None],
                                               us, precision=HI)
