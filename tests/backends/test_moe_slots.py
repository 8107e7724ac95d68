"""moe.moe_routed's per-slot form (ir/kind_moe.py ``per_slot``) and
moe_slots.combine (the expert_combine op) vs the reference
(models.kind_moe.moe, models.kind_expert_combine.combine).

Each simulated core runs its kernel in strict interpret mode on its slice
(expert parallel: experts at an offset; tensor parallel: a slice of every
expert's FFN width); the slots summed over cores must equal the reference's
picks, every core must give the same weights, and the combine of the summed
slots the reference's combine. Padding rows of x are NaN: they must neither
route nor leak.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.check.against_reference import interpret_params, races_found
from megakernel.backends.pallas_tpu.codegen.declare import allocation
from megakernel.backends.pallas_tpu.kernels import blocks as rt
from megakernel.backends.pallas_tpu.kernels import moe as M
from megakernel.backends.pallas_tpu.kernels import moe_slots
from megakernel.ir.kind_expert_combine import ExpertCombine
from megakernel.ir.ops import MoE
from megakernel.models import kind_expert_combine, kind_moe


def _kernel(g: M.MoEGeometry, offset: int, bias_here: bool):
    needs = M.buffers(g)
    names = [n.name for n in needs]

    def kernel(x_ref, xr_ref, r_ref, b_ref, wg, wu, wd, bg, bu, bd, s_ref, w_ref, *scr):
        logits = rt.matmul(xr_ref[...], r_ref[...], exact=r_ref.dtype == jnp.float32)
        biases = (bg[...], bu[...], bd[...]) if g.expert_bias else None
        s_ref[...], w_ref[...] = M.moe_routed(
            g, x_ref[...], logits, b_ref[...], wg, wu, wd, 0, offset,
            bufs=M.Buffers(**dict(zip(names, scr))), biases=biases, bias_here=bias_here)

    vmem, hbm = pl.BlockSpec(memory_space=pltpu.VMEM), pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel, out_shape=(
            jax.ShapeDtypeStruct((g.rows_padded, g.top_k * g.hidden), jnp.float32),
            jax.ShapeDtypeStruct((g.rows_padded, g.top_k), jnp.float32)),
        in_specs=[vmem] * 4 + [hbm] * 3 + [vmem] * 3, out_specs=(vmem, vmem),
        scratch_shapes=[allocation(n.space, n.shape, n.dtype) for n in needs],
        interpret=interpret_params())


def _case(rows, experts, top_k, ep, tp, chunks, dtype, expert_bias=False, seed=0):
    hidden, inter, rdim = 128, 256, 256
    rng = np.random.default_rng(seed)
    norm = lambda shape, s: (rng.standard_normal(shape) * s).astype(np.float32)  # noqa: E731
    rp = -(-rows // 8) * 8
    op = MoE(hidden, experts, top_k, inter, scoring="sigmoid", correction_bias=True,
             renormalize=True, routed_scaling=1.5, router_dim=rdim, router_f32=True,
             router_logit_scale=2 ** -2.5, renormalize_eps=1e-15, expert_bias=expert_bias,
             per_slot=True)
    router, rbias = jnp.asarray(norm((rdim, experts), 1.0)), norm((1, experts), 0.3)
    wg, wu = (jnp.asarray(norm((1, experts, hidden, inter), hidden ** -0.5), dtype)
              for _ in range(2))
    wd = jnp.asarray(norm((1, experts, inter, hidden), inter ** -0.5), dtype)
    bg, bu, bd = (norm((1, experts, w), 0.1) for w in (inter, inter, hidden))
    x, xr = norm((rp, hidden), 1.0), norm((rp, rdim), 1.0)
    x[rows:], xr[rows:] = np.nan, np.nan
    el, il = experts // ep, inter // tp
    g = M.MoEGeometry(rows, rp, hidden, experts, el, il, top_k, "sigmoid", True, True, 1.5,
                      "silu", 2, jnp.dtype(dtype).name, chunk=il // chunks,
                      router_logit_scale=2 ** -2.5, renormalize_eps=1e-15,
                      expert_bias=expert_bias, per_slot=True)
    slots, weights = 0.0, []
    for c in range(ep * tp):
        e0, i0 = (c // tp) * el, (c % tp) * il
        cut = lambda w, a: w[:, e0:e0 + el, ..., i0:i0 + il] if a else w[:, e0:e0 + el]  # noqa
        s, w = jax.jit(_kernel(g, e0, c % tp == 0))(
            x, xr, router, rbias, cut(wg, 1), cut(wu, 1), wd[:, e0:e0 + el, i0:i0 + il],
            cut(bg, 1), cut(bu, 1), cut(bd, 0))
        assert not races_found()
        s, w = np.asarray(s), np.asarray(w)
        assert np.all(s[rows:] == 0) and np.all(w[rows:] == 0)
        slots, weights = slots + s, weights + [w]
    for w in weights[1:]:                       # the same routing on every core, bit for bit
        np.testing.assert_array_equal(w, weights[0])
    p = {"router": router, "router_bias": jnp.asarray(rbias[0]), "experts_gate": wg[0],
         "experts_up": wu[0], "experts_down": wd[0], "experts_gate_bias": bg[0],
         "experts_up_bias": bu[0], "experts_down_bias": bd[0]}
    want_s, want_w = kind_moe.moe(op, p, jnp.asarray(x[:rows]), router_x=jnp.asarray(xr[:rows]))
    want_s, want_w = np.asarray(want_s), np.asarray(want_w)
    # run_case's tolerances (tests/backends/test_moe_op.py)
    tol = 2e-5 if dtype == jnp.float32 else 1e-3
    scale = max(1.0, float(np.max(np.abs(want_s))))
    np.testing.assert_allclose(slots[:rows], want_s, atol=tol * scale, rtol=tol)
    np.testing.assert_allclose(weights[0][:rows], want_w, rtol=1e-6)
    return slots, weights[0], want_s, want_w


@pytest.mark.parametrize("ep, tp, chunks", [(1, 1, 1), (1, 2, 1), (2, 1, 2), (2, 2, 1),
                                            (1, 4, 1), (4, 1, 1)])
def test_per_slot_picks_sum_over_cores_to_the_reference(ep, tp, chunks):
    _case(5, 8, 3, ep, tp, chunks, jnp.float32)


def test_per_slot_bf16_with_expert_biases_added_once_per_expert():
    # the down bias on one core of each width split, at the first of an expert's slices
    _case(8, 8, 2, 1, 2, 2, jnp.bfloat16, expert_bias=True, seed=1)


@pytest.mark.parametrize("input_scaled, offset", [(True, True), (False, False)])
def test_combine_of_the_summed_picks_is_the_reference_combine(input_scaled, offset):
    slots, weights, want_s, want_w = _case(3, 8, 2, 2, 1, 1, jnp.float32, seed=2)
    op = ExpertCombine(128, 2, True, 1e-8, input_scaled, offset)
    w = np.random.default_rng(3).standard_normal(128).astype(np.float32) * 0.3
    got = moe_slots.combine(jnp.asarray(slots[:3]), jnp.asarray(weights[:3]),
                            jnp.asarray(w)[None], top_k=2, eps=1e-8, input_scaled=input_scaled,
                            offset=offset, dtype="float32")
    want = kind_expert_combine.combine(op, {"weight": jnp.asarray(w)}, jnp.asarray(want_s),
                                       jnp.asarray(want_w))
    # measured 3.2e-7 and 3.6e-7 of the output's scale (f32: the slots' sums over
    # cores and the norm's order of operations differ), so 2e-6
    np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                               atol=2e-6 * float(np.max(np.abs(want))), rtol=0)
