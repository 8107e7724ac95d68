"""The plan sizes VMEM scratch as Mosaic tiles it (``layout.scratch_bytes``):
checked against the compiler's own VMEM figure (libtpu AOT for TPU7x) for
scratch arrays whose heights are not a whole native tile. Each array is
filled and drained by DMA, so the compiler cannot drop it; the VMEM added per
array (the slope between 2 and 6 copies) is what Mosaic allocates for it."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

from megakernel.compiler.layout import padded_bytes, scratch_bytes

pytest.importorskip("libtpu")


def _vmem_used(shape, dtype, copies: int) -> int:
    from megakernel.backends.pallas_tpu.aot.tpu_compile import scoped_vmem, topology_mesh

    def kernel(x_hbm, o_hbm, *rest):
        scratch, sem = rest[:-1], rest[-1]
        for i, s in enumerate(scratch):
            for src, dst in ((x_hbm.at[i], s), (s, o_hbm.at[i])):
                copy = pltpu.make_async_copy(src, dst, sem.at[0])
                copy.start()
                copy.wait()

    call = pl.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((copies, *shape), dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM(shape, dtype) for _ in range(copies)]
        + [pltpu.SemaphoreType.DMA((1,))])
    mesh = topology_mesh("tpu7x:2x2x1", 1)
    x = jax.ShapeDtypeStruct((copies, *shape), dtype, sharding=NamedSharding(mesh, P()))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return scoped_vmem(jax.jit(call).trace(x).lower().compile())[0]


@pytest.mark.aot
@pytest.mark.parametrize("shape,dtype", [
    ((2, 1, 3, 768), "bfloat16"),     # Gated DeltaNet's conv history: 4 rows, not 16
    ((2, 1, 4, 512), "bfloat16"),     # its conv taps
    ((2, 24, 768), "bfloat16"),       # 24 rows, not 32
    ((2, 3, 768), "float32"),         # 4 rows, not 8
    ((2, 5, 768), "int8"),            # 8 rows, not 32
    ((2, 1, 768), "bfloat16"),        # one row: one packed sublane pair
])
def test_scratch_is_sized_as_mosaic_tiles_it(shape, dtype):
    per_array = (_vmem_used(shape, jnp.dtype(dtype), 6)
                 - _vmem_used(shape, jnp.dtype(dtype), 2)) // 4
    assert per_array == scratch_bytes(shape, dtype)
    if shape[-2] > 1:
        assert per_array < padded_bytes(shape, dtype)   # the native-tile size overcounts
