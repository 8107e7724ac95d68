"""Micro-kernels at decode shapes whose static profile calibrates the cost model.

Run as a child process (``python -m megakernel.backends.pallas_tpu.aot.calibration_kernels
DUMP NAME...``) with libtpu's profile flags in its environment
(``static_profile.profiled_env``); it AOT-compiles each named kernel for one
TPU7x TensorCore and prints ``{name: kernel cycles}`` as one JSON line.

Every kernel comes in two sizes (``KERNELS[name]`` is a pair of builders) so
that the caller can take the slope between them: fixed costs (the output DMA,
prologue) cancel, and what is left is the cost of the work that grew.
Operands that the kernel only computes on sit in uninitialised VMEM scratch,
so no HBM transfer is charged except where a DMA is what is measured.
"""

from __future__ import annotations

import functools
import json
import sys

from megakernel import formats       # no jax: the profile flags must precede its import
from megakernel.compiler.calibration import RING_PIECE_ROWS, RING_WIDTHS, ring_cols

MiB = 2**20
M_DECODE = 8          # LHS rows at decode (one sublane tile)
KDIM = 2048           # contracting size of the matmul probes
QUANTIZED = tuple(f.name for f in formats.FORMATS.values() if not f.plain)


def _jax():
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    return jax, jnp, pl, pltpu


def _call(kernel, out_shape, scratch, *, any_input=None):
    """A one-core pallas_call with a dummy SMEM operand (or an HBM operand)."""
    jax, jnp, pl, pltpu = _jax()
    spec = pl.BlockSpec(memory_space=pl.ANY if any_input else pltpu.SMEM)
    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(*out_shape),
                          in_specs=[spec], out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
                          scratch_shapes=scratch,
                          compiler_params=pltpu.CompilerParams(vmem_limit_bytes=96 * MiB))


def matmul(dtype: str, layout: str, n: int, rows: int = M_DECODE, precision=None):
    """x[rows, K] @ W, W of ``dtype`` stored [K, n] ("kn") or [n, K] ("nk",
    contracted on its minor dimension), as ``runtime.matmul`` emits it: x cast to
    W's dtype for floats; int8/int4 converted to bf16 in VMEM first (the
    dequantisation path). The product stays in VMEM; one [8, 128] corner is the
    output, so the output DMA does not grow with the probe."""
    jax, jnp, pl, pltpu = _jax()
    wdt = getattr(jnp, dtype)
    xdt = jnp.float32 if dtype == "float32" else jnp.bfloat16
    dims = (((1,), (0,)), ((), ())) if layout == "kn" else (((1,), (1,)), ((), ()))
    prec = getattr(jax.lax.Precision, precision) if precision else None

    def kernel(_, o_ref, x_ref, w_ref, y_ref):
        w = w_ref[...]
        if dtype in ("int8", "int4"):
            w = w.astype(jnp.bfloat16)
        y_ref[...] = jax.lax.dot_general(x_ref[...].astype(w.dtype), w, dims, precision=prec,
                                         preferred_element_type=jnp.float32)
        o_ref[...] = y_ref[0:8, 0:128]

    shape = (KDIM, n) if layout == "kn" else (n, KDIM)
    return _call(kernel, ((8, 128), jnp.float32),
                 [pltpu.VMEM((rows, KDIM), xdt), pltpu.VMEM(shape, wdt),
                  pltpu.VMEM((rows, n), jnp.float32)]), ("smem",)


