"""Several greedy decode steps in one kernel call (``steps_per_call`` > 1).

The generated kernel runs its step body in a ``fori_loop`` over i < STEPS:
``begin_step`` sets each row's token and each sequence's position and stop
flag (scalars in SMEM) before the embedding gather, and ``end_step`` turns the
step's greedy argmax into lane i of the token output and into the next step's
tokens. One token per sequence per step (the planner requires tokens = 1), so
row b is sequence b.

Stop rule: sequence b stops once it emitted ``end_id`` or once its next
position would reach ``min(limit[b], max_len)``; from then on its output
lanes hold ``end_id`` (-1 when none is set), its position is frozen and the
state-owning ops leave its state alone (they get ``stopped``: attention skips
its cache write). Its rows are still computed, on finite values, and ignored.

``STEPPING`` (compiler/stepping.py): each state-owning op kind says whether its
library runs inside a multi-step call, i.e. follows the stop rule above, and how (the
planner refuses ``steps_per_call`` > 1 for a kind that says it does not, and a
state-owning kind with no rule is a ``MissingRuleError``). Stateless kinds need
none: nothing of theirs outlives a step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental import pallas as pl



def begin_step(i, tokens, start_pos, limit, cur_tokens, cur_start, stopped, batch, max_len):
    """Step i's tokens (step 0: the call's), positions and stop flags."""
    @pl.when(i == 0)
    def _():
        for b in range(batch):
            cur_tokens[b] = tokens[b]
            cur_start[b] = start_pos[b]
            stopped[b] = jnp.where(start_pos[b] < jnp.minimum(limit[b], max_len), 0, 1)

    @pl.when(i > 0)
    def _():
        for b in range(batch):
            nxt = cur_start[b] + 1
            go = (stopped[b] == 0) & (nxt < jnp.minimum(limit[b], max_len))
            stopped[b] = jnp.where(go, 0, 1)
            cur_start[b] = jnp.where(go, nxt, cur_start[b])


def end_step(i, idx, out, end_id, cur_tokens, stopped, staged, scalars, sem, batch):
    """Lane i (and later lanes) of ``out`` [rows_padded, 128] <- the step's
    argmax ``idx`` [rows_padded, 1], or end_id for stopped sequences; the
    argmax reaches SMEM by DMA and becomes the running rows' next tokens."""
    rows_p = out.shape[0]
    row = jax.lax.broadcasted_iota(jnp.int32, (rows_p, 1), 0)
    halted = jnp.zeros((rows_p, 1), jnp.int32)
    for b in range(batch):
        halted = jnp.where(row == b, stopped[b], halted)
    tok = jnp.where(halted != 0, end_id[0], idx)
    lane = jax.lax.broadcasted_iota(jnp.int32, out.shape, 1)
    out[...] = jnp.where(lane >= i, jnp.broadcast_to(tok, out.shape), out[...])
    staged[...] = jnp.broadcast_to(idx, staged.shape)
    copy = pltpu.make_async_copy(staged, scalars, sem.at[0])
    copy.start()
    copy.wait()
    for b in range(batch):
        t = scalars[b, 0]
        running = stopped[b] == 0
        cur_tokens[b] = jnp.where(running, t, cur_tokens[b])
        stopped[b] = jnp.where(running & (t == end_id[0]), 1, stopped[b])
