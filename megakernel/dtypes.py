"""The one table of element types: bits, spellings, and VMEM sublane tiling.

Every stage asks this table (compiler/layout.py for sizes and tiling, the
emitter for the kernel's spelling, aot.py for XLA's, pack.py for numpy's).
Sublane tiling comes from ``pltpu.TpuInfo.get_sublane_tiling`` for TPU7x;
nothing about a dtype is typed in twice. Semaphores have no bytes: they are
counted, not sized.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from megakernel.errors import PlanningError


@dataclass(frozen=True)
class Dtype:
    name: str          # numpy / jax name
    bits: int          # in HBM; 0 for semaphores
    hlo: str           # XLA's spelling in HLO text
    vmem_bits: int     # per element as laid out in VMEM (int4 takes a byte)

    @property
    def itemsize(self) -> int:
        """Bytes per element as a VMEM buffer holds it."""
        return self.vmem_bits // 8

    @property
    def kernel(self) -> str:
        """Spelling in generated kernel source."""
        return f"jnp.{self.name}"


TABLE: dict[str, Dtype] = {d.name: d for d in (
    Dtype("float32", 32, "f32", 32),
    Dtype("bfloat16", 16, "bf16", 16),
    Dtype("float16", 16, "f16", 16),
    Dtype("int32", 32, "s32", 32),
    Dtype("int16", 16, "s16", 16),
    Dtype("int8", 8, "s8", 8),
    Dtype("uint8", 8, "u8", 8),
    Dtype("int4", 4, "s4", 8),
    Dtype("float8_e4m3fn", 8, "f8e4m3fn", 8),
    Dtype("float4_e2m1fn", 4, "f4e2m1fn", 8),
    Dtype("bool", 8, "pred", 8),
    Dtype("float64", 64, "f64", 64),
    Dtype("int64", 64, "s64", 64),
    Dtype("dma_semaphore", 0, "", 0),
    Dtype("semaphore", 0, "", 0),
    Dtype("barrier_semaphore", 0, "", 0),
)}
HLO = {d.hlo: d for d in TABLE.values() if d.hlo}


def of(dtype) -> Dtype:
    """The table's entry for a name, a ``DType`` or a numpy/jax dtype."""
    name = getattr(dtype, "value", None) or getattr(dtype, "name", None) or str(dtype)
    try:
        return TABLE[name]
    except KeyError:
        raise PlanningError(f"dtype {name!r} is not in the dtype table; known: "
                            f"{sorted(TABLE)}", path="dtype") from None


@functools.lru_cache(maxsize=None)
def sublanes(dtype) -> int:
    """Rows of one native [sublanes, 128] VMEM tile of ``dtype`` on TPU7x."""
    import numpy as np
    from jax.experimental.pallas import tpu as pltpu

    d = of(dtype)
    if d.bits == 0:
        return 8
    info = pltpu.get_tpu_info_for_chip(pltpu.ChipVersion.TPU_7X, 1)
    return info.get_sublane_tiling(np.dtype(d.name))
