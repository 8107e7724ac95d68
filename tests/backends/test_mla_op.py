"""mla.attend (both forms) in a minimal grid-less pallas_call vs models.kind_mla.mla.

Each simulated core holds a slice of the heads (q, gate, W_UK, W_UV) and the
whole latent cache; its kernel runs in strict interpret mode (race detector,
OOB reads raise, NaN-filled scratch). Cache rows past start+T are NaN in the
kernel's input and padding rows of q / kv_a / gate are NaN, so any read of
them that leaks shows up. The cache is read only; the kernel's windows of
new rows are written into it after the call (new_rows.write_back), as the
megakernel's jit does. The heads' outputs concatenated over cores must
equal the reference, and every core's cache the reference's. One TPU7x AOT
compile per form at DeepSeek-V3's per-core shapes on 32 cores.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from megakernel.backends.pallas_tpu.kernels import mla as M
from megakernel.backends.pallas_tpu.kernels import appended_state as new_rows
from megakernel.backends.pallas_tpu.kernels.attention import row_align, window_rows
from megakernel.backends.pallas_tpu.codegen.declare import allocation
from megakernel.backends.pallas_tpu.check.against_reference import interpret_params as interpret, races_found
from megakernel.ir.kind_mla import MLA
from megakernel.ir.ops import RopeScaling
from megakernel.models import kind_mla as RM
from megakernel.models import reference as R

YARN = RopeScaling("yarn", 40.0, original_max_position=64, mscale=1.0, mscale_all_dim=0.8)


def build(g: M.MLAGeometry, layers: int, loop: int, interp, sync=False):
    """Kernel: `loop` consecutive layers from layer_ref[0], as the megakernel's
    stack loop runs them: the first layer's window and tile prefetched before
    the loop; each layer copies its W_UK / W_UV into the library's buffers (as
    the ring does: W_UK transposed for the expanded form, mla.buffers),
    attends, and prefetches the next; the last stores drained after it.
    ``sync``: the synchronised ablation (each attend starts and waits its own)."""
    needs = M.buffers(g)
    names = [n.name for n in needs]

    def kernel(start_ref, layer_ref, q_ref, kv_ref, gate_ref, norm_ref, inv_ref, pos_ref,
               uk_ref, uv_ref, cache, o_ref, rows_out, *scr):
        bufs = M.Buffers(**dict(zip(names, scr)))
        # The megakernel's repetitions count from 0 in its stack loop (the
        # windows are numbered from there): the touched layers as a view.
        state = tuple(r.at[pl.ds(layer_ref[0], loop)] for r in (cache, rows_out))
        M.prefetch(g, *state, 0, start_ref, start_ref, True, bufs=bufs, sync=sync)

        def body(i, c):
            uk = uk_ref[i]
            bufs.w_uk[...] = uk.T if g.form == "expanded" else uk
            bufs.w_uv[...] = uv_ref[i]
            o_ref[i] = M.attend(g, q_ref[i], kv_ref[i], gate_ref[i] if g.output_gate else None,
                                norm_ref[i], inv_ref[...] if g.rope else None, pos_ref[...],
                                *state, i, start_ref, start_ref, True, bufs=bufs, sync=sync)
            M.prefetch(g, *state, i + 1, start_ref, start_ref, True, bufs=bufs, sync=sync,
                       when=i + 1 < loop)
            return c

        jax.lax.fori_loop(0, loop, body, 0)
        M.drain(g, *state, loop, bufs=bufs, sync=sync)

    cache = jax.ShapeDtypeStruct((layers, g.batch, window_rows(g), g.latent), g.cache_dtype)
    smem = pl.BlockSpec(memory_space=pltpu.SMEM)
    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    hbm = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=(jax.ShapeDtypeStruct((loop, g.rows_padded, g.heads * g.v_dim), jnp.float32),
                   cache),
        in_specs=[smem, smem] + [vmem] * 8 + [hbm],
        out_specs=(vmem, hbm),
        scratch_shapes=[allocation(n.space, n.shape, n.dtype) for n in needs],
        interpret=interp,
    )


def run_case(form, batch, tokens, heads, cores, rank, dims, kv_tile, seq_tiles, dtype, starts,
             rope=True, gate=False, scaling=None, layer=1, layers=2, loop=1, seed=0, sync=False):
    dn, dr, dv = dims
    S, rows = kv_tile * seq_tiles, batch * tokens
    rp = -(-rows // 8) * 8
    L, hl = rank + dr, heads // cores
    op = MLA(heads, rank, dn, dr, dv, rope=rope, scaling=scaling if rope else None,
             output_gate=gate)
    dt = jnp.dtype(dtype).name
    rng = np.random.default_rng(seed)
    start = np.asarray(starts, np.int32)
    norm = lambda shape, s=1.0: (rng.standard_normal(shape) * s).astype(np.float32)  # noqa: E731
    q = norm((loop, rp, heads * (dn + dr)))
    kv = norm((loop, rp, L))
    gt = norm((loop, rp, heads * dv))
    q[:, rows:] = kv[:, rows:] = gt[:, rows:] = np.nan        # padding rows must not leak
    kv_norm = (1 + 0.1 * norm((loop, 1, rank)))
    w_uk = jnp.asarray(norm((loop, heads * dn, rank), rank ** -0.5), dtype)
    w_uv = jnp.asarray(norm((loop, rank, heads * dv), rank ** -0.5), dtype)
    cache = jnp.asarray(norm((layers, batch, S, L)), dtype)

    positions = jnp.asarray(start[:, None] + np.arange(tokens)[None], jnp.int32)
    want_out, want_cache = [], cache
    for i in range(loop):
        lay = layer + i
        ctx = R._Ctx(batch, tokens, positions, {"x.m.latent": want_cache[lay]}, "x.")
        p = {"kv_norm": jnp.asarray(kv_norm[i, 0]), "w_uk": w_uk[i], "w_uv": w_uv[i]}
        xs = [jnp.asarray(q[i, :rows]), jnp.asarray(kv[i, :rows]), jnp.asarray(gt[i, :rows])]
        want_out.append(np.asarray(RM.mla(op, p, xs, ctx, "m")))
        want_cache = want_cache.at[lay].set(ctx.caches["x.m.latent"])

    live = np.arange(S)[None, :] < (start + tokens)[:, None]             # [B, S]
    touched = np.zeros(layers, bool)
    touched[layer:layer + loop] = True
    dead = (~live)[None, :, :, None] & touched[:, None, None, None]
    cache_in = jnp.where(dead, jnp.nan, cache).astype(dtype)
    pos = np.zeros((rp, 1), np.int32)
    pos[:rows, 0] = np.asarray(positions).reshape(-1)
    inv = jnp.asarray(op.inv_freq().astype(np.float32)[None, :])

    g = M.MLAGeometry(batch, tokens, rp, hl, rank, dn, dr, dv, kv_tile, S, op.softmax_scale,
                      op.kv_norm_eps, rope, op.attention_factor(), gate, form, dt, dt)
    f = jax.jit(build(g, layers, loop, interpret(), sync))
    outs = []
    for c in range(cores):       # each core: its heads, the whole cache
        qs = q.reshape(loop, rp, heads, dn + dr)[:, :, c * hl:(c + 1) * hl].reshape(loop, rp, -1)
        gs = gt.reshape(loop, rp, heads, dv)[:, :, c * hl:(c + 1) * hl].reshape(loop, rp, -1)
        uk = w_uk[:, c * hl * dn:(c + 1) * hl * dn]
        uv = w_uv[:, :, c * hl * dv:(c + 1) * hl * dv]
        out, news = f(jnp.asarray(start), jnp.asarray([layer], jnp.int32), qs, kv, gs,
                      jnp.asarray(kv_norm), inv, jnp.asarray(pos), uk, uv, cache_in)
        part = new_rows.write_back(cache_in[layer:layer + loop], news[layer:layer + loop],
                                   jnp.asarray(start), rows=window_rows(g),
                                   align=row_align(g.cache_dtype), seq=S)
        got_cache = cache_in.at[layer:layer + loop].set(part)
        assert not races_found()
        got, want = (np.asarray(x, np.float32) for x in (got_cache, want_cache))
        # Rows other than the new ones are untouched, bit for bit (dead rows stay
        # NaN); the new rows are computed on both sides: within one ulp of the
        # cache dtype (measured: f32 1-ulp flips of the norm's rsqrt).
        fresh = np.zeros(got.shape, bool)
        for b in range(batch):
            fresh[layer:layer + loop, b, start[b]:start[b] + tokens] = True
        assert np.array_equal(got[~fresh], np.where(dead, np.nan, want)[~fresh],
                              equal_nan=True), f"core {c}: cache rows changed"
        ulp = 2.0 ** -23 if dtype == jnp.float32 else 2.0 ** -8
        np.testing.assert_allclose(got[fresh], want[fresh], rtol=2 * ulp, atol=1e-6)
        outs.append(np.asarray(out))
    out = np.concatenate(outs, axis=-1)
    for i in range(loop):
        # Measured: <= 2e-6 (f32 math on both sides; absorbed reassociates
        # (q W_UK) c against q (c W_UK^T)). Padding rows are exactly 0.
        scale = max(1.0, float(np.max(np.abs(want_out[i]))))
        np.testing.assert_allclose(out[i, :rows], want_out[i], atol=2e-5 * scale, rtol=1e-5)
        assert np.all(out[i, rows:] == 0)


def test_chunk_rows():
    g = lambda rank, tile: M.MLAGeometry(1, 1, 8, 1, rank, 16, 16, 16, tile, 1024, 0.1, 1e-6,  # noqa: E731
                                         True, 1.0, False, "absorbed", "float32", "float32")
    assert M.chunk_rows(g(256, 512)) == 128          # 272 -> 384 lanes, 1.5 KiB a row
    assert M.chunk_rows(g(512, 1024)) == 64          # DeepSeek: 576 -> 640 lanes
    assert M.chunk_rows(g(16, 32)) == 32             # a small tile in one chunk


CASES = [
    # form, batch, tokens, heads, cores, rank, (dn, dr, dv), kv_tile, seq_tiles, dtype, starts
    ("absorbed", 3, 3, 4, 1, 64, (32, 16, 32), 16, 4, jnp.bfloat16, [0, 14, 61]),
    ("expanded", 3, 3, 4, 2, 64, (32, 16, 32), 16, 4, jnp.bfloat16, [0, 14, 61]),
    ("absorbed", 1, 1, 2, 2, 32, (16, 8, 24), 32, 2, jnp.float32, [63]),     # dv != dn
    ("expanded", 8, 1, 1, 1, 32, (16, 8, 16), 16, 2, jnp.float32, [0, 1, 15, 16, 17, 30, 31, 8]),
    # L = 272: 512-key tiles read in four 128-key chunks (mla.chunk_rows), some
    # wholly past the end of a sequence
    ("absorbed", 2, 2, 2, 1, 256, (16, 16, 16), 512, 2, jnp.float32, [100, 700]),
    ("expanded", 2, 2, 2, 2, 256, (16, 16, 16), 512, 2, jnp.bfloat16, [300, 1020]),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_mla_cases(case):
    run_case(*case, scaling=YARN)


@pytest.mark.parametrize("sync", [False, True], ids=["ahead", "synchronised"])
@pytest.mark.parametrize("form", M.FORMS)
def test_mla_nope_gate_in_layer_loop(form, sync):
    """Kimi's NoPE with an output gate, three layers in one fori_loop from
    layer 1: the windows' slots rotate across sequences and layers, a layer's
    first window and tile are in flight across the loop's boundary (or, in the
    synchronised ablation, each attend waits its own)."""
    run_case(form, 2, 2, 4, 2, 32, (16, 8, 16), 16, 2, jnp.bfloat16, [15, 3], rope=False,
             gate=True, layer=1, layers=4, loop=3, sync=sync)


@st.composite
def cases(draw):
    batch, tokens = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    kv_tile, seq_tiles = draw(st.sampled_from([16, 32])), draw(st.integers(1, 3))
    S = kv_tile * seq_tiles
    if S < tokens:
        seq_tiles, S = seq_tiles + 1, S + kv_tile
    starts = draw(st.lists(st.integers(0, S - tokens), min_size=batch, max_size=batch))
    cores = draw(st.sampled_from([1, 2]))
    heads = cores * draw(st.integers(1, 2))
    dims = (draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from([2, 8, 16])),
            draw(st.sampled_from([8, 16, 24])))
    return (draw(st.sampled_from(M.FORMS)), batch, tokens, heads, cores,
            draw(st.sampled_from([16, 32, 64])), dims, kv_tile, seq_tiles,
            draw(st.sampled_from([jnp.float32, jnp.bfloat16])), starts)


@settings(max_examples=5)
@given(cases(), st.booleans(), st.booleans(), st.integers(0, 3))
def test_mla_matches_reference(case, rope, gate, seed):
    run_case(*case, rope=rope, gate=gate, scaling=YARN if seed % 2 else None, seed=seed)


@pytest.mark.aot
@pytest.mark.parametrize("form", M.FORMS)
def test_mla_compiles_for_tpu7x(form):
    """DeepSeek-V3 on 32 cores: 4 heads per core, R 512, 128/64/128, bf16."""
    pytest.importorskip("libtpu")
    from jax.experimental import topologies

    topo = topologies.get_topology_desc(topology_name="tpu7x:2x2x1", platform="tpu")
    mesh = jax.sharding.Mesh(topo.devices, ("x",))
    sh = jax.sharding.SingleDeviceSharding(topo.devices[0])
    bf = jnp.bfloat16
    g = M.MLAGeometry(2, 1, 8, 4, 512, 128, 64, 128, 512, 4096, 0.135, 1e-6, True, 1.0,
                      False, form, "bfloat16", "bfloat16")
    f = build(g, 4, 2, False)
    sds = [jax.ShapeDtypeStruct(s, d, sharding=sh) for s, d in (
        ((2,), jnp.int32), ((1,), jnp.int32), ((2, 8, 4 * 192), jnp.float32),
        ((2, 8, 576), jnp.float32), ((2, 8, 512), jnp.float32), ((2, 1, 512), jnp.float32),
        ((1, 32), jnp.float32), ((8, 1), jnp.int32), ((2, 512, 512), bf), ((2, 512, 512), bf),
        ((4, 2, 4096, 576), bf))]
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        jax.jit(f).trace(*sds).lower().compile()
