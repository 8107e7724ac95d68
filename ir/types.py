"""Scalar types and per-token tensor specs of the layer graph."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np

from megakernel.errors import IRError, shown
from megakernel.ir import limits
from megakernel.ir.schema import Identifier, Int, check, node


class DType(enum.Enum):
    """Storage dtype of weights, caches and activations."""

    F32 = "float32"
    BF16 = "bfloat16"

    @property
    def itemsize(self) -> int:
        return {DType.F32: 4, DType.BF16: 2}[self]

    @property
    def jnp(self):
        import jax.numpy as jnp

        return {DType.F32: jnp.float32, DType.BF16: jnp.bfloat16}[self]

    @property
    def np(self):
        import ml_dtypes

        return {DType.F32: np.float32, DType.BF16: ml_dtypes.bfloat16}[self]

    @classmethod
    def parse(cls, value: "str | DType", *, path: str = "dtype") -> "DType":
        if isinstance(value, DType):
            return value
        aliases = {"float32": cls.F32, "f32": cls.F32, "fp32": cls.F32,
                   "bfloat16": cls.BF16, "bf16": cls.BF16}
        found = aliases.get(value.lower()) if isinstance(value, str) else None
        if found is None:
            raise IRError(f"unsupported dtype {shown(value)}; expected one of "
                          f"{sorted(aliases)}", path=path, hint="write one of them, quoted")
        return found


def check_identifier(name: str, *, path: str) -> str:
    """Names reach generated code, so they must be plain identifiers (not
    keywords, at most ``limits.MAX_NAME_CHARS`` characters)."""
    return check(Identifier, name, path=path)


Dim = Int(1, limits.MAX_WIDTH)


@node
class TensorSpec:
    """A named tensor of the layer graph: per-token ``shape`` (the token axis,
    B*T at run time, is implicit and leading) and a dtype."""

    name: Identifier
    shape: tuple[Dim, ...]
    dtype: DType = DType.F32


@dataclass(frozen=True)
class ParamSpec:
    """A weight: full (unsharded) shape and dtype. ``format`` names its storage
    in megakernel/formats.py: ``plain`` (``dtype`` itself) or a quantized
    format (codes and scales; ``dtype`` is then what it dequantises to)."""

    shape: tuple[int, ...]
    dtype: DType
    format: str = field(default="plain", kw_only=True)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes in HBM, in its format (codes plus scales when quantized)."""
        from megakernel import formats

        return formats.get(self.format).hbm_bytes(self.shape, self.dtype.itemsize)


APPEND, WHOLE = "append", "whole"


@dataclass(frozen=True)
class StateSpec(ParamSpec):
    """State an op keeps from one decode step to the next, for the whole batch
    (``shape[0]`` is the batch). ``access``:

    * ``append``: shape [B, max_seq_len, ...]; each step writes the rows of its
      new tokens at their positions and reads the rows before them (K/V caches,
      latent caches);
    * ``whole``: each step reads all of it and writes all of it back (a
      recurrent state, a convolution's history)."""

    access: str = APPEND

    def __post_init__(self):
        if self.access not in (APPEND, WHOLE):
            raise IRError(f"access={self.access!r}, expected {APPEND!r} or {WHOLE!r}",
                          path="state")