def quantized(fmt: str, n: int, mxu: str | None = None):
    """x[8, K] @ W for W in format ``fmt`` as the kernel holds it (32-bit words
    of codes and f32 scales in VMEM), through the kernel's own
    ``dequant.matmul``: its MXU path with the decode it needs (``mxu`` forces
    the other path, to compare the two)."""
    jax, jnp, pl, pltpu = _jax()
    from megakernel.backends.pallas_tpu.kernels import dequant
    from megakernel.backends.pallas_tpu.kernels import blocks as runtime

    f = formats.get(fmt)
    groups = 1 if f.group_rows == formats.WHOLE else KDIM // f.group_rows

    def kernel(_, o_ref, x_ref, w_ref, s_ref, y_ref):
        y_ref[...] = dequant.matmul(x_ref[...], w_ref, s_ref[...], fmt, jnp.bfloat16,
                                    runtime.matmul, mxu=mxu)
        o_ref[...] = y_ref[0:8, 0:128]

    return _call(kernel, ((8, 128), jnp.float32),
                 [pltpu.VMEM((M_DECODE, KDIM), jnp.bfloat16),
                  pltpu.VMEM((KDIM * f.code_bits // 32, n), jnp.int32),
                  pltpu.VMEM((groups, n), jnp.float32),
                  pltpu.VMEM((M_DECODE, n), jnp.float32)]), ("smem",)


def _chained(op, reps: int, shape, extra):
    """``op`` applied ``reps`` times in a row (each on the last one's result) to a
    VMEM value of ``shape``; the difference of 2 and 1 repetitions is one op."""
    jax, jnp, pl, pltpu = _jax()

    def kernel(_, o_ref, x_ref, *e_refs):
        x = x_ref[...]
        for _ in range(reps):
            x = op(x, *e_refs)
        o_ref[...] = x[0:8, 0:128].astype(jnp.float32)

    return _call(kernel, ((8, 128), jnp.float32),
                 [pltpu.VMEM(shape, jnp.float32)] + extra), ("smem",)


def rmsnorm(reps: int, width: int = 4096):
    """RMSNorm of [8, width] f32 with a gain row."""
    jax, jnp, pl, pltpu = _jax()

    def op(x, g_ref):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g_ref[...]
    return _chained(op, reps, (M_DECODE, width), [pltpu.VMEM((1, width), jnp.float32)])


def rope(reps: int, heads: int = 32, head_dim: int = 128):
    """Rotate-half rope of [8, heads * head_dim] f32 with per-row cos/sin."""
    jax, jnp, pl, pltpu = _jax()
    half = head_dim // 2

    def op(x, cs_ref):
        cos = jnp.tile(cs_ref[0], (1, heads))
        sin = jnp.tile(cs_ref[1], (1, heads))
        parts = []
        for h in range(heads):
            xh = x[:, h * head_dim:(h + 1) * head_dim]
            parts.append(jnp.concatenate([-xh[:, half:], xh[:, :half]], axis=-1))
        return x * cos + jnp.concatenate(parts, axis=-1) * sin
    return _chained(op, reps, (M_DECODE, heads * head_dim),
                    [pltpu.VMEM((2, M_DECODE, head_dim), jnp.float32)])


def argmax(reps: int, vocab: int = 32768):
    """Row argmax of [8, vocab] f32 logits (the greedy token)."""
    jax, jnp, pl, pltpu = _jax()

    def op(x):
        idx = jnp.argmax(x, axis=-1, keepdims=True).astype(jnp.float32)
        return x + idx           # the next repetition depends on this one's result
    return _chained(op, reps, (M_DECODE, vocab), [])


def tiles(count: int, rows: int = 8):
    """``count`` small tiles streamed HBM -> VMEM through two slots, each waited
    and the next issued: the per-tile wait and issue work of the ring."""
    jax, jnp, pl, pltpu = _jax()

    def kernel(h_ref, o_ref, buf, sem):
        def copy(i):
            return pltpu.make_async_copy(h_ref.at[i], buf.at[i % 2], sem.at[i % 2])
        copy(0).start()
        acc = jnp.zeros((rows, 128), jnp.float32)
        for i in range(count):
            if i + 1 < count:
                copy(i + 1).start()
            copy(i).wait()
            acc = acc + buf[i % 2]
        o_ref[...] = acc

    return _call(kernel, ((rows, 128), jnp.float32),
                 [pltpu.VMEM((2, rows, 128), jnp.float32), pltpu.SemaphoreType.DMA((2,))],
                 any_input=True), ("hbm", (count, rows, 128))


def ring_piece(width: int, count: int, rows: int):
    """``count`` bf16 tiles [rows, cols] streamed HBM -> VMEM as the weight ring
    streams them: each folded into ``width``-column pieces, a DMA and a
    semaphore per piece, 4 banks with 3 tiles in flight; each piece waited for,
    then multiplied in ``runtime.matmul_ref``'s row chunks (``cols``:
    ``calibration.ring_cols``). The waits order the pieces, so one piece's
    matmuls cannot overlap the next's: the
    rate per piece width tells how wide a piece must be to keep the core's
    MXUs busy (``Target.piece_cols``)."""
    jax, jnp, pl, pltpu = _jax()
    from megakernel.backends.pallas_tpu.kernels.blocks import chunk_rows

    banks, ahead, word_rows, cols = 4, 3, rows // 2, ring_cols(width, rows)
    widths = [width] * (cols // width)

    def kernel(h_ref, o_ref, x_ref, bank, sem, y_ref):
        def copies(i):
            return [pltpu.make_async_copy(
                h_ref.at[i, :, pl.ds(p * width, w)],
                bank.at[i % banks, pl.ds(p * word_rows, word_rows), pl.ds(0, w)],
                sem.at[i % banks, p]) for p, w in enumerate(widths)]

        for i in range(ahead):
            for cp in copies(i):
                cp.start()
        x = x_ref[...].astype(jnp.bfloat16)
        for i in range(count):
            if i + ahead < count:
                for cp in copies(i + ahead):
                    cp.start()
            for p, (cp, w) in enumerate(zip(copies(i), widths)):
                cp.wait()
                step, acc = chunk_rows(rows, w, 2), 0.0
                for r in range(0, rows, step):
                    n = min(step, rows - r)
                    words = bank[i % banks, pl.ds(p * word_rows + r // 2, n // 2), pl.ds(0, w)]
                    acc = acc + jnp.dot(x[:, r:r + n], pltpu.bitcast(words, jnp.bfloat16),
                                        preferred_element_type=jnp.float32)
                y_ref[:, pl.ds(p * width, w)] += acc
        o_ref[...] = y_ref[0:8, 0:128]

    return _call(kernel, ((8, 128), jnp.float32),
                 [pltpu.VMEM((M_DECODE, rows), jnp.float32),
                  pltpu.VMEM((banks, word_rows * len(widths), width), jnp.float32),
                  pltpu.SemaphoreType.DMA((banks, len(widths))),
                  pltpu.VMEM((M_DECODE, cols), jnp.float32)],
                 any_input=True), ("hbm", (count, word_rows, cols))


def dma(nbytes: int):
    """One HBM -> VMEM copy of ``nbytes``: the bytes per cycle the profile charges."""
    jax, jnp, pl, pltpu = _jax()
    rows = nbytes // (128 * 4)

    def kernel(h_ref, o_ref, buf, sem):
        cp = pltpu.make_async_copy(h_ref, buf, sem.at[0])
        cp.start()
        cp.wait()
        o_ref[...] = buf[0:8, :]

    return _call(kernel, ((8, 128), jnp.float32),
                 [pltpu.VMEM((rows, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))],
                 any_input=True), ("hbm", (rows, 128))


def _pair(fn, a, b, **kw):
    return (functools.partial(fn, a, **kw), functools.partial(fn, b, **kw))


# name -> (small, large) builders; the measured quantity is their difference.
KERNELS = {
    **{f"matmul.{dt}.{lay}": _pair(lambda n, dt=dt, lay=lay: matmul(dt, lay, n), 1024, 2048)
       for dt in ("bfloat16", "float32", "float8_e4m3fn", "int8", "int4")
       for lay in ("kn", "nk")},
    # each quantized format through the kernel's own path (dequant.matmul), and
    # through every other path it has (``matmul.q.{fmt}_{path}``), to compare
    **{f"matmul.q.{fmt}.kn": _pair(lambda n, fmt=fmt: quantized(fmt, n), 1024, 2048)
       for fmt in QUANTIZED},
    **{f"matmul.q.{fmt}_{path}.kn": _pair(lambda n, fmt=fmt, path=path:
                                         quantized(fmt, n, path), 1024, 2048)
       for fmt in QUANTIZED for path in formats.get(fmt).mxu_paths[1:]},
    # f32 at full precision (the attention kernels' HIGHEST dots)
    "matmul.float32_highest.kn": _pair(
        lambda n: matmul("float32", "kn", n, precision="HIGHEST"), 1024, 2048),
    # flops per cycle: the same weights, many more LHS rows (MXU flop-bound)
    "matmul.rows": _pair(lambda r: matmul("bfloat16", "kn", 1024, rows=r), 1024, 2048),
    "rmsnorm": _pair(rmsnorm, 1, 2),
    "rope": _pair(rope, 1, 2),
    "argmax": _pair(argmax, 1, 2),
    "tiles": _pair(tiles, 8, 16),
    **{f"ring_piece.{w}.{r}": _pair(lambda n, w=w, r=r: ring_piece(w, n, r), 8, 16)
       for w in RING_WIDTHS for r in RING_PIECE_ROWS},
    "dma": _pair(dma, 4 * MiB, 8 * MiB),
}


def compile_one(name: str, which: int, dump: str) -> float:
    """AOT-compile variant ``which`` (0 small, 1 large) of ``name``; its cycles."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec as P

    from megakernel.backends.pallas_tpu.aot import static_profile

    call, arg = KERNELS[name][which]()
    label = f"cal_{name.replace('.', '_')}_{which}"
    devices = topologies.get_topology_desc(topology_name="tpu7x:2x2x1", platform="tpu").devices
    mesh = jax.sharding.Mesh(np.array(devices[:1]), ("x",))
    shape, dtype = ((1,), jnp.int32) if arg[0] == "smem" else (arg[1], jnp.float32)

    def fn(a):
        return call(a)
    fn.__name__ = fn.__qualname__ = label
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        jax.jit(fn).trace(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(
            mesh, P()))).lower().compile()
    return static_profile.read(dump, label).kernel_cycles


def main(argv: list[str]) -> int:
    dump, names = argv[0], argv[1:]
    out = {}
    for name in names:
        try:
            out[name] = [compile_one(name, k, dump) for k in (0, 1)]
        except Exception as err:  # noqa: BLE001 - reported per kernel, the others still run
            out[name] = f"{type(err).__name__}: {str(err)[:300]}"
        print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
