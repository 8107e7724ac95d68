"""The per-layer vector double buffer of one stack (norm weights, biases).

After import: ``Vectors`` fetches layer k's vectors into buffer k % 2 while
layer k - 1 computes from the other (``start``, ``wait``, ``get``), or, in
the synchronised ablation, at the layer's start. backends/pallas_tpu/kernels/ring.py
re-exports it beside the weight ring.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu


class Vectors:
    """Per-layer vectors of one stack, double-buffered by layer parity:
    hbm[i] is [L, 1, n_i], buf[i] is [2, 1, n_i], sems is [2, len]."""

    def __init__(self, hbm, bufs, sems, sync=False, first=0):
        self.hbm, self.bufs, self.sems, self.sync = hbm, bufs, sems, sync
        # Several runs of a stack each have their vectors in flight at once:
        # each uses its own semaphores, from ``first``.
        self.first = first

    def _copies(self, k):
        p = k % 2
        return [pltpu.make_async_copy(h.at[k], b.at[p], self.sems.at[p, self.first + i])
                for i, (h, b) in enumerate(zip(self.hbm, self.bufs))]

    def start(self, k):
        if self.sync:           # the ablation fetches at the layer start, in wait
            return
        for c in self._copies(k):
            c.start()

    def wait(self, k):
        copies = self._copies(k)
        if self.sync:
            for c in copies:
                c.start()
        for c in copies:
            c.wait()

    def get(self, i, k):
        return self.bufs[i][k % 2].astype(jnp.float32)      # [1, n]
