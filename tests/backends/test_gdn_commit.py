"""Gated DeltaNet's state committed after the call (backends/pallas_tpu/kernels/state_commit.py):
the kernel reads the state only and returns the call's updates; the commit in
the same jit gives the reference's state. The commit rules against the
reference's recurrence and conv (exactly as written in models/kind_gdn.py),
the stop rule replayed on a call's tokens, and a 2-core kernel over three
calls of 2 tokens against the reference."""

import numpy as np
import jax.numpy as jnp

from megakernel.backends.pallas_tpu.check.kernel_check import check as check_kernel
from megakernel.backends.pallas_tpu.kernels import state_commit as commit
from megakernel.compiler.pipeline import plan_model
from megakernel.ir.config import build
from megakernel.models.kind_gdn import causal_conv, delta_rule
from megakernel.models.weights import init_weights
from tests.backends.test_gdn_op import HYBRID, STATE_TOL

# Measured (f32, CPU, 2026-12-04): the low-rank commit against the sequential
# rule, 20 seeds, worst 2.4e-7 (|S| up to 1.4; the same sums in another
# order), hence 1e-6; the 2-core kernel's states after three calls of 2 tokens
# 1.7e-6 (1 core, 2 calls: 1.9e-6), within test_gdn_op's STATE_TOL.
COMMIT_TOL = 1e-6


def _rows(rng, b=2, t=3, hk=1, hv=2, dk=8, dv=8):
    k = rng.normal(size=(b, t, hk, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    return (k, rng.normal(size=(b, t, hv, dv)), rng.uniform(0.1, 0.9, (b, t, hv)),
            -rng.uniform(0.05, 0.7, (b, t, hv)))


def test_low_rank_commit_is_the_delta_rule():
    rng = np.random.default_rng(0)
    b, t, hk, hv, dk, dv, w = 2, 3, 1, 2, 8, 8, 8
    s0 = rng.normal(size=(b, hv, dk, dv))
    k, v, beta, g = _rows(rng, b, t, hk, hv, dk, dv)
    _, states = delta_rule(jnp.asarray(s0, jnp.float32), *(jnp.asarray(x, jnp.float32) for x in
                                                          (k, k, v, beta, g)), group=hv // hk)
    # the kernel's update rows: per value head, key | u_t (after the decay) |
    # the log-decays summed up to t over dv lanes; rows after the call's are
    # garbage the commit must not read
    upd = np.full((1, b, hv, w, dk + 2 * dv), np.nan, np.float32)
    s, summed = s0.copy(), np.zeros((b, hv))
    for i in range(t):
        kk = np.repeat(k[:, i], hv // hk, axis=1)                       # [b, hv, dk]
        s = s * np.exp(g[:, i])[..., None, None]
        u = beta[:, i][..., None] * (v[:, i] - np.einsum("bhk,bhkv->bhv", kk, s))
        s = s + kk[..., :, None] * u[..., None, :]
        summed = summed + g[:, i]
        upd[0, :, :, i] = np.concatenate([kk, u, np.repeat(summed[..., None], dv, -1)], -1)
    got = commit.low_rank(jnp.asarray(s0[None], jnp.float32), jnp.asarray(upd),
                          jnp.asarray([1, 0], jnp.int32), tokens=t, key_dim=dk, value_dim=dv)
    assert np.max(np.abs(np.asarray(got[0, 0]) - np.asarray(states[-1][0]))) <= COMMIT_TOL
    np.testing.assert_array_equal(np.asarray(got[0, 1]), s0[1].astype(np.float32))  # ran no step


def test_shift_rows_is_the_convs_history():
    rng = np.random.default_rng(1)
    hist = rng.normal(size=(1, 3, 3, 16)).astype(np.float32)
    new = rng.normal(size=(1, 3, 4, 16)).astype(np.float32)
    rows = np.full((1, 3, 8, 16), np.nan, np.float32)       # the history, then the call's rows
    rows[:, :, :3], rows[:, :, 3:7] = hist, new
    got = np.asarray(commit.shift_rows(jnp.asarray(hist), jnp.asarray(rows),
                                       jnp.asarray([2, 1, 0], jnp.int32), tokens=2))
    w = jnp.ones((4, 16), jnp.float32)
    for seq, n in ((0, 4), (1, 2)):     # 2 steps of 2 rows, 1 step
        _, after = causal_conv(w, jnp.asarray(hist[0, seq:seq + 1]),
                               jnp.asarray(new[0, seq:seq + 1, :n]))
        np.testing.assert_array_equal(got[0, seq], np.asarray(after[0]))
    np.testing.assert_array_equal(got[0, 2], hist[0, 2])                   # ran no step


def test_steps_run_replays_the_stop_rule():
    # 4 steps; end id 7. Row 0 emits it at step 1 (ran 0 and 1); row 1 starts
    # at 4 with limit 6 (positions 4 and 5); row 2 starts at its limit (none);
    # row 3 runs all 4.
    tokens = np.zeros((8, 128), np.int32)
    tokens[0, :4] = [3, 7, 7, 7]
    tokens[1, :4] = [5, 6, -1, -1]
    tokens[3, :4] = [1, 2, 3, 4]
    ran = commit.steps_run(jnp.asarray(tokens), jnp.asarray([0, 4, 9, 0], jnp.int32),
                           jnp.asarray([7], jnp.int32), jnp.asarray([64, 6, 9, 64], jnp.int32),
                           batch=4, steps=4, max_len=64)
    np.testing.assert_array_equal(np.asarray(ran), [2, 2, 0, 4])


def test_two_cores_commit_the_reference_state_over_three_calls():
    model = build(HYBRID)
    plan = plan_model(model, devices=2, batch=2, tokens=2)
    whole = [o for o in plan.memory.operands if o.role == "cache" and not o.new_rows]
    # the body's run of 3 GDN layers is one node: its 4 states, each [3 x 2 run-layers, ...]
    assert len(whole) == 4 and all(o.updates for o in whole)
    assert all(plan.memory.buffer(o.buffer).shape[0] == 3 * 2 for o in whole)
    # nothing of the state is copied around the call: next_token only ([8, 128] int32)
    assert plan.cost.copy_bytes == 8 * 128 * 4
    assert plan.cost.commit_bytes == sum(s.commit_bytes for s in plan.memory.states) > 0
    result = check_kernel(model, plan, init_weights(model), steps=3)
    assert result.ok, result
    assert result.cache_max_err <= STATE_TOL, result
