"""moe.moe_routed in a minimal grid-less pallas_call vs the reference (models.kind_moe.moe).

Each simulated core (expert parallel: a slice of the experts at an offset;
tensor parallel: a slice of every expert's intermediate) runs its own kernel in
strict interpret mode; the partials summed over cores must equal the reference.
Padding rows of x are NaN: they must neither route nor leak. One TPU7x AOT compile.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.kernels import moe as M
from megakernel.backends.pallas_tpu.codegen.declare import allocation
from megakernel.ir.ops import MoE
from megakernel.backends.pallas_tpu.kernels import blocks as rt
from megakernel.backends.pallas_tpu.check.against_reference import interpret_params as interpret, races_found
from megakernel.models import kind_moe


def build(g: M.MoEGeometry, layers: int, loop: int, interp, static_offset=None):
    """Kernel: `loop` consecutive layers from layer_ref[0]; expert offset from
    SMEM (traced) unless static_offset is given. out [loop, RP, hidden]."""

    needs = M.buffers(g)
    names = [n.name for n in needs]

    def kernel(layer_ref, off_ref, x_ref, xr_ref, r_ref, b_ref, n_ref, wg, wu, wd, o_ref, *scr):
        off = off_ref[0] if static_offset is None else static_offset

        def body(i, c):
            bias = b_ref[...] if g.correction_bias else None
            # as the emitter's ring linear, of the router's own input (a latent
            # MoE's full-width one; x itself otherwise)
            logits = rt.matmul(xr_ref[i], r_ref[...], exact=r_ref.dtype == jnp.float32)
            norm = n_ref[...] if g.expert_output_norm else None
            o_ref[i] = M.moe_routed(g, x_ref[i], logits, bias, wg, wu, wd, layer_ref[0] + i,
                                    off, bufs=M.Buffers(**dict(zip(names, scr))), out_norm=norm)
            return c

        jax.lax.fori_loop(0, loop, body, 0)

    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((loop, g.rows_padded, g.hidden), jnp.float32),
        in_specs=[smem, smem, vmem, vmem, vmem, vmem, vmem, hbm, hbm, hbm],
        out_specs=vmem,
        scratch_shapes=[allocation(n.space, n.shape, n.dtype) for n in needs],
        interpret=interp,
    )


def run_case(rows, experts, top_k, scoring, bias, renorm, slots, ep, tp, chunks,
             activation="silu", dtype=jnp.float32, scaling=1.0, hidden=128, inter=256,
             layer=1, layers=2, loop=1, static=False, tie=False, seed=0, groups=(1, 1),
             latent=None):
    """``latent``: Muse Spark's options of the op (``MoE`` fields: router_dim,
    router_f32, router_logit_scale, renormalize_eps, expert_output_norm and
    its eps, input-scaled form and offset)."""
    rng = np.random.default_rng(seed)
    rp = -(-rows // 8) * 8
    latent = latent or {}
    op = MoE(hidden, experts, top_k, inter, scoring=scoring, correction_bias=bias,
             renormalize=renorm, routed_scaling=scaling, activation=activation,
             n_group=groups[0], topk_group=groups[1], **latent)
    norm = lambda shape, s: (rng.standard_normal(shape) * s).astype(np.float32)
    rdim = op.router_width
    router = jnp.asarray(norm((rdim, experts), 1.0), jnp.float32 if op.router_f32 else dtype)
    rbias = norm((experts,), 0.3)
    if tie == "groups":   # every group a copy of group 0: all group scores tie
        per = experts // groups[0]
        router = jnp.tile(router[:, :per], (1, groups[0]))
        rbias = np.tile(rbias[:per], groups[0])
    elif tie:   # equal router columns 2i, 2i+1 (and bias): top-k ties -> lowest index
        router = router.at[:, 1::2].set(router[:, 0::2])
        rbias[1::2] = rbias[0::2]
    wg = jnp.asarray(norm((layers, experts, hidden, inter), hidden ** -0.5), dtype)
    wu = jnp.asarray(norm((layers, experts, hidden, inter), hidden ** -0.5), dtype)
    wd = jnp.asarray(norm((layers, experts, inter, hidden), inter ** -0.5), dtype)
    x = norm((loop, rp, hidden), 1.0)
    x[:, rows:] = np.nan
    xr = norm((loop, rp, rdim), 1.0) if op.router_dim else x
    xr[:, rows:] = np.nan
    out_norm = jnp.asarray(norm((1, hidden), 0.3) + (0.0 if op.expert_output_norm_offset else 1.0),
                           dtype)

    el, il = experts // ep, inter // tp
    g = M.MoEGeometry(rows, rp, hidden, experts, el, il, top_k, scoring, bias, renorm,
                      scaling, activation, slots, jnp.dtype(dtype).name, chunk=il // chunks,
                      n_group=groups[0], topk_group=groups[1],
                      router_logit_scale=op.router_logit_scale,
                      renormalize_eps=op.renormalize_eps,
                      expert_output_norm=op.expert_output_norm,
                      expert_output_norm_eps=op.expert_output_norm_eps,
                      expert_output_norm_input_scaled=op.expert_output_norm_input_scaled,
                      expert_output_norm_offset=op.expert_output_norm_offset)
    total = 0.0
    for c in range(ep * tp):
        e0, i0 = (c // tp) * el, (c % tp) * il
        offset = e0 if static else None
        f = jax.jit(build(g, layers, loop, interpret(), static_offset=offset))
        part = f(jnp.asarray([layer], jnp.int32), jnp.asarray([e0], jnp.int32), x, xr, router,
                 jnp.asarray(rbias[None]), out_norm.astype(jnp.float32),
                 wg[:, e0:e0 + el, :, i0:i0 + il],
                 wu[:, e0:e0 + el, :, i0:i0 + il], wd[:, e0:e0 + el, i0:i0 + il])
        part = np.asarray(part)
        assert not races_found()
        assert np.all(part[:, rows:] == 0)
        total = total + part
    for i in range(loop):
        l = layer + i
        p = {"router": router, "router_bias": jnp.asarray(rbias), "experts_gate": wg[l],
             "experts_up": wu[l], "experts_down": wd[l], "expert_output_norm": out_norm[0]}
        want = np.asarray(kind_moe.moe(op, p, jnp.asarray(x[i, :rows]),
                                       router_x=jnp.asarray(xr[i, :rows])))
        scale = max(1.0, float(np.max(np.abs(want))))
        # bf16: h is rounded to bf16 before `down`, and a 1-ulp f32 difference
        # (other summation order) can flip that rounding; a wrong expert is O(1).
        tol = 2e-5 if dtype == jnp.float32 else 1e-3
        np.testing.assert_allclose(total[i, :rows], want, atol=tol * scale, rtol=tol)


@pytest.mark.parametrize("case", [
    # rows, experts, top_k, scoring, bias, renorm, slots, ep, tp, chunks
    (3, 8, 2, "softmax", False, True, 2, 1, 1, 1),
    (8, 16, 4, "sigmoid", True, True, 3, 2, 1, 2),          # rows*k > experts > slots
    (1, 4, 1, "softmax", False, False, 1, 1, 2, 1),         # single slot, tensor parallel
    (5, 4, 4, "sigmoid", False, False, 4, 1, 1, 2),         # k = E: every expert
])
def test_moe_cases(case):
    run_case(*case)


@pytest.mark.parametrize("bias", [False, True])
def test_moe_ties_pick_lowest_index(bias):
    run_case(4, 8, 3, "softmax", bias, False, 2, 2, 1, 1, tie=True)


@pytest.mark.parametrize("case, groups", [
    # DeepSeek routing: sigmoid, selection bias, group-limited top-k, scaling after
    # renormalising; rows*k > experts so groups and experts both matter
    ((8, 16, 4, "sigmoid", True, True, 3, 2, 1, 2), (4, 2)),
    ((6, 8, 2, "sigmoid", True, True, 2, 1, 2, 1), (2, 1)),
    ((5, 8, 3, "softmax", False, False, 2, 1, 1, 1), (4, 3)),
])
def test_moe_group_limited_routing(case, groups):
    run_case(*case, scaling=2.5, groups=groups)


@pytest.mark.parametrize("bias", [False, True])
def test_moe_group_ties_pick_lowest_group_and_expert(bias):
    """Equal router columns 2i, 2i+1: experts tie in pairs (with groups of 2,
    each group's top-2 sum is built from a tie); then every group equal."""
    run_case(4, 8, 3, "sigmoid", bias, True, 2, 2, 1, 1, tie=True, groups=(4, 2))
    run_case(4, 8, 2, "sigmoid", bias, True, 2, 1, 1, 1, tie=True, groups=(2, 1))
    # all groups equal: the lowest topk_group groups win, then the lowest experts
    run_case(4, 16, 3, "sigmoid", bias, True, 2, 2, 1, 1, tie="groups", groups=(4, 2))


def test_group_limit_reference_against_numpy():
    """models.kind_moe.route with groups against a NumPy transcription of the
    README's routing facts (HF DeepseekV3TopkRouter order)."""
    rng = np.random.default_rng(3)
    n, E, G, KG, K, H = 9, 16, 4, 2, 3, 32
    op = MoE(H, E, K, 64, scoring="sigmoid", correction_bias=True, renormalize=True,
             routed_scaling=2.5, n_group=G, topk_group=KG)
    x = rng.standard_normal((n, H)).astype(np.float32)
    p = {"router": jnp.asarray(rng.standard_normal((H, E)).astype(np.float32) / 4),
         "router_bias": jnp.asarray(0.1 * rng.standard_normal(E).astype(np.float32))}
    ids, w = kind_moe.route(op, p, jnp.asarray(x))
    s = 1 / (1 + np.exp(-(x.astype(np.float64) @ np.asarray(p["router"], np.float64))))
    b = s + np.asarray(p["router_bias"], np.float64)
    for t in range(n):
        gs = np.sort(b[t].reshape(G, E // G), -1)[:, -2:].sum(-1)
        keep = np.argsort(-gs, kind="stable")[:KG]
        cand = np.full(E, -np.inf)
        for g in keep:
            cand[g * E // G:(g + 1) * E // G] = b[t, g * E // G:(g + 1) * E // G]
        want = np.argsort(-cand, kind="stable")[:K]
        ww = s[t, want] / (s[t, want].sum() + 1e-20) * 2.5
        assert sorted(np.asarray(ids[t]).tolist()) == sorted(want.tolist())
        np.testing.assert_allclose(np.sort(np.asarray(w[t])), np.sort(ww), rtol=1e-5)


MUSE = dict(router_f32=True, router_logit_scale=2 ** -2.5, renormalize_eps=1e-15,
            expert_output_norm=True, expert_output_norm_eps=1e-8,
            expert_output_norm_input_scaled=True, expert_output_norm_offset=True)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case, latent", [
    # Muse Spark's router on a wider input than the experts', its per-expert
    # input-scaled norm; experts over 2 cores, each in 2 slices summed first
    ((8, 8, 2, "sigmoid", True, True, 3, 2, 1, 2), {**MUSE, "router_dim": 256}),
    ((3, 8, 3, "sigmoid", True, True, 2, 1, 1, 1), MUSE),
    # the plain per-expert norm, rms(y) * w (no offset), a bf16 router, softmax
    ((5, 4, 2, "softmax", False, True, 2, 1, 1, 2), dict(
        expert_output_norm=True, expert_output_norm_eps=1e-5, router_logit_scale=0.5)),
], ids=["muse-ep2-sliced", "muse-one-core", "plain-norm-sliced"])
def test_moe_latent_options(case, latent, dtype):
    # run_case's tolerances; measured here at 0.023 of the f32 one (4.7e-7 of
    # the output's scale) and 1.8e-4 of the bf16 one
    run_case(*case, dtype=dtype, scaling=1.5, latent=latent)


def test_moe_bf16_layer_loop_static_offset():
    run_case(6, 8, 2, "sigmoid", True, True, 2, 2, 1, 1, activation="gelu_tanh",
             dtype=jnp.bfloat16, scaling=2.5, layer=0, loop=2, static=True)


@settings(max_examples=5)
@given(st.integers(1, 12), st.sampled_from([4, 8, 16]), st.integers(1, 4),
       st.sampled_from(["softmax", "sigmoid"]), st.booleans(), st.booleans(),
       st.integers(1, 4), st.sampled_from([(1, 1), (2, 1), (4, 1), (1, 2)]),
       st.sampled_from([1, 2]), st.sampled_from(["silu", "gelu", "gelu_tanh"]),
       st.sampled_from([jnp.float32, jnp.bfloat16]), st.integers(0, 9))
def test_moe_matches_reference(rows, experts, top_k, scoring, bias, renorm, slots, split,
                               chunks, activation, dtype, seed):
    ep, tp = split
    run_case(rows, experts, min(top_k, experts), scoring, bias, renorm, slots, ep, tp,
             chunks if tp == 1 else 1, activation=activation, dtype=dtype,
             scaling=1.0 + seed % 3, seed=seed)


@pytest.mark.aot
def test_moe_compiles_for_tpu7x():
    pytest.importorskip("libtpu")
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(topology_name="tpu7x:2x2x1", platform="tpu")
    mesh = jax.sharding.Mesh(topo.devices, ("x",))
    sh = jax.sharding.SingleDeviceSharding(topo.devices[0])
    H, E, EL, I, dt = 1024, 16, 8, 512, jnp.bfloat16
    # the last: Muse Spark's options, an f32 router at full precision on a
    # wider input, each chunked expert's output summed and input-scaled-normed
    muse = dict(router_logit_scale=2 ** -2.5, renormalize_eps=1e-15, expert_output_norm=True,
                expert_output_norm_eps=1e-8, expert_output_norm_input_scaled=True,
                expert_output_norm_offset=True)
    for chunk, static, latent in ((I, None, {}), (256, 8, {}), (256, None, muse)):
        g = M.MoEGeometry(5, 8, H, E, EL, I, 4, "sigmoid", True, True, 2.5, "gelu",
                          3, jnp.dtype(dt).name, chunk=chunk, **latent)
        f = build(g, 4, 2, False, static_offset=static)
        rdim, rdt = (2 * H, jnp.float32) if latent else (H, dt)
        sds = [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d in (
            ((1,), jnp.int32), ((1,), jnp.int32), ((2, 8, H), jnp.float32),
            ((2, 8, rdim), jnp.float32), ((rdim, E), rdt), ((1, E), jnp.float32),
            ((1, H), jnp.float32), ((4, EL, H, I), dt), ((4, EL, H, I), dt),
            ((4, EL, I, H), dt))]
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            jax.jit(f).trace(*sds).lower().compile()
