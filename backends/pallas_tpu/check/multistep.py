"""A multi-step kernel call (``steps_per_call`` N > 1) and its check.

``call`` runs one call: N greedy steps from the given tokens and positions,
caches updated in place, -> tokens [B, N]. ``expected`` is the same call done
by N single reference steps, greedy, with the stop rule of
``backends/pallas_tpu/kernels/step_loop.py``: a stopped sequence outputs ``end_id`` and its
state is restored after each later reference step, so it stops changing.
``check_steps`` prefills with the reference, calls the kernel once and
compares tokens, last-step logits of running rows and all state.
"""

from __future__ import annotations

import time

import jax.numpy as jnp
import numpy as np

from megakernel.backends.pallas_tpu.codegen import operands as pack
from megakernel.models import reference


def call(runner, tokens, start_pos, *, end_id: int = -1, limit=None):
    """One kernel call: tokens [B] int32 at positions start_pos [B] -> (tokens
    [B, N], last step's logits [B, V] or None); runner's caches updated."""
    plan, model = runner.plan, runner.model
    b, n = plan.request.batch, plan.request.steps
    if limit is None:
        limit = np.full((b,), model.max_seq_len, np.int32)
    ops = {o.name: o for o in runner.ops}
    if "end_id" not in ops:
        # A one-step kernel has no stop-rule operands (compiler/plan_operands.py):
        # its one step runs for every row, and a row already at its limit
        # outputs end_id as the stop rule says, though its state advances.
        nxt, logits = runner.step(np.asarray(tokens, np.int32).reshape(b, 1), start_pos)
        stopped = np.asarray(start_pos).reshape(-1) >= np.asarray(limit).reshape(-1)
        got = np.where(stopped[:, None], end_id, nxt).astype(np.int32)
        return got, None if logits is None else logits[:, 0]
    values = {"tokens": np.asarray(tokens, np.int32).reshape(-1),
              "start_pos": np.asarray(start_pos, np.int32).reshape(-1),
              "end_id": np.asarray([end_id], np.int32),
              "limit": np.asarray(limit, np.int32).reshape(-1)}
    for name, value in values.items():
        runner.arrays[name] = runner._put(ops[name], value)
    outs, logits_out = runner.call("interpret-mode call")
    got = np.asarray(outs[0])[:b, :n]
    logits = None
    if logits_out is not None:
        logits = pack.logits_from(plan, np.asarray(logits_out), b, 1)[:, 0]
    return got, logits


def expected(model, weights, tokens, start_pos, caches, steps: int, *, end_id: int = -1,
             limit=None, route_tie: float | None = None):
    """N single greedy reference steps with the stop rule -> (tokens [B, N],
    last step's logits [B, V], running mask of the last step [B], caches,
    routing near-ties [B]: the sequences a running step routed by a margin
    below ``route_tie``, default ``run.ROUTE_TIE`` of the dtype)."""
    from megakernel.backends.pallas_tpu.check.against_reference import reference_step

    b = len(tokens)
    limit = np.minimum(np.full((b,), model.max_seq_len) if limit is None else limit,
                       model.max_seq_len)
    tok, pos = np.asarray(tokens, np.int32), np.asarray(start_pos, np.int32)
    stopped = pos >= limit
    out = np.zeros((b, steps), np.int32)
    logits = running = None
    tied = np.zeros(b, bool)
    for i in range(steps):
        if i:
            stopped |= pos + 1 >= limit
            pos = np.where(stopped, pos, pos + 1)
        step_logits, new, ties_now = reference_step(model, weights, tok[:, None], pos, caches,
                                                    route_tie)
        tied |= ~stopped & ties_now
        keep = stopped.copy()
        caches = {k: jnp.asarray(np.where(keep.reshape(-1, *[1] * (v.ndim - 1)),
                                          np.asarray(caches[k]), np.asarray(v)))
                  for k, v in new.items()}
        nxt = np.asarray(step_logits)[:, 0].argmax(-1).astype(np.int32)
        out[:, i] = np.where(stopped, end_id, nxt)
        running, logits = ~stopped, np.asarray(step_logits)[:, 0]
        tok = np.where(stopped, tok, nxt)
        stopped |= (~stopped) & (nxt == end_id)
    return out, logits, running, caches, tied


def check_steps(model, plan, weights, module, interpret, *, seed: int = 0, prompt: int = 3,
                end_at: int | None = None, limit=None):
    """One N-step call against N reference steps -> CheckResult. ``end_at``:
    the end id is the reference's token of row 0 at that step (it stops there)."""
    from megakernel.backends.pallas_tpu.check.against_reference import (
        CheckResult, KernelRunner, Tolerances, make_mesh, races_found, used_logits)

    b, n = plan.request.batch, plan.request.steps
    t0 = time.perf_counter()
    runner = KernelRunner(module, model, plan, weights, make_mesh(plan.shard.cores), interpret)
    w = reference.as_jax(weights)
    rng = np.random.default_rng(seed)
    caches = reference.init_caches(model, b)
    prompt_tokens = jnp.asarray(rng.integers(0, model.vocab_size, (b, prompt)), jnp.int32)
    _, caches = reference.decode_step_jit(model, w, prompt_tokens, jnp.zeros((b,), jnp.int32),
                                          caches)
    runner.set_caches({k: np.asarray(val) for k, val in caches.items()})
    tokens = rng.integers(0, model.vocab_size, (b,)).astype(np.int32)
    start = prompt + np.arange(b, dtype=np.int32)
    end_id = -1
    if end_at is not None:
        free, *_ = expected(model, w, tokens, start, caches, end_at + 1, limit=limit)
        end_id = int(free[0, end_at])
    tol = Tolerances.of(model, plan)
    want, ref_logits, running, ref_caches, tied = expected(model, w, tokens, start, caches, n,
                                                           end_id=end_id, limit=limit,
                                                           route_tie=tol.route_tie)
    got, logits = call(runner, tokens, start, end_id=end_id, limit=limit)
    if races_found():
        return CheckResult(float("inf"), 0.0, float("inf"), n, time.perf_counter() - t0, True)
    keep, kc = ~tied, runner.caches()
    cache_err = max(float(np.max(np.abs(kc[k].astype(np.float32) - np.asarray(v, np.float32))[keep],
                                 initial=0.0)) for k, v in ref_caches.items())
    cache_scale = max(float(np.max(np.abs(np.asarray(v, np.float32))))
                      for v in ref_caches.values())
    logits, ref_logits = used_logits(model, logits, ref_logits)
    err, scale = 0.0, float(np.max(np.abs(ref_logits)))
    if logits is not None and (running & keep).any():
        err = float(np.max(np.abs(logits[running & keep] - ref_logits[running & keep])))
    agreement = float(np.mean(got[keep] == want[keep])) if keep.any() else 1.0
    return CheckResult(err, agreement, cache_err, n, time.perf_counter() - t0,
                       False, tol.logits * (1.0 + scale), [err], tol.state * (1.0 + cache_scale),
                       tokens=got, route_ties=int(tied.sum()), bounds=tol, logit_scale=scale,
                       cache_scale=cache_scale)
