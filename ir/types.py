"""Scalar types and per-token tensor specs of the layer graph."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import numpy as np

from megakernel.errors import IRError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
        try:
            return aliases[str(value).lower()]
        except KeyError:
            raise IRError(f"unsupported dtype {value!r}; expected one of "
                          f"{sorted(aliases)}", path=path) from None


def check_identifier(name: str, *, path: str) -> str:
    """Names reach generated code, so they must be plain identifiers."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise IRError(f"name {name!r} is not a valid identifier "
                      "(letters, digits and _ only, not starting with a digit)", path=path)
    return name


def check_positive(value, field: str, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        expected = "a non-negative integer" if allow_zero else "a positive integer"
        raise IRError(f"{field}={value!r} must be {expected}", path="")


@dataclass(frozen=True)
class TensorSpec:
    """A named tensor of the layer graph: per-token ``shape`` (the token axis,
    B*T at run time, is implicit and leading) and a dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: DType = DType.F32

    def __post_init__(self):
        check_identifier(self.name, path="tensor")
        object.__setattr__(self, "shape", tuple(self.shape))
        for d in self.shape:
            check_positive(d, f"{self.name}.shape")


@dataclass(frozen=True)
class ParamSpec:
    """A weight: full (unsharded) shape and dtype."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize
