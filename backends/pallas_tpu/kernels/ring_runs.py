"""The weight ring's refill in a stack whose body has runs of equal layers.

A repetition of such a stack streams each run's tiles once per layer of the
run (``ring.Segment.runs``); the kernel reads a run's layer at its run-layer
index k (repetition k // c, layer k % c of a run of c layers). After tile j
of run-layer k is consumed, the tile R places ahead is started; it may lie
in the same run-layer, a later layer of the run, a later run, a later
repetition, past the stack (the next stack or the LM head), or past the
step (the next step of a multi-step call): ``refill_run`` emits one start
per case, each under the guard that selects it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def refill_run(stream, s, k, j):
    """``Stream._refill`` in a segment with runs: tile j of run-layer k (layer
    i = k % c of a run of c layers, repetition k // c) starts flat + R.
    In this run, one dynamic guard (i + a < c) while the target stays in
    it; past the run's last layer, the target's tile is static for each
    i, so one start per such i (guarded by i, and by the repetition
    while inside the stack; one per repetition offset past its end)."""
    seg, R = stream.segments[s], stream.R
    t0, n, c, off = seg.run_at(j)
    jj, flat = j - t0, stream.flat(s, k, j) + R
    ahead, j2 = divmod(jj + R, n)
    if ahead == 0:
        stream._copy(s, k, t0 + j2, flat).start()
        return
    rep = quotient(k, c) if c > 1 else k
    i = k - rep * c
    if ahead < c:

        @pl.when(i + ahead < c)
        def _():
            stream._copy(s, k + ahead, t0 + j2, flat).start()

    after = R if stream.steps > 1 else min(R, stream.total() - seg.end)
    for i0 in range(max(0, c - ahead), c):
        q, place = divmod(off + i0 * n + jj + R, seg.per_rep)
        c2, i2, j3 = seg.at(place)
        mine = [i == i0] if c > 1 else []
        if q == 0:
            _when(mine, lambda: stream._copy(s, rep * c2 + i2, j3, flat).start())
            continue
        _when(mine + [rep + q < seg.count],
              lambda: stream._copy(s, (rep + q) * c2 + i2, j3, flat).start())
        # Past this stack: from repetition rep = count - q + m (m < q) the
        # target is flat seg.end + m * per_rep + place, static.
        for m in range(q):
            e = m * seg.per_rep + place
            if e >= after:
                break
            if seg.count - q + m < 0:
                continue
            _when(mine + [rep == seg.count - q + m],
                  lambda e=e: stream._start_static(seg.end + e))


def _when(conds, fn):
    """``fn()`` under the conjunction of traced ``conds`` (none: always)."""
    if not conds:
        fn()
        return
    cond = conds[0]
    for more in conds[1:]:
        cond = jnp.logical_and(cond, more)
    pl.when(cond)(fn)


def quotient(k, c: int):
    """k // c of a run-layer index k >= 0 (traced or not): a truncating
    division, one op where ``//`` corrects for negative operands."""
    return k // c if isinstance(k, int) else jax.lax.div(k, jnp.int32(c))
