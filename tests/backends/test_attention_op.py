"""attention.attend in a minimal grid-less pallas_call vs the reference
(models.kind_attention.attention).

Strict interpret mode (race detection, OOB reads raise, NaN-filled scratch);
cache positions past start+T are NaN in the kernel's input so any read of them
that leaks into the output shows up. The cache is read only; the kernel's
windows of new rows are written into it after the call (new_rows.write_back),
as the megakernel's jit does. One AOT compile for TPU7x. Also with Gemma 2's score soft-capping and gpt-oss's
attention sinks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.kernels import attention as A
from megakernel.backends.pallas_tpu.kernels import appended_state as new_rows
from megakernel.backends.pallas_tpu.codegen.declare import allocation
from megakernel.ir.ops import Attention
from megakernel.backends.pallas_tpu.check.against_reference import interpret_params as interpret, races_found
from megakernel.models import kind_attention, reference as R


def build(g: A.AttentionGeometry, layers: int, loop: int, interp):
    """Kernel: `loop` consecutive layers starting at layer_ref[0], one attend each
    (as the megakernel's layer fori_loop does), out [loop, RP, Hq*D]."""

    needs = A.buffers(g)
    names = [n.name for n in needs]

    def kernel(start_ref, layer_ref, q_ref, k_ref, v_ref, kc, vc, sinks_ref, o_ref, kn, vn,
               *scr):
        sinks = sinks_ref[...] if g.sinks else None

        # The megakernel's repetitions count from 0 in its stack loop (the
        # windows are numbered from there): the touched layers as a view.
        caches = tuple(r.at[pl.ds(layer_ref[0], loop)] for r in (kc, vc, kn, vn))
        bufs = A.Buffers(**dict(zip(names, scr)))

        def body(i, c):
            A.prefetch(g, *caches, i, start_ref, start_ref, True, bufs=bufs)
            o_ref[i] = A.attend(g, q_ref[i], k_ref[i], v_ref[i], *caches, i, start_ref,
                                start_ref, True, bufs=bufs, sinks=sinks)
            return c

        jax.lax.fori_loop(0, loop, body, 0)
        A.drain(g, *caches, loop, bufs=bufs)

    cache = jax.ShapeDtypeStruct((layers, g.batch, A.window_rows(g), g.width), g.cache_dtype)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((loop, g.rows_padded, g.q_heads * g.head_dim),
                                        jnp.float32), cache, cache),
        in_specs=[smem, smem, vmem, vmem, vmem, hbm, hbm, vmem],
        out_specs=(vmem, hbm, hbm),
        scratch_shapes=[allocation(n.space, n.shape, n.dtype) for n in needs],
        interpret=interp,
    )


def write_back(g, cache, new, start, layer, loop):
    """The cache after the call: the touched layers' windows written in."""
    rows, align = A.window_rows(g), A.row_align(g.cache_dtype)
    part = new_rows.write_back(cache[layer:layer + loop], new[layer:layer + loop], start,
                               rows=rows, align=align, seq=g.max_seq_len)
    return cache.at[layer:layer + loop].set(part)


def run_case(batch, tokens, kv_heads, group, head_dim, kv_tile, seq_tiles, window, dtype,
             starts, layer=1, layers=2, loop=1, seed=0, softcap=None, sinks=False):
    S = kv_tile * seq_tiles
    rows = batch * tokens
    rp = -(-rows // 8) * 8
    hq = kv_heads * group
    op = Attention(hq, kv_heads, head_dim, sliding_window=window, logit_softcap=softcap,
                   sinks=sinks)
    g = A.AttentionGeometry(batch, tokens, rp, hq, kv_heads, head_dim, kv_tile, S,
                            op.softmax_scale, window, jnp.dtype(dtype).name, softcap, sinks)
    rng = np.random.default_rng(seed)
    sink = (2.0 * rng.standard_normal((1, hq))).astype(np.float32)   # some above every score
    start = np.asarray(starts, np.int32)
    q = rng.standard_normal((loop, rp, hq * head_dim)).astype(np.float32)
    k = rng.standard_normal((loop, rp, g.width)).astype(np.float32)
    v = rng.standard_normal((loop, rp, g.width)).astype(np.float32)
    q[:, rows:] = k[:, rows:] = v[:, rows:] = np.nan      # padding rows must not leak
    kc = jnp.asarray(rng.standard_normal((layers, batch, S, g.width)), dtype)
    vc = jnp.asarray(rng.standard_normal((layers, batch, S, g.width)), dtype)

    positions = jnp.asarray(start[:, None] + np.arange(tokens)[None], jnp.int32)
    want_out, want_k, want_v = [], kc, vc
    for i in range(loop):
        name, l = "a", layer + i
        shape = (batch, S, kv_heads, head_dim)
        caches = {"x.a.k": want_k[l].reshape(shape), "x.a.v": want_v[l].reshape(shape)}
        ctx = R._Ctx(batch, tokens, positions, caches, "x.")
        want_out.append(kind_attention.attention(op, jnp.asarray(q[i, :rows]), jnp.asarray(k[i, :rows]),
                                    jnp.asarray(v[i, :rows]), ctx, name,
                                    {"sinks": jnp.asarray(sink[0])}))
        want_k = want_k.at[l].set(ctx.caches["x.a.k"].reshape(batch, S, -1))
        want_v = want_v.at[l].set(ctx.caches["x.a.v"].reshape(batch, S, -1))

    # Poison everything not yet written (>= start+T) in the layers attend touches.
    live = np.arange(S)[None, :] < (start + tokens)[:, None]             # [B, S]
    touched = np.zeros(layers, bool)
    touched[layer:layer + loop] = True
    dead = (~live)[None, :, :, None] & touched[:, None, None, None]
    kc_in = jnp.where(dead, jnp.nan, kc).astype(dtype)
    vc_in = jnp.where(dead, jnp.nan, vc).astype(dtype)

    f = jax.jit(build(g, layers, loop, interpret()))
    out, kn, vn = f(jnp.asarray(start), jnp.asarray([layer], jnp.int32), q, k, v, kc_in, vc_in,
                    sink)
    out = np.asarray(out)
    k2, v2 = (write_back(g, c, n, jnp.asarray(start), layer, loop)
              for c, n in ((kc_in, kn), (vc_in, vn)))
    assert not races_found()
    for i in range(loop):
        np.testing.assert_allclose(out[i, :rows], np.asarray(want_out[i]), atol=2e-5, rtol=1e-5)
        assert np.all(np.isfinite(out[i, rows:]))
    for got, want in ((k2, want_k), (v2, want_v)):
        want = jnp.where(dead, jnp.nan, want).astype(dtype)
        assert np.array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32),
                              equal_nan=True)


