"""The in-kernel collectives on their own: every core ends bit-identical, equal
to an independent NumPy sum of the wire-rounded valid rows in rank order.

A small kernel per case (interpret mode, 2 or 4 virtual devices) runs two
all-reduces back to back (slot parities 0 and 1) and the argmax exchange; the
partials are drawn per core. Pad rows must come back as zeros."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

from megakernel.backends.pallas_tpu.kernels import collectives as co
from megakernel.backends.pallas_tpu.check.against_reference import interpret_params, make_mesh

ROWS_PADDED, LANES = 8, 128


def _run(n, rows, hidden, algorithm, wire, x, m, idx, slot_lanes=None):
    """-> (two all-reduce results [n, 2, RP, H], argmax (max, idx) [n, RP, 1] each);
    ``slot_lanes``: one-shot slots wider than the partials' H lanes."""
    chunk = hidden // n
    wdt = jnp.dtype(wire)
    sem = pltpu.SemaphoreType.DMA
    if algorithm == "one_shot":
        scratch = [pltpu.VMEM((2, n, rows, slot_lanes or hidden), wdt), sem((2, n)), sem((2, n))]
    else:
        scratch = [pltpu.VMEM((2, rows, hidden), wdt), pltpu.VMEM((2, n, rows, chunk), wdt),
                   pltpu.VMEM((2, n, rows, chunk), wdt), sem((2, 2, n)), sem((2, 2, n))]
    scratch += [pltpu.VMEM((n, rows, LANES), jnp.float32),
                pltpu.VMEM((n, rows, LANES), jnp.int32), sem((2, 2, n))]

    def kernel(x_ref, m_ref, i_ref, out_ref, om_ref, oi_ref, *s):
        me = jax.lax.axis_index("x")
        co.barrier(me, n)
        bufs, (values, indices, asems) = s[:-3], s[-3:]
        for parity in (0, 1):
            part = x_ref[parity]
            if algorithm == "one_shot":
                out_ref[parity] = co.all_reduce(part, *bufs, parity, me, n)
            else:
                out_ref[parity] = co.all_reduce_rs_ag(part, *bufs, parity, me, n)
        om_ref[...], oi_ref[...] = co.exchange_argmax(m_ref[...], i_ref[...], values, indices,
                                                      asems, me, n)

    vmem = pl.BlockSpec(memory_space=pltpu.VMEM)
    call = pl.pallas_call(
        kernel, in_specs=[vmem] * 3, out_specs=(vmem,) * 3, scratch_shapes=scratch,
        out_shape=(jax.ShapeDtypeStruct((2, ROWS_PADDED, hidden), jnp.float32),
                   jax.ShapeDtypeStruct((ROWS_PADDED, 1), jnp.float32),
                   jax.ShapeDtypeStruct((ROWS_PADDED, 1), jnp.int32)),
        interpret=interpret_params(), compiler_params=pltpu.CompilerParams(collective_id=0))
    mesh = make_mesh(n)
    f = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=(P("x"),) * 3,
                              out_specs=(P("x"),) * 3, check_vma=False))
    put = lambda a: jax.device_put(a, NamedSharding(mesh, P("x")))  # noqa: E731
    out, om, oi = f(put(x.reshape(n * 2, ROWS_PADDED, hidden)),
                    put(m.reshape(n * ROWS_PADDED, 1)), put(idx.reshape(n * ROWS_PADDED, 1)))
    return (np.asarray(out).reshape(n, 2, ROWS_PADDED, hidden),
            np.asarray(om).reshape(n, ROWS_PADDED, 1), np.asarray(oi).reshape(n, ROWS_PADDED, 1))


@pytest.mark.parametrize("n,rows", [(2, 1), (4, 3)])
def test_a_narrow_partial_moves_only_its_lanes(n, rows):
    """One-shot slots of 4 x 128 lanes carry a partial of 128 lanes (a
    per-row statistic, a latent narrower than hidden): the sum of what
    travelled, bit-identical on every core."""
    rng = np.random.default_rng(n + rows)
    x = rng.standard_normal((n, 2, ROWS_PADDED, LANES)).astype(np.float32) * 3
    m = rng.standard_normal((n, ROWS_PADDED, 1)).astype(np.float32)
    idx = rng.integers(0, 1000, (n, ROWS_PADDED, 1)).astype(np.int32)
    out, _, _ = _run(n, rows, LANES, "one_shot", "bfloat16", x, m, idx, slot_lanes=4 * LANES)
    sent = x[:, :, :rows].astype(ml_dtypes.bfloat16).astype(np.float32)
    want = sent[0]
    for j in range(1, n):                    # rank order, f32
        want = want + sent[j]
    for core in range(n):
        np.testing.assert_array_equal(out[core][:, :rows], want)
        assert not out[core][:, rows:].any()


@pytest.mark.parametrize("n,rows,algorithm,wire", [
    (2, 1, "one_shot", "bfloat16"), (4, 3, "one_shot", "float32"), (4, 2, "one_shot", "bfloat16"),
    (2, 8, "rs_ag", "bfloat16"), (4, 1, "rs_ag", "bfloat16")])
def test_cores_agree_bit_for_bit(n, rows, algorithm, wire):
    hidden = 128 * n
    rng = np.random.default_rng(n * 10 + rows)
    x = rng.standard_normal((n, 2, ROWS_PADDED, hidden)).astype(np.float32) * 3
    m = rng.standard_normal((n, ROWS_PADDED, 1)).astype(np.float32)
    m[1, 0, 0] = m[0, 0, 0]                  # a tie: the lower rank's index wins
    idx = rng.integers(0, 1000, (n, ROWS_PADDED, 1)).astype(np.int32) + 1000 * np.arange(
        n, dtype=np.int32)[:, None, None]
    out, om, oi = _run(n, rows, hidden, algorithm, wire, x, m, idx)

    wt = ml_dtypes.bfloat16 if wire == "bfloat16" else np.float32
    sent = x[:, :, :rows].astype(wt).astype(np.float32)
    want = sent[0]
    for j in range(1, n):                    # rank order, f32
        want = want + sent[j]
    if algorithm == "rs_ag":                 # the reduced chunks travel in the wire dtype
        want = want.astype(wt).astype(np.float32)
    for core in range(n):
        np.testing.assert_array_equal(out[core], out[0])        # bit for bit
        np.testing.assert_array_equal(out[core][:, :rows], want)
        assert not out[core][:, rows:].any()                    # pad rows: zeros
        np.testing.assert_array_equal(om[core], om[0])
        np.testing.assert_array_equal(oi[core], oi[0])
    best = np.argmax(m[:, :rows, 0], axis=0)   # first (lowest rank) maximum
    np.testing.assert_array_equal(om[0][:rows, 0], m[best, np.arange(rows), 0])
    np.testing.assert_array_equal(oi[0][:rows, 0], idx[best, np.arange(rows), 0])
    assert not om[0][rows:].any() and not oi[0][rows:].any()