@pytest.mark.parametrize("case", [
    # batch, tokens, kv_heads, group, head_dim, kv_tile, seq_tiles, window, dtype, starts
    (3, 3, 2, 2, 128, 16, 4, None, jnp.bfloat16, [0, 14, 61]),   # straddle; last slot
    (1, 1, 1, 4, 128, 32, 2, None, jnp.float32, [63]),            # T=1 at max_seq_len-1
    (2, 4, 1, 3, 128, 16, 3, 5, jnp.bfloat16, [30, 12]),          # small window
    (8, 1, 1, 1, 128, 16, 2, None, jnp.float32, [0, 1, 15, 16, 17, 30, 31, 8]),
    # [128 rows, 256 keys] of scores pass 64 KiB (SCORE_BYTES): each 256-key
    # tile is scored in a loop of two 128-key blocks
    (8, 2, 1, 8, 64, 256, 2, None, jnp.float32, [0, 127, 128, 255, 256, 300, 383, 510]),
    (4, 4, 1, 8, 64, 256, 2, 130, jnp.bfloat16, [0, 129, 260, 508]),
])
def test_attend_cases(case):
    run_case(*case)


@pytest.mark.parametrize("case, softcap, sinks", [
    # Gemma 2's soft-capped scores, gpt-oss's sinks (alone and with a window)
    ((2, 2, 2, 2, 128, 16, 3, None, jnp.float32, [5, 40]), 2.0, False),
    ((3, 1, 2, 2, 64, 16, 2, None, jnp.float32, [0, 17, 31]), None, True),
    ((2, 3, 1, 4, 128, 16, 3, 4, jnp.bfloat16, [30, 12]), 5.0, True),
])
def test_attend_softcap_and_sinks(case, softcap, sinks):
    run_case(*case, softcap=softcap, sinks=sinks)


def test_attend_in_layer_loop():
    # two consecutive layers in one fori_loop: no DMA may stay in flight
    run_case(2, 2, 2, 2, 128, 16, 2, 7, jnp.bfloat16, [15, 3], layer=0, layers=2, loop=2)


@st.composite
def cases(draw):
    batch, tokens = draw(st.integers(1, 8)), draw(st.integers(1, 4))
    kv_tile = draw(st.sampled_from([16, 32]))
    seq_tiles = draw(st.integers(1, 3))
    S = kv_tile * seq_tiles
    if S < tokens:
        seq_tiles += 1
        S += kv_tile
    edge = st.sampled_from([0, S - tokens] + [max(0, min(S - tokens, m * kv_tile - d))
                                              for m in range(1, seq_tiles + 1)
                                              for d in (1, 2)])
    starts = draw(st.lists(st.one_of(edge, st.integers(0, S - tokens)),
                           min_size=batch, max_size=batch))
    return (batch, tokens, draw(st.integers(1, 2)), draw(st.integers(1, 4)),
            draw(st.sampled_from([64, 128])), kv_tile, seq_tiles,
            draw(st.sampled_from([None, 1, 3, 17])),
            draw(st.sampled_from([jnp.float32, jnp.bfloat16])), starts)


@settings(max_examples=5)
@given(cases(), st.integers(0, 1), st.integers(0, 3), st.sampled_from([None, 3.0]),
       st.booleans())
def test_attend_matches_reference(case, layer, seed, softcap, sinks):
    run_case(*case, layer=layer, seed=seed, softcap=softcap, sinks=sinks)


@pytest.mark.aot
def test_attend_compiles_for_tpu7x():
    pytest.importorskip("libtpu")
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(topology_name="tpu7x:2x2x1", platform="tpu")
    mesh = jax.sharding.Mesh(topo.devices, ("x",))
    sh = jax.sharding.SingleDeviceSharding(topo.devices[0])
    for window, dt, cap, sinks in ((None, jnp.bfloat16, None, False),
                                    (128, jnp.float32, None, False),
                                    (128, jnp.bfloat16, 50.0, True)):
        g = A.AttentionGeometry(8, 2, 16, 8, 2, 128, 256, 4096, 0.088, window,
                                jnp.dtype(dt).name, cap, sinks)
        f = build(g, 4, 2, False)
        sds = [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d in (
            ((8,), jnp.int32), ((1,), jnp.int32), ((2, 16, 1024), jnp.float32),
            ((2, 16, 256), jnp.float32), ((2, 16, 256), jnp.float32),
            ((4, 8, 4096, 256), dt), ((4, 8, 4096, 256), dt), ((1, 8), jnp.float32))]
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            jax.jit(f).trace(*sds).lower().compile()
